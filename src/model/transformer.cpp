// Encoder and decoder stacks, model loading and teacher-forced scoring.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "model/linear.h"
#include "model/positional_encoding.h"
#include "model/prepared_weights.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"

namespace tfm {

Model::Model(ModelConfig config, TensorMap parameters, const std::string& where,
             const Backend& backend, Int8WeightMap int8_weights)
    : Model(std::move(config), DeviceTensors::upload(backend, std::move(parameters)), where,
            upload_int8_weights(backend, std::move(int8_weights))) {}

Model::Model(ModelConfig config, DeviceTensors parameters, const std::string& where,
             DeviceInt8Weights int8_weights)
    : config_(std::move(config)),
      backend_(&parameters.backend()),
      parameters_(std::move(parameters)),
      int8_weights_(std::move(int8_weights)) {
  validate_config(config_, where);
  if (parameters_.layout() != DeviceTensors::Layout::kPerTensor)
    throw std::logic_error("Model: parameters must be allocated per tensor");
  for (const auto& [name, q] : int8_weights_) {
    auto it = parameters_.find(name);
    if (it == parameters_.end() || it->second.shape != q.shape || it->second.data ||
        q.shape.size() != 2 || q.values.size() != Tensor::numel_of(q.shape) ||
        q.scales.size() != q.shape[0] || q.values.backend() != backend_ ||
        q.scales.backend() != backend_)
      throw Error(where + ": int8 weight \"" + name + "\" does not match its tensor");
  }
  for (const auto& [name, entry] : parameters_)
    if (!entry.data && entry.numel() > 0 && !int8_weights_.count(name))
      throw Error(where + ": tensor \"" + name + "\" holds no data");
  weights_ = bind_weights(config_, parameters_, where, &int8_weights_);
  if (holds_int8_weights()) inference_only_ = Precision::kInt8;
  if (const int64_t elements = sinusoid_table_elements(config_); elements > 0) {
    // Built on the host, then copied into the backend's memory: twice its bytes at once.
    check_memory(2 * elements * int64_t(sizeof(float)),
                 where + ": its sinusoid position table (max_positions × d_model)");
    std::vector<float> table(static_cast<size_t>(elements));
    fill_sinusoid_table(config_, table.data());
    upload(*backend_, table.data(), int64_t(table.size()), sinusoids_);
  }
}

DeviceTensors& Model::mutable_parameters() {
  if (holds_int8_weights())
    throw Error("this model holds its weights in int8 for inference only; load it in float32");
  if (inference_only_)
    throw Error("this model was loaded for inference only; load it again to change it");
  std::lock_guard<std::mutex> lock(prepared_->mutex);
  prepared_->by_precision.clear();
  return parameters_;
}

namespace {

std::string runs_only_in(Precision only, Precision asked) {
  return std::string("this model was loaded for inference in ") + precision_name(only) +
         " only, not " + precision_name(asked);
}

}  // namespace

void Model::set_inference_only(Precision precision) {
  if (inference_only_ && *inference_only_ != precision)
    throw Error(runs_only_in(*inference_only_, precision));
  std::lock_guard<std::mutex> lock(prepared_->mutex);
  if (!prepared_->by_precision.empty())
    throw std::logic_error("set_inference_only: the model is already prepared");
  inference_only_ = precision;
}

std::shared_ptr<const PreparedWeights> Model::prepared(Precision precision) const {
  if (inference_only_ && precision != *inference_only_)
    throw Error(runs_only_in(*inference_only_, precision));
  std::lock_guard<std::mutex> lock(prepared_->mutex);
  auto& prepared = prepared_->by_precision[precision];
  if (prepared) return prepared;
  if (!inference_only_) {
    prepared = prepare_weights(*backend_, config_, weights_, precision);
    return prepared;
  }
  // Inference only: each linear weight (float32 tensor or int8 rows) goes as soon as its
  // packed copy exists, so at no time are there two copies of all the weights. The embeddings
  // are read by every step: they stay, except a float32 table tied to the output projection,
  // whose rows the lookups then read from the packed projection.
  const std::map<std::string, ParameterRole> roles = parameter_roles(config_);
  auto has_role = [&](const std::string& name, ParameterRole role) {
    const auto it = roles.find(name);
    return it != roles.end() && it->second == role;
  };
  std::map<const void*, std::string> float_sources;  // data -> parameter name
  for (const auto& [name, entry] : parameters_)
    if ((has_role(name, ParameterRole::kLinearWeight) ||
         has_role(name, ParameterRole::kTokenEmbedding)) &&
        entry.data)
      float_sources.emplace(entry.data, name);
  std::map<const void*, std::string> int8_sources;  // values -> parameter name
  for (const auto& [name, q] : int8_weights_)
    if (has_role(name, ParameterRole::kLinearWeight)) int8_sources.emplace(q.values.data(), name);
  prepared = prepare_weights(*backend_, config_, weights_, precision, [&](const void* source) {
    if (auto f = float_sources.find(source); f != float_sources.end()) {
      parameters_.release(f->second);
      float_sources.erase(f);
    } else if (auto q = int8_sources.find(source); q != int8_sources.end()) {
      int8_weights_.at(q->second).values.reset();
      int8_sources.erase(q);
    }
  });
  release_freed_memory();
  return prepared;
}

const TransformerWeights& Model::sequence_weights(
    Precision precision, std::shared_ptr<const PreparedWeights>& hold) const {
  if (precision == Precision::kFloat32 && !inference_only_) return weights_;
  hold = prepared(precision);
  return hold->sequences;
}

const float* Model::encoder_positions() const {
  if (config_.position_encoding == PositionEncoding::kLearned) return weights_.encoder_pos_embed;
  if (config_.position_encoding == PositionEncoding::kSinusoidal) return sinusoids_.data();
  return nullptr;
}

const float* Model::decoder_positions() const {
  if (config_.position_encoding == PositionEncoding::kLearned) return weights_.decoder_pos_embed;
  if (config_.position_encoding == PositionEncoding::kSinusoidal) return sinusoids_.data();
  return nullptr;
}

TokenBatch make_batch(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                      const std::vector<std::vector<int32_t>>& targets,
                      const std::vector<int64_t>& members, size_t first, size_t stride) {
  std::vector<std::vector<int32_t>> src, tgt;
  for (size_t i = first; i < members.size(); i += stride) {
    src.push_back(sources[size_t(members[i])]);
    tgt.push_back(targets[size_t(members[i])]);
  }
  return make_batch(config, src, tgt);
}

TokenBatch make_batch(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                      const std::vector<std::vector<int32_t>>& targets) {
  if (sources.size() != targets.size())
    throw Error("make_batch: " + std::to_string(sources.size()) + " sources but " +
                std::to_string(targets.size()) + " targets");
  TokenBatch b;
  b.batch = int64_t(sources.size());
  const int64_t extra_src = config.src_append_eos ? 1 : 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    b.src_len = std::max<int64_t>(b.src_len, int64_t(sources[i].size()) + extra_src);
    b.tgt_len = std::max<int64_t>(b.tgt_len, int64_t(targets[i].size()) + 1);
  }
  const int64_t limit = sequence_positions(config);
  if (b.src_len > limit || b.tgt_len > limit)
    throw Error("a sequence of " + std::to_string(std::max(b.src_len, b.tgt_len)) +
                " positions is longer than the model allows (max_positions " +
                std::to_string(config.max_positions) + ", position_offset " +
                std::to_string(config.position_offset) + ")");
  b.src_ids.assign(size_t(b.batch * b.src_len), int32_t(config.pad_id));
  b.tgt_in.assign(size_t(b.batch * b.tgt_len), int32_t(config.pad_id));
  b.tgt_out.assign(size_t(b.batch * b.tgt_len), int32_t(config.pad_id));
  b.src_lengths.resize(size_t(b.batch));
  b.tgt_lengths.resize(size_t(b.batch));
  auto check = [](int32_t id, int64_t vocab, const char* side) {
    if (id < 0 || id >= vocab)
      throw Error(std::string("token id ") + std::to_string(id) + " is outside the " + side +
                  " vocabulary (size " + std::to_string(vocab) + ")");
  };
  for (int64_t i = 0; i < b.batch; ++i) {
    const auto& src = sources[size_t(i)];
    int32_t* src_row = b.src_ids.data() + i * b.src_len;
    for (size_t t = 0; t < src.size(); ++t) {
      check(src[t], config.src_vocab_size, "source");
      src_row[t] = src[t];
    }
    if (config.src_append_eos) src_row[src.size()] = int32_t(config.eos_id);
    b.src_lengths[size_t(i)] = int32_t(src.size() + size_t(extra_src));

    const auto& tgt = targets[size_t(i)];
    int32_t* in_row = b.tgt_in.data() + i * b.tgt_len;
    int32_t* out_row = b.tgt_out.data() + i * b.tgt_len;
    in_row[0] = int32_t(config.bos_id);
    for (size_t t = 0; t < tgt.size(); ++t) {
      check(tgt[t], config.tgt_vocab_size, "target");
      in_row[t + 1] = tgt[t];
      out_row[t] = tgt[t];
    }
    out_row[tgt.size()] = int32_t(config.eos_id);
    b.tgt_lengths[size_t(i)] = int32_t(tgt.size() + 1);
  }
  return b;
}

BatchShape shape_of(const TokenBatch& batch) {
  BatchShape shape{batch.batch, batch.src_len, batch.tgt_len, 0};
  for (int32_t n : batch.tgt_lengths) shape.target_tokens += n;
  return shape;
}

BatchShape batch_shape(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                       const std::vector<std::vector<int32_t>>& targets,
                       const std::vector<int64_t>& members, size_t first, size_t stride) {
  const int64_t extra_src = config.src_append_eos ? 1 : 0;
  BatchShape shape;
  for (size_t i = first; i < members.size(); i += stride) {
    const int64_t src = int64_t(sources[size_t(members[i])].size()) + extra_src;
    const int64_t tgt = int64_t(targets[size_t(members[i])].size()) + 1;  // bos / eos
    ++shape.batch;
    shape.src_len = std::max(shape.src_len, src);
    shape.tgt_len = std::max(shape.tgt_len, tgt);
    shape.target_tokens += tgt;
  }
  return shape;
}

namespace {

// The buffers of target_states beyond the stacks': the real positions, their labels and their
// decoder states, for `count` target tokens.
template <typename Sizer>
void target_state_buffers(int64_t d_model, int64_t count, StackCache& cache,
                          DeviceBuffer<float>& states, Sizer& sizer) {
  sizer.need(cache.target_rows, count);    // [tokens]
  sizer.need(cache.target_labels, count);  // [tokens]
  sizer.need(states, count * d_model);     // [tokens, D]
}

void upload_target_positions(const Backend& backend, const TokenBatch& batch, StackCache& cache,
                             std::vector<int64_t>& rows, std::vector<int32_t>& labels) {
  rows.clear();
  labels.clear();
  for (int64_t b = 0; b < batch.batch; ++b)
    for (int64_t t = 0; t < batch.tgt_lengths[size_t(b)]; ++t) {
      rows.push_back(b * batch.tgt_len + t);
      labels.push_back(batch.tgt_out[size_t(b * batch.tgt_len + t)]);
    }
  upload(backend, rows.data(), int64_t(rows.size()), cache.target_rows);
  upload(backend, labels.data(), int64_t(labels.size()), cache.target_labels);
}

}  // namespace

int64_t target_states(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                      const DropoutOptions& dropout, StackCache& cache, std::vector<int64_t>& rows,
                      std::vector<int32_t>& labels, DeviceBuffer<float>& states) {
  const Backend& backend = model.backend();
  const int64_t d = model.config().d_model;
  encoder_forward(model, w, batch, dropout, cache);
  decoder_forward(model, w, batch, dropout, cache);
  Allocate sizer{backend};
  target_state_buffers(d, shape_of(batch).target_tokens, cache, states, sizer);
  upload_target_positions(backend, batch, cache, rows, labels);
  const int64_t count = int64_t(rows.size());
  backend.gather_rows(cache.decoder_output, d, cache.target_rows.data(), count, d, states.data(),
                      d);  // [tokens, D]
  return count;
}

void plan_target_states(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                        const DropoutOptions& dropout, StackCache& cache,
                        DeviceBuffer<float>& states, WorkspacePlan& plan) {
  plan_encoder_forward(model, w, shape, dropout, cache, plan);
  plan_decoder_forward(model, w, shape, dropout, cache, plan);
  target_state_buffers(model.config().d_model, shape.target_tokens, cache, states, plan);
}

namespace {

// The buffers of score_forward itself (the stacks' and the output head's aside).
template <typename Sizer>
void score_buffers(int64_t count, ScoringWorkspace& ws, Sizer& sizer) {
  sizer.need(ws.picked, count);  // [tokens] log p of each position's label
}

}  // namespace

void score_forward(const Model& model, const TokenBatch& batch, ScoringWorkspace& ws,
                   std::vector<float>& token_logprobs, Precision precision) {
  std::shared_ptr<const PreparedWeights> hold;
  const TransformerWeights& w = model.sequence_weights(precision, hold);
  const Backend& backend = model.backend();
  const int64_t vocab = model.config().tgt_vocab_size;
  ws.cache.training = false;
  const int64_t count = target_states(model, w, batch, {}, ws.cache, ws.rows, ws.labels, ws.states);
  Allocate sizer{backend};
  score_buffers(count, ws, sizer);
  const int32_t* device_labels = ws.cache.target_labels.data();  // [valid_rows]
  float* picked = ws.picked.data();                              // [valid_rows]
  output_head_forward(backend, w.output, ws.states.data(), count, ws.head,
                      [&](const OutputChunk& c) {
                        backend.log_softmax_pick(c.logits, device_labels + c.begin, c.rows, vocab,
                                                 picked + c.begin);
                      });
  std::vector<float> host_picked(static_cast<size_t>(count));
  backend.copy_to_host(picked, count * int64_t(sizeof(float)), host_picked.data());
  token_logprobs.assign(size_t(batch.batch * batch.tgt_len), 0.f);
  for (int64_t r = 0; r < count; ++r)
    token_logprobs[size_t(ws.rows[size_t(r)])] = host_picked[size_t(r)];
}

void plan_score_forward(const Model& model, const BatchShape& shape, ScoringWorkspace& ws,
                        Precision precision) {
  std::shared_ptr<const PreparedWeights> hold;
  const TransformerWeights& w = model.sequence_weights(precision, hold);
  const int64_t count = shape.target_tokens;
  ws.cache.training = false;
  plan_target_states(model, w, shape, {}, ws.cache, ws.states, ws.plan);
  score_buffers(count, ws, ws.plan);
  plan_output_head_forward(model.backend(), w.output, count, ws.head, ws.plan);
}

}  // namespace tfm
