// Views of a model's parameter tensors, grouped the way the layers use them. Binding checks
// every tensor's presence and shape against the config, so layers never see a bad weight.
#pragma once

#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace tfm {

struct LinearWeights {
  const float* weight = nullptr;  // [out, in]
  const float* bias = nullptr;    // [out] or null
  int64_t in = 0, out = 0;
};

struct LayerNormWeights {
  const float* weight = nullptr;  // [d_model]
  const float* bias = nullptr;    // [d_model]
};

struct AttentionWeights {
  LinearWeights q, k, v, o;
};

struct FeedForwardWeights {
  LinearWeights fc1, fc2;  // fc1: [d_ff, d_model], fc2: [d_model, d_ff]
};

struct EncoderLayerWeights {
  AttentionWeights self_attn;
  LayerNormWeights norm1;
  FeedForwardWeights ffn;
  LayerNormWeights norm2;
};

struct DecoderLayerWeights {
  AttentionWeights self_attn;
  LayerNormWeights norm1;
  AttentionWeights cross_attn;
  LayerNormWeights norm2;
  FeedForwardWeights ffn;
  LayerNormWeights norm3;
};

struct TransformerWeights {
  const float* src_embed = nullptr;          // [src_vocab, d_model]
  const float* tgt_embed = nullptr;          // [tgt_vocab, d_model]
  const float* output_weight = nullptr;      // [tgt_vocab, d_model] (may alias an embedding)
  const float* output_bias = nullptr;        // [tgt_vocab] or null
  const float* encoder_pos_embed = nullptr;  // [max_positions, d_model] when learned
  const float* decoder_pos_embed = nullptr;
  std::vector<EncoderLayerWeights> encoder_layers;
  LayerNormWeights encoder_norm;  // pre-norm only
  std::vector<DecoderLayerWeights> decoder_layers;
  LayerNormWeights decoder_norm;  // pre-norm only
};

// Throws Error("<where>: missing tensor ..." / "... has shape ..., expected ...") on mismatch,
// and on tensors the config does not use.
void check_parameters(const ModelConfig& config, const TensorMap& tensors,
                      const std::string& where);

// Views into `tensors` (which must outlive the result); checks as above.
TransformerWeights bind_weights(const ModelConfig& config, const TensorMap& tensors,
                                const std::string& where);

// Single-layer binders used by tests and tools: prefix like "encoder.layers.0".
EncoderLayerWeights bind_encoder_layer(const TensorMap& tensors, const std::string& prefix);
DecoderLayerWeights bind_decoder_layer(const TensorMap& tensors, const std::string& prefix);
AttentionWeights bind_attention(const TensorMap& tensors, const std::string& prefix);

}  // namespace tfm
