// Parameter binding and checking.
#include "model/weights.h"

#include "tensor/error.h"

namespace tfm {

namespace {

const Tensor& find(const TensorMap& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw Error("missing tensor \"" + name + "\"");
  return it->second;
}

LinearWeights bind_linear(const TensorMap& tensors, const std::string& prefix) {
  const Tensor& w = find(tensors, prefix + ".weight");
  if (w.shape.size() != 2) throw Error("tensor \"" + prefix + ".weight\" is not a matrix");
  LinearWeights l;
  l.weight = w.ptr();
  l.out = w.shape[0];
  l.in = w.shape[1];
  l.bias = find(tensors, prefix + ".bias").ptr();
  return l;
}

LayerNormWeights bind_norm(const TensorMap& tensors, const std::string& prefix) {
  return {find(tensors, prefix + ".weight").ptr(), find(tensors, prefix + ".bias").ptr()};
}

FeedForwardWeights bind_ffn(const TensorMap& tensors, const std::string& prefix) {
  return {bind_linear(tensors, prefix + ".fc1"), bind_linear(tensors, prefix + ".fc2")};
}

}  // namespace

AttentionWeights bind_attention(const TensorMap& tensors, const std::string& prefix) {
  return {bind_linear(tensors, prefix + ".q"), bind_linear(tensors, prefix + ".k"),
          bind_linear(tensors, prefix + ".v"), bind_linear(tensors, prefix + ".o")};
}

EncoderLayerWeights bind_encoder_layer(const TensorMap& tensors, const std::string& prefix) {
  return {bind_attention(tensors, prefix + ".self_attn"), bind_norm(tensors, prefix + ".norm1"),
          bind_ffn(tensors, prefix + ".ffn"), bind_norm(tensors, prefix + ".norm2")};
}

DecoderLayerWeights bind_decoder_layer(const TensorMap& tensors, const std::string& prefix) {
  return {bind_attention(tensors, prefix + ".self_attn"),
          bind_norm(tensors, prefix + ".norm1"),
          bind_attention(tensors, prefix + ".cross_attn"),
          bind_norm(tensors, prefix + ".norm2"),
          bind_ffn(tensors, prefix + ".ffn"),
          bind_norm(tensors, prefix + ".norm3")};
}

void check_parameters(const ModelConfig& config, const TensorMap& tensors,
                      const std::string& where) {
  const auto specs = parameter_specs(config);
  for (const auto& spec : specs) {
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) throw Error(where + ": missing tensor \"" + spec.name + "\"");
    if (it->second.shape != spec.shape)
      throw Error(where + ": tensor \"" + spec.name + "\" has shape " +
                  shape_to_string(it->second.shape) + ", expected " + shape_to_string(spec.shape));
  }
  if (tensors.size() != specs.size()) {
    for (const auto& [name, tensor] : tensors) {
      bool used = false;
      for (const auto& spec : specs) used = used || spec.name == name;
      if (!used) throw Error(where + ": unexpected tensor \"" + name + "\" for this config");
    }
  }
}

TransformerWeights bind_weights(const ModelConfig& config, const TensorMap& tensors,
                                const std::string& where) {
  check_parameters(config, tensors, where);
  TransformerWeights w;
  switch (config.share_embeddings) {
    case EmbeddingSharing::kAll:
      w.src_embed = w.tgt_embed = w.output_weight = find(tensors, "embed.weight").ptr();
      break;
    case EmbeddingSharing::kTarget:
      w.src_embed = find(tensors, "src_embed.weight").ptr();
      w.tgt_embed = w.output_weight = find(tensors, "tgt_embed.weight").ptr();
      break;
    case EmbeddingSharing::kNone:
      w.src_embed = find(tensors, "src_embed.weight").ptr();
      w.tgt_embed = find(tensors, "tgt_embed.weight").ptr();
      w.output_weight = find(tensors, "out_proj.weight").ptr();
      break;
  }
  if (config.output_bias) w.output_bias = find(tensors, "out_proj.bias").ptr();
  if (config.position_encoding == PositionEncoding::kLearned) {
    w.encoder_pos_embed = find(tensors, "encoder.pos_embed.weight").ptr();
    w.decoder_pos_embed = find(tensors, "decoder.pos_embed.weight").ptr();
  }
  for (int64_t i = 0; i < config.encoder_layers; ++i)
    w.encoder_layers.push_back(bind_encoder_layer(tensors, "encoder.layers." + std::to_string(i)));
  for (int64_t i = 0; i < config.decoder_layers; ++i)
    w.decoder_layers.push_back(bind_decoder_layer(tensors, "decoder.layers." + std::to_string(i)));
  if (config.norm == NormPosition::kPre) {
    w.encoder_norm = bind_norm(tensors, "encoder.norm");
    w.decoder_norm = bind_norm(tensors, "decoder.norm");
  }
  return w;
}

}  // namespace tfm
