// Training's attention in bfloat16 on tensor cores, for at most 64 queries and keys with heads
// of 64 (the base and big models' training batches): a block per (sequence, head), as
// attention_short.cu's float32 forward, whose every product (S = Q·Kᵀ and O = P·V; in the
// backward dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K and dK = dSᵀ·Q) is 16 WMMA tiles of bfloat16
// operands summed in float32, two tiles a warp. The operands are rounded to bfloat16 (nearest
// even) as they are loaded, as PyTorch's autocast rounds them; the softmax and its backward stay
// in float32, and the backward reads the weights as the forward stored them (float32). It serves
// the calls whose AttentionShape::products is kBFloat16 (training in bfloat16) where
// attention_short.cu's conditions hold; TFM_CUDA_TENSOR_CORE_ATTENTION=0 turns it off (and the
// whole-matrix backward's TF32 products), to compare or to rule them out.
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>

#include "backend/cuda/attention_common.h"
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kLen = 64;                    // the most queries or keys, and the head size
constexpr int kBlockThreads = 256;          // 8 warps, 2 of a product's 16 output tiles each
constexpr int kPitch16 = kLen + 8;          // bfloat16 rows padded by 16 bytes (WMMA: 8 elements)
constexpr int kPitch32 = kLen + 4;          // float rows padded by 16 bytes
constexpr int kMatrix16 = kLen * kPitch16;  // elements of a shared bfloat16 matrix
constexpr int kMatrix32 = kLen * kPitch32;  // ... of a shared float one

// rows × cols floats (rows row_stride apart) rounded to bfloat16 into shared [64][kPitch16]; the
// rest of the 64 × 64 zero.
__device__ __forceinline__ void load_rounded(const float* first, int64_t row_stride, int rows,
                                             int cols, uint16_t* shared) {
  for (int i = threadIdx.x; i < kLen * kLen; i += kBlockThreads) {
    const int r = i / kLen, c = i % kLen;
    shared[r * kPitch16 + c] = r < rows && c < cols ? to_bfloat16(first[r * row_stride + c]) : 0;
  }
}

// C[64][kPitch32] (float, shared) = A·B over an inner 64, A and B 64 × 64 bfloat16 in shared
// memory, each as its layout says: wmma::row_major, element (i, k) at i · kPitch16 + k;
// wmma::col_major, at k · kPitch16 + i (a transposed operand read in place). Warp w makes the
// tiles of tile row w / 2, tile columns 2 · (w % 2) and the next.
template <typename ALayout, typename BLayout>
__device__ __forceinline__ void product(const uint16_t* a, const uint16_t* b, float* c) {
  constexpr bool a_by_rows = std::is_same_v<ALayout, wmma::row_major>;
  constexpr bool b_by_rows = std::is_same_v<BLayout, wmma::row_major>;
  const auto* a16 = reinterpret_cast<const __nv_bfloat16*>(a);
  const auto* b16 = reinterpret_cast<const __nv_bfloat16*>(b);
  const int warp = threadIdx.x / 32, row = warp / 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int col = 2 * (warp % 2) + half;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> sum;
    wmma::fill_fragment(sum, 0.f);
#pragma unroll
    for (int k = 0; k < kLen / 16; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, ALayout> left;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> right;
      wmma::load_matrix_sync(
          left, a16 + (a_by_rows ? row * 16 * kPitch16 + k * 16 : k * 16 * kPitch16 + row * 16),
          kPitch16);
      wmma::load_matrix_sync(
          right, b16 + (b_by_rows ? k * 16 * kPitch16 + col * 16 : col * 16 * kPitch16 + k * 16),
          kPitch16);
      wmma::mma_sync(sum, left, right, sum);
    }
    wmma::store_matrix_sync(c + row * 16 * kPitch32 + col * 16, sum, kPitch32, wmma::mem_row_major);
  }
}

// The first `rows` rows of C (shared [64][kPitch32]) to rows of `first` row_stride apart, and,
// where `rounded` is given, rounded to bfloat16 to its rows rounded_stride apart.
__device__ __forceinline__ void store_rows(const float* c, int rows, float* first,
                                           int64_t row_stride, uint16_t* rounded,
                                           int64_t rounded_stride) {
  for (int i = threadIdx.x; i < rows * kLen; i += kBlockThreads) {
    const int r = i / kLen, col = i % kLen;
    const float x = c[r * kPitch32 + col];
    first[r * row_stride + col] = x;
    if (rounded) rounded[r * rounded_stride + col] = to_bfloat16(x);
  }
}

// Block (b, h): S = Q·Kᵀ, P = the masked softmax of S · scale (masked_softmax_kernel's formula),
// stored into probs when given, O = P·V into out (and its rounded copy where asked).
__global__ void __launch_bounds__(kBlockThreads)
    tensor_core_forward_kernel(AttentionShape s, AttentionMask mask, const float* q, const float* k,
                               const float* v, float* probs, float* out, float scale) {
  __shared__ __align__(32) uint16_t queries[kMatrix16];  // Q, then the weights P
  __shared__ __align__(32) uint16_t keys[kMatrix16];     // K
  __shared__ __align__(32) uint16_t values[kMatrix16];   // V
  __shared__ __align__(32) float result[kMatrix32];      // S, then O
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  load_rounded(at.query(s, q), s.q_row_stride, tq, kLen, queries);
  load_rounded(at.key(s, k), s.k_row_stride, tk, kLen, keys);
  load_rounded(at.value(s, v), s.v_row_stride, tk, kLen, values);
  __syncthreads();
  product<wmma::row_major, wmma::col_major>(queries, keys, result);  // S = Q·Kᵀ
  __syncthreads();
  softmax_rows_of_64(s, mask, at.b, result, kPitch32, scale, [&](int t, int j, float w) {
    queries[t * kPitch16 + j] = to_bfloat16(w);  // P over Q
    if (probs && t < tq && j < tk) probs[at.weights_row(s, t) + j] = w;
  });
  __syncthreads();
  product<wmma::row_major, wmma::row_major>(queries, values, result);  // O = P·V
  __syncthreads();
  store_rows(result, tq, at.output(s, out), s.out_row_stride,
             at.dense_row(s, s.rounded_out, s.query_len), s.heads * kLen);
}

// Block (b, h) of the backward, from the weights P the forward stored: dV = Pᵀ·dO, dP = dO·Vᵀ,
// dS = P ⊙ (dP − Σ dP·P) · scale (softmax_backward_kernel's formula, in float32), dQ = dS·K,
// dK = dSᵀ·Q; each written (not added) to its first Tq or Tk rows, and rounded to its copy in
// the same layout where AttentionShape asks for one.
__global__ void __launch_bounds__(kBlockThreads)
    tensor_core_backward_kernel(AttentionShape s, const float* q, const float* k, const float* v,
                                const float* probs, const float* d_out, float* dq, float* dk,
                                float* dv, float scale) {
  __shared__ __align__(32) uint16_t first[kMatrix16];   // P, then K
  __shared__ __align__(32) uint16_t second[kMatrix16];  // dO, then Q
  __shared__ __align__(32) uint16_t third[kMatrix16];   // V, then dS
  __shared__ __align__(32) float result[kMatrix32];     // dV, dP, dQ, dK in turn
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  const float* weights = probs + at.weights_row(s, 0);  // [Tq, Tk]
  load_rounded(weights, s.key_len, tq, tk, first);
  load_rounded(at.output(s, d_out), s.out_row_stride, tq, kLen, second);
  load_rounded(at.value(s, v), s.v_row_stride, tk, kLen, third);
  __syncthreads();
  product<wmma::col_major, wmma::row_major>(first, second, result);  // dV = Pᵀ·dO
  __syncthreads();
  store_rows(result, tk, at.value(s, dv), s.v_row_stride,
             s.rounded_dv ? at.value(s, s.rounded_dv) : nullptr, s.v_row_stride);
  __syncthreads();
  product<wmma::row_major, wmma::col_major>(second, third, result);  // dP = dO·Vᵀ
  __syncthreads();
  // dS over V's memory, from the float weights; K and Q over P's and dO's.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int t = warp; t < kLen; t += kBlockThreads / 32) {
    uint16_t* ds = third + t * kPitch16;
    if (t >= tq) {
      ds[lane] = ds[lane + 32] = 0;
      continue;
    }
    const float* p = weights + t * s.key_len;
    const float* dp = result + t * kPitch32;
    float dot = 0.f;
    for (int j = lane; j < tk; j += 32) dot += dp[j] * p[j];
    dot = warp_sum(dot);
    for (int j = lane; j < kLen; j += 32)
      ds[j] = j < tk ? to_bfloat16(p[j] * (dp[j] - dot) * scale) : 0;
  }
  load_rounded(at.key(s, k), s.k_row_stride, tk, kLen, first);
  load_rounded(at.query(s, q), s.q_row_stride, tq, kLen, second);
  __syncthreads();
  product<wmma::row_major, wmma::row_major>(third, first, result);  // dQ = dS·K
  __syncthreads();
  store_rows(result, tq, at.query(s, dq), s.q_row_stride,
             s.rounded_dq ? at.query(s, s.rounded_dq) : nullptr, s.q_row_stride);
  __syncthreads();
  product<wmma::col_major, wmma::row_major>(third, second, result);  // dK = dSᵀ·Q
  __syncthreads();
  store_rows(result, tk, at.key(s, dk), s.k_row_stride,
             s.rounded_dk ? at.key(s, s.rounded_dk) : nullptr, s.k_row_stride);
}

}  // namespace

bool attention_tensor_cores_enabled() {
  static const bool enabled = !turned_off("TFM_CUDA_TENSOR_CORE_ATTENTION");
  return enabled;
}

bool tensor_core_attention_applies(const AttentionShape& s, const AttentionMask& mask,
                                   const AttentionDropout& dropout) {
  return attention_tensor_cores_enabled() && s.products == Precision::kBFloat16 &&
         short_attention_applies(s, mask, dropout);
}

void tensor_core_attention_forward(const Context& c, const AttentionShape& s,
                                   const AttentionMask& mask, const float* q, const float* k,
                                   const float* v, float* probs, float* out) {
  tensor_core_forward_kernel<<<unsigned(s.batch * s.heads), kBlockThreads, 0, c.stream>>>(
      s, mask, q, k, v, probs, out, attention_score_scale(s.score.kind, s.head_dim));
  check_launch("attention_forward (tensor cores)");
}

void tensor_core_attention_backward(const Context& c, const AttentionShape& s, const float* q,
                                    const float* k, const float* v, const float* probs,
                                    const float* d_out, float* dq, float* dk, float* dv) {
  tensor_core_backward_kernel<<<unsigned(s.batch * s.heads), kBlockThreads, 0, c.stream>>>(
      s, q, k, v, probs, d_out, dq, dk, dv, attention_score_scale(s.score.kind, s.head_dim));
  check_launch("attention_backward (tensor cores)");
}

}  // namespace cuda
}  // namespace tfm
