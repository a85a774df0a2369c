// A model's weights prepared once for inference in one number format: every Linear's matrix
// copied into the layout the backend's products read fastest (PackedMatrix, float32 or
// bfloat16), and the projections that read the same input stacked into one product
// (self-attention's Q|K|V, cross-attention's K|V). The encoder, the decoder (whole sequences or
// one position at a time), scoring and the output projection all run on these views through
// linear_forward. Training reads the float32 tensors directly: they change every step.
#pragma once

#include <deque>
#include <vector>

#include "kernels/gemm.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

struct PreparedWeights {
  Precision precision = Precision::kFloat32;
  // The model's views with every Linear's `prepared` set (and Attention::qkv / kv stacked);
  // norms, embeddings and biases still point at the model's tensors.
  TransformerWeights weights;
  std::deque<PackedMatrix> matrices;              // what the views' `prepared` point to
  std::deque<std::vector<float>> stacked_biases;  // [3D] or [2D] biases of qkv / kv
};

// Prepares `weights` (which must outlive the result, unchanged). Throws std::invalid_argument
// for bfloat16 on a CPU without native bfloat16 products.
std::unique_ptr<PreparedWeights> prepare_weights(const TransformerWeights& weights,
                                                 Precision precision);

}  // namespace tfm
