// Decoding steps that a backend records once and replays (Backend::run_and_record: CUDA graphs
// on a GPU). A replay runs the operations with the arguments of the step that was recorded, so
// every argument that changes from step to step must reach them through memory. This test runs
// the searches on a backend that is the CPU's in every operation but records them as a GPU
// would: each call of a recorded step is kept as a closure over its arguments and replayed as
// such, allocations while recording are refused and memory changes since a recording refuse its
// replay. A step argument that still carries the position (a key count, a stride, an offset)
// then replays stale and the translations differ from the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "decode/beam_search.h"
#include "fixture_batch.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "skip_report.h"

namespace tfm {
namespace {

// The closures of one recorded step, in order.
struct RecordedClosures : RecordedOperations {
  std::vector<std::function<void()>> operations;
  int64_t memory_changes = 0;
};

class RecordingCpuBackend final : public Backend {
 public:
  int64_t recordings() const { return recordings_; }
  int64_t replays() const { return replays_; }

  std::string name() const override { return "recording cpu"; }
  bool supports(Precision precision) const override { return cpu().supports(precision); }
  std::string unsupported_reason(Precision precision) const override {
    return cpu().unsupported_reason(precision);
  }

  bool records_operations() const override { return true; }
  std::shared_ptr<const RecordedOperations> run_and_record(
      const std::function<void()>& operations) const override {
    auto recorded = std::make_shared<RecordedClosures>();
    recorded->memory_changes = memory_changes_;
    recording_ = recorded.get();
    try {
      operations();
    } catch (const Refused&) {  // as on a GPU: dropped, and the operations run unrecorded
      recording_ = nullptr;
      operations();
      return nullptr;
    } catch (...) {
      recording_ = nullptr;
      throw;
    }
    recording_ = nullptr;
    ++recordings_;
    return recorded;
  }
  bool replay(const RecordedOperations& recording) const override {
    const auto& recorded = dynamic_cast<const RecordedClosures&>(recording);
    if (recorded.memory_changes != memory_changes_) return false;
    for (const auto& operation : recorded.operations) operation();
    ++replays_;
    return true;
  }

  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta, float* c,
              int64_t ldc, Precision precision, MatmulEpilogue epilogue) const override {
    queue([=] {
      cpu().matmul(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision,
                   epilogue);
    });
  }
  void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx, Precision format,
                        uint16_t* out) const override {
    queue([=] { cpu().round_to_16_bits(x, rows, cols, ldx, format, out); });
  }
  std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                 const std::vector<int64_t>& part_rows, int64_t k,
                                                 Precision precision) const override {
    refuse_while_recording();
    return std::make_unique<Matrix>(*this, cpu().prepare_matrix(parts, part_rows, k, precision));
  }
  std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                      const std::vector<int64_t>& part_rows,
                                                      int64_t k) const override {
    refuse_while_recording();
    return std::make_unique<Matrix>(*this, cpu().prepare_int8_matrix(parts, part_rows, k));
  }

  void attention_forward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                         const float* k, const float* v, float* probs, float* out,
                         const AttentionDropout& dropout) const override {
    queue([=] { cpu().attention_forward(shape, mask, q, k, v, probs, out, dropout); });
  }
  void attention_forward_16_bit_cache(const AttentionShape& shape, const AttentionMask& mask,
                                      const float* q, Precision format, const uint16_t* k,
                                      const uint16_t* v, float* probs, float* out) const override {
    queue([=] { cpu().attention_forward_16_bit_cache(shape, mask, q, format, k, v, probs, out); });
  }
  void attention_backward(const AttentionShape& shape, const AttentionMask& mask, const float* q,
                          const float* k, const float* v, const float* probs,
                          const AttentionDropout& dropout, const float* d_out, float* dq, float* dk,
                          float* dv, float* d_additive_v) const override {
    queue([=] {
      cpu().attention_backward(shape, mask, q, k, v, probs, dropout, d_out, dq, dk, dv,
                               d_additive_v);
    });
  }

  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps, float* mean, float* rstd) const override {
    queue([=] { cpu().layer_norm(x, gamma, beta, y, rows, cols, eps, mean, rstd); });
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                           const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols, bool accumulate) const override {
    queue([=] {
      cpu().layer_norm_backward(dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols,
                                accumulate);
    });
  }
  void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                           uint64_t key, uint8_t* mask, const float* gamma, const float* beta,
                           float eps, float* y, float* mean, float* rstd,
                           uint16_t* rounded_y) const override {
    queue([=] {
      cpu().residual_layer_norm(f, x, rows, cols, p, key, mask, gamma, beta, eps, y, mean, rstd,
                                rounded_y);
    });
  }
  void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                    const float* rstd, const float* gamma, float* dgamma,
                                    float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                    float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                    int64_t rows, int64_t cols) const override {
    queue([=] {
      cpu().residual_layer_norm_backward(dy, sum, mean, rstd, gamma, dgamma, dbeta, mask, p, key,
                                         d_f, rounded_d_f, d_f_column_sums, rows, cols);
    });
  }
  void add(float* y, const float* x, int64_t n) const override {
    queue([=] { cpu().add(y, x, n); });
  }
  void scale(float* x, float s, int64_t n) const override {
    queue([=] { cpu().scale(x, s, n); });
  }
  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const override {
    queue([=] { cpu().add_bias(y, bias, rows, cols); });
  }
  void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                           Activation act) const override {
    queue([=] { cpu().add_bias_activation(pre, bias, out, rows, cols, act); });
  }
  void activation_backward(float* d, const float* pre_activation, int64_t n,
                           Activation act) const override {
    queue([=] { cpu().activation_backward(d, pre_activation, n, act); });
  }
  void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                              int64_t cols, uint16_t* rounded_d,
                              float* column_sums) const override {
    queue(
        [=] { cpu().relu_backward_bfloat16(d, relu_output, rows, cols, rounded_d, column_sums); });
  }
  void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows, int64_t cols,
                     int64_t ld, float* dbias) const override {
    queue([=] { cpu().bias_backward(dy, rounded_dy, rows, cols, ld, dbias); });
  }
  void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const override {
    queue([=] { cpu().dropout_mask(mask, n, p, key); });
  }
  void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                     uint64_t key) const override {
    queue([=] { cpu().apply_dropout(x, mask, n, p, key); });
  }

  void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                         int64_t rows, int64_t len, int64_t d, float scale, int64_t first_position,
                         float* out) const override {
    queue([=] {
      cpu().embedding_forward(table, positions, ids, rows, len, d, scale, first_position, out);
    });
  }
  void embedding_forward_int8(const Int8Rows& table, const float* positions, const int32_t* ids,
                              int64_t rows, int64_t len, int64_t d, float scale,
                              int64_t first_position, float* out) const override {
    queue([=] {
      cpu().embedding_forward_int8(table, positions, ids, rows, len, d, scale, first_position, out);
    });
  }
  void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                  const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                  float scale, int64_t first_position, float* out) const override {
    const PreparedMatrix* inner = &dynamic_cast<const Matrix&>(table).inner();
    queue([=] {
      cpu().embedding_forward_prepared(*inner, positions, ids, rows, len, d, scale, first_position,
                                       out);
    });
  }
  void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                          int64_t d, float scale, int64_t first_position, float* d_table,
                          float* d_positions) const override {
    queue([=] {
      cpu().embedding_backward(d_out, ids, rows, len, d, scale, first_position, d_table,
                               d_positions);
    });
  }

  void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows, int64_t cols,
                        float* out) const override {
    queue([=] { cpu().log_softmax_pick(logits, targets, rows, cols, out); });
  }
  void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float smoothing, float grad_scale,
                                      double* row_totals,
                                      uint16_t* rounded_gradient) const override {
    queue([=] {
      cpu().cross_entropy_forward_backward(logits, targets, rows, vocab, smoothing, grad_scale,
                                           row_totals, rounded_gradient);
    });
  }
  void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                   float* values, int32_t* tokens, float* log_sums) const override {
    queue([=] { cpu().best_tokens(scores, rows, vocab, keep, banned, values, tokens, log_sums); });
  }
  void adam_update(float* const* params, const int64_t* offsets, int64_t count, int64_t total,
                   const float* grad, float* m, float* v, const AdamHyperparameters& h,
                   int64_t step) const override {
    queue([=] { cpu().adam_update(params, offsets, count, total, grad, m, v, h, step); });
  }
  void sgd_update(float* param, const float* grad, int64_t n, float lr) const override {
    queue([=] { cpu().sgd_update(param, grad, n, lr); });
  }
  double sum_of_squares(const float* x, int64_t n) const override {
    refuse_while_recording();  // a result for the host: a GPU waits for it
    return cpu().sum_of_squares(x, n);
  }

  void* allocate(int64_t bytes, bool zeroed) const override {
    refuse_while_recording();
    ++memory_changes_;
    return cpu().allocate(bytes, zeroed);
  }
  void deallocate(void* memory) const override {
    ++memory_changes_;
    cpu().deallocate(memory);
  }
  bool memory_is_host() const override { return true; }
  void copy_bytes(const void* from, int64_t bytes, void* to) const override {
    queue([=] { cpu().copy_bytes(from, bytes, to); });
  }
  // The host's side of a copy is read or written when the call is made, not when a recording
  // replays: neither belongs in one.
  void copy_from_host(const void* host, int64_t bytes, void* device) const override {
    refuse_while_recording();
    cpu().copy_from_host(host, bytes, device);
  }
  void copy_to_host(const void* device, int64_t bytes, void* host) const override {
    refuse_while_recording();
    cpu().copy_to_host(device, bytes, host);
  }
  void copy(const float* x, int64_t n, float* y) const override {
    queue([=] { cpu().copy(x, n, y); });
  }
  void fill(float* y, int64_t n, float value) const override {
    queue([=] { cpu().fill(y, n, value); });
  }
  void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                   float* y, int64_t ldy) const override {
    queue([=] { cpu().gather_rows(x, ldx, rows, count, d, y, ldy); });
  }
  void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count, int64_t d,
                    float* y, int64_t ldy) const override {
    queue([=] { cpu().scatter_rows(x, ldx, rows, count, d, y, ldy); });
  }
  void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                          float* y) const override {
    queue([=] { cpu().mean_of_row_groups(x, groups, group_size, cols, y); });
  }
  void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                               int64_t d, Precision format, uint16_t* y,
                               int64_t ldy) const override {
    queue([=] { cpu().scatter_rows_to_16_bits(x, ldx, rows, count, d, format, y, ldy); });
  }

 private:
  struct Refused {};  // an allocation or a host transfer while recording

  // A prepared matrix of the CPU's whose products are recorded like any operation.
  class Matrix final : public PreparedMatrix {
   public:
    Matrix(const RecordingCpuBackend& owner, std::unique_ptr<PreparedMatrix> inner)
        : owner_(owner), inner_(std::move(inner)) {}
    int64_t rows() const override { return inner_->rows(); }
    int64_t cols() const override { return inner_->cols(); }
    Precision precision() const override { return inner_->precision(); }
    void multiply(MatmulOperand x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                  const MatmulEpilogue& epilogue) const override {
      const PreparedMatrix* inner = inner_.get();
      owner_.queue([=] { inner->multiply(x, m, ldx, y, ldy, epilogue); });
    }
    void read_rows(const int32_t* ids, int64_t count, float* out) const override {
      const PreparedMatrix* inner = inner_.get();
      owner_.queue([=] { inner->read_rows(ids, count, out); });
    }
    const PreparedMatrix& inner() const { return *inner_; }

   private:
    const RecordingCpuBackend& owner_;
    std::unique_ptr<PreparedMatrix> inner_;
  };

  static const Backend& cpu() { return cpu_backend(); }
  void refuse_while_recording() const {
    if (recording_) throw Refused{};
  }
  // Runs the operation, and keeps it where a step is being recorded.
  void queue(std::function<void()> operation) const {
    operation();
    if (recording_) recording_->operations.push_back(std::move(operation));
  }

  mutable RecordedClosures* recording_ = nullptr;
  mutable int64_t memory_changes_ = 0;
  mutable int64_t recordings_ = 0, replays_ = 0;
};

class StepRecording : public ::testing::TestWithParam<std::string> {};

// Every search a user can ask for — greedy and beam, float32 and bfloat16 caches and products,
// with and without the cross-attention weights — gives on the recording backend exactly the
// CPU's translations, scores and weights, and replays most of its steps.
TEST_P(StepRecording, ReplayedStepsTranslateAsTheCpuDoes) {
  const std::string base = std::string(TFM_FIXTURE_DIR) + "/" + GetParam();
  const RecordingCpuBackend recording;
  const Model on_cpu = load_model(base + ".safetensors", cpu_backend());
  const Model recorded = load_model(base + ".safetensors", recording);
  const TensorMap io = read_safetensors(base + ".io.safetensors").tensors;
  const auto fixture_sources = testing_support::fixture_rows(io.at("src_tokens"));
  // Also 13 sentences of several lengths, which end at different steps (their length limits
  // differ), so the live set shrinks step by step: the recorded steps then compute a few rows
  // past the live ones (IncrementalDecoder::step_rows), which must change nothing.
  std::vector<std::vector<int32_t>> varied;
  for (size_t i = 0; i < 13; ++i) {
    std::vector<int32_t> sentence = fixture_sources[i % fixture_sources.size()];
    sentence.resize(size_t(std::max<int64_t>(1, int64_t(sentence.size()) - int64_t(i % 4))));
    varied.push_back(sentence);
  }
  // A self-attention window needs the position in its mask: such a model's steps run unrecorded.
  const bool records = on_cpu.config().self_attention_window < 0;
  const std::vector<std::vector<int32_t>>* source_sets[] = {&fixture_sources, &varied};
  int64_t searches = 0;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!cpu_backend().supports(precision)) {
      testing_support::skip_precision(cpu_backend(), precision, "recorded decoding steps");
      continue;
    }
    for (CacheFormat cache : {CacheFormat::kFloat32, CacheFormat::kBFloat16}) {
      for (int64_t beam : {1, 4}) {
        for (bool attention : {false, true}) {
          for (const std::vector<std::vector<int32_t>>* sources : source_sets) {
            SearchOptions o;
            o.beam = beam;
            o.max_length_a = 1;
            o.max_length_b = 7;
            o.min_length = 6;  // steps enough to replay, whatever the fixture's model prefers
            o.precision = precision;
            o.cache = cache;
            o.attention = attention;
            o.attention_per_head = beam > 1;
            o.nbest = beam > 1 ? 2 : 1;
            const std::string where = std::string(precision_name(precision)) + " products, " +
                                      (cache == CacheFormat::kFloat32 ? "float32" : "bfloat16") +
                                      " cache, beam " + std::to_string(beam) +
                                      (attention ? ", attention" : "") +
                                      (sources == &varied ? ", 13 sentences" : "");
            const int64_t replays = recording.replays();
            const auto expected = search(on_cpu, *sources, {}, o);
            const auto found = search(recorded, *sources, {}, o);
            if (records)
              EXPECT_GT(recording.replays(), replays) << where;
            else
              EXPECT_EQ(recording.replays(), replays) << where;
            ASSERT_EQ(found.size(), expected.size()) << where;
            for (size_t s = 0; s < found.size(); ++s) {
              ASSERT_EQ(found[s].size(), expected[s].size()) << where << ", sentence " << s;
              for (size_t h = 0; h < found[s].size(); ++h) {
                EXPECT_EQ(found[s][h].tokens, expected[s][h].tokens) << where << ", sentence " << s;
                EXPECT_EQ(found[s][h].logprob, expected[s][h].logprob) << where;
                EXPECT_EQ(found[s][h].attention, expected[s][h].attention) << where;
              }
            }
            ++searches;
          }
        }
      }
    }
  }
  EXPECT_GT(searches, 0);
  EXPECT_EQ(recording.recordings() > 0, records);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StepRecording,
                         ::testing::ValuesIn(testing_support::fixture_names()));

}  // namespace
}  // namespace tfm
