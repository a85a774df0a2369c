// The residual sublayer of §3.1 around any function F (attention or feed-forward):
// post-norm LayerNorm(x + Dropout(F(x))) as in the paper, or pre-norm x + Dropout(F(LayerNorm(x))).
// Templates so that training, inference and incremental decoding share one definition, with
// the backward beside the forward.
#pragma once

#include "model/stacks.h"

namespace tfm {

// The buffers sublayer_forward uses (F's own aside), for `rows` rows: its one size table.
template <typename Sizer>
void sublayer_forward_buffers(const ModelConfig& config, int64_t rows, float dropout,
                              SublayerCache& cache, Sizer& sizer) {
  const int64_t n = rows * config.d_model;
  sizer.need(cache.output, n);  // [rows, D]
  sizer.need(cache.norm.mean, rows);
  sizer.need(cache.norm.rstd, rows);
  if (config.norm == NormPosition::kPost)
    sizer.need(cache.residual, n);  // [rows, D]
  else
    sizer.need(cache.normed, n);  // [rows, D]
  if (dropout > 0.f) sizer.need(cache.dropout_mask, n);
}

// function(in [rows, D], out [rows, D]) is the sublayer's attention or feed-forward.
template <typename Function>
void sublayer_forward(const Backend& backend, const ModelConfig& config,
                      const LayerNormWeights& norm, const float* input, int64_t rows, float dropout,
                      uint64_t key, SublayerCache& cache, Function&& function) {
  const int64_t d = config.d_model, n = rows * d;
  const float eps = float(config.layer_norm_eps);
  Allocate sizer{backend};
  sublayer_forward_buffers(config, rows, dropout, cache, sizer);
  float* output = cache.output.data();  // [rows, D]
  float* mean = cache.norm.mean.data();
  float* rstd = cache.norm.rstd.data();
  auto drop = [&](float* x) {
    if (dropout <= 0.f) return;
    uint8_t* mask = cache.dropout_mask.data();
    backend.dropout_mask(mask, n, dropout, key);
    backend.apply_dropout(x, mask, n, dropout);
  };
  if (config.norm == NormPosition::kPost) {
    float* residual = cache.residual.data();  // [rows, D]
    function(input, residual);
    drop(residual);
    backend.add(residual, input, n);
    backend.layer_norm(residual, norm.weight, norm.bias, output, rows, d, eps, mean, rstd);
  } else {
    float* normed = cache.normed.data();  // [rows, D]
    backend.layer_norm(input, norm.weight, norm.bias, normed, rows, d, eps, mean, rstd);
    function(normed, output);
    drop(output);
    backend.add(output, input, n);
  }
}

// What sublayer_forward asks of its cache (F's own buffers aside).
inline void plan_sublayer_forward(const ModelConfig& config, int64_t rows, float dropout,
                                  SublayerCache& cache, WorkspacePlan& plan) {
  sublayer_forward_buffers(config, rows, dropout, cache, plan);
}

// The scratch sublayer_backward uses (F's backward aside), for `rows` rows.
template <typename Sizer>
void sublayer_backward_buffers(const ModelConfig& config, int64_t rows, BackwardScratch& scratch,
                               Sizer& sizer) {
  const int64_t n = rows * config.d_model;
  sizer.need(scratch.d_sublayer, n);                                       // [rows, D]
  if (config.norm == NormPosition::kPre) sizer.need(scratch.d_normed, n);  // [rows, D]
}

// The backward of sublayer_forward (cache from its training call): d_stream [rows, D] holds the
// gradient of the sublayer's output and is replaced, in place, by that of its input.
// function_backward(d_out, function_input, d_function_input, accumulate) runs the function's
// backward (d_function_input: = or += when accumulate).
template <typename FunctionBackward>
void sublayer_backward(const Backend& backend, const ModelConfig& config,
                       const LayerNormWeights& norm, const LayerNormParams<float>& norm_grad,
                       const float* input, int64_t rows, float dropout, SublayerCache& cache,
                       float* d_stream, BackwardScratch& scratch,
                       FunctionBackward&& function_backward) {
  const int64_t d = config.d_model, n = rows * d;
  Allocate sizer{backend};
  sublayer_backward_buffers(config, rows, scratch, sizer);
  float* d_function_out = scratch.d_sublayer.data();  // [rows, D]
  const float* mean = cache.norm.mean.data();
  const float* rstd = cache.norm.rstd.data();
  if (config.norm == NormPosition::kPost) {
    // d residual = LN backward (row by row, so in place); it flows to the input directly and
    // through the dropout to F.
    backend.layer_norm_backward(d_stream, cache.residual.data(), mean, rstd, norm.weight, d_stream,
                                norm_grad.weight, norm_grad.bias, rows, d, false);
    backend.copy(d_stream, n, d_function_out);
    if (dropout > 0.f) backend.apply_dropout(d_function_out, cache.dropout_mask.data(), n, dropout);
    function_backward(d_function_out, input, d_stream, true);
  } else {
    // The residual path passes d_stream through unchanged; F's path adds to it.
    backend.copy(d_stream, n, d_function_out);
    if (dropout > 0.f) backend.apply_dropout(d_function_out, cache.dropout_mask.data(), n, dropout);
    float* d_normed = scratch.d_normed.data();  // [rows, D]
    function_backward(d_function_out, cache.normed.data(), d_normed, false);
    backend.layer_norm_backward(d_normed, input, mean, rstd, norm.weight, d_stream,
                                norm_grad.weight, norm_grad.bias, rows, d, true);
  }
}

// What sublayer_backward asks of the scratch (F's backward aside).
inline void plan_sublayer_backward(const ModelConfig& config, int64_t rows,
                                   BackwardScratch& scratch, WorkspacePlan& plan) {
  sublayer_backward_buffers(config, rows, scratch, plan);
}

}  // namespace tfm
