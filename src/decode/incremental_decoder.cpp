// IncrementalDecoder: one decoder position for N hypotheses per call.
#include "decode/incremental_decoder.h"

#include <algorithm>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/sublayer.h"

namespace tfm {

IncrementalDecoder::IncrementalDecoder(const Model& model, const float* memory, int64_t sentences,
                                       int64_t src_len, const int32_t* src_lengths,
                                       int64_t max_steps)
    : model_(model),
      memory_(memory),
      sentences_(sentences),
      src_len_(src_len),
      max_steps_(max_steps),
      src_lengths_(src_lengths) {
  const ModelConfig& c = model.config();
  const int64_t layers = c.decoder_layers, d = c.d_model, rows = sentences * src_len;
  self_keys_.resize(size_t(layers));
  self_values_.resize(size_t(layers));
  cross_keys_.resize(size_t(layers));
  cross_values_.resize(size_t(layers));
  for (int64_t i = 0; i < layers; ++i) {
    const DecoderLayerWeights& w = model.weights().decoder_layers[size_t(i)];
    cross_keys_[size_t(i)].resize(size_t(rows * d));
    cross_values_[size_t(i)].resize(size_t(rows * d));
    linear_forward(w.cross_attn.k, memory, rows, cross_keys_[size_t(i)].data());
    linear_forward(w.cross_attn.v, memory, rows, cross_values_[size_t(i)].data());
  }
}

void IncrementalDecoder::start(const std::vector<int32_t>& hypothesis_sentence) {
  hypothesis_sentence_ = hypothesis_sentence;
  position_ = 0;
  const int64_t n = hypotheses(), d = model_.config().d_model;
  for (size_t i = 0; i < self_keys_.size(); ++i) {
    ensure_size(self_keys_[i], n * max_steps_ * d);
    ensure_size(self_values_[i], n * max_steps_ * d);
  }
}

void IncrementalDecoder::step(const int32_t* tokens, float* logprobs, float* cross_attention,
                              int64_t attention_layer, bool per_head) {
  const ModelConfig& c = model_.config();
  const TransformerWeights& w = model_.weights();
  const int64_t n = hypotheses(), d = c.d_model, heads = c.heads, t = position_;
  const int64_t kept_layer = attention_layer < 0 ? c.decoder_layers - 1 : attention_layer;
  float* x = ensure_size(x_, n * d);              // [N, D] residual stream
  float* q = ensure_size(q_, n * d);              // [N, D]
  float* k = ensure_size(k_, n * d);              // [N, D]
  float* v = ensure_size(v_, n * d);              // [N, D]
  float* context = ensure_size(context_, n * d);  // [N, D]
  embed_forward(c, w.tgt_embed, model_.decoder_positions(), tokens, n, 1, t, x);

  for (int64_t layer = 0; layer < c.decoder_layers; ++layer) {
    const DecoderLayerWeights& lw = w.decoder_layers[size_t(layer)];
    float* self_k = self_keys_[size_t(layer)].data();    // [N, max_steps, D]
    float* self_v = self_values_[size_t(layer)].data();  // [N, max_steps, D]
    auto self_attention = [&](const float* in, float* out) {
      linear_forward(lw.self_attn.q, in, n, q);
      linear_forward(lw.self_attn.k, in, n, k);
      linear_forward(lw.self_attn.v, in, n, v);
      for (int64_t h = 0; h < n; ++h) {  // append this position to the cache
        std::copy_n(k + h * d, d, self_k + (h * max_steps_ + t) * d);
        std::copy_n(v + h * d, d, self_v + (h * max_steps_ + t) * d);
      }
      AttentionShape s;
      s.batch = n;
      s.heads = heads;
      s.query_len = 1;
      s.key_len = t + 1;
      s.head_dim = d / heads;
      s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = d;
      s.k_batch_stride = s.v_batch_stride = max_steps_ * d;
      AttentionMask mask;
      mask.causal = true;
      mask.window = c.self_attention_window;
      mask.query_offset = t;
      attention_forward(s, mask, q, self_k, self_v, ensure_size(probs_, n * heads * (t + 1)),
                        context);
      linear_forward(lw.self_attn.o, context, n, out);
    };
    auto cross_attention_fn = [&](const float* in, float* out) {
      linear_forward(lw.cross_attn.q, in, n, q);
      AttentionShape s;
      s.batch = n;
      s.heads = heads;
      s.query_len = 1;
      s.key_len = src_len_;
      s.head_dim = d / heads;
      s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = d;
      AttentionMask mask;
      mask.key_lengths = src_lengths_;
      mask.key_batch = hypothesis_sentence_.data();
      float* probs = ensure_size(probs_, n * heads * std::max<int64_t>(src_len_, 1));  // [N, H, S]
      attention_forward(s, mask, q, cross_keys_[size_t(layer)].data(),
                        cross_values_[size_t(layer)].data(), probs, context);
      if (cross_attention && layer == kept_layer) {
        if (per_head) {
          std::copy_n(probs, n * heads * src_len_, cross_attention);
        } else {
          for (int64_t h = 0; h < n; ++h)
            for (int64_t j = 0; j < src_len_; ++j) {
              float sum = 0.f;
              for (int64_t head = 0; head < heads; ++head)
                sum += probs[(h * heads + head) * src_len_ + j];
              cross_attention[h * src_len_ + j] = sum / float(heads);
            }
        }
      }
      linear_forward(lw.cross_attn.o, context, n, out);
    };
    sublayer_forward(c, lw.norm1, x, n, 0.f, 0, layer_cache_.self_sublayer, self_attention);
    sublayer_forward(c, lw.norm2, layer_cache_.self_sublayer.output.data(), n, 0.f, 0,
                     layer_cache_.cross_sublayer, cross_attention_fn);
    sublayer_forward(c, lw.norm3, layer_cache_.cross_sublayer.output.data(), n, 0.f, 0,
                     layer_cache_.ffn_sublayer, [&](const float* in, float* out) {
                       feed_forward_forward(lw.ffn, c.activation, in, n, 0.f, 0, layer_cache_.ffn,
                                            out);
                     });
    std::copy_n(layer_cache_.ffn_sublayer.output.data(), n * d, x);
  }
  if (c.norm == NormPosition::kPre)
    layer_norm(x, w.decoder_norm.weight, w.decoder_norm.bias, x, n, d, float(c.layer_norm_eps));
  const int64_t vocab = c.tgt_vocab_size;
  gemm(false, true, n, vocab, d, 1.f, x, d, w.output_weight, d, 0.f, logprobs, vocab);
  if (w.output_bias) add_bias(logprobs, w.output_bias, n, vocab);
  log_softmax(logprobs, logprobs, n, vocab);
  ++position_;
}

void IncrementalDecoder::reorder(const std::vector<int32_t>& parents) {
  const int64_t d = model_.config().d_model, m = int64_t(parents.size());
  const int64_t row = max_steps_ * d, used = position_ * d;
  for (size_t layer = 0; layer < self_keys_.size(); ++layer)
    for (auto* cache : {&self_keys_[layer], &self_values_[layer]}) {
      float* buffer = ensure_size(reorder_buffer_, m * row);
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(cache->data() + int64_t(parents[size_t(i)]) * row, used, buffer + i * row);
      std::swap(*cache, reorder_buffer_);  // the gathered copy becomes the cache
    }
  std::vector<int32_t> sentence(parents.size());
  for (size_t i = 0; i < parents.size(); ++i)
    sentence[i] = hypothesis_sentence_[size_t(parents[i])];
  hypothesis_sentence_ = std::move(sentence);
}

}  // namespace tfm
