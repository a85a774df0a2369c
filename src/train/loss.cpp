// Loss and gradients of one batch: stacks forward, output projection + fused cross-entropy in
// row chunks (the [tokens, vocab] logits never exist at once), then the stacks' backward.
#include "train/loss.h"

#include <algorithm>

namespace tfm {

LossTotals loss_and_gradients(const Model& model, const TransformerGradients& g,
                              const TokenBatch& batch, const DropoutOptions& dropout,
                              float label_smoothing, float grad_scale, TrainingWorkspace& ws,
                              Precision precision) {
  const ModelConfig& config = model.config();
  const Backend& backend = model.backend();
  const TransformerWeights w = with_rounded_weights(
      backend, with_product_precision(model.weights(), precision), ws.rounded_weights);
  const int64_t d = config.d_model, vocab = config.tgt_vocab_size;
  const bool backward = grad_scale != 0.f;
  ws.cache.training = backward;
  const int64_t count =
      target_states(model, w, batch, dropout, ws.cache, ws.rows, ws.labels, ws.states);
  const int64_t* rows = ws.cache.target_rows.data();               // [tokens]
  const int32_t* labels = ws.cache.target_labels.data();           // [tokens]
  const float* states = ws.states.data();                          // [tokens, D]
  float* d_states = ensure_size(backend, ws.d_states, count * d);  // [tokens, D]

  LossTotals totals;
  totals.tokens = count;
  output_head_forward(backend, w.output, states, count, ws.head, [&](const OutputChunk& c) {
    const CrossEntropyTotals ce = backend.cross_entropy_forward_backward(
        c.logits, labels + c.begin, c.rows, vocab, label_smoothing, grad_scale);
    totals.loss += ce.loss;
    totals.nll += ce.nll;
    totals.correct += ce.correct;
    if (!backward) return;
    // The chunk's logits now hold d loss / d logits [rows, V].
    linear_backward(backend, w.output, g.output, c.states, c.logits, c.rows, d_states + c.begin * d,
                    false, ws.scratch, c.rounded_states);
  });
  if (!backward) return totals;

  const int64_t out_size = batch.batch * batch.tgt_len * d;
  float* d_out = ensure_size(backend, ws.d_decoder_out, out_size);  // [B, T, D]
  backend.fill(d_out, out_size, 0.f);
  backend.scatter_rows(d_states, d, rows, count, d, d_out, d);
  stacks_backward(model, w, g, batch, dropout, ws.cache, d_out, ws.scratch);
  return totals;
}

void plan_loss_and_gradients(const Model& model, const BatchShape& shape,
                             const DropoutOptions& dropout, bool backward, TrainingWorkspace& ws,
                             Precision precision) {
  const ModelConfig& config = model.config();
  const TransformerWeights w = with_product_precision(model.weights(), precision);
  const int64_t d = config.d_model, vocab = config.tgt_vocab_size, count = shape.target_tokens;
  ws.cache.training = backward;
  plan_target_states(model, w, shape, dropout, ws.cache, ws.states, ws.plan);
  ws.plan.need(ws.d_states, count * d);  // [tokens, D]
  plan_output_head_forward(w.output, count, ws.head, ws.plan);
  const int64_t rounded = rounded_weights_elements(w);
  if (rounded > 0) ws.plan.need(ws.rounded_weights, rounded);  // [Σ out · in]
  if (!backward) return;
  plan_linear_backward(w.output, std::min(output_chunk_rows(vocab), count), ws.scratch, ws.plan);
  ws.plan.need(ws.d_decoder_out, shape.batch * shape.tgt_len * d);  // [B, T, D]
  plan_stacks_backward(model, w, shape, ws.scratch, ws.plan);
}

}  // namespace tfm
