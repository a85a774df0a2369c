// The whole encoder–decoder of §3 (Figure 1): a Model owns its config and parameters; the
// forward functions run the encoder stack, the decoder stack (teacher-forced) and the output
// projection + log-softmax, on padded batches, with all activations in a reusable workspace.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "backend/device_int8_weights.h"
#include "backend/device_tensors.h"
#include "backend/workspace.h"
#include "model/config.h"
#include "model/output_head.h"
#include "model/stacks.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace tfm {

struct PreparedWeights;  // model/prepared_weights.h

class Model {
 public:
  // Validates config and parameter shapes (throws Error naming `where`). Every forward and
  // backward pass of this model runs on the backend whose memory holds `parameters` (--device;
  // DeviceTensors::Layout::kPerTensor). int8_weights: linear weights and embeddings held only
  // in int8 (a model loaded for --compute-type int8, io/model_file.h), whose entries in
  // `parameters` keep their shape and are released. Such a model runs inference in int8 only;
  // it cannot be trained, saved in float32 or prepared in another precision.
  Model(ModelConfig config, DeviceTensors parameters, const std::string& where,
        DeviceInt8Weights int8_weights = {});
  // The same from host tensors, copied into `backend`'s memory (each freed once copied); a
  // tensor without data is one that int8_weights holds.
  Model(ModelConfig config, TensorMap parameters, const std::string& where, const Backend& backend,
        Int8WeightMap int8_weights = {});
  Model(Model&&) = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const Backend& backend() const { return *backend_; }
  const TransformerWeights& weights() const { return weights_; }
  // The parameters in the backend's memory; files and tools read them through to_host() (or in
  // place where Backend::memory_is_host()). Entries of weights that an inference-only model
  // has packed, or that it holds in int8, are released.
  const DeviceTensors& parameters() const { return parameters_; }
  // For optimizers: values may change in place, never shapes or names (the views stay valid).
  // Drops the prepared weights, so call it again before each change.
  DeviceTensors& mutable_parameters();
  // Whether weights are held in int8 only (see the constructor).
  bool holds_int8_weights() const { return !int8_weights_.empty(); }
  // Marks the model as running inference in `precision` only (translate, score, serve): its
  // first prepared(precision) then prepares every product and frees each linear weight as soon
  // as its packed copy exists, so the process holds one copy of the weights, not two. From then
  // on the model cannot be trained, saved or prepared in another precision. A model holding
  // int8 weights is inference-only in int8 from its construction. Throws Error for a precision
  // other than an int8 model's, or once prepared.
  void set_inference_only(Precision precision);
  // Those int8 weights by parameter name, in the backend's memory (empty for a float32 model);
  // their rows are released once prepared() has packed them.
  const DeviceInt8Weights& int8_weights() const { return int8_weights_; }
  // The weights prepared for inference in `precision` (model/prepared_weights.h), built on
  // first use and shared by every later caller (a translation run prepares once). Thread-safe.
  std::shared_ptr<const PreparedWeights> prepared(Precision precision) const;
  // What whole-sequence inference (encoder, scoring) reads in `precision`: the model's own
  // tensors for float32 (nothing is prepared), else prepared(precision)->sequences, which
  // `hold` keeps alive.
  const TransformerWeights& sequence_weights(Precision precision,
                                             std::shared_ptr<const PreparedWeights>& hold) const;
  // [max_positions, D] encodings added to the encoder / decoder inputs, or null for "none".
  const float* encoder_positions() const;
  const float* decoder_positions() const;

 private:
  ModelConfig config_;
  const Backend* backend_;
  mutable DeviceTensors parameters_;
  // Mutable: prepared() frees the int8 rows once they are packed (the map keeps the names, the
  // shapes and the scales); weights_' int8 views are not read after that. Likewise it releases
  // the linear weights of parameters_ for an inference-only model (their entries keep name and
  // shape).
  mutable DeviceInt8Weights int8_weights_;
  std::optional<Precision> inference_only_;
  TransformerWeights weights_;
  DeviceBuffer<float> sinusoids_;  // [max_positions, D] when sinusoidal
  struct PreparedCache {
    std::mutex mutex;
    std::map<Precision, std::shared_ptr<const PreparedWeights>> by_precision;
  };
  std::unique_ptr<PreparedCache> prepared_ = std::make_unique<PreparedCache>();
};

// A padded batch of token ids. Rows are padded with pad_id up to src_len / tgt_len.
struct TokenBatch {
  int64_t batch = 0;
  int64_t src_len = 0;               // S: longest encoder input (eos included if appended)
  int64_t tgt_len = 0;               // T: longest decoder input (bos included)
  std::vector<int32_t> src_ids;      // [B, S] encoder input
  std::vector<int32_t> src_lengths;  // [B]
  std::vector<int32_t> tgt_in;       // [B, T] bos + target
  std::vector<int32_t> tgt_out;      // [B, T] target + eos (pad past the length)
  std::vector<int32_t> tgt_lengths;  // [B]
};

// Builds a batch from raw sentences (ids without bos/eos), applying the model's conventions:
// eos appended to sources if src_append_eos, bos prepended to decoder inputs, eos as last label.
// Throws Error if an id is outside the vocabulary or a sequence exceeds max_positions.
TokenBatch make_batch(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                      const std::vector<std::vector<int32_t>>& targets);
// The batch of the pairs `members` names (indices into sources / targets: one batch of a
// text/batching.h plan); with stride > 1 only members[first], members[first + stride], ... (one
// rank's share of a global batch: similar lengths, and the shares hold each pair once).
TokenBatch make_batch(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                      const std::vector<std::vector<int32_t>>& targets,
                      const std::vector<int64_t>& members, size_t first = 0, size_t stride = 1);

// What the size of every buffer of a pass over a batch depends on: the shape a workspace is
// planned for (backend/workspace.h).
struct BatchShape {
  int64_t batch = 0;          // B
  int64_t src_len = 0;        // S
  int64_t tgt_len = 0;        // T
  int64_t target_tokens = 0;  // Σ tgt_lengths: the real target positions
};
BatchShape shape_of(const TokenBatch& batch);
// The shape of make_batch(config, sources, targets, members, first, stride), without building it.
BatchShape batch_shape(const ModelConfig& config, const std::vector<std::vector<int32_t>>& sources,
                       const std::vector<std::vector<int32_t>>& targets,
                       const std::vector<int64_t>& members, size_t first = 0, size_t stride = 1);

// The teacher-forced pass that scoring and the loss share: both stacks over `batch` into cache
// (cache.training as the caller set it), then the decoder output at each real (non-pad) target
// position gathered into states [tokens, D], the rows the output projection runs on (padding
// skipped). rows / labels: those positions as flat indices b * T + t in order and their labels
// (tgt_out there), on the host and uploaded into cache.target_rows / cache.target_labels.
// Returns the number of positions.
int64_t target_states(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                      const DropoutOptions& dropout, StackCache& cache, std::vector<int64_t>& rows,
                      std::vector<int32_t>& labels, DeviceBuffer<float>& states);
// What target_states asks of cache and states for a batch of `shape`.
void plan_target_states(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                        const DropoutOptions& dropout, StackCache& cache,
                        DeviceBuffer<float>& states, WorkspacePlan& plan);

// Every buffer of score_forward. Planned (plan_score_forward for each batch shape, then
// memory.allocate(backend, plan)), they are parts of one block; unplanned, each grows on first
// use to the largest shape it meets.
struct ScoringWorkspace {
  Workspace memory;            // first member: the block outlives the buffers that borrow from it
  WorkspacePlan plan;          // every shape planned so far
  StackCache cache;            // both stacks in inference mode (one layer cache reused)
  DeviceBuffer<float> states;  // [tokens, D] decoder outputs at the real target positions
  OutputHeadBuffers head;      // the output projection of a chunk of them
  DeviceBuffer<float> picked;  // [tokens] log p of each position's label
  std::vector<int64_t> rows;   // [tokens] flat b * T + t of each real position (host)
  std::vector<int32_t> labels;
};

// token_logprobs[B, T]: log p(tgt_out[b, t] | ...) for t < tgt_lengths[b], 0 past the length.
// Runs both stacks (inference mode, no dropout) in ws, every product in `precision`.
void score_forward(const Model& model, const TokenBatch& batch, ScoringWorkspace& ws,
                   std::vector<float>& token_logprobs, Precision precision = Precision::kFloat32);
// Adds to ws.plan what score_forward asks of ws for a batch of `shape` (prepares the model's
// weights for `precision`, as the first score_forward would). Allocates nothing else.
void plan_score_forward(const Model& model, const BatchShape& shape, ScoringWorkspace& ws,
                        Precision precision = Precision::kFloat32);

}  // namespace tfm
