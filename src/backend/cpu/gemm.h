// The CPU backend's matrix products on oneDNN: gemm() on activations, PackedMatrix on weights
// prepared once. The model reaches them through Backend::matmul and Backend::prepare_matrix.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace tfm {

// Row-major C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C[m, n], then the epilogue
// (+ bias on every row, ReLU: MatmulEpilogue), where op(X) is X or Xᵀ. lda/ldb/ldc are row
// strides of A, B, C as stored. The epilogue gives the same floats as a separate pass would; the
// primitive applies it in its own pass where beta is 0. kBFloat16: A and B rounded to bfloat16
// first, float32 accumulation (std::invalid_argument where bfloat16_supported() is false), and
// C may instead be written in bfloat16 (epilogue.rounded_output; beta 0 only, else
// std::invalid_argument, as for any other precision); kInt8 is refused (std::invalid_argument).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          Precision precision = Precision::kFloat32, MatmulEpilogue epilogue = {});

// gemm() in bfloat16 where A and B may come already rounded: a.rounded / b.rounded [rows, cols]
// as stored (round_to_bfloat16 of the values; row stride MatmulOperand::rounded_stride), or
// null (the values rounded here, as gemm() does; lda / ldb are the values' row strides).
void gemm_bfloat16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
                   int64_t ldc, MatmulEpilogue epilogue = {});

// x[m, k] (row stride ldx) rounded to bfloat16 (nearest, ties to even; NaN stays NaN) into
// out[m, k] (row stride ldo); rows spread over the threads when the matrix is large and no
// parallel region is running.
void round_to_bfloat16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out,
                       int64_t ldo);

// The same in IEEE float16 (nearest, ties to even; past 65504 ±Inf; NaN stays NaN): rows of a
// float16 key/value cache. Products in float16 are the GPU's only.
void round_to_float16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out);
// What a float16 product on the CPU is refused with (std::invalid_argument's message).
const char* float16_refusal();

// Whether oneDNN has a native (not reference) bfloat16 matmul kernel on this CPU.
bool bfloat16_supported();

// Whether the CPU has the int8 dot-product instructions (AVX512-VNNI or AVX-VNNI) that int8
// products need: without them oneDNN's u8·s8 kernels saturate 16-bit pair sums.
bool int8_supported();

// The CPU's PreparedMatrix: W copied once into the blocked layout that oneDNN's matmul kernels
// read directly (in float32, bfloat16, or int8 with a scale per row: int8_quantization.h). gemm()
// reads W in place and so repacks it on every call, which dominates when m is small: incremental
// decoding multiplies 32 hypotheses by each weight matrix per step.
class PackedMatrix final : public PreparedMatrix {
 public:
  // kBFloat16 / kInt8 throw std::invalid_argument where bfloat16_supported() /
  // int8_supported() is false.
  PackedMatrix(const std::vector<const float*>& parts, const std::vector<int64_t>& part_rows,
               int64_t k, Precision precision = Precision::kFloat32);
  // kInt8 from rows already quantised (tensor/int8_weights.h); the float constructor with kInt8
  // quantises by the same rule, so both give the same products.
  PackedMatrix(const std::vector<Int8Rows>& parts, const std::vector<int64_t>& part_rows,
               int64_t k);
  int64_t rows() const override;
  int64_t cols() const override;
  Precision precision() const override;
  // The float32 and bfloat16 primitives add the bias and apply the ReLU in their own pass; int8
  // in the pass that turns its integer products back into floats.
  void multiply(MatmulOperand x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                const MatmulEpilogue& epilogue = {}) const override;
  void read_rows(const int32_t* ids, int64_t count, float* out) const override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tfm
