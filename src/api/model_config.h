// A model configuration as a user names it — a preset or a JSON config file, with vocabulary
// sizes and embedding sharing on top — resolved into a ModelConfig. The command line's
// --preset / --config / --vocab flags, `train` and the Python module's train() all go through
// this one rule.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace tfm {

struct ConfigChoice {
  std::string preset;       // tiny, small, base, big (preset_names()); or:
  std::string config_path;  // a JSON file of config keys (docs/model-file.md)
  int64_t vocab = 0;        // one size for source and target; 0: not given
  int64_t src_vocab = 0, tgt_vocab = 0;
  std::string share;  // all, target or none; "": all when the sizes match, else target

  bool given() const { return !preset.empty() || !config_path.empty(); }
};

// Throws UsageError when neither or both of preset and config_path are given, or no vocabulary
// size is known; Error for an unreadable or invalid config.
ModelConfig resolve_config(const ConfigChoice& choice);

}  // namespace tfm
