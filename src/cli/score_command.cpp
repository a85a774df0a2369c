// `transformer score`: force-decodes each (source, target) pair and prints the sum of the
// natural-log probabilities of target + eos (docs/model-file.md), optionally per token. Pairs are
// sorted by length and batched by tokens; output keeps input order.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include "cli/commands.h"
#include "cli/compute_type_option.h"
#include "cli/option_ranges.h"
#include "cli/progress.h"
#include "io/file_util.h"
#include "tensor/error.h"
#include "text/corpus.h"
#include "text/model_directory.h"

namespace tfm {

namespace {

struct ScoreOptions {
  std::string model;
  std::string src;
  std::string tgt;
  std::string output;
  bool ids = false;
  bool per_token = false;
  int64_t batch_tokens = 4096;
  ComputeTypeOption compute_type;
};

void run_score(const ScoreOptions& o) {
  const Precision precision = o.compute_type.resolve();
  ModelBundle bundle = load_model_bundle(o.model, !o.ids);
  const ModelConfig& config = bundle.model.config();
  if (o.src == "-" && o.tgt == "-") throw Error("--src and --tgt cannot both be stdin");
  const std::vector<std::string> src_lines = read_lines(o.src);
  const std::vector<std::string> tgt_lines = read_lines(o.tgt);
  if (src_lines.size() != tgt_lines.size())
    throw Error(o.src + " has " + std::to_string(src_lines.size()) + " lines but " + o.tgt +
                " has " + std::to_string(tgt_lines.size()));
  const auto sources =
      encode_lines(src_lines, bundle.source_vocabulary ? &*bundle.source_vocabulary : nullptr,
                   o.ids, config.src_vocab_size, o.src);
  const auto targets =
      encode_lines(tgt_lines, bundle.target_vocabulary ? &*bundle.target_vocabulary : nullptr,
                   o.ids, config.tgt_vocab_size, o.tgt);
  const int64_t limit = config.max_positions - config.position_offset;
  const int64_t extra_src = config.src_append_eos ? 1 : 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (int64_t(sources[i].size()) + extra_src > limit)
      throw Error(o.src + ":" + std::to_string(i + 1) + ": " + std::to_string(sources[i].size()) +
                  " tokens is longer than the model's max_positions allow");
    if (int64_t(targets[i].size()) + 1 > limit)
      throw Error(o.tgt + ":" + std::to_string(i + 1) + ": " + std::to_string(targets[i].size()) +
                  " tokens is longer than the model's max_positions allow");
  }

  // Longest pairs first, so batches hold sentences of similar length (little padding).
  std::vector<size_t> order(sources.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return sources[a].size() + targets[a].size() > sources[b].size() + targets[b].size();
  });
  std::vector<std::vector<float>> results(sources.size());  // per pair: per-token log-probs
  StackCache ws;
  std::vector<float> logprobs;
  Progress progress("score", int64_t(order.size()));
  size_t next = 0;
  while (next < order.size()) {
    std::vector<std::vector<int32_t>> batch_src, batch_tgt;
    std::vector<size_t> members;
    int64_t src_len = 0, tgt_len = 0;
    while (next < order.size()) {
      const size_t i = order[next];
      const int64_t s = std::max<int64_t>(src_len, int64_t(sources[i].size()) + extra_src);
      const int64_t t = std::max<int64_t>(tgt_len, int64_t(targets[i].size()) + 1);
      if (!members.empty() && int64_t(members.size() + 1) * (s + t) > o.batch_tokens) break;
      src_len = s;
      tgt_len = t;
      members.push_back(i);
      batch_src.push_back(sources[i]);
      batch_tgt.push_back(targets[i]);
      ++next;
    }
    const TokenBatch batch = make_batch(config, batch_src, batch_tgt);
    score_forward(bundle.model, batch, ws, logprobs, precision);
    for (size_t m = 0; m < members.size(); ++m) {
      const float* row = logprobs.data() + int64_t(m) * batch.tgt_len;
      results[members[m]].assign(row, row + batch.tgt_lengths[m]);
    }
    progress.update(int64_t(next));
  }
  progress.finish(int64_t(next));

  auto write = [&](std::FILE* f) {
    for (const auto& tokens : results) {
      double total = 0;
      for (float v : tokens) total += v;
      std::string line = std::to_string(total);
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%.6f", total);
      line = buffer;
      if (o.per_token)
        for (float v : tokens) {
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
                 "Padded source + target tokens per batch (default 4096)")
      ->check(at_least(1));
  o->compute_type.add_to(app);
  app.footer(
      "Output: one line per pair; the first field is the sum of natural-log probabilities of the\n"
      "target tokens and eos. An empty target scores eos alone.\n"
      "Example:\n  transformer score --model model_dir --src test.src --tgt test.tgt --per-token");
  return [o] { run_score(*o); };
}

}  // namespace tfm
