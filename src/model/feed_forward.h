// The position-wise feed-forward network (§3.3): FFN(x) = act(x·W1ᵀ + b1)·W2ᵀ + b2, applied to
// every position alike, as a forward / backward pair (ReLU or GELU, optional dropout inside).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/workspace.h"
#include "model/linear.h"
#include "model/weights.h"

namespace tfm {

struct FeedForwardCache {
  // GELU only: inference sets this to false, and the activation then overwrites the fc1 output
  // in place (one [rows, d_ff] buffer instead of two); backward cannot run. ReLU never keeps
  // one: fc1's product applies it in its own pass, and its backward reads `hidden` instead.
  bool keep_pre_activation = true;
  DeviceBuffer<float> pre_activation;  // [rows, d_ff] fc1 output (GELU, kept for backward)
  // [rows, d_ff] activation (after dropout): fc2 input. Not kept where training in bfloat16 holds
  // the hidden layer only in rounded_hidden (ReLU, no dropout inside: feed_forward.cpp).
  DeviceBuffer<float> hidden;
  DeviceBuffer<uint8_t> dropout_mask;  // [rows, d_ff] when relu dropout > 0 (dropout_mask_buffer)
  uint64_t dropout_key = 0;  // the forward's, from which the backward draws its decisions again
  // Training in bfloat16 with ReLU and no dropout inside, where the backend keeps one
  // (Backend::relu_mask_bytes): fc1's product's record of its ReLU, which fc2's input-gradient
  // product reads (MatmulEpilogue::relu_mask).
  DeviceBuffer<uint8_t> relu_mask;  // [relu_mask_bytes(rows, d_ff)]
  // Training in bfloat16: fc1's and fc2's inputs rounded once, read by the forward product and
  // by the weight gradient's. With ReLU and no dropout inside, rounded_hidden is the only copy of
  // the hidden layer: written by fc1's product (subnormal values flushed to zero), read by fc2's
  // products and by ReLU's backward (its sign).
  // rounded_input is fc1's input rounded here, where it does not come in bfloat16 already (a
  // post-norm sublayer's norm writes it so); rounded_x is the one fc1's products read, either.
  DeviceBuffer<uint16_t> rounded_input;   // [rows, D]
  DeviceBuffer<uint16_t> rounded_hidden;  // [rows, d_ff]
  const uint16_t* rounded_x = nullptr;    // [rows, D]
};

// out[rows, D] = fc2(dropout(act(fc1(x)))). x.rounded: x in bfloat16 where its producer wrote
// it so, else null (rounded here where fc1's products round).
void feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                          MatmulOperand x, int64_t rows, float dropout, uint64_t key,
                          FeedForwardCache& cache, float* out);
// What the forward above asks of its cache (input_rounded: whether x comes with x.rounded), and
// the backward below of the scratch.
void plan_feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                               int64_t rows, float dropout, bool input_rounded,
                               FeedForwardCache& cache, WorkspacePlan& plan);
void plan_feed_forward_backward(const FeedForwardWeights& w, Activation act, int64_t rows,
                                float dropout, BackwardScratch& scratch, WorkspacePlan& plan);
// dx (= or += when accumulate) and parameter gradients, given d_out [rows, D] (and
// rounded_d_out, as multi_head_attention_backward takes them, with g.fc2.bias for g.o.bias).
void feed_forward_backward(const Backend& backend, const FeedForwardWeights& w,
                           const FeedForward<float>& g, Activation act, const float* x,
                           int64_t rows, float dropout, FeedForwardCache& cache, const float* d_out,
                           const uint16_t* rounded_d_out, BackwardScratch& scratch, float* dx,
                           bool accumulate);

}  // namespace tfm
