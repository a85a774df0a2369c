// The one seam between the model and the matrix library (oneDNN's sgemm).
// Every matrix product of the engine goes through gemm(); a CUDA or other backend
// replaces this function, not the layers that call it.
#pragma once

#include <cstdint>

namespace tfm {

// Row-major C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C[m, n],
// where op(X) is X or Xᵀ. lda/ldb/ldc are row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace tfm
