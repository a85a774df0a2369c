// Feed-forward forward / backward.
#include "model/feed_forward.h"

namespace tfm {

namespace {

// Training in bfloat16 with ReLU and no dropout inside keeps the hidden layer in bfloat16 only:
// fc1's product writes it rounded (MatmulEpilogue::rounded_output), fc2's products read it, and
// ReLU's backward reads its sign; its gradient likewise (fc2's input-gradient product writes it
// rounded, the ReLU's backward gates it in place, fc1's products read it). Inference with weights
// prepared in bfloat16 does the same (fc2 would round the float hidden layer itself). That spares
// writing it in float32 (memory-bound: 16 MB a layer for the base model's 4,096-token batch) and
// rounding it again. The products are the same (fc2's read the same bfloat16 values); only a hidden
// value below the smallest normal float (under 1.2e-38, flushed to zero) would stop its gradient
// where the float copy passed it. With dropout the float values are kept: dropping and scaling them
// first, then rounding, is not the same as scaling rounded values.
bool hidden_only_in_bfloat16(const FeedForwardWeights& w, Activation act, float dropout) {
  return act == Activation::kRelu && dropout == 0.f && reads_bfloat16_input(w.fc1) &&
         reads_bfloat16_input(w.fc2);
}

// The bytes of fc1's ReLU record for fc2's input-gradient product (FeedForwardCache::relu_mask):
// training in bfloat16 with the hidden layer in bfloat16 alone, where the backend keeps one.
int64_t relu_mask_bytes(const Backend& backend, const FeedForwardWeights& w, Activation act,
                        int64_t rows, float dropout) {
  return hidden_only_in_bfloat16(w, act, dropout) && rounds_to_bfloat16(w.fc1)
             ? backend.relu_mask_bytes(rows, w.fc1.out)
             : 0;
}

// The buffers feed_forward_forward uses for `rows` rows: its one size table.
template <typename Sizer>
void forward_buffers(const Backend& backend, const FeedForwardWeights& w, Activation act,
                     int64_t rows, float dropout, bool input_rounded, FeedForwardCache& cache,
                     Sizer& sizer) {
  if (rows <= 0) return;
  const int64_t n = rows * w.fc1.out;
  if (rounds_to_bfloat16(w.fc1) && !input_rounded)
    sizer.need(cache.rounded_input, rows * w.fc1.in);  // [rows, D]
  if (hidden_only_in_bfloat16(w, act, dropout)) {
    sizer.need(cache.rounded_hidden, n);  // [rows, d_ff]
    const int64_t mask_bytes = relu_mask_bytes(backend, w, act, rows, dropout);
    if (mask_bytes > 0) sizer.need(cache.relu_mask, mask_bytes);  // the backend's layout
    return;
  }
  sizer.need(cache.hidden, n);  // [rows, d_ff]
  if (act != Activation::kRelu && cache.keep_pre_activation)
    sizer.need(cache.pre_activation, n);                                // [rows, d_ff]
  dropout_mask_buffer(backend, dropout, n, cache.dropout_mask, sizer);  // [rows, d_ff]
  if (rounds_to_bfloat16(w.fc2)) sizer.need(cache.rounded_hidden, n);   // [rows, d_ff]
}

// The scratch feed_forward_backward uses (its products' own aside).
template <typename Sizer>
void backward_buffers(const FeedForwardWeights& w, Activation act, int64_t rows, float dropout,
                      BackwardScratch& scratch, Sizer& sizer) {
  if (hidden_only_in_bfloat16(w, act, dropout))
    sizer.need(scratch.rounded_d_hidden, rows * w.fc1.out);  // [rows, d_ff]
  else
    sizer.need(scratch.d_hidden, rows * w.fc1.out);  // [rows, d_ff]
}

}  // namespace

void feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                          MatmulOperand input, int64_t rows, float dropout, uint64_t key,
                          FeedForwardCache& cache, float* out) {
  cache.rounded_x = nullptr;
  if (rows <= 0) return;
  Allocate sizer{backend};
  const bool input_rounded = input.rounded && reads_bfloat16_input(w.fc1);
  forward_buffers(backend, w, act, rows, dropout, input_rounded, cache, sizer);
  const float* x = input.values;  // [rows, D]
  const uint16_t* rounded_x =     // [rows, D]
      input_rounded ? input.rounded
                    : rounded_copy(backend, w.fc1, x, rows, w.fc1.in, cache.rounded_input);
  cache.rounded_x = rounded_x;
  if (hidden_only_in_bfloat16(w, act, dropout)) {
    uint16_t* rounded_hidden = cache.rounded_hidden.data();  // [rows, d_ff]
    void* relu_mask =
        relu_mask_bytes(backend, w, act, rows, dropout) > 0 ? cache.relu_mask.data() : nullptr;
    linear_forward(backend, w.fc1, x, rows, nullptr, rounded_x, true, rounded_hidden, relu_mask);
    linear_forward(backend, w.fc2, nullptr, rows, out, rounded_hidden);
    return;
  }
  float* hidden = cache.hidden.data();  // [rows, d_ff]
  if (act == Activation::kRelu) {
    linear_forward(backend, w.fc1, x, rows, hidden, rounded_x, true);  // ReLU in fc1's pass
  } else {
    float* pre = cache.keep_pre_activation ? cache.pre_activation.data() : hidden;  // [rows, d_ff]
    // fc1 without its bias, which add_bias_activation adds in the same pass as the activation.
    LinearWeights fc1 = w.fc1;
    fc1.bias = nullptr;
    linear_forward(backend, fc1, x, rows, pre, rounded_x);
    backend.add_bias_activation(pre, w.fc1.bias, hidden, rows, w.fc1.out, act);
  }
  const int64_t hidden_size = rows * w.fc1.out;
  dropout_forward(backend, hidden, hidden_size, dropout, key, cache.dropout_mask);
  cache.dropout_key = key;
  const uint16_t* rounded_hidden =
      rounded_copy(backend, w.fc2, hidden, rows, w.fc1.out, cache.rounded_hidden);  // [rows, d_ff]
  linear_forward(backend, w.fc2, hidden, rows, out, rounded_hidden);
}

void plan_feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                               int64_t rows, float dropout, bool input_rounded,
                               FeedForwardCache& cache, WorkspacePlan& plan) {
  forward_buffers(backend, w, act, rows, dropout, input_rounded && rounds_to_bfloat16(w.fc1), cache,
                  plan);
}

void plan_feed_forward_backward(const FeedForwardWeights& w, Activation act, int64_t rows,
                                float dropout, BackwardScratch& scratch, WorkspacePlan& plan) {
  backward_buffers(w, act, rows, dropout, scratch, plan);
  plan_linear_backward(w.fc2, rows, scratch, plan);
  // fc1's products read the ReLU's backward's bfloat16 gradient where it writes one.
  if (!hidden_only_in_bfloat16(w, act, dropout)) plan_linear_backward(w.fc1, rows, scratch, plan);
}

void feed_forward_backward(const Backend& backend, const FeedForwardWeights& w,
                           const FeedForward<float>& g, Activation act, const float* x,
                           int64_t rows, float dropout, FeedForwardCache& cache, const float* d_out,
                           const uint16_t* rounded_d_out, BackwardScratch& scratch, float* dx,
                           bool accumulate) {
  const int64_t hidden_size = rows * w.fc1.out;
  Allocate sizer{backend};
  backward_buffers(w, act, rows, dropout, scratch, sizer);
  if (hidden_only_in_bfloat16(w, act, dropout)) {
    if (rows <= 0) return;
    const uint16_t* rounded_hidden = cache.rounded_hidden.data();  // [rows, d_ff]
    if (!rounded_d_out)
      rounded_d_out = rounded_copy(backend, w.fc2, d_out, rows, w.fc2.out, scratch.rounded_d_out);
    // The hidden layer's gradient in bfloat16 alone (the product may round its own sums) through
    // the ReLU's gate, with fc1's bias gradient summed on the way (the product's epilogue, from
    // fc1's record of its ReLU where the backend keeps one), for fc1's products.
    uint16_t* rounded_d_hidden = scratch.rounded_d_hidden.data();  // [rows, d_ff]
    void* relu_mask =
        relu_mask_bytes(backend, w, act, rows, dropout) > 0 ? cache.relu_mask.data() : nullptr;
    linear_input_backward(backend, w.fc2, d_out, rounded_d_out, rows, nullptr, false,
                          rounded_d_hidden, {rounded_hidden, relu_mask, g.fc1.bias});
    linear_parameter_backward(backend, w.fc2, g.fc2, nullptr, rounded_hidden, d_out, rounded_d_out,
                              w.fc2.out, rows);
    Linear<float> fc1_grads = g.fc1;
    fc1_grads.bias = nullptr;
    linear_backward(backend, w.fc1, fc1_grads, x, nullptr, rows, dx, accumulate, scratch,
                    cache.rounded_x, rounded_d_hidden);
    return;
  }
  float* d_hidden = scratch.d_hidden.data();  // [rows, d_ff]
  linear_backward(backend, w.fc2, g.fc2, cache.hidden.data(), d_out, rows, d_hidden, false, scratch,
                  rounds_to_bfloat16(w.fc2) ? cache.rounded_hidden.data() : nullptr, rounded_d_out);
  dropout_backward(backend, d_hidden, hidden_size, dropout, cache.dropout_key, cache.dropout_mask);
  // ReLU's derivative from its output (Backend::activation_backward), GELU's from the kept input.
  backend.activation_backward(
      d_hidden, act == Activation::kRelu ? cache.hidden.data() : cache.pre_activation.data(),
      hidden_size, act);
  linear_backward(backend, w.fc1, g.fc1, x, d_hidden, rows, dx, accumulate, scratch,
                  rounds_to_bfloat16(w.fc1) ? cache.rounded_x : nullptr);
}

}  // namespace tfm
