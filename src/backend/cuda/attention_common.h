// What the CUDA backend's attention paths share (attention.cu's per-query kernels,
// attention_dense.cu's whole-matrix products, the block-per-head kernels of attention_short.cu,
// attention_tensor_cores.cu and attention_in_registers.cu): which keys a query sees, where a
// sequence's keys start, where a (sequence, head) block's rows are, and how a block loads them
// into shared memory. Device code; included by those files only.
#pragma once

#include <cstdint>
#include <type_traits>

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

// The valid keys of sequence b: its key length where the mask gives one, else all key_len.
__device__ __forceinline__ int64_t sequence_key_count(const AttentionShape& s,
                                                      const AttentionMask& mask, int64_t b) {
  return mask.key_lengths && mask.key_lengths[b] < s.key_len ? mask.key_lengths[b] : s.key_len;
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
  // Row t of the rows' softmax statistics (shift, inverse sum), [B, H, Tq, 2], which the
  // tensor-core blocks keep instead of the weights where they rebuild them in the backward.
  __device__ int64_t statistics_row(const AttentionShape& s, int64_t t) const {
    return ((b * s.heads + h) * s.query_len + t) * 2;
  }
};

// rows × cols floats (Source float) or bfloat16 values (Source uint16_t: Q, K and V where a
// training step's projections wrote them so, AttentionShape::rounded_q) with rows row_stride
// apart, held by a block of kThreads in registers between fetching them and storing them in
// bfloat16 (floats rounded) into a shared kRows × kCols matrix (rows `pitch` apart; zero outside
// rows × cols). Thread t holds the words w = t + n · kThreads (n < kWords): four values of row
// 4w / kCols from column 4w % kCols, so the threads of a row are kCols / 4 consecutive lanes of
// one warp. A kernel fetches all the matrices it needs next before
// it stores any, so each thread has every load in flight at once: one memory latency where
// fetching a matrix at a time waited three (the 64-row forward took 0.165 ms for 3,200 heads on
// an H200 with 8 floats in flight a thread, about three times its bytes' time). Where the rows
// allow it (cols and row_stride multiples of 4, first aligned to a word: the heads' rows, and
// weights rows of a multiple of 4 keys) a word is one load (16 bytes of floats, 8 of bfloat16),
// else four of one value; the shared matrix holds the same values either way.
template <int kRows, int kCols, int kThreads, typename Source = float>
struct HeldRows {
  static_assert(std::is_same_v<Source, float> || std::is_same_v<Source, uint16_t>,
                "floats, or bfloat16 bits");
  static constexpr bool kRounds = std::is_same_v<Source, float>;
  using Word = std::conditional_t<kRounds, float4, uint2>;  // four values
  static constexpr int kWords = kRows * kCols / 4 / kThreads;
  static_assert(kCols % 4 == 0 && kRows * kCols / 4 % kThreads == 0 && kThreads % (kCols / 4) == 0,
                "every thread holds the same number of words, a row's in one warp");
  Word x[kWords];

  __device__ static int row(int n) { return 4 * (int(threadIdx.x) + n * kThreads) / kCols; }
  __device__ static int column(int n) { return 4 * (int(threadIdx.x) + n * kThreads) % kCols; }

  // Four values from `at` (columns c.. of a row), zero past `cols`.
  __device__ static Word four(const Source* at, int c, int cols) {
    const auto value = [&](int i) { return c + i < cols ? at[i] : Source(0); };
    if constexpr (kRounds)
      return make_float4(value(0), value(1), value(2), value(3));
    else
      return pack_16_bits(value(0), value(1), value(2), value(3));
  }

  __device__ __forceinline__ void fetch(const Source* first, int64_t row_stride, int rows,
                                        int cols) {
    const bool by_words = cols % 4 == 0 && row_stride % 4 == 0 && aligned(first, sizeof(Word));
#pragma unroll
    for (int n = 0; n < kWords; ++n) {
      const int r = row(n), c = column(n);
      const Source* at = first + r * row_stride + c;
      if (r >= rows || c >= cols)
        x[n] = Word{};  // zero: 0.f, or bfloat16 +0
      else if (by_words)
        x[n] = *reinterpret_cast<const Word*>(at);
      else
        x[n] = four(at, c, cols);
    }
  }

  __device__ __forceinline__ void store(uint16_t* shared, int pitch) const {
#pragma unroll
    for (int n = 0; n < kWords; ++n) {
      uint2* to = reinterpret_cast<uint2*>(shared + row(n) * pitch + column(n));
      if constexpr (kRounds)
        *to = pack_16_bits(to_bfloat16(x[n].x), to_bfloat16(x[n].y), to_bfloat16(x[n].z),
                           to_bfloat16(x[n].w));
      else
        *to = x[n];
    }
  }
};

// The sum of `value` over the kLanes consecutive lanes (a power of two up to 32, aligned within
// the warp) that hold one row of a HeldRows matrix, in each of them.
template <int kLanes>
__device__ __forceinline__ float row_sum(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

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
  const int64_t key_count = sequence_key_count(s, mask, b);
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
