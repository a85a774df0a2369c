// The CPU backend: Backend's operations as calls into the CPU kernels of this folder (oneDNN
// products, SIMD/OpenMP loops). Nothing is computed here that a kernel file does not define,
// except the plain row copies.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/best_tokens.h"
#include "backend/cpu/cross_entropy.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/embedding.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/optimizer.h"
#include "backend/cpu/parallel_threshold.h"

namespace tfm {

namespace {

// Blocks of kHugePageBlockBytes and more (training's activation arena and its weights, gradients
// and Adam moments, one block each; in inference only large tables, such as the embeddings of a
// big vocabulary) ask the kernel for transparent huge pages where it gives them on request
// (/sys/kernel/mm/transparent_hugepage/enabled "madvise", Debian's default): 2 MiB pages instead
// of 4 KiB ones for the memory-bound passes over them (the base model's bfloat16 training step
// measured 2.5% faster). The advice covers the whole 2 MiB pages inside the block and stays on
// that memory when it is freed and reused (the heap keeps it: tensor/memory_budget.cpp); pages
// already touched (a reused, zeroed block) stay small until the kernel merges them; where the
// kernel declines the advice, nothing changes.
constexpr size_t kHugePageBlockBytes = size_t(32) << 20;
void advise_huge_pages(void* memory, size_t bytes) {
  constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(memory) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(memory) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool supports(Precision precision) const override {
    switch (precision) {
      case Precision::kFloat32:
        return true;
      case Precision::kBFloat16:
        return bfloat16_supported();
      case Precision::kInt8:
        return int8_supported();
      case Precision::kFloat16:
        return false;
    }
    return false;
  }

  std::string unsupported_reason(Precision precision) const override {
    switch (precision) {
      case Precision::kBFloat16:
        return "needs a CPU with AVX512-BF16 instructions";
      case Precision::kInt8:
        return "needs a CPU with int8 dot-product instructions (AVX512-VNNI or AVX-VNNI)";
      case Precision::kFloat16:
        return "runs on GPUs only (as in CTranslate2); bfloat16 and int8_bfloat16 are the CPU's "
               "16-bit compute types";
      default:
        return Backend::unsupported_reason(precision);
    }
  }

  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue) const override {
    check_relu_gate(epilogue, beta, ldc, n);
    check_column_sums(epilogue, trans_a);
    // A ReLU gate: the product, then the ReLU's backward over its output in place (the CPU keeps
    // no record of the forward's ReLU: relu_mask_bytes 0). A's column sums: a pass after it.
    const MatmulEpilogue product = product_epilogue(epilogue);
    if (precision == Precision::kBFloat16)
      gemm_bfloat16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, product);
    else
      gemm(trans_a, trans_b, m, n, k, alpha, a.values, lda, b.values, ldb, beta, c, ldc, precision,
           product);
    if (epilogue.relu_output)
      tfm::relu_backward_bfloat16(nullptr, epilogue.relu_output, m, n, epilogue.rounded_output,
                                  epilogue.bias_gradient);
    if (epilogue.a_column_sums)
      bias_backward(a.values, a.rounded, k, m, a.read_stride(m, lda), epilogue.a_column_sums);
  }
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override {
    round_rows(x, rows, cols, ldx, format, out);
  }
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override {
    return std::make_unique<PackedMatrix>(parts, part_rows, k, precision);
  }
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override {
    return std::make_unique<PackedMatrix>(parts, part_rows, k);
  }

  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override {
    check_rounded_attention_inputs("attention_forward", shape, false);  // float32 Q, K, V only
    tfm::attention_forward(shape, mask, q, k, v, probs, out, dropout);
  }
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override {
    check_rounded_attention_inputs("attention_forward_16_bit_cache", shape,
                                   false);  // float32 Q, K, V only
    tfm::attention_forward_16_bit_cache(shape, mask, q, format, k, v, probs, out);
  }
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override {
    check_rounded_attention_inputs("attention_backward", shape, false,
                                   true);  // float32 Q, K, V only
    tfm::attention_backward(shape, mask, q, k, v, probs, dropout, d_out, dq, dk, dv, d_additive_v);
  }

  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override {
    tfm::layer_norm(x, gamma, beta, y, rows, cols, eps, mean, rstd);
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override {
    tfm::layer_norm_backward(dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols, accumulate);
  }
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override {
    tfm::residual_layer_norm(f, x, rows, cols, p, key, mask, gamma, beta, eps, y, mean, rstd,
                             rounded_y);
  }
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override {
    check_gradient_written("residual_layer_norm_backward", d_f, rounded_d_f);
    tfm::residual_layer_norm_backward(dy, sum, mean, rstd, gamma, dgamma, dbeta, mask, p, key, d_f,
                                      rounded_d_f, d_f_column_sums, rows, cols);
  }
  void add(float* y, const float* x, int64_t n) const override { add_inplace(y, x, n); }
  void scale(float* x, float s, int64_t n) const override { scale_inplace(x, s, n); }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override {
    tfm::add_bias(y, bias, rows, cols);
  }
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override {
    tfm::add_bias_activation(pre, bias, out, rows, cols, act);
  }
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override {
    tfm::activation_backward(d, pre_activation, n, act);
  }
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d,
                              float* column_sums) const override {
    check_gradient_written("relu_backward_bfloat16", nullptr, rounded_d);
    tfm::relu_backward_bfloat16(d, relu_output, rows, cols, rounded_d, column_sums);
  }
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override {
    tfm::bias_backward(dy, rounded_dy, rows, cols, ld, dbias);
  }

  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override {
    tfm::dropout_mask(mask, n, p, key);
  }
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override {
    tfm::apply_dropout(x, mask, n, p, key);
  }

  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override {
    tfm::embedding_forward(table, positions, ids, rows, len, d, scale, first_position, out);
  }
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override {
    tfm::embedding_forward(table, positions, ids, rows, len, d, scale, first_position, out);
  }
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override {
    if (table.cols() != d) throw std::invalid_argument("embedding_forward_prepared: width");
    table.read_rows(ids, rows, out);
    tfm::scale_and_add_positions(positions, rows, len, d, scale, first_position, out);
  }
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override {
    tfm::embedding_backward(d_out, ids, rows, len, d, scale, first_position, d_table, d_positions);
  }

  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override {
    tfm::log_softmax_pick(logits, targets, rows, cols, out);
  }
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override {
    if (!logits && !rounded_gradient && rows > 0)
      throw std::invalid_argument("cross_entropy_forward_backward: no logits");
    tfm::cross_entropy_forward_backward(logits, targets, rows, vocab, smoothing, grad_scale,
                                        row_totals, rounded_gradient);
  }

  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override {
    tfm::best_tokens(scores, rows, vocab, keep, banned, values, tokens, log_sums);
  }
  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override {
    for (int64_t i = 0; i < count; ++i)
      tfm::adam_update(params[i], grad + offsets[i], m + offsets[i], v + offsets[i],
                       offsets[i + 1] - offsets[i], h, step);
  }
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override {
    tfm::sgd_update(param, grad, n, lr);
  }
  double sum_of_squares(const float* x, int64_t n) const override {
    return tfm::sum_of_squares(x, n);
  }

  void* allocate(int64_t bytes, bool zeroed) const override {
    // Plain malloc, not aligned_alloc: a block freed by one pass (the encoder's) must fit the
    // next pass's request of the same size exactly (the decoder's caches), which an
    // over-aligned request (size + alignment) does not: beam 4 then held ~30 MiB more.
    const size_t size = size_t(std::max<int64_t>(bytes, 1));  // 0 bytes: still a unique block
    void* memory = zeroed ? std::calloc(size, 1) : std::malloc(size);
    if (!memory) throw std::bad_alloc();
    if (size >= kHugePageBlockBytes) advise_huge_pages(memory, size);
    return memory;
  }
  void deallocate(void* memory) const override { std::free(memory); }
  bool memory_is_host() const override { return true; }
  void copy_bytes(const void* from, int64_t bytes, void* to) const override {
    std::memcpy(to, from, size_t(bytes));
  }
  void copy_from_host(const void* host, int64_t bytes, void* device) const override {
    std::memcpy(device, host, size_t(bytes));
  }
  void copy_to_host(const void* device, int64_t bytes, void* host) const override {
    std::memcpy(host, device, size_t(bytes));
  }

  void copy(const float* x, int64_t n, float* y) const override {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  }
  void fill(float* y, int64_t n, float value) const override {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) y[i] = value;
  }
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override {
#pragma omp parallel for schedule(static) if (count * d >= kParallelElements)
    for (int64_t r = 0; r < count; ++r) std::copy_n(x + rows[r] * ldx, d, y + r * ldy);
  }
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override {
#pragma omp parallel for schedule(static) if (count * d >= kParallelElements)
    for (int64_t r = 0; r < count; ++r) std::copy_n(x + r * ldx, d, y + rows[r] * ldy);
  }
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override {
    const float inverse = 1.f / float(group_size);
#pragma omp parallel for schedule(static) if (groups * group_size * cols >= kParallelElements)
    for (int64_t g = 0; g < groups; ++g) {
      float* out = y + g * cols;  // [cols]
      const float* first = x + g * group_size * cols;
      std::copy_n(first, cols, out);
      for (int64_t k = 1; k < group_size; ++k)
        for (int64_t c = 0; c < cols; ++c) out[c] += first[k * cols + c];
      for (int64_t c = 0; c < cols; ++c) out[c] *= inverse;
    }
  }
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override {
    if (!is_16_bit_float(format))
      throw std::invalid_argument("scatter_rows_to_16_bits: the format is bfloat16 or float16");
#pragma omp parallel for schedule(static) if (count * d >= kParallelElements)
    for (int64_t r = 0; r < count; ++r)
      round_rows(x + r * ldx, 1, d, ldx, format, y + rows[r] * ldy);
  }

 private:
  // round_to_16_bits on the CPU.
  static void round_rows(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                         uint16_t* out) {
    if (format == Precision::kBFloat16)
      round_to_bfloat16(x, rows, cols, ldx, out, cols);
    else if (format == Precision::kFloat16)
      round_to_float16(x, rows, cols, ldx, out);
    else
      throw std::invalid_argument("round_to_16_bits: the format is bfloat16 or float16");
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace tfm
