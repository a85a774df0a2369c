// The whole encoder–decoder of §3 (Figure 1): a Model owns its config and parameters; the
// forward functions run the encoder stack, the decoder stack (teacher-forced) and the output
// projection + log-softmax, on padded batches, with all activations in a reusable workspace.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/stacks.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tfm {

struct PreparedWeights;  // model/prepared_weights.h

class Model {
 public:
  // Validates config and parameter shapes (throws Error naming `where`).
  Model(ModelConfig config, TensorMap parameters, const std::string& where);
  Model(Model&&) = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const TransformerWeights& weights() const { return weights_; }
  const TensorMap& parameters() const { return parameters_; }
  // For optimizers: values may change in place, never shapes or names (the views stay valid).
  // Drops the prepared weights, so call it again before each change.
  TensorMap& mutable_parameters();
  // The weights prepared for inference in `precision` (every product, encoder, decoder and
  // output projection), built on first use and shared by every later caller (a translation run
  // prepares once). Thread-safe.
  std::shared_ptr<const PreparedWeights> prepared(Precision precision) const;
  // [max_positions, D] encodings added to the encoder / decoder inputs, or null for "none".
  const float* encoder_positions() const;
  const float* decoder_positions() const;

 private:
  ModelConfig config_;
  TensorMap parameters_;
  TransformerWeights weights_;
  std::vector<float> sinusoids_;  // [max_positions, D] when sinusoidal
  struct PreparedCache {
    std::mutex mutex;
    std::map<Precision, std::shared_ptr<const PreparedWeights>> by_precision;
  };
  std::unique_ptr<PreparedCache> prepared_ = std::make_unique<PreparedCache>();
};

// Reads a model .safetensors file (config from __metadata__.config); its weights must be finite
// (check_finite_parameters).
Model load_model(const std::string& path);

// The config of a model file's header (its metadata and declared shapes, before any tensor is
// read), checked: valid, and every declared shape what it asks for. Throws Error naming `where`.
ModelConfig model_config_of_header(const std::map<std::string, std::string>& metadata,
                                   const std::map<std::string, Shape>& shapes,
                                   const std::string& where);

// True when every element of every tensor is finite.
bool all_finite(const TensorMap& tensors);

// Weights read from files (models, checkpoints, imports) are checked for NaN / Inf: throws Error
// naming `where`, the first bad tensor and index. allow_nonfinite_weights(true) (the CLI's
// --allow-nonfinite) turns the check off for the whole process.
void check_finite_parameters(const TensorMap& parameters, const std::string& where);
void allow_nonfinite_weights(bool allow);
// Writes config + parameters atomically.
void save_model(const Model& model, const std::string& path);

// A padded batch of token ids. Rows are padded with pad_id up to src_len / tgt_len.
struct TokenBatch {
  int64_t batch = 0;
  int64_t src_len = 0;               // S: longest encoder input (eos included if appended)
  int64_t tgt_len = 0;               // T: longest decoder input (bos included)
  std::vector<int32_t> src_ids;      // [B, S] encoder input
  std::vector<int32_t> src_lengths;  // [B]
  std::vector<int32_t> tgt_in;       // [B, T] bos + target
  std::vector<int32_t> tgt_out;      // [B, T] target + eos (pad past the length)
  std::vector<int32_t> tgt_lengths;  // [B]
};

// Builds a batch from raw sentences (ids without bos/eos), applying the model's conventions:
// eos appended to sources if src_append_eos, bos prepended to decoder inputs, eos as last label.
// Throws Error if an id is outside the vocabulary or a sequence exceeds max_positions.
TokenBatch make_batch(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                      const std::vector<std::vector<int32_t>>& targets);

// token_logprobs[B, T]: log p(tgt_out[b, t] | ...) for t < tgt_lengths[b], 0 past the length.
// Runs both stacks (inference mode, no dropout) into cache, every product in `precision`.
void score_forward(const Model& model, const TokenBatch& batch, StackCache& cache,
                   std::vector<float>& token_logprobs, Precision precision = Precision::kFloat32);

}  // namespace tfm
