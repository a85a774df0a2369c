// GuardPageBackend: a test-only "device" that checks HostStagedBackend (host_staged_backend.h)
// without a GPU. It computes every operation with cpu_backend(), but claims memory that is not
// the host's (memory_is_host() false), so tests/backend_ops_test.cpp's StagedCpu instantiation
// runs every operation through the staging adapter; and each block it allocates ends exactly
// at an inaccessible guard page (mmap + mprotect PROT_NONE), so a range the adapter computed
// too small makes the CPU kernel that reads or writes past it fault (SIGSEGV) instead of passing
// unnoticed. Blocks are unmapped when freed (a later use faults too), and blocks not asked
// zeroed start as 0xFF bytes.
//
// Blocks are aligned to no more than their size allows (the end is fixed at the guard page):
// enough for the element types the adapter stages, not the alignof(std::max_align_t) Backend
// promises; tests only.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace tfm {

class GuardPageBackend final : public Backend {
 public:
  std::string name() const override;
  bool supports(Precision precision) const override;
  std::string unsupported_reason(Precision precision) const override;

  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue = {}) const override;
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override;
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override;
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override;

  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override;
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override;
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override;

  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override;
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override;
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override;
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override;
  void add(float* y, const float* x, int64_t n) const override;
  void scale(float* x, float s, int64_t n) const override;

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override;
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override;
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override;
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d, float* column_sums) const override;
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override;

  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override;
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override;

  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override;
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override;
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override;
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override;

  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override;
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override;

  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override;

  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t total,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override;
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override;
  double sum_of_squares(const float* x, int64_t n) const override;

  // Blocks ending at a guard page; host-addressable, but memory_is_host() says otherwise.
  void* allocate(int64_t bytes, bool zeroed) const override;
  void deallocate(void* memory) const override;
  bool memory_is_host() const override { return false; }
  void copy_bytes(const void* from, int64_t bytes, void* to) const override;
  void copy_from_host(const void* host, int64_t bytes, void* device) const override;
  void copy_to_host(const void* device, int64_t bytes, void* host) const override;

  void copy(const float* x, int64_t n, float* y) const override;
  void fill(float* y, int64_t n, float value) const override;
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override;
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override;
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override;
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override;

  // Blocks allocated and not yet freed (a test can check that nothing leaked).
  int64_t live_blocks() const;
  // Bytes moved by copy_from_host and copy_to_host so far (a test can check that host code
  // went through copies instead of reading this memory in place).
  int64_t bytes_copied_with_host() const { return bytes_copied_with_host_; }

 private:
  mutable std::mutex mutex_;
  mutable std::map<void*, std::pair<void*, size_t>> mappings_;  // block -> (mapping, length)
  mutable std::atomic<int64_t> bytes_copied_with_host_{0};
};

}  // namespace tfm
