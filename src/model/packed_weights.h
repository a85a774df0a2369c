// The decoder's weight matrices packed once for incremental decoding (PackedMatrix): a decoding
// step multiplies only as many rows as there are live hypotheses, where reading weights in
// oneDNN's blocked layout instead of repacking them per call is what makes a step fast.
// Q, K, V of the self-attention are stacked into one product, as are K, V of the cross-attention.
#pragma once

#include <vector>

#include "kernels/gemm.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

struct PackedDecoderLayer {
  PackedMatrix self_qkv;             // [3D, D]: W_q, W_k, W_v
  std::vector<float> self_qkv_bias;  // [3D], empty when the projections have no bias
  PackedMatrix self_out;             // [D, D]
  PackedMatrix cross_query;          // [D, D]
  PackedMatrix cross_kv;             // [2D, D]: W_k, W_v applied to the encoder output
  std::vector<float> cross_kv_bias;  // [2D] or empty
  PackedMatrix cross_out;            // [D, D]
  PackedMatrix fc1;                  // [d_ff, D]
  PackedMatrix fc2;                  // [D, d_ff]
};

struct PackedDecoderWeights {
  std::vector<PackedDecoderLayer> layers;
  PackedMatrix output;  // [V, D] the output projection
};

PackedDecoderWeights pack_decoder_weights(const ModelConfig& config,
                                          const TransformerWeights& weights, Precision precision);

// y[rows, out] = x[rows, in] · Wᵀ + bias (bias null: none). The packed twin of linear_forward.
void packed_linear_forward(const PackedMatrix& w, const float* bias, const float* x, int64_t rows,
                           float* y);

}  // namespace tfm
