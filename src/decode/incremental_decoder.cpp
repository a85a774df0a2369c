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
// hypotheses reading `keys` cached rows each: n append rows, then 2n + n·keys int32 values.
int64_t step_input_words(int64_t n, int64_t keys) {
  return n + (2 * n + n * keys + 1) / 2;
}

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
  // The last step's inputs, the largest, allocated once: a buffer grown step by step would be
  // reallocated (and on a GPU freed, allocated, cleared and copied) at every step.
  ensure_size(backend, device_step_inputs_, step_input_words(max_hypotheses, max_steps));
  history_.resize(size_t(max_hypotheses * max_steps));
  reordered_history_.resize(history_.size());
  layer_cache_.self_attn.keep_weights = false;
  layer_cache_.ffn.keep_pre_activation = false;
}

void IncrementalDecoder::start(const std::vector<int32_t>& hypothesis_sentence) {
  if (int64_t(hypothesis_sentence.size()) > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  hypothesis_sentence_ = hypothesis_sentence;
  position_ = 0;
}

void IncrementalDecoder::step(const int32_t* tokens, float* logits, float* cross_attention,
                              int64_t attention_layer, bool per_head) {
  const ModelConfig& c = model_.config();
  const Backend& backend = model_.backend();
  const TransformerWeights& w = prepared_->steps;
  const int64_t n = hypotheses(), d = c.d_model, heads = c.heads, t = position_;
  if (t >= max_steps_)
    throw std::invalid_argument("IncrementalDecoder: more steps than max_steps (" +
                                std::to_string(max_steps_) + ")");
  const int64_t kept_layer = attention_layer < 0 ? c.decoder_layers - 1 : attention_layer;
  const int64_t keys = t + 1;  // each hypothesis' rows of positions 0..t
  // The step's index arrays in one upload (step_inputs_): [N] append rows (int64), then [N]
  // tokens, [N] sentences and [N, keys] history rows (int32).
  const int64_t words = step_input_words(n, keys);
  step_inputs_.resize(size_t(words));
  int64_t* append_rows_host = step_inputs_.data();                             // [N]
  int32_t* tokens_host = reinterpret_cast<int32_t*>(step_inputs_.data() + n);  // [N]
  int32_t* sentence_host = tokens_host + n;                                    // [N]
  int32_t* history_host = sentence_host + n;                                   // [N, keys]
  std::copy_n(tokens, n, tokens_host);
  std::copy_n(hypothesis_sentence_.data(), n, sentence_host);
  for (int64_t i = 0; i < n; ++i) {
    append_rows_host[i] = i * max_steps_ + t;
    history_[size_t(i * max_steps_ + t)] = int32_t(i * max_steps_ + t);
    std::copy_n(history_.data() + i * max_steps_, keys, history_host + i * keys);
  }
  const int64_t* append_rows = upload(backend, step_inputs_.data(), words, device_step_inputs_);
  const int32_t* device_tokens = reinterpret_cast<const int32_t*>(append_rows + n);
  const int32_t* sentence = device_tokens + n;
  const int32_t* history = sentence + n;
  float* x = ensure_size(backend, x_, n * d);  // [N, D] residual stream
  embed_forward(backend, c, target_embedding(w), model_.decoder_positions(), device_tokens, n, 1, t,
                x);

  // Each layer reads the one before's output where it lies, in the layer cache they share (its
  // self-attention sublayer reads it before the feed-forward sublayer writes the next one, as
  // the encoder's inference passes do), not a copy of it; with the bfloat16 copy its norm wrote
  // where the products read one (sublayer_rounds_for).
  MatmulOperand input{x};  // [N, D]
  for (int64_t layer = 0; layer < c.decoder_layers; ++layer) {
    DecoderStep step;
    step.position = t;
    step.sentence_of_query = sentence;
    step.self.row_stride = 2 * d;  // [rows, 2D]: keys | values
    step.self.key_rows = history;
    step.self.key_rows_stride = keys;
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
  ++position_;
}

void IncrementalDecoder::reorder(const std::vector<int32_t>& parents) {
  const int64_t m = int64_t(parents.size());
  if (m > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  for (int32_t parent : parents)
    if (parent < 0 || parent >= hypotheses())
      throw std::invalid_argument("IncrementalDecoder: parent " + std::to_string(parent) +
                                  " is not a current hypothesis");
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(history_.data() + int64_t(parents[size_t(i)]) * max_steps_, position_,
                reordered_history_.data() + i * max_steps_);
  std::swap(history_, reordered_history_);
  std::vector<int32_t> sentence(parents.size());
  for (size_t i = 0; i < parents.size(); ++i)
    sentence[i] = hypothesis_sentence_[size_t(parents[i])];
  hypothesis_sentence_ = std::move(sentence);
}

}  // namespace tfm
