// The CUDA backend: Backend's operations as launches of this folder's kernels and cuBLAS
// products on one stream per GPU, its memory from the device's stream-ordered pool. The host
// waits only where a result must reach it (copies to the host, the loss totals, Σ x²).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "backend/cuda/blas_library.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/lt_product.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/nccl_collectives.h"
#include "backend/cuda/operation_profile.h"
#include "backend/cuda/operation_recording.h"
#include "tensor/error.h"

namespace tfm {
namespace cuda {

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: the allocation failed, the context is fine
    throw std::bad_alloc();
  }
  throw Error(std::string("CUDA: ") + call + ": " + cudaGetErrorString(status));
}
void check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuBLAS: ") + call + ": " + blas_library().status_string(status));
}
void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

void Context::wait_for_other_recording() const {
  const std::thread::id recorder = recording_thread.load(std::memory_order_acquire);
  if (recorder != std::thread::id() && recorder != std::this_thread::get_id()) {
    const std::lock_guard<std::mutex> until_it_ends(recording_mutex);
  }
}

void Context::activate() const {
  wait_for_other_recording();
  TFM_CUDA(cudaSetDevice(device));
  std::call_once(created, [this] {
    TFM_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TFM_CUDA(blas_library().create(&blas));
    TFM_CUDA(blas_library().set_stream(blas, stream));
    // The pool keeps what is freed: the next step's buffers come back without the driver.
    cudaMemPool_t pool;
    TFM_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep_everything = UINT64_MAX;
    TFM_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  });
}

bool Context::recording_here() const {
  return recording_thread.load(std::memory_order_acquire) == std::this_thread::get_id();
}

void Context::change_memory() const {
  if (recording_here()) throw RecordingRefused();
  memory_changes.fetch_add(1, std::memory_order_acq_rel);
}

Scratch::Scratch(const Context& context, int64_t bytes) : context_(context) {
  if (bytes > 0) TFM_CUDA(cudaMallocAsync(&memory_, size_t(bytes), context.stream));
}
Scratch::~Scratch() {
  if (memory_) cudaFreeAsync(memory_, context_.stream);
}

StagedOperand::StagedOperand(const Context& context, int64_t bytes) : lock_(context.staging_mutex) {
  if (bytes > context.staging_bytes) {
    context.change_memory();
    if (context.staging) TFM_CUDA(cudaFreeAsync(context.staging, context.stream));
    context.staging = nullptr;
    context.staging_bytes = 0;
    TFM_CUDA(cudaMallocAsync(&context.staging, size_t(bytes), context.stream));
    context.staging_bytes = bytes;
  }
  memory_ = context.staging;
}

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) {
    c_.device = device;
    name_ = device == 0 ? "cuda" : "cuda:" + std::to_string(device);
  }

  std::string name() const override { return name_; }
  bool supports(Precision) const override { return true; }

  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue) const override {
    c_.activate();
    const bool bfloat16_output = epilogue.rounded_output != nullptr;
    cuda::ProfiledOperation profiled_operation(
        c_, cuda::training_product_name(precision, bfloat16_output, false), m, n, k);
    bool relu_mask_used = false;
    const bool on_lt = cuda::matmul(c_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                    ldc, precision, epilogue, &relu_mask_used);
    // fc1's product writing the ReLU's mask, and fc2's dy·W reading it or gating in a pass.
    if (epilogue.relu_output)
      profiled_operation.rename(relu_mask_used ? "matmul bfloat16 (ReLU gradient inside, cuBLASLt)"
                                : on_lt ? "matmul bfloat16 (bfloat16 out, cuBLASLt) + ReLU gradient"
                                        : "matmul bfloat16 (bfloat16 out) + ReLU gradient");
    else if (relu_mask_used)
      profiled_operation.rename("matmul bfloat16 (bfloat16 out, ReLU mask, cuBLASLt)");
    else if (on_lt)
      profiled_operation.rename(cuda::training_product_name(precision, bfloat16_output, true));
  }
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override {
    TFM_CUDA_OPERATION_SHAPED(
        c_, format == Precision::kFloat16 ? "round_to_float16" : "round_to_bfloat16", rows, cols);
    cuda::round_to_16_bits(c_.stream, x, rows, cols, ldx, format, out, cols);
  }
  void round_each_to_16_bits(const std::vector<RoundingJob>& jobs,
                             Precision format) const override {
    int64_t total = 0;
    for (const RoundingJob& job : jobs) total += std::max<int64_t>(job.count, 0);
    TFM_CUDA_OPERATION_SHAPED(
        c_, format == Precision::kFloat16 ? "round_each_to_float16" : "round_each_to_bfloat16",
        int64_t(jobs.size()), total);
    cuda::round_each_to_16_bits(c_.stream, jobs, format);
  }
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override {
    return cuda::prepare_matrix(*this, c_, parts, part_rows, k, precision);
  }
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override {
    return cuda::prepare_int8_matrix(*this, c_, parts, part_rows, k);
  }

  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override {
    c_.activate();
    cuda::ProfiledOperation profiled_operation(c_, "attention_forward", shape.batch * shape.heads,
                                               shape.query_len, shape.key_len);
    if (cuda::profiling() && cuda::tensor_core_attention_applies(c_, shape, mask, dropout))
      profiled_operation.rename(cuda::tensor_core_attention_name(true));
    cuda::attention_forward(c_, shape, mask, q, k, v, probs, out, dropout);
  }
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override {
    TFM_CUDA_OPERATION_SHAPED(c_, "attention_forward_16_bit_cache", shape.batch * shape.heads,
                              shape.query_len, shape.key_len);
    cuda::attention_forward_16_bit_cache(c_, shape, mask, q, format, k, v, probs, out);
  }
  bool attention_reads_rounded_inputs(const AttentionShape& shape, const AttentionMask& mask,
                                      const AttentionDropout& dropout) const override {
    return cuda::attention_reads_rounded_inputs(c_, shape, mask, dropout);
  }
  int64_t attention_weights_floats(const AttentionShape& shape, const AttentionMask& mask,
                                   const AttentionDropout& dropout) const override {
    return cuda::attention_weights_floats(c_, shape, mask, dropout);
  }
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override {
    c_.activate();
    cuda::ProfiledOperation profiled_operation(c_, "attention_backward", shape.batch * shape.heads,
                                               shape.query_len, shape.key_len);
    if (cuda::profiling() && probs && cuda::tensor_core_attention_applies(c_, shape, mask, dropout))
      profiled_operation.rename(cuda::tensor_core_attention_name(false));
    cuda::attention_backward(c_, shape, mask, q, k, v, probs, dropout, d_out, dq, dk, dv,
                             d_additive_v);
  }

  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override {
    TFM_CUDA_OPERATION(c_, "layer_norm");
    cuda::layer_norm(c_.stream, x, gamma, beta, y, rows, cols, eps, mean, rstd);
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override {
    TFM_CUDA_OPERATION(c_, "layer_norm_backward");
    cuda::layer_norm_backward(c_, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols,
                              accumulate);
  }
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override {
    TFM_CUDA_OPERATION_SHAPED(c_, "residual_layer_norm", rows, cols);
    cuda::residual_layer_norm(c_.stream, f, x, rows, cols, p, key, mask, gamma, beta, eps, y, mean,
                              rstd, rounded_y);
  }
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override {
    check_gradient_written("residual_layer_norm_backward", d_f, rounded_d_f);
    TFM_CUDA_OPERATION_SHAPED(c_, "residual_layer_norm_backward", rows, cols);
    cuda::residual_layer_norm_backward(c_, dy, sum, mean, rstd, gamma, dgamma, dbeta, mask, p, key,
                                       d_f, rounded_d_f, d_f_column_sums, rows, cols);
  }
  void add(float* y, const float* x, int64_t n) const override {
    TFM_CUDA_OPERATION(c_, "add");
    cuda::add(c_.stream, y, x, n);
  }
  void scale(float* x, float s, int64_t n) const override {
    TFM_CUDA_OPERATION(c_, "scale");
    cuda::scale(c_.stream, x, s, n);
  }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override {
    TFM_CUDA_OPERATION(c_, "add_bias");
    cuda::bias_relu_epilogue(c_.stream, y, cols, bias, false, rows, cols);
  }
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override {
    TFM_CUDA_OPERATION(c_, "add_bias_activation");
    cuda::add_bias_activation(c_.stream, pre, bias, out, rows, cols, true, act);
  }
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override {
    TFM_CUDA_OPERATION(c_, "activation_backward");
    cuda::activation_backward(c_.stream, d, pre_activation, n, act);
  }
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d,
                              float* column_sums) const override {
    check_gradient_written("relu_backward_bfloat16", nullptr, rounded_d);
    TFM_CUDA_OPERATION_SHAPED(c_, "relu_backward_bfloat16", rows, cols);
    cuda::relu_backward_bfloat16(c_, d, relu_output, rows, cols, rounded_d, column_sums);
  }
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override {
    TFM_CUDA_OPERATION_SHAPED(c_, "bias_backward", rows, cols);
    cuda::bias_backward(c_, dy, rounded_dy, rows, cols, ld, dbias);
  }

  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override {
    TFM_CUDA_OPERATION(c_, "dropout_mask");
    cuda::dropout_mask(c_.stream, mask, n, p, key);
  }
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override {
    TFM_CUDA_OPERATION(c_, "apply_dropout");
    cuda::apply_dropout(c_.stream, x, mask, n, p, key);
  }

  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override {
    TFM_CUDA_OPERATION(c_, "embedding_forward");
    cuda::embedding_forward(c_.stream, table, d, Int8Rows{}, positions, ids, rows, len, d, scale,
                            first_position, out);
  }
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override {
    TFM_CUDA_OPERATION(c_, "embedding_forward_int8");
    cuda::embedding_forward(c_.stream, nullptr, d, table, positions, ids, rows, len, d, scale,
                            first_position, out);
  }
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override {
    TFM_CUDA_OPERATION(c_, "embedding_forward_prepared");
    cuda::embedding_forward_prepared(c_.stream, table, positions, ids, rows, len, d, scale,
                                     first_position, out);
  }
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override {
    TFM_CUDA_OPERATION(c_, "embedding_backward");
    cuda::embedding_backward(c_.stream, d_out, ids, rows, len, d, scale, first_position, d_table,
                             d_positions);
  }

  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override {
    TFM_CUDA_OPERATION(c_, "log_softmax_pick");
    cuda::log_softmax_pick(c_.stream, logits, targets, rows, cols, out);
  }
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override {
    TFM_CUDA_OPERATION_SHAPED(c_,
                              logits ? "cross_entropy_forward_backward"
                                     : "cross_entropy_forward_backward (bfloat16 logits)",
                              rows, vocab);
    cuda::cross_entropy_forward_backward(c_.stream, logits, targets, rows, vocab, smoothing,
                                         grad_scale, row_totals, rounded_gradient);
  }
  // 512 MiB: a base model's 25,000-token batch in 8 chunks of ~3,600 rows, each product and
  // softmax large enough to fill the device, where 16 MB chunks (the CPU's) made ~230 launches
  // of each per step.
  int64_t logits_chunk_bytes() const override { return int64_t(512) << 20; }
  // cuBLASLt's bit-mask of the feed-forward's ReLU (lt_product.h), which fc2's input-gradient
  // product reads to apply the ReLU's gradient and sum fc1's bias gradient inside itself.
  int64_t relu_mask_bytes(int64_t m, int64_t n) const override {
    return cuda::kept_relu_mask_bytes(m, n);
  }
  // The kernels that drop draw their keep decisions from the key again where the backward needs
  // them (dropout_keeps: a few integer operations an element, where a kept mask costs its bytes
  // written and read back: 13 MB each way a sublayer of a base-model batch).
  // TFM_CUDA_DRAWN_DROPOUT=0 keeps the masks (a byte an element), to compare.
  int64_t dropout_mask_bytes(int64_t n) const override {
    static const bool drawn = !turned_off("TFM_CUDA_DRAWN_DROPOUT");
    return drawn ? 0 : n;
  }

  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override {
    TFM_CUDA_OPERATION_SHAPED(c_, "best_tokens", rows, vocab, keep);
    cuda::best_tokens(c_.stream, scores, rows, vocab, keep, banned, values, tokens, log_sums);
  }
  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t total,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override {
    TFM_CUDA_OPERATION(c_, "adam_update");
    cuda::adam_update(c_.stream, params, offsets, count, total, grad, m, v, h, step);
  }
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override {
    TFM_CUDA_OPERATION(c_, "sgd_update");
    cuda::sgd_update(c_.stream, param, grad, n, lr);
  }
  double sum_of_squares(const float* x, int64_t n) const override {
    TFM_CUDA_OPERATION(c_, "sum_of_squares");
    return cuda::sum_of_squares(c_, x, n);
  }

  void* allocate(int64_t bytes, bool zeroed) const override {
    TFM_CUDA_OPERATION(c_, "allocate");
    c_.change_memory();
    void* memory = nullptr;
    // 0 bytes: still a unique block.
    TFM_CUDA(cudaMallocAsync(&memory, size_t(bytes > 0 ? bytes : 1), c_.stream));
    if (zeroed && bytes > 0) TFM_CUDA(cudaMemsetAsync(memory, 0, size_t(bytes), c_.stream));
    return memory;
  }
  void deallocate(void* memory) const override {
    // Never throws (it runs in destructors, some at exit, when the runtime may be unloading);
    // a failure here is the device's, and the next operation reports it.
    if (!memory) return;
    c_.wait_for_other_recording();
    if (cudaSetDevice(c_.device) != cudaSuccess) return;
    if (c_.recording_here()) {  // freed when the capture ends, which then keeps nothing
      c_.frees_after_recording.push_back(memory);
      return;
    }
    c_.memory_changes.fetch_add(1, std::memory_order_acq_rel);
    const ProfiledOperation profiled_operation(c_, "deallocate");
    cudaFreeAsync(memory, c_.stream);
  }
  bool memory_is_host() const override { return false; }
  std::unique_ptr<DeviceCollectives> join_collectives(int rank, int size,
                                                      const CollectiveBootstrap& bootstrap,
                                                      const CollectiveWait& wait,
                                                      std::string* why_not) const override {
    return cuda::join_nccl(c_, rank, size, bootstrap, wait, why_not);
  }
  // The device's default memory pool, which allocate's cudaMallocAsync draws from, and the
  // cuBLASLt workspace allocated beside it (cuBLAS's own, inside the library, is not seen).
  DeviceMemory device_memory() const override {
    c_.activate();
    cudaMemPool_t pool;
    TFM_CUDA(cudaDeviceGetDefaultMemPool(&pool, c_.device));
    const auto attribute = [&](cudaMemPoolAttr which) {
      uint64_t bytes = 0;
      TFM_CUDA(cudaMemPoolGetAttribute(pool, which, &bytes));
      return int64_t(bytes);
    };
    const int64_t workspace = cuda::lt_workspace_bytes(c_);
    DeviceMemory memory;
    memory.in_use = attribute(cudaMemPoolAttrUsedMemCurrent) + workspace;
    memory.peak_in_use = attribute(cudaMemPoolAttrUsedMemHigh) + workspace;
    memory.peak_reserved = attribute(cudaMemPoolAttrReservedMemHigh) + workspace;
    return memory;
  }
  void restart_profile() const override { cuda::restart_profile(); }
  bool records_operations() const override { return cuda::records_operations(); }
  std::shared_ptr<const RecordedOperations> run_and_record(
      const std::function<void()>& operations) const override {
    return cuda::run_and_record(c_, operations);
  }
  bool replay(const RecordedOperations& recording) const override {
    return cuda::replay(c_, recording);
  }

  void copy_bytes(const void* from, int64_t bytes, void* to) const override {
    if (bytes <= 0) return;
    TFM_CUDA_OPERATION(c_, "copy_bytes");
    TFM_CUDA(cudaMemcpyAsync(to, from, size_t(bytes), cudaMemcpyDeviceToDevice, c_.stream));
  }
  void copy_from_host(const void* host, int64_t bytes, void* device) const override {
    if (bytes <= 0) return;
    TFM_CUDA_OPERATION(c_, "copy_from_host");
    // From pageable memory the call returns once the host bytes are staged: `host` may change.
    TFM_CUDA(cudaMemcpyAsync(device, host, size_t(bytes), cudaMemcpyHostToDevice, c_.stream));
  }
  void copy_to_host(const void* device, int64_t bytes, void* host) const override {
    if (bytes <= 0) return;
    TFM_CUDA_OPERATION(c_, "copy_to_host");
    const ProfiledWait wait;
    TFM_CUDA(cudaMemcpyAsync(host, device, size_t(bytes), cudaMemcpyDeviceToHost, c_.stream));
    TFM_CUDA(cudaStreamSynchronize(c_.stream));
  }

  void copy(const float* x, int64_t n, float* y) const override {
    copy_bytes(x, n * int64_t(sizeof(float)), y);
  }
  void fill(float* y, int64_t n, float value) const override {
    TFM_CUDA_OPERATION(c_, "fill");
    cuda::fill(c_.stream, y, n, value);
  }
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override {
    TFM_CUDA_OPERATION(c_, "gather_rows");
    cuda::gather_rows(c_.stream, x, ldx, rows, count, d, y, ldy);
  }
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override {
    TFM_CUDA_OPERATION(c_, "scatter_rows");
    cuda::scatter_rows(c_.stream, x, ldx, rows, count, d, y, ldy);
  }
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override {
    TFM_CUDA_OPERATION(c_, "mean_of_row_groups");
    cuda::mean_of_row_groups(c_.stream, x, groups, group_size, cols, y);
  }
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override {
    TFM_CUDA_OPERATION(c_, "scatter_rows_to_16_bits");
    cuda::scatter_rows_to_16_bits(c_.stream, x, ldx, rows, count, d, format, y, ldy);
  }

 private:
  Context c_;
  std::string name_;
};

// Why there is no GPU, or empty when there is one.
std::string probe_reason(int* count) {
  *count = 0;
  const cudaError_t status = cudaGetDeviceCount(count);
  if (status != cudaSuccess) {
    *count = 0;
    cudaGetLastError();
    return std::string("no usable CUDA GPU (the CUDA runtime says: ") + cudaGetErrorString(status) +
           ")";
  }
  if (*count == 0) return "no CUDA GPU: the CUDA runtime sees no device";
  return "";
}

struct Registry {
  std::vector<const Backend*> backends;
  std::string reason;
  Registry() {
    int count = 0;
    reason = probe_reason(&count);
    // Never destroyed: a backend's stream and pool must outlive every static buffer freed at exit.
    for (int device = 0; device < count; ++device) backends.push_back(new CudaBackend(device));
  }
};

const Registry& registry() {
  static const Registry instance;
  return instance;
}

}  // namespace
}  // namespace cuda

const std::vector<const Backend*>& cuda_backends() {
  return cuda::registry().backends;
}
std::string cuda_unavailable_reason() {
  return cuda::registry().reason;
}

}  // namespace tfm
