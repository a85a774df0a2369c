// Quantising weight rows to int8 (see int8_weights.h): a plain loop the compiler vectorises,
// rows spread over the threads.
#include "tensor/int8_weights.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tfm {

void quantize_weight_rows(const float* w, int64_t n, int64_t k, int8_t* values, float* scales) {
#pragma omp parallel for if (n * k >= (1 << 15) && omp_get_level() == 0)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = w + r * k;
    float largest = 0.f;  // NaN compares false, so it never wins
#pragma omp simd reduction(max : largest)
    for (int64_t c = 0; c < k; ++c) largest = std::max(largest, std::abs(row[c]));
    const float scale = largest > 0.f ? largest / 127.f : 1.f;
    const float inverse = 1.f / scale;
    int8_t* out = values + r * k;
    // Adding and removing 1.5 · 2^23 rounds |v| < 2^22 to the nearest integer, ties to even (as
    // nearbyint does), in a form the compiler vectorises.
    constexpr float kRound = 12582912.f;
#pragma omp simd
    for (int64_t c = 0; c < k; ++c) {
      const float v = std::max(-127.f, std::min(127.f, row[c] * inverse));
      out[c] = int8_t((v + kRound) - kRound);
    }
    scales[r] = scale;
  }
}

Int8Matrix quantize_weight_rows(const Tensor& w) {
  if (w.shape.size() != 2) throw std::invalid_argument("quantize_weight_rows: not a matrix");
  Int8Matrix q;
  q.shape = w.shape;
  q.values.resize(size_t(w.numel()));
  q.scales.resize(size_t(w.shape[0]));
  quantize_weight_rows(w.ptr(), w.shape[0], w.shape[1], q.values.data(), q.scales.data());
  return q;
}

}  // namespace tfm
