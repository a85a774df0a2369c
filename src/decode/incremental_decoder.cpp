// IncrementalDecoder: one decoder position for N hypotheses per call.
#include "decode/incremental_decoder.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/embeddings.h"
#include "model/sublayer.h"

namespace tfm {

namespace {

// The int64 words of a step's packed inputs (IncrementalDecoder::step_inputs_) for n
// hypotheses: n append rows, n parents, then 3n int32 values.
int64_t step_input_words(int64_t n) {
  return 2 * n + (3 * n + 1) / 2;
}

// How many recordings in a row memory allocated since may make useless before a decoder stops
// recording (something allocates between its steps: replays would keep failing).
constexpr int64_t kMaxDiscardedRecordings = 4;

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Model& model, const float* memory, int64_t sentences,
                                       int64_t src_len, const int32_t* src_lengths,
                                       int64_t max_steps, int64_t max_hypotheses,
                                       Precision precision, CacheFormat cache)
    : model_(model),
      prepared_(model.prepared(precision)),
      src_len_(src_len),
      max_steps_(max_steps),
      max_hypotheses_(max_hypotheses),
      cache_(cache) {
  const ModelConfig& c = model.config();
  const int64_t d = c.d_model, rows = sentences * src_len;
  const Backend& backend = model.backend();
  upload(backend, src_lengths, sentences, device_src_lengths_);
  const size_t layers = prepared_->steps.decoder_layers.size();
  const Precision format = cache_precision(cache);
  const bool rounded = is_16_bit_float(format);
  const int64_t self_size = max_steps * max_hypotheses * 2 * d;  // [rows, 2D]
  DeviceBuffer<float> unrounded;  // 16 bits: one layer's float32 K|V, rounded into the cache
  if (rounded) {
    unrounded.allocate_uninitialized(backend, rows * 2 * d);
    cross_kv_16_bits_.resize(layers);
    self_kv_16_bits_.resize(layers);
  } else {
    cross_kv_.resize(layers);
    self_kv_.resize(layers);
  }
  for (size_t l = 0; l < layers; ++l) {
    float* cross_kv =  // [sentences, S, 2D]: keys | values
        rounded ? unrounded.data() : cross_kv_[l].allocate_uninitialized(backend, rows * 2 * d);
    linear_forward(backend, prepared_->steps.decoder_layers[l].cross_attn.kv, memory, rows,
                   cross_kv);
    // Untouched pages cost nothing: only the rows the steps write are ever mapped.
    if (!rounded) {
      self_kv_[l].allocate_uninitialized(backend, self_size);
      continue;
    }
    backend.round_to_16_bits(cross_kv, rows, 2 * d, 2 * d, format,
                             cross_kv_16_bits_[l].allocate_uninitialized(backend, rows * 2 * d));
    self_kv_16_bits_[l].allocate_uninitialized(backend, self_size);
  }
  // The largest step's inputs, allocated once: a buffer grown step by step would be reallocated
  // (and on a GPU freed, allocated, cleared and copied) at every step.
  ensure_size(backend, device_step_inputs_, step_input_words(max_hypotheses));
  history_.allocate_uninitialized(backend, max_hypotheses * max_steps);
  gathered_history_.allocate_uninitialized(backend, max_hypotheses * max_steps);
  reset_history();
  records_steps_ = backend.records_operations() && c.self_attention_window < 0;
  layer_cache_.self_attn.keep_weights = false;
  layer_cache_.ffn.keep_pre_activation = false;
}

void IncrementalDecoder::reset_history() {
  std::vector<int32_t> own_rows(size_t(max_hypotheses_ * max_steps_));
  for (size_t r = 0; r < own_rows.size(); ++r) own_rows[r] = int32_t(r);
  const int64_t bytes = int64_t(own_rows.size() * sizeof(int32_t));
  model_.backend().copy_from_host(own_rows.data(), bytes, history_.data());
  model_.backend().copy_bytes(history_.data(), bytes, gathered_history_.data());
  history_moved_ = false;
  pending_parents_.clear();
}

void IncrementalDecoder::start(const std::vector<int32_t>& hypothesis_sentence) {
  if (int64_t(hypothesis_sentence.size()) > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  hypothesis_sentence_ = hypothesis_sentence;
  position_ = 0;
  if (history_moved_) reset_history();
  pending_parents_.clear();
}

void IncrementalDecoder::step(const int32_t* tokens, float* logits, float* cross_attention,
                              int64_t attention_layer, bool per_head) {
  const ModelConfig& c = model_.config();
  const Backend& backend = model_.backend();
  const int64_t live = hypotheses(), n = step_rows(), d = c.d_model, t = position_;
  if (t >= max_steps_)
    throw std::invalid_argument("IncrementalDecoder: more steps than max_steps (" +
                                std::to_string(max_steps_) + ")");
  // The step's index arrays in one upload (step_inputs_): [N] append rows, [N] parents (int64),
  // then [N] tokens, [N] sentences and [N] key counts (int32), for N = step_rows() rows.
  const int64_t words = step_input_words(n);
  step_inputs_.resize(size_t(words));
  int64_t* append_rows_host = step_inputs_.data();                                 // [N]
  int64_t* parents_host = append_rows_host + n;                                    // [N]
  int32_t* tokens_host = reinterpret_cast<int32_t*>(step_inputs_.data() + 2 * n);  // [N]
  int32_t* sentence_host = tokens_host + n;                                        // [N]
  int32_t* key_counts_host = sentence_host + n;                                    // [N]
  const bool gathers = !pending_parents_.empty();
  for (int64_t i = 0; i < n; ++i) {
    append_rows_host[i] = i * max_steps_ + t;
    parents_host[i] = gathers && i < live ? pending_parents_[size_t(i)] : i;
    tokens_host[i] = i < live ? tokens[i] : 0;
    sentence_host[i] = i < live ? hypothesis_sentence_[size_t(i)] : 0;
    key_counts_host[i] = i < live ? int32_t(t + 1) : 0;  // a padded row reads no cached key
  }
  const int64_t* append_rows = upload(backend, step_inputs_.data(), words, device_step_inputs_);
  if (gathers) {  // the kept hypotheses' histories, columns 0..t-1, then back in place
    int32_t* history = history_.data();
    int32_t* gathered = gathered_history_.data();
    backend.gather_rows(reinterpret_cast<const float*>(history), max_steps_, append_rows + n, n, t,
                        reinterpret_cast<float*>(gathered), max_steps_);
    backend.copy_bytes(gathered, n * max_steps_ * int64_t(sizeof(int32_t)), history);
    pending_parents_.clear();
  }
  const int32_t* device_tokens = reinterpret_cast<const int32_t*>(append_rows + 2 * n);
  float* x = ensure_size(backend, x_, n * d);  // [N, D] residual stream
  embed_forward(backend, c, target_embedding(prepared_->steps), model_.decoder_positions(),
                device_tokens, n, 1, t, x);
  if (!records_steps_) {
    run_layers(x, n, logits, cross_attention, attention_layer, per_head);
  } else {
    StepRecording& recording =
        recording_for(n, logits, cross_attention, cross_attention ? attention_layer : 0, per_head);
    const auto run = [&] { run_layers(x, n, logits, cross_attention, attention_layer, per_head); };
    if (recording.operations && backend.replay(*recording.operations)) {
      discarded_recordings_ = 0;  // memory that moves now and then costs a recording each time
    } else {
      if (recording.operations) {  // memory moved since: run this one, record the next
        recording.operations.reset();
        recording.runs = 0;
        ++discarded_recordings_;
      }
      if (recording.runs++ > 0 && !recording_failed_ &&
          discarded_recordings_ < kMaxDiscardedRecordings) {
        recording.operations = backend.run_and_record(run);
        // Where the backend kept nothing, a step it could not record: nor will it the next.
        recording_failed_ = !recording.operations;
      } else {
        run();
      }
    }
  }
  ++position_;
}

int64_t IncrementalDecoder::step_rows() const {
  const int64_t n = hypotheses();
  if (!records_steps_ || n == 0) return n;
  const int64_t granule = std::max<int64_t>(1, (max_hypotheses_ + 7) / 8);
  return std::min(max_hypotheses_, (n + granule - 1) / granule * granule);
}

IncrementalDecoder::StepRecording& IncrementalDecoder::recording_for(int64_t n, const float* logits,
                                                                     const float* cross_attention,
                                                                     int64_t attention_layer,
                                                                     bool per_head) {
  for (StepRecording& r : recordings_)
    if (r.rows == n && r.logits == logits && r.cross_attention == cross_attention &&
        r.attention_layer == attention_layer && r.per_head == per_head)
      return r;
  // A search's live set shrinks one size at a time: the oldest shapes are the ones done with.
  constexpr size_t kKept = 32;
  if (recordings_.size() == kKept) recordings_.erase(recordings_.begin());
  recordings_.push_back({n, logits, cross_attention, attention_layer, per_head, 0, nullptr});
  return recordings_.back();
}

void IncrementalDecoder::run_layers(float* x, int64_t n, float* logits, float* cross_attention,
                                    int64_t attention_layer, bool per_head) {
  const ModelConfig& c = model_.config();
  const Backend& backend = model_.backend();
  const TransformerWeights& w = prepared_->steps;
  const int64_t d = c.d_model, heads = c.heads;
  const int64_t kept_layer = attention_layer < 0 ? c.decoder_layers - 1 : attention_layer;
  const int64_t* append_rows = device_step_inputs_.data();  // step()'s upload, [N] first
  const int32_t* sentence = reinterpret_cast<const int32_t*>(append_rows + 2 * n) + n;
  const int32_t* key_counts = sentence + n;
  // Each layer reads the one before's output where it lies, in the layer cache they share (its
  // self-attention sublayer reads it before the feed-forward sublayer writes the next one, as
  // the encoder's inference passes do), not a copy of it; with the bfloat16 copy its norm wrote
  // where the products read one (sublayer_rounds_for).
  MatmulOperand input{x};  // [N, D]
  for (int64_t layer = 0; layer < c.decoder_layers; ++layer) {
    DecoderStep step;
    step.position = position_;
    if (records_steps_) {
      step.key_counts = key_counts;
      step.key_capacity = max_steps_;
    }
    step.sentence_of_query = sentence;
    step.self.row_stride = 2 * d;  // [rows, 2D]: keys | values
    step.self.key_rows = history_.data();
    step.self.key_rows_stride = max_steps_;
    step.self.append_rows = append_rows;
    step.cross.row_stride = 2 * d;  // [sentences, S, 2D]: keys | values
    step.round_last_output = sublayer_rounds_for(c, w.output);
    if (cache_ != CacheFormat::kFloat32) {
      step.self.format = step.cross.format = cache_precision(cache_);
      step.self.keys_16_bits = self_kv_16_bits_[size_t(layer)].data();
      step.self.values_16_bits = step.self.keys_16_bits + d;
      step.cross.keys_16_bits = cross_kv_16_bits_[size_t(layer)].data();
      step.cross.values_16_bits = step.cross.keys_16_bits + d;
    } else {
      step.self.keys = self_kv_[size_t(layer)].data();
      step.self.values = step.self.keys + d;
      step.cross.keys = cross_kv_[size_t(layer)].data();
      step.cross.values = step.cross.keys + d;
    }
    const bool keep = cross_attention && layer == kept_layer;
    layer_cache_.cross_attn.keep_weights = keep;
    decoder_layer_forward(backend, c, w.decoder_layers[size_t(layer)], input, n, 1, nullptr,
                          nullptr, src_len_, device_src_lengths_.data(), {}, layer, layer_cache_,
                          &step);
    if (keep) {
      const float* probs = layer_cache_.cross_attn.probs.data();  // [N, H, S]
      if (per_head) {
        backend.copy(probs, n * heads * src_len_, cross_attention);
      } else {  // the mean over heads: probs viewed as N groups of H rows of S
        backend.mean_of_row_groups(probs, n, heads, src_len_, cross_attention);
      }
    }
    input = layer_cache_.output_operand();
  }
  // The decoder's output where the last layer left it: normalised there (pre-norm), or as it is
  // (post-norm, whose final norm is a copy), with the bfloat16 copy the last layer wrote
  // where the output head reads one (DecoderStep::round_last_output).
  float* states = layer_cache_.ffn_sublayer.output.data();  // [N, D]
  final_norm(backend, c, w.decoder_norm, states, n, nullptr, states);
  output_head_forward(backend, w.output, {states, input.rounded}, n, logits);
}

void IncrementalDecoder::reorder(const std::vector<int32_t>& parents) {
  const int64_t m = int64_t(parents.size());
  if (m > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  for (int32_t parent : parents)
    if (parent < 0 || parent >= hypotheses())
      throw std::invalid_argument("IncrementalDecoder: parent " + std::to_string(parent) +
                                  " is not a current hypothesis");
  // Composed with a reorder the next step has not applied yet: the parents in the history.
  std::vector<int64_t> composed(static_cast<size_t>(m));
  bool moves = false;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t parent = parents[size_t(i)];
    composed[size_t(i)] = pending_parents_.empty() ? parent : pending_parents_[size_t(parent)];
    moves = moves || composed[size_t(i)] != i;
  }
  pending_parents_.clear();
  if (moves && position_ > 0) {
    pending_parents_ = std::move(composed);
    history_moved_ = true;
  }
  std::vector<int32_t> sentence(parents.size());
  for (size_t i = 0; i < parents.size(); ++i)
    sentence[i] = hypothesis_sentence_[size_t(parents[i])];
  hypothesis_sentence_ = std::move(sentence);
}

}  // namespace tfm
