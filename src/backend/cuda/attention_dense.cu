// Attention over whole score matrices on cuBLAS: one batched product over every (sequence, head)
// for QKᵀ, a masked softmax of one warp per query row, and one for P·V; the backward likewise
// (dV = P'ᵀ·dO, dP = dO·Vᵀ, the softmax's backward, dQ = dS·K, dK = dSᵀ·Q). This is
// what training (which keeps the weights for the backward anyway) and the encoder's full
// passes use; additive scores, cached rows and shared key batches (decoding) stay with the
// per-query kernels of attention.cu. Products in float32, as the CPU backend's, or on TF32 tensor
// cores where AttentionShape::products asks for reduced precision (training in bfloat16, whose
// sequences longer than attention_tensor_cores.cu takes come here: forward and backward).
#include <cmath>

#include "backend/cuda/attention_common.h"
#include "backend/cuda/blas_library.h"
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one query row each

// Visible keys [begin, end) of query t of sequence b.
__device__ __forceinline__ void visible_range(const AttentionShape& s, const AttentionMask& mask,
                                              int64_t b, int64_t t, int64_t* begin, int64_t* end) {
  int64_t key_count = s.key_len;
  if (mask.key_lengths && mask.key_lengths[b] < key_count) key_count = mask.key_lengths[b];
  visible_keys(mask, key_count, t + mask.query_offset, begin, end);
}

// Row r = ((b·H + h)·Tq + t) of scores [B, H, Tq, Tk]: the raw logits become the weights (0
// outside the visible keys); `dropped` (or null) receives them through the dropout mask.
__global__ void masked_softmax_kernel(AttentionShape s, AttentionMask mask, float* scores,
                                      float scale, const uint8_t* drop, float keep_scale,
                                      float* dropped) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= s.batch * s.heads * s.query_len) return;
  const int64_t t = row % s.query_len, b = row / (s.query_len * s.heads);
  int64_t begin, end;
  visible_range(s, mask, b, t, &begin, &end);
  float* p = scores + row * s.key_len;
  float largest = -INFINITY;
  for (int64_t j = begin + lane; j < end; j += 32) largest = fmaxf(largest, p[j]);
  largest = warp_max(largest);
  const float shift = largest * scale;
  float total = 0.f;
  for (int64_t j = begin + lane; j < end; j += 32) total += expf(p[j] * scale - shift);
  total = warp_sum(total);
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  for (int64_t j = lane; j < s.key_len; j += 32) {
    const float w = j >= begin && j < end ? expf(p[j] * scale - shift) * inverse : 0.f;
    p[j] = w;
    if (dropped) dropped[row * s.key_len + j] = drop[row * s.key_len + j] ? w * keep_scale : 0.f;
  }
}

// d_scores [B, H, Tq, Tk] holds dP = dO·Vᵀ; it becomes dS = P ⊙ (dP' − Σ dP'·P) · scale, with
// dP' = dP through the dropout mask.
__global__ void softmax_backward_kernel(int64_t rows, int64_t key_len, const float* probs,
                                        float* d_scores, float scale, const uint8_t* drop,
                                        float keep_scale) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* p = probs + row * key_len;
  float* g = d_scores + row * key_len;
  const uint8_t* m = drop ? drop + row * key_len : nullptr;
  float dot = 0.f;
  for (int64_t j = lane; j < key_len; j += 32) {
    float v = g[j];
    if (m) v = m[j] ? v * keep_scale : 0.f;
    g[j] = v;
    dot += v * p[j];
  }
  dot = warp_sum(dot);
  for (int64_t j = lane; j < key_len; j += 32) g[j] = p[j] * (g[j] - dot) * scale;
}

// Where the matrices of one operand of a per-head product lie: matrix (s, h) of sequence s and
// head h starts at base + s·sequence + h·head, rows `ld` elements apart.
struct HeadMatrices {
  const float* base;
  int64_t ld, sequence, head;
};

// The matrix pointers of a per-head product, matrix i = s·heads + h.
__global__ void head_pointers_kernel(HeadMatrices a, HeadMatrices b, HeadMatrices c, int64_t heads,
                                     int64_t count, const float** a_pointers,
                                     const float** b_pointers, float** c_pointers) {
  TFM_FOR_EACH(i, count) {
    const int64_t s = i / heads, h = i % heads;
    a_pointers[i] = a.base + s * a.sequence + h * a.head;
    b_pointers[i] = b.base + s * b.sequence + h * b.head;
    c_pointers[i] = const_cast<float*>(c.base) + s * c.sequence + h * c.head;
  }
}

// Row-major C = op(A)·op(B) for every (sequence, head) of a batch in one cuBLAS call (a per-head
// loop of strided-batched products made 8 launches of 1/8 of the work at 8 heads), column-major
// as matmul.cu: Cᵀ = op(B)ᵀ·op(A)ᵀ. products: kFloat32, or kBFloat16 (AttentionShape::
// products), which takes TF32 tensor cores where cuBLAS has them for the shape.
void head_product(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  HeadMatrices a, HeadMatrices b, HeadMatrices out, int64_t sequences,
                  int64_t heads, Precision products = Precision::kFloat32) {
  const int64_t count = sequences * heads;
  if (count == 0) return;
  Scratch pointers(c, 3 * count * int64_t(sizeof(float*)));  // [3, count]
  const float** a_pointers = pointers.as<const float*>();
  const float** b_pointers = a_pointers + count;
  float** c_pointers = pointers.as<float*>() + 2 * count;
  launch_kernel(head_pointers_kernel, blocks_for(count), kThreads, 0, c.stream, a, b, out, heads,
                count, a_pointers, b_pointers, c_pointers);
  check_launch("attention (head pointers)");
  const float alpha = 1.f, beta = 0.f;
  std::lock_guard<std::mutex> lock(c.blas_mutex);
  const BlasLibrary& blas = blas_library();
  TFM_CUDA(blas.set_stream(c.blas, c.stream));
  if (products == Precision::kBFloat16 && attention_tensor_cores_enabled()) {
    const cublasStatus_t status = blas.gemm_batched_ex(
        c.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n),
        int(m), int(k), &alpha, reinterpret_cast<const void* const*>(b_pointers), CUDA_R_32F,
        int(b.ld), reinterpret_cast<const void* const*>(a_pointers), CUDA_R_32F, int(a.ld), &beta,
        reinterpret_cast<void* const*>(c_pointers), CUDA_R_32F, int(out.ld), int(count),
        CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
      TFM_CUDA(status);
      return;
    }  // else in float32, as below
  }
  TFM_CUDA(blas.sgemm_batched(c.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha,
                              b_pointers, int(b.ld), a_pointers, int(a.ld), &beta, c_pointers,
                              int(out.ld), int(count)));
}

unsigned row_blocks(int64_t rows) {
  return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Scores of more than this many bytes for a pass that keeps no weights go to the per-query
// kernels instead (their memory does not grow with Tq × Tk).
constexpr int64_t kDenseScratchLimit = int64_t(1) << 30;

}  // namespace

bool dense_attention_applies(const AttentionShape& s, const AttentionMask& mask, bool keeps_probs) {
  if (s.score.kind == AttentionScoring::kAdditive || s.key_rows || mask.key_batch) return false;
  if (s.head_dim == 0 || s.key_len == 0) return false;
  const int64_t score_bytes = s.batch * s.heads * s.query_len * s.key_len * int64_t(sizeof(float));
  return keeps_probs || score_bytes <= kDenseScratchLimit;
}

void dense_attention_forward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                             const float* q, const float* k, const float* v, float* probs,
                             float* out, const AttentionDropout& dropout) {
  const int64_t rows = s.batch * s.heads * s.query_len, pair_size = s.query_len * s.key_len;
  const int64_t d = s.head_dim;
  Scratch own_scores(c, probs ? 0 : rows * s.key_len * int64_t(sizeof(float)));
  float* scores = probs ? probs : own_scores.as<float>();  // [B, H, Tq, Tk]
  Scratch dropped(c, dropout.p > 0.f ? rows * s.key_len * int64_t(sizeof(float)) : 0);
  const int64_t k_stride = sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride);
  const int64_t v_stride = sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride);
  // S[Tq, Tk] = Q·Kᵀ per sequence and head
  head_product(c, false, true, s.query_len, s.key_len, d,
               {q, s.q_row_stride, s.query_len * s.q_row_stride, d},
               {k, s.k_row_stride, k_stride, d},
               {scores, s.key_len, s.heads * pair_size, pair_size}, s.batch, s.heads, s.products);
  launch_kernel(masked_softmax_kernel, row_blocks(rows), 32 * kRowsPerBlock, 0, c.stream, s, mask,
                scores, attention_score_scale(s.score.kind, s.head_dim),
                dropout.p > 0.f ? dropout.mask : nullptr,
                dropout.p > 0.f ? 1.f / (1.f - dropout.p) : 1.f,
                dropout.p > 0.f ? dropped.as<float>() : nullptr);
  check_launch("attention_forward (softmax)");
  const float* weights = dropout.p > 0.f ? dropped.as<float>() : scores;
  // O[Tq, d] = P'·V per sequence and head
  head_product(
      c, false, false, s.query_len, d, s.key_len,
      {weights, s.key_len, s.heads * pair_size, pair_size}, {v, s.v_row_stride, v_stride, d},
      {out, s.out_row_stride, s.query_len * s.out_row_stride, d}, s.batch, s.heads, s.products);
}

void dense_attention_backward(const Context& c, const AttentionShape& s, const AttentionMask& mask,
                              const float* q, const float* k, const float* v, const float* probs,
                              const AttentionDropout& dropout, const float* d_out, float* dq,
                              float* dk, float* dv) {
  const int64_t rows = s.batch * s.heads * s.query_len, pair_size = s.query_len * s.key_len;
  const int64_t d = s.head_dim;
  const int64_t k_stride = sequence_stride(s.k_batch_stride, s.key_len, s.k_row_stride);
  const int64_t v_stride = sequence_stride(s.v_batch_stride, s.key_len, s.v_row_stride);
  const int64_t q_stride = s.query_len * s.q_row_stride;
  const int64_t out_stride = s.query_len * s.out_row_stride;
  const bool dropping = dropout.p > 0.f;
  const float keep_scale = dropping ? 1.f / (1.f - dropout.p) : 1.f;
  // P' (the weights the forward applied) and dP, then dS in place of dP: [B, H, Tq, Tk] each.
  Scratch scratch(c, (dropping ? 2 : 1) * rows * s.key_len * int64_t(sizeof(float)));
  float* d_scores = scratch.as<float>();
  const float* weights = probs;
  if (dropping) {
    float* dropped = d_scores + rows * s.key_len;
    // P' = P through the mask: the forward's dropped copy, rebuilt (apply_dropout's rule).
    TFM_CUDA(cudaMemcpyAsync(dropped, probs, size_t(rows * s.key_len) * sizeof(float),
                             cudaMemcpyDeviceToDevice, c.stream));
    apply_dropout(c.stream, dropped, dropout.mask, rows * s.key_len, dropout.p, dropout.key);
    weights = dropped;
  }
  const HeadMatrices weights_by_head{weights, s.key_len, s.heads * pair_size, pair_size};
  const HeadMatrices d_out_by_head{d_out, s.out_row_stride, out_stride, d};
  const HeadMatrices d_scores_by_head{d_scores, s.key_len, s.heads * pair_size, pair_size};
  // dV[Tk, d] = P'ᵀ·dO; rows of keys no query sees get 0 (their weights are 0).
  head_product(c, true, false, s.key_len, d, s.query_len, weights_by_head, d_out_by_head,
               {dv, s.v_row_stride, v_stride, d}, s.batch, s.heads, s.products);
  // dP[Tq, Tk] = dO·Vᵀ
  head_product(c, false, true, s.query_len, s.key_len, d, d_out_by_head,
               {v, s.v_row_stride, v_stride, d}, d_scores_by_head, s.batch, s.heads, s.products);
  launch_kernel(softmax_backward_kernel, row_blocks(rows), 32 * kRowsPerBlock, 0, c.stream, rows,
                s.key_len, probs, d_scores, attention_score_scale(s.score.kind, s.head_dim),
                dropping ? dropout.mask : nullptr, keep_scale);
  check_launch("attention_backward (softmax)");
  // dQ[Tq, d] = dS·K, dK[Tk, d] = dSᵀ·Q.
  head_product(c, false, false, s.query_len, d, s.key_len, d_scores_by_head,
               {k, s.k_row_stride, k_stride, d}, {dq, s.q_row_stride, q_stride, d}, s.batch,
               s.heads, s.products);
  head_product(c, true, false, s.key_len, d, s.query_len, d_scores_by_head,
               {q, s.q_row_stride, q_stride, d}, {dk, s.k_row_stride, k_stride, d}, s.batch,
               s.heads, s.products);
  (void)mask;  // the weights are 0 wherever the mask hides a key: dS is 0 there too
}

}  // namespace cuda
}  // namespace tfm
