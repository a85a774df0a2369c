// Export of our models as CTranslate2 4.x model directories: TransformerSpec revision 7 in
// binary version 6, with the variables, flags, aliases and config.json that CTranslate2's own
// converters write for the same architecture (TransformerSpec.from_config), so its runtime
// (ct2-translator, the Python Translator) loads them unchanged.
#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/ctranslate2.h"
#include "model/parameter_tree.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/file_util.h"

namespace tfm {

namespace {

// Our position scheme as CTranslate2 sees it: nothing when its own sinusoid (concat layout,
// positions from 1) is ours, else the rows the model adds for positions 0..limit-1 (zeros for
// "none", which CTranslate2 then adds as a table).
std::optional<Tensor> position_table(const Model& model, bool encoder) {
  const ModelConfig& c = model.config();
  if (c.position_encoding == PositionEncoding::kSinusoidal &&
      c.sinusoid_layout == SinusoidLayout::kConcat && c.position_offset == 1 &&
      c.max_positions == ModelConfig{}.max_positions)
    return std::nullopt;
  const int64_t rows = sequence_positions(c), d = c.d_model;
  if (rows < 1) throw Error("the model has no usable positions (max_positions <= position_offset)");
  Tensor table({rows, d});  // [positions, d_model]
  const float* added = encoder ? model.encoder_positions() : model.decoder_positions();
  if (added) std::copy_n(added + c.position_offset * d, rows * d, table.data.begin());
  return table;
}

// The float tensors of the spec, by CTranslate2 name (sorted), and whether each is
// quantizable (a Linear's or Embeddings' weight).
struct SpecTensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, bool> quantizable;
  void add(const std::string& name, Tensor t, bool is_weight) {
    tensors[name] = std::move(t);
    quantizable[name] = is_weight;
  }
};

Tensor stack_rows(const TensorMap& p, const std::vector<std::string>& names) {
  Tensor out;
  for (const std::string& name : names) {
    const Tensor& t = p.at(name);
    if (out.shape.empty()) {
      out.shape = t.shape;
      out.shape[0] = 0;
    }
    out.shape[0] += t.shape[0];
    out.data.insert(out.data.end(), t.data.begin(), t.data.end());
  }
  return out;
}

// The model's tensors under CTranslate2's names: a walk of the parameter tree
// (model/parameter_tree.h), plus the position tables CTranslate2 adds per position.
struct SpecWriter : ParameterVisitor {
  const TensorMap& p;
  SpecTensors& s;

  void linears(const std::string& scope, const std::vector<LinearPart<const float>>& parts) {
    std::vector<std::string> weights, biases;
    for (const LinearPart<const float>& part : parts) {
      weights.push_back(part.name + ".weight");
      biases.push_back(part.name + ".bias");
    }
    s.add(scope + "/weight", stack_rows(p, weights), true);
    // An all-zero bias is left out, as CTranslate2's converters leave out the biases a model
    // does not have (OpenNMT-py's query/key/value and feed-forward layers by default):
    // CTranslate2 then adds none, which is the same.
    Tensor bias = stack_rows(p, biases);
    if (std::any_of(bias.data.begin(), bias.data.end(), [](float v) { return v != 0.f; }))
      s.add(scope + "/bias", std::move(bias), false);
  }
  void norm(LayerNormParams<const float>&, const std::string& name, const std::string& scope) {
    s.add(scope + "/gamma", p.at(name + ".weight"), false);
    s.add(scope + "/beta", p.at(name + ".bias"), false);
  }
  void tensor(const float*&, Int8Rows*, const TensorPlace& place) {
    // Position tables are written by position_table; additive attention is refused before.
    for (const std::string& variable : place.ctranslate2)
      s.add(variable, p.at(place.name),
            place.role == ParameterRole::kTokenEmbedding ||
                place.role == ParameterRole::kLinearWeight);
  }
};

SpecTensors spec_tensors(const Model& model) {
  const ModelConfig& c = model.config();
  const TensorMap p = model.parameters().to_host();
  SpecTensors s;
  SpecWriter writer{{}, p, s};
  TransformerParams<const float> scratch;
  walk_parameters(c, scratch, writer);
  for (const char* stack : {"encoder", "decoder"})
    if (auto table = position_table(model, std::string(stack) == "encoder"))
      s.add(std::string(stack) + "/position_encodings/encodings", std::move(*table), false);
  return s;
}

// The scalar flags TransformerSpec.from_config(...) stores for our architecture.
std::vector<CtVariable> spec_flags(const ModelConfig& c) {
  const int8_t activation = c.activation == Activation::kRelu ? 0 : 3;  // RELU 0, GELU 3
  const int8_t pre_norm = c.norm == NormPosition::kPre ? 1 : 0;
  std::vector<CtVariable> flags;
  for (const std::string stack : {"encoder", "decoder"}) {
    flags.push_back(ct_int8_scalar(stack + "/activation", activation));
    flags.push_back(ct_int16_scalar(stack + "/num_heads", int16_t(c.heads)));
    flags.push_back(ct_int8_scalar(stack + "/pre_norm", pre_norm));
    flags.push_back(ct_int8_scalar(stack + "/scale_embeddings", c.scale_embeddings ? 1 : 0));
  }
  flags.push_back(ct_int8_scalar("encoder/embeddings_merge", 0));
  flags.push_back(ct_int8_scalar("encoder/multi_query_attention", 0));
  flags.push_back(ct_int8_scalar("decoder/alibi", 0));
  flags.push_back(ct_int8_scalar("decoder/alibi_use_positive_positions", 0));
  flags.push_back(ct_int16_scalar("decoder/alignment_heads", 1));
  flags.push_back(ct_int16_scalar("decoder/alignment_layer", -1));
  flags.push_back(ct_int8_scalar("decoder/scale_alibi", 0));
  flags.push_back(ct_int8_scalar("decoder/start_from_zero_embedding", 0));
  // Unscaled dot-product attention: every attention layer's queries_scale is 1 (CTranslate2's
  // MultiHeadAttention reads it per layer; absent, it is 1/sqrt(d_k)).
  if (c.attention == AttentionScoring::kDot) {
    for (int64_t i = 0; i < c.encoder_layers; ++i)
      flags.push_back(ct_float32_scalar(
          "encoder/layer_" + std::to_string(i) + "/self_attention/queries_scale", 1.f));
    for (int64_t i = 0; i < c.decoder_layers; ++i)
      for (const char* scope : {"/self_attention", "/attention"})
        flags.push_back(ct_float32_scalar(
            "decoder/layer_" + std::to_string(i) + scope + "/queries_scale", 1.f));
  }
  return flags;
}

void check_exportable(const ModelConfig& c, const CTranslate2Tokens& tokens) {
  if (c.self_attention_window >= 0)
    throw Error("restricted self-attention (self_attention_window " +
                std::to_string(c.self_attention_window) +
                ") has no CTranslate2 equivalent: its sliding_window only bounds the decoder's "
                "cache, the encoder would attend everywhere");
  if (c.attention == AttentionScoring::kAdditive)
    throw Error(
        "additive attention (config \"attention\": \"additive\") has no CTranslate2 "
        "equivalent");
  if (c.heads > 32767) throw Error("CTranslate2 stores num_heads as int16");
  if (int64_t(tokens.source.size()) != c.src_vocab_size ||
      int64_t(tokens.target.size()) != c.tgt_vocab_size)
    throw Error("the vocabularies do not match the model's vocabulary sizes");
  // CTranslate2 maps a token string to its first id and appends unk_token when it is missing.
  auto first_id = [](const std::vector<std::string>& list, const std::string& token) {
    return int64_t(std::find(list.begin(), list.end(), token) - list.begin());
  };
  for (const auto* list : {&tokens.source, &tokens.target})
    if (first_id(*list, tokens.unk_token) == int64_t(list->size()))
      throw Error("the vocabularies need the unknown token " +
                  quoted_for_message(tokens.unk_token) +
                  " (CTranslate2 would append it and change their size)");
  const std::pair<const char*, int64_t> specials[] = {{"bos_id", c.bos_id}, {"eos_id", c.eos_id}};
  for (const auto& [key, id] : specials)
    if (first_id(tokens.target, tokens.target[size_t(id)]) != id)
      throw Error(std::string("the target token of ") + key + " (" +
                  quoted_for_message(tokens.target[size_t(id)]) +
                  ") also appears at a lower id, which CTranslate2 would use instead");
  if (c.src_append_eos && first_id(tokens.source, tokens.target[size_t(c.eos_id)]) != c.eos_id)
    throw Error("the source vocabulary does not hold the end token " +
                quoted_for_message(tokens.target[size_t(c.eos_id)]) + " at eos_id " +
                std::to_string(c.eos_id) + ", which CTranslate2 appends to every source");
}

uint64_t content_hash(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (int64_t d : t.shape) mix(&d, sizeof d);
  mix(t.data.data(), t.data.size() * sizeof(float));
  return h;
}

}  // namespace

void export_ctranslate2(const Model& model, const CTranslate2Tokens& tokens,
                        CtQuantization quantization, const std::string& directory) {
  const ModelConfig& c = model.config();
  check_exportable(c, tokens);
  SpecTensors spec = spec_tensors(model);
  // Converter aliasing: a tensor equal to one earlier in name order becomes an alias of it.
  std::vector<std::pair<std::string, std::string>> aliases;
  std::unordered_multimap<uint64_t, std::string> seen;
  std::vector<CtVariable> variables = spec_flags(c);
  for (const auto& [name, tensor] : spec.tensors) {
    const uint64_t hash = content_hash(tensor);
    std::string alias_of;
    auto [begin, end] = seen.equal_range(hash);
    for (auto it = begin; it != end && alias_of.empty(); ++it) {
      const Tensor& other = spec.tensors.at(it->second);
      if (other.shape == tensor.shape && other.data == tensor.data) alias_of = it->second;
    }
    if (!alias_of.empty()) {
      aliases.emplace_back(name, alias_of);
      continue;
    }
    seen.emplace(hash, name);
    append_ct_variable(variables, name, tensor, spec.quantizable.at(name), quantization);
  }
  const std::string bytes =
      serialize_ctranslate2_model("TransformerSpec", 7, std::move(variables), aliases);

  nlohmann::json config = {
      {"add_source_bos", false},
      {"add_source_eos", c.src_append_eos},
      {"bos_token", tokens.target[size_t(c.bos_id)]},
      {"decoder_start_token", tokens.target[size_t(c.bos_id)]},
      {"eos_token", tokens.target[size_t(c.eos_id)]},
      {"layer_norm_epsilon", c.layer_norm_eps},
      {"multi_query_attention", false},
      {"unk_token", tokens.unk_token},
  };
  // What this writes, and the vocabulary names CTranslate2's own converters use: an export
  // replaces a previous one as a whole.
  static const std::vector<std::string> kExportFiles = {"model.bin",
                                                        "config.json",
                                                        "shared_vocabulary.json",
                                                        "source_vocabulary.json",
                                                        "target_vocabulary.json",
                                                        "shared_vocabulary.txt",
                                                        "source_vocabulary.txt",
                                                        "target_vocabulary.txt"};
  write_directory_atomically(directory, kExportFiles, [&](const std::string& temp) {
    if (tokens.source == tokens.target) {
      write_bytes_atomically(temp + "/shared_vocabulary.json",
                             nlohmann::json(tokens.target).dump(2) + "\n");
    } else {
      write_bytes_atomically(temp + "/source_vocabulary.json",
                             nlohmann::json(tokens.source).dump(2) + "\n");
      write_bytes_atomically(temp + "/target_vocabulary.json",
                             nlohmann::json(tokens.target).dump(2) + "\n");
    }
    write_bytes_atomically(temp + "/config.json", config.dump(2) + "\n");
    write_bytes_atomically(temp + "/model.bin", bytes);
  });
}

}  // namespace tfm
