// IncrementalDecoder: one decoder position for N hypotheses per call.
#include "decode/incremental_decoder.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/sublayer.h"

namespace tfm {

IncrementalDecoder::IncrementalDecoder(const Model& model, const float* memory, int64_t sentences,
                                       int64_t src_len, const int32_t* src_lengths,
                                       int64_t max_steps, int64_t max_hypotheses,
                                       Precision precision)
    : model_(model),
      packed_(model.packed_decoder(precision)),
      src_len_(src_len),
      max_steps_(max_steps),
      max_hypotheses_(max_hypotheses),
      src_lengths_(src_lengths) {
  const ModelConfig& c = model.config();
  const int64_t d = c.d_model, rows = sentences * src_len;
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    const PackedDecoderLayer& layer = packed_->layers[size_t(i)];
    cross_kv_.push_back(std::make_unique_for_overwrite<float[]>(size_t(rows * 2 * d)));
    packed_linear_forward(layer.cross_kv,
                          layer.cross_kv_bias.empty() ? nullptr : layer.cross_kv_bias.data(),
                          memory, rows, cross_kv_.back().get());
    // Untouched pages cost nothing: only the rows the steps write are ever mapped.
    self_keys_.push_back(
        std::make_unique_for_overwrite<float[]>(size_t(max_steps * max_hypotheses * d)));
    self_values_.push_back(
        std::make_unique_for_overwrite<float[]>(size_t(max_steps * max_hypotheses * d)));
  }
  history_.resize(size_t(max_hypotheses * max_steps));
  reordered_history_.resize(history_.size());
}

void IncrementalDecoder::start(const std::vector<int32_t>& hypothesis_sentence) {
  if (int64_t(hypothesis_sentence.size()) > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  hypothesis_sentence_ = hypothesis_sentence;
  position_ = 0;
}

void IncrementalDecoder::step(const int32_t* tokens, float* logprobs, float* cross_attention,
                              int64_t attention_layer, bool per_head) {
  const ModelConfig& c = model_.config();
  const TransformerWeights& w = model_.weights();
  const int64_t n = hypotheses(), d = c.d_model, heads = c.heads, t = position_;
  if (t >= max_steps_)
    throw std::invalid_argument("IncrementalDecoder: more steps than max_steps (" +
                                std::to_string(max_steps_) + ")");
  const int64_t kept_layer = attention_layer < 0 ? c.decoder_layers - 1 : attention_layer;
  float* x = ensure_size(x_, n * d);              // [N, D] residual stream
  float* qkv = ensure_size(qkv_, n * 3 * d);      // [N, 3D]
  float* q = ensure_size(q_, n * d);              // [N, D]
  float* context = ensure_size(context_, n * d);  // [N, D]
  embed_forward(c, w.tgt_embed, model_.decoder_positions(), tokens, n, 1, t, x);
  for (int64_t i = 0; i < n; ++i)
    history_[size_t(i * max_steps_ + t)] = int32_t(i * max_steps_ + t);

  for (int64_t layer = 0; layer < c.decoder_layers; ++layer) {
    const DecoderLayerWeights& lw = w.decoder_layers[size_t(layer)];
    const PackedDecoderLayer& pw = packed_->layers[size_t(layer)];
    float* self_k = self_keys_[size_t(layer)].get();         // [max_hypotheses, max_steps, D]
    float* self_v = self_values_[size_t(layer)].get();       // [max_hypotheses, max_steps, D]
    const float* cross_kv = cross_kv_[size_t(layer)].get();  // [sentences, S, 2D]
    auto self_attention = [&](const float* in, float* out) {
      packed_linear_forward(
          pw.self_qkv, pw.self_qkv_bias.empty() ? nullptr : pw.self_qkv_bias.data(), in, n, qkv);
      for (int64_t i = 0; i < n; ++i) {  // this position's keys/values into the cache
        const int64_t row = i * max_steps_ + t;
        std::copy_n(qkv + i * 3 * d + d, d, self_k + row * d);
        std::copy_n(qkv + i * 3 * d + 2 * d, d, self_v + row * d);
      }
      AttentionShape s;
      s.batch = n;
      s.heads = heads;
      s.query_len = 1;
      s.key_len = t + 1;
      s.head_dim = d / heads;
      s.q_row_stride = 3 * d;
      s.k_row_stride = s.v_row_stride = s.out_row_stride = d;
      s.key_rows = history_.data();
      s.key_rows_stride = max_steps_;
      s.score = lw.self_attn.score();
      AttentionMask mask;
      mask.causal = true;
      mask.window = c.self_attention_window;
      mask.query_offset = t;
      attention_forward(s, mask, qkv, self_k, self_v, ensure_size(probs_, n * heads * (t + 1)),
                        context);
      packed_linear_forward(pw.self_out, lw.self_attn.o.bias, context, n, out);
    };
    auto cross_attention_fn = [&](const float* in, float* out) {
      packed_linear_forward(pw.cross_query, lw.cross_attn.q.bias, in, n, q);
      AttentionShape s;
      s.batch = n;
      s.heads = heads;
      s.query_len = 1;
      s.key_len = src_len_;
      s.head_dim = d / heads;
      s.q_row_stride = s.out_row_stride = d;
      s.k_row_stride = s.v_row_stride = 2 * d;
      s.score = lw.cross_attn.score();
      AttentionMask mask;
      mask.key_lengths = src_lengths_;
      mask.key_batch = hypothesis_sentence_.data();
      float* probs = ensure_size(probs_, n * heads * std::max<int64_t>(src_len_, 1));  // [N, H, S]
      attention_forward(s, mask, q, cross_kv, cross_kv + d, probs, context);
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
      packed_linear_forward(pw.cross_out, lw.cross_attn.o.bias, context, n, out);
    };
    auto feed_forward = [&](const float* in, float* out) {
      const int64_t d_ff = pw.fc1.rows();
      float* hidden = ensure_size(hidden_, n * d_ff);  // [N, d_ff]
      packed_linear_forward(pw.fc1, nullptr, in, n, hidden);
      add_bias_activation(hidden, lw.ffn.fc1.bias, hidden, n, d_ff, c.activation);
      packed_linear_forward(pw.fc2, lw.ffn.fc2.bias, hidden, n, out);
    };
    sublayer_forward(c, lw.norm1, x, n, 0.f, 0, layer_cache_.self_sublayer, self_attention);
    sublayer_forward(c, lw.norm2, layer_cache_.self_sublayer.output.data(), n, 0.f, 0,
                     layer_cache_.cross_sublayer, cross_attention_fn);
    sublayer_forward(c, lw.norm3, layer_cache_.cross_sublayer.output.data(), n, 0.f, 0,
                     layer_cache_.ffn_sublayer, feed_forward);
    std::copy_n(layer_cache_.ffn_sublayer.output.data(), n * d, x);
  }
  if (c.norm == NormPosition::kPre)
    layer_norm(x, w.decoder_norm.weight, w.decoder_norm.bias, x, n, d, float(c.layer_norm_eps));
  packed_linear_forward(packed_->output, w.output_bias, x, n, logprobs);
  log_softmax(logprobs, logprobs, n, c.tgt_vocab_size);
  ++position_;
}

void IncrementalDecoder::reorder(const std::vector<int32_t>& parents) {
  const int64_t m = int64_t(parents.size());
  if (m > max_hypotheses_)
    throw std::invalid_argument("IncrementalDecoder: more hypotheses than max_hypotheses");
  for (int32_t parent : parents)
    if (parent < 0 || parent >= hypotheses())
      throw std::invalid_argument("IncrementalDecoder: parent " + std::to_string(parent) +
                                  " is not a current hypothesis");
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(history_.data() + int64_t(parents[size_t(i)]) * max_steps_, position_,
                reordered_history_.data() + i * max_steps_);
  std::swap(history_, reordered_history_);
  std::vector<int32_t> sentence(parents.size());
  for (size_t i = 0; i < parents.size(); ++i)
    sentence[i] = hypothesis_sentence_[size_t(parents[i])];
  hypothesis_sentence_ = std::move(sentence);
}

}  // namespace tfm
