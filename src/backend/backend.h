// The seam between the Transformer and the hardware it runs on. Every operation that layers, the
// loss, the decoder and the optimizer perform on activations, gradients and weights is a method of
// Backend; model/, train/ and decode/ call these methods and never a device's kernels directly.
// A backend implements this list (docs/adding-a-backend.md) and registers itself in
// available_backends(); tests/backend_ops_test.cpp then checks every operation of it, in every
// precision it supports, against a float64 reference.
//
// Pointers passed to a backend address memory it can read and write (for the CPU backend, host
// memory) — values and index arrays alike (token ids, lengths, row lists: the host computes them
// and uploads them, backend/device_buffer.h), except where a method says "host"; sizes are
// element counts; matrices are row-major with the row strides given.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/operation_types.h"
#include "tensor/int8_weights.h"

namespace tfm {

// A constant weight matrix W[n, k] (row-major, as Linear stores it) converted once into the
// layout and number format the backend multiplies fastest, for y[m, n] = x[m, k] · Wᵀ with any m.
// Several matrices with the same k may be stacked (their rows concatenated), e.g. the Q, K and V
// projections as one product. Inference only: later changes to the source weights are not seen.
class PreparedMatrix {
 public:
  virtual ~PreparedMatrix() = default;
  virtual int64_t rows() const = 0;  // n
  virtual int64_t cols() const = 0;  // k
  virtual Precision precision() const = 0;
  // y[m, n] (row stride ldy) = x[m, k] (row stride ldx) · Wᵀ, then the epilogue's bias (on
  // every row) and ReLU applied to the finished product, in the product's own pass where the
  // backend can (a linear layer's y = x·Wᵀ + b in one step). A bfloat16 matrix reads x.rounded
  // ([m, k]: x rounded to bfloat16, row stride x.rounded_stride(k)) where it is given,
  // instead of rounding x.values itself, and writes its result in bfloat16 only where
  // epilogue.rounded_output is given ([m, ldy], nearest, ties to even; a result below the
  // smallest normal float may be flushed to zero; y is then not touched and may be null).
  // Other precisions read x.values and write y. Throws std::invalid_argument for a missing
  // operand, and for a bfloat16 output from another precision. Thread-safe.
  virtual void multiply(MatmulOperand x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                        const MatmulEpilogue& epilogue = {}) const = 0;
  // out[count, k] = the rows ids of W, exactly as prepared. For float32 matrices only (throws
  // std::logic_error otherwise): a tied output projection of a model prepared for inference
  // serves the embedding lookups too, and the float table is freed.
  virtual void read_rows(const int32_t* ids, int64_t count, float* out) const = 0;
};

// Operations a backend kept, as it queued them, to queue them again for less than the calls cost
// (a CUDA graph): Backend::run_and_record makes one, Backend::replay runs it.
class RecordedOperations {
 public:
  virtual ~RecordedOperations() = default;
};

// How a collective of DeviceCollectives waits for the other ranks: at most timeout_seconds, and
// no longer once *stop is non-zero (a signal to the trainer; null: never).
struct CollectiveWait {
  double timeout_seconds = 300;
  const std::atomic<int>* stop = nullptr;
};

// One wait's deadline under a CollectiveWait, for the loops that poll a collective (Replicas'
// MPI requests, the CUDA backend's NCCL): check() throws Error, naming `what`, once the wait's
// time is up, or once its stop flag has been set for a grace period (min(timeout, 60 s): mpirun
// signals every rank when one dies, and the live ones finish the collective meanwhile). The
// messages begin with `prefix` ("rank 1 of 4: ") and speak of the other `peers` ("ranks").
class CollectiveDeadline {
 public:
  CollectiveDeadline(const CollectiveWait& wait, std::string prefix, const char* peers);
  void check(const char* what);

 private:
  CollectiveWait wait_;
  std::string prefix_;
  const char* peers_;
  std::chrono::steady_clock::time_point start_, signalled_{};
};

// The collectives of a data-parallel job (train/replicas.h) among the ranks' memory of one
// backend each, where the backend has a library for them (NCCL between GPUs) instead of MPI over
// host copies. Each waits until it is done on this rank; a rank that does not answer within the
// wait, an error of the library, or the stop flag ends it with Error, the communicator then
// aborted (every later call throws too).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // data[n] (float32, the backend's memory) becomes the element-wise sum over the ranks.
  virtual void sum(float* data, int64_t n, const CollectiveWait& wait) = 0;
  // data[n] becomes rank 0's.
  virtual void broadcast(float* data, int64_t n, const CollectiveWait& wait) = 0;
  // The library and version, for the log ("NCCL 2.28.3").
  virtual std::string description() const = 0;
};

// What join_collectives needs from the job's other channel (MPI), called by every rank in the
// same order: share(bytes) makes every rank's bytes rank 0's (a broadcast); all_agree(ok) is
// whether ok holds on every rank.
struct CollectiveBootstrap {
  std::function<void(std::vector<char>& bytes)> share;
  std::function<bool(bool ok)> all_agree;
};

// Bytes of a backend's own memory that its allocations hold: now, at most since the process
// began, and at most reserved from the device for them (allocated or cached for reuse) — what
// PyTorch's memory_allocated, max_memory_allocated and max_memory_reserved say of its own.
struct DeviceMemory {
  int64_t in_use = -1;
  int64_t peak_in_use = -1;
  int64_t peak_reserved = -1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // What --device names this backend ("cpu").
  virtual std::string name() const = 0;
  // Whether matmul and prepare_matrix accept this precision here (bfloat16 needs AVX512-BF16 on
  // the CPU; float16 runs on GPUs only).
  virtual bool supports(Precision precision) const = 0;
  // Why supports(precision) is false, as the end of a sentence about it ("needs a CPU with
  // AVX512-BF16 instructions"): what error messages say. By default "is not supported by
  // device <name>".
  virtual std::string unsupported_reason(Precision precision) const;

  // --- Matrix products ---------------------------------------------------------------------
  // C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C, op(X) = X or Xᵀ; lda/ldb/ldc are
  // the row strides of A, B, C as stored. k = 0 leaves beta · C. `precision`: kFloat32, or
  // kBFloat16 (bfloat16 training): every element of A and B rounded to bfloat16 (nearest, ties
  // to even), the products accumulated in float32; an operand whose `rounded` copy is given
  // (MatmulOperand) is read from it instead; or kFloat16 (where supported): the same with A and
  // B rounded to float16, always from their values. The epilogue (bias, ReLU: MatmulEpilogue) then
  // applies to the finished C, which epilogue.rounded_output may ask for in bfloat16 instead
  // (kBFloat16 with beta 0 only; c is then not touched). Throws std::invalid_argument for a
  // precision supports() refuses, for kInt8 (weights only: prepare_matrix), for a
  // rounded_output elsewhere than kBFloat16 with beta 0, and for a ReLU gate (relu_output) with
  // more than a dense bfloat16 output (check_relu_gate).
  virtual void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      MatmulOperand a, int64_t lda, MatmulOperand b, int64_t ldb, float beta,
                      float* c, int64_t ldc, Precision precision,
                      MatmulEpilogue epilogue = {}) const = 0;
  // out[rows, cols] (dense) = x[rows, cols] (row stride ldx) rounded to `format`, kBFloat16 or
  // kFloat16 (nearest, ties to even; NaN stays NaN; float16 past 65504 becomes ±Inf): what a
  // bfloat16 matmul reads, for operands used by several products, and a 16-bit key/value cache's
  // rows. Every backend rounds to both formats, whatever supports() says of their products;
  // std::invalid_argument for any other format.
  virtual void round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx,
                                Precision format, uint16_t* out) const = 0;
  // Each job's floats rounded into its out as round_to_16_bits rounds them: training in
  // bfloat16 rounds every weight matrix once a pass (model/weights.h: with_rounded_weights), a
  // hundred matrices for the base model. A GPU does them in one launch; by default, each job is
  // round_to_16_bits over rows of 1,024 and one over the rest. std::invalid_argument for a format
  // other than the two.
  virtual void round_each_to_16_bits(const std::vector<RoundingJob>& jobs, Precision format) const;
  // parts[i] is [part_rows[i], k]; the prepared matrix stacks them in order. Throws
  // std::invalid_argument for a precision supports() refuses.
  virtual std::unique_ptr<PreparedMatrix> prepare_matrix(const std::vector<const float*>& parts,
                                                         const std::vector<int64_t>& part_rows,
                                                         int64_t k, Precision precision) const = 0;
  // The same from weights already held in int8 (tensor/int8_weights.h), multiplied in
  // Precision::kInt8 exactly as prepare_matrix(kInt8) on their float originals would (that
  // quantises by the same rule). Throws std::invalid_argument where supports(kInt8) is false.
  virtual std::unique_ptr<PreparedMatrix> prepare_int8_matrix(const std::vector<Int8Rows>& parts,
                                                              const std::vector<int64_t>& part_rows,
                                                              int64_t k) const = 0;

  // --- Attention (§3.2.1, all heads of a padded batch) ---------------------------------------
  // out = softmax(score(Q, K) + mask) · V with the masks and modes of AttentionShape /
  // AttentionMask (padding, causal, window, single query over cached rows, key-batch sharing).
  // probs [batch, heads, Tq, Tk] receives the weights before dropout, or is null (inference:
  // streamed, weights never stored). dropout.mask is written when dropout.p > 0.
  virtual void attention_forward(const AttentionShape& shape, const AttentionMask& mask,
                                 const float* q, const float* k, const float* v, float* probs,
                                 float* out, const AttentionDropout& dropout) const = 0;
  // Incremental decoding over a key/value cache stored in `format`, kBFloat16 or kFloat16
  // (round_to_16_bits; row strides in elements): attention_forward for shape.query_len 1 without
  // dropout, q, probs and out in float. Every backend reads both formats;
  // std::invalid_argument for any other.
  virtual void attention_forward_16_bit_cache(const AttentionShape& shape,
                                              const AttentionMask& mask, const float* q,
                                              Precision format, const uint16_t* k,
                                              const uint16_t* v, float* probs,
                                              float* out) const = 0;
  // dq, dk, dv (= , in the layouts of q, k, v) from d_out and the forward's probs and dropout
  // mask; d_additive_v [heads, head_dim] += with additive scores.
  virtual void attention_backward(const AttentionShape& shape, const AttentionMask& mask,
                                  const float* q, const float* k, const float* v,
                                  const float* probs, const AttentionDropout& dropout,
                                  const float* d_out, float* dq, float* dk, float* dv,
                                  float* d_additive_v) const = 0;
  // Whether attention_forward, and attention_backward given the forward's probs, read Q, K and V
  // of such a call in bfloat16 alone where AttentionShape::rounded_q, _k, _v give them (CUDA's
  // bfloat16 tensor-core blocks, which round them as they load them anyway), so that a bfloat16
  // training step's projections may write them so. The answer depends on the shape (not its
  // pointers or strides), mask.key_batch and dropout.p alone. By default false: every path reads
  // float32 Q, K and V.
  virtual bool attention_reads_rounded_inputs(const AttentionShape& shape,
                                              const AttentionMask& mask,
                                              const AttentionDropout& dropout) const;
  // The floats attention_forward writes into probs for such a call, and its backward reads: by
  // default the weights, [B, H, Tq, Tk]; a backend whose forward keeps less for its backward
  // where AttentionShape::weights_for_backward_only lets it (CUDA's tensor-core blocks: each
  // query row's softmax shift and inverse sum, [B, H, Tq, 2]) says so, and a caller may then
  // allocate that much alone. The same dependence as attention_reads_rounded_inputs'.
  virtual int64_t attention_weights_floats(const AttentionShape& shape, const AttentionMask& mask,
                                           const AttentionDropout& dropout) const;

  // --- Layer normalisation and the residual connection (§3.1) --------------------------------
  // y[rows, cols] = (x - mean) / sqrt(var + eps) · gamma + beta per row (biased variance); y may
  // alias x; mean / rstd [rows] (may be null) receive what the backward needs.
  virtual void layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                          int64_t rows, int64_t cols, float eps, float* mean,
                          float* rstd) const = 0;
  // dx (= or += when accumulate; may alias dy row by row), dgamma += Σ dy·x̂, dbeta += Σ dy.
  virtual void layer_norm_backward(const float* dy, const float* x, const float* mean,
                                   const float* rstd, const float* gamma, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols,
                                   bool accumulate) const = 0;
  // The end of a post-norm residual sublayer, y = LayerNorm(x + Dropout(f)), in one pass (the
  // four operations it replaces, each a pass over the rows, give the same values to float32
  // rounding: the dropout's product and the add may be one fused multiply-add). With p > 0, f is
  // dropped as apply_dropout drops it with the keep decisions dropout_mask(mask, rows · cols,
  // p, key) draws, which mask[rows · cols] receives where it is given (null: the backward draws
  // them again: dropout_mask_bytes; p = 0: mask is not touched and may be null). f then becomes the
  // sum x + f, the norm's input, which the backward reads; y = layer_norm(sum), with mean / rstd
  // [rows] (may be null) as layer_norm writes them. rounded_y [rows, cols] (null: none) receives
  // y rounded to bfloat16 (round_to_16_bits) for the products of a bfloat16 step that read it.
  // y aliases neither f nor x.
  virtual void residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols, float p,
                                   uint64_t key, uint8_t* mask, const float* gamma,
                                   const float* beta, float eps, float* y, float* mean, float* rstd,
                                   uint16_t* rounded_y) const = 0;
  // Its backward. dy [rows, cols], the gradient of y, becomes that of x (layer_norm_backward
  // over the saved sum, in place), with dgamma / dbeta += as layer_norm_backward adds them;
  // d_f [rows, cols] receives it after the dropout (apply_dropout with mask, p and key: the
  // forward's mask, or null to draw it again; a copy when p = 0): the gradient of F's output.
  // rounded_d_f [rows, cols] (null: none) receives d_f rounded to bfloat16, for F's last product in
  // a bfloat16 step; d_f may then be null (only the rounded form written). d_f_column_sums [cols]
  // (null: none) += Σ_rows d_f, in float32: the bias gradient of F's last product
  // (bias_backward's), in the same pass over the rows. d_f aliases neither dy nor sum. It throws
  // std::invalid_argument for neither d_f nor rounded_d_f.
  virtual void residual_layer_norm_backward(float* dy, const float* sum, const float* mean,
                                            const float* rstd, const float* gamma, float* dgamma,
                                            float* dbeta, const uint8_t* mask, float p,
                                            uint64_t key, float* d_f, uint16_t* rounded_d_f,
                                            float* d_f_column_sums, int64_t rows,
                                            int64_t cols) const = 0;
  // y[n] += x[n] (the residual add; also gradient accumulation).
  virtual void add(float* y, const float* x, int64_t n) const = 0;
  // x[n] *= s
  virtual void scale(float* x, float s, int64_t n) const = 0;

  // --- Bias and activation (Linear, §3.3) ----------------------------------------------------
  // y[rows, cols] += bias[cols]
  virtual void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const = 0;
  // pre[rows, cols] += bias (may be null), then out = act(pre); out may alias pre.
  virtual void add_bias_activation(float* pre, const float* bias, float* out, int64_t rows,
                                   int64_t cols, Activation act) const = 0;
  // d[n] *= act'(pre_activation[n]). For kRelu the activation's output (or that output after
  // dropout, whose zeros the dropout backward zeroes anyway) serves as well: it is positive
  // exactly where the pre-activation is.
  virtual void activation_backward(float* d, const float* pre_activation, int64_t n,
                                   Activation act) const = 0;
  // The ReLU's backward in a bfloat16 step, where its output is kept in bfloat16 only
  // (MatmulEpilogue::rounded_output): g = d where that output is positive, else 0
  // (activation_backward's kRelu on the rounded output), for d [rows, cols]; rounded_d
  // [rows, cols] receives g rounded to bfloat16, for the products of the backward that read it,
  // and column_sums [cols] (null: none) += Σ_rows g in float32: the bias gradient of the product
  // that made the ReLU's input (bias_backward's), in the same pass. g itself is not kept. d null:
  // the gradient comes in bfloat16 in rounded_d (a product that wrote it so alone), and g is
  // written over it.
  virtual void relu_backward_bfloat16(const float* d, const uint16_t* relu_output, int64_t rows,
                                      int64_t cols, uint16_t* rounded_d,
                                      float* column_sums) const = 0;
  // dbias[cols] += Σ_rows dy[rows, cols] in float32 (rows ld apart: a column block of a wider
  // matrix, the stacked Q|K|V projections' gradients, is summed in place), read from
  // rounded_dy, dy rounded to bfloat16 in the same layout, where it is given (a bfloat16 step's
  // gradients, whose bias gradients PyTorch's autocast sums from them too; dy may then be null),
  // else from dy.
  virtual void bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows,
                             int64_t cols, int64_t ld, float* dbias) const = 0;

  // --- Dropout (§5.4) ------------------------------------------------------------------------
  // mask[n] = 1 iff hash(key, i) >= p (counter-based: reproducible, no generator state).
  virtual void dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const = 0;
  // x[n] = x · keep / (1 - p): forward, and backward on the gradient. keep[i] is mask[i], or,
  // mask null, drawn from (key, i) as dropout_mask draws it.
  virtual void apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                             uint64_t key) const = 0;
  // The bytes of the mask that this backend keeps between a dropout's forward and its backward
  // for n elements (dropout_mask's), or 0: it draws the keep decisions again from the key
  // where the backward needs them (a GPU, whose hash costs less than the bytes' traffic), and
  // the operations above take a null mask. By default n; nothing else.
  virtual int64_t dropout_mask_bytes(int64_t n) const;

  // --- Embeddings and positional encodings (§3.4, §3.5) --------------------------------------
  // out[rows, d] = table[ids[r]] · scale + positions[r % len + first_position] (positions
  // [max_positions, d], or null); rows = batch · len.
  virtual void embedding_forward(const float* table, const float* positions, const int32_t* ids,
                                 int64_t rows, int64_t len, int64_t d, float scale,
                                 int64_t first_position, float* out) const = 0;
  // The same from a table held in int8 (tensor/int8_weights.h): table[i] = values[i] · scales[i],
  // values [vocab, d], scales [vocab].
  virtual void embedding_forward_int8(const Int8Rows& table, const float* positions,
                                      const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                      float scale, int64_t first_position, float* out) const = 0;
  // The same from the rows of a prepared float32 matrix (PreparedMatrix::read_rows).
  virtual void embedding_forward_prepared(const PreparedMatrix& table, const float* positions,
                                          const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                          float scale, int64_t first_position,
                                          float* out) const = 0;
  // d_table[ids[r]] += scale · d_out[r]; d_positions (null: none) [r % len + first_position] +=
  // d_out[r]. Ids may repeat.
  virtual void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows, int64_t len,
                                  int64_t d, float scale, int64_t first_position, float* d_table,
                                  float* d_positions) const = 0;

  // --- Output distribution and loss (§3.4, §5.4) ---------------------------------------------
  // out[r] = log_softmax(logits[r])[targets[r]]
  virtual void log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows,
                                int64_t cols, float* out) const = 0;
  // Label-smoothed cross-entropy fused with its gradient: logits[rows, vocab] becomes
  // grad_scale · (softmax − ((1-ε)·onehot(y) + ε/vocab)); row_totals[rows, 3] (this backend's
  // memory) receives per row its smoothed loss, −log p_y, and 1 where the first argmax is y (else
  // 0). Nothing is summed here, so a backend need not wait for the result: the caller copies the
  // rows back once per batch (sum_cross_entropy_rows). rounded_gradient [rows, vocab] (null:
  // none): the gradient also written there rounded to bfloat16 (as round_to_16_bits would),
  // for the products of a bfloat16 backward; the logits' contents are then unspecified (a
  // backend may write the rounded form only). logits null: the logits come in bfloat16 in
  // rounded_gradient itself (the output head's product of bfloat16 training writes them so, as
  // PyTorch's autocast does: the loss is that of their values widened to float), and each row's
  // gradient replaces them there.
  virtual void cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t rows,
                                              int64_t vocab, float smoothing, float grad_scale,
                                              double* row_totals,
                                              uint16_t* rounded_gradient) const = 0;
  // How many bytes of logits the output head projects at once (model/output_head.h): near the
  // caches on the CPU, where each chunk is consumed while it is warm; large enough on a GPU that
  // each chunk's products and softmax fill the device.
  virtual int64_t logits_chunk_bytes() const { return int64_t(16) << 20; }
  // Bytes of the record a ReLU's forward product keeps for its backward product
  // (MatmulEpilogue::relu_mask) of an [m, n] output; 0: this backend keeps none (it gates by the
  // bfloat16 output itself), as by default.
  virtual int64_t relu_mask_bytes(int64_t m, int64_t n) const;

  // --- Search ------------------------------------------------------------------------------
  // Per row r of scores[rows, vocab]: its keep largest entries, largest first, into
  // values[r, keep] and their token ids into tokens[r, keep]; ties go to the lower id; token
  // `banned` (-1: none) and NaN count as −∞ (a row with fewer than keep finite entries ends in
  // −∞ entries). 1 ≤ keep ≤ vocab. With log_sums given ([rows]), the scores are logits: each
  // row's log Σ exp (over every entry, the banned one included: log_softmax's) goes to
  // log_sums[r] and is subtracted from the row's values, which are then exactly what
  // log_softmax gives those entries — the softmax and the ranking in one pass, with no
  // log-probabilities written. The ranking is the logits' (two logits that the subtraction
  // rounds to one log-probability rank as the logits do, not by id). Beam search ranks each
  // hypothesis' continuations with it and copies back only these rows × keep candidates.
  virtual void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                           int32_t banned, float* values, int32_t* tokens,
                           float* log_sums) const = 0;

  // --- Optimizer (§5.3) and gradient clipping ------------------------------------------------
  // torch.optim.Adam's update of `count` tensors in one call (one launch on a GPU); step counts
  // from 1. Tensor i is params[i][0, n_i), n_i = offsets[i + 1] - offsets[i]; its gradient is
  // grad[offsets[i], offsets[i + 1]) and its moments m and v the same range of theirs (one block
  // each: DeviceTensors' kOneBlock sets, laid out in the same order), updated in place.
  // params [count] (pointers into this backend's memory) and offsets [count + 1] (offsets[0] = 0,
  // non-decreasing) are arrays in this backend's memory too; total = offsets[count], given so
  // that no backend has to read it back.
  virtual void adam_update(float* const* params, const int64_t* offsets, int64_t count,
                           int64_t total, const float* grad, float* m, float* v,
                           const AdamHyperparameters& h, int64_t step) const = 0;
  // param -= lr · grad
  virtual void sgd_update(float* param, const float* grad, int64_t n, float lr) const = 0;
  // Σ x² in double, in a fixed order (deterministic).
  virtual double sum_of_squares(const float* x, int64_t n) const = 0;

  // --- Memory (backend/device_buffer.h holds it) --------------------------------------------
  // `bytes` bytes of this backend's memory, aligned for any element type (at least
  // alignof(std::max_align_t)), zeroed or left as they are
  // (on the CPU, pages of a block that are never written then cost no memory); throws
  // std::bad_alloc.
  virtual void* allocate(int64_t bytes, bool zeroed) const = 0;
  virtual void deallocate(void* memory) const = 0;  // from allocate; null: nothing
  // Whether this backend's memory is the host's (the CPU backend): then the host may read and
  // write it through its pointers — checkpoints are written from it and MPI reduces it in
  // place — where another backend's is copied through the host first.
  virtual bool memory_is_host() const = 0;
  // This backend's own memory (DeviceMemory), all -1 where it does not say (the CPU: its memory
  // is the process's, which the resident set size measures).
  virtual DeviceMemory device_memory() const { return {}; }
  // Forget what the backend's operation profile (TFM_CUDA_PROFILE on CUDA) has recorded so far:
  // benchmarks call it after their warm-up, so the table shows steady steps only. Nothing where
  // a backend keeps no profile.
  virtual void restart_profile() const {}
  // Byte copies within this backend's memory, and between it and the host's.
  virtual void copy_bytes(const void* from, int64_t bytes, void* to) const = 0;
  virtual void copy_from_host(const void* host, int64_t bytes, void* device) const = 0;
  virtual void copy_to_host(const void* device, int64_t bytes, void* host) const = 0;
  // This rank (of `size`) joined to the other ranks' backends of the same kind for collectives
  // in their memory, or null with the reason in *why_not: where the backend has none (the CPU
  // backend: MPI reads its memory as it is), the library is missing, or it refuses these ranks
  // (two ranks on one GPU). Every rank of the job calls it, and gets null on every rank or
  // on none (the bootstrap's all_agree), whatever happened where.
  virtual std::unique_ptr<DeviceCollectives> join_collectives(int rank, int size,
                                                              const CollectiveBootstrap& bootstrap,
                                                              const CollectiveWait& wait,
                                                              std::string* why_not) const;

  // --- Copies, fills and row movement ---------------------------------------------------------
  virtual void copy(const float* x, int64_t n, float* y) const = 0;  // y[n] = x[n]
  virtual void fill(float* y, int64_t n, float value) const = 0;     // y[n] = value
  // y[r] = x[rows[r]] for r < count; rows of d elements with strides ldx, ldy. A copy: every
  // element's 32 bits arrive as they were (IncrementalDecoder moves rows of int32 with it).
  virtual void gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                           int64_t d, float* y, int64_t ldy) const = 0;
  // y[rows[r]] = x[r] for r < count (rows distinct); strides ldx, ldy.
  virtual void scatter_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                            int64_t d, float* y, int64_t ldy) const = 0;
  // y[groups, cols] (dense) = the mean of each group of group_size consecutive rows of
  // x[groups · group_size, cols] (dense): the rows summed in order, then times 1 / group_size.
  // Decoding's cross-attention weights [N, H, S] averaged over the heads in one call.
  virtual void mean_of_row_groups(const float* x, int64_t groups, int64_t group_size, int64_t cols,
                                  float* y) const = 0;
  // y[rows[r]] = x[r] rounded to `format` as round_to_16_bits does, placed as scatter_rows
  // places them: a 16-bit key/value cache's append.
  virtual void scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows,
                                       int64_t count, int64_t d, Precision format, uint16_t* y,
                                       int64_t ldy) const = 0;

  // --- Recording operations to run them again (a decoding step: CUDA graphs) -----------------
  // Whether run_and_record may keep anything here. A caller that runs the same operations many
  // times may then record them once, giving them arguments (pointers, sizes, scalars) that stay
  // the same from run to run and putting what changes in the memory they read.
  virtual bool records_operations() const { return false; }
  // Runs `operations` — calls of this backend's operations that allocate nothing — and returns
  // them recorded, or null where nothing was kept; they ran either way, in order.
  virtual std::shared_ptr<const RecordedOperations> run_and_record(
      const std::function<void()>& operations) const {
    operations();
    return nullptr;
  }
  // Queues what `recording` (from this backend's run_and_record) recorded again, with the
  // arguments it was recorded with, and returns true; or returns false, having queued nothing,
  // where memory was allocated on this backend since the recording (a buffer it names may have
  // moved): the caller runs the operations itself, and may record them anew.
  virtual bool replay(const RecordedOperations& recording) const {
    (void)recording;
    return false;
  }
};

// The CPU backend: oneDNN products and the SIMD/OpenMP kernels of backend/cpu/.
const Backend& cpu_backend();

// Every backend built into this binary, the CPU first.
const std::vector<const Backend*>& available_backends();

// Their names, comma-separated ("cpu"), for errors. Asking probes the GPUs.
std::string available_backend_names();

// The kinds of backend compiled into this binary ("cpu", "cuda"), whether or not this machine
// can run them: what `--version` reports, without touching a device.
std::vector<std::string> built_backend_kinds();

// The backend --device names; an unknown name throws Error listing the available ones.
const Backend& find_backend(const std::string& device);
// The same for the process of local rank `local_rank` among several on one machine
// (data-parallel training under mpirun): the first accelerator's plain name ("cuda") and
// "auto" give it the accelerator local_rank mod their count, so that `mpirun -np <GPUs>` puts
// each process on a GPU of its own; a name with a number ("cuda:1") is that device for all.
const Backend& find_backend(const std::string& device, int local_rank);

}  // namespace tfm
