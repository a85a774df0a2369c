// Training's attention in bfloat16 on tensor cores, for at most 128 queries and keys with heads
// of 64 (the base and big models' training batches, and the longer sentences of real corpora): a
// block per (sequence, head), as attention_short.cu's float32 forward, whose every product (S =
// Q·Kᵀ and O = P·V; in the backward dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K and dK = dSᵀ·Q) is 16 × 16
// WMMA tiles of bfloat16 operands summed in float32, the block's warps taking the tiles in
// turn. Blocks come in two sizes, for up to 64 rows (45 KB of shared memory) and up to 128
// (136 KB forward, 152 KB backward: where the device lends a block that much). The operands are
// rounded to bfloat16 (nearest even) as they are loaded, as PyTorch's autocast rounds them; Q, K
// and V may come in bfloat16 instead (AttentionShape::rounded_q: a training step's projections
// then write them so alone, half the bytes of a base-model batch's 157 MB of float Q|K|V to write
// and to read), and the backward's dO with them (W_o's input-gradient product writes it so). The
// softmax and its backward stay in float32, and the backward reads the weights as the forward
// stored them (float32), or, where they are kept for it alone (AttentionShape::
// weights_for_backward_only: a training step), rebuilds them to the bit from Q·Kᵀ and each row's
// shift and inverse sum, which is all the forward then stores: 52 MB less written and read twice
// a call for a base-model batch. It serves the calls whose AttentionShape::products is kBFloat16
// (training in bfloat16) where block_per_head_applies; TFM_CUDA_TENSOR_CORE_ATTENTION=0 turns it
// off (and the whole-matrix path's TF32 products), to compare or to rule them out. Its calls go to
// attention_in_registers.cu's kernels (the same blocks with each product's result kept in the
// registers of the warp that computed it) unless TFM_CUDA_ATTENTION_IN_REGISTERS=0.
#include <cuda_bf16.h>
#include <mma.h>  // (tests/warp_emulation.h brings its own nvcuda::wmma)

#include <algorithm>
#include <type_traits>

#include "backend/cuda/attention_common.h"
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kHead = 64;  // the head size

// The threads of a block of kLen rows: 8 warps for 64 rows (four blocks an SM), 16 for 128,
// whose shared memory leaves one block an SM (with 8 warps the 128-row blocks were no faster
// than the float32 kernels with TF32 products on an H200: 0.984 at 127 tokens). The warps take
// the same tiles and rows in turn either way, so the results do not depend on it.
template <int kLen>
constexpr int kBlockThreads = kLen == 128 ? 512 : 256;
// The forward's 64-row blocks an SM the registers must leave room for: four (64 registers a
// thread; its shared memory allows five); the compiler's own choice for Q, K and V in flight at
// once was 70 registers, three blocks. The backward's (80 registers: three blocks) spilled when
// held to four; the 128-row blocks are one an SM either way (shared memory).
template <int kLen>
constexpr int kForwardBlocksAnSm = kLen == 64 ? 4 : 1;

// The shared matrices of a block that takes up to kLen queries and keys (64 or 128), rows padded
// by 16 bytes (WMMA's row strides are multiples of 8 bfloat16 or 4 floats; the padding also
// spreads a column's reads over the banks): bfloat16 matrices of a head's width (Q, K, V, dO)
// and of the keys' (P, dS), and the float matrix a product writes (S, dP, then O, dV, dQ, dK).
template <int kLen>
struct Tiles {
  static constexpr int kPitchHead = kHead + 8;
  static constexpr int kPitchLen = kLen + 8;
  static constexpr int kPitchResult = kLen + 4;
  static constexpr int kHeadMatrix = kLen * kPitchHead;  // elements
  static constexpr int kLenMatrix = kLen * kPitchLen;
  static constexpr int kResultMatrix = kLen * kPitchResult;
  // Bytes: the forward holds Q (then P), K, V and the result; the backward P (then K), dO (then
  // Q), V (then dS) and the result. Every part a multiple of 32 bytes, as WMMA's pointers must be.
  static constexpr size_t kForwardBytes =
      sizeof(uint16_t) * (kLenMatrix + 2 * kHeadMatrix) + sizeof(float) * kResultMatrix;
  static constexpr size_t kBackwardBytes =
      sizeof(uint16_t) * (2 * kLenMatrix + kHeadMatrix) + sizeof(float) * kResultMatrix;
  // The backward that rebuilds the weights (AttentionShape::weights_for_backward_only) holds
  // the same matrices (Q, K over dO's, V's places first) and each row's shift and inverse sum.
  static constexpr size_t kRebuildingBackwardBytes = kBackwardBytes + sizeof(float) * 2 * kLen;
  static_assert(kLen % 32 == 0 && kHeadMatrix * sizeof(uint16_t) % 32 == 0 &&
                    kLenMatrix * sizeof(uint16_t) % 32 == 0,
                "WMMA pointers must stay 32-byte aligned");
};

namespace wmma = nvcuda::wmma;

// C (float, shared, rows ldc apart) = A·B, an kM × kN result over an inner kK (multiples of 16),
// A and B bfloat16 in shared memory with rows lda and ldb elements apart, each read as its
// layout says: wmma::row_major, element (i, k) at i · lda + k; wmma::col_major, at k · lda + i
// (a transposed operand read in place). The warps take the 16 × 16 output tiles in turn.
template <int kM, int kN, int kK, typename ALayout, typename BLayout, int kThreads>
__device__ __forceinline__ void product(const uint16_t* a, int lda, const uint16_t* b, int ldb,
                                        float* c, int ldc) {
  constexpr bool a_by_rows = std::is_same_v<ALayout, wmma::row_major>;
  constexpr bool b_by_rows = std::is_same_v<BLayout, wmma::row_major>;
  constexpr int kTileColumns = kN / 16, kTiles = (kM / 16) * kTileColumns;
  const auto* a16 = reinterpret_cast<const __nv_bfloat16*>(a);
  const auto* b16 = reinterpret_cast<const __nv_bfloat16*>(b);
  for (int tile = threadIdx.x / 32; tile < kTiles; tile += kThreads / 32) {
    const int row = tile / kTileColumns, col = tile % kTileColumns;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> sum;
    wmma::fill_fragment(sum, 0.f);
#pragma unroll
    for (int k = 0; k < kK / 16; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, ALayout> left;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> right;
      wmma::load_matrix_sync(
          left, a16 + (a_by_rows ? row * 16 * lda + k * 16 : k * 16 * lda + row * 16), lda);
      wmma::load_matrix_sync(
          right, b16 + (b_by_rows ? k * 16 * ldb + col * 16 : col * 16 * ldb + k * 16), ldb);
      wmma::mma_sync(sum, left, right, sum);
    }
    wmma::store_matrix_sync(c + row * 16 * ldc + col * 16, sum, ldc, wmma::mem_row_major);
  }
}

// S = Q·Kᵀ (float, shared, Tiles<kLen>'s result pitch) from Q and K (bfloat16, shared, its head
// pitch): the one product of the forward's scores and of the backward that rebuilds the weights
// from them, so that both sum alike, to the bit.
template <int kLen, int kThreads>
__device__ __forceinline__ void scores(const uint16_t* queries, const uint16_t* keys,
                                       float* result) {
  using T = Tiles<kLen>;
  product<kLen, kLen, kHead, wmma::row_major, wmma::col_major, kThreads>(
      queries, T::kPitchHead, keys, T::kPitchHead, result, T::kPitchResult);
}

// The first `rows` rows of a head's width of C (shared, rows `pitch` apart) to rows of `first`
// row_stride apart (null: not there), and, where `rounded` is given, rounded to bfloat16 to its
// rows rounded_stride apart.
template <int kThreads>
__device__ __forceinline__ void store_rows(const float* c, int pitch, int rows, float* first,
                                           int64_t row_stride, uint16_t* rounded,
                                           int64_t rounded_stride) {
  for (int i = threadIdx.x; i < rows * kHead; i += kThreads) {
    const int r = i / kHead, col = i % kHead;
    const float x = c[r * pitch + col];
    if (first) first[r * row_stride + col] = x;
    if (rounded) rounded[r * rounded_stride + col] = to_bfloat16(x);
  }
}

// Block (b, h): S = Q·Kᵀ, P = the masked softmax of S · scale (masked_softmax_kernel's formula),
// stored into probs when given (statistics_only: each row's shift and inverse sum instead, from
// which the backward rebuilds P), O = P·V into out (unless null: its rounded copy alone) and its
// rounded copy where asked. Q, K and V in float (Input float), rounded as they are loaded, or in
// bfloat16 already (Input uint16_t): the same shared matrices either way.
template <int kLen, typename Input>
__global__ void __launch_bounds__(kBlockThreads<kLen>, kForwardBlocksAnSm<kLen>)
    tensor_core_forward_kernel(AttentionShape s, AttentionMask mask, const Input* q, const Input* k,
                               const Input* v, float* probs, float* out, float scale,
                               bool statistics_only) {
  using T = Tiles<kLen>;
  constexpr int kThreads = kBlockThreads<kLen>;
  TFM_DYNAMIC_SHARED_ALIGNED(unsigned char, shared_bytes, 32);
  uint16_t* queries = reinterpret_cast<uint16_t*>(shared_bytes);      // Q, then the weights P
  uint16_t* keys = queries + T::kLenMatrix;                           // K
  uint16_t* values = keys + T::kHeadMatrix;                           // V
  float* result = reinterpret_cast<float*>(values + T::kHeadMatrix);  // S, then O
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  {
    HeldRows<kLen, kHead, kThreads, Input> held_q, held_k, held_v;  // every load, then stores
    held_q.fetch(at.query(s, q), s.q_row_stride, tq, kHead);
    held_k.fetch(at.key(s, k), s.k_row_stride, tk, kHead);
    held_v.fetch(at.value(s, v), s.v_row_stride, tk, kHead);
    held_q.store(queries, T::kPitchHead);
    held_k.store(keys, T::kPitchHead);
    held_v.store(values, T::kPitchHead);
  }
  __syncthreads();
  scores<kLen, kThreads>(queries, keys, result);
  __syncthreads();
  // The weights into probs, or (statistics_only) each row's shift and inverse sum: [Tq, 2].
  float* weights = probs && !statistics_only ? probs : nullptr;
  float* statistics = probs && statistics_only ? probs + at.statistics_row(s, 0) : nullptr;
  softmax_block_rows<kLen>(
      s, mask, at.b, result, T::kPitchResult, scale,
      [&](int t, int j, float w) {
        queries[t * T::kPitchLen + j] = to_bfloat16(w);  // P over Q
        if (weights && t < tq && j < tk) weights[at.weights_row(s, t) + j] = w;
      },
      [&](int t, float shift, float inverse) {
        if (statistics) {
          statistics[2 * t] = shift;
          statistics[2 * t + 1] = inverse;
        }
      });
  __syncthreads();
  product<kLen, kHead, kLen, wmma::row_major, wmma::row_major, kThreads>(
      queries, T::kPitchLen, values, T::kPitchHead, result, T::kPitchResult);  // O = P·V
  __syncthreads();
  store_rows<kThreads>(result, T::kPitchResult, tq, out ? at.output(s, out) : nullptr,
                       s.out_row_stride, at.dense_row(s, s.rounded_out, s.query_len),
                       s.heads * kHead);
}

// dS = P ⊙ (dP − Σ dP·P) · scale (softmax_backward_kernel's formula, in float32) into ds (shared,
// rows ds_pitch apart), rounded to bfloat16, zero past Tq rows and Tk keys: from the float weights
// P a thread holds, four of a row, and dP (shared, rows dp_pitch apart), the row's sum over the
// lanes that hold it.
template <int kLen, int kThreads>
__device__ __forceinline__ void softmax_gradient(const HeldRows<kLen, kLen, kThreads>& held_p,
                                                 const float* dp, int dp_pitch, int tq, int tk,
                                                 float scale, uint16_t* ds, int ds_pitch) {
#pragma unroll
  for (int n = 0; n < held_p.kWords; ++n) {
    const int t = held_p.row(n), j = held_p.column(n);
    const float4 p = held_p.x[n];
    const float4 g = *reinterpret_cast<const float4*>(dp + t * dp_pitch + j);
    const float dot = row_sum<kLen / 4>(g.x * p.x + g.y * p.y + g.z * p.z + g.w * p.w);
    const auto one = [&](float p_j, float g_j, int at_j) -> uint16_t {
      return t < tq && at_j < tk ? to_bfloat16(p_j * (g_j - dot) * scale) : 0;
    };
    *reinterpret_cast<uint2*>(ds + t * ds_pitch + j) = pack_16_bits(
        one(p.x, g.x, j), one(p.y, g.y, j + 1), one(p.z, g.z, j + 2), one(p.w, g.w, j + 3));
  }
}

// The weights P of the thread's words of a kLen × kLen matrix rebuilt from the scores S (shared,
// rows `pitch` apart, Q·Kᵀ as the forward's product made them) and each row's shift and inverse
// sum (shared, [kLen, 2]) as the forward's softmax_block_rows: the same bits, zero outside a row's
// visible keys and past Tq rows.
template <int kLen, int kThreads>
__device__ __forceinline__ void rebuild_weights(const AttentionShape& s, const AttentionMask& mask,
                                                int64_t b, const float* scores, int pitch,
                                                const float* row_statistics, float scale,
                                                HeldRows<kLen, kLen, kThreads>& held_p) {
  const int64_t key_count = sequence_key_count(s, mask, b);
#pragma unroll
  for (int n = 0; n < held_p.kWords; ++n) {
    const int t = held_p.row(n), j = held_p.column(n);
    int64_t begin = 0, end = 0;  // no query: no key
    if (t < s.query_len) visible_keys(mask, key_count, t + mask.query_offset, &begin, &end);
    const float shift = row_statistics[2 * t], inverse = row_statistics[2 * t + 1];
    const float4 score = *reinterpret_cast<const float4*>(scores + t * pitch + j);
    const auto one = [&](float score_j, int at_j) {
      return at_j >= begin && at_j < end ? softmax_weight(score_j, scale, shift, inverse) : 0.f;
    };
    held_p.x[n] =
        make_float4(one(score.x, j), one(score.y, j + 1), one(score.z, j + 2), one(score.w, j + 3));
  }
}

// Block (b, h) of the backward: dV = Pᵀ·dO, dP = dO·Vᵀ, dS (softmax_gradient), dQ = dS·K,
// dK = dSᵀ·Q; each written (not added) to its first Tq or Tk rows (unless null), and rounded to
// its copy in the same layout where AttentionShape asks for one. The weights P come from probs as
// the forward stored them, or (kRebuild) are rebuilt from S = Q·Kᵀ and the rows' shift and inverse
// sum the forward stored there instead (rebuild_weights): Q and K are then read twice (the second
// time mostly from the L2 cache) and the weights not at all. Q, K, V and dO as the forward's
// Input (in bfloat16: AttentionShape::rounded_q and rounded_d_out).
template <int kLen, bool kRebuild, typename Input>
__global__ void __launch_bounds__(kBlockThreads<kLen>, kLen == 64 ? 3 : 1)
    tensor_core_backward_kernel(AttentionShape s, AttentionMask mask, const Input* q,
                                const Input* k, const Input* v, const float* probs,
                                const Input* d_out, float* dq, float* dk, float* dv, float scale) {
  using T = Tiles<kLen>;
  constexpr int kThreads = kBlockThreads<kLen>;
  TFM_DYNAMIC_SHARED_ALIGNED(unsigned char, shared_bytes, 32);
  // kRebuild: P then dS; Q, then dO, then Q; K, then V, then K. Else: P then K; dO then Q; V then
  // dS.
  uint16_t* first = reinterpret_cast<uint16_t*>(shared_bytes);
  uint16_t* second = first + T::kLenMatrix;
  uint16_t* third = second + T::kHeadMatrix;
  float* result = reinterpret_cast<float*>(third + T::kLenMatrix);  // (S,) dV, dP, dQ, dK in turn
  uint16_t* ds = kRebuild ? first : third;
  uint16_t* keys = kRebuild ? third : first;
  uint16_t* queries = second;
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  // [Tq, Tk]; kRebuild: each row's statistics, [Tq, 2]
  const float* weights = probs + (kRebuild ? at.statistics_row(s, 0) : at.weights_row(s, 0));
  HeldRows<kLen, kLen, kThreads> held_p;  // the float weights, for dS
  HeldRows<kLen, kHead, kThreads, Input> held_d_out, held_v;
  if constexpr (kRebuild) {
    float* row_statistics = result + T::kResultMatrix;  // [kLen, 2]
    {
      HeldRows<kLen, kHead, kThreads, Input> held_q, held_k;  // Q, K, the statistics first
      held_q.fetch(at.query(s, q), s.q_row_stride, tq, kHead);
      held_k.fetch(at.key(s, k), s.k_row_stride, tk, kHead);
      for (int i = threadIdx.x; i < 2 * kLen; i += kThreads)
        row_statistics[i] = i < 2 * tq ? weights[i] : 0.f;
      held_q.store(queries, T::kPitchHead);
      held_k.store(keys, T::kPitchHead);
    }
    __syncthreads();
    scores<kLen, kThreads>(queries, keys, result);
    __syncthreads();
    held_d_out.fetch(at.output(s, d_out), s.out_row_stride, tq, kHead);  // in flight meanwhile
    held_v.fetch(at.value(s, v), s.v_row_stride, tk, kHead);
    rebuild_weights(s, mask, at.b, result, T::kPitchResult, row_statistics, scale, held_p);
  } else {
    held_p.fetch(weights, s.key_len, tq, tk);  // P, dO, V: every load, then stores
    held_d_out.fetch(at.output(s, d_out), s.out_row_stride, tq, kHead);
    held_v.fetch(at.value(s, v), s.v_row_stride, tk, kHead);
  }
  held_p.store(first, T::kPitchLen);
  held_d_out.store(second, T::kPitchHead);
  held_v.store(third, T::kPitchHead);
  __syncthreads();
  product<kLen, kHead, kLen, wmma::col_major, wmma::row_major, kThreads>(
      first, T::kPitchLen, second, T::kPitchHead, result, T::kPitchResult);  // dV = Pᵀ·dO
  __syncthreads();
  store_rows<kThreads>(result, T::kPitchResult, tk, dv ? at.value(s, dv) : nullptr, s.v_row_stride,
                       s.rounded_dv ? at.value(s, s.rounded_dv) : nullptr, s.v_row_stride);
  __syncthreads();
  product<kLen, kLen, kHead, wmma::row_major, wmma::col_major, kThreads>(
      second, T::kPitchHead, third, T::kPitchHead, result, T::kPitchResult);  // dP = dO·Vᵀ
  __syncthreads();
  // dS over P's memory (kRebuild, from the weights still held) or V's (from the weights read
  // again with K and Q: one latency for the three); K and Q over the matrices dP read.
  {
    HeldRows<kLen, kHead, kThreads, Input> held_k, held_q;
    if constexpr (!kRebuild) held_p.fetch(weights, s.key_len, tq, tk);
    held_k.fetch(at.key(s, k), s.k_row_stride, tk, kHead);
    held_q.fetch(at.query(s, q), s.q_row_stride, tq, kHead);
    softmax_gradient(held_p, result, T::kPitchResult, tq, tk, scale, ds, T::kPitchLen);
    held_k.store(keys, T::kPitchHead);
    held_q.store(queries, T::kPitchHead);
  }
  __syncthreads();
  product<kLen, kHead, kLen, wmma::row_major, wmma::row_major, kThreads>(
      ds, T::kPitchLen, keys, T::kPitchHead, result, T::kPitchResult);  // dQ = dS·K
  __syncthreads();
  store_rows<kThreads>(result, T::kPitchResult, tq, dq ? at.query(s, dq) : nullptr, s.q_row_stride,
                       s.rounded_dq ? at.query(s, s.rounded_dq) : nullptr, s.q_row_stride);
  __syncthreads();
  product<kLen, kHead, kLen, wmma::col_major, wmma::row_major, kThreads>(
      ds, T::kPitchLen, queries, T::kPitchHead, result, T::kPitchResult);  // dK = dSᵀ·Q
  __syncthreads();
  store_rows<kThreads>(result, T::kPitchResult, tk, dk ? at.key(s, dk) : nullptr, s.k_row_stride,
                       s.rounded_dk ? at.key(s, s.rounded_dk) : nullptr, s.k_row_stride);
}

// Whether a call's forward stores the rows' statistics instead of its weights, and its backward
// rebuilds them (AttentionShape::weights_for_backward_only; two keys at least, so that the
// statistics, [B, H, Tq, 2] from the start of probs, take no more than the weights would).
// TFM_CUDA_REBUILT_WEIGHTS=0 stores and reads the weights instead, to compare.
bool rebuilds_weights(const AttentionShape& s) {
  static const bool enabled = !turned_off("TFM_CUDA_REBUILT_WEIGHTS");
  return enabled && s.weights_for_backward_only && s.key_len >= 2;
}

// The most queries or keys the tiled kernels take. Their backward's shared memory also holds a
// float a query: beyond what the device lends a block (~44,000 queries on an H200, ~28,000 on an
// A100) the whole-matrix path takes the call.
constexpr int64_t kLongestTiled = int64_t(1) << 16;

// The block size a call takes: 64 rows where its queries and keys fit, else 128.
bool fits_small_blocks(const AttentionShape& s) {
  return std::max(s.query_len, s.key_len) <= 64;
}

// Launches `kernel` in blocks of `threads` with `bytes` of dynamic shared memory (beyond the
// default 48 KB, as the device allows it once asked).
template <typename Kernel, typename... Arguments>
void launch_blocks(const Context& c, const AttentionShape& s, Kernel kernel, int threads,
                   size_t bytes, Arguments... arguments) {
  TFM_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  launch_kernel(kernel, unsigned(s.batch * s.heads), threads, bytes, c.stream, arguments...);
}

}  // namespace

bool attention_tensor_cores_enabled() {
  static const bool enabled = !turned_off("TFM_CUDA_TENSOR_CORE_ATTENTION");
  return enabled;
}

bool tensor_core_attention_applies(const Context& c, const AttentionShape& s,
                                   const AttentionMask& mask, const AttentionDropout& dropout) {
  if (!attention_tensor_cores_enabled() || s.products != Precision::kBFloat16) return false;
  const bool whole_heads = block_per_head_applies(s, mask, dropout, 128);
  if (whole_heads && fits_small_blocks(s)) return true;
  // Longer sequences: attention_in_registers.cu's tiles of 64 (where the launch's grid allows).
  const bool tiles = !whole_heads && attention_in_registers_enabled() &&
                     block_per_head_applies(s, mask, dropout, kLongestTiled) &&
                     s.batch * s.heads * ((s.query_len + 63) / 64) < int64_t(1) << 31;
  if (!whole_heads && !tiles) return false;
  int lendable = 0;  // bytes of shared memory the device lends a block (H100: 227 KB, A100: 163)
  TFM_CUDA(cudaDeviceGetAttribute(&lendable, cudaDevAttrMaxSharedMemoryPerBlockOptin, c.device));
  return size_t(lendable) >=
         (tiles ? attention_in_registers_tile_bytes(s.query_len)
                : std::max(Tiles<128>::kForwardBytes, Tiles<128>::kRebuildingBackwardBytes));
}

const char* tensor_core_attention_name(bool forward) {
  if (attention_in_registers_enabled())
    return forward ? "attention_forward (bfloat16, in registers)"
                   : "attention_backward (bfloat16, in registers)";
  return forward ? "attention_forward (bfloat16, WMMA)" : "attention_backward (bfloat16, WMMA)";
}

int64_t attention_weights_floats(const Context& c, const AttentionShape& s,
                                 const AttentionMask& mask, const AttentionDropout& dropout) {
  if (s.batch * s.heads * s.query_len > 0 && rebuilds_weights(s) &&
      tensor_core_attention_applies(c, s, mask, dropout))
    return s.batch * s.heads * s.query_len * 2;  // [B, H, Tq, 2]
  return s.batch * s.heads * s.query_len * s.key_len;
}

bool attention_reads_rounded_inputs(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const AttentionDropout& dropout) {
  static const bool enabled = !turned_off("TFM_CUDA_BFLOAT16_QKV");
  return enabled && tensor_core_attention_applies(c, s, mask, dropout);
}

void tensor_core_attention_forward(const Context& c, const AttentionShape& s,
                                   const AttentionMask& mask, const float* q, const float* k,
                                   const float* v, float* probs, float* out) {
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  if (s.rounded_out_only && s.rounded_out) out = nullptr;  // the copy alone: nothing reads out
  const bool statistics_only = rebuilds_weights(s);
  if (attention_in_registers_enabled()) {
    attention_in_registers_forward(c, s, mask, q, k, v, probs, out, scale, statistics_only);
    return;
  }
  const auto launch = [&](auto input, const auto* q_in, const auto* k_in, const auto* v_in) {
    using Input = decltype(input);
    if (fits_small_blocks(s))
      launch_blocks(c, s, tensor_core_forward_kernel<64, Input>, kBlockThreads<64>,
                    Tiles<64>::kForwardBytes, s, mask, q_in, k_in, v_in, probs, out, scale,
                    statistics_only);
    else
      launch_blocks(c, s, tensor_core_forward_kernel<128, Input>, kBlockThreads<128>,
                    Tiles<128>::kForwardBytes, s, mask, q_in, k_in, v_in, probs, out, scale,
                    statistics_only);
  };
  if (s.rounded_q)
    launch(uint16_t{}, s.rounded_q, s.rounded_k, s.rounded_v);
  else
    launch(float{}, q, k, v);
  check_launch("attention_forward (tensor cores)");
}

void tensor_core_attention_backward(const Context& c, const AttentionShape& s,
                                    const AttentionMask& mask, const float* q, const float* k,
                                    const float* v, const float* probs, const float* d_out,
                                    float* dq, float* dk, float* dv) {
  const float scale = attention_score_scale(s.score.kind, s.head_dim);
  if (s.rounded_gradients_only && s.rounded_dq && s.rounded_dk && s.rounded_dv)
    dq = dk = dv = nullptr;  // the rounded copies alone: the caller reads nothing else
  if (attention_in_registers_enabled()) {
    attention_in_registers_backward(c, s, mask, q, k, v, probs, d_out, dq, dk, dv, scale,
                                    rebuilds_weights(s));
    return;
  }
  // Q, K, V and dO of the Input type, from the given pointers.
  const auto launch_with = [&](auto input, const auto* q_in, const auto* k_in, const auto* v_in,
                               const auto* d_out_in) {
    using Input = decltype(input);
    const auto launch = [&](auto kernel, int threads, size_t bytes) {
      launch_blocks(c, s, kernel, threads, bytes, s, mask, q_in, k_in, v_in, probs, d_out_in, dq,
                    dk, dv, scale);
    };
    const bool small = fits_small_blocks(s);
    if (rebuilds_weights(s) && small)
      launch(tensor_core_backward_kernel<64, true, Input>, kBlockThreads<64>,
             Tiles<64>::kRebuildingBackwardBytes);
    else if (rebuilds_weights(s))
      launch(tensor_core_backward_kernel<128, true, Input>, kBlockThreads<128>,
             Tiles<128>::kRebuildingBackwardBytes);
    else if (small)
      launch(tensor_core_backward_kernel<64, false, Input>, kBlockThreads<64>,
             Tiles<64>::kBackwardBytes);
    else
      launch(tensor_core_backward_kernel<128, false, Input>, kBlockThreads<128>,
             Tiles<128>::kBackwardBytes);
  };
  if (s.rounded_q)
    launch_with(uint16_t{}, s.rounded_q, s.rounded_k, s.rounded_v, s.rounded_d_out);
  else
    launch_with(float{}, q, k, v, d_out);
  check_launch("attention_backward (tensor cores)");
}

}  // namespace cuda
}  // namespace tfm
