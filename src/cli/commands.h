// The subcommands of the `transformer` binary. Each registers its flags on the CLI11 app and
// returns the function that runs it; errors are thrown as tfm::Error and printed by main().
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace tfm {

using CommandRunner = std::function<void()>;

CommandRunner add_info_command(CLI::App& app);
CommandRunner add_init_command(CLI::App& app);
CommandRunner add_score_command(CLI::App& app);
CommandRunner add_import_ctranslate2_command(CLI::App& app);
CommandRunner add_export_ctranslate2_command(CLI::App& app);
CommandRunner add_train_command(CLI::App& app);
CommandRunner add_vocab_command(CLI::App& app);
CommandRunner add_average_command(CLI::App& app);
CommandRunner add_quantize_command(CLI::App& app);
CommandRunner add_translate_command(CLI::App& app);
CommandRunner add_bleu_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);

class Translator;
struct TranslatorOptions;
// translate and score's --model, loaded: a model without the vocabulary text needs is an error
// that points to --ids, which those two commands have.
Translator open_translator_for_text_or_ids(const std::string& model,
                                           const TranslatorOptions& options);

}  // namespace tfm
