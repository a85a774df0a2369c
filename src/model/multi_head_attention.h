// Multi-head attention (§3.2.2): Q, K, V projections, scaled dot-product attention (§3.2.1) per
// head over batch × heads, heads concatenated and projected by W_o; as a forward / backward pair
// on padded batches [batch, time, d_model], with incremental decoding's cached keys and values.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/workspace.h"
#include "model/linear.h"
#include "model/weights.h"

namespace tfm {

// Incremental decoding's keys and values for one attention (one query per sequence), used
// instead of projecting them from AttentionInputs::memory_input. A self-attention appends this
// position's keys/values to its cache and attends over the history; a cross-attention reads the
// encoder output's keys/values, projected once per batch.
struct CachedKeysValues {
  float* keys = nullptr;    // row r at keys + r * row_stride, heads side by side
  float* values = nullptr;  // the same rows for the values
  // A cache stored in 16 bits instead (keys and values above null): the same rows in
  // `format` (bfloat16 or float16), half the bytes for each step to read; appended rows are
  // rounded to nearest even.
  uint16_t* keys_16_bits = nullptr;
  uint16_t* values_16_bits = nullptr;
  Precision format = Precision::kFloat32;  // of keys_16_bits and values_16_bits
  int64_t row_stride = 0;                  // in elements
  // Self-attention: query i reads key j from row key_rows[i * key_rows_stride + j], j up to the
  // mask's query_offset (its own position), and first writes its own key and value to row
  // append_rows[i] (= key_rows[i * key_rows_stride + query_offset]). Null (cross-attention):
  // the keys are dense per sequence, which the mask's key_batch picks, and nothing is written.
  const int32_t* key_rows = nullptr;
  int64_t key_rows_stride = 0;
  const int64_t* append_rows = nullptr;  // [B]
};

struct AttentionInputs {
  const float* query_input = nullptr;   // [B, Tq, D]
  const float* memory_input = nullptr;  // [B, Tk, D] (keys and values come from here)
  // The same in bfloat16 where their producer wrote them so (a post-norm sublayer's norm in a
  // bfloat16 step), else null: rounded here where the projections round.
  const uint16_t* rounded_query_input = nullptr;   // [B, Tq, D]
  const uint16_t* rounded_memory_input = nullptr;  // [B, Tk, D]
  int64_t batch = 0, query_len = 0, key_len = 0;
  AttentionMask mask;
  float dropout = 0.f;  // on the attention weights
  uint64_t dropout_key = 0;
  // Incremental decoding: self-attention still projects memory_input (= query_input) for this
  // position; cross-attention leaves it unused.
  const CachedKeysValues* cached = nullptr;
};

struct AttentionCache {
  // Where the projections are stacked (Attention::qkv, kv: prepared for inference, or training
  // in bfloat16) their one product's rows hold them side by side.
  DeviceBuffer<float> q;  // [B, Tq, D]; stacked self-attention: [B, T, 3D] rows q | k | v
  DeviceBuffer<float> k;  // [B, Tk, D]; stacked cross-attention: [B, Tk, 2D] rows k | v
  DeviceBuffer<float> v;  // [B, Tk, D]
  // Training in bfloat16 where the backend's attention reads Q, K and V in bfloat16 alone
  // (Backend::attention_reads_rounded_inputs): the projections write them here instead of q, k,
  // v, in the same layouts, and projected_in_bfloat16 says so (the last forward's answer, which
  // its backward takes).
  DeviceBuffer<uint16_t> rounded_q;  // as q
  DeviceBuffer<uint16_t> rounded_k;  // as k
  DeviceBuffer<uint16_t> rounded_v;  // as v
  bool projected_in_bfloat16 = false;
  DeviceBuffer<float> context;  // [B, Tq, D] heads concatenated (input of W_o)
  // [B, H, Tq, Tk] softmax before dropout, or what the backend keeps for the backward instead
  // (Backend::attention_weights_floats, where AttentionShape::weights_for_backward_only).
  DeviceBuffer<float> probs;
  // Inference sets this to false: the weights are then never stored (attention streams over
  // the keys with an online softmax), and backward cannot run.
  bool keep_weights = true;
  DeviceBuffer<uint8_t> dropout_mask;  // [B, H, Tq, Tk] when dropout > 0
  uint64_t dropout_key = 0;            // the forward's, which the backward's call takes too
  // Training in bfloat16: the projections' inputs rounded once, read by the Q, K, V products and
  // by their weight gradients (a self-attention's one copy serves all three); the same for W_o.
  // The two input buffers are used where the inputs do not come rounded already
  // (AttentionInputs); rounded_query / rounded_memory are the copies the products read, either:
  // a producer's (the previous sublayer's cache, the encoder's last one) is valid while that cache
  // is, i.e. through a training pass's backward; inference passes, which share one layer cache,
  // never read them back.
  DeviceBuffer<uint16_t> rounded_query_input;   // [B, Tq, D]
  DeviceBuffer<uint16_t> rounded_memory_input;  // [B, Tk, D] cross-attention only
  DeviceBuffer<uint16_t> rounded_context;       // [B, Tq, D] W_o's input, for W_o and its dW
  const uint16_t* rounded_query = nullptr;      // [B, Tq, D]
  const uint16_t* rounded_memory = nullptr;     // [B, Tk, D] (self-attention: rounded_query)
};

// out[B, Tq, D] = W_o · Concat_h(softmax(Q_h K_hᵀ / sqrt(d_k)) V_h): one GEMM per projection
// over all heads and positions, attention over batch × heads in parallel.
void multi_head_attention_forward(const Backend& backend, const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionCache& cache, float* out);
// What the forward above asks of its cache for whole sequences (not incremental decoding) of
// `batch` × query_len queries over key_len keys on `backend`; self_attention: keys and values come
// from the queries' own input; query_rounded / memory_rounded: the inputs come with their bfloat16
// copies (AttentionInputs). The backward's scratch likewise.
void plan_multi_head_attention_forward(const Backend& backend, const AttentionWeights& w,
                                       int64_t heads, int64_t batch, int64_t query_len,
                                       int64_t key_len, float dropout, bool self_attention,
                                       bool query_rounded, bool memory_rounded,
                                       AttentionCache& cache, WorkspacePlan& plan);
void plan_multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                        int64_t heads, int64_t batch, int64_t query_len,
                                        int64_t key_len, float dropout, BackwardScratch& scratch,
                                        WorkspacePlan& plan);
// Given d_out [B, Tq, D] (and rounded_d_out, the same in bfloat16 where its producer wrote it,
// else null: rounded here if W_o's products round; d_out may then be null where g.o.bias is):
// d_query_input (= or += when accumulate), d_memory_input += (the same pointer for self-attention),
// and the parameter gradients.
void multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                   const Attention<float>& g, int64_t heads,
                                   const AttentionInputs& in, AttentionCache& cache,
                                   const float* d_out, const uint16_t* rounded_d_out,
                                   BackwardScratch& scratch, float* d_query_input, bool accumulate,
                                   float* d_memory_input);

}  // namespace tfm
