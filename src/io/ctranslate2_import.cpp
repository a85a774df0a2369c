// Import of CTranslate2 Transformer models: every variable of CTranslate2's TransformerSpec
// (python/ctranslate2/specs/*.py, read by src/layers/transformer.cc) is known by name and
// either mapped onto our parameters, accepted at its default value, or refused with an error
// naming the feature it switches on. Older layouts (binary versions 1–5, spec revisions 1–6)
// are read the way CTranslate2's runtime reads them.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "io/ctranslate2.h"
#include "model/config.h"
#include "model/parameter_tree.h"
#include "model/positional_encoding.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/strict_json.h"

namespace tfm {

namespace {

// The variables of one model.bin, consumed by name; whatever is left at the end is unknown.
class SpecVariables {
 public:
  SpecVariables(CTranslate2Variables file, std::string where)
      : file_(std::move(file)), where_(std::move(where)) {}

  const CTranslate2Variables& file() const { return file_; }
  bool has(const std::string& name) const { return file_.variables.count(name) != 0; }
  bool has_scope(const std::string& scope) const {
    auto it = file_.variables.lower_bound(scope + "/");
    return it != file_.variables.end() && it->first.compare(0, scope.size() + 1, scope + "/") == 0;
  }
  CtDtype stored_dtype(const std::string& name) const { return file_.stored_dtypes.at(name); }

  Tensor take(const std::string& name) {
    std::optional<Tensor> t = take_optional(name);
    if (!t) fail("missing variable " + quoted_for_message(name));
    return std::move(*t);
  }
  // The int8 form of a variable stored in int8 (its fp32 form is taken with take()).
  std::optional<Int8Matrix> take_int8(const std::string& name) {
    return take_from(file_.int8_matrices, name);
  }
  std::optional<Tensor> take_optional(const std::string& name) {
    return take_from(file_.variables, name);
  }
  // A scalar flag, enum or number; `fallback` when absent.
  double take_scalar(const std::string& name, double fallback) {
    std::optional<Tensor> t = take_optional(name);
    if (!t) return fallback;
    if (t->numel() != 1) fail("variable " + quoted_for_message(name) + " is not a scalar");
    return t->data[0];
  }
  // Strings stored as int8 arrays (special tokens before binary version 6).
  std::string take_string(const std::string& name, const std::string& fallback) {
    std::optional<Tensor> t = take_optional(name);
    if (!t) return fallback;
    std::string s;
    for (float c : t->data) s += char(int8_t(c));
    return s;
  }
  void rename(const std::string& from, const std::string& to) {
    auto it = file_.variables.find(from);
    if (it == file_.variables.end() || has(to)) return;
    file_.variables.emplace(to, it->second);
    file_.stored_dtypes[to] = file_.stored_dtypes[from];
    auto int8 = file_.int8_matrices.find(from);
    if (int8 != file_.int8_matrices.end()) file_.int8_matrices.emplace(to, int8->second);
  }
  void erase(const std::string& name) { file_.variables.erase(name); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : file_.variables) out.push_back(name);
    return out;
  }

  [[noreturn]] void fail(const std::string& message) const { throw Error(where_ + ": " + message); }
  // A CTranslate2 feature that is switched on in this model and absent from ours.
  [[noreturn]] void refuse(const std::string& feature) const {
    fail("the model uses " + feature + ", which this engine's Transformer does not implement");
  }

 private:
  // Moves the entry `name` out of `entries` (consumed); nullopt when absent.
  template <typename T>
  static std::optional<T> take_from(std::map<std::string, T>& entries, const std::string& name) {
    auto it = entries.find(name);
    if (it == entries.end()) return std::nullopt;
    T value = std::move(it->second);
    entries.erase(it);
    return value;
  }

  CTranslate2Variables file_;
  std::string where_;
};

bool is_float_dtype(CtDtype d) {
  return d == CtDtype::kF32 || d == CtDtype::kF16 || d == CtDtype::kBF16;
}

// Binary version 1 used OpenNMT-tf's names (CTranslate2's models/transformer.cc maps them).
std::string map_version1_name(std::string name) {
  auto replace_first = [&](const std::string& from, const std::string& to) {
    const size_t at = name.find(from);
    if (at != std::string::npos) name.replace(at, from.size(), to);
  };
  replace_first("transformer/", "");
  replace_first(":0", "");
  replace_first("w_embs", "embeddings/weight");
  replace_first("kernel", "weight");
  replace_first("LayerNorm", "layer_norm");
  replace_first("dense", "projection");
  replace_first("conv1d_", "linear_");
  replace_first("conv1d", "linear_0");
  if (name.find("encoder") != std::string::npos) {
    replace_first("multi_head", "self_attention");
  } else {
    replace_first("masked_multi_head", "self_attention");
    replace_first("multi_head", "attention");
  }
  return name;
}

// Brings older layouts to revision 7's names: version-1 names, and the model-level flags that
// revisions < 5 stored once for both stacks (revisions < 3 did not store num_heads at all).
void apply_legacy_layout(SpecVariables& v) {
  const CTranslate2Variables& file = v.file();
  if (file.version == 1) {
    for (const std::string& name : v.names()) {
      const std::string mapped = map_version1_name(name);
      if (mapped != name) {
        v.rename(name, mapped);
        v.erase(name);
      }
    }
  }
  if (file.spec_revision < 5) {
    for (const char* flag : {"num_heads", "pre_norm", "activation", "embeddings_merge"}) {
      v.rename(flag, std::string("encoder/") + flag);
      v.rename(flag, std::string("decoder/") + flag);
      v.erase(flag);
    }
    for (const char* flag : {"alignment_layer", "alignment_heads"}) {
      v.rename(flag, std::string("decoder/") + flag);
      v.erase(flag);
    }
  }
}

int64_t default_heads(const CTranslate2Variables& file) {
  return file.spec_name == "TransformerBig" ? 16 : 8;
}

Activation map_activation(SpecVariables& v, double id) {
  // CTranslate2's ops::ActivationType: ReLU 0, GELUTanh 1, Swish 2, GELU 3, GELUSigmoid 4,
  // Tanh 5, Sigmoid 6.
  switch (int(id)) {
    case 0:
      return Activation::kRelu;
    case 3:
      return Activation::kGelu;
    case 1:
      v.refuse("the tanh approximation of GELU (activation GELUTanh)");
    case 2:
      v.refuse("the Swish activation");
    case 4:
      v.refuse("the sigmoid approximation of GELU (activation GELUSigmoid)");
    case 5:
      v.refuse("the tanh activation");
    case 6:
      v.refuse("the sigmoid activation");
  }
  v.fail("unknown activation id " + std::to_string(int(id)));
}

// `scope/scale_embeddings` (or the older `scope/embeddings/multiply_by_sqrt_depth`): an int8
// flag, or a float that CTranslate2 multiplies by (1 meaning no scaling).
bool read_embedding_scale(SpecVariables& v, const std::string& scope, int64_t d_model) {
  std::string name = scope + "/scale_embeddings";
  if (!v.has(name)) name = scope + "/embeddings/multiply_by_sqrt_depth";
  if (!v.has(name)) return true;
  const bool is_float = is_float_dtype(v.stored_dtype(name));
  const double value = v.take_scalar(name, 1.0);
  if (!is_float) return value != 0.0;
  const double root = std::sqrt(double(d_model));
  if (value == 1.0) return false;
  if (std::fabs(value - root) <= 1e-5 * root) return true;
  v.refuse("an embedding scale of " + std::to_string(value) + " (ours scales by sqrt(d_model) " +
           std::to_string(root) + " or not at all)");
}

// Flags of one stack that only switch on features we do not have: refused when on.
void check_stack_flags(SpecVariables& v, const std::string& stack) {
  auto refuse_if_on = [&](const std::string& name, const std::string& feature) {
    if (v.take_scalar(stack + "/" + name, 0.0) != 0.0) v.refuse(feature);
  };
  refuse_if_on("multi_query_attention", "multi-query attention");
  refuse_if_on("sliding_window", "sliding-window attention");
  refuse_if_on("alibi", "ALiBi attention biases");
  refuse_if_on("start_from_zero_embedding", "a zero embedding for the decoder start");
  refuse_if_on("final_logit_softcapping", "final logit soft-capping");
  if (v.has(stack + "/scale_outputs") && v.take_scalar(stack + "/scale_outputs", 1.0) != 1.0)
    v.refuse("scaled decoder outputs (scale_outputs)");
  // Meaningful only with ALiBi, with several source embeddings, or for alignments we do not
  // return: accepted at any value.
  for (const char* ignored : {"alibi_use_positive_positions", "scale_alibi", "embeddings_merge",
                              "alignment_layer", "alignment_heads"})
    v.take_scalar(stack + "/" + ignored, 0.0);
  if (v.has_scope(stack + "/layernorm_embedding")) v.refuse("a layer norm after the embeddings");
  if (v.has_scope(stack + "/project_in") || v.has_scope(stack + "/project_out"))
    v.refuse("decoder input/output projections (project_in_out)");
}

// Heads, norm placement and activation: one value each for both stacks.
void read_architecture(SpecVariables& v, ModelConfig& c) {
  const double fallback_heads = double(default_heads(v.file()));
  const double encoder_heads = v.take_scalar("encoder/num_heads", fallback_heads);
  const double decoder_heads = v.take_scalar("decoder/num_heads", fallback_heads);
  if (encoder_heads != decoder_heads)
    v.refuse("different head counts in the encoder and the decoder");
  c.heads = int64_t(encoder_heads);
  const double encoder_pre = v.take_scalar("encoder/pre_norm", 1.0);
  const double decoder_pre = v.take_scalar("decoder/pre_norm", 1.0);
  if ((encoder_pre != 0.0) != (decoder_pre != 0.0))
    v.refuse("pre-norm in one stack and post-norm in the other");
  c.norm = encoder_pre != 0.0 ? NormPosition::kPre : NormPosition::kPost;
  const Activation encoder_activation = map_activation(v, v.take_scalar("encoder/activation", 0.0));
  const Activation decoder_activation = map_activation(v, v.take_scalar("decoder/activation", 0.0));
  if (encoder_activation != decoder_activation)
    v.refuse("different activations in the encoder and the decoder");
  c.activation = encoder_activation;
  // Dot products without the 1/sqrt(d_k) factor: queries_scale 1 (every attention scope is
  // checked against this one in refuse_scope_features).
  const auto first_scale = v.file().variables.find("encoder/layer_0/self_attention/queries_scale");
  if (first_scale != v.file().variables.end() && first_scale->second.numel() == 1 &&
      first_scale->second.data[0] == 1.f)
    c.attention = AttentionScoring::kDot;
  check_stack_flags(v, "encoder");
  check_stack_flags(v, "decoder");
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && a.data == b.data;
}

// Source and target embeddings, the pre-softmax projection, and which of them are one matrix
// (CTranslate2's converters alias equal variables; equal values are what sharing means).
void map_embeddings(SpecVariables& v, ModelConfig& c, TensorMap& p, Int8WeightMap& int8) {
  if (v.has_scope("encoder/embeddings_1")) v.refuse("several source embeddings (source factors)");
  const std::string src_name = v.has("encoder/embeddings/weight") ? "encoder/embeddings/weight"
                                                                  : "encoder/embeddings_0/weight";
  Tensor src = v.take(src_name);
  Tensor tgt = v.take("decoder/embeddings/weight");
  Tensor proj = v.take("decoder/projection/weight");
  // Embeddings stored in int8 stay so (as linear weights do); a tied projection reads them.
  std::optional<Int8Matrix> src_int8 = v.take_int8(src_name);
  std::optional<Int8Matrix> tgt_int8 = v.take_int8("decoder/embeddings/weight");
  for (const Tensor* t : {&src, &tgt, &proj})
    if (t->shape.size() != 2) v.fail("embeddings and the projection must be matrices");
  c.d_model = src.shape[1];
  if (tgt.shape[1] != c.d_model || proj.shape[1] != c.d_model)
    v.fail("embeddings and projection differ in width");
  if (proj.shape[0] != tgt.shape[0])
    v.fail("the projection's rows do not match the target vocabulary");
  c.src_vocab_size = src.shape[0];
  c.tgt_vocab_size = tgt.shape[0];
  if (same_values(src, tgt) && same_values(tgt, proj))
    c.share_embeddings = EmbeddingSharing::kAll;
  else if (same_values(tgt, proj))
    c.share_embeddings = EmbeddingSharing::kTarget;
  else
    c.share_embeddings = EmbeddingSharing::kNone;
  std::optional<Tensor> bias = v.take_optional("decoder/projection/bias");
  c.output_bias = bias.has_value();
  // Our tensors for the sharing found are the parameter spec's: each takes the CTranslate2
  // variable it is written as first (a shared table is written as several, the same values).
  // Embeddings stored in int8 stay so, as linear weights do; a tied projection reads them.
  struct Source {
    Tensor* values;
    std::optional<Int8Matrix>* int8;  // null: never int8 (a bias)
  };
  std::optional<Int8Matrix> proj_int8;  // taken only where the projection is a tensor of its own
  const std::map<std::string, Source> sources = {
      {"encoder/embeddings_0/weight", {&src, &src_int8}},
      {"decoder/embeddings/weight", {&tgt, &tgt_int8}},
      {"decoder/projection/weight", {&proj, &proj_int8}},
      {"decoder/projection/bias", {bias ? &*bias : nullptr, nullptr}}};
  ModelConfig tables_only = c;  // the layers are not read yet: the walk lists none
  tables_only.encoder_layers = tables_only.decoder_layers = 0;
  for (const ParameterSpec& spec : parameter_specs(tables_only)) {
    if (spec.ctranslate2.empty()) continue;
    const auto source = sources.find(spec.ctranslate2.front());
    if (source == sources.end() || !source->second.values) continue;
    if (source->second.int8 == &proj_int8) proj_int8 = v.take_int8("decoder/projection/weight");
    p[spec.name] = std::move(*source->second.values);
    if (source->second.int8 && *source->second.int8)
      int8[spec.name] = std::move(**source->second.int8);
  }
  if (v.has("decoder/projection/weight_zero")) v.refuse("AWQ-quantised weights");
  const bool encoder_scale = read_embedding_scale(v, "encoder", c.d_model);
  const bool decoder_scale = read_embedding_scale(v, "decoder", c.d_model);
  if (encoder_scale != decoder_scale) v.refuse("embedding scaling in one stack only");
  c.scale_embeddings = encoder_scale;
}

// CTranslate2 adds `position_encodings/encodings` row t to position t when the table exists,
// else its own sinusoid (our "concat" layout, positions from 1). Tables that are a sinusoid of
// ours, or all zeros, become that setting again; others are learned positions.
void map_positions(SpecVariables& v, ModelConfig& c, TensorMap& p) {
  const std::string enc_name = "encoder/position_encodings/encodings",
                    dec_name = "decoder/position_encodings/encodings";
  if (!v.has(enc_name) && !v.has(dec_name)) {
    c.position_encoding = PositionEncoding::kSinusoidal;
    c.sinusoid_layout = SinusoidLayout::kConcat;
    c.position_offset = 1;
    if (c.d_model % 2 != 0 || c.d_model < 4)
      v.fail("CTranslate2's sinusoid needs an even d_model >= 4");
    return;
  }
  if (!v.has(enc_name) || !v.has(dec_name)) v.refuse("a position table in one stack only");
  auto tolerance = [&](const std::string& name) {
    return v.stored_dtype(name) == CtDtype::kBF16 ? 1e-2 : 2e-3;
  };
  const double enc_tolerance = tolerance(enc_name), dec_tolerance = tolerance(dec_name);
  Tensor enc = v.take(enc_name), dec = v.take(dec_name);
  for (const Tensor* t : {&enc, &dec})
    if (t->shape.size() != 2 || t->shape[1] != c.d_model || t->shape[0] < 1)
      v.fail("position tables must be [positions, d_model]");
  const int64_t rows = std::min(enc.shape[0], dec.shape[0]);
  auto all_zero = [](const Tensor& t) {
    return std::all_of(t.data.begin(), t.data.end(), [](float x) { return x == 0.f; });
  };
  if (all_zero(enc) && all_zero(dec)) {
    c.position_encoding = PositionEncoding::kNone;
    c.max_positions = rows;
    return;
  }
  SinusoidLayout enc_layout, dec_layout;
  int64_t enc_offset, dec_offset;
  if (match_sinusoid_table(enc, enc_tolerance, enc_layout, enc_offset) &&
      match_sinusoid_table(dec, dec_tolerance, dec_layout, dec_offset) &&
      enc_layout == dec_layout && enc_offset == dec_offset) {
    c.position_encoding = PositionEncoding::kSinusoidal;
    c.sinusoid_layout = enc_layout;
    c.position_offset = enc_offset;
    c.max_positions = rows + enc_offset;
    return;
  }
  c.position_encoding = PositionEncoding::kLearned;
  c.position_offset = 0;
  c.max_positions = rows;  // our one limit serves both stacks: the shorter table's
  for (Tensor* t : {&enc, &dec}) {
    t->shape[0] = rows;
    t->data.resize(size_t(rows * c.d_model));
  }
  p["encoder.pos_embed.weight"] = std::move(enc);
  p["decoder.pos_embed.weight"] = std::move(dec);
}

// Features of an attention, feed-forward or layer scope that we do not have.
void refuse_scope_features(SpecVariables& v, const std::string& scope, const ModelConfig& c) {
  auto present = [&](const char* name) {
    return v.has(scope + "/" + name) || v.has_scope(scope + "/" + name);
  };
  const std::pair<const char*, const char*> features[] = {
      {"relative_position_keys", "relative position representations"},
      {"relative_position_values", "relative position representations"},
      {"relative_attention_bias", "T5 relative attention biases"},
      {"relative_asymmetric_position_keys", "asymmetric relative positions"},
      {"rotary_dim", "rotary position embeddings"},
      {"q_norm", "query/key normalisation"},
      {"k_norm", "query/key normalisation"},
      {"v_norm", "value normalisation"},
      {"memory_kv", "merged encoder attention"},
      {"merged_encoder_attention", "merged encoder attention"},
      {"linear_0_noact", "a gated feed-forward (GLU)"},
      {"input_layer_norm", "extra layer norms around the sublayers"},
      {"post_attention_layer_norm", "extra layer norms around the sublayers"},
      {"pre_feedforward_layer_norm", "extra layer norms around the sublayers"},
      {"post_feedforward_layer_norm", "extra layer norms around the sublayers"},
      {"shared_layer_norm", "parallel residual blocks"},
      {"external_pre_encoder_attention_layer_norm", "external encoder-attention layer norms"},
      {"external_post_encoder_attention_layer_norm", "external encoder-attention layer norms"},
  };
  for (const auto& [name, feature] : features)
    if (present(name)) v.refuse(feature);
  if (v.take_scalar(scope + "/sliding_window", 0.0) != 0.0) v.refuse("sliding-window attention");
  if (v.has(scope + "/num_heads_kv") &&
      v.take_scalar(scope + "/num_heads_kv", 0.0) != double(c.heads))
    v.refuse("multi-query or grouped-query attention (num_heads_kv)");
  if (v.has(scope + "/head_dim") && v.take_scalar(scope + "/head_dim", 0.0) != double(c.head_dim()))
    v.refuse("a head size other than d_model / heads (head_dim)");
  if (v.has(scope + "/queries_scale")) {  // 1/sqrt(d_k) (the default) or 1 (unscaled dot)
    const double scale = v.take_scalar(scope + "/queries_scale", 0.0),
                 expected = c.attention == AttentionScoring::kDot
                                ? 1.0
                                : 1.0 / std::sqrt(double(c.head_dim()));
    if (std::fabs(scale - expected) > 1e-6 * expected)
      v.refuse(
          "a query scale other than 1/sqrt(d_k) or 1, or one that differs between "
          "attention layers (queries_scale)");
  }
  if (v.has(scope + "/layer_scalar") && v.take_scalar(scope + "/layer_scalar", 1.0) != 1.0)
    v.refuse("a scaled layer output (layer_scalar)");
  // Only read with rotary embeddings (refused above): accepted at any value when alone.
  v.take_scalar(scope + "/original_max_position_embeddings", 0.0);
  v.take_scalar(scope + "/max_position_embeddings", 0.0);
}

class LayerMapper {
 public:
  LayerMapper(SpecVariables& v, const ModelConfig& c, TensorMap& p, Int8WeightMap& int8)
      : v_(v), c_(c), p_(p), int8_(int8) {}

  void linear(const std::string& from, const std::vector<std::string>& to) {
    if (v_.has(from + "/weight_zero")) v_.refuse("AWQ-quantised weights");
    Tensor weight = v_.take(from + "/weight");
    const std::optional<Int8Matrix> stored = v_.take_int8(from + "/weight");
    const int64_t parts = int64_t(to.size());
    if (weight.shape.size() != 2 || weight.shape[0] % parts != 0)
      v_.fail("\"" + from + "/weight\" is not a matrix of " + std::to_string(parts) + " parts");
    const int64_t rows = weight.shape[0] / parts, cols = weight.shape[1];
    std::optional<Tensor> bias = v_.take_optional(from + "/bias");
    if (bias && bias->numel() != weight.shape[0])
      v_.fail("\"" + from + "/bias\" does not match its weight");
    for (int64_t i = 0; i < parts; ++i) {
      Tensor w({rows, cols}), b({rows});
      std::copy_n(weight.data.begin() + i * rows * cols, rows * cols, w.data.begin());
      if (bias) std::copy_n(bias->data.begin() + i * rows, rows, b.data.begin());
      p_[to[size_t(i)] + ".weight"] = std::move(w);
      p_[to[size_t(i)] + ".bias"] = std::move(b);  // absent bias: zeros
      if (!stored) continue;
      Int8Matrix& q = int8_[to[size_t(i)] + ".weight"];  // rows i·rows .. (i+1)·rows
      q.shape = {rows, cols};
      q.values.assign(stored->values.begin() + i * rows * cols,
                      stored->values.begin() + (i + 1) * rows * cols);
      q.scales.assign(stored->scales.begin() + i * rows, stored->scales.begin() + (i + 1) * rows);
    }
  }
  void norm(const std::string& from, const std::string& to) {
    if (!v_.has(from + "/beta") || v_.has(from + "/layer_norm_use_residual"))
      v_.refuse("RMS normalisation");
    p_[to + ".weight"] = v_.take(from + "/gamma");
    p_[to + ".bias"] = v_.take(from + "/beta");
  }

 private:
  SpecVariables& v_;
  const ModelConfig& c_;
  TensorMap& p_;
  Int8WeightMap& int8_;
};

// The layers' tensors read by walking the parameter tree (model/parameter_tree.h) with
// CTranslate2's names: every scope's features checked, every stacked linear split into ours.
// Embeddings and position tables are read before, where the config is found.
struct LayerReader : ParameterVisitor {
  SpecVariables& v;
  const ModelConfig& c;
  LayerMapper& map;

  void scope(const std::string& scope) { refuse_scope_features(v, scope, c); }
  void linears(const std::string& scope, const std::vector<LinearPart<const float>>& parts) {
    std::vector<std::string> names;
    for (const LinearPart<const float>& part : parts) names.push_back(part.name);
    map.linear(scope, names);
  }
  void norm(LayerNormParams<const float>&, const std::string& name, const std::string& scope) {
    map.norm(scope, name);
  }
};

void map_layers(SpecVariables& v, ModelConfig& c, TensorMap& p, Int8WeightMap& int8) {
  auto count_layers = [&](const std::string& stack) {
    int64_t n = 0;
    while (v.has_scope(stack + "/layer_" + std::to_string(n))) ++n;
    return n;
  };
  c.encoder_layers = count_layers("encoder");
  c.decoder_layers = count_layers("decoder");
  if (c.encoder_layers == 0 || c.decoder_layers == 0) v.fail("no encoder or decoder layers found");
  if (c.d_model % c.heads != 0)
    v.fail("d_model " + std::to_string(c.d_model) + " is not divisible by " +
           std::to_string(c.heads) + " heads");
  for (int64_t i = 0; i < c.decoder_layers; ++i)
    if (!v.has_scope("decoder/layer_" + std::to_string(i) + "/attention"))
      v.refuse("decoder layers without encoder attention");
  for (const char* stack : {"encoder", "decoder"}) {
    const bool has_final_norm = v.has_scope(std::string(stack) + "/layer_norm");
    if (c.norm == NormPosition::kPre && !has_final_norm)
      v.refuse("pre-norm without a final layer norm (no_final_norm)");
    if (c.norm == NormPosition::kPost && has_final_norm)
      v.refuse("a final layer norm after post-norm layers");
  }
  LayerMapper map(v, c, p, int8);
  LayerReader reader{{}, v, c, map};
  TransformerParams<const float> scratch;
  walk_parameters(c, scratch, reader);
  c.d_ff = p.at("encoder.layers.0.ffn.fc1.weight").shape[0];
}

// The special tokens and source conventions: config.json from binary version 6, variables
// before it (as CTranslate2's SequenceToSequenceModel::initialize reads them).
struct TokenSettings {
  std::string unk = "<unk>", bos = "<s>", eos = "</s>";
  std::optional<std::string> decoder_start = std::string("<s>");
  bool add_source_bos = false, add_source_eos = false;
  std::optional<double> layer_norm_epsilon;
};

TokenSettings read_token_settings(SpecVariables& v, const std::string& directory) {
  TokenSettings s;
  const std::string config_path = directory + "/config.json";
  nlohmann::json j = nlohmann::json::object();
  if (std::filesystem::exists(config_path)) {
    j = parse_json_strictly(read_file_bytes(config_path), config_path);
    if (!j.is_object()) throw Error(config_path + ": not a JSON object");
  }
  auto string_key = [&](const char* key, std::string& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_string()) throw Error(config_path + ": \"" + key + "\" is not a string");
    out = j[key].get<std::string>();
  };
  auto bool_key = [&](const char* key, bool& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_boolean()) throw Error(config_path + ": \"" + key + "\" is not a boolean");
    out = j[key].get<bool>();
  };
  if (j.contains("layer_norm_epsilon") && !j["layer_norm_epsilon"].is_null()) {
    if (!j["layer_norm_epsilon"].is_number())
      throw Error(config_path + ": \"layer_norm_epsilon\" is not a number");
    s.layer_norm_epsilon = j["layer_norm_epsilon"].get<double>();
  }
  if (j.contains("quantization_type") && j["quantization_type"] != 0)
    v.refuse("AWQ quantisation (quantization_type)");
  bool multi_query = false;
  bool_key("multi_query_attention", multi_query);
  if (multi_query) v.refuse("multi-query attention");
  if (v.file().version < 6) {
    s.unk = v.take_string("unk_token", "<unk>");
    s.bos = v.take_string("bos_token", "<s>");
    s.eos = v.take_string("eos_token", "</s>");
    s.add_source_bos = v.take_scalar("with_source_bos", 0.0) != 0.0;
    s.add_source_eos = v.take_scalar("with_source_eos", 0.0) != 0.0;
    const bool user_start = v.take_scalar("user_decoder_start_tokens", 0.0) != 0.0;
    const bool target_bos = v.take_scalar("with_target_bos", 1.0) != 0.0;
    if (user_start)
      s.decoder_start.reset();
    else
      s.decoder_start = target_bos ? s.bos : s.eos;
    return s;
  }
  string_key("unk_token", s.unk);
  string_key("bos_token", s.bos);
  string_key("eos_token", s.eos);
  bool_key("add_source_bos", s.add_source_bos);
  bool_key("add_source_eos", s.add_source_eos);
  if (j.contains("decoder_start_token")) {
    if (j["decoder_start_token"].is_null())
      s.decoder_start.reset();
    else
      string_key("decoder_start_token", *s.decoder_start);
  }
  return s;
}

// CTranslate2's Vocabulary: `<name>.json` (a list) or `<name>.txt` (one token per line, a
// trailing \r removed only when every line has one); the unknown token appended if missing.
std::optional<std::vector<std::string>> read_vocabulary(const std::string& directory,
                                                        const std::string& name,
                                                        const std::string& unk) {
  namespace fs = std::filesystem;
  const std::string json_path = directory + "/" + name + ".json",
                    txt_path = directory + "/" + name + ".txt";
  std::vector<std::string> tokens;
  if (fs::exists(json_path)) {
    const nlohmann::json j = parse_json_strictly(read_file_bytes(json_path), json_path);
    if (!j.is_array()) throw Error(json_path + ": not a JSON list of tokens");
    for (const auto& t : j) {
      if (!t.is_string()) throw Error(json_path + ": not a JSON list of tokens");
      tokens.push_back(t.get<std::string>());
    }
  } else if (fs::exists(txt_path)) {
    std::istringstream lines(read_file_bytes(txt_path));
    bool all_carriage_return = true;
    for (std::string line; std::getline(lines, line);) {
      all_carriage_return = all_carriage_return && !line.empty() && line.back() == '\r';
      tokens.push_back(line);
    }
    if (all_carriage_return)
      for (std::string& t : tokens) t.pop_back();
  } else {
    return std::nullopt;
  }
  if (std::find(tokens.begin(), tokens.end(), unk) == tokens.end()) tokens.push_back(unk);
  return tokens;
}

void read_vocabularies(SpecVariables& v, const std::string& directory, const TokenSettings& s,
                       ImportedModel& out) {
  if (auto shared = read_vocabulary(directory, "shared_vocabulary", s.unk)) {
    out.source_tokens = *shared;
    out.target_tokens = std::move(*shared);
  } else {
    auto target = read_vocabulary(directory, "target_vocabulary", s.unk);
    auto source = read_vocabulary(directory, "source_vocabulary", s.unk);
    if (!source && read_vocabulary(directory, "source_1_vocabulary", s.unk))
      v.refuse("several source vocabularies (source factors)");
    if (!source || !target)
      throw Error(directory +
                  ": no shared_vocabulary or source_vocabulary + target_vocabulary (.json/.txt)");
    out.source_tokens = std::move(*source);
    out.target_tokens = std::move(*target);
  }
  ModelConfig& c = out.config;
  if (int64_t(out.source_tokens.size()) != c.src_vocab_size ||
      int64_t(out.target_tokens.size()) != c.tgt_vocab_size)
    v.fail("vocabulary sizes (" + std::to_string(out.source_tokens.size()) + ", " +
           std::to_string(out.target_tokens.size()) + ") do not match the embeddings (" +
           std::to_string(c.src_vocab_size) + ", " + std::to_string(c.tgt_vocab_size) + ")");
  auto id_of = [&](const std::vector<std::string>& tokens, const std::string& token,
                   const char* side) {
    auto it = std::find(tokens.begin(), tokens.end(), token);
    if (it == tokens.end())
      throw Error(directory + ": the " + side + " vocabulary has no " + quoted_for_message(token));
    return int64_t(it - tokens.begin());
  };
  if (s.add_source_bos) v.refuse("a start token prepended to the source (add_source_bos)");
  if (!s.decoder_start)
    v.refuse("decoder start tokens supplied by the caller (decoder_start_token null)");
  c.eos_id = id_of(out.target_tokens, s.eos, "target");
  c.bos_id = id_of(out.target_tokens, *s.decoder_start, "target");
  c.src_append_eos = s.add_source_eos;
  if (s.add_source_eos && id_of(out.source_tokens, s.eos, "source") != c.eos_id)
    v.refuse("an end token whose id differs between the source and target vocabularies");
  c.pad_id = 0;  // CTranslate2 has no padding token; ours only fills padded rows
  for (const char* pad : {"<blank>", "<pad>"}) {
    auto it = std::find(out.target_tokens.begin(), out.target_tokens.end(), pad);
    if (it != out.target_tokens.end()) {
      c.pad_id = int64_t(it - out.target_tokens.begin());
      break;
    }
  }
}

}  // namespace

bool match_sinusoid_table(const Tensor& table, double tolerance, SinusoidLayout& layout,
                          int64_t& offset) {
  if (table.shape.size() != 2 || table.shape[0] < 1) return false;
  const int64_t rows = table.shape[0], d = table.shape[1];
  ModelConfig probe;
  probe.d_model = d;
  auto matches = [&](int64_t first_row_to_check, int64_t rows_to_check, int64_t candidate) {
    std::vector<float> reference(size_t((candidate + first_row_to_check + rows_to_check) * d));
    probe.max_positions = candidate + first_row_to_check + rows_to_check;
    fill_sinusoid_table(probe, reference.data());
    for (int64_t r = first_row_to_check; r < first_row_to_check + rows_to_check; ++r)
      for (int64_t k = 0; k < d; ++k)
        if (std::fabs(double(table.data[size_t(r * d + k)]) -
                      double(reference[size_t((candidate + r) * d + k)])) > tolerance)
          return false;
    return true;
  };
  for (SinusoidLayout candidate_layout : {SinusoidLayout::kInterleaved, SinusoidLayout::kConcat}) {
    if (candidate_layout == SinusoidLayout::kConcat && (d % 2 != 0 || d < 4)) continue;
    probe.sinusoid_layout = candidate_layout;
    for (int64_t candidate = 0; candidate <= 16; ++candidate) {
      // Two rows first (cheap), then the whole table.
      if (!matches(0, std::min<int64_t>(rows, 2), candidate)) continue;
      if (!matches(0, rows, candidate)) continue;
      layout = candidate_layout;
      offset = candidate;
      return true;
    }
  }
  return false;
}

ImportedModel import_ctranslate2(const std::string& directory) {
  const std::string model_path = directory + "/model.bin";
  SpecVariables v(parse_ctranslate2_model(read_file_bytes(model_path), model_path), model_path);
  const std::string& spec = v.file().spec_name;
  if (spec != "" && spec != "TransformerBase" && spec != "TransformerBig" &&
      spec != "TransformerSpec")
    v.fail("spec " + quoted_for_message(spec) +
           " is not a Transformer encoder-decoder (TransformerSpec)");
  if (v.file().spec_revision > 7)
    v.fail("spec revision " + std::to_string(v.file().spec_revision) +
           " is newer than this importer knows (1-7)");
  apply_legacy_layout(v);
  ImportedModel out;
  ModelConfig& c = out.config;
  read_architecture(v, c);
  map_embeddings(v, c, out.parameters, out.int8_parameters);
  map_positions(v, c, out.parameters);
  map_layers(v, c, out.parameters, out.int8_parameters);
  const TokenSettings tokens = read_token_settings(v, directory);
  // CTranslate2's LayerNorm: config.json's layer_norm_epsilon, else 1e-5.
  c.layer_norm_eps = tokens.layer_norm_epsilon.value_or(1e-5);
  const std::vector<std::string> left = v.names();
  if (!left.empty())
    v.fail("unsupported variable " + quoted_for_message(left.front()) +
           " (a model feature this importer does not know)");
  read_vocabularies(v, directory, tokens, out);
  validate_config(c, model_path);
  return out;
}

}  // namespace tfm
