// The linear map y = x·Wᵀ + b every sublayer of §3 is built from, as a forward / backward pair,
// with the helpers all layers share: dropout keys and the scratch of the backward passes (in
// the backend's memory: backend/device_buffer.h). A forward saves what its backward needs in an
// explicit cache.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "backend/workspace.h"
#include "model/weights.h"

namespace tfm {

// Mixes a seed with a site number into an independent dropout key.
uint64_t dropout_key(uint64_t seed, uint64_t site);

// A dropout's mask between its forward and its backward, n elements dropped with probability p:
// what the backend keeps (Backend::dropout_mask_bytes: a byte an element, or nothing where it
// draws the decisions again from the key), sized here once for every dropout of the model.
template <typename Sizer>
void dropout_mask_buffer(const Backend& backend, float p, int64_t n, DeviceBuffer<uint8_t>& mask,
                         Sizer& sizer) {
  const int64_t bytes = p > 0.f ? backend.dropout_mask_bytes(n) : 0;
  if (bytes != 0 && bytes != n)
    throw std::logic_error("Backend::dropout_mask_bytes is a byte an element, or 0");
  if (bytes > 0) sizer.need(mask, bytes);  // [n] or nothing
}
// That mask's memory after dropout_mask_buffer, or null where the backend keeps none (or p = 0).
inline uint8_t* dropout_mask_of(const Backend& backend, float p, int64_t n,
                                DeviceBuffer<uint8_t>& mask) {
  return p > 0.f && backend.dropout_mask_bytes(n) > 0 ? mask.data() : nullptr;
}
// x[n] dropped with the decisions drawn from `key`, kept in `mask` (sized by
// dropout_mask_buffer) where the backend keeps them.
inline void dropout_forward(const Backend& backend, float* x, int64_t n, float p, uint64_t key,
                            DeviceBuffer<uint8_t>& mask) {
  if (!(p > 0.f)) return;
  uint8_t* kept = dropout_mask_of(backend, p, n, mask);  // [n] or null
  if (kept) backend.dropout_mask(kept, n, p, key);
  backend.apply_dropout(x, kept, n, p, key);
}
// Its backward: dx[n] (the gradient of the dropout's output, replaced by its input's) through
// the same decisions, from the forward's mask and key.
inline void dropout_backward(const Backend& backend, float* dx, int64_t n, float p, uint64_t key,
                             DeviceBuffer<uint8_t>& mask) {
  if (p > 0.f) backend.apply_dropout(dx, dropout_mask_of(backend, p, n, mask), n, p, key);
}

struct BackwardScratch;

// Whether w's products round their operands to bfloat16 here: training in bfloat16 (the float
// weight multiplied in kBFloat16; a weight prepared for inference is never rounded again).
inline bool rounds_to_bfloat16(const LinearWeights& w) {
  return w.precision == Precision::kBFloat16 && !w.prepared;
}

// Whether w's product reads a bfloat16 copy of its input where one is given (linear_forward's
// rounded_x) instead of rounding the input itself: the products that round (above), and a
// weight prepared in bfloat16 (PreparedMatrix::multiply). What a post-norm sublayer's norm
// writes its copy for (sublayer_rounds_for).
inline bool reads_bfloat16_input(const LinearWeights& w) {
  return rounds_to_bfloat16(w) || (w.prepared && w.prepared->precision() == Precision::kBFloat16);
}

// x[rows, cols] (dense) rounded to bfloat16 into `buffer` where w's products round their
// operands (rows > 0), for the products that read the same rows; else null. The one way layers
// make the rounded copies that linear_forward / linear_backward take.
const uint16_t* rounded_copy(const Backend& backend, const LinearWeights& w, const float* x,
                             int64_t rows, int64_t cols, DeviceBuffer<uint16_t>& buffer);

// y[rows, out] = x[rows, in] · Wᵀ + b, then max(y, 0) when relu (the feed-forward's first
// transformation and its ReLU, §3.3), in w.prepared's precision, else w.precision. rounded_x: x
// already rounded to bfloat16 (Backend::round_to_16_bits, [rows, in]) where several products
// read the same rows or a norm wrote it, read where reads_bfloat16_input(w), or null (x may be
// null where it is read). W is read from w.rounded where set.
// rounded_y (where reads_bfloat16_input(w)): y is written there in bfloat16 instead
// (MatmulEpilogue::rounded_output), and y may be null; with y null (the bfloat16 output alone)
// the product may round its own sums (MatmulEpilogue::rounded_by_the_product). relu_mask: where
// the product may keep its record of the ReLU (MatmulEpilogue::relu_mask), or null.
void linear_forward(const Backend& backend, const LinearWeights& w, const float* x, int64_t rows,
                    float* y, const uint16_t* rounded_x = nullptr, bool relu = false,
                    uint16_t* rounded_y = nullptr, void* relu_mask = nullptr);

// The ReLU an input gradient passes back through on its way out of a product (MatmulEpilogue::
// relu_output, relu_mask, bias_gradient): the feed-forward's hidden gradient in bfloat16.
struct ReluGate {
  const uint16_t* relu_output = nullptr;  // [rows, in] the ReLU's bfloat16 output; null: none
  void* relu_mask = nullptr;              // its forward product's record (relu_mask), or null
  float* bias_gradient = nullptr;         // [in] += Σ_rows of the gated gradient, or null
};
// dx[rows, in] (= or += when accumulate_dx; skipped when null) = dy · W; dW += dyᵀ · x;
// db += Σ_rows dy (where g.bias is given). Both products in w.precision; in bfloat16 dy is
// rounded once for both and for db (into scratch.rounded_d_out; db then sums the rounded dy,
// as PyTorch's autocast sums a bfloat16 gradient) unless rounded_dy holds it already (the loss
// and the attention write their gradients so; dy is then not read, and may be null), and x / W
// are read from rounded_x / w.rounded where given. (The post-norm sublayer's last bias is summed
// instead by the pass that makes its gradient, residual_layer_norm_backward, and fc1's before a
// ReLU in bfloat16 by fc2's input-gradient product through the ReLU: ReluGate.)
void linear_backward(const Backend& backend, const LinearWeights& w, const Linear<float>& g,
                     const float* x, const float* dy, int64_t rows, float* dx, bool accumulate_dx,
                     BackwardScratch& scratch, const uint16_t* rounded_x = nullptr,
                     const uint16_t* rounded_dy = nullptr);
// Its two halves, for gradients that are already rounded where w rounds (rounded_dy given):
// dx[rows, in] (= or += when accumulate_dx) = dy · W, dy and rounded_dy dense [rows, out] (a
// stacked view's input gradient: one product over the stacked Q|K|V gradients), or, where w
// rounds and rounded_dx is given (dx null, not accumulated), dx in bfloat16 alone there, which the
// product may round itself (MatmulEpilogue::rounded_by_the_product: the feed-forward's hidden
// gradient, which only fc1's products read), through `gate` where it has a relu_output;
void linear_input_backward(const Backend& backend, const LinearWeights& w, const float* dy,
                           const uint16_t* rounded_dy, int64_t rows, float* dx, bool accumulate_dx,
                           uint16_t* rounded_dx = nullptr, const ReluGate& gate = {});
// dW += dyᵀ · x and db += Σ_rows dy (where g.bias is given; of rounded_dy where given), dy and
// rounded_dy [rows, out] with row stride ldy (a column block of the stacked gradients).
void linear_parameter_backward(const Backend& backend, const LinearWeights& w,
                               const Linear<float>& g, const float* x, const uint16_t* rounded_x,
                               const float* dy, const uint16_t* rounded_dy, int64_t ldy,
                               int64_t rows);
// What linear_backward asks of the scratch for `rows` rows.
void plan_linear_backward(const LinearWeights& w, int64_t rows, BackwardScratch& scratch,
                          WorkspacePlan& plan);

// Scratch of the backward passes, shared by all layers. Where an attention's projections are
// stacked (Attention::qkv, kv) their gradients lie side by side as the projections do: dq | dk |
// dv in dq's rows, or dk | dv in dk's (dv then unused), and so do the rounded copies.
struct BackwardScratch {
  DeviceBuffer<float> d_context;  // [B, Tq, D]
  // [B, Tq, D] the same in bfloat16 alone, where the attention's backward reads it so
  // (model/multi_head_attention.cpp: projects_in_bfloat16)
  DeviceBuffer<uint16_t> rounded_d_context;
  DeviceBuffer<float> dq;  // [B, Tq, D]; stacked Q|K|V: [B, T, 3D]
  DeviceBuffer<float> dk;  // [B, Tk, D]; stacked K|V: [B, Tk, 2D]
  DeviceBuffer<float> dv;  // [B, Tk, D]
  // Training in bfloat16: dq, dk, dv rounded by the attention's backward for the projections'
  // backward products (AttentionShape::rounded_dq, ...), in their layouts.
  DeviceBuffer<uint16_t> rounded_dq;  // as dq
  DeviceBuffer<uint16_t> rounded_dk;  // as dk
  DeviceBuffer<uint16_t> rounded_dv;  // as dv
  DeviceBuffer<float> d_hidden;       // [rows, d_ff]
  // [rows, d_ff] the same in bfloat16 alone (training in bfloat16 with ReLU and no dropout inside
  // the feed-forward: model/feed_forward.cpp)
  DeviceBuffer<uint16_t> rounded_d_hidden;
  DeviceBuffer<float> d_sublayer;  // [rows, D] gradient entering a sublayer's function
  DeviceBuffer<float> d_normed;    // [rows, D] gradient of a pre-norm sublayer's function input
  // [rows, D] gradient of the residual stream below a pre-norm stack's final norm (post-norm's
  // stacks run theirs in the gradients they are given: stacks_backward)
  DeviceBuffer<float> d_stream;
  DeviceBuffer<float> d_memory;  // [B, S, D] gradient of the encoder output (cross-attention)
  // [rows, out] a linear's output gradient rounded to bfloat16 (training in bfloat16), read by
  // both of its backward products: rounded by linear_backward, or written there by the kernel
  // that makes the gradient (a post-norm sublayer's norm backward)
  DeviceBuffer<uint16_t> rounded_d_out;
};

}  // namespace tfm
