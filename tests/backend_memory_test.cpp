// Which memory the model hands to its backend. A backend with memory of its own (a GPU) can only
// read what it allocated, so every pointer an operation receives — activations, gradients,
// caches, parameters, int8 weights, and the index arrays the host computes (token ids, lengths,
// row lists) — must come from that backend's allocate(), never from a std::vector on the host;
// and the host cannot read that memory in place, only through copy_to_host. On the CPU both
// would work anyway, so this test runs training, checkpoints, scoring and decoding on a backend
// that is the CPU's in everything but two checks: it records every pointer an operation
// receives outside the blocks it allocated, and it keeps those blocks in pages the host cannot
// touch except while an operation handed a pointer into them runs, so host code that reads
// the backend's memory in place faults (and is named) at once.
#include <execinfo.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_tensors.h"
#include "decode/beam_search.h"
#include "decode/incremental_decoder.h"
#include "fixture_batch.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "skip_report.h"
#include "tensor/file_util.h"
#include "tensor/float16.h"
#include "tensor/random.h"
#include "train/checkpoint.h"
#include "train/loss.h"
#include "train/optimizer.h"
#include "train/replicas.h"

namespace tfm {
namespace {

class MemoryCheckingBackend : public Backend {
 public:
  // "operation: argument" for every pointer seen outside this backend's memory.
  std::set<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return violations_;
  }

  // Products that were handed a rounded copy of an operand (MatmulOperand) so far; with
  // ignore_rounded_copies set they round from the float values instead, as if none were given.
  int64_t rounded_operands() const { return rounded_operands_; }
  // How many times each operation has been called so far.
  std::map<std::string, int64_t> calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  void set_ignore_rounded_copies(bool ignore) { ignore_rounded_copies_ = ignore; }

  // What attention makes of Q, K and V in a bfloat16 training step's calls (AttentionShape::
  // products kBFloat16): kAsGiven, the CPU's float32; kRoundedAtLoad, rounded to bfloat16 first,
  // as CUDA's tensor-core blocks round them as they load them; kRoundedAlone, the same, and the
  // backend says it reads them in bfloat16 alone where there is no attention dropout
  // (attention_reads_rounded_inputs, as CUDA's says for the calls those blocks take), so the
  // model writes them so; their copies are widened for the CPU.
  enum class BFloat16Attention { kAsGiven, kRoundedAtLoad, kRoundedAlone };
  void set_bfloat16_attention(BFloat16Attention mode) { bfloat16_attention_ = mode; }
  // Attention calls handed Q, K and V in bfloat16 alone so far.
  int64_t rounded_attention_calls() const { return rounded_attention_calls_; }
  // Products handed a ReLU mask so far. As a GPU's would, this backend asks for one (of a GPU
  // library's size, which the CPU's products ignore), so that the model's masks are planned and
  // handed over as that memory.
  int64_t relu_masks() const { return relu_masks_; }
  int64_t relu_mask_bytes(int64_t m, int64_t n) const override { return (n + 127) / 128 * 16 * m; }
  // Whether this backend keeps dropout masks (the CPU's one byte an element), or, as a GPU,
  // none: its dropouts then draw their decisions again from the key (Backend::dropout_mask_bytes).
  void set_keeps_dropout_masks(bool keeps) { keeps_dropout_masks_ = keeps; }
  int64_t dropout_mask_bytes(int64_t n) const override { return keeps_dropout_masks_ ? n : 0; }

  std::string name() const override { return "memory-checking cpu"; }
  bool supports(Precision precision) const override { return cpu().supports(precision); }
  std::string unsupported_reason(Precision precision) const override {
    return cpu().unsupported_reason(precision);
  }

  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue) const override {
    const Access access = check("matmul", {{"a", a.values},
                                           {"a rounded", a.rounded},
                                           {"b", b.values},
                                           {"b rounded", b.rounded},
                                           {"c", c},
                                           {"bias", epilogue.bias},
                                           {"rounded bias", epilogue.rounded_bias},
                                           {"rounded output", epilogue.rounded_output},
                                           {"relu mask", epilogue.relu_mask},
                                           {"relu output", epilogue.relu_output},
                                           {"bias gradient", epilogue.bias_gradient},
                                           {"column sums", epilogue.a_column_sums}});
    if (a.rounded || b.rounded) ++rounded_operands_;
    if (epilogue.relu_mask) ++relu_masks_;
    const MatmulOperand given_a = a;
    float* column_sums = nullptr;  // summed below from the given copy (a bias gradient's source)
    if (ignore_rounded_copies_) {  // each product rounds again, where the float values exist
      if (a.values) a.rounded = nullptr;
      if (b.values) b.rounded = nullptr;
      std::swap(column_sums, epilogue.a_column_sums);
    }
    cpu().matmul(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision,
                 epilogue);
    if (column_sums)
      cpu().bias_backward(given_a.values, given_a.rounded, k, m, given_a.read_stride(m, lda),
                          column_sums);
  }
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override {
    const Access access = check("round_to_16_bits", {{"x", x}, {"out", out}});
    cpu().round_to_16_bits(x, rows, cols, ldx, format, out);
  }
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override {
    std::vector<Argument> arguments;
    for (const float* part : parts) arguments.push_back({"part", part});
    const Access access = check("prepare_matrix", arguments);
    return std::make_unique<CheckedMatrix>(*this,
                                           cpu().prepare_matrix(parts, part_rows, k, precision));
  }
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override {
    std::vector<Argument> arguments;
    for (const Int8Rows& part : parts) {
      arguments.push_back({"values", part.values});
      arguments.push_back({"scales", part.scales});
    }
    const Access access = check("prepare_int8_matrix", arguments);
    return std::make_unique<CheckedMatrix>(*this, cpu().prepare_int8_matrix(parts, part_rows, k));
  }

  bool attention_reads_rounded_inputs(const AttentionShape& shape, const AttentionMask& mask,
                                      const AttentionDropout& dropout) const override {
    return bfloat16_attention_ == BFloat16Attention::kRoundedAlone &&
           shape.products == Precision::kBFloat16 && dropout.p == 0.f && !shape.key_rows &&
           !mask.key_batch;
  }
  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override {
    const Access access =
        check("attention_forward", {{"q", q}, {"k", k}, {"v", v}, {"probs", probs}, {"out", out}});
    const Access attention_access = check_attention("attention_forward", shape, mask, dropout);
    check_rounded_attention_inputs("attention_forward", shape,
                                   attention_reads_rounded_inputs(shape, mask, dropout));
    const InputsForCpu in = inputs_for_cpu(shape, q, k, v, nullptr);
    cpu().attention_forward(in.shape, mask, in.q, in.k, in.v, probs, out, dropout);
  }
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override {
    const Access access = check("attention_forward_16_bit_cache",
                                {{"q", q}, {"k", k}, {"v", v}, {"probs", probs}, {"out", out}});
    const Access attention_access =
        check_attention("attention_forward_16_bit_cache", shape, mask, {});
    cpu().attention_forward_16_bit_cache(shape, mask, q, format, k, v, probs, out);
  }
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override {
    const Access access = check("attention_backward", {{"q", q},
                                                       {"k", k},
                                                       {"v", v},
                                                       {"probs", probs},
                                                       {"d_out", d_out},
                                                       {"dq", dq},
                                                       {"dk", dk},
                                                       {"dv", dv},
                                                       {"d_additive_v", d_additive_v}});
    const Access attention_access = check_attention("attention_backward", shape, mask, dropout);
    check_rounded_attention_inputs("attention_backward", shape,
                                   probs && attention_reads_rounded_inputs(shape, mask, dropout),
                                   true);
    const InputsForCpu in = inputs_for_cpu(shape, q, k, v, d_out);
    cpu().attention_backward(in.shape, mask, in.q, in.k, in.v, probs, dropout, in.d_out, dq, dk, dv,
                             d_additive_v);
  }

  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override {
    const Access access = check(
        "layer_norm",
        {{"x", x}, {"gamma", gamma}, {"beta", beta}, {"y", y}, {"mean", mean}, {"rstd", rstd}});
    cpu().layer_norm(x, gamma, beta, y, rows, cols, eps, mean, rstd);
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override {
    const Access access = check("layer_norm_backward", {{"dy", dy},
                                                        {"x", x},
                                                        {"mean", mean},
                                                        {"rstd", rstd},
                                                        {"gamma", gamma},
                                                        {"dx", dx},
                                                        {"dgamma", dgamma},
                                                        {"dbeta", dbeta}});
    cpu().layer_norm_backward(dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols, accumulate);
  }
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override {
    const Access access = check("residual_layer_norm", {{"f", f},
                                                        {"x", x},
                                                        {"mask", mask},
                                                        {"gamma", gamma},
                                                        {"beta", beta},
                                                        {"y", y},
                                                        {"mean", mean},
                                                        {"rstd", rstd},
                                                        {"rounded_y", rounded_y}});
    cpu().residual_layer_norm(f, x, rows, cols, p, key, mask, gamma, beta, eps, y, mean, rstd,
                              rounded_y);
  }
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override {
    const Access access =
        check("residual_layer_norm_backward", {{"dy", dy},
                                               {"sum", sum},
                                               {"mean", mean},
                                               {"rstd", rstd},
                                               {"gamma", gamma},
                                               {"dgamma", dgamma},
                                               {"dbeta", dbeta},
                                               {"mask", mask},
                                               {"d_f", d_f},
                                               {"rounded_d_f", rounded_d_f},
                                               {"d_f_column_sums", d_f_column_sums}});
    cpu().residual_layer_norm_backward(dy, sum, mean, rstd, gamma, dgamma, dbeta, mask, p, key, d_f,
                                       rounded_d_f, d_f_column_sums, rows, cols);
  }
  void add(float* y, const float* x, int64_t n) const override {
    const Access access = check("add", {{"y", y}, {"x", x}});
    cpu().add(y, x, n);
  }
  void scale(float* x, float s, int64_t n) const override {
    const Access access = check("scale", {{"x", x}});
    cpu().scale(x, s, n);
  }
  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override {
    const Access access = check("add_bias", {{"y", y}, {"bias", bias}});
    cpu().add_bias(y, bias, rows, cols);
  }
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override {
    const Access access =
        check("add_bias_activation", {{"pre", pre}, {"bias", bias}, {"out", out}});
    cpu().add_bias_activation(pre, bias, out, rows, cols, act);
  }
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override {
    const Access access =
        check("activation_backward", {{"d", d}, {"pre_activation", pre_activation}});
    cpu().activation_backward(d, pre_activation, n, act);
  }
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d,
                              float* column_sums) const override {
    const Access access = check("relu_backward_bfloat16", {{"d", d},
                                                           {"relu_output", relu_output},
                                                           {"rounded_d", rounded_d},
                                                           {"column_sums", column_sums}});
    cpu().relu_backward_bfloat16(d, relu_output, rows, cols, rounded_d, column_sums);
  }
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override {
    const Access access =
        check("bias_backward", {{"dy", dy}, {"rounded_dy", rounded_dy}, {"dbias", dbias}});
    cpu().bias_backward(dy, rounded_dy, rows, cols, ld, dbias);
  }
  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override {
    const Access access = check("dropout_mask", {{"mask", mask}});
    cpu().dropout_mask(mask, n, p, key);
  }
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override {
    const Access access = check("apply_dropout", {{"x", x}, {"mask", mask}});
    cpu().apply_dropout(x, mask, n, p, key);
  }

  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override {
    const Access access =
        check("embedding_forward",
              {{"table", table}, {"positions", positions}, {"ids", ids}, {"out", out}});
    cpu().embedding_forward(table, positions, ids, rows, len, d, scale, first_position, out);
  }
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override {
    const Access access = check("embedding_forward_int8", {{"table.values", table.values},
                                                           {"table.scales", table.scales},
                                                           {"positions", positions},
                                                           {"ids", ids},
                                                           {"out", out}});
    cpu().embedding_forward_int8(table, positions, ids, rows, len, d, scale, first_position, out);
  }
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override {
    const Access access =
        check("embedding_forward_prepared", {{"positions", positions}, {"ids", ids}, {"out", out}});
    cpu().embedding_forward_prepared(static_cast<const CheckedMatrix&>(table).inner(), positions,
                                     ids, rows, len, d, scale, first_position, out);
  }
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override {
    const Access access =
        check("embedding_backward",
              {{"d_out", d_out}, {"ids", ids}, {"d_table", d_table}, {"d_positions", d_positions}});
    cpu().embedding_backward(d_out, ids, rows, len, d, scale, first_position, d_table, d_positions);
  }

  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override {
    const Access access =
        check("log_softmax_pick", {{"logits", logits}, {"targets", targets}, {"out", out}});
    cpu().log_softmax_pick(logits, targets, rows, cols, out);
  }
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override {
    const Access access = check("cross_entropy_forward_backward", {{"logits", logits},
                                                                   {"targets", targets},
                                                                   {"row_totals", row_totals},
                                                                   {"rounded", rounded_gradient}});
    cpu().cross_entropy_forward_backward(logits, targets, rows, vocab, smoothing, grad_scale,
                                         row_totals, rounded_gradient);
  }
  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override {
    const Access access =
        check("best_tokens",
              {{"scores", scores}, {"values", values}, {"tokens", tokens}, {"log_sums", log_sums}});
    cpu().best_tokens(scores, rows, vocab, keep, banned, values, tokens, log_sums);
  }

  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t total,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override {
    const Access access =
        check("adam_update",
              {{"params", params}, {"offsets", offsets}, {"grad", grad}, {"m", m}, {"v", v}});
    std::vector<Argument> tensors;  // the addresses the table holds (readable now)
    for (int64_t i = 0; i < count; ++i) tensors.push_back({"param", params[i]});
    const Access tensors_access = check("adam_update", tensors);
    cpu().adam_update(params, offsets, count, total, grad, m, v, h, step);
  }
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override {
    const Access access = check("sgd_update", {{"param", param}, {"grad", grad}});
    cpu().sgd_update(param, grad, n, lr);
  }
  double sum_of_squares(const float* x, int64_t n) const override {
    const Access access = check("sum_of_squares", {{"x", x}});
    return cpu().sum_of_squares(x, n);
  }

  // Pages of their own, inaccessible to the host except while an operation that was handed a
  // pointer into them runs (check() opens them): host code that reads or writes the backend's
  // memory in place, as it could not on a GPU, faults at once (see ReportHostAccess).
  void* allocate(int64_t bytes, bool) const override {
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    const size_t mapped = (size_t(std::max<int64_t>(bytes, 1)) + page - 1) / page * page;
    void* memory = ::mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::bad_alloc();  // pages of zeros, as zeroed asks
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[static_cast<const char*>(memory)] = Block{bytes, mapped, 0};
    ++allocations_;
    live_bytes_ += bytes;
    return memory;
  }
  void deallocate(void* memory) const override {
    if (!memory) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto block = blocks_.find(static_cast<const char*>(memory));
    live_bytes_ -= block->second.bytes;
    ::munmap(memory, block->second.mapped);
    blocks_.erase(block);
  }
  // allocate() calls so far, and the bytes of the blocks not yet deallocated.
  int64_t allocations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocations_;
  }
  int64_t live_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_bytes_;
  }
  // Whether `address` lies in one of the blocks (for the fault report; no lock: a fault
  // handler calls it).
  bool holds(const void* address) const { return containing(address) != blocks_.end(); }
  // As a device's would be: the host does not read it in place.
  bool memory_is_host() const override { return false; }
  void copy_bytes(const void* from, int64_t bytes, void* to) const override {
    const Access access = check("copy_bytes", {{"from", from}, {"to", to}});
    cpu().copy_bytes(from, bytes, to);
  }
  void copy_from_host(const void* host, int64_t bytes, void* device) const override {
    const Access access = check("copy_from_host", {{"device", device}});
    cpu().copy_from_host(host, bytes, device);
  }
  void copy_to_host(const void* device, int64_t bytes, void* host) const override {
    const Access access = check("copy_to_host", {{"device", device}});
    cpu().copy_to_host(device, bytes, host);
  }
  void copy(const float* x, int64_t n, float* y) const override {
    const Access access = check("copy", {{"x", x}, {"y", y}});
    cpu().copy(x, n, y);
  }
  void fill(float* y, int64_t n, float value) const override {
    const Access access = check("fill", {{"y", y}});
    cpu().fill(y, n, value);
  }
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override {
    const Access access = check("gather_rows", {{"x", x}, {"rows", rows}, {"y", y}});
    cpu().gather_rows(x, ldx, rows, count, d, y, ldy);
  }
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override {
    const Access access = check("scatter_rows", {{"x", x}, {"rows", rows}, {"y", y}});
    cpu().scatter_rows(x, ldx, rows, count, d, y, ldy);
  }
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override {
    const Access access = check("mean_of_row_groups", {{"x", x}, {"y", y}});
    cpu().mean_of_row_groups(x, groups, group_size, cols, y);
  }
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override {
    const Access access = check("scatter_rows_to_16_bits", {{"x", x}, {"rows", rows}, {"y", y}});
    cpu().scatter_rows_to_16_bits(x, ldx, rows, count, d, format, y, ldy);
  }

 private:
  // The CPU's prepared matrix, its multiply checked the same way.
  class CheckedMatrix : public PreparedMatrix {
   public:
    CheckedMatrix(const MemoryCheckingBackend& backend, std::unique_ptr<PreparedMatrix> inner)
        : backend_(backend), inner_(std::move(inner)) {}
    const PreparedMatrix& inner() const { return *inner_; }
    int64_t rows() const override { return inner_->rows(); }
    int64_t cols() const override { return inner_->cols(); }
    Precision precision() const override { return inner_->precision(); }
    void multiply(MatmulOperand x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                  const MatmulEpilogue& epilogue) const override {
      const Access access =
          backend_.check("PreparedMatrix::multiply", {{"x", x.values},
                                                      {"x rounded", x.rounded},
                                                      {"y", y},
                                                      {"bias", epilogue.bias},
                                                      {"rounded bias", epilogue.rounded_bias},
                                                      {"rounded output", epilogue.rounded_output}});
      if (x.rounded) ++backend_.rounded_operands_;
      if (backend_.ignore_rounded_copies_ && x.values) x.rounded = nullptr;
      inner_->multiply(x, m, ldx, y, ldy, epilogue);
    }
    void read_rows(const int32_t* ids, int64_t count, float* out) const override {
      const Access access =
          backend_.check("PreparedMatrix::read_rows", {{"ids", ids}, {"out", out}});
      inner_->read_rows(ids, count, out);
    }

   private:
    const MemoryCheckingBackend& backend_;
    std::unique_ptr<PreparedMatrix> inner_;
  };

  static const Backend& cpu() { return cpu_backend(); }

  struct Argument {
    const char* name;
    const void* pointer;
  };
  // One allocate() block: its bytes, its pages and how many running operations can read it.
  struct Block {
    int64_t bytes = 0;
    size_t mapped = 0;  // bytes rounded up to whole pages
    int users = 0;
  };
  // What an operation may touch while it runs: the blocks its arguments point into, readable
  // and writable until the Access is destroyed (they are inaccessible to the host otherwise).
  class Access {
   public:
    Access(const MemoryCheckingBackend* backend, std::vector<const char*> starts)
        : backend_(backend), starts_(std::move(starts)) {}
    Access(Access&& other) noexcept : backend_(other.backend_), starts_(std::move(other.starts_)) {
      other.backend_ = nullptr;
    }
    Access(const Access&) = delete;
    Access& operator=(const Access&) = delete;
    ~Access() {
      if (backend_) backend_->close(starts_);
    }

   private:
    const MemoryCheckingBackend* backend_;
    std::vector<const char*> starts_;
  };

  // Records the arguments outside this backend's blocks, and opens the blocks of those inside
  // for the operation. Null pointers are "none" and pass.
  // An operation's pointers (admit) and the call itself counted (calls()).
  template <typename Arguments>
  Access check(const char* operation, const Arguments& arguments) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++calls_[operation];
    }
    return admit(operation, arguments);
  }
  template <typename Arguments>
  Access admit(const char* operation, const Arguments& arguments) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<const char*> starts;
    for (const Argument& a : arguments) {
      if (!a.pointer) continue;
      const auto block = containing(a.pointer);
      if (block == blocks_.end()) {
        violations_.insert(std::string(operation) + ": " + a.name);
        continue;
      }
      if (block->second.users++ == 0)
        ::mprotect(const_cast<char*>(block->first), block->second.mapped, PROT_READ | PROT_WRITE);
      starts.push_back(block->first);
    }
    return Access(this, std::move(starts));
  }
  Access check(const char* operation, std::initializer_list<Argument> arguments) const {
    return check<std::initializer_list<Argument>>(operation, arguments);
  }
  // Q, K and V (and the backward's d_out) as the CPU is to read them (set_bfloat16_attention): as
  // given, or in bfloat16 (the copies widened, or the floats rounded) in host arrays of the same
  // layouts (dense batches). The forward's d_out null.
  struct InputsForCpu {
    AttentionShape shape;
    const float *q, *k, *v, *d_out;
    std::vector<float> q_host, k_host, v_host, d_out_host;
  };
  InputsForCpu inputs_for_cpu(const AttentionShape& s, const float* q, const float* k,
                              const float* v, const float* d_out) const {
    InputsForCpu in{s, q, k, v, d_out, {}, {}, {}, {}};
    in.shape.rounded_q = in.shape.rounded_k = in.shape.rounded_v = nullptr;
    in.shape.rounded_d_out = nullptr;
    if (s.rounded_q) ++rounded_attention_calls_;
    if (bfloat16_attention_ == BFloat16Attention::kAsGiven || s.products != Precision::kBFloat16)
      return in;
    if (s.k_batch_stride || s.v_batch_stride || s.key_rows)
      throw std::logic_error("memory-checking backend: bfloat16 attention over dense batches only");
    const int64_t width = s.heads * s.head_dim;
    const auto widen = [&](const float* x, const uint16_t* rounded, int64_t rows, int64_t stride,
                           std::vector<float>& host) {
      host.assign(size_t(rows > 0 ? (rows - 1) * stride + width : 0), 0.f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c) {
          const int64_t at = r * stride + c;
          host[size_t(at)] = bfloat16_to_float(rounded ? rounded[at] : float_to_bfloat16(x[at]));
        }
      return host.data();
    };
    in.q = widen(q, s.rounded_q, s.batch * s.query_len, s.q_row_stride, in.q_host);
    in.k = widen(k, s.rounded_k, s.batch * s.key_len, s.k_row_stride, in.k_host);
    in.v = widen(v, s.rounded_v, s.batch * s.key_len, s.v_row_stride, in.v_host);
    if (d_out || s.rounded_d_out)
      in.d_out =
          widen(d_out, s.rounded_d_out, s.batch * s.query_len, s.out_row_stride, in.d_out_host);
    return in;
  }
  Access check_attention(const char* operation, const AttentionShape& shape,
                         const AttentionMask& mask, const AttentionDropout& dropout) const {
    return admit(operation,
                 std::initializer_list<Argument>{{"shape.key_rows", shape.key_rows},
                                                 {"shape.rounded_q", shape.rounded_q},
                                                 {"shape.rounded_k", shape.rounded_k},
                                                 {"shape.rounded_v", shape.rounded_v},
                                                 {"shape.rounded_d_out", shape.rounded_d_out},
                                                 {"shape.rounded_out", shape.rounded_out},
                                                 {"shape.rounded_dq", shape.rounded_dq},
                                                 {"shape.rounded_dk", shape.rounded_dk},
                                                 {"shape.rounded_dv", shape.rounded_dv},
                                                 {"shape.score.additive_v", shape.score.additive_v},
                                                 {"mask.key_lengths", mask.key_lengths},
                                                 {"mask.key_batch", mask.key_batch},
                                                 {"dropout.mask", dropout.mask}});
  }
  void close(const std::vector<const char*>& starts) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const char* start : starts) {
      Block& block = blocks_.at(start);
      if (--block.users == 0) ::mprotect(const_cast<char*>(start), block.mapped, PROT_NONE);
    }
  }
  std::map<const char*, Block>::iterator containing(const void* pointer) const {
    const char* p = static_cast<const char*>(pointer);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return p < it->first + std::max<int64_t>(it->second.bytes, 1) ? it : blocks_.end();
  }

  mutable std::mutex mutex_;
  mutable std::map<const char*, Block> blocks_;  // allocate()'s blocks by start
  mutable int64_t allocations_ = 0, live_bytes_ = 0;
  mutable std::set<std::string> violations_;
  mutable std::atomic<int64_t> rounded_operands_{0};
  mutable std::map<std::string, int64_t> calls_;  // by operation
  bool ignore_rounded_copies_ = false;
  bool keeps_dropout_masks_ = true;
  BFloat16Attention bfloat16_attention_ = BFloat16Attention::kAsGiven;
  mutable std::atomic<int64_t> rounded_attention_calls_{0};
  mutable std::atomic<int64_t> relu_masks_{0};
};

// While a test runs on a checking backend: a fault on its memory (host code reading or writing
// it outside an operation) is reported by name, with the stack that made it, before the process
// ends with the fault.
const MemoryCheckingBackend* g_faulting_backend = nullptr;

void report_host_access(int, siginfo_t* info, void*) {
  if (g_faulting_backend && g_faulting_backend->holds(info->si_addr)) {
    const char message[] =
        "\nhost code touched the backend's memory outside an operation (a GPU backend's memory "
        "would not be there); the stack:\n";
    [[maybe_unused]] const ssize_t written = ::write(2, message, sizeof message - 1);
    void* frames[64];
    ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), 2);
  }
  std::signal(SIGSEGV, SIG_DFL);  // the faulting access runs again and ends the process
}

struct ReportHostAccess {
  explicit ReportHostAccess(const MemoryCheckingBackend& backend) {
    g_faulting_backend = &backend;
    struct sigaction action {};
    action.sa_sigaction = report_host_access;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGSEGV, &action, &previous_);
  }
  ~ReportHostAccess() {
    ::sigaction(SIGSEGV, &previous_, nullptr);
    g_faulting_backend = nullptr;
  }
  struct sigaction previous_ {};
};

std::string listed(const std::set<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += "\n  " + item;
  return text;
}

// Every fixture variant (norm position, positions, activation, attention scoring, tied
// embeddings) loaded on the checking backend: its parameters are that backend's memory too.
class BackendMemory : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string base = std::string(TFM_FIXTURE_DIR) + "/" + GetParam();
    file_ = base + ".safetensors";
    model_.emplace(load_model(file_, backend_));
    const TensorMap io = read_safetensors(base + ".io.safetensors").tensors;
    batch_ = testing_support::fixture_batch(model_->config(), io);
    sources_ = testing_support::fixture_rows(io.at("src_tokens"));
  }
  MemoryCheckingBackend backend_;
  ReportHostAccess report_{backend_};
  std::string file_;  // the fixture's model file
  std::optional<Model> model_;
  TokenBatch batch_;
  std::vector<std::vector<int32_t>> sources_;  // the batch's sources as raw ids
};

TEST_P(BackendMemory, TrainingScoringAndDecodingPassOnlyBackendMemoryToOperations) {
  const Model& model = *model_;
  // Training: forward, loss, backward, and an Adam step (with clipping) of the parameters.
  DeviceTensors gradients = DeviceTensors::zeros_like(model.parameters());
  TrainingWorkspace ws;
  DropoutOptions dropout;
  dropout.dropout = dropout.attention_dropout = dropout.relu_dropout = 0.1f;
  dropout.seed = 7;
  const LossTotals totals = loss_and_gradients(model, bind_gradients(model.config(), gradients),
                                               batch_, dropout, 0.1f, 1e-2f, ws);
  EXPECT_GT(totals.tokens, 0);
  OptimizerOptions adam;
  adam.clip_norm = 1.0;
  Optimizer optimizer(adam, model.parameters());
  EXPECT_GT(optimizer.apply(model_->mutable_parameters(), gradients, model.config().d_model), 0.0);
  // A checkpoint written from that memory (through the host) resumes the same values: the
  // parameters and both moments, read back on the checking backend.
  const std::string dir = ::testing::TempDir() + "/memory_checkpoint_" + GetParam();
  std::filesystem::remove_all(dir);
  TrainingState state;
  state.step = 1;
  save_checkpoint(dir, model, optimizer, state, 1);
  LoadedCheckpoint resumed = load_checkpoint(dir, backend_);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(checksum_tensors(resumed.model.parameters()), checksum_tensors(model.parameters()));
  Optimizer reloaded(adam, resumed.model.parameters());
  reloaded.load_state(std::move(resumed.optimizer_state), dir);
  uint64_t saved = kChecksumStart, loaded = kChecksumStart;
  for (size_t i = 0; i < optimizer.moments().size(); ++i) {
    saved = checksum_tensors(*optimizer.moments()[i].second, saved);
    loaded = checksum_tensors(*reloaded.moments()[i].second, loaded);
  }
  EXPECT_EQ(loaded, saved);
  EXPECT_NE(saved, kChecksumStart);  // Adam has moments

  // Scoring.
  ScoringWorkspace cache;
  std::vector<float> logprobs;
  score_forward(model, batch_, cache, logprobs);
  EXPECT_EQ(int64_t(logprobs.size()), batch_.batch * batch_.tgt_len);

  // Decoding: greedy and beam 4 with the kept cross-attention (mean and per head), in every
  // precision of the backend, with a float32 and a bfloat16 key/value cache.
  const std::vector<std::vector<int32_t>>& sources = sources_;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kInt8}) {
    if (!backend_.supports(precision)) {
      testing_support::skip_precision(backend_, precision, "decoding");
      continue;
    }
    for (CacheFormat cache : {CacheFormat::kFloat32, CacheFormat::kBFloat16})
      for (int64_t beam : {1, 4})
        for (bool per_head : {false, true}) {
          SearchOptions o;
          o.beam = beam;
          o.max_length_b = 6;
          o.attention = true;
          o.attention_per_head = per_head;
          o.precision = precision;
          o.cache = cache;
          const int64_t before = backend_.rounded_operands();
          const auto found = search(model, sources, {}, o);
          EXPECT_EQ(found.size(), sources.size());
          if (precision != Precision::kBFloat16) continue;
          // The bfloat16 copies handed to the prepared products that read them give bit for bit
          // what rounding at each product gives: every attention's output for W_o
          // (AttentionShape::rounded_out); post-norm, the norms' (model/sublayer.h); with ReLU,
          // fc1's hidden layer, which it writes in bfloat16 only (model/feed_forward.cpp).
          EXPECT_GT(backend_.rounded_operands(), before) << "no product was handed a copy";
          backend_.set_ignore_rounded_copies(true);
          const auto rounded_again = search(model, sources, {}, o);
          backend_.set_ignore_rounded_copies(false);
          ASSERT_EQ(rounded_again.size(), found.size());
          for (size_t s = 0; s < found.size(); ++s)
            for (size_t h = 0; h < found[s].size(); ++h) {
              EXPECT_EQ(rounded_again[s][h].tokens, found[s][h].tokens);
              EXPECT_EQ(rounded_again[s][h].score, found[s][h].score);
            }
        }
  }
  // A model loaded for int8 inference (quantised as it is read, and from a file that stores
  // int8): its int8 weights are the backend's memory too.
  if (!backend_.supports(Precision::kInt8)) {
    testing_support::skip_precision(backend_, Precision::kInt8, "an int8-loaded model");
  } else {
    const std::string int8_file = ::testing::TempDir() + "/memory_" + GetParam() + "_int8";
    const Model quantised = load_model(file_, backend_, ModelWeights::kInt8);
    save_model(quantised, int8_file);
    const Model stored = load_model(int8_file, backend_, ModelWeights::kInt8);
    std::remove(int8_file.c_str());
    SearchOptions o;
    o.max_length_b = 6;
    o.precision = Precision::kInt8;
    const auto on_cpu =
        search(load_model(file_, cpu_backend(), ModelWeights::kInt8), sources, {}, o);
    for (const Model* int8 : {&quantised, &stored}) {
      const auto found = search(*int8, sources, {}, o);
      ASSERT_EQ(found.size(), on_cpu.size());
      for (size_t s = 0; s < found.size(); ++s)
        EXPECT_EQ(found[s][0].tokens, on_cpu[s][0].tokens) << s;
    }
  }
  EXPECT_TRUE(backend_.violations().empty())
      << "host memory handed to operations:" << listed(backend_.violations());
}

// What one decoding step asks of the backend, operation by operation, after the first steps
// (which allocate): each decoder layer appends its keys and values to the cache in one
// operation, the decoder's output reaches the output head uncopied, no operation rounds on its
// own (the norms, the attentions and fc1 write the bfloat16 copies the products read, the
// output head reads the last layer's), and the logits are left for the search's ranking to
// normalise. On a GPU each of these is a launch.
TEST_P(BackendMemory, ADecodingStepAppendsOnceALayerAndRoundsNothingApart) {
  const Model& model = *model_;
  const ModelConfig& c = model.config();
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!backend_.supports(precision)) {
      testing_support::skip_precision(backend_, precision, "a decoding step's operations");
      continue;
    }
    for (CacheFormat format : {CacheFormat::kFloat32, CacheFormat::kBFloat16}) {
      StackCache encoded;
      std::shared_ptr<const PreparedWeights> hold;
      encoder_forward(model, model.sequence_weights(precision, hold), batch_, {}, encoded);
      const int64_t n = batch_.batch, steps = 4;
      IncrementalDecoder decoder(model, encoded.memory.data(), n, batch_.src_len,
                                 batch_.src_lengths.data(), steps, n, precision, format);
      std::vector<int32_t> sentences(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) sentences[size_t(i)] = int32_t(i);
      decoder.start(sentences);
      DeviceBuffer<float> logits;
      logits.allocate_uninitialized(backend_, n * c.tgt_vocab_size);
      const std::vector<int32_t> tokens(size_t(n), int32_t(c.bos_id));
      std::map<std::string, int64_t> before;
      int64_t allocations = 0;
      for (int64_t t = 0; t < steps; ++t) {
        if (t + 1 == steps) before = backend_.calls(), allocations = backend_.allocations();
        decoder.step(tokens.data(), logits.data(), nullptr);
      }
      std::map<std::string, int64_t> step = backend_.calls();
      for (const auto& [operation, count] : before) step[operation] -= count;
      const std::string appends =
          format == CacheFormat::kFloat32 ? "scatter_rows" : "scatter_rows_to_16_bits";
      const std::string where = std::string(precision_name(precision)) + " products, " +
                                (format == CacheFormat::kFloat32 ? "float32" : "bfloat16") +
                                " cache";
      EXPECT_EQ(step[appends], c.decoder_layers) << where;
      EXPECT_EQ(step["round_to_16_bits"], 0) << where;
      EXPECT_EQ(step["copy"], 0) << where;
      EXPECT_EQ(backend_.allocations(), allocations) << where;
      EXPECT_EQ(step["attention_forward"] + step["attention_forward_16_bit_cache"],
                2 * c.decoder_layers)
          << where;
    }
  }
}

// Batches of the fixture's model in several shapes: the fixture's own, the longer source, the
// longer target, one sentence, many short ones.
std::vector<TokenBatch> batches_of_several_shapes(const ModelConfig& config,
                                                  const TokenBatch& fixture) {
  std::vector<TokenBatch> batches{fixture};
  Random random(11);
  const int64_t lowest = 4;  // past pad / bos / eos / unk in every fixture
  for (auto [count, longest_source, longest_target] :
       std::vector<std::array<int64_t, 3>>{{3, 7, 3}, {2, 3, 8}, {1, 5, 5}, {6, 2, 2}}) {
    std::vector<std::vector<int32_t>> sources, targets;
    for (int64_t i = 0; i < count; ++i) {
      auto sentence = [&](int64_t longest, int64_t vocab) {
        std::vector<int32_t> ids(size_t(i == 0 ? longest : 1 + random.next_u64() % longest));
        for (int32_t& id : ids) id = int32_t(lowest + random.next_u64() % (vocab - lowest));
        return ids;
      };
      sources.push_back(sentence(longest_source, config.src_vocab_size));
      targets.push_back(sentence(longest_target, config.tgt_vocab_size));
    }
    batches.push_back(make_batch(config, sources, targets));
  }
  return batches;
}

// A workspace planned from batch shapes (backend/workspace.h) is one block that every pass of
// those shapes fits without allocating, and its plan is exactly what the passes ask for: the
// same bytes as an unplanned workspace grows to, buffer sizes summed. run(ws) runs the passes
// and returns their results, which must be the unplanned workspace's bit for bit: so the
// buffers the plan puts in one shared slot hold nothing that is read after the slot's next
// buffer is written (there, each has memory of its own). Returns the bytes the slots spare.
template <typename PassWorkspace, typename Plan, typename Run>
int64_t expect_planned_block_fits_exactly(const MemoryCheckingBackend& backend, Plan plan,
                                          Run run) {
  PassWorkspace grown;  // unplanned: every buffer grows to the largest shape it meets
  const int64_t before = backend.live_bytes();
  const std::vector<double> grown_results = run(grown);
  const int64_t grown_bytes = backend.live_bytes() - before;

  PassWorkspace planned;
  plan(planned);
  EXPECT_EQ(planned.plan.needed_bytes(), grown_bytes);
  EXPECT_GT(planned.plan.buffers(), 20);
  const int64_t allocations = backend.allocations();
  planned.memory.allocate(backend, planned.plan);
  EXPECT_EQ(backend.allocations(), allocations + 1);  // the block
  EXPECT_EQ(planned.memory.bytes(), planned.plan.block_bytes());
  const std::vector<double> planned_results = run(planned);
  EXPECT_EQ(backend.allocations(), allocations + 1) << "a pass grew a buffer past its plan";
  EXPECT_EQ(planned_results, grown_results);
  return planned.plan.needed_bytes() - planned.plan.held_bytes();
}

// The trainer's passes over `batches` in `precision`: for each batch, a training pass with
// `dropout` and a validation pass (no dropout, no gradient). plan(ws) plans them; run(ws) runs them
// as a run interleaves them and returns their results: every pass' totals and the gradients'
// checksum.
class TrainingPasses {
 public:
  TrainingPasses(const Model& model, std::vector<TokenBatch> batches, const DropoutOptions& dropout,
                 Precision precision)
      : model_(model),
        batches_(std::move(batches)),
        dropout_(dropout),
        precision_(precision),
        gradients_(DeviceTensors::zeros_like(model.parameters())),
        bound_(bind_gradients(model.config(), gradients_)) {}
  void plan(TrainingWorkspace& ws) const {
    for (const TokenBatch& batch : batches_) {
      plan_loss_and_gradients(model_, shape_of(batch), dropout_, true, ws, precision_);
      plan_loss_and_gradients(model_, shape_of(batch), {}, false, ws, precision_);
    }
  }
  std::vector<double> run(TrainingWorkspace& ws) {
    gradients_.set_zero();
    std::vector<double> results;
    for (const TokenBatch& batch : batches_)
      for (float grad_scale : {1e-2f, 0.f}) {
        const LossTotals totals = loss_and_gradients(
            model_, bound_, batch, grad_scale != 0.f ? dropout_ : DropoutOptions{}, 0.1f,
            grad_scale, ws, precision_);
        results.insert(results.end(), {totals.loss, totals.nll, double(totals.correct)});
      }
    const uint64_t checksum = checksum_tensors(gradients_);
    results.insert(results.end(), {double(checksum >> 32), double(checksum & 0xffffffffu)});
    return results;
  }

 private:
  const Model& model_;
  std::vector<TokenBatch> batches_;
  DropoutOptions dropout_;
  Precision precision_;
  DeviceTensors gradients_;
  TransformerGradients bound_;
};

// Training and validation passes (the trainer's TrainingWorkspace), in each precision, with and
// without dropout inside the feed-forward layer (without it, bfloat16 training holds the hidden
// layer in bfloat16 only: model/feed_forward.cpp).
TEST_P(BackendMemory, PlannedTrainingActivationsAreOneBlockThatThePassesFitExactly) {
  const Model& model = *model_;
  const std::vector<TokenBatch> batches = batches_of_several_shapes(model.config(), batch_);
  for (float relu_dropout : {0.1f, 0.f})
    for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
      if (!backend_.supports(precision)) {
        testing_support::skip_precision(backend_, precision, "planned training");
        continue;
      }
      SCOPED_TRACE(std::string(precision_name(precision)) + " relu dropout " +
                   std::to_string(relu_dropout));
      DropoutOptions dropout;
      dropout.dropout = dropout.attention_dropout = 0.1f;
      dropout.relu_dropout = relu_dropout;
      dropout.seed = 5;
      TrainingPasses passes(model, batches, dropout, precision);
      const int64_t spared = expect_planned_block_fits_exactly<TrainingWorkspace>(
          backend_, [&](TrainingWorkspace& ws) { passes.plan(ws); },
          [&](TrainingWorkspace& ws) { return passes.run(ws); });
      // Float32 training's backward reads every float32 activation; bfloat16 training's reads
      // the copies, and shares the float32 attention contexts (model/workspace_slots.h) and,
      // post-norm, the sublayer outputs.
      if (precision == Precision::kFloat32) {
        EXPECT_EQ(spared, 0);
      }
      if (precision == Precision::kBFloat16) {
        const int64_t rows = batch_.batch * std::min(batch_.src_len, batch_.tgt_len);
        const int64_t layers = model.config().encoder_layers + model.config().decoder_layers;
        const int64_t one = rows * model.config().d_model * int64_t(sizeof(float));
        EXPECT_GE(spared, (model.config().norm == NormPosition::kPost ? layers : 1) * one);
        // Each operand rounded once (the weights per pass, the attention inputs, the output
        // gradients: the copies handed to matmul) gives bit for bit what rounding it again at
        // every product gives.
        TrainingWorkspace once, at_each_product;
        const int64_t before = backend_.rounded_operands(), masks = backend_.relu_masks();
        const std::vector<double> rounded_once = passes.run(once);
        EXPECT_GT(backend_.rounded_operands(), before) << "no product was handed a rounded copy";
        // With ReLU and no dropout inside, fc1's record of its ReLU goes to fc2's backward.
        if (model.config().activation == Activation::kRelu && relu_dropout == 0.f) {
          EXPECT_GT(backend_.relu_masks(), masks) << "no product was handed a ReLU mask";
        }
        backend_.set_ignore_rounded_copies(true);
        const std::vector<double> rounded_again = passes.run(at_each_product);
        backend_.set_ignore_rounded_copies(false);
        EXPECT_EQ(rounded_once, rounded_again);
      }
    }
  EXPECT_TRUE(backend_.violations().empty())
      << "host memory handed to operations:" << listed(backend_.violations());
}

// Training on a backend that keeps no dropout mask (a GPU's: Backend::dropout_mask_bytes 0), whose
// dropouts' backwards draw the forward's decisions again from their keys: every pass gives bit
// for bit what the kept masks give, in each precision, and the plan holds no mask (the
// sublayers' and the embeddings' one byte an element gone; dropout everywhere here).
TEST_P(BackendMemory, TrainingWithoutKeptMasksDrawsTheSameDecisionsAgain) {
  const Model& model = *model_;
  const std::vector<TokenBatch> batches = batches_of_several_shapes(model.config(), batch_);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!backend_.supports(precision)) {
      testing_support::skip_precision(backend_, precision, "training without kept masks");
      continue;
    }
    SCOPED_TRACE(precision_name(precision));
    DropoutOptions dropout;
    dropout.dropout = dropout.attention_dropout = dropout.relu_dropout = 0.1f;
    dropout.seed = 9;
    TrainingPasses passes(model, batches, dropout, precision);
    TrainingWorkspace kept, with_masks_planned;
    const std::vector<double> with_masks = passes.run(kept);
    passes.plan(with_masks_planned);
    backend_.set_keeps_dropout_masks(false);
    TrainingWorkspace drawn, without_masks_planned;
    EXPECT_EQ(passes.run(drawn), with_masks);
    passes.plan(without_masks_planned);
    const ModelConfig& c = model.config();
    const int64_t sublayers = 2 * c.encoder_layers + 3 * c.decoder_layers + 2;  // + embeddings
    EXPECT_GE(with_masks_planned.plan.needed_bytes() - without_masks_planned.plan.needed_bytes(),
              sublayers * batch_.batch * std::min(batch_.src_len, batch_.tgt_len) * c.d_model);
    expect_planned_block_fits_exactly<TrainingWorkspace>(
        backend_, [&](TrainingWorkspace& ws) { passes.plan(ws); },
        [&](TrainingWorkspace& ws) { return passes.run(ws); });
    backend_.set_keeps_dropout_masks(true);
  }
  EXPECT_TRUE(backend_.violations().empty())
      << "host memory handed to operations:" << listed(backend_.violations());
}

// Training in bfloat16 on a backend whose attention reads Q, K and V in bfloat16 alone (CUDA's
// tensor-core blocks, for calls without attention dropout): the projections write them so, in
// buffers the plan sized (without attention dropout, and with it, where they stay float32), and
// every pass gives bit for bit what rounding float32 Q, K and V as the attention loads them gives
// (the products round their own sums as the float32 ones are rounded).
TEST_P(BackendMemory, BFloat16ProjectionsAreWrittenAloneWhereTheAttentionReadsNothingElse) {
  using Mode = MemoryCheckingBackend::BFloat16Attention;
  if (!backend_.supports(Precision::kBFloat16)) {
    testing_support::skip_precision(backend_, Precision::kBFloat16, "bfloat16 projections");
    return;
  }
  const Model& model = *model_;
  const std::vector<TokenBatch> batches = batches_of_several_shapes(model.config(), batch_);
  for (float attention_dropout : {0.f, 0.1f}) {
    SCOPED_TRACE("attention dropout " + std::to_string(attention_dropout));
    DropoutOptions dropout;
    dropout.dropout = dropout.relu_dropout = 0.1f;
    dropout.attention_dropout = attention_dropout;
    dropout.seed = 3;
    TrainingPasses passes(model, batches, dropout, Precision::kBFloat16);
    TrainingWorkspace at_load;
    backend_.set_bfloat16_attention(Mode::kRoundedAtLoad);
    const std::vector<double> rounded_at_load = passes.run(at_load);
    backend_.set_bfloat16_attention(Mode::kRoundedAlone);
    const int64_t before = backend_.rounded_attention_calls();
    TrainingWorkspace alone;
    const std::vector<double> rounded_alone = passes.run(alone);
    EXPECT_GT(backend_.rounded_attention_calls(), before)
        << "no attention call was handed Q, K and V in bfloat16 alone";
    EXPECT_EQ(rounded_alone, rounded_at_load);
    expect_planned_block_fits_exactly<TrainingWorkspace>(
        backend_, [&](TrainingWorkspace& ws) { passes.plan(ws); },
        [&](TrainingWorkspace& ws) { return passes.run(ws); });
    backend_.set_bfloat16_attention(Mode::kAsGiven);
  }
  EXPECT_TRUE(backend_.violations().empty())
      << "host memory handed to operations:" << listed(backend_.violations());
}

// Scoring (the score command's ScoringWorkspace), in each precision: float32 reads the model's
// own weights, bfloat16 and int8 the prepared ones (stacked Q|K|V and K|V products).
TEST_P(BackendMemory, PlannedScoringActivationsAreOneBlockThatThePassesFitExactly) {
  const Model& model = *model_;
  const std::vector<TokenBatch> batches = batches_of_several_shapes(model.config(), batch_);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kInt8}) {
    if (!backend_.supports(precision)) {
      testing_support::skip_precision(backend_, precision, "planned scoring");
      continue;
    }
    SCOPED_TRACE(precision_name(precision));
    auto plan = [&](ScoringWorkspace& ws) {
      for (const TokenBatch& batch : batches)
        plan_score_forward(model, shape_of(batch), ws, precision);
    };
    auto run = [&](ScoringWorkspace& ws) {
      std::vector<double> results;
      std::vector<float> logprobs;
      for (const TokenBatch& batch : batches) {
        score_forward(model, batch, ws, logprobs, precision);
        results.insert(results.end(), logprobs.begin(), logprobs.end());
      }
      return results;
    };
    // Prepared weights are the model's memory, not the workspace's: made before either counts.
    if (precision != Precision::kFloat32) model.prepared(precision);
    expect_planned_block_fits_exactly<ScoringWorkspace>(backend_, plan, run);
  }
  EXPECT_TRUE(backend_.violations().empty())
      << "host memory handed to operations:" << listed(backend_.violations());
}

// The checking backend's memory is not the host's (memory_is_host() false), so loading and
// saving on it take the staged paths a GPU takes: the model it loads decodes as the CPU's
// does, and the file it saves is the CPU's byte for byte.
TEST_P(BackendMemory, LoadingAndSavingThroughTheHostKeepEveryValue) {
  const Model on_cpu = load_model(file_, tfm::cpu_backend());
  SearchOptions o;
  o.max_length_b = 6;
  const auto expected = search(on_cpu, sources_, {}, o);
  const auto found = search(*model_, sources_, {}, o);
  ASSERT_EQ(found.size(), expected.size());
  for (size_t s = 0; s < found.size(); ++s) {
    EXPECT_EQ(found[s][0].tokens, expected[s][0].tokens) << s;
    EXPECT_EQ(found[s][0].logprob, expected[s][0].logprob) << s;
  }
  const std::string from_cpu = ::testing::TempDir() + "/memory_" + GetParam() + "_cpu";
  const std::string from_backend = ::testing::TempDir() + "/memory_" + GetParam() + "_backend";
  save_model(on_cpu, from_cpu);
  save_model(*model_, from_backend);
  EXPECT_EQ(read_file_bytes(from_backend), read_file_bytes(from_cpu));
  EXPECT_EQ(checksum_tensors(model_->parameters()), checksum_tensors(on_cpu.parameters()));
  std::remove(from_cpu.c_str());
  std::remove(from_backend.c_str());
  EXPECT_TRUE(backend_.violations().empty()) << listed(backend_.violations());
}

// The check itself: a host vector handed to an operation is caught.
TEST(BackendMemoryCheck, AHostArrayIsReported) {
  MemoryCheckingBackend backend;
  DeviceBuffer<float> device;
  float* y = ensure_size(backend, device, 4);
  std::vector<float> host(4, 1.f);
  backend.add(y, device.data(), 4);
  EXPECT_TRUE(backend.violations().empty());
  backend.add(y, host.data(), 4);
  EXPECT_EQ(backend.violations(), std::set<std::string>{"add: x"});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BackendMemory,
                         ::testing::ValuesIn(testing_support::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tfm
