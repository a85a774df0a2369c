// The model's hyper-parameters (docs/model-file.md), their JSON form stored in every model file,
// validation with clear errors, the presets of the paper's Table 3 and small CPU presets, and
// the list of parameter tensors (names and shapes) a configuration implies.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/operation_types.h"
#include "tensor/tensor.h"

namespace tfm {

// The format tag every model file's config carries: "transformer-cpp/<version>". The version
// rises when a file written now could be misread by an older build; a build reads every version
// up to its own and refuses a newer one by name.
inline constexpr const char* kModelFormatName = "transformer-cpp";
inline constexpr int kModelFormatVersion = 1;

enum class EmbeddingSharing { kAll, kTarget, kNone };
enum class NormPosition { kPost, kPre };
enum class PositionEncoding { kSinusoidal, kLearned, kNone };
enum class SinusoidLayout { kInterleaved, kConcat };

struct ModelConfig {
  int64_t d_model = 512;
  int64_t heads = 8;
  int64_t d_ff = 2048;
  int64_t encoder_layers = 6;
  int64_t decoder_layers = 6;
  int64_t src_vocab_size = 0;
  int64_t tgt_vocab_size = 0;
  EmbeddingSharing share_embeddings = EmbeddingSharing::kAll;
  bool output_bias = false;
  NormPosition norm = NormPosition::kPost;
  Activation activation = Activation::kRelu;
  double layer_norm_eps = 1e-5;
  bool scale_embeddings = true;
  PositionEncoding position_encoding = PositionEncoding::kSinusoidal;
  SinusoidLayout sinusoid_layout = SinusoidLayout::kInterleaved;
  int64_t position_offset = 0;
  int64_t max_positions = 1024;
  int64_t self_attention_window = -1;                         // -1: null (full attention)
  AttentionScoring attention = AttentionScoring::kScaledDot;  // every attention's logits
  int64_t pad_id = 0;
  int64_t bos_id = 1;
  int64_t eos_id = 2;
  bool src_append_eos = true;

  int64_t head_dim() const { return d_model / heads; }
};

// The positions one sequence may occupy: the rows of the position table past position_offset.
// Every length limit derives from this one.
inline int64_t sequence_positions(const ModelConfig& c) {
  return c.max_positions - c.position_offset;
}
// The most source tokens a sentence may have (without the eos the encoder appends itself).
inline int64_t max_source_tokens(const ModelConfig& c) {
  return sequence_positions(c) - (c.src_append_eos ? 1 : 0);
}
// The most target tokens (the decoder reads bos + target; eos is only a label).
inline int64_t max_target_tokens(const ModelConfig& c) {
  return sequence_positions(c) - 1;
}

// Reads a config object, applying defaults for absent keys; throws Error on unknown keys,
// unknown values or inconsistent sizes. `where` names the source in messages.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);
ModelConfig config_from_json_text(const std::string& text, const std::string& where);
nlohmann::json config_to_json(const ModelConfig& c);
std::string config_to_json_text(const ModelConfig& c);

// Throws Error describing the first problem found.
void validate_config(const ModelConfig& c, const std::string& where);

// "tiny", "small", "base", "big"; vocabulary sizes are left 0 for the caller to set.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

// What a parameter tensor is to the model.
enum class ParameterRole {
  kTokenEmbedding,     // [vocabulary, d_model]; may also be the output projection
  kPositionEmbedding,  // a learned position table [max_positions, d_model]
  kLinearWeight,       // [out, in]
  kLinearBias,         // [out]
  kNormScale,          // a layer norm's gain [d_model] (CTranslate2's gamma)
  kNormShift,          // its bias [d_model] (beta)
  kAdditiveV,          // additive attention's per-head vectors [heads, d_k]
};

struct ParameterSpec {
  std::string name;
  Shape shape;
  ParameterRole role = ParameterRole::kLinearWeight;
  // The CTranslate2 variables it is written as (a shared embedding is several), and the row
  // where it starts in them: CTranslate2 stacks Q|K|V (and K|V) into one variable. Empty for
  // the tensors CTranslate2 has no variable of its own for.
  std::vector<std::string> ctranslate2;
  int64_t ctranslate2_row = 0;
};

// Every parameter tensor of the model, in a fixed order (the walk of model/parameter_tree.h).
std::vector<ParameterSpec> parameter_specs(const ModelConfig& c);
// The role of each of them, by name.
std::map<std::string, ParameterRole> parameter_roles(const ModelConfig& c);
// Whether a model file or a model may hold a parameter of this role in int8 (rows of int8 and a
// scale per row): the matrices of the products (linear weights) and the token embeddings.
inline bool int8_may_hold(ParameterRole role) {
  return role == ParameterRole::kLinearWeight || role == ParameterRole::kTokenEmbedding;
}
int64_t parameter_count(const ModelConfig& c);

}  // namespace tfm
