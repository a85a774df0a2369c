// The CUDA backend's matrix products: Backend::matmul on cuBLAS (float32 in float32; bfloat16 as
// cublasGemmEx on operands rounded to bfloat16 with float32 accumulation), its epilogue, and the
// PreparedMatrix of a weight held on the GPU in float32, bfloat16 or int8 with a scale per row.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

namespace tfm {
namespace cuda {

void matmul(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta,
            float* out, int64_t ldc, Precision precision, const MatmulEpilogue& epilogue);

// parts[i] [part_rows[i], k] in `backend`'s (this GPU's) memory, stacked in order.
std::unique_ptr<PreparedMatrix> prepare_matrix(const Backend& backend, const Context& c,
                                               const std::vector<const float*>& parts,
                                               const std::vector<int64_t>& part_rows, int64_t k,
                                               Precision precision);
std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const Backend& backend, const Context& c,
                                                    const std::vector<Int8Rows>& parts,
                                                    const std::vector<int64_t>& part_rows,
                                                    int64_t k);

}  // namespace cuda
}  // namespace tfm
