// `transformer info`: what a model or preset is, how many parameters it has (exactly) and how
// much memory it needs to run and to train.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/config_options.h"
#include "text/model_directory.h"

namespace tfm {

namespace {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_info(const ModelConfig& c) {
  std::printf("config:\n");
  const nlohmann::json j = config_to_json(c);
  for (auto it = j.begin(); it != j.end(); ++it)
    std::printf("  %-22s %s\n", it.key().c_str(), it.value().dump().c_str());
  int64_t embeddings = 0, encoder = 0, decoder = 0;
  for (const auto& spec : parameter_specs(c)) {
    const int64_t n = Tensor::numel_of(spec.shape);
    if (spec.name.rfind("encoder.", 0) == 0)
      encoder += n;
    else if (spec.name.rfind("decoder.", 0) == 0)
      decoder += n;
    else
      embeddings += n;
  }
  const int64_t total = embeddings + encoder + decoder;
  std::printf("parameters: %s (%.1fM)\n", with_commas(total).c_str(), double(total) / 1e6);
  std::printf("  embeddings + output: %s\n  encoder: %s\n  decoder: %s\n",
              with_commas(embeddings).c_str(), with_commas(encoder).c_str(),
              with_commas(decoder).c_str());
  const double mib = 1024.0 * 1024.0;
  // Activations of one 4096-token batch in inference: a few [tokens, d_model] buffers, the
  // FFN hidden layer, and attention weights for 64-token sentences.
  const double tokens = 4096, sentence = 64;
  const double activations = 4.0 * (tokens * double(c.d_model) * 6 + tokens * double(c.d_ff) +
                                    tokens * sentence * double(c.heads));
  std::printf("memory (fp32):\n");
  std::printf("  weights:                                %10.1f MiB\n", 4.0 * double(total) / mib);
  std::printf("  inference, + activations of 4096 tokens: %9.1f MiB\n",
              (4.0 * double(total) + activations) / mib);
  std::printf("  training, weights + gradients + Adam:   %10.1f MiB (plus activations)\n",
              16.0 * double(total) / mib);
}

}  // namespace

CommandRunner add_info_command(CLI::App& app) {
  auto options = std::make_shared<ConfigOptions>();
  auto model_path = std::make_shared<std::string>();
  options->add_to(app);
  app.add_option("--model", *model_path, "A model directory or .safetensors file to describe");
  app.footer(
      "Examples:\n  transformer info --preset base --vocab 37000\n  transformer info --model "
      "model_dir");
  return [options, model_path] {
    if (!model_path->empty()) {
      ModelBundle bundle = load_model_bundle(*model_path, false);
      print_info(bundle.model.config());
    } else {
      print_info(options->resolve());
    }
  };
}

}  // namespace tfm
