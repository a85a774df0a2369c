// The CUDA backend's attention (§3.2.1 over all heads of a padded batch), forward and backward,
// with every mask and mode of AttentionShape / AttentionMask: key padding, causal, window, query
// offset, a single query over cached rows (key_rows), shared key batches, bfloat16 caches,
// scaled-dot / dot / additive scores and attention dropout. One block per (sequence, head,
// query): the block scores the query's visible keys, normalises them and sums the values. The
// backward adds each query's share of dK and dV with atomics (their order is not fixed, so dK
// and dV may differ from run to run in the last bits). These kernels serve decoding (cached
// rows, shared key batches), additive scores and very long passes without stored weights;
// everything else goes to attention_short.cu's block per head (the forward of short
// sequences) or the whole-matrix products of attention_dense.cu.
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention_common.h"
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kAttentionThreads = 128;

__device__ __forceinline__ float element(float x) {
  return x;
}
__device__ __forceinline__ float element(uint16_t x) {
  return from_bfloat16(x);
}
// A float16 cache element: its bits, a type of its own so that the templates tell it from
// bfloat16's uint16_t.
struct Float16Bits {
  uint16_t bits;
};
static_assert(sizeof(Float16Bits) == sizeof(uint16_t), "read in place of the cache's uint16_t");
__device__ __forceinline__ float element(Float16Bits x) {
  return from_float16(x.bits);
}

__host__ __device__ __forceinline__ int64_t round_up4(int64_t n) {
  return (n + 3) / 4 * 4;
}

// Row j (of keys or values) of query sequence b, whose keys are sequence kb's, head h.
template <typename Element>
__device__ __forceinline__ const Element* key_row(const Element* base, const AttentionShape& s,
                                                  int64_t b, int64_t kb, int64_t j,
                                                  int64_t row_stride, int64_t given_batch_stride,
                                                  int64_t h) {
  if (s.key_rows)
    return base + int64_t(s.key_rows[b * s.key_rows_stride + j]) * row_stride + h * s.head_dim;
  return base + kb * sequence_stride(given_batch_stride, s.key_len, row_stride) + j * row_stride +
         h * s.head_dim;
}

// Query `index` of s decomposed as (b, h, t), the key sequence kb it reads and the keys
// [begin, end) it sees there.
struct QueryAt {
  int64_t t, h, b, kb, begin, end;
  __device__ QueryAt(const AttentionShape& s, const AttentionMask& mask, int64_t index) {
    t = index % s.query_len;
    const int64_t pair = index / s.query_len;
    h = pair % s.heads;
    b = pair / s.heads;
    kb = mask.key_batch ? mask.key_batch[b] : b;
    int64_t key_count = s.key_len;
    if (mask.key_lengths && mask.key_lengths[kb] < key_count) key_count = mask.key_lengths[kb];
    visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
  }
};

// Block (b, h, t) = blockIdx.x decomposed. scores: probs' row, or this block's scratch row.
template <typename Element>
__global__ void attention_forward_kernel(AttentionShape s, AttentionMask mask, const float* q,
                                         const Element* k, const Element* v, float* probs,
                                         float* scratch, float* out, AttentionDropout dropout,
                                         float scale) {
  TFM_DYNAMIC_SHARED(float, shared_memory);
  __shared__ float reduce[32];
  const int64_t index = blockIdx.x;
  const QueryAt at(s, mask, index);
  const int64_t t = at.t, h = at.h, b = at.b, kb = at.kb, begin = at.begin, end = at.end;
  const int64_t d = s.head_dim;

  // Shared memory: the scores (when neither probs nor scratch holds them), then the query: a
  // wide read past the query's end lands in the padding, not in what other threads write.
  const bool scores_shared = !probs && !scratch;
  float* q_row = shared_memory + (scores_shared ? round_up4(s.key_len) : 0);  // [d]
  float* scores = probs ? probs + index * s.key_len
                        : (scratch ? scratch + index * s.key_len : shared_memory);  // [Tk]
  const float* q_global = q + (b * s.query_len + t) * s.q_row_stride + h * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) q_row[c] = q_global[c];
  __syncthreads();
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  const float* v_head = additive ? s.score.additive_v + h * d : nullptr;
  float largest = -INFINITY;
  for (int64_t j = threadIdx.x; j < s.key_len; j += blockDim.x) {
    if (j < begin || j >= end) {
      scores[j] = 0.f;
      continue;
    }
    const Element* key = key_row(k, s, b, kb, j, s.k_row_stride, s.k_batch_stride, h);
    float sum = 0.f;
    if (additive)
      for (int64_t c = 0; c < d; ++c) sum += v_head[c] * tanhf(q_row[c] + element(key[c]));
    else
      for (int64_t c = 0; c < d; ++c) sum += q_row[c] * element(key[c]);
    scores[j] = sum;
    largest = fmaxf(largest, sum);
  }
  largest = block_max(largest, reduce);
  const float shift = largest * scale;
  float total = 0.f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float e = expf(scores[j] * scale - shift);
    scores[j] = e;
    total += e;
  }
  total = block_sum(total, reduce);
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) scores[j] *= inverse;
  __syncthreads();
  const uint8_t* drop = dropout.p > 0.f ? dropout.mask + index * s.key_len : nullptr;
  const float keep_scale = drop ? 1.f / (1.f - dropout.p) : 1.f;
  float* out_row = out + (b * s.query_len + t) * s.out_row_stride + h * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.f;
    for (int64_t j = begin; j < end; ++j) {
      const float w = drop ? (drop[j] ? scores[j] * keep_scale : 0.f) : scores[j];
      sum += w * element(key_row(v, s, b, kb, j, s.v_row_stride, s.v_batch_stride, h)[c]);
    }
    out_row[c] = sum;
  }
}

// The warp-per-query kernels below: queries a block, the most columns a lane holds (heads of
// at most 32 · kMaxLaneColumns), and the keys whose loads a lane issues together (a decoding
// step's cache attention, 0.092 ms for 16,384 queries of 33 keys in bfloat16 on an H200, 3
// times its bytes' time, spent most of it waiting on the values' loads four keys at a time).
constexpr int kQueryWarps = 4;
constexpr int kMaxLaneColumns = 4;
constexpr int kKeysAtOnce = 8;

// The warp-per-query kernels' softmax: scores [Tk] hold the logits of keys [begin, end) (written
// by any lane of the warp) and become the weights, exp(score · scale − largest · scale)
// normalised over those keys and 0 elsewhere, as the block kernel's.
__device__ __forceinline__ void warp_softmax(float* scores, int64_t key_len, int64_t begin,
                                             int64_t end, float largest, float scale) {
  const int lane = threadIdx.x & 31;
  __syncwarp();  // the logits other lanes wrote
  const float shift = largest * scale;
  float total = 0.f;
  for (int64_t j = lane; j < key_len; j += 32) {
    if (j < begin || j >= end) {
      scores[j] = 0.f;
      continue;
    }
    const float e = expf(scores[j] * scale - shift);
    scores[j] = e;
    total += e;
  }
  total = warp_sum(total);
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  __syncwarp();  // lanes now scale scores other lanes wrote (keys from begin, not from 0)
  for (int64_t j = begin + lane; j < end; j += 32) scores[j] *= inverse;
  __syncwarp();
}

// Their output: query `at`'s row of out, column c = lane + 32 m (m < kColumns, c < d) the sum of
// its visible keys' values weighted, kKeysAtOnce keys' row lookups and loads issued together.
template <int kColumns, typename Element>
__device__ __forceinline__ void warp_weighted_values(const AttentionShape& s, const Element* v,
                                                     const QueryAt& at, const float* weights,
                                                     int64_t d, float* out) {
  const int lane = threadIdx.x & 31;
  float sum[kColumns] = {};
  for (int64_t j0 = at.begin; j0 < at.end; j0 += kKeysAtOnce) {
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; ++u) {
      if (j0 + u >= at.end) continue;
      const float w = weights[j0 + u];
      const Element* value =
          key_row(v, s, at.b, at.kb, j0 + u, s.v_row_stride, s.v_batch_stride, at.h);
#pragma unroll
      for (int m = 0; m < kColumns; ++m) {
        const int64_t c = lane + 32 * m;
        if (c < d) sum[m] += w * element(value[c]);
      }
    }
  }
  const int64_t row = at.b * s.query_len + at.t;
  float* out_row = out + row * s.out_row_stride + at.h * d;
  uint16_t* rounded_row =  // [heads · d] of the dense rounded copy, or null
      s.rounded_out ? s.rounded_out + row * s.heads * d + at.h * d : nullptr;
#pragma unroll
  for (int m = 0; m < kColumns; ++m) {
    const int64_t c = lane + 32 * m;
    if (c >= d) continue;
    out_row[c] = sum[m];
    if (rounded_row) rounded_row[c] = to_bfloat16(sum[m]);
  }
}

// The forward of one query per warp (kQueryWarps queries a block), for dot-product scores
// without dropout and heads of at most 32 · kMaxLaneColumns: the lanes split the head's
// columns, so each key and value row is read by the warp in one coalesced pass (the per-block
// kernel above gives each thread a whole key row and leaves most of its threads idle over a
// decoding step's few keys). The score of each key is a warp sum. Query index (b, h, t) as
// above; scores go to probs' row or to this warp's part of shared memory.

template <typename Element>
__global__ void attention_query_warp_kernel(AttentionShape s, AttentionMask mask, const float* q,
                                            const Element* k, const Element* v, float* probs,
                                            float* out, float scale) {
  TFM_DYNAMIC_SHARED(float, shared_memory);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t index = int64_t(blockIdx.x) * kQueryWarps + warp;
  if (index >= s.batch * s.heads * s.query_len) return;  // no block barrier follows
  const QueryAt at(s, mask, index);
  const int64_t t = at.t, h = at.h, b = at.b, kb = at.kb, begin = at.begin, end = at.end;
  const int64_t d = s.head_dim;
  float* scores =
      probs ? probs + index * s.key_len : shared_memory + warp * round_up4(s.key_len);  // [Tk]
  const float* q_global = q + (b * s.query_len + t) * s.q_row_stride + h * d;
  float q_lane[kMaxLaneColumns];  // q[lane + 32 m]
#pragma unroll
  for (int m = 0; m < kMaxLaneColumns; ++m) {
    const int64_t c = lane + 32 * m;
    q_lane[m] = c < d ? q_global[c] : 0.f;
  }
  // kKeysAtOnce keys per step, their row lookups and loads issued together (a key costs two
  // dependent loads: its row in the table, then the row).
  float largest = -INFINITY;
  for (int64_t j0 = begin; j0 < end; j0 += kKeysAtOnce) {
    float sum[kKeysAtOnce];
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; ++u) {
      sum[u] = 0.f;
      if (j0 + u >= end) continue;
      const Element* key = key_row(k, s, b, kb, j0 + u, s.k_row_stride, s.k_batch_stride, h);
#pragma unroll
      for (int m = 0; m < kMaxLaneColumns; ++m) {
        const int64_t c = lane + 32 * m;
        if (c < d) sum[u] += q_lane[m] * element(key[c]);
      }
    }
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; ++u) {
      sum[u] = warp_sum(sum[u]);
      if (j0 + u < end) {
        if (lane == 0) scores[j0 + u] = sum[u];
        largest = fmaxf(largest, sum[u]);
      }
    }
  }
  warp_softmax(scores, s.key_len, begin, end, largest, scale);
  warp_weighted_values<kMaxLaneColumns>(s, v, at, scores, d, out);
}

// 16 bytes of a row of Element widened to floats (kCount of them); p 16-byte aligned.
template <typename Element>
struct SixteenBytes;
template <>
struct SixteenBytes<float> {
  static constexpr int kCount = 4;
  __device__ static void widen(const float* p, float* out) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  }
};
template <>
struct SixteenBytes<uint16_t> {
  static constexpr int kCount = 8;
  __device__ static void widen(const uint16_t* p, float* out) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = from_bfloat16(uint16_t(words[i] & 0xffffu));
      out[2 * i + 1] = from_bfloat16(uint16_t(words[i] >> 16));
    }
  }
};
template <>
struct SixteenBytes<Float16Bits> {
  static constexpr int kCount = 8;
  __device__ static void widen(const Float16Bits* p, float* out) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = from_float16(uint16_t(words[i] & 0xffffu));
      out[2 * i + 1] = from_float16(uint16_t(words[i] >> 16));
    }
  }
};

// attention_query_warp_kernel with the scores a key per lane, for heads of kHead columns whose
// key rows are 16-byte aligned: each lane reads its key's row in 16-byte words and sums its dot
// product alone, where the kernel above pays a warp reduction per key (most of a decoding
// step's attention was those shuffles). The query sits in the warp's shared memory (read by
// every lane at once), then the scores. Weights and values as above.
template <typename Element, int kHead>
__global__ void attention_query_lanes_kernel(AttentionShape s, AttentionMask mask, const float* q,
                                             const Element* k, const Element* v, float* probs,
                                             float* out, float scale) {
  TFM_DYNAMIC_SHARED(float, shared_memory);
  constexpr int kWord = SixteenBytes<Element>::kCount;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t index = int64_t(blockIdx.x) * kQueryWarps + warp;
  if (index >= s.batch * s.heads * s.query_len) return;  // no block barrier follows
  const QueryAt at(s, mask, index);
  const int64_t t = at.t, h = at.h, b = at.b, kb = at.kb, begin = at.begin, end = at.end;
  // The warp's part of shared memory: the query, then the scores unless probs holds them (the
  // launch's size: kQueryWarps × this).
  const int64_t warp_floats = kHead + (probs ? 0 : round_up4(s.key_len));
  float* q_row = shared_memory + warp * warp_floats;                  // [kHead]
  float* scores = probs ? probs + index * s.key_len : q_row + kHead;  // [Tk]
  const float* q_global = q + (b * s.query_len + t) * s.q_row_stride + h * kHead;
  for (int c = lane; c < kHead; c += 32) q_row[c] = q_global[c];
  __syncwarp();
  float largest = -INFINITY;
  for (int64_t j = begin + lane; j < end; j += 32) {
    const Element* key = key_row(k, s, b, kb, j, s.k_row_stride, s.k_batch_stride, h);
    float sum = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < kHead; c0 += kWord) {
      float word[kWord];
      SixteenBytes<Element>::widen(key + c0, word);
#pragma unroll
      for (int e = 0; e < kWord; ++e) sum += q_row[c0 + e] * word[e];
    }
    scores[j] = sum;
    largest = fmaxf(largest, sum);
  }
  largest = warp_max(largest);
  warp_softmax(scores, s.key_len, begin, end, largest, scale);
  warp_weighted_values<kHead / 32>(s, v, at, scores, kHead, out);
}

// Whether the key rows of s are 16-byte words for attention_query_lanes_kernel: the head a
// multiple of a word, every row and sequence start a whole number of words from an aligned k.
template <typename Element>
bool key_rows_are_words(const AttentionShape& s, const Element* k) {
  constexpr int64_t word = 16 / int64_t(sizeof(Element));
  return s.head_dim % word == 0 && s.k_row_stride % word == 0 &&
         sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride) % word == 0 && aligned(k, 16);
}

// dK and dV of every key row a block may add to start at 0 (only the heads' columns).
__global__ void zero_key_rows_kernel(AttentionShape s, float* dk, float* dv) {
  const int64_t width = s.heads * s.head_dim;
  const int64_t k_batch = sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride);
  const int64_t v_batch = sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride);
  TFM_FOR_EACH(i, s.batch * s.key_len * width) {
    const int64_t c = i % width, j = (i / width) % s.key_len, b = i / (width * s.key_len);
    dk[b * k_batch + j * s.k_row_stride + c] = 0.f;
    dv[b * v_batch + j * s.v_row_stride + c] = 0.f;
  }
}

// Block (b, h, t): dq of its query, and its shares of dK, dV (and d_additive_v) by atomics.
__global__ void attention_backward_kernel(AttentionShape s, AttentionMask mask, const float* q,
                                          const float* k, const float* v, const float* probs,
                                          AttentionDropout dropout, const float* d_out,
                                          float* scratch, float* dq, float* dk, float* dv,
                                          float* d_additive_v, float scale) {
  TFM_DYNAMIC_SHARED(float, shared_memory);
  __shared__ float reduce[32];
  const int64_t index = blockIdx.x;
  const int64_t t = index % s.query_len, pair = index / s.query_len;
  const int64_t h = pair % s.heads, b = pair / s.heads;
  const int64_t d = s.head_dim;
  int64_t key_count = s.key_len;
  if (mask.key_lengths && mask.key_lengths[b] < key_count) key_count = mask.key_lengths[b];
  int64_t begin, end;
  visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
  float* dq_row = dq + (b * s.query_len + t) * s.q_row_stride + h * d;
  if (begin >= end) {
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dq_row[c] = 0.f;
    return;
  }
  // Shared memory: the score gradients (unless in scratch), then the query and its d_out.
  float* d_scores = scratch ? scratch + index * s.key_len : shared_memory;  // [Tk]
  float* q_row = shared_memory + (scratch ? 0 : round_up4(s.key_len));      // [d]
  float* g_row = q_row + d;  // [d] d_out of this query
  const float* q_global = q + (b * s.query_len + t) * s.q_row_stride + h * d;
  const float* g_global = d_out + (b * s.query_len + t) * s.out_row_stride + h * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    q_row[c] = q_global[c];
    g_row[c] = g_global[c];
  }
  __syncthreads();
  const float* p = probs + index * s.key_len;
  const uint8_t* drop = dropout.p > 0.f ? dropout.mask + index * s.key_len : nullptr;
  const float keep_scale = drop ? 1.f / (1.f - dropout.p) : 1.f;
  const int64_t k_batch = sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride);
  const int64_t v_batch = sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride);
  // dP'_j = dO · V_j, through dropout, and Σ_j dP_j · P_j.
  float dot = 0.f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float* value = v + b * v_batch + j * s.v_row_stride + h * d;
    float sum = 0.f;
    for (int64_t c = 0; c < d; ++c) sum += g_row[c] * value[c];
    if (drop) sum = drop[j] ? sum * keep_scale : 0.f;
    d_scores[j] = sum;
    dot += sum * p[j];
  }
  dot = block_sum(dot, reduce);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
    d_scores[j] = p[j] * (d_scores[j] - dot) * scale;
  __syncthreads();
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  const float* v_head = additive ? s.score.additive_v + h * d : nullptr;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.f, sum_v = 0.f;
    for (int64_t j = begin; j < end; ++j) {
      const float g = d_scores[j];
      const float key = k[b * k_batch + j * s.k_row_stride + h * d + c];
      if (additive) {
        const float th = tanhf(q_row[c] + key);
        const float u = g * v_head[c] * (1.f - th * th);
        sum += u;
        sum_v += g * th;
        atomicAdd(dk + b * k_batch + j * s.k_row_stride + h * d + c, u);
      } else {
        sum += g * key;
      }
    }
    dq_row[c] = sum;
    if (additive) atomicAdd(d_additive_v + h * d + c, sum_v);
  }
  for (int64_t i = threadIdx.x; i < (end - begin) * d; i += blockDim.x) {
    const int64_t j = begin + i / d, c = i % d;
    const float weight = drop ? (drop[j] ? p[j] * keep_scale : 0.f) : p[j];
    atomicAdd(dv + b * v_batch + j * s.v_row_stride + h * d + c, weight * g_row[c]);
    if (!additive)
      atomicAdd(dk + b * k_batch + j * s.k_row_stride + h * d + c, d_scores[j] * q_row[c]);
  }
}

// Shared memory for `rows_in_shared` query-sized rows plus a row of Tk scores, when that fits
// in the default 48 KB (with the static arrays); otherwise the scores go to a scratch block of
// [blocks, Tk] floats.
constexpr int64_t kSharedLimit = 44 * 1024;  // of 48 KB, the rest for the static arrays
// The dynamic shared bytes of `floats` floats, rounded up to whole 16-byte words and one more:
// the compiler may read a head's short row (head_dim 1 or 3) with wider loads than its end.
size_t shared_bytes_for(int64_t floats) {
  return size_t((floats * int64_t(sizeof(float)) + 15) / 16 * 16 + 16);
}
bool scores_fit_shared(const AttentionShape& s, int64_t vectors) {
  return int64_t(shared_bytes_for(vectors * s.head_dim + round_up4(s.key_len))) <= kSharedLimit;
}

// The rounded copy of out (AttentionShape::rounded_out) for the forwards whose kernels do not
// write it themselves: a pass of its own.
void round_output(const Context& c, const AttentionShape& s, const float* out) {
  if (s.rounded_out)
    round_to_16_bits(c.stream, out, s.batch * s.query_len, s.heads * s.head_dim, s.out_row_stride,
                     Precision::kBFloat16, s.rounded_out, s.heads * s.head_dim);
}

template <typename Element>
void launch_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                    const float* q, const Element* k, const Element* v, float* probs, float* out,
                    const AttentionDropout& dropout) {
  const int64_t blocks = s.batch * s.heads * s.query_len;
  if (blocks == 0) return;
  if (s.score.kind == AttentionScoring::kAdditive && !s.score.additive_v)
    throw std::invalid_argument("attention_forward: additive scores need their v vectors");
  if (!probs && dropout.p > 0.f)
    throw std::invalid_argument("attention_forward: dropout needs the probs buffer");
  if (s.key_rows && (s.query_len != 1 || dropout.p > 0.f))
    throw std::invalid_argument("attention_forward: key_rows is for one query without dropout");
  if (dropout.p > 0.f)
    dropout_mask(c.stream, dropout.mask, blocks * s.key_len, dropout.p, dropout.key);
  if constexpr (std::is_same_v<Element, float>) {
    if (tensor_core_attention_applies(c, s, mask, dropout)) {
      tensor_core_attention_forward(c, s, mask, q, k, v, probs, out);
      return;
    }
    if (short_attention_applies(s, mask, dropout)) {
      short_attention_forward(c, s, mask, q, k, v, probs, out);
      return;
    }
    if (dense_attention_applies(s, mask, probs != nullptr)) {
      dense_attention_forward(c, s, mask, q, k, v, probs, out, dropout);
      round_output(c, s, out);
      return;
    }
  }
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  const int64_t warp_scores = probs ? 0 : kQueryWarps * round_up4(s.key_len);
  const bool dot_scores = s.score.kind != AttentionScoring::kAdditive && dropout.p == 0.f;
  const int64_t lanes_shared = kQueryWarps * (s.head_dim + (probs ? 0 : round_up4(s.key_len)));
  if (dot_scores && (s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128) &&
      key_rows_are_words(s, k) && int64_t(shared_bytes_for(lanes_shared)) <= kSharedLimit) {
    const unsigned grid = unsigned((blocks + kQueryWarps - 1) / kQueryWarps);
    const size_t bytes = shared_bytes_for(lanes_shared);
    const auto launch = [&](auto kernel) {
      launch_kernel(kernel, grid, 32 * kQueryWarps, bytes, c.stream, s, mask, q, k, v, probs, out,
                    scale);
    };
    if (s.head_dim == 32)
      launch(attention_query_lanes_kernel<Element, 32>);
    else if (s.head_dim == 64)
      launch(attention_query_lanes_kernel<Element, 64>);
    else
      launch(attention_query_lanes_kernel<Element, 128>);
    check_launch("attention_forward (a key per lane)");
    return;
  }
  if (dot_scores && s.head_dim <= 32 * kMaxLaneColumns &&
      int64_t(shared_bytes_for(warp_scores)) <= kSharedLimit) {
    launch_kernel(attention_query_warp_kernel<Element>,
                  unsigned((blocks + kQueryWarps - 1) / kQueryWarps), 32 * kQueryWarps,
                  shared_bytes_for(warp_scores), c.stream, s, mask, q, k, v, probs, out, scale);
    check_launch("attention_forward (a query per warp)");
    return;
  }
  const bool in_shared = probs || scores_fit_shared(s, 1);
  Scratch scratch(c, in_shared ? 0 : blocks * s.key_len * int64_t(sizeof(float)));
  const size_t shared_bytes =
      shared_bytes_for(s.head_dim + (probs || !in_shared ? 0 : round_up4(s.key_len)));
  launch_kernel(attention_forward_kernel<Element>, unsigned(blocks), kAttentionThreads,
                shared_bytes, c.stream, s, mask, q, k, v, probs,
                in_shared ? nullptr : scratch.as<float>(), out, dropout, scale);
  check_launch("attention_forward");
  round_output(c, s, out);
}

}  // namespace

void attention_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                       const float* q, const float* k, const float* v, float* probs, float* out,
                       const AttentionDropout& dropout) {
  // Q, K, V in bfloat16 alone: the tensor-core blocks' (launch_forward's first path) only.
  check_rounded_attention_inputs("attention_forward", s,
                                 attention_reads_rounded_inputs(c, s, mask, dropout));
  launch_forward<float>(c, s, mask, q, k, v, probs, out, dropout);
}

void attention_forward_16_bit_cache(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const float* q, Precision format,
                                    const uint16_t* k, const uint16_t* v, float* probs,
                                    float* out) {
  if (!is_16_bit_float(format))
    throw std::invalid_argument("attention_forward_16_bit_cache: the cache is bfloat16 or float16");
  check_rounded_attention_inputs("attention_forward_16_bit_cache", s, false);
  if (s.query_len != 1)
    throw std::invalid_argument("attention_forward_16_bit_cache: one query per sequence only");
  if (format == Precision::kBFloat16)
    launch_forward<uint16_t>(c, s, mask, q, k, v, probs, out, AttentionDropout{});
  else
    launch_forward<Float16Bits>(c, s, mask, q, reinterpret_cast<const Float16Bits*>(k),
                                reinterpret_cast<const Float16Bits*>(v), probs, out,
                                AttentionDropout{});
}

namespace {

// The gradients' rounded copies (AttentionShape::rounded_dq, _dk, _dv, in the layouts of dq,
// dk, dv) for the backward paths whose kernels do not write them: a pass each (keys and values a
// sequence at a time where their sequences lie apart, a batch stride).
void round_gradients(const Context& c, const AttentionShape& s, const float* dq, const float* dk,
                     const float* dv) {
  const int64_t width = s.heads * s.head_dim;
  if (s.rounded_dq)
    round_to_16_bits(c.stream, dq, s.batch * s.query_len, width, s.q_row_stride,
                     Precision::kBFloat16, s.rounded_dq, s.q_row_stride);
  auto round_keys = [&](const float* x, int64_t given_stride, int64_t row_stride, uint16_t* out) {
    if (!out) return;
    const int64_t batch_stride = sequence_stride(given_stride, s.key_len, row_stride);
    if (batch_stride == s.key_len * row_stride) {
      round_to_16_bits(c.stream, x, s.batch * s.key_len, width, row_stride, Precision::kBFloat16,
                       out, row_stride);
      return;
    }
    for (int64_t b = 0; b < s.batch; ++b)
      round_to_16_bits(c.stream, x + b * batch_stride, s.key_len, width, row_stride,
                       Precision::kBFloat16, out + b * batch_stride, row_stride);
  };
  round_keys(dk, s.k_batch_stride, s.k_row_stride, s.rounded_dk);
  round_keys(dv, s.v_batch_stride, s.v_row_stride, s.rounded_dv);
}

// attention_backward's paths but the tensor cores'.
void backward_in_float32(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                         const float* q, const float* k, const float* v, const float* probs,
                         const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                         float* dv, float* d_additive_v) {
  const int64_t blocks = s.batch * s.heads * s.query_len;
  if (blocks > 0 && dense_attention_applies(s, mask, true)) {
    dense_attention_backward(c, s, mask, q, k, v, probs, dropout, d_out, dq, dk, dv);
    return;
  }
  if (s.batch * s.key_len * s.heads * s.head_dim > 0) {
    launch_kernel(zero_key_rows_kernel, blocks_for(s.batch * s.key_len * s.heads * s.head_dim),
                  kThreads, 0, c.stream, s, dk, dv);
    check_launch("attention_backward (zero dK, dV)");
  }
  if (blocks == 0) return;
  const bool in_shared = scores_fit_shared(s, 2);
  Scratch scratch(c, in_shared ? 0 : blocks * s.key_len * int64_t(sizeof(float)));
  const size_t shared_bytes =
      shared_bytes_for(2 * s.head_dim + (in_shared ? round_up4(s.key_len) : 0));
  launch_kernel(attention_backward_kernel, unsigned(blocks), kAttentionThreads, shared_bytes,
                c.stream, s, mask, q, k, v, probs, dropout, d_out,
                in_shared ? nullptr : scratch.as<float>(), dq, dk, dv, d_additive_v,
                attention_score_scale(s.score.kind, s.head_dim));
  check_launch("attention_backward");
}

}  // namespace

void attention_backward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                        const float* q, const float* k, const float* v, const float* probs,
                        const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                        float* dv, float* d_additive_v) {
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  if (additive && (!s.score.additive_v || !d_additive_v))
    throw std::invalid_argument("attention_backward: additive scores need v and its gradient");
  // Q, K, V in bfloat16 alone: the tensor-core blocks' (below) only.
  check_rounded_attention_inputs(
      "attention_backward", s, probs && attention_reads_rounded_inputs(c, s, mask, dropout), true);
  if (s.batch * s.heads * s.query_len > 0 && probs &&
      tensor_core_attention_applies(c, s, mask, dropout)) {
    tensor_core_attention_backward(c, s, mask, q, k, v, probs, d_out, dq, dk, dv);  // and copies
    return;
  }
  backward_in_float32(c, s, mask, q, k, v, probs, dropout, d_out, dq, dk, dv, d_additive_v);
  round_gradients(c, s, dq, dk, dv);
}

}  // namespace cuda
}  // namespace tfm
