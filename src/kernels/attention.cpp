// attention_forward(): per (sequence, head) the scores come from one GEMM (Q·Kᵀ, transpose
// absorbed by the GEMM flag), then scale, mask and softmax run in one pass per row, then a
// second GEMM multiplies by V. OpenMP spreads the batch × heads pairs over the threads; the
// GEMMs inside run single-threaded (no nested parallelism).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/fast_exp.h"
#include "kernels/gemm.h"

namespace tfm {

namespace {

// Visible key range [begin, end) of one query row under the mask.
inline void visible_keys(const AttentionMask& mask, int64_t key_count, int64_t query_position,
                         int64_t* begin, int64_t* end) {
  int64_t lo = 0, hi = key_count;
  if (mask.causal && query_position + 1 < hi) hi = query_position + 1;
  if (mask.window >= 0) {
    if (query_position - mask.window > lo) lo = query_position - mask.window;
    if (!mask.causal && query_position + mask.window + 1 < hi)
      hi = query_position + mask.window + 1;
  }
  if (hi < lo) hi = lo;
  *begin = lo;
  *end = hi;
}

// Scale, mask and normalise one row of scores in place.
inline void masked_softmax_row(float* row, int64_t key_len, int64_t begin, int64_t end,
                               float scale) {
  if (begin >= end) {
    for (int64_t j = 0; j < key_len; ++j) row[j] = 0.f;
    return;
  }
  for (int64_t j = 0; j < begin; ++j) row[j] = 0.f;
  for (int64_t j = end; j < key_len; ++j) row[j] = 0.f;
  float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
  for (int64_t j = begin; j < end; ++j) max_value = row[j] > max_value ? row[j] : max_value;
  const float shift = max_value * scale;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = begin; j < end; ++j) {
    row[j] = fast_exp(row[j] * scale - shift);
    sum += row[j];
  }
  const float inv_sum = 1.f / sum;
#pragma omp simd
  for (int64_t j = begin; j < end; ++j) row[j] *= inv_sum;
}

int64_t key_batch_stride(const AttentionShape& s) {
  return s.k_batch_stride ? s.k_batch_stride : s.key_len * s.k_row_stride;
}
int64_t value_batch_stride(const AttentionShape& s) {
  return s.v_batch_stride ? s.v_batch_stride : s.key_len * s.v_row_stride;
}

// One query row against key_count keys with plain vectorised loops: at decoding time a GEMM
// call per (hypothesis, head) would cost more in overhead than the arithmetic.
void single_query_attention(const AttentionShape& s, const AttentionMask& mask, int64_t key_count,
                            float scale, const float* q, const float* k, const float* v,
                            float* probs, float* out) {
  const int64_t d = s.head_dim;
  int64_t begin, end;
  visible_keys(mask, key_count, mask.query_offset, &begin, &end);
  for (int64_t j = begin; j < end; ++j) {
    const float* key = k + j * s.k_row_stride;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < d; ++c) dot += q[c] * key[c];
    probs[j] = dot;
  }
  masked_softmax_row(probs, s.key_len, begin, end, scale);
  for (int64_t c = 0; c < d; ++c) out[c] = 0.f;
  for (int64_t j = begin; j < end; ++j) {
    const float p = probs[j];
    const float* value = v + j * s.v_row_stride;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) out[c] += p * value[c];
  }
}

// Per-thread scratch of at least n floats, reused across calls (no allocation once warm).
float* thread_scratch(int64_t n, int slot) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& buffer = buffers[slot];
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

// dropped[Tq, Tk] = probs ⊙ mask / (1 - p), the weights actually applied to V.
void dropped_probs(const float* probs, const uint8_t* mask, float p, int64_t n, float* dropped) {
  const float keep_scale = 1.f / (1.f - p);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dropped[i] = mask[i] ? probs[i] * keep_scale : 0.f;
}

}  // namespace

void attention_forward(const AttentionShape& s, const AttentionMask& mask, const float* q,
                       const float* k, const float* v, float* probs, float* out,
                       const AttentionDropout& dropout) {
  const float scale = 1.f / std::sqrt(float(s.head_dim));
  const int64_t pairs = s.batch * s.heads;
  const int64_t pair_size = s.query_len * s.key_len;
  if (dropout.p > 0.f) dropout_mask(dropout.mask, pairs * pair_size, dropout.p, dropout.key);
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t b = pair / s.heads, h = pair % s.heads;
    const int64_t kb = mask.key_batch ? mask.key_batch[b] : b;
    const int64_t key_count =
        mask.key_lengths ? std::min<int64_t>(mask.key_lengths[kb], s.key_len) : s.key_len;
    const float* q_bh = q + b * s.query_len * s.q_row_stride + h * s.head_dim;
    const float* k_bh = k + kb * key_batch_stride(s) + h * s.head_dim;
    const float* v_bh = v + kb * value_batch_stride(s) + h * s.head_dim;
    float* out_bh = out + b * s.query_len * s.out_row_stride + h * s.head_dim;
    float* p_bh = probs + pair * pair_size;      // [Tq, Tk]
    if (s.query_len == 1 && dropout.p == 0.f) {  // incremental decoding: dot products, no GEMM
      single_query_attention(s, mask, key_count, scale, q_bh, k_bh, v_bh, p_bh, out_bh);
      continue;
    }

    // Only the first key_count keys can be visible: skip padded keys in both GEMMs.
    if (key_count > 0)
      gemm(false, true, s.query_len, key_count, s.head_dim, 1.f, q_bh, s.q_row_stride, k_bh,
           s.k_row_stride, 0.f, p_bh, s.key_len);
    for (int64_t t = 0; t < s.query_len; ++t) {
      int64_t begin, end;
      visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
      masked_softmax_row(p_bh + t * s.key_len, s.key_len, begin, end, scale);
    }
    const float* weights = p_bh;
    if (dropout.p > 0.f) {
      float* dropped = thread_scratch(pair_size, 0);  // [Tq, Tk]
      dropped_probs(p_bh, dropout.mask + pair * pair_size, dropout.p, pair_size, dropped);
      weights = dropped;
    }
    gemm(false, false, s.query_len, s.head_dim, key_count, 1.f, weights, s.key_len, v_bh,
         s.v_row_stride, 0.f, out_bh, s.out_row_stride);
  }
}

void attention_backward(const AttentionShape& s, const AttentionMask& mask, const float* q,
                        const float* k, const float* v, const float* probs,
                        const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                        float* dv) {
  const float scale = 1.f / std::sqrt(float(s.head_dim));
  const int64_t pairs = s.batch * s.heads;
  const int64_t pair_size = s.query_len * s.key_len;
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t b = pair / s.heads, h = pair % s.heads;
    const int64_t key_count =
        mask.key_lengths ? std::min<int64_t>(mask.key_lengths[b], s.key_len) : s.key_len;
    const int64_t q_offset = b * s.query_len * s.q_row_stride + h * s.head_dim;
    const int64_t k_offset = b * key_batch_stride(s) + h * s.head_dim;
    const int64_t v_offset = b * value_batch_stride(s) + h * s.head_dim;
    const float* d_out_bh = d_out + b * s.query_len * s.out_row_stride + h * s.head_dim;
    const float* p_bh = probs + pair * pair_size;  // [Tq, Tk]
    const uint8_t* mask_bh = dropout.p > 0.f ? dropout.mask + pair * pair_size : nullptr;

    // Padded keys get no gradient.
    for (int64_t j = key_count; j < s.key_len; ++j)
      for (int64_t c = 0; c < s.head_dim; ++c) {
        dk[k_offset + j * s.k_row_stride + c] = 0.f;
        dv[v_offset + j * s.v_row_stride + c] = 0.f;
      }
    if (key_count == 0) {
      for (int64_t t = 0; t < s.query_len; ++t)
        for (int64_t c = 0; c < s.head_dim; ++c) dq[q_offset + t * s.q_row_stride + c] = 0.f;
      continue;
    }
    // dV = P'ᵀ · dO, with P' the weights applied in the forward pass.
    const float* weights = p_bh;
    if (mask_bh) {
      float* dropped = thread_scratch(pair_size, 0);
      dropped_probs(p_bh, mask_bh, dropout.p, pair_size, dropped);
      weights = dropped;
    }
    gemm(true, false, key_count, s.head_dim, s.query_len, 1.f, weights, s.key_len, d_out_bh,
         s.out_row_stride, 0.f, dv + v_offset, s.v_row_stride);
    // dP' = dO · Vᵀ  [Tq, key_count], stored with row stride key_len.
    float* d_scores = thread_scratch(pair_size, 1);
    gemm(false, true, s.query_len, key_count, s.head_dim, 1.f, d_out_bh, s.out_row_stride,
         v + v_offset, s.v_row_stride, 0.f, d_scores, s.key_len);
    // Through dropout, then softmax: dS = P ⊙ (dP − Σ_j dP·P), scaled by 1/sqrt(d_k).
    const float keep_scale = mask_bh ? 1.f / (1.f - dropout.p) : 1.f;
    for (int64_t t = 0; t < s.query_len; ++t) {
      float* row = d_scores + t * s.key_len;
      const float* p_row = p_bh + t * s.key_len;
      if (mask_bh) {
        const uint8_t* m_row = mask_bh + t * s.key_len;
        for (int64_t j = 0; j < key_count; ++j) row[j] = m_row[j] ? row[j] * keep_scale : 0.f;
      }
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < key_count; ++j) dot += row[j] * p_row[j];
#pragma omp simd
      for (int64_t j = 0; j < key_count; ++j) row[j] = p_row[j] * (row[j] - dot) * scale;
    }
    // dQ = dS · K, dK = dSᵀ · Q.
    gemm(false, false, s.query_len, s.head_dim, key_count, 1.f, d_scores, s.key_len, k + k_offset,
         s.k_row_stride, 0.f, dq + q_offset, s.q_row_stride);
    gemm(true, false, key_count, s.head_dim, s.query_len, 1.f, d_scores, s.key_len, q + q_offset,
         s.q_row_stride, 0.f, dk + k_offset, s.k_row_stride);
  }
}

}  // namespace tfm
