// The residual sublayer of §3.1 around any function F (attention or feed-forward):
// post-norm LayerNorm(x + Dropout(F(x))) as in the paper, or pre-norm x + Dropout(F(LayerNorm(x))).
// A template so that training, inference and incremental decoding share one definition.
#pragma once

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

}  // namespace tfm
