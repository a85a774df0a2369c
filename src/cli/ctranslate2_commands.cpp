// `transformer import-ctranslate2` and `export-ctranslate2`: model directories to and from
// CTranslate2's format (see io/ctranslate2.h for what maps onto what).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/output_overwrite.h"
#include "io/ctranslate2.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "tensor/error.h"

namespace tfm {

CommandRunner add_import_ctranslate2_command(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("DIR", o->input, "CTranslate2 model directory (model.bin + vocabularies)")
      ->required();
  app.add_option("-o,--output", o->output, "Model directory to write")->required();
  add_force_flag(app, o->force,
                 "model directory (as a whole, once the new one is complete; a directory "
                 "holding other files is refused)");
  app.footer(
      "Reads TransformerSpec models as CTranslate2's converters write them (model.bin binary\n"
      "versions 1-6, spec revisions 1-7), config.json (special tokens, add_source_eos,\n"
      "layer_norm_epsilon) and the shared or source/target vocabularies (.json or .txt).\n"
      "Features our Transformer does not have (rotary or relative positions, ALiBi, multi-query\n"
      "attention, GLU, RMS norm, ...) are refused by name when switched on.\n"
      "Linear weights and embeddings stored in int8 stay int8 (values and row scales as stored:\n"
      "the model runs in int8 by default; `transformer quantize --type float32` rewrites it in\n"
      "float32); other weights (int16, float16, bfloat16) are converted to float32.\n"
      "Example:\n  transformer import-ctranslate2 ende_ctranslate2 -o ende");
  return [o] {
    refuse_existing_output(o->output, OutputKind::kDirectory, o->force);
    ImportedModel imported = import_ctranslate2(o->input);
    check_finite_parameters(imported.parameters, o->input + "/model.bin");
    for (const auto& [name, q] : imported.int8_parameters)  // held in int8 only
      std::vector<float>().swap(imported.parameters.at(name).data);
    Model model(imported.config, std::move(imported.parameters), o->input + "/model.bin",
                cpu_backend(), std::move(imported.int8_parameters));
    write_model_directory(o->output, model, &imported.source_tokens, &imported.target_tokens);
    const ModelConfig& c = model.config();
    std::printf(
        "wrote %s: %lld+%lld layers, d_model %lld, %lld heads, vocabularies %lld/%lld, "
        "weights %s\n",
        o->output.c_str(), (long long)c.encoder_layers, (long long)c.decoder_layers,
        (long long)c.d_model, (long long)c.heads, (long long)c.src_vocab_size,
        (long long)c.tgt_vocab_size, model.holds_int8_weights() ? "int8" : "float32");
  };
}

CommandRunner add_export_ctranslate2_command(CLI::App& app) {
  struct Options {
    std::string model;
    std::string output;
    std::string quantization = "float32";
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--model", o->model, "Model directory (model.safetensors + its vocabulary)")
      ->required();
  app.add_option("-o,--output", o->output, "CTranslate2 model directory to write")->required();
  app.add_option("--quantization", o->quantization,
                 "Weight type, quantised as CTranslate2's converters do: float32 (default), "
                 "int8 (or int8_float32: the other weights stay float32), int8_float16 or "
                 "int8_bfloat16 (the other weights in that type), int16, float16 or bfloat16")
      ->check(CLI::IsMember({"float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                             "int16", "float16", "bfloat16"}));
  app.add_flag("--force", o->force,
               "Replace an earlier export in the output directory (as a whole, once the new one "
               "is complete; a directory holding other files is refused)");
  app.footer(
      "Writes model.bin (binary version 6, TransformerSpec revision 7), config.json and the\n"
      "vocabularies as JSON token lists (shared_vocabulary.json when source and target are the\n"
      "same). Positions other than CTranslate2's own sinusoid (concat layout from position 1)\n"
      "are written as a position table; restricted self-attention cannot be exported.\n"
      "Example:\n  transformer export-ctranslate2 --model run -o run_ct2 --quantization int8\n"
      "  ct2-translator --model run_ct2 --src test.pieces");
  return [o] {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!o->force && fs::is_directory(o->output, ec) && !fs::is_empty(o->output, ec))
      throw Error(o->output + ": directory is not empty (use --force to write into it)");
    ModelBundle bundle = load_model_bundle(o->model, /*need_vocabulary=*/true, cpu_backend());
    const Vocabulary& source = *bundle.source_vocabulary;
    const Vocabulary& target = *bundle.target_vocabulary;
    auto token_list = [](const Vocabulary& v) {
      if (v.unk_id() < 0)
        throw Error(v.where() + ": no unknown token, which CTranslate2 vocabularies need");
      std::vector<std::string> list;
      for (int64_t id = 0; id < v.size(); ++id) list.push_back(v.piece(int32_t(id)));
      return list;
    };
    const CTranslate2Tokens tokens{token_list(source), token_list(target),
                                   target.piece(target.unk_id())};
    if (source.piece(source.unk_id()) != tokens.unk_token)
      throw Error("the source and target vocabularies name their unknown token differently");
    export_ctranslate2(bundle.model, tokens, parse_ct_quantization(o->quantization), o->output);
    const ModelConfig& c = bundle.model.config();
    std::printf("wrote %s: CTranslate2 TransformerSpec, %lld+%lld layers, d_model %lld, %s\n",
                o->output.c_str(), (long long)c.encoder_layers, (long long)c.decoder_layers,
                (long long)c.d_model, o->quantization.c_str());
  };
}

}  // namespace tfm
