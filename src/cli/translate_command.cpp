// `transformer translate`: reads sentences (stdin or --input), translates them with greedy or
// beam search in length-sorted batches, and writes one line per input in input order (or
// --nbest lines `index ||| hypothesis ||| score`). Empty lines give empty lines.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "cli/progress.h"
#include "cli/search_options.h"
#include "decode/beam_search.h"
#include "decode/hypothesis_text.h"
#include "io/file_util.h"
#include "io/model_directory.h"
#include "tensor/error.h"
#include "text/corpus.h"

namespace tfm {

namespace {

struct TranslateOptions {
  std::string model, input = "-", output;
  bool ids = false;
  SearchFlags decoding;  // --beam, --alpha, length limits, --device, --compute-type
  SearchOptions search;  // decoding, resolved when the command runs
  int64_t nbest = 0;     // 0: plain output
  int64_t batch_tokens = 4096;
  std::string prefix, prefix_file;
  bool replace_unknowns = false;
  bool attention = false;
  std::string attention_file;  // JSON lines with every head of one layer
};

// Source line i, encoded; empty when the line is empty or skipped.
struct Source {
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;  // for --replace-unknowns
  bool translate = false;
};

std::string format_attention(const Hypothesis& h, int64_t heads) {
  std::string out;
  char buffer[32];
  for (size_t t = 0; t < h.attention.size(); ++t) {
    if (t) out += ' ';
    const std::vector<float> row = mean_attention(h, t, heads);
    for (size_t j = 0; j < row.size(); ++j) {
      std::snprintf(buffer, sizeof buffer, j ? ",%.4f" : "%.4f", double(row[j]));
      out += buffer;
    }
  }
  return out;
}

void run_translate(TranslateOptions o) {
  const Backend& backend = o.decoding.device.resolve();
  o.search = o.decoding.resolve(backend, o.model);
  ModelBundle bundle = load_model_bundle(o.model, !o.ids, backend, o.search.precision);
  const ModelConfig& config = bundle.model.config();
  const Vocabulary* source_vocabulary =
      bundle.source_vocabulary ? &*bundle.source_vocabulary : nullptr;
  const Vocabulary* target_vocabulary =
      bundle.target_vocabulary ? &*bundle.target_vocabulary : nullptr;
  if (o.search.beam < 1) throw Error("--beam must be at least 1");
  if (o.nbest > o.search.beam) throw Error("--nbest cannot exceed --beam");
  if (o.replace_unknowns && o.ids) throw Error("--replace-unknowns needs text input, not --ids");
  o.search.nbest = std::max<int64_t>(o.nbest, 1);
  o.search.attention = o.attention || o.replace_unknowns || !o.attention_file.empty();
  o.search.attention_per_head = !o.attention_file.empty();
  const int64_t stored_heads = o.search.attention_per_head ? config.heads : 1;
  const std::string where = o.input == "-" ? "stdin" : o.input;
  const std::vector<std::string> lines = read_lines(o.input);

  // Target prefixes: one for all, or one per line.
  std::vector<std::vector<int32_t>> prefixes;
  auto encode_target = [&](const std::string& text, const std::string& file, int64_t line) {
    if (o.ids) return parse_id_line(text, config.tgt_vocab_size, file, line);
    if (!is_valid_utf8(text)) throw Error(file + ":" + std::to_string(line) + ": invalid UTF-8");
    return target_vocabulary->encode(text);
  };
  if (!o.prefix.empty() && !o.prefix_file.empty())
    throw Error("give --prefix or --prefix-file, not both");
  if (!o.prefix.empty()) {
    prefixes.assign(lines.size(), encode_target(o.prefix, "--prefix", 1));
  } else if (!o.prefix_file.empty()) {
    const auto prefix_lines = read_lines(o.prefix_file);
    if (prefix_lines.size() != lines.size())
      throw Error(o.prefix_file + " has " + std::to_string(prefix_lines.size()) + " lines but " +
                  where + " has " + std::to_string(lines.size()));
    for (size_t i = 0; i < prefix_lines.size(); ++i)
      prefixes.push_back(encode_target(prefix_lines[i], o.prefix_file, int64_t(i) + 1));
  }

  const int64_t limit = max_source_tokens(config);
  std::vector<Source> sources(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string at = where + ":" + std::to_string(i + 1);
    Source& s = sources[i];
    if (o.ids) {
      s.ids = parse_id_line(lines[i], config.src_vocab_size, where, int64_t(i) + 1);
    } else {
      s.ids = source_vocabulary->encode(lines[i]);
      if (o.replace_unknowns) s.pieces = source_vocabulary->to_pieces(lines[i]);
    }
    if (s.ids.empty()) continue;
    if (int64_t(s.ids.size()) > limit) {
      std::fprintf(
          stderr,
          "warning: %s: %zu tokens exceed the model's limit of %lld; writing an empty line\n",
          at.c_str(), s.ids.size(), (long long)limit);
      continue;
    }
    s.translate = true;
  }

  // Longest first, batched so that sentences × longest source × beam stays within budget.
  std::vector<size_t> order;
  for (size_t i = 0; i < sources.size(); ++i)
    if (sources[i].translate) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return sources[a].ids.size() > sources[b].ids.size();
  });
  std::vector<std::vector<Hypothesis>> results(sources.size());
  Progress progress("translate", int64_t(order.size()));
  for (size_t next = 0; next < order.size();) {
    const int64_t count = sentences_within_budget(
        o.batch_tokens, int64_t(sources[order[next]].ids.size()), o.search.beam);
    std::vector<std::vector<int32_t>> batch_sources, batch_prefixes;
    std::vector<size_t> members;
    for (; next < order.size() && int64_t(members.size()) < count; ++next) {
      members.push_back(order[next]);
      batch_sources.push_back(sources[order[next]].ids);
      if (!prefixes.empty()) batch_prefixes.push_back(prefixes[order[next]]);
    }
    auto hypotheses = search(bundle.model, batch_sources, batch_prefixes, o.search);
    for (size_t m = 0; m < members.size(); ++m) results[members[m]] = std::move(hypotheses[m]);
    progress.update(int64_t(next));
  }
  progress.finish(int64_t(order.size()));

  auto render = [&](size_t line, const Hypothesis& h) {
    if (o.ids) {
      std::string text;
      for (int32_t id : h.tokens) text += (text.empty() ? "" : " ") + std::to_string(id);
      return text;
    }
    return hypothesis_text(h, *target_vocabulary, stored_heads,
                           o.replace_unknowns ? &sources[line].pieces : nullptr);
  };
  auto write = [&](std::FILE* f) {
    std::string out;
    char score[32];
    for (size_t i = 0; i < sources.size(); ++i) {
      if (o.nbest > 0) {
        // A line that was not translated (empty, or too long) has no entries: an empty
        // hypothesis with a log-probability would claim a translation that never happened.
        for (const Hypothesis& h : results[i]) {
          std::snprintf(score, sizeof score, "%.6f", h.logprob);
          out += std::to_string(i) + " ||| " + render(i, h) + " ||| " + score;
          if (o.attention) out += " ||| " + format_attention(h, stored_heads);
          out += '\n';
        }
      } else {
        if (!results[i].empty()) {
          out += render(i, results[i].front());
          if (o.attention) out += " ||| " + format_attention(results[i].front(), stored_heads);
        }
        out += '\n';
      }
      if (out.size() > (1 << 16) || i + 1 == sources.size()) {
        write_text(f, out);
        out.clear();
      }
    }
  };
  write_output(o.output, write);
  if (!o.attention_file.empty()) {
    // One JSON object per translated line: pieces and attention[head][target step][source].
    write_file_atomically(o.attention_file, [&](std::FILE* f) {
      for (size_t i = 0; i < sources.size(); ++i) {
        if (results[i].empty()) continue;
        const Hypothesis& h = results[i].front();
        nlohmann::json line;
        line["line"] = i;
        line["source"] = o.ids ? nlohmann::json(sources[i].ids)
                               : nlohmann::json(source_vocabulary->to_pieces(lines[i]));
        nlohmann::json target = nlohmann::json::array();
        for (int32_t id : h.tokens)
          target.push_back(o.ids ? nlohmann::json(id)
                                 : nlohmann::json(target_vocabulary->piece(id)));
        if (h.finished_with_eos) target.push_back("</s>");
        line["target"] = target;
        line["layer"] =
            o.search.attention_layer < 0 ? config.decoder_layers - 1 : o.search.attention_layer;
        nlohmann::json heads = nlohmann::json::array();
        for (int64_t head = 0; head < config.heads; ++head) {
          nlohmann::json rows = nlohmann::json::array();
          for (const auto& step : h.attention) {
            const size_t width = step.size() / size_t(config.heads);
            rows.push_back(std::vector<float>(step.begin() + long(head * width),
                                              step.begin() + long((head + 1) * width)));
          }
          heads.push_back(rows);
        }
        line["attention"] = heads;
        const std::string text = line.dump() + "\n";
        write_text(f, text);
      }
    });
  }
}

}  // namespace

CommandRunner add_translate_command(CLI::App& app) {
  auto o = std::make_shared<TranslateOptions>();
  app.add_option(
         "--model", o->model,
         "Model directory (model.safetensors + vocabulary), or a .safetensors file with --ids")
      ->required();
  app.add_option("-i,--input", o->input, "Sentences to translate, one per line (default: stdin)");
  app.add_option("-o,--output", o->output,
                 "Write translations here (atomically) instead of stdout");
  app.add_flag("--ids", o->ids, "Input and output are space-separated token ids");
  o->decoding.add_to(app);
  app.add_option(
         "--nbest", o->nbest,
         "Print the K best hypotheses per input as `index ||| hypothesis ||| score` "
         "(index from 0; score = natural-log probability of the tokens and eos; a line that is "
         "not translated, empty or too long, has no entries)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--batch-tokens", o->batch_tokens,
                 "Budget per batch: sentences × longest source × beam (default 4096)")
      ->check(at_least(1));
  app.add_option("--prefix", o->prefix, "Force every translation to start with this target text");
  app.add_option("--prefix-file", o->prefix_file,
                 "Force line i's translation to start with line i of FILE");
  app.add_flag("--replace-unknowns", o->replace_unknowns,
               "Replace each <unk> output with the source token it attends to most");
  app.add_flag(
      "--attention", o->attention,
      "After each hypothesis print ` ||| ` and its attention: per output token (eos included), "
      "the last decoder layer's cross-attention averaged over heads, comma-separated over "
      "source positions; tokens separated by spaces");
  app.add_option(
         "--attention-layer", o->decoding.search.attention_layer,
         "Decoder layer (0-based) whose cross-attention --attention / --attention-file report "
         "(default: the last)")
      ->check(at_least(0));
  app.add_option(
      "--attention-file", o->attention_file,
      "Write JSON lines {line, source, target, layer, attention[head][target][source]} with "
      "every head of that layer, for visualisation");
  app.footer(
      "Example:\n  echo 'the house is small' | transformer translate --model run --beam 4\n"
      "  transformer translate --model run -i test.en -o test.out --nbest 4");
  return [o] { run_translate(*o); };
}

}  // namespace tfm
