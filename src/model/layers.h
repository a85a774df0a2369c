// The layers of §3 on padded batches laid out [batch, time, d_model], each as a forward /
// backward pair: Linear, multi-head attention (§3.2.2), position-wise feed-forward (§3.3),
// embeddings with the sqrt(d_model) scale (§3.4) and positional encodings (§3.5). A forward
// saves what its backward needs in an explicit cache; buffers grow once and are then reused.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

// Grows `buffer` to at least n elements (never shrinks, so steady-state calls do not
// allocate) and returns its data.
template <typename T>
T* ensure_size(std::vector<T>& buffer, int64_t n) {
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

// Mixes a seed with a site number into an independent dropout key.
uint64_t dropout_key(uint64_t seed, uint64_t site);

// y[rows, out] = x[rows, in] · Wᵀ + b, in w.prepared's precision, else w.precision
void linear_forward(const Backend& backend, const LinearWeights& w, const float* x, int64_t rows,
                    float* y);
// dx[rows, in] (= or += when accumulate_dx; skipped when null) = dy · W; dW += dyᵀ · x;
// db += Σ_rows dy. Both products in w.precision.
void linear_backward(const Backend& backend, const LinearWeights& w, const Linear<float>& g,
                     const float* x, const float* dy, int64_t rows, float* dx, bool accumulate_dx);

// Incremental decoding's keys and values for one attention (one query per sequence), used
// instead of projecting them from AttentionInputs::memory_input. A self-attention appends this
// position's keys/values to its cache and attends over the history; a cross-attention reads the
// encoder output's keys/values, projected once per batch.
struct CachedKeysValues {
  float* keys = nullptr;    // row r at keys + r * row_stride, heads side by side
  float* values = nullptr;  // the same rows for the values
  int64_t row_stride = 0;
  // Self-attention: query i reads key j from row key_rows[i * key_rows_stride + j] and writes
  // its own key/value to row key_rows[i * key_rows_stride + position], position being the
  // mask's query_offset. Null (cross-attention): the keys are dense per sequence, which the
  // mask's key_batch picks.
  const int32_t* key_rows = nullptr;
  int64_t key_rows_stride = 0;
};

struct AttentionInputs {
  const float* query_input = nullptr;   // [B, Tq, D]
  const float* memory_input = nullptr;  // [B, Tk, D] (keys and values come from here)
  int64_t batch = 0, query_len = 0, key_len = 0;
  AttentionMask mask;
  float dropout = 0.f;  // on the attention weights
  uint64_t dropout_key = 0;
  // Incremental decoding: self-attention still projects memory_input (= query_input) for this
  // position; cross-attention leaves it unused.
  const CachedKeysValues* cached = nullptr;
};

struct AttentionCache {
  std::vector<float> q;        // [B, Tq, D]; prepared self-attention: [B, T, 3D] rows q | k | v
  std::vector<float> k;        // [B, Tk, D]; prepared cross-attention: [B, Tk, 2D] rows k | v
  std::vector<float> v;        // [B, Tk, D]
  std::vector<float> context;  // [B, Tq, D] heads concatenated (input of W_o)
  std::vector<float> probs;    // [B, H, Tq, Tk] softmax before dropout
  // Inference sets this to false: the weights are then never stored (attention streams over
  // the keys with an online softmax), and backward cannot run.
  bool keep_weights = true;
  std::vector<uint8_t> dropout_mask;  // [B, H, Tq, Tk] when dropout > 0
  std::vector<int64_t> append_rows;   // [B] incremental decoding: the KV-cache row written
};

// Scratch of the backward passes, shared by all layers.
struct BackwardScratch {
  std::vector<float> d_context;   // [B, Tq, D]
  std::vector<float> dq;          // [B, Tq, D]
  std::vector<float> dk;          // [B, Tk, D]
  std::vector<float> dv;          // [B, Tk, D]
  std::vector<float> d_hidden;    // [rows, d_ff]
  std::vector<float> d_sublayer;  // [rows, D] gradient entering a sublayer's function
  std::vector<float> d_normed;    // [rows, D] gradient of a pre-norm sublayer's function input
  std::vector<float> d_stream;    // [rows, D] gradient of the residual stream
  std::vector<float> d_memory;    // [B, S, D] gradient of the encoder output (cross-attention)
};

// out[B, Tq, D] = W_o · Concat_h(softmax(Q_h K_hᵀ / sqrt(d_k)) V_h): one GEMM per projection
// over all heads and positions, attention over batch × heads in parallel.
void multi_head_attention_forward(const Backend& backend, const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionCache& cache, float* out);
// Given d_out [B, Tq, D]: d_query_input (= or += when accumulate), d_memory_input += (the same
// pointer for self-attention), and the parameter gradients.
void multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                   const Attention<float>& g, int64_t heads,
                                   const AttentionInputs& in, AttentionCache& cache,
                                   const float* d_out, BackwardScratch& scratch,
                                   float* d_query_input, bool accumulate, float* d_memory_input);

struct FeedForwardCache {
  // Inference sets this to false: the activation then overwrites the fc1 output in place (one
  // [rows, d_ff] buffer instead of two), and backward cannot run.
  bool keep_pre_activation = true;
  std::vector<float> pre_activation;  // [rows, d_ff] fc1 output
  std::vector<float> hidden;          // [rows, d_ff] activation (after dropout): fc2 input
  std::vector<uint8_t> dropout_mask;  // [rows, d_ff] when relu dropout > 0
};

// out[rows, D] = fc2(dropout(act(fc1(x)))).
void feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                          const float* x, int64_t rows, float dropout, uint64_t key,
                          FeedForwardCache& cache, float* out);
// dx (= or += when accumulate) and parameter gradients, given d_out [rows, D].
void feed_forward_backward(const Backend& backend, const FeedForwardWeights& w,
                           const FeedForward<float>& g, Activation act, const float* x,
                           int64_t rows, float dropout, FeedForwardCache& cache, const float* d_out,
                           BackwardScratch& scratch, float* dx, bool accumulate);

// out[B, T, D] = table[ids] * (sqrt(D) if scale) + position_table[t + first_position + offset];
// ids [B, T]. Positions past a sequence's length are still embedded (their ids are pad) and
// are masked later. position_table: [max_positions, D], or null for "none"; the caller checks
// that first_position + len + offset <= max_positions.
void embed_forward(const Backend& backend, const ModelConfig& config, const EmbeddingTable& table,
                   const float* position_table, const int32_t* ids, int64_t batch, int64_t len,
                   int64_t first_position, float* out);
// d_table[ids] += scale · d_out; d_positions (learned tables only, else null) gets the
// position rows' sums.
void embed_backward(const Backend& backend, const ModelConfig& config, const float* d_out,
                    const int32_t* ids, int64_t batch, int64_t len, float* d_table,
                    float* d_positions);

// The sinusoidal encodings of positions 0 .. max_positions-1 in the config's layout:
// table[max_positions, D].
void fill_sinusoid_table(const ModelConfig& config, float* table);

}  // namespace tfm
