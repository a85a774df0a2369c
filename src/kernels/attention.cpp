// attention_forward(): per (sequence, head) the scores come from one GEMM (Q·Kᵀ, transpose
// absorbed by the GEMM flag), then scale, mask and softmax run in one pass per row, then a
// second GEMM multiplies by V. OpenMP spreads the batch × heads pairs over the threads; the
// GEMMs inside run single-threaded (no nested parallelism).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

void attention_forward(const AttentionShape& s, const AttentionMask& mask, const float* q,
                       const float* k, const float* v, float* probs, float* out) {
  const float scale = 1.f / std::sqrt(float(s.head_dim));
  const int64_t pairs = s.batch * s.heads;
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t b = pair / s.heads, h = pair % s.heads;
    const int64_t key_count =
        mask.key_lengths ? std::min<int64_t>(mask.key_lengths[b], s.key_len) : s.key_len;
    const float* q_bh = q + b * s.query_len * s.q_row_stride + h * s.head_dim;
    const float* k_bh = k + b * s.key_len * s.k_row_stride + h * s.head_dim;
    const float* v_bh = v + b * s.key_len * s.v_row_stride + h * s.head_dim;
    float* out_bh = out + b * s.query_len * s.out_row_stride + h * s.head_dim;
    float* p_bh = probs + pair * s.query_len * s.key_len;  // [Tq, Tk]

    // Only the first key_count keys can be visible: skip padded keys in both GEMMs.
    if (key_count > 0)
      gemm(false, true, s.query_len, key_count, s.head_dim, 1.f, q_bh, s.q_row_stride, k_bh,
           s.k_row_stride, 0.f, p_bh, s.key_len);
    for (int64_t t = 0; t < s.query_len; ++t) {
      int64_t begin, end;
      visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
      masked_softmax_row(p_bh + t * s.key_len, s.key_len, begin, end, scale);
    }
    gemm(false, false, s.query_len, s.head_dim, key_count, 1.f, p_bh, s.key_len, v_bh,
         s.v_row_stride, 0.f, out_bh, s.out_row_stride);
  }
}

}  // namespace tfm
