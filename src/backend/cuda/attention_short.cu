// The attention forward over short sequences (at most 64 queries and 64 keys, heads of 64) with
// one thread block per (sequence, head), for training's batches: the block holds the head's Q, K
// and V in shared memory, so the scores are written only as the weights the backward keeps and
// the pass is one launch, where attention_dense.cu's made two batched cuBLAS products of
// 64 × 64 × 64 matrices, a softmax pass over the stored scores and the products' pointer tables
// (0.232 ms against 0.246 for 3200 heads on an H200). Its backward stays on the dense path: the
// same block-per-head form with 4 × 4 register tiles took 0.426 ms there against the dense
// path's 0.357 (four products per block read shared memory more than they compute). Dot-product
// scores and every mask (visible_keys); additive scores, attention dropout, cached rows and
// shared key batches keep the other paths. Products in float32, as everywhere else.
#include "backend/cuda/attention_common.h"
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kShortLen = 64;          // the most queries or keys a block takes
constexpr int kShortHead = 64;         // the head size it takes
constexpr int kPitch = kShortLen + 1;  // shared rows padded: column reads fall in distinct banks
constexpr int kShortThreads = 256;     // a 16 × 16 grid, each thread a 4 × 4 tile of a product
constexpr int64_t kMatrix = int64_t(kShortLen) * kPitch;  // floats of one shared matrix

// rows × 64 of a head's rows into shared [64][kPitch], rows past `rows` zero.
__device__ __forceinline__ void load_head_rows(const float* first_row, int64_t row_stride,
                                               int64_t rows, float* shared) {
  for (int i = threadIdx.x; i < kShortLen * kShortHead; i += kShortThreads) {
    const int r = i / kShortHead, c = i % kShortHead;
    shared[r * kPitch + c] = r < rows ? first_row[r * row_stride + c] : 0.f;
  }
}

// This thread's 4 × 4 tile of C[64, 64] = Σ_k A(i, k) · B(k, j) over k < inner, rows
// ty + 16·a and columns tx + 16·b of the tile; a_at(i, k) and b_at(k, j) read shared memory.
template <typename A, typename B>
__device__ __forceinline__ void tile_product(int inner, A a_at, B b_at, float (&acc)[4][4]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;
  for (int k = 0; k < inner; ++k) {
    float left[4], right[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) left[a] = a_at(ty + 16 * a, k);
#pragma unroll
    for (int b = 0; b < 4; ++b) right[b] = b_at(k, tx + 16 * b);
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[a][b] += left[a] * right[b];
  }
}

// store(i, j, value) for each element of the tile.
template <typename Store>
__device__ __forceinline__ void store_tile(const float (&acc)[4][4], Store store) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) store(ty + 16 * a, tx + 16 * b, acc[a][b]);
}

// Block (b, h): S = Q·Kᵀ, P = the masked softmax of S · scale (masked_softmax_kernel's formula),
// stored into probs when given, O = P·V.
__global__ void short_attention_forward_kernel(AttentionShape s, AttentionMask mask, const float* q,
                                               const float* k, const float* v, float* probs,
                                               float* out, float scale) {
  TFM_DYNAMIC_SHARED(float, shared);
  float* qs = shared;        // [64][kPitch] Q rows
  float* ks = qs + kMatrix;  // [64][kPitch] K rows
  float* vs = ks + kMatrix;  // [64][kPitch] V rows
  float* ps = vs + kMatrix;  // [64][kPitch] S, then P
  const HeadRows at(s);
  const int tq = int(s.query_len), tk = int(s.key_len);
  load_head_rows(at.query(s, q), s.q_row_stride, tq, qs);
  load_head_rows(at.key(s, k), s.k_row_stride, tk, ks);
  load_head_rows(at.value(s, v), s.v_row_stride, tk, vs);
  __syncthreads();
  float acc[4][4];
  tile_product(
      kShortHead, [&](int i, int c) { return qs[i * kPitch + c]; },
      [&](int c, int j) { return ks[j * kPitch + c]; }, acc);
  store_tile(acc, [&](int i, int j, float x) { ps[i * kPitch + j] = x; });
  __syncthreads();
  softmax_block_rows<kShortLen>(
      s, mask, at.b, ps, kPitch, scale,
      [&](int t, int j, float w) {
        ps[t * kPitch + j] = w;
        if (probs && t < tq && j < tk) probs[at.weights_row(s, t) + j] = w;
      },
      [](int, float, float) {});
  __syncthreads();
  tile_product(
      tk, [&](int i, int j) { return ps[i * kPitch + j]; },
      [&](int j, int c) { return vs[j * kPitch + c]; }, acc);
  float* out_rows = at.output(s, out);
  uint16_t* rounded_rows = at.dense_row(s, s.rounded_out, s.query_len);  // or null
  store_tile(acc, [&](int i, int c, float x) {
    if (i >= tq) return;
    out_rows[i * s.out_row_stride + c] = x;
    if (rounded_rows) rounded_rows[i * s.heads * kShortHead + c] = to_bfloat16(x);
  });
}

constexpr size_t kForwardShared = 4 * kMatrix * sizeof(float);

}  // namespace

bool block_per_head_applies(const AttentionShape& s, const AttentionMask& mask,
                            const AttentionDropout& dropout, int64_t most_rows) {
  return s.score.kind != AttentionScoring::kAdditive && !s.key_rows && !mask.key_batch &&
         dropout.p == 0.f && s.head_dim == kShortHead && s.query_len >= 1 &&
         s.query_len <= most_rows && s.key_len >= 1 && s.key_len <= most_rows &&
         s.batch * s.heads >= 1 && s.batch * s.heads < int64_t(1) << 31;
}

bool short_attention_applies(const AttentionShape& s, const AttentionMask& mask,
                             const AttentionDropout& dropout) {
  return block_per_head_applies(s, mask, dropout, kShortLen);
}

void short_attention_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                             const float* q, const float* k, const float* v, float* probs,
                             float* out) {
  TFM_CUDA(cudaFuncSetAttribute(short_attention_forward_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, int(kForwardShared)));
  launch_kernel(short_attention_forward_kernel, unsigned(s.batch * s.heads), kShortThreads,
                kForwardShared, c.stream, s, mask, q, k, v, probs, out,
                attention_score_scale(s.score.kind, s.head_dim));
  check_launch("attention_forward (short sequences)");
}

}  // namespace cuda
}  // namespace tfm
