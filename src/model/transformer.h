// The whole encoder–decoder of §3 (Figure 1): a Model owns its config and parameters; the
// forward functions run the encoder stack, the decoder stack (teacher-forced) and the output
// projection + log-softmax, on padded batches, with all activations in a reusable workspace.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tfm {

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
  // [max_positions, D] encodings added to the encoder / decoder inputs, or null for "none".
  const float* encoder_positions() const;
  const float* decoder_positions() const;

 private:
  ModelConfig config_;
  TensorMap parameters_;
  TransformerWeights weights_;
  std::vector<float> sinusoids_;  // [max_positions, D] when sinusoidal
};

// Reads a model .safetensors file (config from __metadata__.config).
Model load_model(const std::string& path);
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

struct ForwardWorkspace {
  std::vector<float> encoder_out;  // [B, S, D] memory
  std::vector<float> decoder_out;  // [B, T, D]
  std::vector<float> sublayer;     // [B, max(S,T), D] sublayer output before the residual add
  std::vector<float> normed;       // [B, max(S,T), D] pre-norm input of a sublayer
  std::vector<float> ffn_hidden;   // [B, max(S,T), d_ff]
  std::vector<float> logits;       // [rows_per_chunk, V]
  AttentionWorkspace attention;
};

// Single layers, in place on x (used by the stacks and by layer-level tests).
// x: [B, S, D]; src_lengths: [B].
void encoder_layer_forward(const ModelConfig& config, const EncoderLayerWeights& w, float* x,
                           int64_t batch, int64_t src_len, const int32_t* src_lengths,
                           ForwardWorkspace& ws);
// x: [B, T, D]; memory: [B, S, D].
void decoder_layer_forward(const ModelConfig& config, const DecoderLayerWeights& w, float* x,
                           int64_t batch, int64_t tgt_len, const int32_t* tgt_lengths,
                           const float* memory, int64_t src_len, const int32_t* src_lengths,
                           ForwardWorkspace& ws);

// ws.encoder_out[B, S, D] = encoder stack output (after the final norm for pre-norm).
void encoder_forward(const Model& model, const TokenBatch& batch, ForwardWorkspace& ws);
// ws.decoder_out[B, T, D] = decoder stack output given ws.encoder_out.
void decoder_forward(const Model& model, const TokenBatch& batch, ForwardWorkspace& ws);

// token_logprobs[B, T]: log p(tgt_out[b, t] | ...) for t < tgt_lengths[b], 0 past the length.
void score_forward(const Model& model, const TokenBatch& batch, ForwardWorkspace& ws,
                   std::vector<float>& token_logprobs);

}  // namespace tfm
