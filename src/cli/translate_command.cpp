// `transformer translate`: reads sentences (stdin or --input), translates them through the
// library's Translator (api/translator.h: length-sorted batches, greedy or beam search), and
// writes one line per input in input order (or --nbest lines `index ||| hypothesis ||| score`).
// Empty lines give empty lines.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "api/translator.h"
#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "cli/output_overwrite.h"
#include "cli/progress.h"
#include "cli/search_options.h"
#include "io/model_directory.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "text/corpus.h"
#include "text/vocabulary.h"

namespace tfm {

Translator open_translator_for_text_or_ids(const std::string& model,
                                           const TranslatorOptions& options) {
  try {
    return Translator(model, options);
  } catch (const MissingVocabulary& e) {
    throw Error(std::string(e.what()) + ", or use --ids for token ids");
  }
}

namespace {

struct TranslateOptions {
  std::string model, input = "-", output;
  bool ids = false;
  SearchFlags decoding;  // --beam, --alpha, length limits, --device, --compute-type
  int64_t nbest = 0;     // 0: plain output
  int64_t batch_tokens = kDefaultMaxBatchTokens;
  std::string prefix, prefix_file;
  bool replace_unknowns = false;
  bool attention = false;
  std::string attention_file;  // JSON lines with every head of one layer
};

std::string format_attention(const TranslationHypothesis& h) {
  std::string out;
  char buffer[32];
  for (size_t t = 0; t < h.attention.size(); ++t) {
    if (t) out += ' ';
    for (size_t j = 0; j < h.attention[t].size(); ++j) {
      std::snprintf(buffer, sizeof buffer, j ? ",%.4f" : "%.4f", double(h.attention[t][j]));
      out += buffer;
    }
  }
  return out;
}

// One `translate` run in named steps: the model (a Translator), the input lines and their
// prefixes, the translation, then the output file and the attention file.
class Translation {
 public:
  explicit Translation(TranslateOptions options)
      : o_(std::move(options)),
        translator_(open_translator_for_text_or_ids(o_.model, translator_options())) {
    t_ = o_.decoding.search;
    o_.decoding.check();
    if (o_.nbest > t_.beam_size && !samples(t_))
      throw UsageError("--nbest cannot exceed --beam (when sampling it is the draws of each line)");
    if (o_.replace_unknowns && o_.ids)
      throw UsageError("--replace-unknowns needs text input, not --ids");
    if (!o_.prefix.empty() && !o_.prefix_file.empty())
      throw UsageError("give --prefix or --prefix-file, not both");
    if (!o_.attention_file.empty() && !o_.output.empty() && o_.output != "-" &&
        same_file(o_.attention_file, o_.output))
      throw UsageError("--attention-file and -o name the same file (" + o_.output + ")");
    refuse_output_over_input("-o", o_.output, {o_.input, o_.prefix_file});
    refuse_output_over_input("--attention-file", o_.attention_file, {o_.input, o_.prefix_file});
    t_.num_hypotheses = std::max<int64_t>(o_.nbest, 1);
    t_.max_batch_tokens = o_.batch_tokens;
    t_.return_attention = o_.attention;
    t_.return_attention_heads = !o_.attention_file.empty();
    t_.replace_unknowns = o_.replace_unknowns;
    translator_.check_options(t_);  // before the input is read
  }

  void run() {
    where_ = o_.input == "-" ? "stdin" : o_.input;
    lines_ = read_lines(o_.input);
    read_prefixes();
    translate();
    warn_about_long_lines();
    write_output(o_.output, [&](std::FILE* f) { write_translations(f); });
    if (!o_.attention_file.empty())
      write_file_atomically(o_.attention_file, [&](std::FILE* f) { write_attention(f); });
  }

 private:
  TranslatorOptions translator_options() const {
    TranslatorOptions t = o_.decoding.translator_options();
    t.need_vocabulary = !o_.ids;
    return t;
  }

  // Target prefixes, as text lines (or id lines with --ids): one for all lines (--prefix), or
  // one per line (--prefix-file).
  void read_prefixes() {
    if (!o_.prefix.empty()) {
      if (!o_.ids && !is_valid_utf8(o_.prefix)) throw Error("--prefix: invalid UTF-8");
      prefixes_.assign(lines_.size(), o_.prefix);
    } else if (!o_.prefix_file.empty()) {
      prefixes_ = read_lines(o_.prefix_file);
      if (prefixes_.size() != lines_.size())
        throw Error(o_.prefix_file + " has " + std::to_string(prefixes_.size()) + " lines but " +
                    where_ + " has " + std::to_string(lines_.size()));
    }
  }

  void translate() {
    const int64_t count = int64_t(lines_.size());
    Progress progress("translate", count);
    auto update = [&](int64_t done) { progress.update(done); };
    if (o_.ids) {
      const ModelConfig& config = translator_.config();
      std::vector<std::vector<int32_t>> sources, prefixes;
      for (size_t i = 0; i < lines_.size(); ++i)
        sources.push_back(parse_id_line(lines_[i], config.src_vocab_size, where_, int64_t(i) + 1));
      const std::string prefix_where = o_.prefix.empty() ? o_.prefix_file : "--prefix";
      for (size_t i = 0; i < prefixes_.size(); ++i)
        prefixes.push_back(parse_id_line(prefixes_[i], config.tgt_vocab_size, prefix_where,
                                         o_.prefix.empty() ? int64_t(i) + 1 : 1));
      results_ = translator_.translate_ids(sources, t_, prefixes, update);
    } else {
      results_ = translator_.translate_batch(lines_, t_, prefixes_, update);
    }
    progress.finish(count);
  }

  // A line too long for the model's positions is left untranslated, with a warning.
  void warn_about_long_lines() const {
    for (size_t i = 0; i < results_.size(); ++i)
      if (results_[i].hypotheses.empty() && translator_.too_long(results_[i].source_tokens))
        std::fprintf(stderr,
                     "warning: %s:%zu: %lld tokens exceed the model's limit of %lld; writing an "
                     "empty line\n",
                     where_.c_str(), i + 1, (long long)results_[i].source_tokens,
                     (long long)max_source_tokens(translator_.config()));
  }

  std::string render(const TranslationHypothesis& h) const {
    if (!o_.ids) return h.text;
    std::string text;
    for (int32_t id : h.ids) text += (text.empty() ? "" : " ") + std::to_string(id);
    return text;
  }

  // One line per input line, in input order, or --nbest lines `index ||| text ||| score`.
  void write_translations(std::FILE* f) const {
    std::string out;
    char score[32];
    for (size_t i = 0; i < results_.size(); ++i) {
      const auto& hypotheses = results_[i].hypotheses;
      if (o_.nbest > 0) {
        // A line that was not translated (empty, or too long) has no entries: an empty
        // hypothesis with a log-probability would claim a translation that never happened.
        for (const TranslationHypothesis& h : hypotheses) {
          std::snprintf(score, sizeof score, "%.6f", h.log_prob);
          out += std::to_string(i) + " ||| " + render(h) + " ||| " + score;
          if (o_.attention) out += " ||| " + format_attention(h);
          out += '\n';
        }
      } else {
        if (!hypotheses.empty()) {
          out += render(hypotheses.front());
          if (o_.attention) out += " ||| " + format_attention(hypotheses.front());
        }
        out += '\n';
      }
      if (out.size() > (1 << 16) || i + 1 == results_.size()) {
        write_text(f, out);
        out.clear();
      }
    }
  }

  // One JSON object per translated line: pieces and attention[head][target step][source].
  void write_attention(std::FILE* f) const {
    const ModelConfig& config = translator_.config();
    for (size_t i = 0; i < results_.size(); ++i) {
      if (results_[i].hypotheses.empty()) continue;
      const TranslationHypothesis& h = results_[i].hypotheses.front();
      nlohmann::json line;
      line["line"] = i;
      if (o_.ids)
        line["source"] = parse_id_line(lines_[i], config.src_vocab_size, where_, int64_t(i) + 1);
      else
        line["source"] = translator_.source_vocabulary()->to_pieces(lines_[i]);
      nlohmann::json target = o_.ids ? nlohmann::json(h.ids) : nlohmann::json(h.tokens);
      if (h.finished_with_eos) target.push_back("</s>");
      line["target"] = target;
      line["layer"] = t_.attention_layer < 0 ? config.decoder_layers - 1 : t_.attention_layer;
      line["attention"] = h.attention_heads;
      write_text(f, line.dump() + "\n");
    }
  }

  TranslateOptions o_;
  Translator translator_;
  TranslationOptions t_;
  std::string where_;  // the input's name in messages
  std::vector<std::string> lines_;
  std::vector<std::string> prefixes_;       // per line (text, or ids with --ids), or none
  std::vector<TranslationResult> results_;  // per line: the n best, or none
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
  app.add_option(
         "--batch-tokens", o->batch_tokens,
         with_default("Budget per batch: sentences × longest source × beam", o->batch_tokens))
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
         "(default -1: the last)")
      ->check(at_least(-1));
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
