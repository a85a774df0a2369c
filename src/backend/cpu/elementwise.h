// Row-wise and element-wise kernels of the forward pass: bias + activation, residual adds,
// layer normalisation and log-softmax. Raw pointers and sizes only; no allocation.
#pragma once

#include <cstdint>

#include "backend/operation_types.h"

namespace tfm {

// y[rows, cols] += bias[cols]
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);

// pre[rows, cols] += bias (bias may be null), then out = act(pre); out may alias pre.
void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                         Activation act);

// y[n] += x[n]
void add_inplace(float* y, const float* x, int64_t n);

// y[rows, cols] = (x - mean) / sqrt(var + eps) * gamma + beta, per row, biased variance.
// y may alias x. mean / rstd ([rows], may be null) receive the statistics backward needs.
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps, float* mean = nullptr, float* rstd = nullptr);

// Backward of layer_norm given its input x and statistics: dx (= or += when accumulate),
// dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy. dx may be dy itself (not a partial overlap).
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate);

// d[n] *= act'(pre_activation[n]) — backward of add_bias_activation.
void activation_backward(float* d, const float* pre_activation, int64_t n, Activation act);

// dbias[cols] += Σ_rows dy[rows, cols] (rows ld apart)
void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                   int64_t ld, float* dbias);

// rounded_d[rows, cols] = bfloat16(relu_output > 0 ? d : 0), the ReLU's output held in
// bfloat16; column_sums[cols] (null: none) += Σ_rows of the same in float32.
void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows, int64_t cols,
                            uint16_t* rounded_d, float* column_sums);

// Backend::residual_layer_norm and its backward: the post-norm sublayer's dropout, residual add
// and layer norm, row by row in one pass.
void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                         uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                         float eps, float* y, float* mean, float* rstd, uint16_t* rounded_y);
void residual_layer_norm_backward(float* dy, const float* sum, const float* mean, const float* rstd,
                                  const float* gamma, float* dgamma, float* dbeta,
                                  const uint8_t* mask, float p, uint64_t key, float* d_f,
                                  uint16_t* rounded_d_f, float* d_f_column_sums, int64_t rows,
                                  int64_t cols);
// Inverted dropout with a counter-based generator: element i is kept iff
// hash(key, i) >= p, so masks depend only on (key, i) — reproducible, parallel, and
// needing no generator state to resume. mask[n] receives 1 (kept) or 0.
void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key);
// x[n] = x * keep / (1 - p): forward, and also backward on the gradient; keep is mask, or
// (mask null) drawn from key as dropout_mask draws it.
void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p, uint64_t key);

// x[n] *= s
void scale_inplace(float* x, float s, int64_t n);

}  // namespace tfm

namespace tfm {

// out[r] = log_softmax(logits[r, :])[targets[r]] for each of rows rows.
void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                      float* out);

}  // namespace tfm
