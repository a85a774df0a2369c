// The residual sublayer of §3.1 around any function F (attention or feed-forward):
// post-norm LayerNorm(x + Dropout(F(x))) as in the paper, or pre-norm x + Dropout(F(LayerNorm(x))).
// Templates so that training, inference and incremental decoding share one definition, with
// the backward beside the forward.
#pragma once

#include "model/stacks.h"

namespace tfm {

// Whether a sublayer's norm hands `reader`, the product that reads what it writes, a bfloat16
// copy too: post-norm, where the norm's pass writes the copy (forward: its output, in
// SublayerCache::rounded_output, for the next sublayer's first products; backward: F's output
// gradient, for F's last product), and where `reader` reads such a copy (a bfloat16 step's
// products, or weights prepared in bfloat16: reads_bfloat16_input). That product's rounding pass
// is then gone. A layer may name one of its own products as the following layer's reader: a
// model's products share one precision.
inline bool sublayer_rounds_for(const ModelConfig& config, const LinearWeights& reader) {
  return config.norm == NormPosition::kPost && reads_bfloat16_input(reader);
}

// The buffers sublayer_forward uses (F's own aside), for `rows` rows: its one size table.
// output_shared: the stack's products read bfloat16 copies (sublayer_rounds_for its layers'
// readers), so the float32 output is read only by the next sublayer's forward (its residual
// sum), the encoder's final copy or the output head's gather of the decoder's output (straight
// after the decoder's forward), never by a backward: in a planned workspace it lies in the
// shared slot of its place in the layer (SublayerCache::output_slot).
template <typename Sizer>
void sublayer_forward_buffers(const Backend& backend, const ModelConfig& config, int64_t rows,
                              float dropout, bool round_output, bool output_shared,
                              SublayerCache& cache, Sizer& sizer) {
  const int64_t n = rows * config.d_model;
  if (output_shared)
    sizer.need(cache.output, n, cache.output_slot);  // [rows, D]
  else
    sizer.need(cache.output, n);  // [rows, D]
  sizer.need(cache.norm.mean, rows);
  sizer.need(cache.norm.rstd, rows);
  if (config.norm == NormPosition::kPost)
    sizer.need(cache.residual, n);  // [rows, D]
  else
    sizer.need(cache.normed, n);  // [rows, D]
  dropout_mask_buffer(backend, dropout, n, cache.dropout_mask, sizer);
  if (round_output && rows > 0) sizer.need(cache.rounded_output, n);  // [rows, D]
}

// function(in [rows, D], out [rows, D]) is the sublayer's attention or feed-forward; `in` is a
// MatmulOperand: the values, and their bfloat16 copy where one comes with them (else null).
// round_output: sublayer_rounds_for the next product (the copy then in cache.rounded_output);
// output_shared: as sublayer_forward_buffers.
template <typename Function>
void sublayer_forward(const Backend& backend, const ModelConfig& config,
                      const LayerNormWeights& norm, MatmulOperand input, int64_t rows,
                      float dropout, uint64_t key, bool round_output, bool output_shared,
                      SublayerCache& cache, Function&& function) {
  const int64_t d = config.d_model, n = rows * d;
  const float eps = float(config.layer_norm_eps);
  Allocate sizer{backend};
  sublayer_forward_buffers(backend, config, rows, dropout, round_output, output_shared, cache,
                           sizer);
  float* output = cache.output.data();  // [rows, D]
  float* mean = cache.norm.mean.data();
  float* rstd = cache.norm.rstd.data();
  cache.dropout_key = key;
  if (config.norm == NormPosition::kPost) {
    uint8_t* mask = dropout_mask_of(backend, dropout, n, cache.dropout_mask);  // [rows, D] or null
    float* residual = cache.residual.data();  // [rows, D] F's output, then the norm's input
    function(input, residual);
    uint16_t* rounded_output = round_output && rows > 0 ? cache.rounded_output.data() : nullptr;
    backend.residual_layer_norm(residual, input.values, rows, d, dropout, key, mask, norm.weight,
                                norm.bias, eps, output, mean, rstd, rounded_output);
    cache.output_rounded = rounded_output;
  } else {
    float* normed = cache.normed.data();  // [rows, D]
    backend.layer_norm(input.values, norm.weight, norm.bias, normed, rows, d, eps, mean, rstd);
    function(MatmulOperand{normed}, output);
    dropout_forward(backend, output, n, dropout, key, cache.dropout_mask);
    backend.add(output, input.values, n);
    cache.output_rounded = nullptr;
  }
}

// What sublayer_forward asks of its cache (F's own buffers aside).
inline void plan_sublayer_forward(const Backend& backend, const ModelConfig& config, int64_t rows,
                                  float dropout, bool round_output, bool output_shared,
                                  SublayerCache& cache, WorkspacePlan& plan) {
  sublayer_forward_buffers(backend, config, rows, dropout, round_output, output_shared, cache,
                           plan);
}

// The scratch sublayer_backward uses (F's backward aside), for `rows` rows. F's last product is
// `last`.
template <typename Sizer>
void sublayer_backward_buffers(const ModelConfig& config, const LinearWeights& last, int64_t rows,
                               BackwardScratch& scratch, Sizer& sizer) {
  const int64_t n = rows * config.d_model;
  // [rows, D] F's output gradient in bfloat16: F's last product's (linear_backward's own buffer)
  const bool rounded = rows > 0 && sublayer_rounds_for(config, last);
  if (rounded) sizer.need(scratch.rounded_d_out, n);
  // [rows, D] the same in float32, where F's backward reads it: not where the norm's backward
  // writes the bfloat16 copy and sums the last product's bias gradient (sublayer_backward)
  if (!rounded) sizer.need(scratch.d_sublayer, n);
  if (config.norm == NormPosition::kPre) sizer.need(scratch.d_normed, n);  // [rows, D]
}

// The backward of sublayer_forward (cache from its training call): d_stream [rows, D] holds the
// gradient of the sublayer's output and is replaced, in place, by that of its input.
// function_backward(d_out, rounded_d_out, function_input, d_function_input, accumulate,
// last_bias_summed) runs the function's backward (d_function_input: = or += when accumulate);
// rounded_d_out is d_out in bfloat16 where sublayer_rounds_for(config, last) (else null), for F's
// last product `last`, and d_out is then null (F's products read the bfloat16 copy only);
// last_bias_summed: the gradient of that product's bias, last_bias_grad (null: it has none), is
// summed here already (post-norm: in the norm's backward pass), so F's backward leaves it alone.
template <typename FunctionBackward>
void sublayer_backward(const Backend& backend, const ModelConfig& config,
                       const LayerNormWeights& norm, const LayerNormParams<float>& norm_grad,
                       const LinearWeights& last, float* last_bias_grad, const float* input,
                       int64_t rows, float dropout, SublayerCache& cache, float* d_stream,
                       BackwardScratch& scratch, FunctionBackward&& function_backward) {
  const int64_t d = config.d_model, n = rows * d;
  if (rows == 0) return;  // no gradient flows (and an empty buffer may be null)
  Allocate sizer{backend};
  sublayer_backward_buffers(config, last, rows, scratch, sizer);
  const float* mean = cache.norm.mean.data();
  const float* rstd = cache.norm.rstd.data();
  if (config.norm == NormPosition::kPost) {
    // d residual = LN backward (row by row, so in place); it flows to the input directly and
    // through the dropout to F, in float32 or only in bfloat16 (sublayer_backward_buffers), with
    // the column sums that are F's last bias gradient taken in the same pass.
    uint16_t* rounded_d_function_out =  // [rows, D]
        rows > 0 && sublayer_rounds_for(config, last) ? scratch.rounded_d_out.data() : nullptr;
    float* d_function_out =  // [rows, D]
        rounded_d_function_out ? nullptr : scratch.d_sublayer.data();
    backend.residual_layer_norm_backward(
        d_stream, cache.residual.data(), mean, rstd, norm.weight, norm_grad.weight, norm_grad.bias,
        dropout_mask_of(backend, dropout, n, cache.dropout_mask), dropout, cache.dropout_key,
        d_function_out, rounded_d_function_out, last_bias_grad, rows, d);
    function_backward(d_function_out, rounded_d_function_out, input, d_stream, true, true);
  } else {
    // The residual path passes d_stream through unchanged; F's path adds to it.
    float* d_function_out = scratch.d_sublayer.data();  // [rows, D]
    backend.copy(d_stream, n, d_function_out);
    dropout_backward(backend, d_function_out, n, dropout, cache.dropout_key, cache.dropout_mask);
    float* d_normed = scratch.d_normed.data();  // [rows, D]
    function_backward(d_function_out, nullptr, cache.normed.data(), d_normed, false, false);
    backend.layer_norm_backward(d_normed, input, mean, rstd, norm.weight, d_stream,
                                norm_grad.weight, norm_grad.bias, rows, d, true);
  }
}

// What sublayer_backward asks of the scratch (F's backward aside).
inline void plan_sublayer_backward(const ModelConfig& config, const LinearWeights& last,
                                   int64_t rows, BackwardScratch& scratch, WorkspacePlan& plan) {
  sublayer_backward_buffers(config, last, rows, scratch, plan);
}

}  // namespace tfm
