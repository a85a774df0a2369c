// Quantisation to int8 and back (see int8_quantization.h): plain loops the compiler
// vectorises, rows spread over the threads when there are enough of them.
#include "backend/cpu/int8_quantization.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/parallel_threshold.h"

namespace tfm {

namespace {

// The largest magnitude in x[k]; NaN compares false, so it never wins.
float max_magnitude(const float* x, int64_t k) {
  float largest = 0.f;
#pragma omp simd reduction(max : largest)
  for (int64_t c = 0; c < k; ++c) largest = std::max(largest, std::abs(x[c]));
  return largest;
}

}  // namespace

TFM_CPU_KERNEL void int8_row_sums(const int8_t* q, int64_t n, int64_t k, int32_t* column_sums) {
  for (int64_t r = 0; r < n; ++r) {
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < k; ++c) sum += q[r * k + c];
    column_sums[r] = sum;
  }
}

TFM_CPU_KERNEL void quantize_activation_rows(const float* x, int64_t m, int64_t k, int64_t ldx,
                                             uint8_t* q, float* scales) {
#pragma omp parallel for if (m * k >= kParallelElements && omp_get_level() == 0)
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    uint8_t* out = q + r * k;
    const float largest = max_magnitude(row, k);
    const float scale = largest > 0.f ? largest / 127.f : 1.f;
    const float inverse = 1.f / scale;
    // row[c] · inverse lies in [−127, 127], so + 128.5 is positive and truncation rounds. The
    // bounds are written so that NaN (v < 255 is false) still converts defined, to 255, and as
    // plain comparisons, which GCC vectorises (std::min/max here kept the loop scalar).
#pragma omp simd
    for (int64_t c = 0; c < k; ++c) {
      float v = row[c] * inverse + 128.5f;
      v = v < 255.f ? v : 255.f;
      v = v > 1.f ? v : 1.f;
      out[c] = uint8_t(int32_t(v));
    }
    scales[r] = scale;
  }
}

TFM_CPU_KERNEL void dequantize_products(const int32_t* products, int64_t m, int64_t n,
                                        const int32_t* column_sums, const float* row_scales,
                                        const float* column_scales, float* y, int64_t ldy,
                                        const float* bias, bool relu) {
#pragma omp parallel for if (m * n >= kParallelElements && omp_get_level() == 0)
  for (int64_t r = 0; r < m; ++r) {
    const int32_t* in = products + r * n;
    float* out = y + r * ldy;
    const float row_scale = row_scales[r];
#pragma omp simd
    for (int64_t c = 0; c < n; ++c)
      out[c] = float(in[c] - 128 * column_sums[c]) * (row_scale * column_scales[c]);
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) out[c] += bias[c];
    }
    if (relu) {
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) out[c] = out[c] > 0.f ? out[c] : 0.f;
    }
  }
}

}  // namespace tfm
