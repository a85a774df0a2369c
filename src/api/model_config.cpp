// resolve_config: preset or JSON config file, then vocabulary and sharing overrides.
#include "api/model_config.h"

#include <nlohmann/json.hpp>

#include "tensor/file_util.h"
#include "tensor/error.h"
#include "tensor/strict_json.h"

namespace tfm {

ModelConfig resolve_config(const ConfigChoice& choice) {
  if (choice.preset.empty() == choice.config_path.empty())
    throw UsageError("give exactly one of --preset or --config");
  ModelConfig c;
  nlohmann::json overrides = nlohmann::json::object();
  if (!choice.preset.empty()) {
    c = preset_config(choice.preset);
  } else {
    nlohmann::json j = parse_json_strictly(read_file_bytes(choice.config_path), choice.config_path);
    if (!j.is_object()) throw Error(choice.config_path + ": not a JSON object");
    overrides = j;
  }
  const bool has_src =
      choice.src_vocab > 0 || choice.vocab > 0 || overrides.contains("src_vocab_size");
  const bool has_tgt =
      choice.tgt_vocab > 0 || choice.vocab > 0 || overrides.contains("tgt_vocab_size");
  if (!has_src || !has_tgt)
    throw UsageError(
        "the vocabulary size is needed: --vocab N (shared) or --src-vocab N --tgt-vocab M (vocab, "
        "or src_vocab and tgt_vocab, from code)");
  nlohmann::json j = config_to_json(c);
  for (auto it = overrides.begin(); it != overrides.end(); ++it) j[it.key()] = it.value();
  if (choice.vocab > 0) j["src_vocab_size"] = j["tgt_vocab_size"] = choice.vocab;
  if (choice.src_vocab > 0) j["src_vocab_size"] = choice.src_vocab;
  if (choice.tgt_vocab > 0) j["tgt_vocab_size"] = choice.tgt_vocab;
  if (!choice.share.empty()) {
    j["share_embeddings"] = choice.share;
  } else if (!overrides.contains("share_embeddings") &&
             j["src_vocab_size"] != j["tgt_vocab_size"]) {
    j["share_embeddings"] = "target";
  }
  return config_from_json(j,
                          choice.preset.empty() ? choice.config_path : "preset " + choice.preset);
}

}  // namespace tfm
