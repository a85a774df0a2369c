// EmulatedCudaBackend (emulated_cuda_backend.h): the CUDA backend's kernels and products,
// compiled for the CPU (emulated_cuda_*.cpp), behind the Backend interface. Each operation below
// calls the host function of src/backend/cuda that CudaBackend (cuda_backend.cu) calls for it,
// with the same arguments; memory is the host's (guard-paged). What else those files call from
// the backend's other files is defined at the end, for the emulated device.
#include "emulated_cuda_backend.h"

#include "guard_page_backend.h"
// The emulation, after which `cuda` names tfm::emulated_cuda,
#include "emulated_cuda.h"
// so that these are the emulated copies' declarations.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/lt_product.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/operation_profile.h"

namespace tfm {

namespace {

class EmulatedCudaBackend final : public Backend {
 public:
  std::string name() const override { return "emulated_cuda"; }
  // Its memory: blocks ending at a guard page, "not the host's" (guard_page_backend.h), so that
  // backend_ops stages every call through HostStagedBackend as it stages a GPU's, outputs a
  // kernel leaves alone come back as staged, and a kernel reading or writing past a block faults.
  bool memory_is_host() const override { return false; }
  void* allocate(int64_t bytes, bool zeroed) const override {
    return memory_.allocate(bytes, zeroed);
  }
  void deallocate(void* memory) const override { memory_.deallocate(memory); }
  void copy_bytes(const void* from, int64_t bytes, void* to) const override {
    memory_.copy_bytes(from, bytes, to);
  }
  void copy_from_host(const void* host, int64_t bytes, void* device) const override {
    memory_.copy_from_host(host, bytes, device);
  }
  void copy_to_host(const void* device, int64_t bytes, void* host) const override {
    memory_.copy_to_host(device, bytes, host);
  }
  void copy(const float* x, int64_t n, float* y) const override { memory_.copy(x, n, y); }

  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override {
    emulated_cuda::attention_forward(context_, shape, mask, q, k, v, probs, out, dropout);
  }
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override {
    emulated_cuda::attention_backward(context_, shape, mask, q, k, v, probs, dropout, d_out, dq, dk,
                                      dv, d_additive_v);
  }
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override {
    emulated_cuda::round_to_16_bits(context_.stream, x, rows, cols, ldx, format, out, cols);
  }
  void round_each_to_16_bits(const std::vector<RoundingJob>& jobs,
                             Precision format) const override {
    emulated_cuda::round_each_to_16_bits(context_.stream, jobs, format);
  }
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override {
    emulated_cuda::attention_forward_16_bit_cache(context_, shape, mask, q, format, k, v, probs,
                                                  out);
  }
  bool attention_reads_rounded_inputs(const AttentionShape& shape, const AttentionMask& mask,
                                      const AttentionDropout& dropout) const override {
    return emulated_cuda::attention_reads_rounded_inputs(context_, shape, mask, dropout);
  }
  int64_t attention_weights_floats(const AttentionShape& shape, const AttentionMask& mask,
                                   const AttentionDropout& dropout) const override {
    return emulated_cuda::attention_weights_floats(context_, shape, mask, dropout);
  }
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override {
    emulated_cuda::layer_norm(context_.stream, x, gamma, beta, y, rows, cols, eps, mean, rstd);
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override {
    emulated_cuda::layer_norm_backward(context_, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows,
                                       cols, accumulate);
  }
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override {
    emulated_cuda::residual_layer_norm(context_.stream, f, x, rows, cols, p, key, mask, gamma, beta,
                                       eps, y, mean, rstd, rounded_y);
  }
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override {
    check_gradient_written("residual_layer_norm_backward", d_f, rounded_d_f);
    emulated_cuda::residual_layer_norm_backward(context_, dy, sum, mean, rstd, gamma, dgamma, dbeta,
                                                mask, p, key, d_f, rounded_d_f, d_f_column_sums,
                                                rows, cols);
  }
  void add(float* y, const float* x, int64_t n) const override {
    emulated_cuda::add(context_.stream, y, x, n);
  }
  void scale(float* x, float s, int64_t n) const override {
    emulated_cuda::scale(context_.stream, x, s, n);
  }
  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override {
    emulated_cuda::bias_relu_epilogue(context_.stream, y, cols, bias, false, rows, cols);
  }
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override {
    emulated_cuda::add_bias_activation(context_.stream, pre, bias, out, rows, cols, true, act);
  }
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override {
    emulated_cuda::activation_backward(context_.stream, d, pre_activation, n, act);
  }
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d,
                              float* column_sums) const override {
    check_gradient_written("relu_backward_bfloat16", nullptr, rounded_d);
    emulated_cuda::relu_backward_bfloat16(context_, d, relu_output, rows, cols, rounded_d,
                                          column_sums);
  }
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override {
    emulated_cuda::bias_backward(context_, dy, rounded_dy, rows, cols, ld, dbias);
  }
  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override {
    emulated_cuda::dropout_mask(context_.stream, mask, n, p, key);
  }
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override {
    emulated_cuda::apply_dropout(context_.stream, x, mask, n, p, key);
  }
  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override {
    emulated_cuda::embedding_forward(context_.stream, table, d, Int8Rows{}, positions, ids, rows,
                                     len, d, scale, first_position, out);
  }
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override {
    emulated_cuda::embedding_forward(context_.stream, nullptr, d, table, positions, ids, rows, len,
                                     d, scale, first_position, out);
  }
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override {
    emulated_cuda::embedding_forward_prepared(context_.stream, table, positions, ids, rows, len, d,
                                              scale, first_position, out);
  }
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override {
    emulated_cuda::embedding_backward(context_.stream, d_out, ids, rows, len, d, scale,
                                      first_position, d_table, d_positions);
  }
  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override {
    emulated_cuda::log_softmax_pick(context_.stream, logits, targets, rows, cols, out);
  }
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override {
    emulated_cuda::cross_entropy_forward_backward(context_.stream, logits, targets, rows, vocab,
                                                  smoothing, grad_scale, row_totals,
                                                  rounded_gradient);
  }
  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override {
    emulated_cuda::best_tokens(context_.stream, scores, rows, vocab, keep, banned, values, tokens,
                               log_sums);
  }
  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t total,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override {
    emulated_cuda::adam_update(context_.stream, params, offsets, count, total, grad, m, v, h, step);
  }
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override {
    emulated_cuda::sgd_update(context_.stream, param, grad, n, lr);
  }
  double sum_of_squares(const float* x, int64_t n) const override {
    return emulated_cuda::sum_of_squares(context_, x, n);
  }
  void fill(float* y, int64_t n, float value) const override {
    emulated_cuda::fill(context_.stream, y, n, value);
  }
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override {
    emulated_cuda::gather_rows(context_.stream, x, ldx, rows, count, d, y, ldy);
  }
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override {
    emulated_cuda::scatter_rows(context_.stream, x, ldx, rows, count, d, y, ldy);
  }
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override {
    emulated_cuda::mean_of_row_groups(context_.stream, x, groups, group_size, cols, y);
  }
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override {
    emulated_cuda::scatter_rows_to_16_bits(context_.stream, x, ldx, rows, count, d, format, y, ldy);
  }

  // The products of matmul.cu and lt_product.cu, on the emulated cuBLAS and cuBLASLt, in every
  // precision, as CudaBackend's.
  bool supports(Precision) const override { return true; }
  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue) const override {
    emulated_cuda::matmul(context_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                          precision, epilogue);
  }
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override {
    return emulated_cuda::prepare_matrix(*this, context_, parts, part_rows, k, precision);
  }
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override {
    return emulated_cuda::prepare_int8_matrix(*this, context_, parts, part_rows, k);
  }
  int64_t relu_mask_bytes(int64_t m, int64_t n) const override {
    return emulated_cuda::kept_relu_mask_bytes(m, n);
  }
  int64_t dropout_mask_bytes(int64_t) const override { return 0; }  // as the CUDA backend

 private:
  GuardPageBackend memory_;
  emulated_cuda::Context context_;  // its stream null: every launch runs before it returns
};

}  // namespace

const Backend& emulated_cuda_backend() {
  static const EmulatedCudaBackend backend;
  return backend;
}

// The rest of the backend the kernels' and products' files call (cuda_backend.cu,
// operation_profile.cu), for the emulated device; cuBLAS and cuBLASLt are
// tests/emulated_cuda_blas.cpp's.
namespace cuda {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw Error(std::string("CUDA: ") + call + ": emulated failure");
}
void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS: ") + call + ": emulated failure");
}
void check_launch(const char*) {}

Scratch::Scratch(const Context& context, int64_t bytes) : context_(context) {
  memory_ = bytes > 0 ? std::malloc(size_t(bytes)) : nullptr;
  if (bytes > 0 && !memory_) throw std::bad_alloc();
  if (bytes > 0) std::memset(memory_, 0xFF, size_t(bytes));  // NaN where a kernel reads unwritten
}
Scratch::~Scratch() {
  std::free(memory_);
}

ProfiledWait::ProfiledWait() {}
ProfiledWait::~ProfiledWait() {}

// The context's calls, for a device whose launches run before they return: nothing to make
// current, no stream to capture.
void Context::activate() const {}
bool Context::recording_here() const {
  return false;
}
void Context::change_memory() const {
  memory_changes.fetch_add(1, std::memory_order_acq_rel);
}

// The staging memory as CudaBackend lends it: the context's, grown to the largest asked for,
// NaN where a product would read what its conversion did not write.
StagedOperand::StagedOperand(const Context& context, int64_t bytes) : lock_(context.staging_mutex) {
  if (bytes > context.staging_bytes) {
    context.change_memory();
    std::free(context.staging);
    context.staging = std::malloc(size_t(bytes));
    if (!context.staging) throw std::bad_alloc();
    context.staging_bytes = bytes;
  }
  if (bytes > 0) std::memset(context.staging, 0xFF, size_t(bytes));
  memory_ = context.staging;
}

ProfiledOperation::ProfiledOperation(const Context&, const char*, int64_t, int64_t, int64_t) {}
ProfiledOperation::~ProfiledOperation() {}

}  // namespace cuda
}  // namespace tfm
