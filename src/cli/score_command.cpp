// `transformer score`: force-decodes each (source, target) pair and prints the sum of the
// natural-log probabilities of target + eos (docs/model-file.md), optionally per token. Pairs are
// sorted by length and batched by tokens; output keeps input order.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "cli/option_ranges.h"
#include "cli/progress.h"
#include "io/file_util.h"
#include "io/model_directory.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"
#include "text/batching.h"
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
  int64_t batch_tokens = 4096;
  DeviceOption device;
  ComputeTypeOption compute_type;
};

void run_score(const ScoreOptions& o) {
  const Backend& backend = o.device.resolve();
  const Precision precision = o.compute_type.resolve(backend, o.model);
  ModelBundle bundle = load_model_bundle(o.model, !o.ids, backend, precision);
  const ModelConfig& config = bundle.model.config();
  if (o.src == "-" && o.tgt == "-") throw UsageError("--src and --tgt cannot both be stdin");
  const std::vector<std::string> src_lines = read_lines(o.src);
  const std::vector<std::string> tgt_lines = read_lines(o.tgt);
  if (src_lines.size() != tgt_lines.size())
    throw Error(o.src + " has " + std::to_string(src_lines.size()) + " lines but " + o.tgt +
                " has " + std::to_string(tgt_lines.size()));
  auto sources =
      encode_lines(src_lines, bundle.source_vocabulary ? &*bundle.source_vocabulary : nullptr,
                   o.ids, config.src_vocab_size, o.src);
  auto targets =
      encode_lines(tgt_lines, bundle.target_vocabulary ? &*bundle.target_vocabulary : nullptr,
                   o.ids, config.tgt_vocab_size, o.tgt);
  const int64_t extra_src = config.src_append_eos ? 1 : 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (int64_t(sources[i].size()) > max_source_tokens(config))
      throw Error(o.src + ":" + std::to_string(i + 1) + ": " + std::to_string(sources[i].size()) +
                  " tokens is longer than the model's max_positions allow");
    if (int64_t(targets[i].size()) > max_target_tokens(config))
      throw Error(o.tgt + ":" + std::to_string(i + 1) + ": " + std::to_string(targets[i].size()) +
                  " tokens is longer than the model's max_positions allow");
  }

  // Pairs of similar length batched together (little padding), as training batches them.
  ParallelCorpus pairs;
  pairs.sources = std::move(sources);
  pairs.targets = std::move(targets);
  const BatchPlan plan = plan_batches(pairs, o.batch_tokens, extra_src, 0, 0, false);
  std::vector<std::vector<float>> results(pairs.sources.size());  // per pair: per-token log-probs
  // The activations of every batch, planned from their shapes and allocated as one block before
  // the first: a --batch-tokens that does not fit is refused here.
  ScoringWorkspace ws;
  for (const std::vector<int64_t>& members : plan)
    plan_score_forward(bundle.model, batch_shape(config, pairs.sources, pairs.targets, members), ws,
                       precision);
  check_memory(ws.plan.block_bytes(), "scoring in batches of up to " +
                                          std::to_string(o.batch_tokens) +
                                          " tokens (--batch-tokens: the activations)");
  ws.memory.allocate(bundle.model.backend(), ws.plan);
  std::vector<float> logprobs;
  Progress progress("score", int64_t(pairs.sources.size()));
  int64_t done = 0;
  for (const std::vector<int64_t>& members : plan) {
    const TokenBatch batch = make_batch(config, pairs.sources, pairs.targets, members);
    score_forward(bundle.model, batch, ws, logprobs, precision);
    for (size_t m = 0; m < members.size(); ++m) {
      const float* row = logprobs.data() + int64_t(m) * batch.tgt_len;
      results[size_t(members[m])].assign(row, row + batch.tgt_lengths[m]);
    }
    done += int64_t(members.size());
    progress.update(done);
  }
  progress.finish(done);

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
  o->device.add_to(app);
  o->compute_type.add_to(app);
  app.footer(
      "Output: one line per pair; the first field is the sum of natural-log probabilities of the\n"
      "target tokens and eos. An empty target scores eos alone.\n"
      "Example:\n  transformer score --model model_dir --src test.src --tgt test.tgt --per-token");
  return [o] { run_score(*o); };
}

}  // namespace tfm
