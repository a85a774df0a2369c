// One batch through the whole model and back: the label-smoothed cross-entropy of
// docs/model-file.md on every real target position (eos included, padding excluded), and the
// gradient of grad_scale × Σ loss with respect to every parameter, accumulated into the gradient
// buffers.
#pragma once

#include <vector>

#include "model/stacks.h"
#include "model/transformer.h"

namespace tfm {

struct LossTotals {
  double loss = 0;      // Σ over target tokens of the smoothed loss
  double nll = 0;       // Σ over target tokens of −log p(y) (perplexity = exp(nll / tokens))
  int64_t tokens = 0;   // target tokens (eos included)
  int64_t correct = 0;  // target tokens whose argmax prediction is right (teacher-forced)

  LossTotals& operator+=(const LossTotals& o) {
    loss += o.loss;
    nll += o.nll;
    tokens += o.tokens;
    correct += o.correct;
    return *this;
  }
};

// Every buffer of a training or validation pass. Planned (plan_loss_and_gradients for each
// batch shape a run will see, then memory.allocate(backend, plan)), they are parts of one block;
// unplanned, each grows on first use to the largest shape it meets.
struct TrainingWorkspace {
  Workspace memory;    // first member: the block outlives the buffers that borrow from it
  WorkspacePlan plan;  // every shape planned so far
  StackCache cache;    // training = true: every layer's activations
  BackwardScratch scratch;
  DeviceBuffer<float> states;         // [tokens, D] decoder outputs at real positions
  DeviceBuffer<float> d_states;       // [tokens, D]
  OutputHeadBuffers head;             // a chunk's logits, then their gradient
  DeviceBuffer<float> d_decoder_out;  // [B, T, D]
  DeviceBuffer<double> row_totals;    // [tokens, 3] each token's loss terms (cross-entropy's)
  // Training in bfloat16: every linear weight rounded once per pass (with_rounded_weights).
  DeviceBuffer<uint16_t> rounded_weights;  // [Σ out · in]
  DeviceBuffer<float> stacked_biases;      // [Σ out] the stacked Q|K|V and K|V views' biases
  std::vector<int32_t> labels;             // [tokens]
  std::vector<int64_t> rows;               // [tokens] flat b * T + t of each real position
  std::vector<double> host_row_totals;     // [tokens, 3] row_totals copied back once per batch
};

// With grad_scale = 0 only the loss is computed (no backward): validation. Every linear product,
// forward and backward, runs in `precision` (float32, or bfloat16: model/weights.h).
LossTotals loss_and_gradients(const Model& model, const TransformerGradients& gradients,
                              const TokenBatch& batch, const DropoutOptions& dropout,
                              float label_smoothing, float grad_scale, TrainingWorkspace& ws,
                              Precision precision = Precision::kFloat32);

// Adds to ws.plan what loss_and_gradients asks of ws for a batch of `shape` (backward: a
// training pass, grad_scale != 0; else validation). Allocates nothing.
void plan_loss_and_gradients(const Model& model, const BatchShape& shape,
                             const DropoutOptions& dropout, bool backward, TrainingWorkspace& ws,
                             Precision precision = Precision::kFloat32);

}  // namespace tfm
