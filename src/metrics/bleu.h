// Corpus BLEU and chrF, computed exactly as sacreBLEU 2.x does (Post, 2018): the same
// tokenizers (13a, intl, char, none), the same n-gram statistics, smoothing, brevity penalty
// and chrF averaging, on UTF-8 text treated as Unicode code points (as Python strings are).
//
// sacreBLEU semantics reproduced here, for reference:
//  - BLEU preprocessing: optional Python-style lowercasing, then rstrip, then the tokenizer;
//    tokens are the whitespace-separated pieces of the tokenizer's output.
//  - Matches are clipped by the maximum count of the n-gram over the references; the reference
//    length is the closest one to the hypothesis length (ties: the shorter).
//  - An empty reference line is a reference like any other (the empty string): sacreBLEU ≥ 2.2
//    drops only undefined (None) references, which text files cannot hold, so every stream
//    counts for every segment (reference_count below).
//  - chrF: character n-grams (orders 1..char_order) with whitespace removed; per segment the
//    reference with the best sentence-level F wins; corpus statistics are summed, then
//    precision and recall are averaged over the orders that have n-grams on both sides.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tfm {

// ---- Unicode helpers (UTF-8 in and out) ----

// Python's str.rstrip(): trailing Unicode whitespace (str.isspace()) removed.
std::string rstrip_whitespace(const std::string& text);

// Python's str.lower() (full Unicode case mapping, final sigma). Throws Error on bad UTF-8.
std::string unicode_lowercase(const std::string& text);

// ---- Tokenizers: each returns exactly what sacreBLEU's tokenizer returns for `line` ----

enum class BleuTokenizer { k13a, kIntl, kChar, kNone };

// "13a", "intl", "char" or "none"; anything else throws Error listing the choices.
BleuTokenizer parse_bleu_tokenizer(const std::string& name);
const char* bleu_tokenizer_name(BleuTokenizer tokenizer);

// mteval-v13a.pl tokenization (sacreBLEU Tokenizer13a): unescapes &quot; &amp; &lt; &gt;,
// splits off ASCII punctuation and symbols, periods and commas except next to digits, and a
// dash after a digit; single spaces between tokens.
std::string tokenize_13a(const std::string& line);
// mteval-v14.pl international tokenization (sacreBLEU TokenizerV14International): splits
// off Unicode punctuation (\p{P}) unless a number (\p{N}) is on both sides of it, and every
// symbol (\p{S}).
std::string tokenize_intl(const std::string& line);
// Every code point separated by a space (sacreBLEU TokenizerChar; spaces stay as they are).
std::string tokenize_char(const std::string& line);
std::string tokenize(const std::string& line, BleuTokenizer tokenizer);

// ---- BLEU ----

enum class BleuSmoothing { kNone, kFloor, kAddK, kExp };

struct BleuOptions {
  BleuTokenizer tokenizer = BleuTokenizer::k13a;
  bool lowercase = false;
  BleuSmoothing smoothing = BleuSmoothing::kExp;  // sacreBLEU's default
  std::optional<double> smooth_value;             // unset: floor 0.1, add-k 1
  int max_ngram_order = 4;
  bool effective_order = false;  // sacreBLEU turns it on only for sentence-level BLEU
};

struct BleuScore {
  double score = 0;                // 0..100
  std::vector<int64_t> counts;     // clipped n-gram matches per order
  std::vector<int64_t> totals;     // hypothesis n-grams per order
  std::vector<double> precisions;  // per order, 0..100, after smoothing
  double bp = 0;                   // brevity penalty
  double ratio = 0;                // hyp_len / ref_len (0 when ref_len is 0)
  int64_t hyp_len = 0;
  int64_t ref_len = 0;

  // sacreBLEU's line: "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17
  // ref_len = 18)".
  std::string format() const;
  // The part after the score: "82.4/50.0/45.5/37.5 (BP = ... ref_len = 18)".
  std::string verbose() const;
};

// BLEU from summed statistics (sacreBLEU's BLEU.compute_bleu; counts/totals have
// options.max_ngram_order entries).
BleuScore compute_bleu(const std::vector<int64_t>& counts, const std::vector<int64_t>& totals,
                       int64_t hyp_len, int64_t ref_len, const BleuOptions& options = {});

// Corpus BLEU of `hypotheses` against one or more reference streams, each with one line per
// hypothesis. Throws Error if a stream has a different length or a segment has no reference.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const BleuOptions& options = {});

// ---- chrF ----

struct ChrfOptions {
  int char_order = 6;
  int beta = 2;
  bool lowercase = false;
  bool whitespace = false;     // keep whitespace inside character n-grams
  bool eps_smoothing = false;  // chrF++.py-style averaging instead of sacreBLEU's effective order
};

struct ChrfScore {
  double score = 0;  // 0..100
  int beta = 2;
  std::string name() const;    // "chrF2"
  std::string format() const;  // "chrF2 = 59.73"
};

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const ChrfOptions& options = {});

// ---- Signatures (sacreBLEU's reproducibility strings) ----

// The sacreBLEU release whose default behaviour this implementation reproduces; it is the
// `version:` field of the signatures.
inline constexpr const char* kSacrebleuVersion = "2.5.1";

// The number of references per segment as sacreBLEU's signature writes it. Every stream counts
// for every segment, empty lines included: sacreBLEU ≥ 2.2 drops only undefined (None)
// references, which text files cannot hold.
std::string reference_count(const std::vector<std::vector<std::string>>& references);

// "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
std::string bleu_signature(const BleuOptions& options, const std::string& nrefs);
// "nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.5.1"
std::string chrf_signature(const ChrfOptions& options, const std::string& nrefs);

}  // namespace tfm
