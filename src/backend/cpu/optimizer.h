// Parameter updates on flat arrays: Adam exactly as torch.optim.Adam computes it (bias
// corrections, eps added after the second-moment correction) and plain SGD; plus the squared
// L2 norm used for gradient clipping.
#pragma once

#include <cstdint>

#include "backend/operation_types.h"

namespace tfm {

// step counts from 1. m, v: the first and second moments, updated in place.
void adam_update(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamHyperparameters& h, int64_t step);

// param -= lr · grad
void sgd_update(float* param, const float* grad, int64_t n, float lr);

// Σ x² in double, summed in an order fixed by n alone (deterministic whatever the threads).
double sum_of_squares(const float* x, int64_t n);

}  // namespace tfm
