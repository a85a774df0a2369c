// `transformer init`: a randomly initialised model file, for tests, benchmarks and as a
// starting point.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/config_options.h"
#include "cli/output_overwrite.h"
#include "io/model_file.h"
#include "model/init.h"
#include "tensor/error.h"

namespace tfm {

CommandRunner add_init_command(CLI::App& app) {
  struct Options {
    ConfigOptions config;
    uint64_t seed = 1;
    std::string output;
    bool force = false;
  };
  auto options = std::make_shared<Options>();
  options->config.add_to(app);
  app.add_option("--seed", options->seed, "Random seed (same seed, same model on every machine)");
  app.add_option("-o,--output", options->output, "Model file to write (.safetensors)")->required();
  add_force_flag(app, options->force, "file");
  app.footer(
      "Example:\n  transformer init --preset tiny --src-vocab 1000 --tgt-vocab 1000 --seed 7 -o "
      "model.safetensors");
  return [options] {
    refuse_existing_output(options->output, OutputKind::kFile, options->force);
    const ModelConfig config = options->config.resolve();
    Model model = init_model(config, options->seed, cpu_backend());
    save_model(model, options->output);
    std::printf("wrote %s: %lld parameters\n", options->output.c_str(),
                (long long)parameter_count(config));
  };
}

}  // namespace tfm
