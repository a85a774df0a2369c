// `transformer vocab`: a joint byte-pair-encoding vocabulary (the paper's shared source-target
// BPE, §5.1) trained with SentencePiece, with the special ids of docs/model-file.md:
// pad 0, bos 1, eos 2, unk 3.
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>

#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "cli/output_overwrite.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "text/corpus.h"

// Declared by SentencePiece's internal headers, which Debian does not install.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}

namespace tfm {

namespace {

// The inputs checked as every text command checks its lines (read_lines: UTF-8, no NUL, the
// line-length cap, named by file and line) before SentencePiece reads them, whose own failures
// name its source lines; and some line must hold more than white space.
void check_vocabulary_text(const std::vector<std::string>& inputs) {
  bool any_text = false;
  for (const std::string& path : inputs)
    for (const std::string& line : read_lines(path))
      any_text = any_text || line.find_first_not_of(" \t\r\f\v") != std::string::npos;
  if (!any_text)
    throw Error(
        "the inputs hold no text to learn a vocabulary from (no line with more than "
        "white space)");
}

// SentencePiece's failure in this command's terms: its messages for a --size the text cannot
// fill, or one too small for the text's characters, name its own flags (--vocab_size,
// --character_coverage) and source lines. Anything else is passed on as it says it.
std::string vocabulary_failure(const std::string& status) {
  std::smatch m;
  if (std::regex_search(status, m,
                        std::regex(R"(Vocabulary size too high \((\d+)\)\. .*<= (\d+))")))
    return "--size " + m[1].str() + ": the text yields only " + m[2].str() +
           " pieces (its characters, their merges and the 4 special tokens); give more text" +
           (std::stoll(m[2].str()) >= 8 ? " or a --size of at most " + m[2].str() : "");
  if (std::regex_search(status, m, std::regex(R"(smaller than required_chars\. (\d+) vs (\d+))")))
    return "--size " + m[1].str() + " is smaller than the " + m[2].str() +
           " pieces the text's characters and the 4 special tokens need; raise --size or lower "
           "--character-coverage";
  return "SentencePiece training failed: " + status;
}

}  // namespace

CommandRunner add_vocab_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> inputs;
    int64_t size = 8000;
    std::string output;
    bool force = false;
    double character_coverage = 1.0;
    int64_t max_sentences = 2000000;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--input", o->inputs, "Text files, one sentence per line (source and target)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--size", o->size,
                 with_default("Vocabulary size, special tokens included", o->size))
      ->check(in_range(8, 1 << 22));
  app.add_option("-o,--output", o->output, "SentencePiece model file to write (e.g. vocab.spm)")
      ->required();
  add_force_flag(app, o->force, "file");
  app.add_option("--character-coverage", o->character_coverage,
                 with_default("Share of characters covered by the vocabulary",
                              o->character_coverage, "0.9995 for CJK"))
      ->check(in_range(0.98, 1));  // SentencePiece's own bounds
  app.add_option("--max-sentences", o->max_sentences,
                 with_default("Train on at most this many sentences, sampled", o->max_sentences))
      ->check(at_least(101));  // SentencePiece takes more than 100
  app.footer("Example:\n  transformer vocab --input train.en train.es --size 8000 -o vocab.spm");
  return [o] {
    refuse_existing_output(o->output, OutputKind::kFile, o->force);
    refuse_output_over_input("-o", o->output, o->inputs);
    check_vocabulary_text(o->inputs);
    std::string inputs;
    for (const auto& f : o->inputs) inputs += (inputs.empty() ? "" : ",") + f;
    const std::string args =
        "--input=" + inputs + " --model_type=bpe --vocab_size=" + std::to_string(o->size) +
        " --character_coverage=" + std::to_string(o->character_coverage) +
        " --pad_id=0 --bos_id=1 --eos_id=2 --unk_id=3 --pad_piece=<pad> --input_sentence_size=" +
        std::to_string(o->max_sentences) +
        " --shuffle_input_sentence=true --num_threads=2 --minloglevel=2";
    sentencepiece::logging::SetMinLogLevel(2);  // errors only: the status says what failed
    // The model comes back in memory (SentencePiece writes no file of its own, whose write
    // errors it would not report) and is written atomically and checked.
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, nullptr, &model);
    if (!status.ok()) throw Error(vocabulary_failure(status.ToString()));
    write_bytes_atomically(o->output, model);
    std::printf("wrote %s: %lld-token BPE vocabulary\n", o->output.c_str(), (long long)o->size);
  };
}

}  // namespace tfm
