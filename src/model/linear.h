// The linear map y = x·Wᵀ + b every sublayer of §3 is built from, as a forward / backward pair,
// with the helpers all layers share: buffers that grow once (ensure_size), dropout keys, and the
// scratch of the backward passes. A forward saves what its backward needs in an explicit cache.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace tfm {

// Grows `buffer` to at least n elements (never shrinks, so steady-state calls do not
// allocate) and returns its data.
template <typename T>
T* ensure_size(std::vector<T>& buffer, int64_t n) {
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

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
  std::vector<float> d_context;   // [B, Tq, D]
  std::vector<float> dq;          // [B, Tq, D]
  std::vector<float> dk;          // [B, Tk, D]
  std::vector<float> dv;          // [B, Tk, D]
  std::vector<float> d_hidden;    // [rows, d_ff]
  std::vector<float> d_sublayer;  // [rows, D] gradient entering a sublayer's function
  std::vector<float> d_normed;    // [rows, D] gradient of a pre-norm sublayer's function input
  std::vector<float> d_stream;    // [rows, D] gradient of the residual stream
  std::vector<float> d_memory;    // [B, S, D] gradient of the encoder output (cross-attention)
};

}  // namespace tfm
