// `transformer bleu`: corpus BLEU and chrF of a hypothesis file against one or more reference
// files, with sacreBLEU 2.x's defaults and output (text/bleu.h). Lines are read as sacreBLEU's
// command line reads them: UTF-8, trailing whitespace removed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/output_overwrite.h"
#include "metrics/bleu.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "text/corpus.h"
#include "text/vocabulary.h"

namespace tfm {

namespace {

struct BleuCommandOptions {
  std::vector<std::string> refs;
  std::string input = "-";
  std::string tokenize = "13a";
  std::vector<std::string> metrics = {"bleu", "chrf"};
  std::string output;
  bool lowercase = false;
  bool json = false;
};

std::string display_name(const std::string& path) {
  return path == "-" ? "stdin" : path;
}

// The lines of `path` (read_lines: UTF-8, no NUL, BOM dropped), each with trailing whitespace
// removed.
std::vector<std::string> read_text(const std::string& path) {
  std::vector<std::string> lines = read_lines(path);
  // sacreBLEU's command line applies Python's str.rstrip() to every line it reads.
  for (std::string& line : lines) line = rstrip_whitespace(line);
  return lines;
}

void run_bleu(const BleuCommandOptions& o) {
  int stdin_uses = o.input == "-" ? 1 : 0;
  for (const auto& ref : o.refs) stdin_uses += ref == "-" ? 1 : 0;
  if (stdin_uses > 1)
    throw UsageError("stdin (-) can be read only once: give the hypotheses with --input FILE");
  std::vector<std::string> inputs = o.refs;
  inputs.push_back(o.input);
  refuse_output_over_input("-o", o.output, inputs);
  const bool want_bleu = std::find(o.metrics.begin(), o.metrics.end(), "bleu") != o.metrics.end();
  const bool want_chrf = std::find(o.metrics.begin(), o.metrics.end(), "chrf") != o.metrics.end();

  const std::vector<std::string> hypotheses = read_text(o.input);
  std::vector<std::vector<std::string>> references;
  for (const auto& ref : o.refs) {
    references.push_back(read_text(ref));
    if (references.back().size() != hypotheses.size())
      throw Error(display_name(o.input) + " has " + std::to_string(hypotheses.size()) +
                  " lines but " + display_name(ref) + " has " +
                  std::to_string(references.back().size()) +
                  " (hypotheses and references must match line for line)");
  }
  if (hypotheses.empty()) throw Error(display_name(o.input) + " has no lines: nothing to score");

  BleuOptions bleu_options;
  bleu_options.tokenizer = parse_bleu_tokenizer(o.tokenize);
  bleu_options.lowercase = o.lowercase;
  const ChrfOptions chrf_options;  // sacreBLEU's CHRF defaults: case-sensitive, nc 6, beta 2
  const std::string nrefs = reference_count(references);

  std::string text;
  if (o.json) {
    nlohmann::ordered_json chrf_json;
    if (want_chrf) {
      const ChrfScore chrf = corpus_chrf(hypotheses, references, chrf_options);
      chrf_json["name"] = chrf.name();
      chrf_json["score"] = chrf.score;
      chrf_json["signature"] = chrf_signature(chrf_options, nrefs);
    }
    nlohmann::ordered_json result;
    if (want_bleu) {
      const BleuScore bleu = corpus_bleu(hypotheses, references, bleu_options);
      result["name"] = "BLEU";
      result["score"] = bleu.score;
      result["signature"] = bleu_signature(bleu_options, nrefs);
      result["verbose_score"] = bleu.verbose();
      result["precisions"] = bleu.precisions;
      result["counts"] = bleu.counts;
      result["totals"] = bleu.totals;
      result["bp"] = bleu.bp;
      result["ratio"] = bleu.ratio;
      result["hyp_len"] = bleu.hyp_len;
      result["ref_len"] = bleu.ref_len;
      result["nrefs"] = nrefs;
      result["case"] = o.lowercase ? "lc" : "mixed";
      result["eff"] = "no";
      result["tok"] = o.tokenize;
      result["smooth"] = "exp";
      result["version"] = kSacrebleuVersion;
      if (want_chrf) result["chrf"] = chrf_json;
    } else {
      result = chrf_json;
    }
    text = result.dump(1) + "\n";
  } else {
    if (want_bleu) text += corpus_bleu(hypotheses, references, bleu_options).format() + "\n";
    if (want_chrf) text += corpus_chrf(hypotheses, references, chrf_options).format() + "\n";
  }

  auto write = [&](std::FILE* f) { write_text(f, text); };
  write_output(o.output, write);
}

}  // namespace

CommandRunner add_bleu_command(CLI::App& app) {
  auto o = std::make_shared<BleuCommandOptions>();
  app.add_option(
         "-r,--ref", o->refs,
         "Reference file, one sentence per line; for several references repeat --ref or list "
         "the files after it (an empty line is an empty reference, as in sacreBLEU 2.2 and "
         "later)")
      ->required();
  app.add_option("-i,--input", o->input,
                 "Hypotheses (system output), one per line, same line count as each reference "
                 "(default: stdin)");
  app.add_option("-t,--tokenize", o->tokenize,
                 "BLEU tokenizer: 13a (default, mteval-v13a as WMT), intl (mteval-v14 "
                 "international: Unicode punctuation and symbols), char (every character), "
                 "none (split on whitespace only)")
      ->check(CLI::IsMember({"13a", "intl", "char", "none"}));
  app.add_flag("--lowercase", o->lowercase,
               "Lowercase hypotheses and references before BLEU (case:lc); chrF stays "
               "case-sensitive, as in sacreBLEU");
  app.add_option("-m,--metrics", o->metrics,
                 "Metrics to report, comma-separated: bleu, chrf (default: bleu,chrf)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bleu", "chrf"}));
  app.add_flag("--json", o->json,
               "Print one JSON object: BLEU's name, score, precisions, bp, ratio, hyp_len, "
               "ref_len, counts, totals and sacreBLEU-style signature, with chrF under \"chrf\" "
               "(with --metrics chrf alone: the chrF object)");
  app.add_option("-o,--output", o->output, "Write the result here (atomically) instead of stdout");
  app.footer(
      "Scores are sacreBLEU 2.x's defaults: corpus BLEU with n-grams up to 4, matches clipped by\n"
      "the most frequent occurrence in any reference, exponential smoothing, brevity penalty\n"
      "from the closest reference length (ties: the shorter); chrF2 with character n-grams up to\n"
      "6 and whitespace ignored. Text is UTF-8; trailing whitespace on a line is ignored.\n"
      "Output: BLEU = score p1/p2/p3/p4 (BP = .. ratio = .. hyp_len = .. ref_len = ..), then\n"
      "chrF2 = score.\n"
      "Examples:\n"
      "  transformer bleu --ref newstest.de --input output.de\n"
      "  cat output.de | transformer bleu --ref ref1.de --ref ref2.de\n"
      "  transformer bleu --ref ref.txt -i hyp.txt --tokenize intl --metrics bleu --json");
  return [o] { run_bleu(*o); };
}

}  // namespace tfm
