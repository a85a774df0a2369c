// Element-wise and row kernels. Loops are written so that GCC vectorises them for the
// target's SIMD width (-O3 -march=native); accumulations use double where rows are long.
#include "backend/cpu/elementwise.h"

#include <cmath>
#include <initializer_list>
#include <vector>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/parallel_threshold.h"
#include "tensor/float16.h"

namespace tfm {

namespace {

// One row of layer_norm: in[cols] normalised into out[cols] (may alias), its mean and 1/σ
// stored at mean_out[r] / rstd_out[r] where those are given. Inlined into each caller's
// clone (cpu_dispatch.h), so every caller rounds alike.
__attribute__((always_inline)) inline void normalize_row(const float* in, const float* gamma,
                                                         const float* beta, float* out,
                                                         int64_t cols, float eps, float* mean_out,
                                                         float* rstd_out, int64_t r) {
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
  if (mean_out) mean_out[r] = mean;
  if (rstd_out) rstd_out[r] = inv_std;
#pragma omp simd
  for (int64_t c = 0; c < cols; ++c) out[c] = (in[c] - mean) * inv_std * gamma[c] + beta[c];
}

// Dropout's keep decision for element i: a counter-based hash of (key, i) against p in units
// of 2^-24 (dropout_threshold), so that any pass over any part of a matrix draws the same mask.
inline uint32_t dropout_threshold(float p) {
  return uint32_t(double(p) * 16777216.0);
}
__attribute__((always_inline)) inline bool dropout_keeps(uint64_t key, uint64_t i,
                                                         uint32_t threshold) {
  uint64_t z = key + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return uint32_t(z >> 40) >= threshold;
}

// One row of layer_norm_backward: dx row `out` (= or += when accumulate; may alias g) from the
// gradient g and input `in` with their mean m and 1/σ s, and the row's dgamma / dbeta terms
// added to the block's partial sums lg / lb. Its callers keep their own OpenMP loops, which are
// cloned per instruction set with them (cpu_dispatch.h); an inlined helper's would not be.
__attribute__((always_inline)) inline void layer_norm_backward_row(const float* g, const float* in,
                                                                   float m, float s,
                                                                   const float* gamma, float* out,
                                                                   float* lg, float* lb,
                                                                   int64_t cols, bool accumulate) {
  float sum_gy = 0.f, sum_gy_xhat = 0.f;
#pragma omp simd reduction(+ : sum_gy, sum_gy_xhat)
  for (int64_t c = 0; c < cols; ++c) {
    const float xhat = (in[c] - m) * s;
    const float gy = g[c] * gamma[c];
    sum_gy += gy;
    sum_gy_xhat += gy * xhat;
    lg[c] += g[c] * xhat;
    lb[c] += g[c];
  }
  const float mean_gy = sum_gy / float(cols), mean_gy_xhat = sum_gy_xhat / float(cols);
  if (accumulate) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      out[c] += s * (g[c] * gamma[c] - mean_gy - (in[c] - m) * s * mean_gy_xhat);
  } else {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      out[c] = s * (g[c] * gamma[c] - mean_gy - (in[c] - m) * s * mean_gy_xhat);
  }
}

// Rows are split into a fixed number of contiguous blocks whose partial column sums (dgamma,
// dbeta, a bias gradient) are added in block order, so results do not depend on thread
// scheduling (resumed training must reproduce an uninterrupted run bit for bit).
constexpr int64_t kRowBlocks = 8;
// The rows of `block` of kRowBlocks.
inline int64_t row_block_begin(int64_t rows, int64_t block) {
  return rows * block / kRowBlocks;
}
// A row of n elements of this thread's own, kept from call to call (contents unspecified).
template <typename T>
T* thread_row(int64_t n) {
  thread_local std::vector<T> row;
  if (row.size() < size_t(n)) row.resize(size_t(n));
  return row.data();
}
// partial [kRowBlocks, sums, cols], zeroed.
inline float* row_block_partials(int64_t sums, int64_t cols) {
  thread_local std::vector<float> partials;
  partials.assign(size_t(kRowBlocks * sums * cols), 0.f);
  return partials.data();
}
// totals[s][cols] += Σ_blocks partial[block, s] in block order, for each s whose total is
// given (null: that sum is not wanted).
inline void add_row_block_partials(const float* partial, int64_t cols,
                                   std::initializer_list<float*> totals) {
  const int64_t sums = int64_t(totals.size());
  for (int64_t block = 0; block < kRowBlocks; ++block) {
    int64_t s = 0;
    for (float* total : totals) {
      const float* part = partial + (block * sums + s++) * cols;
      if (total)
        for (int64_t c = 0; c < cols; ++c) total[c] += part[c];
    }
  }
}

}  // namespace

TFM_CPU_KERNEL void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

TFM_CPU_KERNEL void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows,
                                        int64_t cols, Activation act) {
  const float inv_sqrt2 = 0.70710678118654752440f;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* in_row = pre + r * cols;
    float* out_row = out + r * cols;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) in_row[c] += bias[c];
    }
    if (act == Activation::kRelu) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out_row[c] = in_row[c] > 0.f ? in_row[c] : 0.f;
    } else {
      for (int64_t c = 0; c < cols; ++c)
        out_row[c] = 0.5f * in_row[c] * (1.f + std::erf(in_row[c] * inv_sqrt2));
    }
  }
}

TFM_CPU_KERNEL void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

TFM_CPU_KERNEL void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

TFM_CPU_KERNEL void layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                               int64_t rows, int64_t cols, float eps, float* mean_out,
                               float* rstd_out) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r)
    normalize_row(x + r * cols, gamma, beta, y + r * cols, cols, eps, mean_out, rstd_out, r);
}

TFM_CPU_KERNEL void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols,
                                        float p, uint64_t key, uint8_t* mask, const float* gamma,
                                        const float* beta, float eps, float* y, float* mean_out,
                                        float* rstd_out, uint16_t* rounded_y) {
  const uint32_t threshold = dropout_threshold(p);
  const float keep_scale = 1.f / (1.f - p);
  // Row by row, each row's four steps while it is in cache: the values of dropout_mask,
  // apply_dropout, add_inplace and layer_norm over the whole matrix.
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* sum = f + r * cols;
    const float* in = x + r * cols;
    if (p > 0.f) {
      // The decisions into the mask, or, where none is kept, into a row of this thread's own:
      // the same loop either way (the same fused multiply-adds, the same bits).
      uint8_t* keep = mask ? mask + r * cols : thread_row<uint8_t>(cols);
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        keep[c] = dropout_keeps(key, uint64_t(r * cols + c), threshold) ? 1 : 0;
        sum[c] = (keep[c] ? sum[c] * keep_scale : 0.f) + in[c];
      }
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) sum[c] += in[c];
    }
    float* out = y + r * cols;
    normalize_row(sum, gamma, beta, out, cols, eps, mean_out, rstd_out, r);
    if (rounded_y) {
      uint16_t* rounded = rounded_y + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) rounded[c] = float_to_bfloat16(out[c]);
    }
  }
}

TFM_CPU_KERNEL void layer_norm_backward(const float* dy, const float* x, const float* mean,
                                        const float* rstd, const float* gamma, float* dx,
                                        float* dgamma, float* dbeta, int64_t rows, int64_t cols,
                                        bool accumulate) {
  float* partial = row_block_partials(2, cols);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t block = 0; block < kRowBlocks; ++block) {
    float* lg = partial + block * 2 * cols;
    const int64_t end = row_block_begin(rows, block + 1);
    for (int64_t r = row_block_begin(rows, block); r < end; ++r)
      layer_norm_backward_row(dy + r * cols, x + r * cols, mean[r], rstd[r], gamma, dx + r * cols,
                              lg, lg + cols, cols, accumulate);
  }
  add_row_block_partials(partial, cols, {dgamma, dbeta});
}

TFM_CPU_KERNEL void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                                 const float* rstd, const float* gamma,
                                                 float* dgamma, float* dbeta, const uint8_t* mask,
                                                 float p, uint64_t key, float* d_f,
                                                 uint16_t* rounded_d_f, float* d_f_column_sums,
                                                 int64_t rows, int64_t cols) {
  const uint32_t threshold = dropout_threshold(p);
  const float keep_scale = 1.f / (1.f - p);
  // [kRowBlocks, 3, cols]: dgamma's, dbeta's and d_f's column sums
  float* partial = row_block_partials(3, cols);
  // layer_norm_backward's blocks, each row then dropped into d_f (and rounded, and summed) while
  // in cache.
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t block = 0; block < kRowBlocks; ++block) {
    float* lg = partial + block * 3 * cols;
    float* lf = lg + 2 * cols;
    // Without d_f, each row's gradient is dropped into a row of this thread's own.
    thread_local std::vector<float> dropped_row;
    if (!d_f) dropped_row.resize(size_t(cols));
    const int64_t end = row_block_begin(rows, block + 1);
    for (int64_t r = row_block_begin(rows, block); r < end; ++r) {
      float* d_sum = dy + r * cols;
      layer_norm_backward_row(d_sum, sum + r * cols, mean[r], rstd[r], gamma, d_sum, lg, lg + cols,
                              cols, false);
      float* out = d_f ? d_f + r * cols : dropped_row.data();  // [cols]
      if (p > 0.f) {
        // The forward's decisions: its mask, or drawn again where none was kept.
        const uint8_t* keep = mask ? mask + r * cols : nullptr;  // [cols]
        if (!keep) {
          uint8_t* drawn = thread_row<uint8_t>(cols);
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c)
            drawn[c] = dropout_keeps(key, uint64_t(r * cols + c), threshold) ? 1 : 0;
          keep = drawn;
        }
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] = keep[c] ? d_sum[c] * keep_scale : 0.f;
      } else {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] = d_sum[c];
      }
      if (rounded_d_f) {
        uint16_t* rounded = rounded_d_f + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) rounded[c] = float_to_bfloat16(out[c]);
      }
      if (d_f_column_sums) {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) lf[c] += out[c];
      }
    }
  }
  add_row_block_partials(partial, cols, {dgamma, dbeta, d_f_column_sums});
}

TFM_CPU_KERNEL void activation_backward(float* d, const float* pre_activation, int64_t n,
                                        Activation act) {
  if (act == Activation::kRelu) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) d[i] = pre_activation[i] > 0.f ? d[i] : 0.f;
  } else {
    const float inv_sqrt2 = 0.70710678118654752440f, inv_sqrt_2pi = 0.39894228040143267794f;
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const float x = pre_activation[i];
      const float cdf = 0.5f * (1.f + std::erf(x * inv_sqrt2));
      const float pdf = inv_sqrt_2pi * std::exp(-0.5f * x * x);
      d[i] *= cdf + x * pdf;
    }
  }
}

// One loop for each source of the gradient (d, or with d null the bfloat16 one in rounded_d),
// written out in this multiversioned function so that each vectorises for the CPU it runs on: a
// choice inside the loop, or a helper outside the clone, kept the bfloat16 step 10% slower.
TFM_CPU_KERNEL void relu_backward_bfloat16(const float* d, const uint16_t* relu_output,
                                           int64_t rows, int64_t cols, uint16_t* rounded_d,
                                           float* column_sums) {
  if (!column_sums) {
    const int64_t n = rows * cols;
    if (d) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
      for (int64_t i = 0; i < n; ++i)
        rounded_d[i] = float_to_bfloat16(bfloat16_to_float(relu_output[i]) > 0.f ? d[i] : 0.f);
    } else {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
      for (int64_t i = 0; i < n; ++i)
        rounded_d[i] = float_to_bfloat16(
            bfloat16_to_float(relu_output[i]) > 0.f ? bfloat16_to_float(rounded_d[i]) : 0.f);
    }
    return;
  }
  float* partial = row_block_partials(1, cols);  // [kRowBlocks, cols]
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t block = 0; block < kRowBlocks; ++block) {
    float* sums = partial + block * cols;
    const int64_t end = row_block_begin(rows, block + 1);
    for (int64_t r = row_block_begin(rows, block); r < end; ++r) {
      const uint16_t* out = relu_output + r * cols;
      uint16_t* rounded = rounded_d + r * cols;
      if (d) {
        const float* in = d + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          const float g = bfloat16_to_float(out[c]) > 0.f ? in[c] : 0.f;
          rounded[c] = float_to_bfloat16(g);
          sums[c] += g;
        }
      } else {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          const float g = bfloat16_to_float(out[c]) > 0.f ? bfloat16_to_float(rounded[c]) : 0.f;
          rounded[c] = float_to_bfloat16(g);
          sums[c] += g;
        }
      }
    }
  }
  add_row_block_partials(partial, cols, {column_sums});
}

TFM_CPU_KERNEL void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows,
                                  int64_t cols, int64_t ld, float* dbias) {
  for (int64_t r = 0; r < rows; ++r) {
    if (rounded_dy) {
      const uint16_t* g = rounded_dy + r * ld;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) dbias[c] += bfloat16_to_float(g[c]);
    } else {
      const float* g = dy + r * ld;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) dbias[c] += g[c];
    }
  }
}

TFM_CPU_KERNEL void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) {
  const uint32_t threshold = dropout_threshold(p);
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) mask[i] = dropout_keeps(key, uint64_t(i), threshold) ? 1 : 0;
}

TFM_CPU_KERNEL void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p, uint64_t key) {
  const float keep_scale = 1.f / (1.f - p);
  if (mask) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) x[i] = mask[i] ? x[i] * keep_scale : 0.f;
    return;
  }
  const uint32_t threshold = dropout_threshold(p);
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i)
    x[i] = dropout_keeps(key, uint64_t(i), threshold) ? x[i] * keep_scale : 0.f;
}

}  // namespace tfm

namespace tfm {

TFM_CPU_KERNEL void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows,
                                     int64_t cols, float* out) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = logits + r * cols;
    out[r] = in[targets[r]] - log_sum_exp(in, cols);
  }
}

}  // namespace tfm
