// `transformer import-ctranslate2`: converts a CTranslate2 Transformer model directory into a
// model directory of ours (model.safetensors + token-list vocabularies).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "io/ctranslate2.h"
#include "text/model_directory.h"

namespace tfm {

CommandRunner add_import_ctranslate2_command(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
  };
  auto o = std::make_shared<Options>();
  app.add_option("DIR", o->input, "CTranslate2 model directory (model.bin + vocabularies)")
      ->required();
  app.add_option("-o,--output", o->output, "Model directory to write")->required();
  app.footer(
      "Reads model.bin versions 1-6 (float32; int8/int16/float16/bfloat16 weights are converted "
      "to\n"
      "float32) and source/target vocabularies (.txt or .json).\n"
      "Example:\n  transformer import-ctranslate2 ende_ctranslate2 -o ende");
  return [o] {
    ImportedModel imported = import_ctranslate2(o->input);
    check_finite_parameters(imported.parameters, o->input + "/model.bin");
    Model model(imported.config, std::move(imported.parameters), o->input + "/model.bin");
    write_model_directory(o->output, model, &imported.source_tokens, &imported.target_tokens);
    const ModelConfig& c = model.config();
    std::printf("wrote %s: %lld+%lld layers, d_model %lld, %lld heads, vocabularies %lld/%lld\n",
                o->output.c_str(), (long long)c.encoder_layers, (long long)c.decoder_layers,
                (long long)c.d_model, (long long)c.heads, (long long)c.src_vocab_size,
                (long long)c.tgt_vocab_size);
  };
}

}  // namespace tfm
