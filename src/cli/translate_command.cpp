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

// One `translate` run in named steps: the model, the input lines and their prefixes, the
// length-sorted batches through search(), then the output file and the attention file.
class Translation {
 public:
  explicit Translation(TranslateOptions options)
      : o_(std::move(options)),
        backend_(o_.decoding.device.resolve()),
        bundle_(open_model()),
        config_(bundle_.model.config()),
        source_vocabulary_(bundle_.source_vocabulary ? &*bundle_.source_vocabulary : nullptr),
        target_vocabulary_(bundle_.target_vocabulary ? &*bundle_.target_vocabulary : nullptr) {
    if (o_.search.beam < 1) throw UsageError("--beam must be at least 1");
    if (o_.nbest > o_.search.beam) throw UsageError("--nbest cannot exceed --beam");
    if (o_.replace_unknowns && o_.ids)
      throw UsageError("--replace-unknowns needs text input, not --ids");
    o_.search.nbest = std::max<int64_t>(o_.nbest, 1);
    o_.search.attention = o_.attention || o_.replace_unknowns || !o_.attention_file.empty();
    o_.search.attention_per_head = !o_.attention_file.empty();
    stored_heads_ = o_.search.attention_per_head ? config_.heads : 1;
  }

  void run() {
    where_ = o_.input == "-" ? "stdin" : o_.input;
    lines_ = read_lines(o_.input);
    read_prefixes();
    encode_sources();
    translate_in_batches();
    write_output(o_.output, [&](std::FILE* f) { write_translations(f); });
    if (!o_.attention_file.empty())
      write_file_atomically(o_.attention_file, [&](std::FILE* f) { write_attention(f); });
  }

 private:
  ModelBundle open_model() {
    o_.search = o_.decoding.resolve(backend_, o_.model);
    return load_model_bundle(o_.model, !o_.ids, backend_, o_.search.precision);
  }

  std::vector<int32_t> encode_target(const std::string& text, const std::string& file,
                                     int64_t line) const {
    if (o_.ids) return parse_id_line(text, config_.tgt_vocab_size, file, line);
    if (!is_valid_utf8(text)) throw Error(file + ":" + std::to_string(line) + ": invalid UTF-8");
    return target_vocabulary_->encode(text);
  }

  // Target prefixes: one for all lines (--prefix), or one per line (--prefix-file).
  void read_prefixes() {
    if (!o_.prefix.empty() && !o_.prefix_file.empty())
      throw UsageError("give --prefix or --prefix-file, not both");
    if (!o_.prefix.empty()) {
      prefixes_.assign(lines_.size(), encode_target(o_.prefix, "--prefix", 1));
    } else if (!o_.prefix_file.empty()) {
      const auto prefix_lines = read_lines(o_.prefix_file);
      if (prefix_lines.size() != lines_.size())
        throw Error(o_.prefix_file + " has " + std::to_string(prefix_lines.size()) + " lines but " +
                    where_ + " has " + std::to_string(lines_.size()));
      for (size_t i = 0; i < prefix_lines.size(); ++i)
        prefixes_.push_back(encode_target(prefix_lines[i], o_.prefix_file, int64_t(i) + 1));
    }
  }

  // Every line as source ids; empty lines and lines over the model's limit are not translated
  // (the latter with a warning).
  void encode_sources() {
    const int64_t limit = max_source_tokens(config_);
    sources_.resize(lines_.size());
    for (size_t i = 0; i < lines_.size(); ++i) {
      Source& s = sources_[i];
      if (o_.ids) {
        s.ids = parse_id_line(lines_[i], config_.src_vocab_size, where_, int64_t(i) + 1);
      } else {
        s.ids = source_vocabulary_->encode(lines_[i]);
        if (o_.replace_unknowns) s.pieces = source_vocabulary_->to_pieces(lines_[i]);
      }
      if (s.ids.empty()) continue;
      if (int64_t(s.ids.size()) > limit) {
        std::fprintf(
            stderr,
            "warning: %s:%zu: %zu tokens exceed the model's limit of %lld; writing an empty line\n",
            where_.c_str(), i + 1, s.ids.size(), (long long)limit);
        continue;
      }
      s.translate = true;
    }
  }

  // Longest first, batched so that sentences × longest source × beam stays within budget.
  void translate_in_batches() {
    std::vector<size_t> order;
    for (size_t i = 0; i < sources_.size(); ++i)
      if (sources_[i].translate) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return sources_[a].ids.size() > sources_[b].ids.size();
    });
    results_.assign(sources_.size(), {});
    Progress progress("translate", int64_t(order.size()));
    for (size_t next = 0; next < order.size();) {
      const int64_t count = sentences_within_budget(
          o_.batch_tokens, int64_t(sources_[order[next]].ids.size()), o_.search.beam);
      std::vector<std::vector<int32_t>> batch_sources, batch_prefixes;
      std::vector<size_t> members;
      for (; next < order.size() && int64_t(members.size()) < count; ++next) {
        members.push_back(order[next]);
        batch_sources.push_back(sources_[order[next]].ids);
        if (!prefixes_.empty()) batch_prefixes.push_back(prefixes_[order[next]]);
      }
      auto hypotheses = search(bundle_.model, batch_sources, batch_prefixes, o_.search);
      for (size_t m = 0; m < members.size(); ++m) results_[members[m]] = std::move(hypotheses[m]);
      progress.update(int64_t(next));
    }
    progress.finish(int64_t(order.size()));
  }

  std::string render(size_t line, const Hypothesis& h) const {
    if (o_.ids) {
      std::string text;
      for (int32_t id : h.tokens) text += (text.empty() ? "" : " ") + std::to_string(id);
      return text;
    }
    return hypothesis_text(h, *target_vocabulary_, stored_heads_,
                           o_.replace_unknowns ? &sources_[line].pieces : nullptr);
  }

  // One line per input line, in input order, or --nbest lines `index ||| text ||| score`.
  void write_translations(std::FILE* f) const {
    std::string out;
    char score[32];
    for (size_t i = 0; i < sources_.size(); ++i) {
      if (o_.nbest > 0) {
        // A line that was not translated (empty, or too long) has no entries: an empty
        // hypothesis with a log-probability would claim a translation that never happened.
        for (const Hypothesis& h : results_[i]) {
          std::snprintf(score, sizeof score, "%.6f", h.logprob);
          out += std::to_string(i) + " ||| " + render(i, h) + " ||| " + score;
          if (o_.attention) out += " ||| " + format_attention(h, stored_heads_);
          out += '\n';
        }
      } else {
        if (!results_[i].empty()) {
          out += render(i, results_[i].front());
          if (o_.attention) out += " ||| " + format_attention(results_[i].front(), stored_heads_);
        }
        out += '\n';
      }
      if (out.size() > (1 << 16) || i + 1 == sources_.size()) {
        write_text(f, out);
        out.clear();
      }
    }
  }

  // One JSON object per translated line: pieces and attention[head][target step][source].
  void write_attention(std::FILE* f) const {
    for (size_t i = 0; i < sources_.size(); ++i) {
      if (results_[i].empty()) continue;
      const Hypothesis& h = results_[i].front();
      nlohmann::json line;
      line["line"] = i;
      line["source"] = o_.ids ? nlohmann::json(sources_[i].ids)
                              : nlohmann::json(source_vocabulary_->to_pieces(lines_[i]));
      nlohmann::json target = nlohmann::json::array();
      for (int32_t id : h.tokens)
        target.push_back(o_.ids ? nlohmann::json(id)
                                : nlohmann::json(target_vocabulary_->piece(id)));
      if (h.finished_with_eos) target.push_back("</s>");
      line["target"] = target;
      line["layer"] =
          o_.search.attention_layer < 0 ? config_.decoder_layers - 1 : o_.search.attention_layer;
      nlohmann::json heads = nlohmann::json::array();
      for (int64_t head = 0; head < config_.heads; ++head) {
        nlohmann::json rows = nlohmann::json::array();
        for (const auto& step : h.attention) {
          const size_t width = step.size() / size_t(config_.heads);
          rows.push_back(std::vector<float>(step.begin() + long(head * width),
                                            step.begin() + long((head + 1) * width)));
        }
        heads.push_back(rows);
      }
      line["attention"] = heads;
      write_text(f, line.dump() + "\n");
    }
  }

  TranslateOptions o_;
  const Backend& backend_;
  ModelBundle bundle_;
  const ModelConfig& config_;
  const Vocabulary* source_vocabulary_;  // null with --ids
  const Vocabulary* target_vocabulary_;
  int64_t stored_heads_ = 1;  // attention kept per hypothesis step: 1 (mean) or every head
  std::string where_;         // the input's name in messages
  std::vector<std::string> lines_;
  std::vector<std::vector<int32_t>> prefixes_;    // per line, or none
  std::vector<Source> sources_;                   // per line
  std::vector<std::vector<Hypothesis>> results_;  // per line: the n best, or none
};

void run_translate(TranslateOptions o) {
  Translation(std::move(o)).run();
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
