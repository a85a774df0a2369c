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

// Backend::matmul. Returns whether the epilogue ran inside cuBLASLt's product (a linear layer's
// bias and ReLU with a float output: lt_product.h) rather than in a pass after cuBLAS's;
// *relu_mask_used (where given): whether that product wrote or read the ReLU's mask
// (MatmulEpilogue::relu_mask), for the profile's names.
bool matmul(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta,
            float* out, int64_t ldc, Precision precision, const MatmulEpilogue& epilogue,
            bool* relu_mask_used = nullptr);
// What the profile (TFM_CUDA_PROFILE) calls such a product, by its precision, whether it writes
// bfloat16, and whether its epilogue ran inside cuBLASLt's product.
const char* training_product_name(Precision precision, bool bfloat16_output, bool on_lt);

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
