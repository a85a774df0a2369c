// Loss and gradients of one batch: stacks forward, output projection + fused cross-entropy in
// row chunks (the [tokens, vocab] logits never exist at once), then the stacks' backward.
#include "train/loss.h"

#include <algorithm>

namespace tfm {

namespace {

// The buffers of loss_and_gradients itself (the stacks', the output head's and the scratch's
// aside), for `count` target tokens of a [batch, tgt_len] batch.
template <typename Sizer>
void loss_buffers(int64_t d_model, int64_t count, int64_t batch, int64_t tgt_len, bool backward,
                  TrainingWorkspace& ws, Sizer& sizer) {
  sizer.need(ws.d_states, count * d_model);                               // [tokens, D]
  sizer.need(ws.row_totals, count * 3);                                   // [tokens, 3]
  if (backward) sizer.need(ws.d_decoder_out, batch * tgt_len * d_model);  // [B, T, D]
}

}  // namespace

LossTotals loss_and_gradients(const Model& model, const TransformerGradients& g,
                              const TokenBatch& batch, const DropoutOptions& dropout,
                              float label_smoothing, float grad_scale, TrainingWorkspace& ws,
                              Precision precision) {
  const ModelConfig& config = model.config();
  const Backend& backend = model.backend();
  const TransformerWeights w =
      with_rounded_weights(backend, with_product_precision(model.weights(), precision),
                           ws.rounded_weights, ws.stacked_biases);
  const int64_t d = config.d_model, vocab = config.tgt_vocab_size;
  const bool backward = grad_scale != 0.f;
  ws.cache.training = backward;
  const int64_t count =
      target_states(model, w, batch, dropout, ws.cache, ws.rows, ws.labels, ws.states);
  Allocate sizer{backend};
  loss_buffers(d, count, batch.batch, batch.tgt_len, backward, ws, sizer);
  const int64_t* rows = ws.cache.target_rows.data();      // [tokens]
  const int32_t* labels = ws.cache.target_labels.data();  // [tokens]
  const float* states = ws.states.data();                 // [tokens, D]
  float* d_states = ws.d_states.data();                   // [tokens, D]

  double* row_totals = ws.row_totals.data();  // [tokens, 3]

  // Training in bfloat16 the output head's product writes the logits in bfloat16 alone (as
  // PyTorch's autocast does), and the cross-entropy reads them and writes its gradient over them
  // in bfloat16, all the backward reads (its products, and an output bias's gradient:
  // bias_backward sums the rounded copy). Else the float32 logits become the float32 gradient.
  output_head_forward(backend, w.output, states, count, ws.head, [&](const OutputChunk& c) {
    backend.cross_entropy_forward_backward(c.logits, labels + c.begin, c.rows, vocab,
                                           label_smoothing, grad_scale, row_totals + 3 * c.begin,
                                           c.rounded_logits);
    if (!backward) return;
    // The chunk's logits now hold d loss / d logits [rows, V] (or its rounded_logits do).
    linear_backward(backend, w.output, g.output, c.states, c.logits, c.rows, d_states + c.begin * d,
                    false, ws.scratch, c.rounded_states, c.rounded_logits);
  });
  if (backward) {
    const int64_t out_size = batch.batch * batch.tgt_len * d;
    float* d_out = ws.d_decoder_out.data();  // [B, T, D]
    backend.fill(d_out, out_size, 0.f);
    backend.scatter_rows(d_states, d, rows, count, d, d_out, d);
    stacks_backward(model, w, g, batch, dropout, ws.cache, d_out, ws.scratch);
  }
  // The pass's one wait for the device, once all of it is enqueued: the per-token loss terms,
  // summed in token order.
  ws.host_row_totals.resize(size_t(count * 3));
  backend.copy_to_host(row_totals, count * 3 * int64_t(sizeof(double)), ws.host_row_totals.data());
  const CrossEntropyTotals sums = sum_cross_entropy_rows(ws.host_row_totals.data(), count);
  LossTotals totals;
  totals.tokens = count;
  totals.loss = sums.loss;
  totals.nll = sums.nll;
  totals.correct = sums.correct;
  return totals;
}

void plan_loss_and_gradients(const Model& model, const BatchShape& shape,
                             const DropoutOptions& dropout, bool backward, TrainingWorkspace& ws,
                             Precision precision) {
  const ModelConfig& config = model.config();
  const TransformerWeights w = with_product_precision(model.weights(), precision);
  const int64_t d = config.d_model, count = shape.target_tokens;
  ws.cache.training = backward;
  plan_target_states(model, w, shape, dropout, ws.cache, ws.states, ws.plan);
  loss_buffers(d, count, shape.batch, shape.tgt_len, backward, ws, ws.plan);
  plan_output_head_forward(model.backend(), w.output, count, ws.head, ws.plan);
  const int64_t rounded = rounded_weights_elements(w);
  if (rounded > 0) ws.plan.need(ws.rounded_weights, rounded);  // [Σ out · in]
  const int64_t biases = stacked_bias_elements(w);
  if (biases > 0) ws.plan.need(ws.stacked_biases, biases);  // [Σ out]
  if (!backward) return;
  // The output head's backward needs no scratch: its gradient comes in float32 in the logits'
  // place, or in bfloat16 in the rounded logits' (output_head_forward).
  plan_stacks_backward(model, w, shape, dropout, ws.scratch, ws.plan);
}

}  // namespace tfm
