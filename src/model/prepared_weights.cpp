// prepare_weights(): packs each matrix once, and stacks the attentions' input projections.
#include "model/prepared_weights.h"

#include <memory>
#include <stdexcept>

namespace tfm {

namespace {

struct Preparer {
  const Backend& backend;
  PreparedWeights& out;
  const ReleasePackedSource& release;
  // The float embedding tables: never released with a product packed from them (a tied output
  // projection), since the lookups read them, unless serve_embeddings_from_output moves the
  // lookups to the product.
  const float* embeddings[2] = {nullptr, nullptr};

  const PreparedMatrix* keep(std::unique_ptr<PreparedMatrix> matrix) {
    out.matrices.push_back(std::move(matrix));
    return out.matrices.back().get();
  }

  // The product of the parts stacked: from their int8 rows where the model holds them so
  // (precision int8 only), else from their float weights.
  const PreparedMatrix* product(const std::vector<const LinearWeights*>& parts) {
    std::vector<int64_t> rows;
    std::vector<const float*> weights;
    std::vector<Int8Rows> int8;
    for (const LinearWeights* p : parts) {
      rows.push_back(p->out);
      if (p->int8.values)
        int8.push_back(p->int8);
      else
        weights.push_back(p->weight);
    }
    const PreparedMatrix* packed = nullptr;
    if (int8.empty()) {
      packed = keep(backend.prepare_matrix(weights, rows, parts[0]->in, out.precision));
    } else {
      if (!weights.empty() || out.precision != Precision::kInt8)
        throw std::logic_error("int8 weights are prepared in int8 only, and never with float ones");
      packed = keep(backend.prepare_int8_matrix(int8, rows, parts[0]->in));
    }
    if (release)
      for (const LinearWeights* p : parts)
        if (!p->weight || (p->weight != embeddings[0] && p->weight != embeddings[1]))
          release(p->int8.values ? static_cast<const void*>(p->int8.values) : p->weight);
    return packed;
  }

  void prepare(LinearWeights& w) { w.prepared = product({&w}); }

  // int8 reads its embeddings in int8 too: a float table [vocab, d] is quantised once (a shared
  // one once for all its uses, a tied output projection's product among them).
  void quantize_embeddings(TransformerWeights& w, const ModelConfig& config) {
    auto quantize = [&](const float* table, int64_t vocab) {
      std::vector<float> staged;                                                // [vocab, D]
      std::vector<int8_t> values(static_cast<size_t>(vocab * config.d_model));  // [vocab, D]
      std::vector<float> scales(static_cast<size_t>(vocab));                    // [vocab]
      quantize_weight_rows(host_readable(backend, table, vocab * config.d_model, staged), vocab,
                           config.d_model, values.data(), scales.data());
      PreparedWeights::Int8Table& q = out.int8_embeddings.emplace_back();
      return Int8Rows{upload(backend, values.data(), int64_t(values.size()), q.values),
                      upload(backend, scales.data(), int64_t(scales.size()), q.scales)};
    };
    const bool shared = w.src_embed && w.src_embed == w.tgt_embed;
    const bool tied_output = w.tgt_embed && w.output.weight == w.tgt_embed;
    if (w.src_embed) w.src_embed_int8 = quantize(w.src_embed, config.src_vocab_size);
    if (shared)
      w.tgt_embed_int8 = w.src_embed_int8;
    else if (w.tgt_embed)
      w.tgt_embed_int8 = quantize(w.tgt_embed, config.tgt_vocab_size);
    if (tied_output) {  // packed from these rows: the same rule would quantise it again
      w.output.weight = nullptr;
      w.output.int8 = w.tgt_embed_int8;
    }
    w.src_embed = w.tgt_embed = nullptr;
  }

  // float32, inference only: a tied output projection's packed matrix holds the target
  // embedding's values exactly, so the lookups read their rows from it (a shared source
  // embedding too) and the float table is released: one copy of the largest matrix, not two.
  void serve_embeddings_from_output(TransformerWeights& w) {
    const float* table = w.tgt_embed;
    if (!table || w.output.weight != table || !w.output.prepared) return;
    w.tgt_embed_prepared = w.output.prepared;
    w.tgt_embed = nullptr;
    if (w.src_embed == table) {
      w.src_embed_prepared = w.output.prepared;
      w.src_embed = nullptr;
    }
    w.output.weight = nullptr;
    release(table);
  }

  // The parts as one product: weight [Σ out, in] and their biases concatenated (null when none
  // of them has one).
  LinearWeights stack(const std::vector<const LinearWeights*>& parts) {
    LinearWeights stacked;
    stacked.in = parts[0]->in;
    bool any_bias = false;
    for (const LinearWeights* p : parts) {
      stacked.out += p->out;
      any_bias |= p->bias != nullptr;
    }
    stacked.prepared = product(parts);
    if (any_bias) {
      float* bias = out.stacked_biases.emplace_back().allocate_uninitialized(backend, stacked.out);
      for (const LinearWeights* p : parts) {  // a part without a bias adds zeros
        if (p->bias)
          backend.copy(p->bias, p->out, bias);
        else
          backend.fill(bias, p->out, 0.f);
        bias += p->out;
      }
      stacked.bias = out.stacked_biases.back().data();
    }
    return stacked;
  }

  // Only the products inference runs are packed: Q|K|V and W_o for self-attention, W_q, K|V
  // and W_o for cross-attention (the unstacked K, V keep reading the model's tensors).
  void prepare(AttentionWeights& a, bool self_attention) {
    if (self_attention) {
      a.qkv = stack({&a.q, &a.k, &a.v});
    } else {
      a.kv = stack({&a.k, &a.v});
      prepare(a.q);
    }
    prepare(a.o);
  }
};

}  // namespace

std::unique_ptr<PreparedWeights> prepare_weights(const Backend& backend, const ModelConfig& config,
                                                 const TransformerWeights& weights,
                                                 Precision precision,
                                                 const ReleasePackedSource& release) {
  auto prepared = std::make_unique<PreparedWeights>();
  prepared->precision = precision;
  Preparer p{backend, *prepared, release, {weights.src_embed, weights.tgt_embed}};
  TransformerWeights& steps = prepared->steps;
  steps = weights;
  if (precision == Precision::kInt8) p.quantize_embeddings(steps, config);
  for (DecoderLayerWeights& layer : steps.decoder_layers) {
    p.prepare(layer.self_attn, true);
    p.prepare(layer.cross_attn, false);
    p.prepare(layer.ffn.fc1);
    p.prepare(layer.ffn.fc2);
  }
  p.prepare(steps.output);
  if (precision == Precision::kFloat32 && release) p.serve_embeddings_from_output(steps);
  if (precision == Precision::kFloat32 && !release) {
    prepared->sequences = weights;
    return prepared;
  }
  for (EncoderLayerWeights& layer : steps.encoder_layers) {
    p.prepare(layer.self_attn, true);
    p.prepare(layer.ffn.fc1);
    p.prepare(layer.ffn.fc2);
  }
  prepared->sequences = steps;
  return prepared;
}

}  // namespace tfm
