// The flags that choose a model configuration (--preset / --config plus vocabulary sizes and
// embedding sharing), shared by `info` and `init` (and later `train`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "model/config.h"

namespace tfm {

struct ConfigOptions {
  std::string preset;
  std::string config_path;
  int64_t vocab = 0;
  int64_t src_vocab = 0;
  int64_t tgt_vocab = 0;
  std::string share;

  void add_to(CLI::App& app);
  // Throws Error when neither a preset nor a config is given or sizes are missing.
  ModelConfig resolve() const;
};

}  // namespace tfm
