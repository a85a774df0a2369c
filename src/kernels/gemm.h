// The one seam between the model and the matrix library (oneDNN's sgemm).
// Every matrix product of the engine goes through gemm(); a CUDA or other backend
// replaces this function, not the layers that call it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tfm {

// Row-major C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C[m, n],
// where op(X) is X or Xᵀ. lda/ldb/ldc are row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The number format a PackedMatrix stores its weights in, and multiplies in (float32
// accumulation and output either way). bfloat16 keeps float32's range with an 8-bit mantissa:
// half the memory, and twice the multiply rate on CPUs with AVX512-BF16 (CTranslate2's
// compute_type "bfloat16"); the activations are rounded to bfloat16 at each product's input.
enum class Precision { kFloat32, kBFloat16 };

// Whether oneDNN has a native (not reference) bfloat16 matmul kernel on this CPU.
bool bfloat16_supported();

// A constant weight matrix W[n, k] (row-major, as Linear stores it) copied once into the blocked
// layout that oneDNN's matmul kernels read directly, for y[m, n] = x[m, k] · Wᵀ with any m.
// gemm() reads W in place and so repacks it on every call, which dominates when m is small:
// incremental decoding multiplies 32 hypotheses by each weight matrix per step. Several matrices
// with the same k can be stacked (rows concatenated), e.g. the Q, K and V projections as one
// product. For inference only: later changes to the source weights are not seen.
class PackedMatrix {
 public:
  // parts[i] is a [part_rows[i], k] row-major matrix; W stacks them in order. kBFloat16 throws
  // std::invalid_argument where bfloat16_supported() is false.
  PackedMatrix(const std::vector<const float*>& parts, const std::vector<int64_t>& part_rows,
               int64_t k, Precision precision = Precision::kFloat32);
  int64_t rows() const;  // n
  int64_t cols() const;  // k
  // y[m, n] (row stride ldy) = x[m, k] (row stride ldx) · Wᵀ. Thread-safe.
  void multiply(const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tfm
