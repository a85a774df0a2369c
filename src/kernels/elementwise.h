// Row-wise and element-wise kernels of the forward pass: bias + activation, residual adds,
// layer normalisation and log-softmax. Raw pointers and sizes only; no allocation.
#pragma once

#include <cstdint>

namespace tfm {

enum class Activation { kRelu, kGelu };

// y[rows, cols] += bias[cols]
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);

// y[rows, cols] = act(y + bias[cols]); bias may be null.
void add_bias_activation(float* y, const float* bias, int64_t rows, int64_t cols, Activation act);

// y[n] += x[n]
void add_inplace(float* y, const float* x, int64_t n);

// y[rows, cols] = (x - mean) / sqrt(var + eps) * gamma + beta, per row, biased variance.
// y may alias x.
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps);

// y[rows, cols] = x - logsumexp(x) per row; y may alias x.
void log_softmax(const float* x, float* y, int64_t rows, int64_t cols);

// x[n] *= s
void scale_inplace(float* x, float s, int64_t n);

}  // namespace tfm

namespace tfm {

// out[r] = log_softmax(logits[r, :])[targets[r]] for each of rows rows.
void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                      float* out);

}  // namespace tfm
