// The output head of §3.4: decoder states to logits over the target vocabulary (the learned
// linear transformation before the softmax, tied to the embeddings or not), the one definition
// that scoring (model/transformer.cpp), the loss (train/loss.cpp) and decoding
// (decode/incremental_decoder.cpp) share. In training and scoring, rows go through the
// projection in chunks, so that the [rows, V] logits never exist at once whatever the
// vocabulary; each chunk is handed to the caller's softmax (log p of a label, cross-entropy and
// its gradient) before the next chunk overwrites it. A decoding step projects its few rows at
// once, for the search to rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "model/linear.h"

namespace tfm {

// How many rows of logits the projection computes at once on `backend`: [rows, vocab] within
// its Backend::logits_chunk_bytes, at least one row.
int64_t output_chunk_rows(const Backend& backend, int64_t vocab);
// Elements of the logits buffer for `positions` rows projected in such chunks:
// [min(chunk, positions), vocab], at least one row.
int64_t output_logits_elements(const Backend& backend, int64_t vocab, int64_t positions);

struct OutputHeadBuffers {
  DeviceBuffer<float> logits;             // [chunk, V] one chunk's logits
  DeviceBuffer<uint16_t> rounded_states;  // [chunk, D] its states in bfloat16 (bfloat16 training)
  DeviceBuffer<uint16_t> rounded_logits;  // [chunk, V] bfloat16 training's logits, instead
};

// One chunk of the projection, as output_head_forward hands it over.
struct OutputChunk {
  int64_t begin = 0;                         // its first row of the states
  int64_t rows = 0;                          // how many
  const float* states = nullptr;             // [rows, D]
  const uint16_t* rounded_states = nullptr;  // [rows, D] in bfloat16, or null (linear_backward's)
  float* logits = nullptr;                   // [rows, V], the caller's to overwrite
  // [rows, V] in bfloat16 instead (logits null) where the product rounds to bfloat16 (training
  // in bfloat16: its output rounded as PyTorch's autocast rounds it), the caller's to overwrite.
  uint16_t* rounded_logits = nullptr;
};

// logits = states[count, D] · outputᵀ + b, chunk by chunk in buffers, each passed to
// use(const OutputChunk&): in float32, or in bfloat16 alone where the product rounds to it.
template <typename Use>
void output_head_forward(const Backend& backend, const LinearWeights& output, const float* states,
                         int64_t count, OutputHeadBuffers& buffers, Use&& use) {
  const int64_t d = output.in, vocab = output.out, chunk = output_chunk_rows(backend, vocab);
  const int64_t elements = output_logits_elements(backend, vocab, count);
  const bool rounds = rounds_to_bfloat16(output);
  float* logits = rounds ? nullptr : ensure_size(backend, buffers.logits, elements);  // [chunk, V]
  uint16_t* rounded_logits =
      rounds ? ensure_size(backend, buffers.rounded_logits, elements) : nullptr;  // [chunk, V]
  for (int64_t begin = 0; begin < count; begin += chunk) {
    OutputChunk c;
    c.begin = begin;
    c.rows = std::min(chunk, count - begin);
    c.states = states + begin * d;
    c.rounded_states = rounded_copy(backend, output, c.states, c.rows, d, buffers.rounded_states);
    c.logits = logits;
    c.rounded_logits = rounded_logits;
    linear_forward(backend, output, c.states, c.rows, c.logits, c.rounded_states, false,
                   c.rounded_logits);
    use(c);
  }
}

// Decoding's form: every row's logits projected into `destination` [count, V] at once (the
// search ranks them all: Backend::best_tokens). Its weights are prepared, so no buffer of its
// own is needed: a bfloat16 matrix reads states.rounded where given, else rounds them itself.
inline void output_head_forward(const Backend& backend, const LinearWeights& output,
                                MatmulOperand states, int64_t count, float* destination) {
  if (rounds_to_bfloat16(output))
    throw std::logic_error("output_head_forward: decoding's projection rounds to bfloat16");
  linear_forward(backend, output, states.values, count, destination, states.rounded);
}

// What the chunked output_head_forward asks of `buffers` for `count` rows.
void plan_output_head_forward(const Backend& backend, const LinearWeights& output, int64_t count,
                              OutputHeadBuffers& buffers, WorkspacePlan& plan);

}  // namespace tfm
