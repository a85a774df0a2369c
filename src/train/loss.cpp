// Loss and gradients of one batch: stacks forward, output projection + fused cross-entropy in
// row chunks (the [tokens, vocab] logits never exist at once), then the stacks' backward.
#include "train/loss.h"

#include <algorithm>

#include "kernels/cross_entropy.h"

namespace tfm {

LossTotals loss_and_gradients(const Model& model, const TransformerGradients& g,
                              const TokenBatch& batch, const DropoutOptions& dropout,
                              float label_smoothing, float grad_scale, TrainingWorkspace& ws) {
  const ModelConfig& config = model.config();
  const TransformerWeights& w = model.weights();
  const int64_t d = config.d_model, vocab = config.tgt_vocab_size;
  const bool backward = grad_scale != 0.f;
  ws.cache.training = backward;
  encoder_forward(model, w, batch, dropout, ws.cache);
  decoder_forward(model, w, batch, dropout, ws.cache);

  ws.rows.clear();
  for (int64_t b = 0; b < batch.batch; ++b)
    for (int64_t t = 0; t < batch.tgt_lengths[size_t(b)]; ++t)
      ws.rows.push_back(b * batch.tgt_len + t);
  const int64_t count = int64_t(ws.rows.size());
  float* states = ensure_size(ws.states, count * d);      // [tokens, D]
  float* d_states = ensure_size(ws.d_states, count * d);  // [tokens, D]
  int32_t* labels = ensure_size(ws.labels, count);
  for (int64_t r = 0; r < count; ++r) {
    std::copy_n(ws.cache.decoder_out.data() + ws.rows[size_t(r)] * d, d, states + r * d);
    labels[r] = batch.tgt_out[size_t(ws.rows[size_t(r)])];
  }

  LossTotals totals;
  totals.tokens = count;
  const int64_t chunk = std::max<int64_t>(1, (int64_t(4) << 20) / vocab);
  float* logits = ensure_size(ws.logits, std::min(chunk, std::max<int64_t>(count, 1)) * vocab);
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t n = std::min(chunk, count - begin);
    const float* x = states + begin * d;  // [n, D]
    linear_forward(w.output, x, n, logits);
    const CrossEntropyTotals ce = cross_entropy_forward_backward(logits, labels + begin, n, vocab,
                                                                 label_smoothing, grad_scale);
    totals.loss += ce.loss;
    totals.nll += ce.nll;
    totals.correct += ce.correct;
    if (!backward) continue;
    // logits now hold d loss / d logits [n, V].
    linear_backward(w.output, g.output, x, logits, n, d_states + begin * d, false);
  }
  if (!backward) return totals;

  const int64_t out_size = batch.batch * batch.tgt_len * d;
  float* d_out = ensure_size(ws.d_decoder_out, out_size);  // [B, T, D]
  std::fill_n(d_out, out_size, 0.f);
  for (int64_t r = 0; r < count; ++r)
    std::copy_n(d_states + r * d, d, d_out + ws.rows[size_t(r)] * d);
  stacks_backward(model, g, batch, dropout, ws.cache, d_out, ws.scratch);
  return totals;
}

}  // namespace tfm
