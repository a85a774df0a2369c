// `transformer quantize`: rewrites a model with its linear weights and token embeddings stored
// in int8 (a scale per row, the format --compute-type int8 multiplies in), or back in float32. An
// int8 file is about a quarter of the size and loads without quantising anything, which is
// most of the start-up time of an int8 translate (what CTranslate2's converters'
// --quantization int8 does for its users).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/output_overwrite.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "tensor/error.h"
#include "tensor/file_util.h"

namespace tfm {

CommandRunner add_quantize_command(CLI::App& app) {
  struct Options {
    std::string model;
    std::string output;
    std::string type = "int8";
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--model", o->model, "Model directory (model.safetensors + vocabulary) or file")
      ->required();
  app.add_option("-o,--output", o->output,
                 "What to write: a model directory (with a copy of the vocabulary) for a "
                 "directory, a model file for a file")
      ->required();
  app.add_option("--type", o->type,
                 "int8: linear weights and token embeddings as int8 rows with one float32 "
                 "scale each (scale = max|row|/127, round to nearest even); float32: every "
                 "weight in float32")
      ->check(CLI::IsMember({"int8", "float32"}))
      ->capture_default_str();
  app.add_flag("--force", o->force,
               "Overwrite an existing output file, or replace a model directory (as a whole, once "
               "the new one is complete; a directory holding other files is refused)");
  app.footer(
      "Biases, layer norms and learned positions stay float32. translate, score and serve\n"
      "run an int8 model in int8 unless --compute-type says otherwise (other types multiply\n"
      "out the stored int8 weights when loading).\n"
      "Example:\n  transformer quantize --model run -o run-int8\n"
      "  transformer translate --model run-int8 < test.en");
  return [o] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string model_path = model_file_path(o->model);
    const bool directory = fs::is_directory(o->model, ec);
    refuse_existing_output(o->output, directory ? OutputKind::kDirectory : OutputKind::kFile,
                           o->force);
    const ModelWeights weights = o->type == "int8" ? ModelWeights::kInt8 : ModelWeights::kFloat32;
    const Model model = load_model(model_path, cpu_backend(), weights);
    std::string output_path = o->output;
    if (directory) {
      write_directory_atomically(o->output, model_directory_files(), [&](const std::string& temp) {
        copy_vocabulary_files(o->model, temp);
        save_model(model, temp + "/model.safetensors");
      });
      output_path = o->output + "/model.safetensors";
    } else {
      save_model(model, output_path);
    }
    std::printf("wrote %s: linear weights and embeddings in %s, %.1f MiB\n", o->output.c_str(),
                o->type.c_str(), double(fs::file_size(output_path, ec)) / (1 << 20));
  };
}

}  // namespace tfm
