// Random initialisation of a new model: Xavier-uniform matrices (as the reference
// implementations of this model do), zero biases, unit LayerNorm gains, and N(0, d^-1/2)
// embeddings so that embedding × sqrt(d_model) has unit scale.
#pragma once

#include <cstdint>

#include "model/transformer.h"

namespace tfm {

Model init_model(const ModelConfig& config, uint64_t seed, const Backend& backend);

}  // namespace tfm
