// What the CUDA backend's attention paths share (attention.cu's per-query kernels,
// attention_dense.cu's whole-matrix products, the block-per-head kernels of attention_short.cu
// and attention_tensor_cores.cu): which keys a query sees, where a sequence's keys start, and
// where a (sequence, head) block's rows are. Device code; included by those files only.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/operation_types.h"

namespace tfm {
namespace cuda {

// Visible keys [begin, end) of the query at absolute `position` among `key_count` valid keys
// (backend/cpu/attention.cpp's rule: causal, window), clamped to them: a query past the last
// valid key gets an empty range.
__device__ __forceinline__ void visible_keys(const AttentionMask& mask, int64_t key_count,
                                             int64_t position, int64_t* begin, int64_t* end) {
  int64_t lo = 0, hi = key_count;
  if (mask.causal && position + 1 < hi) hi = position + 1;
  if (mask.window >= 0) {
    if (position - mask.window > lo) lo = position - mask.window;
    if (!mask.causal && position + mask.window + 1 < hi) hi = position + mask.window + 1;
  }
  lo = lo < key_count ? lo : key_count;
  hi = hi < key_count ? hi : key_count;
  *begin = lo;
  *end = hi > lo ? hi : lo;
}

// Elements from one sequence's keys (or values) to the next: AttentionShape's batch stride, or
// key_len rows when it is 0 (a dense batch).
__host__ __device__ __forceinline__ int64_t sequence_stride(int64_t given, int64_t key_len,
                                                            int64_t row_stride) {
  return given ? given : key_len * row_stride;
}

// Where the rows of block (b, h) = (blockIdx.x / heads, blockIdx.x % heads) are, for the
// kernels with a block per (sequence, head).
struct HeadRows {
  int64_t b, h;
  __device__ HeadRows(const AttentionShape& s) : b(blockIdx.x / s.heads), h(blockIdx.x % s.heads) {}
  // Its first query's row of q (or of dq: the same strides).
  template <typename T>
  __device__ T* query(const AttentionShape& s, T* q) const {
    return q + b * s.query_len * s.q_row_stride + h * s.head_dim;
  }
  template <typename T>
  __device__ T* key(const AttentionShape& s, T* k) const {
    return k + b * sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride) + h * s.head_dim;
  }
  template <typename T>
  __device__ T* value(const AttentionShape& s, T* v) const {
    return v + b * sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride) + h * s.head_dim;
  }
  // Its first query's row of out (or of d_out).
  template <typename T>
  __device__ T* output(const AttentionShape& s, T* out) const {
    return out + b * s.query_len * s.out_row_stride + h * s.head_dim;
  }
  // Its first row of a dense [batch · len, heads · head_dim] copy at base (rounded_out: len =
  // query_len), or null without one.
  __device__ uint16_t* dense_row(const AttentionShape& s, uint16_t* base, int64_t len) const {
    return base ? base + (b * len * s.heads + h) * s.head_dim : nullptr;
  }
  // Row t of the weights [B, H, Tq, Tk].
  __device__ int64_t weights_row(const AttentionShape& s, int64_t t) const {
    return ((b * s.heads + h) * s.query_len + t) * s.key_len;
  }
};

// A softmax weight from its score and its row's shift (the largest visible score · scale) and
// inverse (1 / the row's Σ exp): one expression for the forward that stores the weight and for
// the tensor-core backward that rebuilds it from the two, so that both round alike.
__device__ __forceinline__ float softmax_weight(float score, float scale, float shift,
                                                float inverse) {
  return expf(fmaf(score, scale, -shift)) * inverse;
}

// The weights of a block-per-head kernel's kLen score rows (scores[t · pitch + j], Q·Kᵀ of
// sequence b; kLen a multiple of 32), a warp a row: row t < query_len gets the masked softmax of
// its scores · scale over its visible keys (masked_softmax_kernel's formula), a row past
// query_len zero weights. store(t, j, w) for every t, j < kLen (w = 0 outside the visible keys),
// once the row is read; statistics(t, shift, inverse) once for each row t < query_len (its lane
// 0), which softmax_weight makes its visible weights from.
template <int kLen, typename Store, typename Statistics>
__device__ __forceinline__ void softmax_block_rows(const AttentionShape& s,
                                                   const AttentionMask& mask, int64_t b,
                                                   const float* scores, int pitch, float scale,
                                                   Store store, Statistics statistics) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t key_count = s.key_len;
  if (mask.key_lengths && mask.key_lengths[b] < key_count) key_count = mask.key_lengths[b];
  for (int t = warp; t < kLen; t += blockDim.x / 32) {
    const float* row = scores + t * pitch;
    int64_t begin = 0, end = 0;  // no query: no key
    if (t < s.query_len) visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
    float largest = -INFINITY;
    for (int j = lane; j < kLen; j += 32)
      if (j >= begin && j < end) largest = fmaxf(largest, row[j]);
    largest = warp_max(largest);
    const float shift = largest * scale;
    float total = 0.f;
    for (int j = lane; j < kLen; j += 32)
      if (j >= begin && j < end) total += softmax_weight(row[j], scale, shift, 1.f);
    total = warp_sum(total);
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    for (int j = lane; j < kLen; j += 32)
      store(t, j, j >= begin && j < end ? softmax_weight(row[j], scale, shift, inverse) : 0.f);
    if (lane == 0 && t < s.query_len) statistics(t, shift, inverse);
  }
}

}  // namespace cuda
}  // namespace tfm
