// GuardPageBackend (guard_page_backend.h): cpu_backend()'s operations on blocks that end at a
// guard page, for the StagedCpu check of HostStagedBackend in tests/backend_ops_test.cpp.
#include "guard_page_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

namespace tfm {

namespace {
const Backend& cpu() {
  return cpu_backend();
}
}  // namespace

std::string GuardPageBackend::name() const {
  return cpu().name();
}
bool GuardPageBackend::supports(Precision precision) const {
  return cpu().supports(precision);
}
std::string GuardPageBackend::unsupported_reason(Precision precision) const {
  return cpu().unsupported_reason(precision);
}

void GuardPageBackend::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, MatmulOperand a, int64_t lda, MatmulOperand b,
                              int64_t ldb, float beta, float* c, int64_t ldc, Precision precision,
                              MatmulEpilogue epilogue) const {
  cpu().matmul(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision, epilogue);
}
void GuardPageBackend::round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx,
                                        Precision format, uint16_t* out) const {
  cpu().round_to_16_bits(x, rows, cols, ldx, format, out);
}
std::unique_ptr<PreparedMatrix> GuardPageBackend::prepare_matrix(
    const std::vector<const float*>& parts, const std::vector<int64_t>& part_rows, int64_t k,
    Precision precision) const {
  return cpu().prepare_matrix(parts, part_rows, k, precision);
}
std::unique_ptr<PreparedMatrix> GuardPageBackend::prepare_int8_matrix(
    const std::vector<Int8Rows>& parts, const std::vector<int64_t>& part_rows, int64_t k) const {
  return cpu().prepare_int8_matrix(parts, part_rows, k);
}

void GuardPageBackend::attention_forward(const AttentionShape& shape, const AttentionMask& mask,
                                         const float* q, const float* k, const float* v,
                                         float* probs, float* out,
                                         const AttentionDropout& dropout) const {
  cpu().attention_forward(shape, mask, q, k, v, probs, out, dropout);
}
void GuardPageBackend::attention_forward_16_bit_cache(const AttentionShape& shape,
                                                      const AttentionMask& mask, const float* q,
                                                      Precision format, const uint16_t* k,
                                                      const uint16_t* v, float* probs,
                                                      float* out) const {
  cpu().attention_forward_16_bit_cache(shape, mask, q, format, k, v, probs, out);
}
void GuardPageBackend::attention_backward(const AttentionShape& shape, const AttentionMask& mask,
                                          const float* q, const float* k, const float* v,
                                          const float* probs, const AttentionDropout& dropout,
                                          const float* d_out, float* dq, float* dk, float* dv,
                                          float* d_additive_v) const {
  cpu().attention_backward(shape, mask, q, k, v, probs, dropout, d_out, dq, dk, dv, d_additive_v);
}

void GuardPageBackend::layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                                  int64_t rows, int64_t cols, float eps, float* mean,
                                  float* rstd) const {
  cpu().layer_norm(x, gamma, beta, y, rows, cols, eps, mean, rstd);
}
void GuardPageBackend::layer_norm_backward(const float* dy, const float* x, const float* mean,
                                           const float* rstd, const float* gamma, float* dx,
                                           float* dgamma, float* dbeta, int64_t rows, int64_t cols,
                                           bool accumulate) const {
  cpu().layer_norm_backward(dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols, accumulate);
}
void GuardPageBackend::residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols,
                                           float p, uint64_t key, uint8_t* mask, const float* gamma,
                                           const float* beta, float eps, float* y, float* mean,
                                           float* rstd, uint16_t* rounded_y) const {
  cpu().residual_layer_norm(f, x, rows, cols, p, key, mask, gamma, beta, eps, y, mean, rstd,
                            rounded_y);
}
void GuardPageBackend::residual_layer_norm_backward(
    float* dy, const float* sum, const float* mean, const float* rstd, const float* gamma,
    float* dgamma, float* dbeta, const uint8_t* mask, float p, uint64_t key, float* d_f,
    uint16_t* rounded_d_f, float* d_f_column_sums, int64_t rows, int64_t cols) const {
  cpu().residual_layer_norm_backward(dy, sum, mean, rstd, gamma, dgamma, dbeta, mask, p, key, d_f,
                                     rounded_d_f, d_f_column_sums, rows, cols);
}
void GuardPageBackend::add(float* y, const float* x, int64_t n) const {
  cpu().add(y, x, n);
}
void GuardPageBackend::scale(float* x, float s, int64_t n) const {
  cpu().scale(x, s, n);
}

void GuardPageBackend::add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const {
  cpu().add_bias(y, bias, rows, cols);
}
void GuardPageBackend::add_bias_activation(float* pre, const float* bias, float* out, int64_t rows,
                                           int64_t cols, Activation act) const {
  cpu().add_bias_activation(pre, bias, out, rows, cols, act);
}
void GuardPageBackend::activation_backward(float* d, const float* pre_activation, int64_t n,
                                           Activation act) const {
  cpu().activation_backward(d, pre_activation, n, act);
}
void GuardPageBackend::relu_backward_bfloat16(const float* d, const uint16_t* relu_output,
                                              int64_t rows, int64_t cols, uint16_t* rounded_d,
                                              float* column_sums) const {
  cpu().relu_backward_bfloat16(d, relu_output, rows, cols, rounded_d, column_sums);
}
void GuardPageBackend::bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows,
                                     int64_t cols, int64_t ld, float* dbias) const {
  cpu().bias_backward(dy, rounded_dy, rows, cols, ld, dbias);
}

void GuardPageBackend::dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const {
  cpu().dropout_mask(mask, n, p, key);
}
void GuardPageBackend::apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                                     uint64_t key) const {
  cpu().apply_dropout(x, mask, n, p, key);
}

void GuardPageBackend::embedding_forward(const float* table, const float* positions,
                                         const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                         float scale, int64_t first_position, float* out) const {
  cpu().embedding_forward(table, positions, ids, rows, len, d, scale, first_position, out);
}
void GuardPageBackend::embedding_forward_int8(const Int8Rows& table, const float* positions,
                                              const int32_t* ids, int64_t rows, int64_t len,
                                              int64_t d, float scale, int64_t first_position,
                                              float* out) const {
  cpu().embedding_forward_int8(table, positions, ids, rows, len, d, scale, first_position, out);
}
void GuardPageBackend::embedding_forward_prepared(const PreparedMatrix& table,
                                                  const float* positions, const int32_t* ids,
                                                  int64_t rows, int64_t len, int64_t d, float scale,
                                                  int64_t first_position, float* out) const {
  cpu().embedding_forward_prepared(table, positions, ids, rows, len, d, scale, first_position, out);
}
void GuardPageBackend::embedding_backward(const float* d_out, const int32_t* ids, int64_t rows,
                                          int64_t len, int64_t d, float scale,
                                          int64_t first_position, float* d_table,
                                          float* d_positions) const {
  cpu().embedding_backward(d_out, ids, rows, len, d, scale, first_position, d_table, d_positions);
}

void GuardPageBackend::log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows,
                                        int64_t cols, float* out) const {
  cpu().log_softmax_pick(logits, targets, rows, cols, out);
}
void GuardPageBackend::cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                      int64_t rows, int64_t vocab, float smoothing,
                                                      float grad_scale, double* row_totals,
                                                      uint16_t* rounded_gradient) const {
  cpu().cross_entropy_forward_backward(logits, targets, rows, vocab, smoothing, grad_scale,
                                       row_totals, rounded_gradient);
}

void GuardPageBackend::best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                                   int32_t banned, float* values, int32_t* tokens,
                                   float* log_sums) const {
  cpu().best_tokens(scores, rows, vocab, keep, banned, values, tokens, log_sums);
}

void GuardPageBackend::adam_update(float* const* params, const int64_t* offsets, int64_t count,
                                   int64_t total, const float* grad, float* m, float* v,
                                   const AdamHyperparameters& h, int64_t step) const {
  cpu().adam_update(params, offsets, count, total, grad, m, v, h, step);
}
void GuardPageBackend::sgd_update(float* param, const float* grad, int64_t n, float lr) const {
  cpu().sgd_update(param, grad, n, lr);
}
double GuardPageBackend::sum_of_squares(const float* x, int64_t n) const {
  return cpu().sum_of_squares(x, n);
}

// [ pages holding the block, which ends at the last one's end | guard page ]
void* GuardPageBackend::allocate(int64_t bytes, bool zeroed) const {
  if (bytes < 0) throw std::bad_alloc();
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t data_pages = (size_t(bytes) + page - 1) / page;
  const size_t length = (data_pages + 1) * page;
  void* mapping = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::bad_alloc();
  auto* guard = static_cast<char*>(mapping) + data_pages * page;
  if (mprotect(guard, page, PROT_NONE) != 0) {
    munmap(mapping, length);
    throw std::bad_alloc();
  }
  char* block = guard - bytes;
  if (!zeroed) std::memset(block, 0xff, size_t(bytes));  // fresh mappings are zero
  std::lock_guard<std::mutex> lock(mutex_);
  mappings_[block] = {mapping, length};
  return block;
}

void GuardPageBackend::deallocate(void* memory) const {
  if (!memory) return;
  std::pair<void*, size_t> mapping;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mappings_.find(memory);
    if (it == mappings_.end()) std::abort();  // not from allocate, or freed twice
    mapping = it->second;
    mappings_.erase(it);
  }
  munmap(mapping.first, mapping.second);
}

int64_t GuardPageBackend::live_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(mappings_.size());
}

void GuardPageBackend::copy_bytes(const void* from, int64_t bytes, void* to) const {
  if (bytes > 0) std::memmove(to, from, size_t(bytes));
}
void GuardPageBackend::copy_from_host(const void* host, int64_t bytes, void* device) const {
  if (bytes <= 0) return;
  std::memcpy(device, host, size_t(bytes));
  bytes_copied_with_host_ += bytes;
}
void GuardPageBackend::copy_to_host(const void* device, int64_t bytes, void* host) const {
  if (bytes <= 0) return;
  std::memcpy(host, device, size_t(bytes));
  bytes_copied_with_host_ += bytes;
}

void GuardPageBackend::copy(const float* x, int64_t n, float* y) const {
  cpu().copy(x, n, y);
}
void GuardPageBackend::fill(float* y, int64_t n, float value) const {
  cpu().fill(y, n, value);
}
void GuardPageBackend::gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                                   int64_t d, float* y, int64_t ldy) const {
  cpu().gather_rows(x, ldx, rows, count, d, y, ldy);
}
void GuardPageBackend::scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                                    int64_t d, float* y, int64_t ldy) const {
  cpu().scatter_rows(x, ldx, rows, count, d, y, ldy);
}
void GuardPageBackend::mean_of_row_groups(const float* x, int64_t groups, int64_t group_size,
                                          int64_t cols, float* y) const {
  cpu().mean_of_row_groups(x, groups, group_size, cols, y);
}
void GuardPageBackend::scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows,
                                               int64_t count, int64_t d, Precision format,
                                               uint16_t* y, int64_t ldy) const {
  cpu().scatter_rows_to_16_bits(x, ldx, rows, count, d, format, y, ldy);
}

}  // namespace tfm
