// The flags that choose a model configuration (--preset / --config plus vocabulary sizes and
// embedding sharing), shared by `info`, `init` and `train`; the library resolves them
// (api/model_config.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "api/model_config.h"

namespace tfm {

struct ConfigOptions : ConfigChoice {
  void add_to(CLI::App& app);
  ModelConfig resolve() const { return resolve_config(*this); }
};

}  // namespace tfm
