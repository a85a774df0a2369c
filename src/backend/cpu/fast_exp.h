// exp() for softmax-style loops that GCC can vectorise (`#pragma omp simd`): Cody–Waite range
// reduction x = n·ln2 + r, a degree-6 polynomial for e^r on |r| <= ln2/2, and 2^n built in the
// exponent bits. Relative error about 2e-7 over the float range; inputs below -87 give 0.
// fast_tanh() builds on it for additive attention's inner loops. GCC vectorises the loops that
// call it only under -fno-trapping-math (CMakeLists.txt): its selects would otherwise stay scalar.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tfm {

#pragma omp declare simd
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;  // ln2 split in two for an exact reduction
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  const float scale = std::bit_cast<float>(bits);
  return x <= -87.3f ? 0.f : p * scale;
}

// tanh(x) = 1 - 2/(e^{2x} + 1): absolute error below 2e-7 (relative error grows near 0, where
// the subtraction cancels); saturates to ±1 exactly for |x| > 44.
#pragma omp declare simd
inline float fast_tanh(float x) {
  return 1.f - 2.f / (fast_exp(2.f * x) + 1.f);
}

// log Σ exp(x[c]) of one row, shifted by its maximum for stability: log_softmax_pick's
// (elementwise.cpp), and best_tokens' where it normalises logits. Inlined
// into each caller's clone (cpu_dispatch.h), so every caller computes it alike.
__attribute__((always_inline)) inline float log_sum_exp(const float* x, int64_t cols) {
  float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
  for (int64_t c = 0; c < cols; ++c) max_value = x[c] > max_value ? x[c] : max_value;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < cols; ++c) sum += fast_exp(x[c] - max_value);
  return max_value + std::log(sum);
}

}  // namespace tfm
