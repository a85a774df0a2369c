// The residual sublayer of §3.1 around any function F (attention or feed-forward):
// post-norm LayerNorm(x + Dropout(F(x))) as in the paper, or pre-norm x + Dropout(F(LayerNorm(x))).
// Templates so that training, inference and incremental decoding share one definition, with
// the backward beside the forward.
#pragma once

#include <algorithm>

#include "kernels/elementwise.h"
#include "model/stacks.h"

namespace tfm {

// function(in [rows, D], out [rows, D]) is the sublayer's attention or feed-forward.
template <typename Function>
void sublayer_forward(const ModelConfig& config, const LayerNormWeights& norm, const float* input,
                      int64_t rows, float dropout, uint64_t key, SublayerCache& cache,
                      Function&& function) {
  const int64_t d = config.d_model, n = rows * d;
  const float eps = float(config.layer_norm_eps);
  float* output = ensure_size(cache.output, n);  // [rows, D]
  float* mean = ensure_size(cache.norm.mean, rows);
  float* rstd = ensure_size(cache.norm.rstd, rows);
  auto drop = [&](float* x) {
    if (dropout <= 0.f) return;
    uint8_t* mask = ensure_size(cache.dropout_mask, n);
    dropout_mask(mask, n, dropout, key);
    apply_dropout(x, mask, n, dropout);
  };
  if (config.norm == NormPosition::kPost) {
    float* residual = ensure_size(cache.residual, n);  // [rows, D]
    function(input, residual);
    drop(residual);
    add_inplace(residual, input, n);
    layer_norm(residual, norm.weight, norm.bias, output, rows, d, eps, mean, rstd);
  } else {
    float* normed = ensure_size(cache.normed, n);  // [rows, D]
    layer_norm(input, norm.weight, norm.bias, normed, rows, d, eps, mean, rstd);
    function(normed, output);
    drop(output);
    add_inplace(output, input, n);
  }
}

// The backward of sublayer_forward (cache from its training call, d_output [rows, D]):
// function_backward(d_out, function_input, d_function_input, accumulate) runs the function's
// backward. d_input (= the sublayer input's gradient) must not alias d_output.
template <typename FunctionBackward>
void sublayer_backward(const ModelConfig& config, const LayerNormWeights& norm,
                       const LayerNormParams<float>& norm_grad, const float* input, int64_t rows,
                       float dropout, SublayerCache& cache, const float* d_output, float* d_input,
                       BackwardScratch& scratch, FunctionBackward&& function_backward) {
  const int64_t d = config.d_model, n = rows * d;
  float* d_function_out = ensure_size(scratch.d_sublayer, n);  // [rows, D]
  const float* mean = cache.norm.mean.data();
  const float* rstd = cache.norm.rstd.data();
  if (config.norm == NormPosition::kPost) {
    // d residual = LN backward; it flows to the input directly and through the dropout to F.
    layer_norm_backward(d_output, cache.residual.data(), mean, rstd, norm.weight, d_input,
                        norm_grad.weight, norm_grad.bias, rows, d, false);
    std::copy_n(d_input, n, d_function_out);
    if (dropout > 0.f) apply_dropout(d_function_out, cache.dropout_mask.data(), n, dropout);
    function_backward(d_function_out, input, d_input, true);
  } else {
    std::copy_n(d_output, n, d_input);
    std::copy_n(d_output, n, d_function_out);
    if (dropout > 0.f) apply_dropout(d_function_out, cache.dropout_mask.data(), n, dropout);
    float* d_normed = ensure_size(scratch.d_normed, n);  // [rows, D]
    function_backward(d_function_out, cache.normed.data(), d_normed, false);
    layer_norm_backward(d_normed, input, mean, rstd, norm.weight, d_input, norm_grad.weight,
                        norm_grad.bias, rows, d, true);
  }
}

}  // namespace tfm
