// `transformer info`: what a model or preset is, how many parameters it has (exactly) and how
// much memory it needs to run and to train.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/config_options.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/positional_encoding.h"
#include "train/checkpoint.h"

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
  // The sinusoid table a model builds as it loads (no tensor of its file).
  const double table = 4.0 * double(sinusoid_table_elements(c));
  std::printf("  inference, + activations of 4096 tokens: %9.1f MiB\n",
              (4.0 * double(total) + table + activations) / mib);
  std::printf("  training, weights + gradients + Adam:   %10.1f MiB (plus activations)\n",
              (16.0 * double(total) + table) / mib);
}

// A checkpoint's training state; `where` names its file when that is not the file described.
void print_training_state(const TrainingState& s, const std::string& where) {
  const std::string file = where.empty() ? "" : " (" + where + ")";
  std::printf(
      "training checkpoint%s:\n  step %lld, epoch %lld (batch %lld), %lld target tokens, %.1f "
      "minutes, compute type %s\n",
      file.c_str(), (long long)s.step, (long long)s.epoch + 1, (long long)s.batch_index,
      (long long)s.target_tokens_seen, s.train_seconds / 60.0, precision_name(s.compute_type));
  if (s.sentencepiece_alphas[0] > 0 || s.sentencepiece_alphas[1] > 0)
    std::printf("  segmentations sampled at --sentencepiece-alphas %g %g (source, target)\n",
                s.sentencepiece_alphas[0], s.sentencepiece_alphas[1]);
  if (s.best_valid_nll >= 0)
    std::printf("  best validation perplexity %.2f\n", std::exp(s.best_valid_nll));
}

// A checkpoint file's training state from its header alone (no tensor is read).
TrainingState checkpoint_state(const std::string& path) {
  const SafetensorsHeader header = read_safetensors_header(path);
  return checkpoint_of_header(header.metadata, header.shapes, path).state;
}

// A model or checkpoint file, from its header alone (no tensor is read): its config, checked
// against the declared shapes, and a checkpoint's training state.
void print_file_info(const std::string& path) {
  const SafetensorsHeader header = read_safetensors_header(path);
  if (!header.metadata.count("training_state")) {
    print_info(model_config_of_header(header, path));
    if (stores_int8_weights(header))
      std::printf(
          "stored: int8 matrices with a float32 scale per row (runs in int8 by default), "
          "other tensors float32\n");
    return;
  }
  const CheckpointHeader checkpoint = checkpoint_of_header(header.metadata, header.shapes, path);
  print_info(checkpoint.config);
  print_training_state(checkpoint.state, "");
}

}  // namespace

CommandRunner add_info_command(CLI::App& app) {
  auto options = std::make_shared<ConfigOptions>();
  auto model_path = std::make_shared<std::string>();
  options->add_to(app);
  app.add_option("--model", *model_path,
                 "A model directory, model file or training checkpoint (.safetensors) to describe");
  app.footer(
      "Examples:\n  transformer info --preset base --vocab 37000\n  transformer info --model "
      "model_dir");
  return [options, model_path] {
    std::error_code ec;
    if (!model_path->empty() && !std::filesystem::is_directory(*model_path, ec)) {
      print_file_info(model_file_path(*model_path));
    } else if (!model_path->empty()) {
      ModelBundle bundle = load_model_bundle(*model_path, false, cpu_backend());
      print_info(bundle.model.config());
      // A training run's directory: where its training stands (the checkpoint --resume reads).
      if (has_checkpoint(*model_path)) {
        const std::string checkpoint = checkpoint_path(*model_path);
        print_training_state(checkpoint_state(checkpoint), checkpoint);
      }
    } else {
      print_info(options->resolve());
    }
  };
}

}  // namespace tfm
