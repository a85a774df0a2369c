// attention_forward(): per (sequence, head) and block of queries the scores come from one GEMM
// over the block's visible keys (Q·Kᵀ, transpose absorbed by the GEMM flag) — or, for additive
// scores, from a vectorised loop over (query, key) pairs — then scale, mask and softmax run in
// one pass per row, then a second GEMM multiplies by V; without a weights buffer, the keys are
// streamed with an online softmax instead. OpenMP spreads the batch × heads pairs over the
// threads; the GEMMs inside run single-threaded. Incremental decoding (one query per sequence)
// reads its cached key and value rows directly instead: plain loops, or with AVX-512 and heads
// of 64, blocks of 16 keys with register-held sums.
#include "backend/cpu/attention.h"

#include "backend/cpu/cpu_dispatch.h"

// The AVX-512 kernels below are compiled into every x86-64 build, whatever its -march, each
// function marked for AVX-512 (TFM_AVX512), and run only where the CPU has it (avx512_usable):
// a portable binary (x86-64-v3) uses them on a machine that has AVX-512 as a native build does.
#if defined(__x86_64__) && defined(__GNUC__)
#define TFM_AVX512_KERNELS 1
#define TFM_AVX512 __attribute__((target("avx512f")))
// GCC 12's AVX-512 header declares its "undefined" vectors as self-initialised, which GCC 12
// then reports as maybe-uninitialized wherever they are inlined: not a fault of this file.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/gemm.h"
#include "tensor/float16.h"

namespace tfm {

namespace {

// One additive logit: Σ_c v[c]·tanh(q[c] + k[c]) over the d entries of a head.
inline float additive_score(const float* q, const float* k, const float* v, int64_t d) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < d; ++c) sum += v[c] * fast_tanh(q[c] + k[c]);
  return sum;
}

// Unscaled logits of one head for `rows` queries × `cols` keys: scores[r * ld + c] is query r's
// logit for key c. v_head: the head's additive vector [d] (additive scores only).
void head_scores(AttentionScoring kind, int64_t rows, int64_t cols, int64_t d, const float* q,
                 int64_t q_stride, const float* k, int64_t k_stride, const float* v_head,
                 float* scores, int64_t ld) {
  if (kind != AttentionScoring::kAdditive) {
    gemm(false, true, rows, cols, d, 1.f, q, q_stride, k, k_stride, 0.f, scores, ld);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      scores[r * ld + c] = additive_score(q + r * q_stride, k + c * k_stride, v_head, d);
}

// Backward of head_scores for additive logits, given d_scores [rows, cols] (row stride ld):
// with t = tanh(q_r + k_c), u = dS[r, c]·v ⊙ (1 − t²): dq_r += u, dk_c += u, dv += dS[r, c]·t.
// tanh is recomputed per pair, so nothing of size rows × cols × d is ever stored.
void additive_scores_backward(int64_t rows, int64_t cols, int64_t d, const float* q,
                              int64_t q_stride, const float* k, int64_t k_stride,
                              const float* v_head, const float* d_scores, int64_t ld, float* dq,
                              int64_t dq_stride, float* dk, int64_t dk_stride, float* dv_head) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* q_r = q + r * q_stride;
    float* dq_r = dq + r * dq_stride;
    for (int64_t c = 0; c < cols; ++c) {
      const float g = d_scores[r * ld + c];
      if (g == 0.f) continue;  // masked keys (and exact zeros) contribute nothing
      const float* k_c = k + c * k_stride;
      float* dk_c = dk + c * dk_stride;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) {
        const float t = fast_tanh(q_r[e] + k_c[e]);
        const float u = g * v_head[e] * (1.f - t * t);
        dq_r[e] += u;
        dk_c[e] += u;
        dv_head[e] += g * t;
      }
    }
  }
}

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

// Query rows are taken in blocks; a block's GEMMs cover only the keys visible to some row of
// it, so causal attention skips the future and restricted attention (window w) costs O(w·n·d).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 256;  // streamed attention: keys per online-softmax update

// Keys visible to any query of [t0, t1) (visibility is an interval moving right with t).
void block_keys(const AttentionMask& mask, int64_t key_count, int64_t t0, int64_t t1, int64_t* lo,
                int64_t* hi) {
  int64_t begin_first, end_first, begin_last, end_last;
  visible_keys(mask, key_count, t0 + mask.query_offset, &begin_first, &end_first);
  visible_keys(mask, key_count, t1 - 1 + mask.query_offset, &begin_last, &end_last);
  // A row past the last valid key has an empty interval starting beyond key_count: clamp.
  *lo = std::min(begin_first, key_count);
  *hi = std::min(std::max(end_last, *lo), key_count);
}

int64_t query_block(const AttentionShape& s, const AttentionMask& mask) {
  return mask.causal || mask.window >= 0 ? kQueryBlock : std::max<int64_t>(s.query_len, 1);
}

// Inference without the weights kept: each block of queries visits its visible keys kKeyBlock at
// a time with an online softmax (running max m, running sum l, unnormalised output acc), so a
// thread holds O(kQueryBlock · kKeyBlock) scores, never the Tq × Tk matrix.
void streamed_attention(const AttentionShape& s, const AttentionMask& mask, int64_t key_count,
                        float scale, const float* v_head, const float* q, const float* k,
                        const float* v, float* out) {
  const int64_t d = s.head_dim;
  float* scratch = thread_scratch(kQueryBlock * (kKeyBlock + d + 2), 0);
  float* scores = scratch;                         // [kQueryBlock, kKeyBlock]
  float* acc = scores + kQueryBlock * kKeyBlock;   // [kQueryBlock, d]
  float* running_max = acc + kQueryBlock * d;      // [kQueryBlock]
  float* running_sum = running_max + kQueryBlock;  // [kQueryBlock]
  for (int64_t t0 = 0; t0 < s.query_len; t0 += kQueryBlock) {
    const int64_t t1 = std::min(t0 + kQueryBlock, s.query_len), rows = t1 - t0;
    int64_t lo, hi;
    block_keys(mask, key_count, t0, t1, &lo, &hi);
    std::fill_n(acc, rows * d, 0.f);
    std::fill_n(running_max, rows, -INFINITY);
    std::fill_n(running_sum, rows, 0.f);
    for (int64_t j0 = lo; j0 < hi; j0 += kKeyBlock) {
      const int64_t j1 = std::min(j0 + kKeyBlock, hi);
      head_scores(s.score.kind, rows, j1 - j0, d, q + t0 * s.q_row_stride, s.q_row_stride,
                  k + j0 * s.k_row_stride, s.k_row_stride, v_head, scores, kKeyBlock);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores + r * kKeyBlock;  // [j1 - j0], column c is key j0 + c
        int64_t begin, end;
        visible_keys(mask, key_count, t0 + r + mask.query_offset, &begin, &end);
        begin = std::max(begin, j0) - j0;
        end = std::min(end, j1) - j0;
        if (begin >= end) {
          std::fill_n(row, j1 - j0, 0.f);
          continue;
        }
        float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
        for (int64_t j = begin; j < end; ++j) block_max = std::max(block_max, row[j] * scale);
        const float new_max = std::max(running_max[r], block_max);
        const float correction = fast_exp(running_max[r] - new_max);  // exp(-inf) = 0 at first
        float sum = 0.f;
        for (int64_t j = 0; j < begin; ++j) row[j] = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = begin; j < end; ++j) {
          row[j] = fast_exp(row[j] * scale - new_max);
          sum += row[j];
        }
        for (int64_t j = end; j < j1 - j0; ++j) row[j] = 0.f;
        running_sum[r] = running_sum[r] * correction + sum;
        running_max[r] = new_max;
        float* acc_row = acc + r * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) acc_row[c] *= correction;
      }
      gemm(false, false, rows, d, j1 - j0, 1.f, scores, kKeyBlock, v + j0 * s.v_row_stride,
           s.v_row_stride, 1.f, acc, d);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float inv_sum = running_sum[r] > 0.f ? 1.f / running_sum[r] : 0.f;
      float* o = out + (t0 + r) * s.out_row_stride;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] = acc[r * d + c] * inv_sum;
    }
  }
}

// A cache element in IEEE float16: its bits, as a type of its own so that the templates below
// tell it from bfloat16's uint16_t (the cache's uint16_t rows are read through it).
struct Float16Bits {
  uint16_t bits;
};
static_assert(sizeof(Float16Bits) == sizeof(uint16_t));

// A cached key or value element as float: float32 as it is, bfloat16 and float16 widened (exact).
inline float cached_element(float x) {
  return x;
}
inline float cached_element(uint16_t x) {
  return std::bit_cast<float>(uint32_t(x) << 16);
}
inline float cached_element(Float16Bits x) {
  return half_to_float(x.bits);
}

// Key or value j of a single query's sequence: row rows[j] of the shared cache at `base`, or
// with no row table, row j of the sequence's own rows at `base`.
template <typename Element>
inline const Element* cached_row(const Element* base, const int32_t* rows, int64_t j,
                                 int64_t stride) {
  return base + (rows ? int64_t(rows[j]) : j) * stride;
}

#if TFM_AVX512_KERNELS
// The AVX-512 form of single_query_attention's two loops for heads of 64 (base and big models),
// which the plain loops leave at a fraction of the machine's rate: there each key's dot product
// ends in a horizontal sum of 16 lanes (GCC: 15 dependent scalar adds), and each key's weighted
// value is added into the output in memory (a load and a store per 16 floats per key).

// Whether this CPU (and its operating system) runs AVX-512 code: asked once.
inline bool avx512_usable() {
  static const bool usable = __builtin_cpu_supports("avx512f");
  return usable;
}

// 16 cached elements as float32 (bfloat16: widened exactly).
TFM_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
TFM_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
TFM_AVX512 inline __m512 load16(const Float16Bits* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lane i of the result: the sum of v[i]'s 16 lanes. Three rounds of pairwise adds, each pairing
// lanes by a shuffle: 45 instructions for 16 sums instead of 16 reductions of 15 adds.
TFM_AVX512 inline __m512 transposed_sums(const __m512 v[16]) {
  __m512 pairs[8];  // per 128-bit lane: [v0, v1, v0, v1] partial sums of v[2i], v[2i + 1]
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 quads[4];  // per 128-bit lane: partial sums of v[4i .. 4i + 3] in order
  for (int i = 0; i < 4; ++i)
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  // 128-bit lanes [0, 2] and [1, 3] of two quads added: each pair of quads in two lanes each.
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88),
                       _mm512_shuffle_f32x4(low, high, 0xDD));
}

// Unscaled scores of keys [begin, end) for every head: probs[h * key_len + j] = q_h · k_j,h.
// Keys in blocks of 16, each block's rows read once for all heads (the block stays in L1).
template <typename Element>
TFM_AVX512 void dot_scores_64(const float* q, const Element* k_base, const int32_t* rows,
                              int64_t k_stride, int64_t heads, int64_t key_len, int64_t begin,
                              int64_t end, float* probs) {
  for (int64_t j0 = begin; j0 < end; j0 += 16) {
    const int n = int(std::min<int64_t>(16, end - j0));
    const Element* key[16];  // the block's rows
    for (int i = 0; i < n; ++i) key[i] = cached_row(k_base, rows, j0 + i, k_stride);
    for (int64_t h = 0; h < heads; ++h) {
      const float* q_h = q + h * 64;
      const __m512 q0 = _mm512_loadu_ps(q_h), q1 = _mm512_loadu_ps(q_h + 16),
                   q2 = _mm512_loadu_ps(q_h + 32), q3 = _mm512_loadu_ps(q_h + 48);
      __m512 lanes[16];  // per key of the block, 16 partial sums of its dot product
      for (int i = 0; i < 16; ++i) {
        if (i >= n) {
          lanes[i] = _mm512_setzero_ps();
          continue;
        }
        const Element* k_h = key[i] + h * 64;
        __m512 sum = _mm512_mul_ps(q0, load16(k_h));
        sum = _mm512_fmadd_ps(q1, load16(k_h + 16), sum);
        sum = _mm512_fmadd_ps(q2, load16(k_h + 32), sum);
        lanes[i] = _mm512_fmadd_ps(q3, load16(k_h + 48), sum);
      }
      float* scores = probs + h * key_len + j0;  // [n]
      if (n == 16) {
        _mm512_storeu_ps(scores, transposed_sums(lanes));
      } else {  // a partial block: only its n scores are written (the row may end here)
        alignas(64) float sums[16];
        _mm512_store_ps(sums, transposed_sums(lanes));
        std::copy_n(sums, n, scores);
      }
    }
  }
}

// out[h * 64 + c] = Σ_j probs[h * key_len + j] · v_j[h * 64 + c] over keys [begin, end), each
// head's sums held in registers (two sets, even and odd keys, for two chains of FMAs).
template <typename Element>
TFM_AVX512 void weighted_values_64(const float* probs, const Element* v_base, const int32_t* rows,
                                   int64_t v_stride, int64_t heads, int64_t key_len, int64_t begin,
                                   int64_t end, float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* p_h = probs + h * key_len;
    __m512 even[4], odd[4];
    for (int c = 0; c < 4; ++c) even[c] = odd[c] = _mm512_setzero_ps();
    int64_t j = begin;
    for (; j + 1 < end; j += 2) {
      const Element* v0 = cached_row(v_base, rows, j, v_stride) + h * 64;
      const Element* v1 = cached_row(v_base, rows, j + 1, v_stride) + h * 64;
      const __m512 p0 = _mm512_set1_ps(p_h[j]), p1 = _mm512_set1_ps(p_h[j + 1]);
      for (int c = 0; c < 4; ++c) {
        even[c] = _mm512_fmadd_ps(p0, load16(v0 + 16 * c), even[c]);
        odd[c] = _mm512_fmadd_ps(p1, load16(v1 + 16 * c), odd[c]);
      }
    }
    if (j < end) {
      const Element* v0 = cached_row(v_base, rows, j, v_stride) + h * 64;
      const __m512 p0 = _mm512_set1_ps(p_h[j]);
      for (int c = 0; c < 4; ++c) even[c] = _mm512_fmadd_ps(p0, load16(v0 + 16 * c), even[c]);
    }
    for (int c = 0; c < 4; ++c)
      _mm512_storeu_ps(out + h * 64 + 16 * c, _mm512_add_ps(even[c], odd[c]));
  }
}
#endif

// Incremental decoding: the single query of sequence b, all heads at once, with plain vectorised
// loops (a GEMM call per head would cost more in overhead than the arithmetic). Each visible
// key row is read once, front to back, for every head. probs: [heads, key_len] of sequence b.
// kHeadDim > 0 fixes the head size at compile time (fully unrolled dot products); 0: runtime.
// Element: float, or uint16_t / Float16Bits for keys and values cached in bfloat16 / float16
// (half the bytes to read, which is what this loop waits for once the cache outgrows the caches).
template <int64_t kHeadDim, typename Element>
void single_query_attention(const AttentionShape& s, const AttentionMask& mask, int64_t b,
                            float scale, const float* q, const Element* k, const Element* v,
                            float* probs, float* out) {
  const int64_t d = kHeadDim > 0 ? kHeadDim : s.head_dim, heads = s.heads;
  const int64_t kb = mask.key_batch ? mask.key_batch[b] : b;
  const int64_t key_count =
      mask.key_lengths ? std::min<int64_t>(mask.key_lengths[kb], s.key_len) : s.key_len;
  // Key j is row rows[j] of k and v (shared cache rows), else row j of sequence kb.
  const int32_t* rows = s.key_rows ? s.key_rows + b * s.key_rows_stride : nullptr;
  const Element* k_base = rows ? k : k + kb * key_batch_stride(s);
  const Element* v_base = rows ? v : v + kb * value_batch_stride(s);
  const float* q_b = q + b * s.q_row_stride;
  float* out_b = out + b * s.out_row_stride;
  int64_t begin, end;
  visible_keys(mask, key_count, mask.query_offset, &begin, &end);
  const float* additive_v =
      s.score.kind == AttentionScoring::kAdditive ? s.score.additive_v : nullptr;
#if TFM_AVX512_KERNELS
  if constexpr (kHeadDim == 64)
    if (!additive_v && avx512_usable()) {
      dot_scores_64(q_b, k_base, rows, s.k_row_stride, heads, s.key_len, begin, end, probs);
      for (int64_t h = 0; h < heads; ++h)
        masked_softmax_row(probs + h * s.key_len, s.key_len, begin, end, scale);
      weighted_values_64(probs, v_base, rows, s.v_row_stride, heads, s.key_len, begin, end, out_b);
      return;
    }
#endif
  float* widened = nullptr;  // [heads · d] one key row as float (additive scores only)
  if constexpr (!std::is_same_v<Element, float>)
    if (additive_v) widened = thread_scratch(heads * d, 0);
  for (int64_t j = begin; j < end; ++j) {
    const Element* key = cached_row(k_base, rows, j, s.k_row_stride);
    if (additive_v) {
      const float* key_row = nullptr;
      if constexpr (std::is_same_v<Element, float>) {
        key_row = key;
      } else {
        for (int64_t c = 0; c < heads * d; ++c) widened[c] = cached_element(key[c]);
        key_row = widened;
      }
      for (int64_t h = 0; h < heads; ++h)
        probs[h * s.key_len + j] =
            additive_score(q_b + h * d, key_row + h * d, additive_v + h * d, d);
      continue;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < d; ++c) dot += q_b[h * d + c] * cached_element(key[h * d + c]);
      probs[h * s.key_len + j] = dot;
    }
  }
  for (int64_t h = 0; h < heads; ++h)
    masked_softmax_row(probs + h * s.key_len, s.key_len, begin, end, scale);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t c = 0; c < d; ++c) out_b[h * d + c] = 0.f;
  for (int64_t j = begin; j < end; ++j) {
    const Element* value = cached_row(v_base, rows, j, s.v_row_stride);
    for (int64_t h = 0; h < heads; ++h) {
      const float p = probs[h * s.key_len + j];
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) out_b[h * d + c] += p * cached_element(value[h * d + c]);
    }
  }
}

// Every sequence's single query in parallel (see single_query_attention).
template <typename Element>
void single_query_attention_batch(const AttentionShape& s, const AttentionMask& mask, float scale,
                                  const float* q, const Element* k, const Element* v, float* probs,
                                  float* out) {
#pragma omp parallel for schedule(static) if (s.batch > 1)
  for (int64_t b = 0; b < s.batch; ++b) {
    float* p_b = probs ? probs + b * s.heads * s.key_len : thread_scratch(s.heads * s.key_len, 1);
    if (s.head_dim == 64)  // base and big models
      single_query_attention<64>(s, mask, b, scale, q, k, v, p_b, out);
    else
      single_query_attention<0>(s, mask, b, scale, q, k, v, p_b, out);
  }
}

// out rounded into s.rounded_out where the caller asks for it (AttentionShape::rounded_out).
void write_rounded_output(const AttentionShape& s, const float* out) {
  if (s.rounded_out)
    round_to_bfloat16(out, s.batch * s.query_len, s.heads * s.head_dim, s.out_row_stride,
                      s.rounded_out, s.heads * s.head_dim);
}

// dq, dk, dv rounded into s.rounded_dq / _dk / _dv (in their layouts) where the caller asks for
// them: keys and values a sequence at a time where their sequences lie apart (a batch stride),
// else at once.
void write_rounded_gradients(const AttentionShape& s, const float* dq, const float* dk,
                             const float* dv) {
  const int64_t width = s.heads * s.head_dim;
  if (s.rounded_dq)
    round_to_bfloat16(dq, s.batch * s.query_len, width, s.q_row_stride, s.rounded_dq,
                      s.q_row_stride);
  auto round_keys = [&](const float* x, int64_t batch_stride, int64_t row_stride, uint16_t* out) {
    if (!out) return;
    if (batch_stride == s.key_len * row_stride) {
      round_to_bfloat16(x, s.batch * s.key_len, width, row_stride, out, row_stride);
      return;
    }
    for (int64_t b = 0; b < s.batch; ++b)
      round_to_bfloat16(x + b * batch_stride, s.key_len, width, row_stride, out + b * batch_stride,
                        row_stride);
  };
  round_keys(dk, key_batch_stride(s), s.k_row_stride, s.rounded_dk);
  round_keys(dv, value_batch_stride(s), s.v_row_stride, s.rounded_dv);
}

}  // namespace

TFM_CPU_KERNEL void attention_forward(const AttentionShape& s, const AttentionMask& mask,
                                      const float* q, const float* k, const float* v, float* probs,
                                      float* out, const AttentionDropout& dropout) {
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  const int64_t pairs = s.batch * s.heads;
  const int64_t pair_size = s.query_len * s.key_len;
  const int64_t block = query_block(s, mask);
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  if (additive && !s.score.additive_v)
    throw std::invalid_argument("attention_forward: additive scores need their v vectors");
  if (!probs && dropout.p > 0.f)
    throw std::invalid_argument("attention_forward: dropout needs the probs buffer");
  if (s.key_rows && (s.query_len != 1 || dropout.p > 0.f))
    throw std::invalid_argument("attention_forward: key_rows is for one query without dropout");
  if (s.query_len == 1 && dropout.p == 0.f) {  // incremental decoding
    single_query_attention_batch(s, mask, scale, q, k, v, probs, out);
    write_rounded_output(s, out);
    return;
  }
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
    const float* v_head = additive ? s.score.additive_v + h * s.head_dim : nullptr;  // [d_k]
    // [Tq, Tk] this pair's weights; null when the caller keeps none (streamed instead)
    float* p_bh = probs ? probs + pair * pair_size : nullptr;
    if (!p_bh) {
      streamed_attention(s, mask, key_count, scale, v_head, q_bh, k_bh, v_bh, out_bh);
      continue;
    }
    for (int64_t t0 = 0; t0 < s.query_len; t0 += block) {
      const int64_t t1 = std::min(t0 + block, s.query_len), rows = t1 - t0;
      int64_t lo, hi;
      block_keys(mask, key_count, t0, t1, &lo, &hi);
      float* p_block = p_bh + t0 * s.key_len;  // [rows, Tk]
      if (hi > lo)
        head_scores(s.score.kind, rows, hi - lo, s.head_dim, q_bh + t0 * s.q_row_stride,
                    s.q_row_stride, k_bh + lo * s.k_row_stride, s.k_row_stride, v_head,
                    p_block + lo, s.key_len);
      for (int64_t t = t0; t < t1; ++t) {  // also zeroes the columns outside [lo, hi)
        int64_t begin, end;
        visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
        masked_softmax_row(p_bh + t * s.key_len, s.key_len, begin, end, scale);
      }
      const float* weights = p_block;
      if (dropout.p > 0.f) {
        float* dropped = thread_scratch(rows * s.key_len, 0);  // [rows, Tk]
        dropped_probs(p_block, dropout.mask + pair * pair_size + t0 * s.key_len, dropout.p,
                      rows * s.key_len, dropped);
        weights = dropped;
      }
      gemm(false, false, rows, s.head_dim, hi - lo, 1.f, weights + lo, s.key_len,
           v_bh + lo * s.v_row_stride, s.v_row_stride, 0.f, out_bh + t0 * s.out_row_stride,
           s.out_row_stride);
    }
  }
  write_rounded_output(s, out);
}

TFM_CPU_KERNEL void attention_forward_16_bit_cache(const AttentionShape& s,
                                                   const AttentionMask& mask, const float* q,
                                                   Precision format, const uint16_t* k,
                                                   const uint16_t* v, float* probs, float* out) {
  if (!is_16_bit_float(format))
    throw std::invalid_argument("attention_forward_16_bit_cache: the cache is bfloat16 or float16");
  if (s.query_len != 1)
    throw std::invalid_argument("attention_forward_16_bit_cache: one query per sequence only");
  if (s.score.kind == AttentionScoring::kAdditive && !s.score.additive_v)
    throw std::invalid_argument("attention_forward: additive scores need their v vectors");
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  if (format == Precision::kBFloat16)
    single_query_attention_batch(s, mask, scale, q, k, v, probs, out);
  else
    single_query_attention_batch(s, mask, scale, q, reinterpret_cast<const Float16Bits*>(k),
                                 reinterpret_cast<const Float16Bits*>(v), probs, out);
  write_rounded_output(s, out);
}

TFM_CPU_KERNEL void attention_backward(const AttentionShape& s, const AttentionMask& mask,
                                       const float* q, const float* k, const float* v,
                                       const float* probs, const AttentionDropout& dropout,
                                       const float* d_out, float* dq, float* dk, float* dv,
                                       float* d_additive_v) {
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  const int64_t pairs = s.batch * s.heads;
  const int64_t pair_size = s.query_len * s.key_len;
  const int64_t block = query_block(s, mask);
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  if (additive && (!s.score.additive_v || !d_additive_v))
    throw std::invalid_argument("attention_backward: additive scores need v and its gradient");
  // [pairs, d_k] each pair's share of d_additive_v, summed over the batch after the loop (a
  // fixed order, so the result does not depend on the thread count).
  std::vector<float> pair_dv(additive ? size_t(pairs * s.head_dim) : 0, 0.f);
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
    const float keep_scale = mask_bh ? 1.f / (1.f - dropout.p) : 1.f;

    // dK and dV accumulate over the query blocks. The keys a block sees, [lo, hi), only move
    // right from block to block: the first block with keys writes its rows (beta 0), a later one
    // first zeroes the rows that are new to it ([written_hi, hi)) and adds. Rows no query sees
    // (padding, keys before the first block's) are zeroed at the end. Additive scores add into
    // dK outside a product, so there every row starts at 0.
    auto zero_key_rows = [&](int64_t j0, int64_t j1) {  // dK and dV rows [j0, j1) of this pair
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t c = 0; c < s.head_dim; ++c) {
          dk[k_offset + j * s.k_row_stride + c] = 0.f;
          dv[v_offset + j * s.v_row_stride + c] = 0.f;
        }
    };
    int64_t written_lo = 0, written_hi = 0;  // dK / dV rows written so far (none: empty)
    if (additive) {
      zero_key_rows(0, s.key_len);
      written_hi = s.key_len;
    }
    for (int64_t t0 = 0; t0 < s.query_len; t0 += block) {
      const int64_t t1 = std::min(t0 + block, s.query_len), rows = t1 - t0;
      int64_t lo, hi;
      block_keys(mask, key_count, t0, t1, &lo, &hi);
      if (hi <= lo) {  // no visible key: no gradient to the queries
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t c = 0; c < s.head_dim; ++c) dq[q_offset + t * s.q_row_stride + c] = 0.f;
        continue;
      }
      const int64_t width = hi - lo;
      float key_beta = 1.f;  // 0: this block writes the first rows of dK and dV
      if (written_hi == written_lo) {
        key_beta = 0.f;
        written_lo = lo;
        written_hi = hi;
      } else if (hi > written_hi) {
        zero_key_rows(written_hi, hi);
        written_hi = hi;
      }
      const float* p_block = p_bh + t0 * s.key_len + lo;  // [rows, width], row stride Tk
      // dV += P'ᵀ · dO, with P' the weights applied in the forward pass.
      const float* weights = p_block;
      int64_t weights_stride = s.key_len;
      if (mask_bh) {
        float* dropped = thread_scratch(rows * width, 0);  // [rows, width]
        for (int64_t r = 0; r < rows; ++r)
          dropped_probs(p_block + r * s.key_len, mask_bh + (t0 + r) * s.key_len + lo, dropout.p,
                        width, dropped + r * width);
        weights = dropped;
        weights_stride = width;
      }
      gemm(true, false, width, s.head_dim, rows, 1.f, weights, weights_stride,
           d_out_bh + t0 * s.out_row_stride, s.out_row_stride, key_beta,
           dv + v_offset + lo * s.v_row_stride, s.v_row_stride);
      // dP' = dO · Vᵀ  [rows, width]
      float* d_scores = thread_scratch(rows * width, 1);
      gemm(false, true, rows, width, s.head_dim, 1.f, d_out_bh + t0 * s.out_row_stride,
           s.out_row_stride, v + v_offset + lo * s.v_row_stride, s.v_row_stride, 0.f, d_scores,
           width);
      // Through dropout, then softmax: dS = P ⊙ (dP − Σ_j dP·P), scaled by 1/sqrt(d_k).
      for (int64_t r = 0; r < rows; ++r) {
        float* row = d_scores + r * width;
        const float* p_row = p_block + r * s.key_len;
        if (mask_bh) {
          const uint8_t* m_row = mask_bh + (t0 + r) * s.key_len + lo;
          for (int64_t j = 0; j < width; ++j) row[j] = m_row[j] ? row[j] * keep_scale : 0.f;
        }
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < width; ++j) dot += row[j] * p_row[j];
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) row[j] = p_row[j] * (row[j] - dot) * scale;
      }
      if (additive) {  // through v_hᵀ·tanh(q_i + k_j)
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t c = 0; c < s.head_dim; ++c) dq[q_offset + t * s.q_row_stride + c] = 0.f;
        additive_scores_backward(rows, width, s.head_dim, q + q_offset + t0 * s.q_row_stride,
                                 s.q_row_stride, k + k_offset + lo * s.k_row_stride, s.k_row_stride,
                                 s.score.additive_v + h * s.head_dim, d_scores, width,
                                 dq + q_offset + t0 * s.q_row_stride, s.q_row_stride,
                                 dk + k_offset + lo * s.k_row_stride, s.k_row_stride,
                                 pair_dv.data() + pair * s.head_dim);
        continue;
      }
      // dQ = dS · K, dK += dSᵀ · Q.
      gemm(false, false, rows, s.head_dim, width, 1.f, d_scores, width,
           k + k_offset + lo * s.k_row_stride, s.k_row_stride, 0.f,
           dq + q_offset + t0 * s.q_row_stride, s.q_row_stride);
      gemm(true, false, width, s.head_dim, rows, 1.f, d_scores, width,
           q + q_offset + t0 * s.q_row_stride, s.q_row_stride, key_beta,
           dk + k_offset + lo * s.k_row_stride, s.k_row_stride);
    }
    zero_key_rows(0, written_lo);
    zero_key_rows(written_hi, s.key_len);
  }
  if (additive)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.heads * s.head_dim; ++i)
        d_additive_v[i] += pair_dv[size_t(b * s.heads * s.head_dim + i)];
  write_rounded_gradients(s, dq, dk, dv);
}

}  // namespace tfm
