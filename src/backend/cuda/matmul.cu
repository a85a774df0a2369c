// Row-major products on cuBLAS, which is column-major: C[m, n] = op(A) · op(B) is computed as
// Cᵀ[n, m] = op(B)ᵀ · op(A)ᵀ, so each row-major matrix is read as its column-major transpose
// with the same stride and no copy. See matmul.h.
#include <optional>
#include <stdexcept>

#include "backend/cuda/blas_library.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/lt_product.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/operation_profile.h"
#include "backend/device_buffer.h"

namespace tfm {
namespace cuda {

namespace {

cublasOperation_t op(bool transposed) {
  return transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// cuBLAS's name for the element type of a 16-bit product's operands.
cudaDataType_t blas_type(Precision format) {
  return format == Precision::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
}

// C = alpha · op(A) · op(B) + beta · C with A, B in float32, bfloat16 or float16 (`type`).
void blas_product(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                  float* out, int64_t ldc, cudaDataType_t type) {
  std::lock_guard<std::mutex> lock(c.blas_mutex);
  const BlasLibrary& blas = blas_library();
  TFM_CUDA(blas.set_stream(c.blas, c.stream));
  if (type == CUDA_R_32F) {
    TFM_CUDA(blas.sgemm(c.blas, op(trans_b), op(trans_a), int(n), int(m), int(k), &alpha,
                        static_cast<const float*>(b), int(ldb), static_cast<const float*>(a),
                        int(lda), &beta, out, int(ldc)));
    return;
  }
  TFM_CUDA(blas.gemm_ex(c.blas, op(trans_b), op(trans_a), int(n), int(m), int(k), &alpha, b, type,
                        int(ldb), a, type, int(lda), &beta, out, CUDA_R_32F, int(ldc),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The epilogue of a product finished in float: `result` [m, n] (row stride ld) gets the bias and
// ReLU in place, or, where the epilogue asks for bfloat16, is rounded into rounded_output (row
// stride ld) in the same pass with them, results below the smallest normal float flushed to
// zero.
void finish_epilogue(const Context& c, float* result, int64_t ld, const MatmulEpilogue& epilogue,
                     int64_t m, int64_t n) {
  if (epilogue.rounded_output)
    round_to_bfloat16_flushing(c.stream, result, ld, epilogue.bias, epilogue.relu, m, n,
                               epilogue.rounded_output, ld);
  else
    bias_relu_epilogue(c.stream, result, ld, epilogue.bias, epilogue.relu, m, n);
}

// What the profile calls a prepared product (TFM_CUDA_PROFILE), by its precision, whether it
// writes bfloat16, and whether the library's own path ran it (on_lt: cuBLASLt with its epilogue,
// for int8 cuBLAS's int8 product) or the other way (cuBLAS and a pass of our own; for int8 our
// own kernel).
const char* prepared_product_name(Precision precision, bool bfloat16_output, bool on_lt) {
  switch (precision) {
    case Precision::kFloat32:
      return on_lt ? "prepared float32 (cuBLASLt)" : "prepared float32 (cuBLAS + pass)";
    case Precision::kBFloat16:
      if (bfloat16_output)
        return on_lt ? "prepared bfloat16 out (cuBLASLt)" : "prepared bfloat16 out (cuBLAS + pass)";
      return on_lt ? "prepared bfloat16 (cuBLASLt)" : "prepared bfloat16 (cuBLAS + pass)";
    case Precision::kFloat16:
      return on_lt ? "prepared float16 (cuBLASLt)" : "prepared float16 (cuBLAS + pass)";
    case Precision::kInt8:
      return on_lt ? "prepared int8 (cuBLAS int8 + pass)" : "prepared int8 (own kernel)";
  }
  return "prepared";
}

// A weight matrix held on the GPU in the format it is multiplied in.
class CudaPreparedMatrix final : public PreparedMatrix {
 public:
  CudaPreparedMatrix(const Backend& backend, const Context& c, int64_t rows, int64_t cols,
                     Precision precision)
      : context_(c), rows_(rows), cols_(cols), precision_(precision) {
    switch (precision) {
      case Precision::kFloat32:
        weights_float_.allocate_uninitialized(backend, rows * cols);
        break;
      case Precision::kBFloat16:
      case Precision::kFloat16:
        weights_16_bits_.allocate_uninitialized(backend, rows * cols);
        break;
      case Precision::kInt8:
        weights_int8_.allocate_uninitialized(backend, rows * cols);
        scales_.allocate_uninitialized(backend, rows);
        break;
    }
  }
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  Precision precision() const override { return precision_; }

  // The epilogue inside the product where cuBLASLt has one for it (lt_product.h), else cuBLAS
  // and a pass of its own; int8's in the kernel that scales the integer sums back.
  void multiply(MatmulOperand operand, int64_t m, int64_t ldx, float* y, int64_t ldy,
                const MatmulEpilogue& epilogue) const override {
    if (epilogue.rounded_output && precision_ != Precision::kBFloat16)
      throw std::invalid_argument(
          "PreparedMatrix::multiply: a bfloat16 output needs bfloat16 weights");
    const uint16_t* given_rounded =
        precision_ == Precision::kBFloat16 ? operand.rounded : nullptr;  // [m, k]
    const float* x = operand.values;                                     // [m, k] (ldx)
    if (!x && !given_rounded) throw std::invalid_argument("PreparedMatrix::multiply: no operand");
    if (m == 0 || rows_ == 0) return;
    const bool bfloat16_output = epilogue.rounded_output != nullptr;
    context_.activate();  // TFM_CUDA_OPERATION_SHAPED's steps, with a name it may change
    ProfiledOperation profiled_operation(
        context_, prepared_product_name(precision_, bfloat16_output, true), m, rows_, cols_);
    switch (precision_) {
      case Precision::kFloat32:
        if (!lt_product(context_, m, rows_, cols_, x, ldx, weights_float_.data(), cols_, CUDA_R_32F,
                        y, CUDA_R_32F, ldy, epilogue.bias, nullptr, epilogue.relu)) {
          profiled_operation.rename(prepared_product_name(precision_, false, false));
          blas_product(context_, false, true, m, rows_, cols_, 1.f, x, ldx, weights_float_.data(),
                       cols_, 0.f, y, ldy, CUDA_R_32F);
          finish_epilogue(context_, y, ldy, epilogue, m, rows_);
        }
        return;
      case Precision::kBFloat16:
      case Precision::kFloat16: {
        if (given_rounded) {
          if (!product_16_bits(given_rounded, operand.rounded_stride(cols_), m, y, ldy, epilogue))
            profiled_operation.rename(prepared_product_name(precision_, bfloat16_output, false));
          return;
        }
        StagedOperand rounded(context_, m * cols_ * int64_t(sizeof(uint16_t)));  // [m, k]
        round_to_16_bits(context_.stream, x, m, cols_, ldx, precision_, rounded.as<uint16_t>(),
                         cols_);
        if (!product_16_bits(rounded.as<uint16_t>(), cols_, m, y, ldy, epilogue))
          profiled_operation.rename(prepared_product_name(precision_, bfloat16_output, false));
        return;
      }
      case Precision::kInt8: {
        const int64_t scales_bytes = (m * int64_t(sizeof(float)) + 15) / 16 * 16;
        StagedOperand quantised(context_, scales_bytes + m * cols_ + 16);
        float* x_scales = quantised.as<float>();                                      // [m]
        int8_t* qx = reinterpret_cast<int8_t*>(quantised.as<char>() + scales_bytes);  // [m, k]
        quantize_activation_rows(context_.stream, x, m, cols_, ldx, qx, x_scales);
        if (int8_sums_on_tensor_cores(qx, m, y, ldy)) {
          dequantize_int8_sums(context_.stream, y, m, rows_, ldy, x_scales, scales_.data(),
                               epilogue.bias, epilogue.relu);
        } else {
          profiled_operation.rename(prepared_product_name(precision_, false, false));
          int8_product(context_.stream, qx, x_scales, weights_int8_.data(), scales_.data(), m,
                       rows_, cols_, y, ldy, epilogue.bias, epilogue.relu);
        }
        return;
      }
    }
  }
  // y = x16[m, k] (row stride ld16, in this matrix's 16-bit format) · Wᵀ, then the epilogue; in
  // bfloat16 only where it asks (cuBLASLt rounds in its epilogue, else a float result in scratch is
  // rounded as Backend::matmul's is, flushing results below the smallest normal float). Returns
  // whether cuBLASLt ran it.
  bool product_16_bits(const uint16_t* x16, int64_t ld16, int64_t m, float* y, int64_t ldy,
                       const MatmulEpilogue& epilogue) const {
    const bool bfloat16_output = epilogue.rounded_output != nullptr;
    if (lt_product(context_, m, rows_, cols_, x16, ld16, weights_16_bits_.data(), cols_,
                   blas_type(precision_),
                   bfloat16_output ? static_cast<void*>(epilogue.rounded_output) : y,
                   bfloat16_output ? CUDA_R_16BF : CUDA_R_32F, ldy, epilogue.bias, nullptr,
                   epilogue.relu))
      return true;
    Scratch result(context_, bfloat16_output ? m * ldy * int64_t(sizeof(float)) : 0);  // [m, ldy]
    float* target = bfloat16_output ? result.as<float>() : y;
    blas_product(context_, false, true, m, rows_, cols_, 1.f, x16, ld16, weights_16_bits_.data(),
                 cols_, 0.f, target, ldy, blas_type(precision_));
    finish_epilogue(context_, target, ldy, epilogue, m, rows_);
    return false;
  }
  // y[m, rows] (row stride ldy) = qx[m, k] · W_int8ᵀ as exact int32 sums (in y's memory, for
  // dequantize_int8_sums), on cuBLAS's int8 tensor-core product as CTranslate2 runs it. Returns
  // false, having written nothing, where cuBLAS does not take the shape (its int8 operands'
  // rows must be multiples of 4 bytes, and 4-byte aligned, which qx and the weights are; a
  // shape it refuses all the same is left to int8_product too) or TFM_CUDA_INT8_TENSOR_CORES=0
  // keeps int8_product, to compare; both give the same sums, which are exact.
  bool int8_sums_on_tensor_cores(const int8_t* qx, int64_t m, float* y, int64_t ldy) const {
    static const bool enabled = !turned_off("TFM_CUDA_INT8_TENSOR_CORES");
    if (!enabled || cols_ % 4 != 0) return false;
    std::lock_guard<std::mutex> lock(context_.blas_mutex);
    const BlasLibrary& blas = blas_library();
    TFM_CUDA(blas.set_stream(context_.blas, context_.stream));
    const int32_t one = 1, zero = 0;  // CUBLAS_COMPUTE_32I's scalars are int32
    const cublasStatus_t status =
        blas.gemm_ex(context_.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows_), int(m), int(cols_), &one,
                     weights_int8_.data(), CUDA_R_8I, int(cols_), qx, CUDA_R_8I, int(cols_), &zero,
                     y, CUDA_R_32I, int(ldy), CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)
      return false;
    TFM_CUDA(status);
    return true;
  }
  void read_rows(const int32_t* ids, int64_t count, float* out) const override {
    if (precision_ != Precision::kFloat32)
      throw std::logic_error("read_rows: only a float32 prepared matrix keeps its rows exactly");
    context_.activate();
    cuda::read_rows(context_.stream, weights_float_.data(), ids, count, cols_, out);
  }

  const Context& context_;
  int64_t rows_, cols_;
  Precision precision_;
  DeviceBuffer<float> weights_float_;       // [rows, cols] (float32)
  DeviceBuffer<uint16_t> weights_16_bits_;  // [rows, cols] (bfloat16 or float16)
  DeviceBuffer<int8_t> weights_int8_;       // [rows, cols] (int8)
  DeviceBuffer<float> scales_;              // [rows] (int8)
};

int64_t total_rows(const std::vector<int64_t>& part_rows) {
  int64_t rows = 0;
  for (int64_t r : part_rows) rows += r;
  return rows;
}

}  // namespace

const char* training_product_name(Precision precision, bool bfloat16_output, bool on_lt) {
  switch (precision) {
    case Precision::kFloat32:
      return on_lt ? "matmul float32 (cuBLASLt epilogue)" : "matmul float32";
    case Precision::kBFloat16:
      if (bfloat16_output)
        return on_lt ? "matmul bfloat16 (bfloat16 out, cuBLASLt)"
                     : "matmul bfloat16 (bfloat16 out)";
      return on_lt ? "matmul bfloat16 (cuBLASLt epilogue)" : "matmul bfloat16";
    case Precision::kFloat16:
      return on_lt ? "matmul float16 (cuBLASLt epilogue)" : "matmul float16";
    case Precision::kInt8:
      break;
  }
  return "matmul";
}

namespace {

// Notes whether cuBLASLt's forward product wrote the ReLU mask at `mask` for an [m, n] output
// (Context::relu_masks): a forward that took another path leaves it unwritten, and cuBLASLt's
// layout is its own, so the backward product reads a mask only where the forward of its shape
// wrote it.
void note_relu_mask(const Context& c, const void* mask, int64_t m, int64_t n, bool written) {
  std::lock_guard<std::mutex> lock(c.relu_masks_mutex);
  if (written)
    c.relu_masks[mask] = {m, n};
  else
    c.relu_masks.erase(mask);
}
bool relu_mask_written(const Context& c, const void* mask, int64_t m, int64_t n) {
  std::lock_guard<std::mutex> lock(c.relu_masks_mutex);
  const auto found = c.relu_masks.find(mask);
  return found != c.relu_masks.end() && found->second == std::make_pair(m, n);
}

// matmul's product and epilogue, the ReLU mask aside: `relu_mask` (LtReluMask) is written or read
// where cuBLASLt's product rounding its own output takes it (*mask_used then true); else the
// product goes as it would without it. With a_column_sums ([m], trans_a), where the product runs
// on cuBLASLt's tuned algorithm with its bias-gradient epilogue, A's sums over its k rows (as the
// product reads A) are written there too (*sums_written then true).
bool product(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta,
             float* out, int64_t ldc, Precision precision, const MatmulEpilogue& epilogue,
             const LtReluMask& relu_mask, bool* mask_used, float* a_column_sums = nullptr,
             bool* sums_written = nullptr) {
  *mask_used = false;
  if (sums_written) *sums_written = false;
  if (precision == Precision::kInt8)
    throw std::invalid_argument("matmul: int8 is for prepared weights only");
  if (epilogue.rounded_output && (precision != Precision::kBFloat16 || beta != 0.f))
    throw std::invalid_argument("matmul: a bfloat16 output needs a bfloat16 product with beta 0");
  if (m == 0 || n == 0) return false;
  c.activate();
  // A linear layer's y = x·Wᵀ + b (and its ReLU) with a float output: the epilogue inside
  // cuBLASLt's product where it has an algorithm for it, instead of a pass over y after it (the
  // stacked Q|K|V product's bias pass read and wrote 157 MB of a base model's training step).
  const bool epilogue_in_lt = !trans_a && trans_b && alpha == 1.f && beta == 0.f && k > 0 &&
                              (epilogue.bias || epilogue.relu) && !epilogue.rounded_output;
  // A bfloat16 output the product may round itself (MatmulEpilogue::rounded_by_the_product):
  // cuBLASLt writes it directly where it has an algorithm, instead of a float block and a pass
  // (a bfloat16 training step's logits: 537 MB of float written and read back a chunk; fc1's
  // hidden layer, with its bias in bfloat16 and the ReLU inside the product; the feed-forward's
  // hidden gradient, dy·W, whose 210 MB of float a base-model layer took twice that to read back).
  const bool lt_rounds = !trans_a && alpha == 1.f && k > 0 && epilogue.rounded_by_the_product &&
                         epilogue.rounded_output && (!epilogue.bias || epilogue.rounded_bias);
  // Else a bfloat16 output goes to a float block first, with C's row stride: cuBLAS may pick
  // another algorithm for another stride, and the bits must be the float path's. The block is
  // taken when cuBLAS is about to write it.
  std::optional<Scratch> result;  // [m, ldc]
  float* target = out;
  const int64_t ld_target = ldc;
  const auto float_target = [&] {
    if (epilogue.rounded_output && !result) {
      result.emplace(c, m * ldc * int64_t(sizeof(float)));
      target = result->as<float>();
    }
    return target;
  };
  // The product of the operands as they are to be read (`type`, their strides): inside
  // cuBLASLt with the epilogue, or rounding its output, where that applies (returns true), else
  // cuBLAS into the float target.
  const auto multiply = [&](const void* a_read, int64_t a_ld, const void* b_read, int64_t b_ld,
                            cudaDataType_t type) {
    if (epilogue_in_lt && lt_product(c, m, n, k, a_read, a_ld, b_read, b_ld, type, out, CUDA_R_32F,
                                     ldc, epilogue.bias, nullptr, epilogue.relu,
                                     WeightLayout::kOutputsByInputs, {}, epilogue.may_tune))
      return true;
    const auto lt_rounded = [&](const LtReluMask& mask) {
      return lt_product(c, m, n, k, a_read, a_ld, b_read, b_ld, type, epilogue.rounded_output,
                        CUDA_R_16BF, ldc, nullptr, epilogue.bias ? epilogue.rounded_bias : nullptr,
                        epilogue.relu,
                        trans_b ? WeightLayout::kOutputsByInputs : WeightLayout::kInputsByOutputs,
                        mask, epilogue.may_tune);
    };
    if (lt_rounds && relu_mask.mask && lt_rounded(relu_mask)) {
      *mask_used = true;
      return true;
    }
    if (lt_rounds && lt_rounded({})) return true;
    // The product alone, its epilogue (if any) a pass after it: on cuBLASLt's tuned algorithm
    // where training's shape is tuned (with A's column sums inside it where asked and cuBLASLt
    // has an algorithm for that), else cuBLAS's choice.
    if (epilogue.may_tune && lt_tunes(m, n, k)) {
      if (a_column_sums &&
          lt_tuned_product(c, trans_a, trans_b, m, n, k, alpha, a_read, a_ld, b_read, b_ld, beta,
                           float_target(), ld_target, type, a_column_sums)) {
        *sums_written = true;
        return false;
      }
      if (lt_tuned_product(c, trans_a, trans_b, m, n, k, alpha, a_read, a_ld, b_read, b_ld, beta,
                           float_target(), ld_target, type))
        return false;
    }
    blas_product(c, trans_a, trans_b, m, n, k, alpha, a_read, a_ld, b_read, b_ld, beta,
                 float_target(), ld_target, type);
    return false;
  };
  if (k == 0) {
    scale_matrix(c.stream, float_target(), ld_target, m, n, epilogue.rounded_output ? 0.f : beta);
  } else if (precision == Precision::kFloat32) {
    if (multiply(a.values, lda, b.values, ldb, CUDA_R_32F)) return true;
  } else {
    // Each operand rounded into a dense copy unless it came rounded (bfloat16 copies only):
    // stored [rows, cols] with row stride cols, or the given copy's (rounded_stride).
    const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    const bool bfloat16 = precision == Precision::kBFloat16;
    const uint16_t* a16 = bfloat16 ? a.rounded : nullptr;
    const uint16_t* b16 = bfloat16 ? b.rounded : nullptr;
    int64_t a16_ld = a.rounded_stride(a_cols), b16_ld = b.rounded_stride(b_cols);
    if ((!a16 && !a.values) || (!b16 && !b.values))
      throw std::invalid_argument(
          "matmul: an operand without values (a float16 product rounds "
          "its operands itself)");
    Scratch a_copy(c, a16 ? 0 : a_rows * a_cols * int64_t(sizeof(uint16_t)));
    Scratch b_copy(c, b16 ? 0 : b_rows * b_cols * int64_t(sizeof(uint16_t)));
    if (!a16) {
      round_to_16_bits(c.stream, a.values, a_rows, a_cols, lda, precision, a_copy.as<uint16_t>(),
                       a_cols);
      a16 = a_copy.as<uint16_t>();
      a16_ld = a_cols;
    }
    if (!b16) {
      round_to_16_bits(c.stream, b.values, b_rows, b_cols, ldb, precision, b_copy.as<uint16_t>(),
                       b_cols);
      b16 = b_copy.as<uint16_t>();
      b16_ld = b_cols;
    }
    if (multiply(a16, a16_ld, b16, b16_ld, blas_type(precision))) return true;
  }
  finish_epilogue(c, target, ld_target, epilogue, m, n);  // bias, ReLU, rounding: one pass
  return false;
}

}  // namespace

bool matmul(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta,
            float* out, int64_t ldc, Precision precision, const MatmulEpilogue& epilogue,
            bool* relu_mask_used) {
  check_relu_gate(epilogue, beta, ldc, n);
  check_column_sums(epilogue, trans_a);
  bool unused = false;
  bool& mask_used = relu_mask_used ? *relu_mask_used : unused;
  const MatmulEpilogue plain = product_epilogue(epilogue);
  if (epilogue.a_column_sums) {
    // A weight gradient's product with its bias gradient: the sums inside cuBLASLt's tuned
    // product (training's large ones: lt_tunes) where A is read as its given bfloat16 copy (what
    // bias_backward sums too) and unscaled (alpha 1: the epilogue sums the operand as it is), into
    // a scratch added after it (the epilogue writes); else bias_backward's pass over A after the
    // product. TFM_CUDA_BIAS_GRADIENT_IN_PRODUCT=0 always takes the pass, to compare.
    static const bool in_product = !turned_off("TFM_CUDA_BIAS_GRADIENT_IN_PRODUCT");
    const bool fused = in_product && precision == Precision::kBFloat16 && a.rounded &&
                       alpha == 1.f && epilogue.may_tune && m > 0 && n > 0 && k > 0 &&
                       lt_tunes(m, n, k);
    Scratch sums(c, fused ? m * int64_t(sizeof(float)) : 0);  // [m]
    bool sums_written = false;
    const bool on_lt =
        product(c, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc, precision,
                plain, {}, &mask_used, fused ? sums.as<float>() : nullptr, &sums_written);
    if (sums_written)
      add(c.stream, epilogue.a_column_sums, sums.as<float>(), m);
    else
      bias_backward(c, a.values, a.rounded, k, m, a.read_stride(m, lda), epilogue.a_column_sums);
    return on_lt;
  }
  if (!epilogue.relu_output) {
    // fc1's product with its ReLU: the mask written inside cuBLASLt's product, where it takes it.
    const LtReluMask record{epilogue.relu ? epilogue.relu_mask : nullptr, true, nullptr};
    const bool on_lt = product(c, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc,
                               precision, plain, record, &mask_used);
    if (record.mask) note_relu_mask(c, record.mask, m, n, mask_used);
    return on_lt;
  }
  // The ReLU's gradient (fc2's dy·W): inside cuBLASLt's product where the forward's wrote the
  // mask, with the bias gradient summed there in bfloat16 and added here; else the product, then
  // the ReLU's backward over its output in place.
  const bool written = epilogue.relu_mask && relu_mask_written(c, epilogue.relu_mask, m, n);
  std::optional<Scratch> bias_gradient;  // [n] bfloat16
  if (written && epilogue.bias_gradient) bias_gradient.emplace(c, n * int64_t(sizeof(uint16_t)));
  const LtReluMask gate{written ? epilogue.relu_mask : nullptr, false,
                        bias_gradient ? bias_gradient->as<uint16_t>() : nullptr};
  const bool on_lt = product(c, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc,
                             precision, plain, gate, &mask_used);
  if (!mask_used)
    relu_backward_bfloat16(c, nullptr, epilogue.relu_output, m, n, epilogue.rounded_output,
                           epilogue.bias_gradient);
  else if (bias_gradient)
    add_bfloat16(c.stream, epilogue.bias_gradient, bias_gradient->as<uint16_t>(), n);
  return on_lt;
}

std::unique_ptr<PreparedMatrix> prepare_matrix(const Backend& backend, const Context& c,
                                               const std::vector<const float*>& parts,
                                               const std::vector<int64_t>& part_rows, int64_t k,
                                               Precision precision) {
  if (parts.size() != part_rows.size())
    throw std::invalid_argument("prepare_matrix: one row count per part");
  c.activate();
  const int64_t rows = total_rows(part_rows);
  auto prepared = std::make_unique<CudaPreparedMatrix>(backend, c, rows, k, precision);
  int64_t row = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t n = part_rows[i];
    if (n == 0) continue;
    switch (precision) {
      case Precision::kFloat32:
        TFM_CUDA(cudaMemcpyAsync(prepared->weights_float_.data() + row * k, parts[i],
                                 size_t(n * k) * sizeof(float), cudaMemcpyDeviceToDevice,
                                 c.stream));
        break;
      case Precision::kBFloat16:
      case Precision::kFloat16:
        round_to_16_bits(c.stream, parts[i], n, k, k, precision,
                         prepared->weights_16_bits_.data() + row * k, k);
        break;
      case Precision::kInt8:
        quantize_weight_rows(c.stream, parts[i], n, k, prepared->weights_int8_.data() + row * k,
                             prepared->scales_.data() + row);
        break;
    }
    row += n;
  }
  return prepared;
}

std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const Backend& backend, const Context& c,
                                                    const std::vector<Int8Rows>& parts,
                                                    const std::vector<int64_t>& part_rows,
                                                    int64_t k) {
  if (parts.size() != part_rows.size())
    throw std::invalid_argument("prepare_int8_matrix: one row count per part");
  c.activate();
  const int64_t rows = total_rows(part_rows);
  auto prepared = std::make_unique<CudaPreparedMatrix>(backend, c, rows, k, Precision::kInt8);
  int64_t row = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t n = part_rows[i];
    if (n == 0) continue;
    TFM_CUDA(cudaMemcpyAsync(prepared->weights_int8_.data() + row * k, parts[i].values,
                             size_t(n * k), cudaMemcpyDeviceToDevice, c.stream));
    TFM_CUDA(cudaMemcpyAsync(prepared->scales_.data() + row, parts[i].scales,
                             size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, c.stream));
    row += n;
  }
  return prepared;
}

}  // namespace cuda
}  // namespace tfm
