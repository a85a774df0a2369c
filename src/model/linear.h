// The linear map y = x·Wᵀ + b every sublayer of §3 is built from, as a forward / backward pair,
// with the helpers all layers share: dropout keys and the scratch of the backward passes (in
// the backend's memory: backend/device_buffer.h). A forward saves what its backward needs in an
// explicit cache.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "model/weights.h"

namespace tfm {

// Mixes a seed with a site number into an independent dropout key.
uint64_t dropout_key(uint64_t seed, uint64_t site);

// y[rows, out] = x[rows, in] · Wᵀ + b, in w.prepared's precision, else w.precision
void linear_forward(const Backend& backend, const LinearWeights& w, const float* x, int64_t rows,
                    float* y);
// dx[rows, in] (= or += when accumulate_dx; skipped when null) = dy · W; dW += dyᵀ · x;
// db += Σ_rows dy. Both products in w.precision.
void linear_backward(const Backend& backend, const LinearWeights& w, const Linear<float>& g,
                     const float* x, const float* dy, int64_t rows, float* dx, bool accumulate_dx);

// Scratch of the backward passes, shared by all layers.
struct BackwardScratch {
  DeviceBuffer<float> d_context;   // [B, Tq, D]
  DeviceBuffer<float> dq;          // [B, Tq, D]
  DeviceBuffer<float> dk;          // [B, Tk, D]
  DeviceBuffer<float> dv;          // [B, Tk, D]
  DeviceBuffer<float> d_hidden;    // [rows, d_ff]
  DeviceBuffer<float> d_sublayer;  // [rows, D] gradient entering a sublayer's function
  DeviceBuffer<float> d_normed;    // [rows, D] gradient of a pre-norm sublayer's function input
  DeviceBuffer<float> d_stream;    // [rows, D] gradient of the residual stream
  DeviceBuffer<float> d_memory;    // [B, S, D] gradient of the encoder output (cross-attention)
};

}  // namespace tfm
