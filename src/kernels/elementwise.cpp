// Element-wise and row kernels. Loops are written so that GCC vectorises them for the
// target's SIMD width (-O3 -march=native); accumulations use double where rows are long.
#include "kernels/elementwise.h"

#include <cmath>

#include "kernels/fast_exp.h"

namespace tfm {

namespace {

// log Σ exp(x[c]) of one row, shifted by its maximum for stability.
inline float log_sum_exp(const float* x, int64_t cols) {
  float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
  for (int64_t c = 0; c < cols; ++c) max_value = x[c] > max_value ? x[c] : max_value;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < cols; ++c) sum += fast_exp(x[c] - max_value);
  return max_value + std::log(sum);
}

}  // namespace

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void add_bias_activation(float* y, const float* bias, int64_t rows, int64_t cols, Activation act) {
  const float inv_sqrt2 = 0.70710678118654752440f;
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    }
    if (act == Activation::kRelu) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = row[c] > 0.f ? row[c] : 0.f;
    } else {
      for (int64_t c = 0; c < cols; ++c)
        row[c] = 0.5f * row[c] * (1.f + std::erf(row[c] * inv_sqrt2));
    }
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += in[c];
    const float mean = sum / float(cols);
    float sum_sq = 0.f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t c = 0; c < cols; ++c) {
      const float d = in[c] - mean;
      sum_sq += d * d;
    }
    const float inv_std = 1.f / std::sqrt(sum_sq / float(cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] = (in[c] - mean) * inv_std * gamma[c] + beta[c];
  }
}

void log_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    const float log_sum = log_sum_exp(in, cols);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] = in[c] - log_sum;
  }
}

}  // namespace tfm

namespace tfm {

void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                      float* out) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = logits + r * cols;
    out[r] = in[targets[r]] - log_sum_exp(in, cols);
  }
}

}  // namespace tfm
