// The layers of §3, forward direction, on padded batches laid out [batch, time, d_model]:
// Linear, multi-head attention (§3.2.2), position-wise feed-forward (§3.3), embeddings with the
// sqrt(d_model) scale (§3.4) and positional encodings (§3.5). Each layer takes its weights view,
// raw input/output pointers and a workspace whose buffers grow once and are then reused.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

// Grows `buffer` to at least n floats (never shrinks, so steady-state calls do not allocate)
// and returns its data.
float* ensure_size(std::vector<float>& buffer, int64_t n);

// y[rows, out] = x[rows, in] · Wᵀ + b
void linear_forward(const LinearWeights& w, const float* x, int64_t rows, float* y);

struct AttentionWorkspace {
  std::vector<float> q;        // [B, Tq, D]
  std::vector<float> k;        // [B, Tk, D]
  std::vector<float> v;        // [B, Tk, D]
  std::vector<float> context;  // [B, Tq, D] heads concatenated
  std::vector<float> probs;    // [B, H, Tq, Tk]
};

struct AttentionInputs {
  const float* query_input = nullptr;   // [B, Tq, D]
  const float* memory_input = nullptr;  // [B, Tk, D] (keys and values come from here)
  int64_t batch = 0, query_len = 0, key_len = 0;
  AttentionMask mask;
};

// out[B, Tq, D] = W_o · Concat_h(softmax(Q_h K_hᵀ / sqrt(d_k)) V_h): one GEMM per projection
// over all heads and positions, attention over batch × heads in parallel.
void multi_head_attention_forward(const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionWorkspace& ws, float* out);

// out[rows, D] = fc2(act(fc1(x))); hidden: workspace for [rows, d_ff].
void feed_forward_forward(const FeedForwardWeights& w, Activation act, const float* x, int64_t rows,
                          std::vector<float>& hidden, float* out);

// out[B, T, D] = table[ids] * (sqrt(D) if scale) + position_table[t + first_position + offset];
// ids [B, T]. Positions past a sequence's length are still embedded (their ids are pad) and
// are masked later. position_table: [max_positions, D], or null for "none"; the caller checks
// that first_position + len + offset <= max_positions.
void embed_forward(const ModelConfig& config, const float* table, const float* position_table,
                   const int32_t* ids, int64_t batch, int64_t len, int64_t first_position,
                   float* out);

// The sinusoidal encodings of positions 0 .. max_positions-1 in the config's layout:
// table[max_positions, D].
void fill_sinusoid_table(const ModelConfig& config, float* table);

}  // namespace tfm
