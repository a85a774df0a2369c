// `transformer score`: force-decodes each (source, target) pair and prints the sum of the
// natural-log probabilities of target + eos (docs/model-file.md), optionally per token, through
// the library's Translator (pairs sorted by length and batched by tokens); output keeps input
// order.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "api/translator.h"
#include "cli/commands.h"
#include "cli/device_options.h"
#include "cli/option_ranges.h"
#include "cli/output_overwrite.h"
#include "cli/progress.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "text/corpus.h"

namespace tfm {

namespace {

struct ScoreOptions {
  std::string model;
  std::string src;
  std::string tgt;
  std::string output;
  bool ids = false;
  bool per_token = false;
  int64_t batch_tokens = kDefaultMaxBatchTokens;
  DeviceOption device;
  ComputeTypeOption compute_type;
};

void run_score(const ScoreOptions& o) {
  if (o.src == "-" && o.tgt == "-") throw UsageError("--src and --tgt cannot both be stdin");
  refuse_output_over_input("-o", o.output, {o.src, o.tgt});
  TranslatorOptions loading;
  loading.device = o.device.name;
  loading.compute_type = o.compute_type.name;
  loading.need_vocabulary = !o.ids;
  const Translator translator = open_translator_for_text_or_ids(o.model, loading);
  const ModelConfig& config = translator.config();
  const std::vector<std::string> src_lines = read_lines(o.src);
  const std::vector<std::string> tgt_lines = read_lines(o.tgt);
  if (src_lines.size() != tgt_lines.size())
    throw Error(o.src + " has " + std::to_string(src_lines.size()) + " lines but " + o.tgt +
                " has " + std::to_string(tgt_lines.size()));
  const auto sources =
      encode_lines(src_lines, translator.source_vocabulary(), o.ids, config.src_vocab_size, o.src);
  const auto targets =
      encode_lines(tgt_lines, translator.target_vocabulary(), o.ids, config.tgt_vocab_size, o.tgt);
  Progress progress("score", int64_t(sources.size()));
  std::vector<ScoringResult> results;
  try {
    results = translator.score_ids(sources, targets, o.batch_tokens,
                                   [&](int64_t done) { progress.update(done); });
  } catch (const SequenceTooLong& e) {  // the library's check, told as file:line
    throw Error((e.target ? o.tgt : o.src) + ":" + std::to_string(e.index + 1) + ": " + e.detail);
  }
  progress.finish(int64_t(sources.size()));

  auto write = [&](std::FILE* f) {
    for (const ScoringResult& result : results) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%.6f", result.log_prob);
      std::string line = buffer;
      if (o.per_token)
        for (float v : result.log_probs) {
          std::snprintf(buffer, sizeof buffer, " %.6f", double(v));
          line += buffer;
        }
      line += '\n';
      write_text(f, line);
    }
  };
  write_output(o.output, write);
}

}  // namespace

CommandRunner add_score_command(CLI::App& app) {
  auto o = std::make_shared<ScoreOptions>();
  app.add_option(
         "--model", o->model,
         "Model directory (model.safetensors + vocabulary), or a .safetensors file with --ids")
      ->required();
  app.add_option("--src", o->src, "Source sentences, one per line (- for stdin)")->required();
  app.add_option("--tgt", o->tgt, "Target sentences, one per line, same count (- for stdin)")
      ->required();
  app.add_option("-o,--output", o->output, "Write scores here (atomically) instead of stdout");
  app.add_flag("--ids", o->ids, "Lines are space-separated token ids, not text");
  app.add_flag("--per-token", o->per_token,
               "After the total, print each token's log-probability (target tokens, then eos)");
  app.add_option("--batch-tokens", o->batch_tokens,
                 with_default("Padded source + target tokens per batch", o->batch_tokens))
      ->check(at_least(1));
  o->device.add_to(app);
  o->compute_type.add_to(app);
  app.footer(
      "Output: one line per pair; the first field is the sum of natural-log probabilities of the\n"
      "target tokens and eos. An empty target scores eos alone.\n"
      "Example:\n  transformer score --model model_dir --src test.src --tgt test.tgt --per-token");
  return [o] { run_score(*o); };
}

}  // namespace tfm
