// A weight product whose epilogue (the bias on every row, the ReLU) runs inside the product's own
// kernel, on cuBLASLt: a linear layer's y = x·Wᵀ + b as one launch instead of a product and a pass
// over y. Incremental decoding is bound by launches (a base model's step makes some 37 products,
// 31 of them with a bias), so each pass saved is a launch saved; training's linears with a bias
// and a float output (matmul.cu) save the pass's read and write of y. cuBLASLt's
// heuristic picks the algorithm for each shape and alignment once; the choice is kept. Training's
// large products (matmul.cu's, with or without an epilogue) are tuned instead: the heuristic's
// first few algorithms timed on the GPU, the fastest kept (lt_tunes).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"

namespace tfm {
namespace cuda {

// How W of a product lies: [n, k], y = x·Wᵀ (a linear layer's forward), or [k, n], y = x·W (its
// input gradient, dy·W).
enum class WeightLayout { kOutputsByInputs, kInputsByOutputs };

// The ReLU's bit-mask of training's feed-forward in bfloat16, in cuBLASLt's own layout (a bit per
// element of the [n, m] column-major output, n rounded up to 128 bits a column:
// lt_relu_mask_bytes), which NVIDIA documents as opaque: written by the forward product (fc1 with
// its ReLU: written set), read by the backward one (fc2's dy·W), which then keeps only the
// elements the ReLU passed and, where bias_gradient is given, sums them over the rows into it
// ([n], in the output's type).
struct LtReluMask {
  void* mask = nullptr;
  bool written = false;
  void* bias_gradient = nullptr;
};
int64_t lt_relu_mask_bytes(int64_t m, int64_t n);
// Backend::relu_mask_bytes: lt_relu_mask_bytes, or 0 where no mask is kept — with
// TFM_CUDA_RELU_MASK=0 (the ReLU's backward then a pass of its own, to compare), and with
// TFM_CUDA_LT=0, under which no product would write it.
int64_t kept_relu_mask_bytes(int64_t m, int64_t n);
// The bytes of context c's cuBLASLt workspace (cudaMalloc'd outside the memory pool that
// Backend::device_memory reads): 0 until its first product made it.
int64_t lt_workspace_bytes(const Context& c);

// y[m, n] (row stride ldy) = x[m, k] (row stride ldx) · Wᵀ with W [n, k] (row stride ldw; or x·W
// with W [k, n], where `layout` says so), then +
// bias (float32, on every row; null: none; or rounded_bias, bfloat16, for a bfloat16 output only)
// and max(·, 0) where relu. x and W are both `type`:
// CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F, accumulated in float32; y is `output_type`: CUDA_R_32F,
// or CUDA_R_16BF from bfloat16 operands (rounded to nearest). Returns false, having enqueued
// nothing, where cuBLASLt has no algorithm for the product (or TFM_CUDA_LT=0 is set, to compare
// or rule it out); the caller then multiplies another way. `tunable` (training's products,
// MatmulEpilogue::may_tune): tuned where lt_tunes says so; inference's keep the heuristic's
// choice, the same in every process.
bool lt_product(const Context& c, int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
                const void* w, int64_t ldw, cudaDataType_t type, void* y,
                cudaDataType_t output_type, int64_t ldy, const float* bias,
                const uint16_t* rounded_bias, bool relu,
                WeightLayout layout = WeightLayout::kOutputsByInputs,
                const LtReluMask& relu_mask = {}, bool tunable = false);

// Whether a tunable product of m·n·k multiply-adds is tuned: the first of its shape (each
// dimension rounded down to a quarter of its octave) runs each of cuBLASLt's first 8 algorithms for
// it on its own operands, timed on the stream (a wait for the GPU), and the fastest is kept for the
// shape. TFM_CUDA_LT_TUNING: unset, products of m·n·k ≥ 2^31 (a base model's training products;
// each tuning costs some 30 runs of the product, once); "all", every product (the tests' setting,
// so that small shapes take the path); "0", none (the heuristic's first choice, to compare).
bool lt_tunes(int64_t m, int64_t n, int64_t k);

// C[m, n] (row stride ldc, float32) = alpha · op(A) · op(B) + beta · C as cuBLAS's gemm computes
// it for matmul.cu (A [m, k] or, transposed, [k, m] with row stride lda; B [k, n] or [n, k]; of
// `type`, accumulated in float32), on cuBLASLt's algorithm tuned for the shape (lt_tunes). Returns
// false, having enqueued nothing, where cuBLASLt has no algorithm for it or TFM_CUDA_LT=0 is set.
// With a_column_sums (trans_a only: a weight gradient's dy), also a_column_sums[m] = Σ over A's k
// rows, as read (float32 sums, written, not added), in the same product (cuBLASLt's bias-gradient
// epilogue); false where it has no algorithm for that.
bool lt_tuned_product(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                      float beta, float* out, int64_t ldc, cudaDataType_t type,
                      float* a_column_sums = nullptr);

}  // namespace cuda
}  // namespace tfm
