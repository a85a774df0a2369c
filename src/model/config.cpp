// ModelConfig <-> JSON, validation, presets and the parameter list.
#include "model/config.h"

#include <nlohmann/json.hpp>
#include <set>

#include "tensor/error.h"
#include "tensor/strict_json.h"

namespace tfm {

namespace {

const std::string kFormat =
    std::string(kModelFormatName) + "/" + std::to_string(kModelFormatVersion);

// Checks a file's "format" tag: one of ours, at a version this build reads.
void check_format(const nlohmann::json& tag, const std::string& where) {
  const std::string prefix = std::string(kModelFormatName) + "/";
  const std::string text = tag.is_string() ? tag.get<std::string>() : std::string();
  if (text.rfind(prefix, 0) == 0 && text.size() > prefix.size() &&
      text.size() <= prefix.size() + 9 &&
      text.find_first_not_of("0123456789", prefix.size()) == std::string::npos &&
      text[prefix.size()] != '0') {
    const long version = std::stol(text.substr(prefix.size()));
    if (version <= kModelFormatVersion) return;
    throw Error(where + ": model format " + text + " is newer than this build reads (up to " +
                kFormat + "); use a newer transformer-cpp");
  }
  throw Error(where + ": unsupported model format " + tag.dump() + " (expected \"" + kFormat +
              "\")");
}

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

const EnumName<EmbeddingSharing> kSharingNames[] = {{EmbeddingSharing::kAll, "all"},
                                                    {EmbeddingSharing::kTarget, "target"},
                                                    {EmbeddingSharing::kNone, "none"}};
const EnumName<NormPosition> kNormNames[] = {{NormPosition::kPost, "post"},
                                             {NormPosition::kPre, "pre"}};
const EnumName<Activation> kActivationNames[] = {{Activation::kRelu, "relu"},
                                                 {Activation::kGelu, "gelu"}};
const EnumName<PositionEncoding> kPositionNames[] = {{PositionEncoding::kSinusoidal, "sinusoidal"},
                                                     {PositionEncoding::kLearned, "learned"},
                                                     {PositionEncoding::kNone, "none"}};
const EnumName<SinusoidLayout> kLayoutNames[] = {{SinusoidLayout::kInterleaved, "interleaved"},
                                                 {SinusoidLayout::kConcat, "concat"}};
const EnumName<AttentionScoring> kAttentionNames[] = {{AttentionScoring::kScaledDot, "scaled_dot"},
                                                      {AttentionScoring::kDot, "dot"},
                                                      {AttentionScoring::kAdditive, "additive"}};

template <typename Enum, size_t N>
const char* enum_to_name(const EnumName<Enum> (&names)[N], Enum value) {
  for (const auto& entry : names)
    if (entry.value == value) return entry.name;
  return "?";
}

template <typename Enum, size_t N>
Enum enum_from_json(const EnumName<Enum> (&names)[N], const nlohmann::json& j, const char* key,
                    const std::string& where) {
  if (!j.is_string()) throw Error(where + ": config key \"" + key + "\" must be a string");
  const std::string value = j.get<std::string>();
  std::string allowed;
  for (const auto& entry : names) {
    if (value == entry.name) return entry.value;
    allowed += std::string(allowed.empty() ? "" : ", ") + "\"" + entry.name + "\"";
  }
  throw Error(where + ": unknown value " + quoted_for_message(value) + " for config key \"" + key +
              "\" (expected one of " + allowed + ")");
}

int64_t int_from_json(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_number_integer())
    throw Error(where + ": config key \"" + key + "\" must be an integer");
  return j.get<int64_t>();
}

bool bool_from_json(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_boolean()) throw Error(where + ": config key \"" + key + "\" must be true or false");
  return j.get<bool>();
}

}  // namespace

ModelConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": model config must be a JSON object");
  static const std::set<std::string> known = {"format",
                                              "d_model",
                                              "heads",
                                              "d_ff",
                                              "encoder_layers",
                                              "decoder_layers",
                                              "src_vocab_size",
                                              "tgt_vocab_size",
                                              "share_embeddings",
                                              "output_bias",
                                              "norm",
                                              "activation",
                                              "layer_norm_eps",
                                              "scale_embeddings",
                                              "position_encoding",
                                              "sinusoid_layout",
                                              "position_offset",
                                              "max_positions",
                                              "self_attention_window",
                                              "attention",
                                              "pad_id",
                                              "bos_id",
                                              "eos_id",
                                              "src_append_eos"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key()))
      throw Error(where + ": unknown config key " + quoted_for_message(it.key()));

  ModelConfig c;
  if (j.contains("format")) check_format(j["format"], where);
  auto read_int = [&](const char* key, int64_t& field) {
    if (j.contains(key)) field = int_from_json(j[key], key, where);
  };
  auto read_bool = [&](const char* key, bool& field) {
    if (j.contains(key)) field = bool_from_json(j[key], key, where);
  };
  read_int("d_model", c.d_model);
  read_int("heads", c.heads);
  read_int("d_ff", c.d_ff);
  read_int("encoder_layers", c.encoder_layers);
  read_int("decoder_layers", c.decoder_layers);
  read_int("src_vocab_size", c.src_vocab_size);
  read_int("tgt_vocab_size", c.tgt_vocab_size);
  read_int("position_offset", c.position_offset);
  read_int("max_positions", c.max_positions);
  read_int("pad_id", c.pad_id);
  read_int("bos_id", c.bos_id);
  read_int("eos_id", c.eos_id);
  read_bool("output_bias", c.output_bias);
  read_bool("scale_embeddings", c.scale_embeddings);
  read_bool("src_append_eos", c.src_append_eos);
  if (j.contains("share_embeddings"))
    c.share_embeddings =
        enum_from_json(kSharingNames, j["share_embeddings"], "share_embeddings", where);
  if (j.contains("norm")) c.norm = enum_from_json(kNormNames, j["norm"], "norm", where);
  if (j.contains("activation"))
    c.activation = enum_from_json(kActivationNames, j["activation"], "activation", where);
  if (j.contains("position_encoding"))
    c.position_encoding =
        enum_from_json(kPositionNames, j["position_encoding"], "position_encoding", where);
  if (j.contains("sinusoid_layout"))
    c.sinusoid_layout =
        enum_from_json(kLayoutNames, j["sinusoid_layout"], "sinusoid_layout", where);
  if (j.contains("layer_norm_eps")) {
    if (!j["layer_norm_eps"].is_number())
      throw Error(where + ": config key \"layer_norm_eps\" must be a number");
    c.layer_norm_eps = j["layer_norm_eps"].get<double>();
  }
  if (j.contains("attention"))
    c.attention = enum_from_json(kAttentionNames, j["attention"], "attention", where);
  if (j.contains("self_attention_window") && !j["self_attention_window"].is_null())
    c.self_attention_window =
        int_from_json(j["self_attention_window"], "self_attention_window", where);
  validate_config(c, where);
  return c;
}

ModelConfig config_from_json_text(const std::string& text, const std::string& where) {
  return config_from_json(parse_json_strictly(text, where + ": model config"), where);
}

nlohmann::json config_to_json(const ModelConfig& c) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["d_model"] = c.d_model;
  j["heads"] = c.heads;
  j["d_ff"] = c.d_ff;
  j["encoder_layers"] = c.encoder_layers;
  j["decoder_layers"] = c.decoder_layers;
  j["src_vocab_size"] = c.src_vocab_size;
  j["tgt_vocab_size"] = c.tgt_vocab_size;
  j["share_embeddings"] = enum_to_name(kSharingNames, c.share_embeddings);
  j["output_bias"] = c.output_bias;
  j["norm"] = enum_to_name(kNormNames, c.norm);
  j["activation"] = enum_to_name(kActivationNames, c.activation);
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["scale_embeddings"] = c.scale_embeddings;
  j["position_encoding"] = enum_to_name(kPositionNames, c.position_encoding);
  j["sinusoid_layout"] = enum_to_name(kLayoutNames, c.sinusoid_layout);
  j["position_offset"] = c.position_offset;
  j["max_positions"] = c.max_positions;
  j["self_attention_window"] = c.self_attention_window < 0
                                   ? nlohmann::json(nullptr)
                                   : nlohmann::json(c.self_attention_window);
  j["attention"] = enum_to_name(kAttentionNames, c.attention);
  j["pad_id"] = c.pad_id;
  j["bos_id"] = c.bos_id;
  j["eos_id"] = c.eos_id;
  j["src_append_eos"] = c.src_append_eos;
  return j;
}

std::string config_to_json_text(const ModelConfig& c) {
  return config_to_json(c).dump();
}

void validate_config(const ModelConfig& c, const std::string& where) {
  auto fail = [&](const std::string& message) { throw Error(where + ": " + message); };
  // Upper bounds keep every size product far from int64 overflow and reject absurd files
  // before anything is allocated.
  auto check_range = [&](const char* key, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi)
      fail(std::string("config \"") + key + "\" = " + std::to_string(value) + " is out of range [" +
           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  check_range("d_model", c.d_model, 1, 65536);
  check_range("heads", c.heads, 1, 1024);
  check_range("d_ff", c.d_ff, 1, 262144);
  check_range("encoder_layers", c.encoder_layers, 1, 256);
  check_range("decoder_layers", c.decoder_layers, 1, 256);
  check_range("src_vocab_size", c.src_vocab_size, 1, 1 << 24);
  check_range("tgt_vocab_size", c.tgt_vocab_size, 1, 1 << 24);
  check_range("max_positions", c.max_positions, 1, 1 << 20);
  check_range("position_offset", c.position_offset, 0, 1 << 20);
  check_range("self_attention_window", c.self_attention_window, -1, 1 << 20);
  if (sequence_positions(c) < 2)
    fail("max_positions " + std::to_string(c.max_positions) + " less position_offset " +
         std::to_string(c.position_offset) + " leaves fewer than the 2 positions a sequence needs");
  if (c.d_model % c.heads != 0)
    fail("d_model " + std::to_string(c.d_model) + " is not divisible by heads " +
         std::to_string(c.heads));
  if (!(c.layer_norm_eps > 0.f) || !std::isfinite(c.layer_norm_eps))
    fail("layer_norm_eps must be a positive number");
  if (c.share_embeddings == EmbeddingSharing::kAll && c.src_vocab_size != c.tgt_vocab_size)
    fail("share_embeddings \"all\" needs src_vocab_size == tgt_vocab_size (got " +
         std::to_string(c.src_vocab_size) + " and " + std::to_string(c.tgt_vocab_size) + ")");
  if (c.position_encoding == PositionEncoding::kSinusoidal &&
      c.sinusoid_layout == SinusoidLayout::kConcat && (c.d_model % 2 != 0 || c.d_model < 4))
    fail("the \"concat\" sinusoid layout needs an even d_model >= 4");
  const int64_t smallest_vocab = std::min(c.src_vocab_size, c.tgt_vocab_size);
  for (auto [key, id] : {std::pair{"pad_id", c.pad_id}, {"bos_id", c.bos_id}, {"eos_id", c.eos_id}})
    if (id < 0 || id >= smallest_vocab)
      fail(std::string("config \"") + key + "\" = " + std::to_string(id) +
           " is outside the vocabulary");
}

std::vector<std::string> preset_names() {
  return {"tiny", "small", "base", "big"};
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;  // defaults are the paper's base model
  if (name == "base") return c;
  if (name == "big") {
    c.d_model = 1024;
    c.heads = 16;
    c.d_ff = 4096;
    return c;
  }
  if (name == "small") {  // a CPU model that trains on a real corpus in hours
    c.d_model = 256;
    c.heads = 4;
    c.d_ff = 1024;
    c.encoder_layers = 3;
    c.decoder_layers = 3;
    return c;
  }
  if (name == "tiny") {  // tests and toy tasks (copy, reversal) in minutes
    c.d_model = 64;
    c.heads = 4;
    c.d_ff = 256;
    c.encoder_layers = 2;
    c.decoder_layers = 2;
    return c;
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown preset \"" + name + "\" (expected one of " + names + ")");
}

int64_t parameter_count(const ModelConfig& c) {
  int64_t total = 0;
  for (const auto& spec : parameter_specs(c)) total += Tensor::numel_of(spec.shape);
  return total;
}

}  // namespace tfm
