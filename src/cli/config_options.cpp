// ConfigOptions: preset or JSON config file, then vocabulary and sharing overrides.
#include "cli/config_options.h"

#include <nlohmann/json.hpp>

#include "cli/option_ranges.h"
#include "io/file_util.h"
#include "tensor/error.h"
#include "tensor/strict_json.h"

namespace tfm {

void ConfigOptions::add_to(CLI::App& app) {
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : "|") + n;
  app.add_option("--preset", preset,
                 "Model preset: base/big are the paper's Table 3 models (N=6, d_model 512/1024, "
                 "d_ff 2048/4096, h 8/16); small (3+3 layers, d_model 256) and tiny (2+2, d_model "
                 "64) are for CPUs and tests")
      ->check(CLI::IsMember(preset_names()));
  app.add_option(
      "--config", config_path,
      "JSON file with model config keys (docs/model-file.md); absent keys take their defaults");
  app.add_option("--vocab", vocab, "Shared vocabulary size (source = target)")->check(at_least(1));
  app.add_option("--src-vocab", src_vocab, "Source vocabulary size")->check(at_least(1));
  app.add_option("--tgt-vocab", tgt_vocab, "Target vocabulary size")->check(at_least(1));
  app.add_option("--share", share,
                 "Embedding sharing: all (one matrix for source, target and pre-softmax, the "
                 "paper's choice; default when sizes match), target (target embedding = "
                 "pre-softmax; default when sizes differ) or none")
      ->check(CLI::IsMember({"all", "target", "none"}));
}

ModelConfig ConfigOptions::resolve() const {
  if (preset.empty() == config_path.empty())
    throw UsageError("give exactly one of --preset or --config");
  ModelConfig c;
  nlohmann::json overrides = nlohmann::json::object();
  if (!preset.empty()) {
    c = preset_config(preset);
  } else {
    nlohmann::json j = parse_json_strictly(read_file_bytes(config_path), config_path);
    if (!j.is_object()) throw Error(config_path + ": not a JSON object");
    overrides = j;
  }
  const bool has_src = src_vocab > 0 || vocab > 0 || overrides.contains("src_vocab_size");
  const bool has_tgt = tgt_vocab > 0 || vocab > 0 || overrides.contains("tgt_vocab_size");
  if (!has_src || !has_tgt)
    throw UsageError(
        "the vocabulary size is needed: --vocab N (shared) or --src-vocab N --tgt-vocab M");
  nlohmann::json j = config_to_json(c);
  for (auto it = overrides.begin(); it != overrides.end(); ++it) j[it.key()] = it.value();
  if (vocab > 0) j["src_vocab_size"] = j["tgt_vocab_size"] = vocab;
  if (src_vocab > 0) j["src_vocab_size"] = src_vocab;
  if (tgt_vocab > 0) j["tgt_vocab_size"] = tgt_vocab;
  if (!share.empty()) {
    j["share_embeddings"] = share;
  } else if (!overrides.contains("share_embeddings") &&
             j["src_vocab_size"] != j["tgt_vocab_size"]) {
    j["share_embeddings"] = "target";
  }
  return config_from_json(j, preset.empty() ? config_path : "preset " + preset);
}

}  // namespace tfm
