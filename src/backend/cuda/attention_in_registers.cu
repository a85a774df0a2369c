// Training's attention in bfloat16 with its scores, weights and products in the registers of the
// warps that compute them: a block per (sequence, head) for up to kRows = 32, 48, 64, 96 or 128
// queries and keys with heads of 64, as attention_tensor_cores.cu's WMMA blocks, which go through
// shared memory at every step (S and dP stored as floats and read back for the softmax, P and dS
// stored again for the next product): 0.165 ms forward and 0.250 ms backward for 3,200 heads of 64
// × 64 on an H200, several times what their bytes and products need. Here each warp holds 16 query
// rows: mma.sync's m16n8k16 bfloat16 products (summed in float32) leave S = Q·Kᵀ in its
// registers, the masked softmax runs on them (a row's sums over the four lanes that hold it), and
// the weights go into O = P·V as the product's left operand without leaving the registers (two
// accumulator tiles make one left operand). The backward holds a strip's weights (rebuilt from
// Q·Kᵀ and each row's shift and inverse sum, or read as the forward stored them), dP = dO·Vᵀ, dS
// and dQ = dS·K the same way, then stores P and dS in bfloat16 once, so that each warp can take
// 16 keys for dV = Pᵀ·dO and dK = dSᵀ·Q. Operands come from shared memory through ldmatrix
// (transposed where a product reads a matrix by columns).
//
// The same formulas as the WMMA blocks (softmax_weight; masked_softmax_kernel's softmax and
// softmax_backward_kernel's gradient in float32; operands rounded to bfloat16, nearest even), in
// other orders of summation. The forward and the backward that rebuilds the weights share one
// product for S, so that stored and rebuilt weights are the same bits.
// TFM_CUDA_ATTENTION_IN_REGISTERS=0 takes the WMMA blocks instead, to compare or to rule these out.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

#include "backend/cuda/attention_common.h"
#ifndef TFM_EMULATED_WARPS  // tests/warp_emulation.h brings its own
#include "backend/cuda/warp_matrix.h"
#endif
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kHead = 64;               // the head size
constexpr int kHeadSteps = kHead / 16;  // the k16 steps of a product over a head's width
constexpr int kHeadTiles = kHead / 8;   // the n8 tiles of a head's width
// Shared matrices' rows are padded by 16 bytes (a head's width: 144 bytes; kRows keys: 16 · 2 ·
// kRows + 16), so that ldmatrix's eight row addresses fall on distinct banks.
constexpr int kHeadPitch = kHead + 8;  // bfloat16 values from a row to the next
template <int kRows>
constexpr int kKeyPitch = kRows + 8;
template <int kRows>
constexpr int kThreads = 2 * kRows;  // a warp for each 16 query rows (or keys)

// The forward's blocks an SM the registers must leave room for: two of 128 rows (128 registers a
// thread, where the compiler's own choice, 138, left one: half the SM's warps idle while a
// block loads), four of 64 (its choice, 90 to 120, allows that anyway); of 96 rows two (120
// registers; three spilled 108 bytes), of 48 five (125; six spilled), of 32 eight.
template <int kRows>
constexpr int kForwardBlocksAnSm = kRows == 128  ? 2
                                   : kRows == 96 ? 2
                                   : kRows == 64 ? 4
                                   : kRows == 48 ? 5
                                                 : 8;

// The rows a block that holds a call's (sequence, head) whole may have, fewest first: each an
// instantiation of the kernels below.
constexpr int kBlockRows[] = {32, 48, 64, 96, 128};

// The rows of the blocks that hold a call's (sequence, head) whole: the fewest of kBlockRows
// that hold its queries and keys, since a block's products, softmax and warps grow with its rows
// and not with the sequence's (a sentence of 25 tokens in a 64-row block paid for 64 × 64 scores
// in four warps, where a 32-row one computes 32 × 32 in two); 0 beyond 128: tiles of 64.
// TFM_CUDA_ATTENTION_FITTED_ROWS=0 keeps to 64 and 128 (as before 2026-11-30), to compare.
inline int rows_of_blocks(int64_t query_len, int64_t key_len) {
  static const bool fitted = !turned_off("TFM_CUDA_ATTENTION_FITTED_ROWS");
  const int64_t longest = std::max(query_len, key_len);
  for (int rows : kBlockRows)
    if (longest <= rows && (fitted || rows == 64 || rows == 128)) return rows;
  return 0;
}

// launch(std::integral_constant<int, R>{}) for the R of kBlockRows that equals `rows`; false
// (nothing called) where none does.
template <typename Launch, size_t... kIndex>
bool launch_with_rows(int rows, Launch& launch, std::index_sequence<kIndex...>) {
  return ((rows == kBlockRows[kIndex] &&
           (launch(std::integral_constant<int, kBlockRows[kIndex]>{}), true)) ||
          ...);
}

// launch(std::integral_constant<int, R>{}) for R = rows_of_blocks of shape s; false (nothing
// called) where s takes tiles.
template <typename Launch>
bool with_block_rows(const AttentionShape& s, Launch launch) {
  return launch_with_rows(rows_of_blocks(s.query_len, s.key_len), launch,
                          std::make_index_sequence<std::size(kBlockRows)>{});
}

template <int kRows>
struct Layout {
  static constexpr int kKeyTiles = kRows / 8;             // n8 tiles of a row of scores
  static constexpr int kKeySteps = kRows / 16;            // k16 steps over the keys (or queries)
  static constexpr int kHeadMatrix = kRows * kHeadPitch;  // elements: Q, K, V, dO
  static constexpr int kKeyMatrix = kRows * kKeyPitch<kRows>;  // P, dS
  // Bytes of shared memory: the forward's Q, K, V; the backward's Q, dO, then K and V, whose
  // place P and dS take once the products that read K and V are done.
  static constexpr size_t kForwardBytes = sizeof(uint16_t) * 3 * kHeadMatrix;
  static constexpr size_t kBackwardBytes =
      sizeof(uint16_t) * (2 * kHeadMatrix + std::max(2 * kHeadMatrix, 2 * kKeyMatrix));
  static_assert(kHeadMatrix * sizeof(uint16_t) % 16 == 0 && kKeyMatrix * sizeof(uint16_t) % 16 == 0,
                "ldmatrix reads rows of 16-byte words");
};

// Two floats rounded to bfloat16 (to_bfloat16: nearest even), the first in the low half: the
// integer rounding rather than cuda_common.h's to_bfloat16_pair (one cvt instruction), with which
// the 128-row forward's registers spilled 48 bytes.
__device__ __forceinline__ uint32_t pack_bfloat16(float low, float high) {
  return uint32_t(to_bfloat16(low)) | uint32_t(to_bfloat16(high)) << 16;
}

// A lane's float sums of a warp's 16 rows × 8 kTiles columns: tile j's d[0..3] (multiply_add's
// layout): row g + 8 h, column 8 j + 2 q + e in sums[j][2 h + e].
template <int kTiles>
struct Sums {
  float d[kTiles][4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
  }
};

// A warp's 16 rows × 16 kSteps columns as bfloat16 left operands, one a k16 step.
template <int kSteps>
struct LeftOperands {
  uint32_t a[kSteps][4];
  // From sums of the same rows (kTiles = 2 kSteps), rounded: tiles 2i and 2i + 1 make step i.
  __device__ __forceinline__ void round(const Sums<2 * kSteps>& s) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      a[i][0] = pack_bfloat16(s.d[2 * i][0], s.d[2 * i][1]);
      a[i][1] = pack_bfloat16(s.d[2 * i][2], s.d[2 * i][3]);
      a[i][2] = pack_bfloat16(s.d[2 * i + 1][0], s.d[2 * i + 1][1]);
      a[i][3] = pack_bfloat16(s.d[2 * i + 1][2], s.d[2 * i + 1][3]);
    }
  }
  // Into shared rows (the warp's first at `rows`, `pitch` apart), as they lie.
  __device__ __forceinline__ void store(uint16_t* rows, int pitch) const {
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      uint16_t* at = rows + g * pitch + 16 * i + 2 * q;
      *reinterpret_cast<uint32_t*>(at) = a[i][0];
      *reinterpret_cast<uint32_t*>(at + 8 * pitch) = a[i][1];
      *reinterpret_cast<uint32_t*>(at + 8) = a[i][2];
      *reinterpret_cast<uint32_t*>(at + 8 * pitch + 8) = a[i][3];
    }
  }
};

// The left operand of k step `step` of a warp's product from shared memory, `pitch` apart.
// kByRows: the 16 rows stored as rows (element (i, k) at m[i · pitch + k], m at the warp's first
// row): matrices rows 0-7 and 8-15 of columns 0-7, then of columns 8-15. Else the operand's
// transpose stored (element (i, k) at m[k · pitch + i], m at the warp's first column: Pᵀ and dSᵀ
// read in place): k 0-7 of columns i 0-7 and 8-15, then k 8-15 of each.
template <bool kByRows>
__device__ __forceinline__ void load_left(uint32_t (&a)[4], const uint16_t* m, int pitch,
                                          int step) {
  const int lane = threadIdx.x % 32;
  if constexpr (kByRows)
    load_matrices(a, m + (lane % 16) * pitch + 16 * step + 8 * (lane / 16));
  else
    load_matrices_transposed(
        a, m + (16 * step + lane % 8 + 8 * (lane / 16)) * pitch + 8 * (lane / 8 % 2));
}

// sums += a · B[16 step.., all kTiles · 8 columns] for k step `step`, B in shared memory, `pitch`
// apart. kByRows: B stored as rows (element (k, n) at b[k · pitch + n]: V, K, dO, Q), read
// transposed; else stored by columns (element (k, n) at b[n · pitch + k]: Kᵀ, Vᵀ). Two tiles a
// load: matrices (k 0-7, k 8-15) of columns n..n + 7, then of n + 8..n + 15.
template <int kTiles, bool kByRows>
__device__ __forceinline__ void multiply_add_right(Sums<kTiles>& sums, const uint32_t (&a)[4],
                                                   const uint16_t* b, int pitch, int step) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kTiles; j += 2) {
    uint32_t r[4];
    if constexpr (kByRows)
      load_matrices_transposed(
          r, b + (16 * step + lane % 8 + 8 * (lane / 8 % 2)) * pitch + 8 * j + 8 * (lane / 16));
    else
      load_matrices(
          r, b + (8 * j + lane % 8 + 8 * (lane / 16)) * pitch + 16 * step + 8 * (lane / 8 % 2));
    multiply_add(sums.d[j], a, r[0], r[1]);
    multiply_add(sums.d[j + 1], a, r[2], r[3]);
  }
}

// sums = strip · Mᵀ over a head's width: a warp's 16 rows (`strip`: its first) by the 8 kTiles
// rows of M (K or V), both in shared memory kHeadPitch apart. S = Q·Kᵀ, dP = dO·Vᵀ.
template <int kTiles>
__device__ __forceinline__ void strip_by_rows_of(const uint16_t* strip, const uint16_t* m,
                                                 Sums<kTiles>& sums) {
  sums.zero();
#pragma unroll
  for (int step = 0; step < kHeadSteps; ++step) {
    uint32_t a[4];
    load_left<true>(a, strip, kHeadPitch, step);
    multiply_add_right<kTiles, false>(sums, a, m, kHeadPitch, step);
  }
}

// sums += A·M: a warp's left operands A in registers (16 rows × 16 kSteps: P, dS) by the first
// 16 kSteps rows of M (V, K: a head's width, kHeadPitch apart). O = P·V, dQ = dS·K.
template <int kSteps>
__device__ __forceinline__ void multiply_add_rows(const LeftOperands<kSteps>& left,
                                                  const uint16_t* m, Sums<kHeadTiles>& sums) {
#pragma unroll
  for (int step = 0; step < kSteps; ++step)
    multiply_add_right<kHeadTiles, true>(sums, left.a[step], m, kHeadPitch, step);
}

// sums += Wᵀ·M for a warp's 16 columns of W (`columns`: its first; 16 kSteps rows `pitch` apart:
// P or dS stored by query rows) and M's rows (dO, Q: a head's width, kHeadPitch apart), W read
// in place, transposed. dV = Pᵀ·dO, dK = dSᵀ·Q.
template <int kSteps>
__device__ __forceinline__ void multiply_add_columns(const uint16_t* columns, int pitch,
                                                     const uint16_t* m, Sums<kHeadTiles>& sums) {
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    uint32_t a[4];
    load_left<false>(a, columns, pitch, step);
    multiply_add_right<kHeadTiles, true>(sums, a, m, kHeadPitch, step);
  }
}

// S = Q·Kᵀ for a warp's 16 query rows (`strip`: its first row of Q) over a block's kRows keys:
// the one product of the forward's scores and of the backward that rebuilds the weights from
// them, so that both sum alike, to the bit.
template <int kRows>
__device__ __forceinline__ void strip_scores(const uint16_t* strip, const uint16_t* keys,
                                             Sums<Layout<kRows>::kKeyTiles>& scores) {
  strip_by_rows_of(strip, keys, scores);
}

// Σ (or the largest) of a row's values over the four lanes that hold it.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// The keys query row `row` of sequence b sees, [begin, end): none past the queries.
struct VisibleKeys {
  int64_t begin = 0, end = 0;
  __device__ VisibleKeys(const AttentionShape& s, const AttentionMask& mask, int64_t key_count,
                         int row) {
    if (row < s.query_len) visible_keys(mask, key_count, row + mask.query_offset, &begin, &end);
  }
  __device__ bool operator()(int key) const { return key >= begin && key < end; }
};

// The weights of half h of a strip's rows from its scores of keys first_key.., in place:
// softmax_weight of the visible keys, zero elsewhere.
template <int kTiles>
__device__ __forceinline__ void weights_from_scores(Sums<kTiles>& p, int h,
                                                    const VisibleKeys& visible, float scale,
                                                    float shift, float inverse, int first_key = 0) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = p.d[j][2 * h + e];
      x = visible(first_key + 8 * j + 2 * q + e) ? softmax_weight(x, scale, shift, inverse) : 0.f;
    }
}

// A strip's 16 rows × a head's width of sums to rows `first_row`.. of `first` (floats, null: not
// there) and of `rounded` (bfloat16, null: not there), row_stride and rounded_stride apart; rows
// from `rows` on are not stored. Pairs of values in one store where the rows allow.
__device__ __forceinline__ void store_strip(const Sums<kHeadTiles>& sums, int first_row, int rows,
                                            float* first, int64_t row_stride, uint16_t* rounded,
                                            int64_t rounded_stride) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const bool float_pairs = aligned(first, 8) && row_stride % 2 == 0;
  const bool rounded_pairs = aligned(rounded, 4) && rounded_stride % 2 == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + g + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int j = 0; j < kHeadTiles; ++j) {
      const int col = 8 * j + 2 * q;
      const float x = sums.d[j][2 * h], y = sums.d[j][2 * h + 1];
      if (first) {
        float* at = first + row * row_stride + col;
        if (float_pairs) {
          *reinterpret_cast<float2*>(at) = make_float2(x, y);
        } else {
          at[0] = x;
          at[1] = y;
        }
      }
      if (rounded) {
        uint16_t* at = rounded + row * rounded_stride + col;
        if (rounded_pairs) {
          *reinterpret_cast<uint32_t*>(at) = pack_bfloat16(x, y);
        } else {
          at[0] = to_bfloat16(x);
          at[1] = to_bfloat16(y);
        }
      }
    }
  }
}

// A head's rows from device memory into shared matrices of bfloat16 (rounded as they come where
// they are floats), kRows rows kHeadPitch apart, zero past `rows`.
template <typename Input>
struct HeadSource {
  const Input* first;
  int64_t row_stride;
  int rows;
  uint16_t* shared;
};
// Every load of `together` matrices is issued before their stores: four of bfloat16 (16
// registers each), two of floats (32 each).
template <int kRows, typename Input, int kCount>
__device__ __forceinline__ void load_heads(const HeadSource<Input> (&sources)[kCount]) {
  constexpr int kTogether = std::is_same_v<Input, float> ? 2 : 4;
#pragma unroll
  for (int first = 0; first < kCount; first += kTogether) {
    HeldRows<kRows, kHead, kThreads<kRows>, Input> held[kTogether];
#pragma unroll
    for (int i = 0; i < kTogether && first + i < kCount; ++i) {
      const HeadSource<Input>& from = sources[first + i];
      held[i].fetch(from.first, from.row_stride, from.rows, kHead);
    }
#pragma unroll
    for (int i = 0; i < kTogether && first + i < kCount; ++i)
      held[i].store(sources[first + i].shared, kHeadPitch);
  }
}

// Block (b, h): S = Q·Kᵀ, P = the masked softmax of S · scale, stored into probs where given
// (statistics_only: each row's shift and inverse sum instead, [Tq, 2], from which the backward
// rebuilds P), O = P·V into out (unless null) and into s.rounded_out where given.
template <int kRows, typename Input>
__global__ void __launch_bounds__(kThreads<kRows>, kForwardBlocksAnSm<kRows>)
    forward_in_registers_kernel(AttentionShape s, AttentionMask mask, const Input* q,
                                const Input* k, const Input* v, float* probs, float* out,
                                float scale, bool statistics_only) {
  using L = Layout<kRows>;
  TFM_DYNAMIC_SHARED(unsigned char, shared_bytes);
  uint16_t* queries = reinterpret_cast<uint16_t*>(shared_bytes);
  uint16_t* keys = queries + L::kHeadMatrix;
  uint16_t* values = keys + L::kHeadMatrix;
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  load_heads<kRows>({HeadSource<Input>{at.query(s, q), s.q_row_stride, tq, queries},
                     HeadSource<Input>{at.key(s, k), s.k_row_stride, tk, keys},
                     HeadSource<Input>{at.value(s, v), s.v_row_stride, tk, values}});
  __syncthreads();
  const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  const int first_row = 16 * (int(threadIdx.x) / 32);
  Sums<L::kKeyTiles> p;
  strip_scores<kRows>(queries + first_row * kHeadPitch, keys, p);
  const int64_t key_count = sequence_key_count(s, mask, at.b);
  float* statistics = probs && statistics_only ? probs + at.statistics_row(s, 0) : nullptr;
  float* weights = probs && !statistics_only ? probs : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + g + 8 * h;
    const VisibleKeys visible(s, mask, key_count, row);
    float largest = -INFINITY;
#pragma unroll
    for (int j = 0; j < L::kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (visible(8 * j + 2 * quad + e)) largest = fmaxf(largest, p.d[j][2 * h + e]);
    const float shift = quad_max(largest) * scale;
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < L::kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (visible(8 * j + 2 * quad + e))
          total += softmax_weight(p.d[j][2 * h + e], scale, shift, 1.f);
    total = row_sum<4>(total);
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    weights_from_scores(p, h, visible, scale, shift, inverse);
    if (row < tq) {
      if (statistics && quad == 0) {
        statistics[2 * row] = shift;
        statistics[2 * row + 1] = inverse;
      }
      if (weights) {
        float* weights_row = weights + at.weights_row(s, row);
#pragma unroll
        for (int j = 0; j < L::kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * j + 2 * quad + e < tk) weights_row[8 * j + 2 * quad + e] = p.d[j][2 * h + e];
      }
    }
  }
  LeftOperands<L::kKeySteps> rounded_weights;
  rounded_weights.round(p);
  Sums<kHeadTiles> o;  // O = P·V
  o.zero();
  multiply_add_rows(rounded_weights, values, o);
  store_strip(o, first_row, tq, out ? at.output(s, out) : nullptr, s.out_row_stride,
              at.dense_row(s, s.rounded_out, s.query_len), s.heads * kHead);
}

// Block (b, h) of the backward: dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ⊙ (dP − Σ dP·P) · scale,
// dQ = dS·K, dK = dSᵀ·Q; each written (not added) to its first Tq or Tk rows (unless null) and
// rounded to its copy in the same layout where AttentionShape asks for one. The weights P are
// read as the forward stored them, or (kRebuild) rebuilt from Q·Kᵀ and the rows' shift and
// inverse sum the forward stored there instead.
template <int kRows, bool kRebuild, typename Input>
__global__ void __launch_bounds__(kThreads<kRows>)
    backward_in_registers_kernel(AttentionShape s, AttentionMask mask, const Input* q,
                                 const Input* k, const Input* v, const float* probs,
                                 const Input* d_out, float* dq, float* dk, float* dv, float scale) {
  using L = Layout<kRows>;
  TFM_DYNAMIC_SHARED(unsigned char, shared_bytes);
  uint16_t* queries = reinterpret_cast<uint16_t*>(shared_bytes);
  uint16_t* d_outs = queries + L::kHeadMatrix;
  uint16_t* keys = d_outs + L::kHeadMatrix;
  uint16_t* values = keys + L::kHeadMatrix;
  uint16_t* rounded_weights_by_rows = keys;  // P, then dS, over K and V once they are read
  uint16_t* gradients_by_rows = keys + L::kKeyMatrix;
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  const int warp = int(threadIdx.x) / 32, first_row = 16 * warp;
  // [Tq, Tk]; kRebuild: each row's statistics, [Tq, 2]
  const float* stored = probs + (kRebuild ? at.statistics_row(s, 0) : at.weights_row(s, 0));
  float shift[2] = {}, inverse[2] = {};  // kRebuild: the strip's two rows', read with Q, K, V, dO
  if constexpr (kRebuild)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + g + 8 * h;
      if (row < tq) {
        shift[h] = stored[2 * row];
        inverse[h] = stored[2 * row + 1];
      }
    }
  load_heads<kRows>({HeadSource<Input>{at.query(s, q), s.q_row_stride, tq, queries},
                     HeadSource<Input>{at.key(s, k), s.k_row_stride, tk, keys},
                     HeadSource<Input>{at.value(s, v), s.v_row_stride, tk, values},
                     HeadSource<Input>{at.output(s, d_out), s.out_row_stride, tq, d_outs}});
  __syncthreads();
  Sums<L::kKeyTiles> p;
  if constexpr (kRebuild) {
    strip_scores<kRows>(queries + first_row * kHeadPitch, keys, p);
    const int64_t key_count = sequence_key_count(s, mask, at.b);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      weights_from_scores(p, h, VisibleKeys(s, mask, key_count, first_row + g + 8 * h), scale,
                          shift[h], inverse[h]);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + g + 8 * h;
#pragma unroll
      for (int j = 0; j < L::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * quad + e;
          p.d[j][2 * h + e] = row < tq && key < tk ? stored[int64_t(row) * tk + key] : 0.f;
        }
    }
  }
  Sums<L::kKeyTiles> dp;  // dP = dO·Vᵀ, then dS over it
  strip_by_rows_of(d_outs + first_row * kHeadPitch, values, dp);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + g + 8 * h;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < L::kKeyTiles; ++j)
      dot += dp.d[j][2 * h] * p.d[j][2 * h] + dp.d[j][2 * h + 1] * p.d[j][2 * h + 1];
    dot = row_sum<4>(dot);
#pragma unroll
    for (int j = 0; j < L::kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = dp.d[j][2 * h + e];
        x = row < tq && 8 * j + 2 * quad + e < tk ? p.d[j][2 * h + e] * (x - dot) * scale : 0.f;
      }
  }
  LeftOperands<L::kKeySteps> gradients, rounded_weights;  // dS, P in bfloat16
  gradients.round(dp);
  rounded_weights.round(p);
  Sums<kHeadTiles> d;  // dQ = dS·K
  d.zero();
  multiply_add_rows(gradients, keys, d);
  store_strip(d, first_row, tq, dq ? at.query(s, dq) : nullptr, s.q_row_stride,
              s.rounded_dq ? at.query(s, s.rounded_dq) : nullptr, s.q_row_stride);
  __syncthreads();  // every warp's reads of K and V done: P and dS take their place
  rounded_weights.store(rounded_weights_by_rows + first_row * kKeyPitch<kRows>, kKeyPitch<kRows>);
  gradients.store(gradients_by_rows + first_row * kKeyPitch<kRows>, kKeyPitch<kRows>);
  __syncthreads();
  const int first_key = 16 * warp;  // the warp's keys from here on
  d.zero();                         // dV = Pᵀ·dO
  multiply_add_columns<L::kKeySteps>(rounded_weights_by_rows + first_key, kKeyPitch<kRows>, d_outs,
                                     d);
  store_strip(d, first_key, tk, dv ? at.value(s, dv) : nullptr, s.v_row_stride,
              s.rounded_dv ? at.value(s, s.rounded_dv) : nullptr, s.v_row_stride);
  d.zero();  // dK = dSᵀ·Q
  multiply_add_columns<L::kKeySteps>(gradients_by_rows + first_key, kKeyPitch<kRows>, queries, d);
  store_strip(d, first_key, tk, dk ? at.key(s, dk) : nullptr, s.k_row_stride,
              s.rounded_dk ? at.key(s, s.rounded_dk) : nullptr, s.k_row_stride);
}

// --- Longer sequences: tiles of 64 queries and 64 keys ---
// Beyond 128 queries or keys a block cannot hold a head; the same warps' products then run over
// tiles of 64 keys in turn (FlashAttention's scheme): the forward takes a block per 64 queries of
// a (sequence, head), the backward a block per (sequence, head), and neither stores more than the
// rows' statistics (or the weights where asked for them). Shared memory: tiles of 64 rows.
constexpr int kTile = 64;
using TileLayout = Layout<kTile>;
constexpr int kTileThreads = kThreads<kTile>;

// The key tiles [*first, *last) that query rows [first_row, end_row) of sequence b see: the union
// of their visible ranges, which the masks (causal, window, lengths) make monotone in the row, so
// that the first row's start and the last row's end bound it. None where the rows see no key.
__device__ __forceinline__ void key_tiles_seen(const AttentionMask& mask, int64_t key_count,
                                               int first_row, int end_row, int* first, int* last) {
  int64_t begin = 0, end = 0, unused = 0;
  visible_keys(mask, key_count, first_row + mask.query_offset, &begin, &unused);
  visible_keys(mask, key_count, end_row - 1 + mask.query_offset, &unused, &end);
  *first = int(begin / kTile);
  *last = end > begin ? int((end + kTile - 1) / kTile) : *first;
}

// The rows of a tile from `first` on among `count`: 64, or fewer in the last tile.
__device__ __forceinline__ int rows_of_tile(int count, int first) {
  return count - first < kTile ? count - first : kTile;
}

// Block (b, h, query tile t): rows 64 t.. of attention_forward, as forward_in_registers_kernel's
// rows, over the keys' tiles in two passes: the first finds each row's largest score and the sum
// of its exponentials (rescaled as the largest grows), the second makes the weights from those
// (the ones the backward rebuilds) and sums O = P·V. The weights, where stored, for every key.
template <typename Input>
__global__ void __launch_bounds__(kTileThreads)
    forward_tiled_kernel(AttentionShape s, AttentionMask mask, const Input* q, const Input* k,
                         const Input* v, float* probs, float* out, float scale,
                         bool statistics_only, int query_tiles) {
  TFM_DYNAMIC_SHARED(unsigned char, shared_bytes);
  uint16_t* queries = reinterpret_cast<uint16_t*>(shared_bytes);
  uint16_t* keys = queries + TileLayout::kHeadMatrix;
  uint16_t* values = keys + TileLayout::kHeadMatrix;
  const int64_t head = blockIdx.x / query_tiles, b = head / s.heads, h = head % s.heads;
  const int tq = int(s.query_len), tk = int(s.key_len);
  const int first_query = kTile * int(blockIdx.x % query_tiles);
  const int queries_here = rows_of_tile(tq, first_query);
  const int64_t key_stride = sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride);
  const int64_t value_stride = sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride);
  const Input* q_tile = q + (b * s.query_len + first_query) * s.q_row_stride + h * kHead;
  const Input* k_first = k + b * key_stride + h * kHead;
  const Input* v_first = v + b * value_stride + h * kHead;
  const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  const int first_row = 16 * (int(threadIdx.x) / 32);  // of the tile
  const int64_t key_count = sequence_key_count(s, mask, b);
  float* weights = probs && !statistics_only ? probs : nullptr;
  float* statistics = probs && statistics_only ? probs + head * s.query_len * 2 : nullptr;
  int first_tile = 0, last_tile = (tk + kTile - 1) / kTile;  // every key where weights are stored
  if (!weights)
    key_tiles_seen(mask, key_count, first_query, first_query + queries_here, &first_tile,
                   &last_tile);
  const VisibleKeys visible[2] = {VisibleKeys(s, mask, key_count, first_query + first_row + g),
                                  VisibleKeys(s, mask, key_count, first_query + first_row + g + 8)};
  load_heads<kTile>({HeadSource<Input>{q_tile, s.q_row_stride, queries_here, queries}});
  float shift[2] = {-INFINITY, -INFINITY}, total[2] = {0.f, 0.f};
  for (int tile = first_tile; tile < last_tile; ++tile) {  // the largest score, Σ exp
    const int first_key = kTile * tile, keys_here = rows_of_tile(tk, first_key);
    __syncthreads();  // the previous tile's products are done with its keys
    load_heads<kTile>(
        {HeadSource<Input>{k_first + first_key * s.k_row_stride, s.k_row_stride, keys_here, keys}});
    __syncthreads();
    Sums<TileLayout::kKeyTiles> p;
    strip_scores<kTile>(queries + first_row * kHeadPitch, keys, p);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float largest = -INFINITY;
#pragma unroll
      for (int j = 0; j < TileLayout::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (visible[half](first_key + 8 * j + 2 * quad + e))
            largest = fmaxf(largest, p.d[j][2 * half + e]);
      const float grown = fmaxf(shift[half], quad_max(largest) * scale);
      float sum = 0.f;  // nothing visible yet where grown is -inf
#pragma unroll
      for (int j = 0; j < TileLayout::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (visible[half](first_key + 8 * j + 2 * quad + e))
            sum += softmax_weight(p.d[j][2 * half + e], scale, grown, 1.f);
      sum = row_sum<4>(sum);
      if (grown != -INFINITY) {
        total[half] = total[half] * expf(shift[half] - grown) + sum;
        shift[half] = grown;
      }
    }
  }
  const float inverse[2] = {total[0] > 0.f ? 1.f / total[0] : 0.f,
                            total[1] > 0.f ? 1.f / total[1] : 0.f};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first_query + first_row + g + 8 * half;
    if (statistics && quad == 0 && row < tq) {
      statistics[2 * row] = shift[half];
      statistics[2 * row + 1] = inverse[half];
    }
  }
  Sums<kHeadTiles> o;  // O = P·V, tile by tile
  o.zero();
  for (int tile = first_tile; tile < last_tile; ++tile) {
    const int first_key = kTile * tile, keys_here = rows_of_tile(tk, first_key);
    __syncthreads();
    load_heads<kTile>(
        {HeadSource<Input>{k_first + first_key * s.k_row_stride, s.k_row_stride, keys_here, keys},
         HeadSource<Input>{v_first + first_key * s.v_row_stride, s.v_row_stride, keys_here,
                           values}});
    __syncthreads();
    Sums<TileLayout::kKeyTiles> p;
    strip_scores<kTile>(queries + first_row * kHeadPitch, keys, p);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      weights_from_scores(p, half, visible[half], scale, shift[half], inverse[half], first_key);
      const int row = first_query + first_row + g + 8 * half;
      if (weights && row < tq) {
        float* weights_row = weights + (head * s.query_len + row) * s.key_len;
#pragma unroll
        for (int j = 0; j < TileLayout::kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = first_key + 8 * j + 2 * quad + e;
            if (key < tk) weights_row[key] = p.d[j][2 * half + e];
          }
      }
    }
    LeftOperands<TileLayout::kKeySteps> rounded_weights;
    rounded_weights.round(p);
    multiply_add_rows(rounded_weights, values, o);
  }
  store_strip(o, first_row, queries_here,
              out ? out + (b * s.query_len + first_query) * s.out_row_stride + h * kHead : nullptr,
              s.out_row_stride,
              s.rounded_out
                  ? s.rounded_out + ((b * s.query_len + first_query) * s.heads + h) * kHead
                  : nullptr,
              s.heads * kHead);
}

// What the tiled backward's block holds in shared memory: tiles of Q, dO, K, V, P and dS, and each
// query row's Σ dP·P ([Tq] floats).
constexpr size_t kTiledBackwardTileBytes = sizeof(uint16_t) * 6 * TileLayout::kHeadMatrix;
size_t tiled_backward_bytes(int64_t query_len) {
  return kTiledBackwardTileBytes + sizeof(float) * size_t(query_len);
}

// A thread's two rows' shift and inverse sum as the forward stored them ([Tq, 2] at `stored`),
// zero for rows past Tq.
struct RowStatistics {
  float shift[2] = {0.f, 0.f}, inverse[2] = {0.f, 0.f};
  __device__ RowStatistics(const float* stored, const int (&row)[2], int tq) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row[half] < tq) {
        shift[half] = stored[2 * row[half]];
        inverse[half] = stored[2 * row[half] + 1];
      }
  }
};

// A strip's weights of keys first_key.. (a tile): rebuilt from Q·Kᵀ (queries, keys: the tiles in
// shared memory) and its rows' statistics, or read as the forward stored them.
template <bool kRebuild>
__device__ __forceinline__ void tile_weights(const AttentionShape& s, const float* stored,
                                             const RowStatistics& statistics, const uint16_t* strip,
                                             const uint16_t* keys, const VisibleKeys (&visible)[2],
                                             const int (&row)[2], float scale, int first_key,
                                             Sums<TileLayout::kKeyTiles>& p) {
  const int quad = threadIdx.x % 4;
  const int tq = int(s.query_len), tk = int(s.key_len);
  if constexpr (kRebuild) {
    strip_scores<kTile>(strip, keys, p);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      weights_from_scores(p, half, visible[half], scale, statistics.shift[half],
                          statistics.inverse[half], first_key);
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < TileLayout::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = first_key + 8 * j + 2 * quad + e;
          p.d[j][2 * half + e] =
              row[half] < tq && key < tk ? stored[int64_t(row[half]) * tk + key] : 0.f;
        }
  }
}

// dS = P ⊙ (dP − dot) · scale over dp, in place: zero past Tq rows and Tk keys.
__device__ __forceinline__ void score_gradients(const Sums<TileLayout::kKeyTiles>& p,
                                                const float (&dot)[2], const int (&row)[2],
                                                int first_key, int tq, int tk, float scale,
                                                Sums<TileLayout::kKeyTiles>& dp) {
  const int quad = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < TileLayout::kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = dp.d[j][2 * half + e];
        x = row[half] < tq && first_key + 8 * j + 2 * quad + e < tk
                ? p.d[j][2 * half + e] * (x - dot[half]) * scale
                : 0.f;
      }
}

// Block (b, h) of attention_backward over tiles: for each tile of queries, each row's Σ dP·P over
// the key tiles it sees, then dQ = dS·K over them again; then for each tile of keys, dV = Pᵀ·dO
// and dK = dSᵀ·Q summed over the query tiles that see it, P and dS of each stored in bfloat16 in
// shared memory so that each warp can take 16 keys (as backward_in_registers_kernel's second
// half). P rebuilt (kRebuild) or read, as there.
template <bool kRebuild, typename Input>
__global__ void __launch_bounds__(kTileThreads)
    backward_tiled_kernel(AttentionShape s, AttentionMask mask, const Input* q, const Input* k,
                          const Input* v, const float* probs, const Input* d_out, float* dq,
                          float* dk, float* dv, float scale) {
  TFM_DYNAMIC_SHARED(unsigned char, shared_bytes);
  uint16_t* queries = reinterpret_cast<uint16_t*>(shared_bytes);
  uint16_t* d_outs = queries + TileLayout::kHeadMatrix;
  uint16_t* keys = d_outs + TileLayout::kHeadMatrix;
  uint16_t* values = keys + TileLayout::kHeadMatrix;
  uint16_t* rounded_weights_by_rows = values + TileLayout::kHeadMatrix;  // P, [64 q, 64 keys]
  uint16_t* gradients_by_rows = rounded_weights_by_rows + TileLayout::kHeadMatrix;      // dS
  float* dots = reinterpret_cast<float*>(gradients_by_rows + TileLayout::kHeadMatrix);  // [Tq]
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  const int query_tiles = (tq + kTile - 1) / kTile, key_tiles = (tk + kTile - 1) / kTile;
  const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  const int warp = int(threadIdx.x) / 32, first_row = 16 * warp;
  // [Tq, Tk]; kRebuild: each row's statistics, [Tq, 2]
  const float* stored = probs + (kRebuild ? at.statistics_row(s, 0) : at.weights_row(s, 0));
  const int64_t key_count = sequence_key_count(s, mask, at.b);
  const Input* q_first = at.query(s, q);
  const Input* k_first = at.key(s, k);
  const Input* v_first = at.value(s, v);
  const Input* d_out_first = at.output(s, d_out);
  const auto load_queries = [&](int first_query, int queries_here) {
    load_heads<kTile>({HeadSource<Input>{q_first + first_query * s.q_row_stride, s.q_row_stride,
                                         queries_here, queries},
                       HeadSource<Input>{d_out_first + first_query * s.out_row_stride,
                                         s.out_row_stride, queries_here, d_outs}});
  };
  const auto load_keys = [&](int first_key, int keys_here) {
    load_heads<kTile>(
        {HeadSource<Input>{k_first + first_key * s.k_row_stride, s.k_row_stride, keys_here, keys},
         HeadSource<Input>{v_first + first_key * s.v_row_stride, s.v_row_stride, keys_here,
                           values}});
  };
  // dQ: a query tile at a time.
  for (int query_tile = 0; query_tile < query_tiles; ++query_tile) {
    const int first_query = kTile * query_tile, queries_here = rows_of_tile(tq, first_query);
    const int row[2] = {first_query + first_row + g, first_query + first_row + g + 8};
    const VisibleKeys visible[2] = {VisibleKeys(s, mask, key_count, row[0]),
                                    VisibleKeys(s, mask, key_count, row[1])};
    const RowStatistics statistics(kRebuild ? stored : nullptr, row, kRebuild ? tq : 0);
    int first_tile, last_tile;
    key_tiles_seen(mask, key_count, first_query, first_query + queries_here, &first_tile,
                   &last_tile);
    __syncthreads();  // the last tile's products are done with Q and dO
    load_queries(first_query, queries_here);
    float dot[2] = {0.f, 0.f};
    for (int tile = first_tile; tile < last_tile; ++tile) {  // Σ dP·P
      const int first_key = kTile * tile;
      __syncthreads();
      load_keys(first_key, rows_of_tile(tk, first_key));
      __syncthreads();
      Sums<TileLayout::kKeyTiles> p, dp;
      tile_weights<kRebuild>(s, stored, statistics, queries + first_row * kHeadPitch, keys, visible,
                             row, scale, first_key, p);
      strip_by_rows_of(d_outs + first_row * kHeadPitch, values, dp);
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < TileLayout::kKeyTiles; ++j)
          dot[half] +=
              dp.d[j][2 * half] * p.d[j][2 * half] + dp.d[j][2 * half + 1] * p.d[j][2 * half + 1];
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      dot[half] = row_sum<4>(dot[half]);
      if (quad == 0 && row[half] < tq) dots[row[half]] = dot[half];
    }
    Sums<kHeadTiles> d;  // dQ = dS·K
    d.zero();
    for (int tile = first_tile; tile < last_tile; ++tile) {
      const int first_key = kTile * tile;
      __syncthreads();
      load_keys(first_key, rows_of_tile(tk, first_key));
      __syncthreads();
      Sums<TileLayout::kKeyTiles> p, dp;
      tile_weights<kRebuild>(s, stored, statistics, queries + first_row * kHeadPitch, keys, visible,
                             row, scale, first_key, p);
      strip_by_rows_of(d_outs + first_row * kHeadPitch, values, dp);
      score_gradients(p, dot, row, first_key, tq, tk, scale, dp);
      LeftOperands<TileLayout::kKeySteps> gradients;
      gradients.round(dp);
      multiply_add_rows(gradients, keys, d);
    }
    store_strip(d, first_row, queries_here,
                dq ? at.query(s, dq) + first_query * s.q_row_stride : nullptr, s.q_row_stride,
                s.rounded_dq ? at.query(s, s.rounded_dq) + first_query * s.q_row_stride : nullptr,
                s.q_row_stride);
  }
  // dK and dV: a key tile at a time, over the query tiles that see it.
  const int first_key_of_warp = 16 * warp;  // of the tile
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int first_key = kTile * key_tile, keys_here = rows_of_tile(tk, first_key);
    __syncthreads();  // the last products are done with K and V (and the dots are written)
    load_keys(first_key, keys_here);
    Sums<kHeadTiles> d_values, d_keys;
    d_values.zero();
    d_keys.zero();
    for (int query_tile = 0; query_tile < query_tiles; ++query_tile) {
      const int first_query = kTile * query_tile, queries_here = rows_of_tile(tq, first_query);
      int first_tile, last_tile;
      key_tiles_seen(mask, key_count, first_query, first_query + queries_here, &first_tile,
                     &last_tile);
      if (key_tile < first_tile || key_tile >= last_tile) continue;  // the whole block alike
      const int row[2] = {first_query + first_row + g, first_query + first_row + g + 8};
      const VisibleKeys visible[2] = {VisibleKeys(s, mask, key_count, row[0]),
                                      VisibleKeys(s, mask, key_count, row[1])};
      const RowStatistics statistics(kRebuild ? stored : nullptr, row, kRebuild ? tq : 0);
      __syncthreads();  // the last query tile's products are done with Q, dO, P and dS
      load_queries(first_query, queries_here);
      __syncthreads();
      Sums<TileLayout::kKeyTiles> p, dp;
      tile_weights<kRebuild>(s, stored, statistics, queries + first_row * kHeadPitch, keys, visible,
                             row, scale, first_key, p);
      strip_by_rows_of(d_outs + first_row * kHeadPitch, values, dp);
      const float dot[2] = {row[0] < tq ? dots[row[0]] : 0.f, row[1] < tq ? dots[row[1]] : 0.f};
      score_gradients(p, dot, row, first_key, tq, tk, scale, dp);
      LeftOperands<TileLayout::kKeySteps> rounded_weights, gradients;
      rounded_weights.round(p);
      gradients.round(dp);
      rounded_weights.store(rounded_weights_by_rows + first_row * kHeadPitch, kHeadPitch);
      gradients.store(gradients_by_rows + first_row * kHeadPitch, kHeadPitch);
      __syncthreads();
      multiply_add_columns<TileLayout::kKeySteps>(rounded_weights_by_rows + first_key_of_warp,
                                                  kHeadPitch, d_outs, d_values);
      multiply_add_columns<TileLayout::kKeySteps>(gradients_by_rows + first_key_of_warp, kHeadPitch,
                                                  queries, d_keys);
    }
    store_strip(d_values, first_key_of_warp, keys_here,
                dv ? at.value(s, dv) + first_key * s.v_row_stride : nullptr, s.v_row_stride,
                s.rounded_dv ? at.value(s, s.rounded_dv) + first_key * s.v_row_stride : nullptr,
                s.v_row_stride);
    store_strip(d_keys, first_key_of_warp, keys_here,
                dk ? at.key(s, dk) + first_key * s.k_row_stride : nullptr, s.k_row_stride,
                s.rounded_dk ? at.key(s, s.rounded_dk) + first_key * s.k_row_stride : nullptr,
                s.k_row_stride);
  }
}

}  // namespace

#ifndef TFM_EMULATED_KERNELS_ONLY  // tests/attention_in_registers_emulated.cpp: the kernels alone
namespace {

// Launches `kernel` in `blocks` blocks of `threads` with `bytes` of dynamic shared memory (beyond
// the default 48 KB, as the device allows it once asked).
template <typename Kernel, typename... Arguments>
void launch_blocks(const Context& c, int64_t blocks, int threads, Kernel kernel, size_t bytes,
                   Arguments... arguments) {
  TFM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  launch_kernel(kernel, unsigned(blocks), threads, bytes, c.stream, arguments...);
}
// The same in a block per (sequence, head) of kThreads<kRows>.
template <int kRows, typename Kernel, typename... Arguments>
void launch_heads(const Context& c, const AttentionShape& s, Kernel kernel, size_t bytes,
                  Arguments... arguments) {
  launch_blocks(c, s.batch * s.heads, kThreads<kRows>, kernel, bytes, arguments...);
}

}  // namespace

size_t attention_in_registers_tile_bytes(int64_t query_len) {
  return std::max(TileLayout::kForwardBytes, tiled_backward_bytes(query_len));
}

bool attention_in_registers_enabled() {
  static const bool enabled = !turned_off("TFM_CUDA_ATTENTION_IN_REGISTERS");
  return enabled;
}

void attention_in_registers_forward(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const float* q, const float* k,
                                    const float* v, float* probs, float* out, float scale,
                                    bool statistics_only) {
  const auto launch = [&](const auto* q_in, const auto* k_in, const auto* v_in) {
    using Input = std::remove_cv_t<std::remove_pointer_t<decltype(q_in)>>;
    const bool whole = with_block_rows(s, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      launch_heads<kRows>(c, s, forward_in_registers_kernel<kRows, Input>,
                          Layout<kRows>::kForwardBytes, s, mask, q_in, k_in, v_in, probs, out,
                          scale, statistics_only);
    });
    if (!whole) {
      const int query_tiles = int((s.query_len + kTile - 1) / kTile);
      launch_blocks(c, s.batch * s.heads * query_tiles, kTileThreads, forward_tiled_kernel<Input>,
                    TileLayout::kForwardBytes, s, mask, q_in, k_in, v_in, probs, out, scale,
                    statistics_only, query_tiles);
    }
  };
  if (s.rounded_q)
    launch(s.rounded_q, s.rounded_k, s.rounded_v);
  else
    launch(q, k, v);
  check_launch("attention_forward (in registers)");
}

void attention_in_registers_backward(const Context& c, const AttentionShape& s,
                                     const AttentionMask& mask, const float* q, const float* k,
                                     const float* v, const float* probs, const float* d_out,
                                     float* dq, float* dk, float* dv, float scale,
                                     bool rebuild_weights) {
  const auto launch = [&](const auto* q_in, const auto* k_in, const auto* v_in,
                          const auto* d_out_in) {
    using Input = std::remove_cv_t<std::remove_pointer_t<decltype(q_in)>>;
    const bool whole = with_block_rows(s, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const auto with = [&](auto kernel) {
        launch_heads<kRows>(c, s, kernel, Layout<kRows>::kBackwardBytes, s, mask, q_in, k_in, v_in,
                            probs, d_out_in, dq, dk, dv, scale);
      };
      if (rebuild_weights)
        with(backward_in_registers_kernel<kRows, true, Input>);
      else
        with(backward_in_registers_kernel<kRows, false, Input>);
    });
    if (whole) return;
    const auto tiled = [&](auto kernel) {
      launch_blocks(c, s.batch * s.heads, kTileThreads, kernel, tiled_backward_bytes(s.query_len),
                    s, mask, q_in, k_in, v_in, probs, d_out_in, dq, dk, dv, scale);
    };
    if (rebuild_weights)
      tiled(backward_tiled_kernel<true, Input>);
    else
      tiled(backward_tiled_kernel<false, Input>);
  };
  if (s.rounded_q)
    launch(s.rounded_q, s.rounded_k, s.rounded_v, s.rounded_d_out);
  else
    launch(q, k, v, d_out);
  check_launch("attention_backward (in registers)");
}

#endif  // TFM_EMULATED_KERNELS_ONLY

}  // namespace cuda
}  // namespace tfm
