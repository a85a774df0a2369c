// Entry point of `transformer`: subcommand dispatch and the error contract
// (one "error: ..." line on stderr; exit 1 for failures, 2 for usage errors).
#include <omp.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <new>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "io/model_file.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/memory_budget.h"
#include "tensor/thread_limit.h"
#include "text/corpus.h"
#include "train/replicas.h"

namespace {

// The exit status after --help (or --version) printed to standard output: `code`, or 1 with one
// error line when the text was lost (a full disk, /dev/full, a closed pipe).
int help_written(int code) {
  std::cout.flush();
  try {
    tfm::flush_standard_output();
  } catch (const tfm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  tfm::remove_temp_files_on_signals();
  tfm::retain_freed_memory();
  CLI::App app{
      "transformer: the Transformer of \"Attention Is All You Need\" (encoder-decoder, §3) —\n"
      "train, translate, score, serve and convert models. Run `transformer COMMAND --help` for "
      "each command.",
      "transformer"};  // the name usage lines show, whatever path the binary was run by
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for all commands");
  app.set_version_flag("--version", tfm::build_description(),
                       "Print the version, the model file format and what this build has");
  int threads = 0;
  app.add_option("--threads", threads,
                 "Worker threads, at most 4 × the CPUs this process may use (default: all cores, "
                 "or OMP_NUM_THREADS)")
      // Described in words: the bound is this machine's, and --help must not depend on it.
      ->check(tfm::in_range(0, tfm::max_worker_threads()).description("in [0, 4 × CPUs]"));
  bool allow_nonfinite = false;
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "Load model weights that contain NaN or Inf instead of refusing them");
  std::string max_memory;
  app.add_option("--max-memory", max_memory,
                 "Refuse models and files that need more memory than this (e.g. 8G; default: "
                 "the machine's physical memory)");
  int64_t max_line_bytes = tfm::kDefaultMaxLineBytes;
  app.add_option("--max-line-bytes", max_line_bytes,
                 tfm::with_default("Refuse text lines longer than this many bytes", max_line_bytes))
      ->check(tfm::at_least(1));
  app.fallthrough();  // the options above may also follow the command

  std::map<CLI::App*, tfm::CommandRunner> runners;
  auto add = [&](const char* name, const char* description, auto add_command) {
    CLI::App* sub = app.add_subcommand(name, description);
    runners[sub] = add_command(*sub);
  };
  add("info", "Show a model's or preset's config, exact parameter count and memory needs",
      tfm::add_info_command);
  add("init", "Write a randomly initialised model file from a preset or config",
      tfm::add_init_command);
  add("vocab", "Train a joint BPE SentencePiece vocabulary from text files",
      tfm::add_vocab_command);
  add("train", "Train a model (from scratch, from --init, or --resume)", tfm::add_train_command);
  add("average", "Average the parameters of several checkpoints", tfm::add_average_command);
  add("quantize",
      "Rewrite a model with its linear weights and embeddings stored in int8 (or float32)",
      tfm::add_quantize_command);
  add("translate", "Translate text with greedy or beam search", tfm::add_translate_command);
  add("bleu", "Corpus BLEU (and chrF) of hypotheses against references, sacreBLEU-compatible",
      tfm::add_bleu_command);
  add("score", "Log-probability of each target given its source (force decoding)",
      tfm::add_score_command);
  add("serve", "Serve translations over HTTP (JSON API, LibreTranslate API, web page)",
      tfm::add_serve_command);
  add("import-ctranslate2",
      "Convert a CTranslate2 Transformer model directory into a model directory",
      tfm::add_import_ctranslate2_command);
  add("export-ctranslate2", "Write a model directory as a CTranslate2 model directory",
      tfm::add_export_ctranslate2_command);

  tfm::read_integers_as_decimal(app);

  bool known_command = argc < 2 || argv[1][0] == '-';
  for (const auto& [sub, runner] : runners)
    known_command = known_command || sub->check_name(argv[1]);
  if (!known_command) {
    std::fprintf(stderr, "error: unknown command \"%s\" (see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return help_written(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return help_written(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return help_written(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
    return 2;
  }
  if (threads > 0) {
    omp_set_num_threads(threads);
  } else if (const std::string problem = tfm::thread_environment_problem(); !problem.empty()) {
    std::fprintf(stderr, "error: %s\n", problem.c_str());  // before any parallel region runs
    return 2;
  }
  tfm::allow_nonfinite_weights(allow_nonfinite);
  try {
    if (!max_memory.empty()) tfm::set_memory_limit(tfm::parse_memory_size(max_memory));
    if (max_line_bytes) tfm::set_max_line_bytes(max_line_bytes);
    for (CLI::App* sub : app.get_subcommands()) runners.at(sub)();
    tfm::flush_standard_output();  // a full disk or /dev/full must not pass for success
  } catch (const tfm::UsageError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
    tfm::abort_replicas(2);
    return 2;
  } catch (const tfm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    // Under mpirun: end the other ranks too instead of leaving them waiting.
    tfm::abort_replicas(1);
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    tfm::abort_replicas(1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    tfm::abort_replicas(1);
    return 1;
  }
  return 0;
}
