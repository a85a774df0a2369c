// Parameter binding and checking.
#include "model/weights.h"

#include "tensor/error.h"

namespace tfm {

namespace {

// Map is a const DeviceTensors (weights), a DeviceTensors (gradients) or a const TensorMap
// (single layers for tests); F is const float or float to match.
template <typename Map>
auto& find(Map& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw Error("missing tensor \"" + name + "\"");
  return it->second;
}

// int8: the weights held in int8 (tensor/int8_weights.h), whose float tensors keep only their
// shape; a Linear whose weight is found there reads it instead (weight null). Null: none.
template <typename F>
void bind_int8(Linear<F>& l, const std::string& name, const DeviceInt8Weights* int8) {
  if (!int8) return;
  auto it = int8->find(name);
  if (it == int8->end()) return;
  l.weight = nullptr;
  l.int8 = it->second.view();
}

template <typename F, typename Map>
Linear<F> bind_linear(Map& tensors, const std::string& prefix, const DeviceInt8Weights* int8) {
  auto& w = find(tensors, prefix + ".weight");
  if (w.shape.size() != 2) throw Error("tensor \"" + prefix + ".weight\" is not a matrix");
  Linear<F> l;
  l.weight = w.ptr();
  bind_int8(l, prefix + ".weight", int8);
  l.out = w.shape[0];
  l.in = w.shape[1];
  l.bias = find(tensors, prefix + ".bias").ptr();
  return l;
}

template <typename F, typename Map>
LayerNormParams<F> bind_norm(Map& tensors, const std::string& prefix) {
  return {find(tensors, prefix + ".weight").ptr(), find(tensors, prefix + ".bias").ptr()};
}

template <typename F, typename Map>
FeedForward<F> bind_ffn(Map& tensors, const std::string& prefix, const DeviceInt8Weights* int8) {
  return {bind_linear<F>(tensors, prefix + ".fc1", int8),
          bind_linear<F>(tensors, prefix + ".fc2", int8)};
}

template <typename F, typename Map>
Attention<F> bind_attention_of(Map& tensors, const std::string& prefix, AttentionScoring scoring,
                               const DeviceInt8Weights* int8) {
  Attention<F> a;
  a.q = bind_linear<F>(tensors, prefix + ".q", int8);
  a.k = bind_linear<F>(tensors, prefix + ".k", int8);
  a.v = bind_linear<F>(tensors, prefix + ".v", int8);
  a.o = bind_linear<F>(tensors, prefix + ".o", int8);
  a.scoring = scoring;
  if (scoring == AttentionScoring::kAdditive)
    a.additive_v = find(tensors, prefix + ".additive_v").ptr();
  return a;
}

template <typename F, typename Map>
EncoderLayer<F> bind_encoder_layer_of(Map& tensors, const std::string& prefix,
                                      AttentionScoring scoring, const DeviceInt8Weights* int8) {
  return {bind_attention_of<F>(tensors, prefix + ".self_attn", scoring, int8),
          bind_norm<F>(tensors, prefix + ".norm1"), bind_ffn<F>(tensors, prefix + ".ffn", int8),
          bind_norm<F>(tensors, prefix + ".norm2")};
}

template <typename F, typename Map>
DecoderLayer<F> bind_decoder_layer_of(Map& tensors, const std::string& prefix,
                                      AttentionScoring scoring, const DeviceInt8Weights* int8) {
  return {bind_attention_of<F>(tensors, prefix + ".self_attn", scoring, int8),
          bind_norm<F>(tensors, prefix + ".norm1"),
          bind_attention_of<F>(tensors, prefix + ".cross_attn", scoring, int8),
          bind_norm<F>(tensors, prefix + ".norm2"),
          bind_ffn<F>(tensors, prefix + ".ffn", int8),
          bind_norm<F>(tensors, prefix + ".norm3")};
}

template <typename F, typename Map>
TransformerParams<F> bind_all(const ModelConfig& config, Map& tensors,
                              const DeviceInt8Weights* int8 = nullptr) {
  TransformerParams<F> w;
  // An embedding's float rows, or null and its int8 view when int8 holds it.
  auto embedding = [&](const char* name, Int8Rows& int8_view) -> F* {
    if (int8) {
      if (auto it = int8->find(name); it != int8->end()) {
        int8_view = it->second.view();
        find(tensors, name);  // still required, with no data
        return nullptr;
      }
    }
    return find(tensors, name).ptr();
  };
  switch (config.share_embeddings) {
    case EmbeddingSharing::kAll:
      w.src_embed = w.tgt_embed = w.output.weight = embedding("embed.weight", w.src_embed_int8);
      w.tgt_embed_int8 = w.output.int8 = w.src_embed_int8;
      break;
    case EmbeddingSharing::kTarget:
      w.src_embed = embedding("src_embed.weight", w.src_embed_int8);
      w.tgt_embed = w.output.weight = embedding("tgt_embed.weight", w.tgt_embed_int8);
      w.output.int8 = w.tgt_embed_int8;
      break;
    case EmbeddingSharing::kNone:
      w.src_embed = embedding("src_embed.weight", w.src_embed_int8);
      w.tgt_embed = embedding("tgt_embed.weight", w.tgt_embed_int8);
      w.output.weight = find(tensors, "out_proj.weight").ptr();
      bind_int8(w.output, "out_proj.weight", int8);
      break;
  }
  w.output.in = config.d_model;
  w.output.out = config.tgt_vocab_size;
  if (config.output_bias) w.output.bias = find(tensors, "out_proj.bias").ptr();
  if (config.position_encoding == PositionEncoding::kLearned) {
    w.encoder_pos_embed = find(tensors, "encoder.pos_embed.weight").ptr();
    w.decoder_pos_embed = find(tensors, "decoder.pos_embed.weight").ptr();
  }
  for (int64_t i = 0; i < config.encoder_layers; ++i)
    w.encoder_layers.push_back(bind_encoder_layer_of<F>(
        tensors, "encoder.layers." + std::to_string(i), config.attention, int8));
  for (int64_t i = 0; i < config.decoder_layers; ++i)
    w.decoder_layers.push_back(bind_decoder_layer_of<F>(
        tensors, "decoder.layers." + std::to_string(i), config.attention, int8));
  if (config.norm == NormPosition::kPre) {
    w.encoder_norm = bind_norm<F>(tensors, "encoder.norm");
    w.decoder_norm = bind_norm<F>(tensors, "decoder.norm");
  }
  return w;
}

}  // namespace

EncoderLayerWeights bind_encoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring) {
  return bind_encoder_layer_of<const float>(tensors, prefix, scoring, nullptr);
}

DecoderLayerWeights bind_decoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring) {
  return bind_decoder_layer_of<const float>(tensors, prefix, scoring, nullptr);
}

void check_parameter_shapes(const ModelConfig& config, const std::map<std::string, Shape>& shapes,
                            const std::string& where) {
  const auto specs = parameter_specs(config);
  for (const auto& spec : specs) {
    auto it = shapes.find(spec.name);
    if (it == shapes.end()) throw Error(where + ": missing tensor \"" + spec.name + "\"");
    if (it->second != spec.shape)
      throw Error(where + ": tensor \"" + spec.name + "\" has shape " +
                  shape_to_string(it->second) + ", expected " + shape_to_string(spec.shape));
  }
  if (shapes.size() != specs.size()) {
    for (const auto& [name, shape] : shapes) {
      bool used = false;
      for (const auto& spec : specs) used = used || spec.name == name;
      if (!used)
        throw Error(where + ": unexpected tensor " + quoted_for_message(name) + " for this config");
    }
  }
}

bool is_token_embedding(const std::string& name) {
  return name == "embed.weight" || name == "src_embed.weight" || name == "tgt_embed.weight";
}

bool is_linear_weight(const std::string& name) {
  if (name == "out_proj.weight") return true;
  for (const char* suffix :
       {".q.weight", ".k.weight", ".v.weight", ".o.weight", ".fc1.weight", ".fc2.weight"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
        (name.rfind("encoder.layers.", 0) == 0 || name.rfind("decoder.layers.", 0) == 0))
      return true;
  }
  return false;
}

TransformerWeights bind_weights(const ModelConfig& config, const DeviceTensors& tensors,
                                const std::string& where, const DeviceInt8Weights* int8) {
  check_parameter_shapes(config, tensors.shapes(), where);
  return bind_all<const float>(config, tensors, int8);
}

namespace {

// f(linear) for every Linear of `weights` (the stacked qkv / kv views included).
template <typename Weights, typename F>
void for_each_linear(Weights& weights, F f) {
  auto attention = [&f](auto& a) {
    for (auto* l : {&a.q, &a.k, &a.v, &a.o, &a.qkv, &a.kv}) f(*l);
  };
  for (auto& layer : weights.encoder_layers) {
    attention(layer.self_attn);
    f(layer.ffn.fc1);
    f(layer.ffn.fc2);
  }
  for (auto& layer : weights.decoder_layers) {
    attention(layer.self_attn);
    attention(layer.cross_attn);
    f(layer.ffn.fc1);
    f(layer.ffn.fc2);
  }
  f(weights.output);
}

// Whether with_rounded_weights rounds this linear's weight.
bool has_rounded_weight(const LinearWeights& l) {
  return l.precision == Precision::kBFloat16 && !l.prepared && l.weight && l.out > 0;
}

}  // namespace

TransformerWeights with_product_precision(TransformerWeights weights, Precision precision) {
  for_each_linear(weights, [precision](LinearWeights& l) { l.precision = precision; });
  return weights;
}

int64_t rounded_weights_elements(const TransformerWeights& weights) {
  int64_t n = 0;
  for_each_linear(weights, [&n](const LinearWeights& l) {
    if (has_rounded_weight(l)) n += l.out * l.in;
  });
  return n;
}

TransformerWeights with_rounded_weights(const Backend& backend, TransformerWeights weights,
                                        DeviceBuffer<uint16_t>& storage) {
  uint16_t* next = ensure_size(backend, storage, rounded_weights_elements(weights));
  for_each_linear(weights, [&](LinearWeights& l) {
    if (!has_rounded_weight(l)) return;
    backend.round_to_bfloat16(l.weight, l.out, l.in, l.in, next);  // [out, in]
    l.rounded = next;
    next += l.out * l.in;
  });
  return weights;
}

TransformerGradients bind_gradients(const ModelConfig& config, DeviceTensors& gradients) {
  check_parameter_shapes(config, gradients.shapes(), "gradients");
  return bind_all<float>(config, gradients);
}

}  // namespace tfm
