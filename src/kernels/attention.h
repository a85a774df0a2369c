// Attention over all heads of a padded batch: softmax(score(Q, K) + mask)·V, with key padding,
// causal and windowed masks, computed per (sequence, head) in parallel over batch × heads. The
// score is the paper's scaled dot product (§3.2.1) or one of the two it is compared with there:
// the dot product without the 1/sqrt(d_k) factor, and additive attention.
#pragma once

#include <cstdint>

namespace tfm {

// How query q_i and key k_j of one head (both d_k = head_dim wide) make a logit:
//   kScaledDot  q_i·k_j / sqrt(d_k)        (§3.2.1, the default)
//   kDot        q_i·k_j                    (§3.2.1's "dot-product attention" without scaling)
//   kAdditive   v_hᵀ·tanh(q_i + k_j)       (Bahdanau et al.; v_h has d_k entries per head)
// In the additive score the head's query and key projections W_i^Q, W_i^K play the roles of
// Bahdanau's W and U (a further linear map after them would compose into the same thing).
enum class AttentionScoring { kScaledDot, kDot, kAdditive };

struct AttentionScore {
  AttentionScoring kind = AttentionScoring::kScaledDot;
  const float* additive_v = nullptr;  // [heads, head_dim]; kAdditive only
};

// Scale applied to the raw dot products: 1/sqrt(d_k) for kScaledDot, else 1.
float attention_score_scale(AttentionScoring kind, int64_t head_dim);

// Where the heads live: row (b, t) of Q starts at q + (b * query_len + t) * q_row_stride and
// head h occupies columns [h * head_dim, (h + 1) * head_dim) of that row. The same for K, V, out.
struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t query_len = 0;  // Tq (padded)
  int64_t key_len = 0;    // Tk (padded)
  int64_t head_dim = 0;   // d_k = d_v
  int64_t q_row_stride = 0;
  int64_t k_row_stride = 0;
  int64_t v_row_stride = 0;
  int64_t out_row_stride = 0;
  // Distance between consecutive sequences; 0 means len × row stride (a dense batch). A KV
  // cache with room for more positions than key_len sets these to its capacity × row stride.
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
  // Incremental decoding (query_len 1, no dropout): key j of sequence b is row
  // key_rows[b * key_rows_stride + j] of k and v (batch strides unused), so beam hypotheses
  // that share a prefix read the same cached rows instead of each holding a copy. Null: dense.
  const int32_t* key_rows = nullptr;
  int64_t key_rows_stride = 0;
  AttentionScore score;  // how queries and keys make logits
};

// Which keys a query sees. Query t of sequence b has absolute position t + query_offset;
// key j is visible iff j < key_lengths[b], and j <= position when causal, and the distance
// is within window (window < 0: unrestricted; causal: position - j <= window).
struct AttentionMask {
  const int32_t* key_lengths = nullptr;  // [key batches]; null: all key_len keys valid
  // Which key/value sequence serves query sequence b (beam search: the hypotheses of one
  // sentence share its encoder keys); null: sequence b itself.
  const int32_t* key_batch = nullptr;
  bool causal = false;
  int64_t window = -1;
  int64_t query_offset = 0;
};

// Dropout on the attention weights (training only). mask: [batch, heads, query_len, key_len],
// written by the forward pass (from key) and read by the backward pass.
struct AttentionDropout {
  float p = 0.f;
  uint8_t* mask = nullptr;
  uint64_t key = 0;
};

// out[b, t, h*d:(h+1)*d] = Σ_j p[b,h,t,j] · V[b, j, h*d:(h+1)*d]
// probs: [batch, heads, query_len, key_len] receives the attention weights before dropout
// (masked entries 0; a query with no visible key gets an all-zero row and a zero output).
// probs null (inference, no dropout): the weights are not kept; each block of queries streams
// over its visible keys with an online softmax, in O(block²) memory per thread.
// Either way, causal and windowed masks restrict the products to the visible band of keys
// (per block of 64 queries), so a window w costs O(w·n·d), not O(n²·d).
void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                       const float* k, const float* v, float* probs, float* out,
                       const AttentionDropout& dropout = {});

// Additive scores never materialise the [Tq, Tk, d_k] tensor tanh(q_i + k_j): forward and
// backward recompute it one (i, j) pair at a time, so they need O(d_k) memory beyond the
// weights, the same as the dot products.
//
// Gradients of attention_forward: given d_out (layout of out), writes dq, dk, dv (layouts of
// q, k, v; padded key rows get 0). probs and dropout are what the forward pass saved. With
// additive scores, d_additive_v [heads, head_dim] receives += the gradient of score.additive_v.
void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                        const float* k, const float* v, const float* probs,
                        const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                        float* dv, float* d_additive_v = nullptr);

}  // namespace tfm
