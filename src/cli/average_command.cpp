// `transformer average`: the element-wise mean of several checkpoints' parameters (the paper
// averaged the last 5 checkpoints of base models, the last 20 of big ones).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "cli/output_overwrite.h"
#include "io/model_file.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "train/checkpoint.h"

namespace tfm {

CommandRunner add_average_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> models;
    std::string model_dir;
    int64_t last = 5;
    std::string output;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("MODELS", o->models, "Model files to average");
  app.add_option("--model-dir", o->model_dir,
                 "Average the newest --last snapshots in DIR/checkpoints (written by train)");
  app.add_option("--last", o->last, with_default("How many snapshots with --model-dir", o->last))
      ->check(at_least(1));
  app.add_option("-o,--output", o->output, "Model file to write")->required();
  add_force_flag(app, o->force, "file");
  app.footer(
      "Examples:\n  transformer average --model-dir run --last 5 -o run/model.avg.safetensors\n"
      "  transformer average a.safetensors b.safetensors -o avg.safetensors");
  return [o] {
    std::vector<std::string> files = o->models;
    if (!o->model_dir.empty()) {
      if (!files.empty()) throw UsageError("give model files or --model-dir, not both");
      const auto snapshots = list_snapshots(o->model_dir);
      if (snapshots.empty()) throw Error(o->model_dir + ": no snapshots in checkpoints/");
      files.assign(snapshots.end() - std::min<int64_t>(o->last, int64_t(snapshots.size())),
                   snapshots.end());
    }
    if (files.empty()) throw UsageError("nothing to average: give model files or --model-dir");
    refuse_existing_output(o->output, OutputKind::kFile, o->force);
    // Σ x / n, each term scaled before it is added: a sum of large finite weights could
    // overflow to infinity where their mean does not.
    const float inv = 1.f / float(files.size());
    TensorMap sum;
    std::optional<ModelConfig> config;
    std::vector<float> add;  // a tensor being added, copied where the host cannot read it
    for (const auto& path : files) {
      Model m = load_model(path, cpu_backend());  // averaged on the host
      if (!config) {
        config = m.config();
        sum = m.parameters().to_host();
        for (auto& [name, t] : sum)
          for (float& x : t.data) x *= inv;
        continue;
      }
      if (config_to_json(*config) != config_to_json(m.config()))
        throw Error(path + ": its config differs from " + files.front() + "'s");
      for (auto& [name, t] : sum) {
        const float* values =
            host_readable(m.backend(), m.parameters().at(name).ptr(), int64_t(t.data.size()), add);
        for (size_t i = 0; i < t.data.size(); ++i) t.data[i] += values[i] * inv;
      }
    }
    save_model(Model(*config, std::move(sum), "average", cpu_backend()), o->output);
    std::printf("wrote %s: average of %zu models\n", o->output.c_str(), files.size());
  };
}

}  // namespace tfm
