// Attention over all heads of a padded batch: softmax(score(Q, K) + mask)·V, with key padding,
// causal and windowed masks, computed per (sequence, head) in parallel over batch × heads. The
// score is the paper's scaled dot product (§3.2.1) or one of the two it is compared with there:
// the dot product without the 1/sqrt(d_k) factor, and additive attention.
#pragma once

#include <cstdint>

#include "backend/operation_types.h"

namespace tfm {

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

// Incremental decoding over keys and values cached in `format`, bfloat16 or float16 (row strides
// in elements): attention_forward for shape.query_len 1 without dropout, each element widened to
// float as it is read; q, probs and out stay float.
void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                    const float* q, Precision format, const uint16_t* k,
                                    const uint16_t* v, float* probs, float* out);

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
