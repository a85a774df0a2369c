// ConfigOptions: the flags of a ConfigChoice.
#include "cli/config_options.h"

#include "cli/option_ranges.h"

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

}  // namespace tfm
