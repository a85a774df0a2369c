// sacreBLEU-compatible BLEU and chrF. Text is decoded to code points (std::u32string) so that
// every rule sees what Python's str sees: the regular-expression rules of the tokenizers are
// fixed-width, so each is applied as one left-to-right scan with non-overlapping matches,
// exactly as re.sub does; "whitespace" is Python's str.isspace(); Unicode general categories
// and lowercasing come from ICU.
#include "metrics/bleu.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>
#include <unordered_map>

#include "tensor/error.h"

namespace tfm {

namespace {

// ---- UTF-8 <-> code points ----

bool decode_utf8(const std::string& text, std::u32string& out) {
  out.clear();
  out.reserve(text.size());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t len;
    char32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out.push_back(cp);
    i += len;
  }
  return true;
}

std::u32string decode_or_throw(const std::string& text) {
  std::u32string out;
  if (!decode_utf8(text, out)) throw Error("text is not valid UTF-8");
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_utf8(out, cp);
  return out;
}

// ---- character classes ----

// Python's str.isspace(): the separators of str.split() and str.rstrip().
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_ascii_digit(char32_t c) {
  return c >= U'0' && c <= U'9';
}

// \p{P}, \p{S}, \p{N}: Unicode general categories.
bool is_punctuation(char32_t c) {
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_P_MASK) != 0;
}
bool is_symbol(char32_t c) {
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_S_MASK) != 0;
}
bool is_number(char32_t c) {
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_N_MASK) != 0;
}

// ---- string operations with Python semantics ----

// str.split() with no argument.
std::vector<std::u32string> split_whitespace(const std::u32string& s) {
  std::vector<std::u32string> pieces;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    const size_t begin = i;
    while (i < s.size() && !is_space(s[i])) ++i;
    if (i > begin) pieces.emplace_back(s, begin, i - begin);
  }
  return pieces;
}

// ' '.join(s.split())
std::u32string normalize_spaces(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (const auto& piece : split_whitespace(s)) {
    if (!out.empty()) out.push_back(U' ');
    out += piece;
  }
  return out;
}

// str.rstrip() with no argument.
std::u32string rstrip(std::u32string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// str.replace(from, to): non-overlapping, left to right.
std::u32string replace_all(const std::u32string& s, const std::u32string& from,
                           const std::u32string& to) {
  std::u32string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::u32string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::u32string::npos);
  return out;
}

// re.sub of a two-character pattern (first)(second) -> replacement(first, second): scans left
// to right, a match consumes both characters, unmatched characters are copied.
template <class First, class Second, class Emit>
std::u32string substitute_pairs(const std::u32string& s, First first, Second second, Emit emit) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && first(s[i]) && second(s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i]);
      ++i;
    }
  }
  return out;
}

// re.sub of a one-character pattern (c) -> " c ".
template <class Match>
std::u32string pad_characters(const std::u32string& s, Match match) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  for (char32_t c : s) {
    if (match(c)) {
      out.push_back(U' ');
      out.push_back(c);
      out.push_back(U' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// "\1 \2 " and " \1 \2"
void emit_split_after_first(std::u32string& out, char32_t a, char32_t b) {
  out.push_back(a);
  out.push_back(U' ');
  out.push_back(b);
  out.push_back(U' ');
}
void emit_split_before_both(std::u32string& out, char32_t a, char32_t b) {
  out.push_back(U' ');
  out.push_back(a);
  out.push_back(U' ');
  out.push_back(b);
}

// ---- tokenizers on code points ----

std::u32string tokenize_13a_u32(std::u32string line) {
  // Language-independent part of mteval-v13a.pl.
  line = replace_all(line, U"<skipped>", U"");
  line = replace_all(line, U"-\n", U"");
  line = replace_all(line, U"\n", U" ");
  if (line.find(U'&') != std::u32string::npos) {
    line = replace_all(line, U"&quot;", U"\"");
    line = replace_all(line, U"&amp;", U"&");
    line = replace_all(line, U"&lt;", U"<");
    line = replace_all(line, U"&gt;", U">");
  }
  line = U" " + line + U" ";
  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 ": ASCII punctuation and symbols except ' , - .
  line = pad_characters(line, [](char32_t c) {
    return (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
           (c >= 0x28 && c <= 0x2B) || (c >= 0x3A && c <= 0x40) || c == U'/';
  });
  auto period_comma = [](char32_t c) { return c == U'.' || c == U','; };
  auto non_digit = [](char32_t c) { return !is_ascii_digit(c); };
  // ([^0-9])([\.,]) -> "\1 \2 ": period and comma unless preceded by a digit.
  line = substitute_pairs(line, non_digit, period_comma, emit_split_after_first);
  // ([\.,])([^0-9]) -> " \1 \2": period and comma unless followed by a digit.
  line = substitute_pairs(line, period_comma, non_digit, emit_split_before_both);
  // ([0-9])(-) -> "\1 \2 ": dash after a digit.
  line = substitute_pairs(
      line, is_ascii_digit, [](char32_t c) { return c == U'-'; }, emit_split_after_first);
  return normalize_spaces(line);
}

std::u32string tokenize_intl_u32(const std::u32string& input) {
  auto non_number = [](char32_t c) { return !is_number(c); };
  // (\P{N})(\p{P}) -> "\1 \2 "
  std::u32string line = substitute_pairs(input, non_number, is_punctuation, emit_split_after_first);
  // (\p{P})(\P{N}) -> " \1 \2"
  line = substitute_pairs(line, is_punctuation, non_number, emit_split_before_both);
  // (\p{S}) -> " \1 "
  line = pad_characters(line, is_symbol);
  return normalize_spaces(line);
}

std::u32string tokenize_char_u32(const std::u32string& line) {
  std::u32string out;
  out.reserve(line.size() * 2);
  for (size_t i = 0; i < line.size(); ++i) {
    if (i > 0) out.push_back(U' ');
    out.push_back(line[i]);
  }
  return out;
}

std::u32string tokenize_u32(const std::u32string& line, BleuTokenizer tokenizer) {
  switch (tokenizer) {
    case BleuTokenizer::k13a:
      return tokenize_13a_u32(line);
    case BleuTokenizer::kIntl:
      return tokenize_intl_u32(line);
    case BleuTokenizer::kChar:
      return tokenize_char_u32(line);
    case BleuTokenizer::kNone:
      return line;
  }
  return line;
}

// ---- shared corpus plumbing ----

void check_streams(size_t num_hypotheses, const std::vector<std::vector<std::string>>& references) {
  if (references.empty()) throw Error("no reference stream given");
  for (size_t s = 0; s < references.size(); ++s)
    if (references[s].size() != num_hypotheses)
      throw Error("reference stream " + std::to_string(s + 1) + " has " +
                  std::to_string(references[s].size()) + " segments but there are " +
                  std::to_string(num_hypotheses) + " hypotheses");
}

// The references of segment i. An empty line is a reference like any other (sacreBLEU ≥ 2.2:
// its length 0 takes part in the brevity penalty; it has no n-grams to match).
std::vector<const std::string*> segment_references(
    const std::vector<std::vector<std::string>>& references, size_t i) {
  std::vector<const std::string*> refs;
  for (const auto& stream : references) refs.push_back(&stream[i]);
  return refs;
}

// ---- BLEU internals ----

// A segment after preprocessing: its tokens joined by single spaces, and where each token is.
// An n-gram is then a view of `text` from its first token's start to its last token's end.
struct TokenizedSegment {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each token in `text`

  std::string_view ngram(size_t first, size_t n) const {
    return std::string_view(text).substr(spans[first].first,
                                         spans[first + n - 1].second - spans[first].first);
  }
};

// Lowercase (optional), rstrip, tokenize, split on whitespace.
TokenizedSegment bleu_segment(const std::string& input, const BleuOptions& options) {
  const std::string cased = options.lowercase ? unicode_lowercase(input) : input;
  const std::u32string tokenized = tokenize_u32(rstrip(decode_or_throw(cased)), options.tokenizer);
  TokenizedSegment segment;
  for (const auto& token : split_whitespace(tokenized)) {
    if (!segment.text.empty()) segment.text.push_back(' ');
    const size_t begin = segment.text.size();
    segment.text += encode_utf8(token);
    segment.spans.emplace_back(begin, segment.text.size());
  }
  return segment;
}

// Counts of the segment's n-grams, orders 1..max_order; the keys view segment.text.
using NgramCounts = std::vector<std::unordered_map<std::string_view, int64_t>>;  // [order - 1]

NgramCounts word_ngrams(const TokenizedSegment& segment, int max_order) {
  NgramCounts counts(static_cast<size_t>(max_order));
  const size_t length = segment.spans.size();
  for (size_t n = 1; n <= size_t(max_order); ++n)
    for (size_t i = 0; i + n <= length; ++i) ++counts[n - 1][segment.ngram(i, n)];
  return counts;
}

double smoothing_default(BleuSmoothing smoothing) {
  switch (smoothing) {
    case BleuSmoothing::kFloor:
      return 0.1;
    case BleuSmoothing::kAddK:
      return 1.0;
    default:
      return 0.0;
  }
}

// sacreBLEU's my_log: log with log(0) floored to -9999999999.
double floored_log(double x) {
  return x == 0.0 ? -9999999999.0 : std::log(x);
}

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

// ---- chrF internals ----

// The characters chrF counts: optionally lowercased, whitespace removed unless kept.
std::u32string chrf_text(const std::string& input, const ChrfOptions& options) {
  const std::string cased = options.lowercase ? unicode_lowercase(input) : input;
  std::u32string text = decode_or_throw(cased);
  if (options.whitespace) return text;
  std::u32string joined;
  for (const auto& piece : split_whitespace(text)) joined += piece;
  return joined;
}

// Character n-gram counts, orders 1..order; the keys view `text`.
using CharNgrams = std::vector<std::unordered_map<std::u32string_view, int64_t>>;  // [order - 1]

CharNgrams char_ngrams(const std::u32string& text, int order) {
  CharNgrams counts(static_cast<size_t>(order));
  const std::u32string_view view(text);
  for (size_t n = 1; n <= size_t(order); ++n)
    for (size_t i = 0; i + n <= text.size(); ++i) ++counts[n - 1][view.substr(i, n)];
  return counts;
}

// sacreBLEU's CHRF._compute_f_score over [hyp, ref, match] triples per order.
double chrf_f_score(const std::vector<int64_t>& stats, const ChrfOptions& options) {
  const double eps = 1e-16;
  const int order = options.char_order;
  const double factor = double(options.beta) * double(options.beta);
  double score = 0.0, avg_prec = 0.0, avg_rec = 0.0;
  int effective_order = 0;
  for (int i = 0; i < order; ++i) {
    const int64_t n_hyp = stats[size_t(3 * i)];
    const int64_t n_ref = stats[size_t(3 * i + 1)];
    const int64_t n_match = stats[size_t(3 * i + 2)];
    const double prec = n_hyp > 0 ? double(n_match) / double(n_hyp) : eps;
    const double rec = n_ref > 0 ? double(n_match) / double(n_ref) : eps;
    const double denom = factor * prec + rec;
    score += denom > 0 ? (1 + factor) * prec * rec / denom : eps;
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective_order;
    }
  }
  if (options.eps_smoothing) return 100 * score / order;
  if (effective_order == 0) {
    avg_prec = avg_rec = 0.0;
  } else {
    avg_prec /= effective_order;
    avg_rec /= effective_order;
  }
  if (avg_prec + avg_rec != 0.0) {
    score = (1 + factor) * avg_prec * avg_rec;
    score /= (factor * avg_prec) + avg_rec;
    return 100 * score;
  }
  return 0.0;
}

}  // namespace

// ---- public: Unicode ----

std::string rstrip_whitespace(const std::string& text) {
  return encode_utf8(rstrip(decode_or_throw(text)));
}

std::string unicode_lowercase(const std::string& text) {
  std::u32string scratch;
  if (!decode_utf8(text, scratch)) throw Error("text is not valid UTF-8");
  if (std::all_of(text.begin(), text.end(), [](char c) { return (unsigned char)c < 0x80; })) {
    std::string out = text;
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  int32_t utf16_len = 0;
  u_strFromUTF8(nullptr, 0, &utf16_len, text.data(), int32_t(text.size()), &status);
  std::vector<UChar> utf16(size_t(utf16_len) + 1);
  status = U_ZERO_ERROR;
  u_strFromUTF8(utf16.data(), int32_t(utf16.size()), &utf16_len, text.data(), int32_t(text.size()),
                &status);
  if (U_FAILURE(status)) throw Error(std::string("lowercasing failed: ") + u_errorName(status));
  // Root locale: no Turkish / Lithuanian special cases, as Python's str.lower().
  status = U_ZERO_ERROR;
  int32_t lower_len = u_strToLower(nullptr, 0, utf16.data(), utf16_len, "", &status);
  std::vector<UChar> lower(size_t(lower_len) + 1);
  status = U_ZERO_ERROR;
  u_strToLower(lower.data(), int32_t(lower.size()), utf16.data(), utf16_len, "", &status);
  if (U_FAILURE(status)) throw Error(std::string("lowercasing failed: ") + u_errorName(status));
  int32_t utf8_len = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &utf8_len, lower.data(), lower_len, &status);
  std::string out(size_t(utf8_len), '\0');
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), int32_t(out.size()), &utf8_len, lower.data(), lower_len, &status);
  if (U_FAILURE(status) && status != U_STRING_NOT_TERMINATED_WARNING)
    throw Error(std::string("lowercasing failed: ") + u_errorName(status));
  return out;
}

// ---- public: tokenizers ----

BleuTokenizer parse_bleu_tokenizer(const std::string& name) {
  if (name == "13a") return BleuTokenizer::k13a;
  if (name == "intl") return BleuTokenizer::kIntl;
  if (name == "char") return BleuTokenizer::kChar;
  if (name == "none") return BleuTokenizer::kNone;
  throw Error("unknown tokenizer \"" + name + "\" (choose 13a, intl, char or none)");
}

const char* bleu_tokenizer_name(BleuTokenizer tokenizer) {
  switch (tokenizer) {
    case BleuTokenizer::k13a:
      return "13a";
    case BleuTokenizer::kIntl:
      return "intl";
    case BleuTokenizer::kChar:
      return "char";
    case BleuTokenizer::kNone:
      return "none";
  }
  return "?";
}

std::string tokenize_13a(const std::string& line) {
  return encode_utf8(tokenize_13a_u32(decode_or_throw(line)));
}
std::string tokenize_intl(const std::string& line) {
  return encode_utf8(tokenize_intl_u32(decode_or_throw(line)));
}
std::string tokenize_char(const std::string& line) {
  return encode_utf8(tokenize_char_u32(decode_or_throw(line)));
}
std::string tokenize(const std::string& line, BleuTokenizer tokenizer) {
  return encode_utf8(tokenize_u32(decode_or_throw(line), tokenizer));
}

// ---- public: BLEU ----

std::string BleuScore::verbose() const {
  std::string out;
  for (size_t i = 0; i < precisions.size(); ++i) {
    if (i > 0) out += '/';
    out += format_fixed(precisions[i], 1);
  }
  out += " (BP = " + format_fixed(bp, 3) + " ratio = " + format_fixed(ratio, 3) +
         " hyp_len = " + std::to_string(hyp_len) + " ref_len = " + std::to_string(ref_len) + ")";
  return out;
}

std::string BleuScore::format() const {
  return "BLEU = " + format_fixed(score, 2) + " " + verbose();
}

BleuScore compute_bleu(const std::vector<int64_t>& counts, const std::vector<int64_t>& totals,
                       int64_t hyp_len, int64_t ref_len, const BleuOptions& options) {
  const int max_order = options.max_ngram_order;
  if (max_order < 1) throw Error("BLEU n-gram order must be at least 1");
  if (counts.size() != size_t(max_order) || totals.size() != size_t(max_order))
    throw Error("BLEU statistics must have one count and one total per n-gram order");
  BleuScore result;
  result.counts = counts;
  result.totals = totals;
  result.hyp_len = hyp_len;
  result.ref_len = ref_len;
  result.ratio = ref_len != 0 ? double(hyp_len) / double(ref_len) : 0.0;
  if (hyp_len < ref_len)
    result.bp = hyp_len > 0 ? std::exp(1.0 - double(ref_len) / double(hyp_len)) : 0.0;
  else
    result.bp = 1.0;
  result.precisions.assign(size_t(max_order), 0.0);
  // No match at all: 0 without smoothing (sacreBLEU #141).
  if (std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c == 0; })) return result;

  const double smooth_value = options.smooth_value.value_or(smoothing_default(options.smoothing));
  double smooth_mteval = 1.0;
  int effective_order = max_order;
  for (int n = 1; n <= max_order; ++n) {
    double correct = double(counts[size_t(n - 1)]);
    double total = double(totals[size_t(n - 1)]);
    if (options.smoothing == BleuSmoothing::kAddK && n > 1) {
      correct += smooth_value;
      total += smooth_value;
    }
    if (total == 0) break;
    if (options.effective_order) effective_order = n;
    double& precision = result.precisions[size_t(n - 1)];
    if (correct == 0) {
      if (options.smoothing == BleuSmoothing::kExp) {
        smooth_mteval *= 2;
        precision = 100.0 / (smooth_mteval * total);
      } else if (options.smoothing == BleuSmoothing::kFloor) {
        precision = 100.0 * smooth_value / total;
      }
    } else {
      precision = 100.0 * correct / total;
    }
  }
  double log_sum = 0.0;
  for (int i = 0; i < effective_order; ++i) log_sum += floored_log(result.precisions[size_t(i)]);
  result.score = result.bp * std::exp(log_sum / effective_order);
  return result;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const BleuOptions& options) {
  check_streams(hypotheses.size(), references);
  const int max_order = options.max_ngram_order;
  if (max_order < 1) throw Error("BLEU n-gram order must be at least 1");
  std::vector<int64_t> counts(size_t(max_order), 0), totals(size_t(max_order), 0);
  int64_t hyp_len_sum = 0, ref_len_sum = 0;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    // References: n-gram counts merged by maximum, and their lengths. The segments are all
    // in place before counting, as the counts view their text.
    std::vector<TokenizedSegment> ref_segments;
    for (const std::string* ref : segment_references(references, i))
      ref_segments.push_back(bleu_segment(*ref, options));
    NgramCounts ref_ngrams(static_cast<size_t>(max_order));
    std::vector<int64_t> ref_lens;
    for (const TokenizedSegment& ref : ref_segments) {
      ref_lens.push_back(int64_t(ref.spans.size()));
      NgramCounts ngrams = word_ngrams(ref, max_order);
      if (ref_segments.size() == 1) {
        ref_ngrams = std::move(ngrams);
        break;
      }
      for (size_t n = 0; n < ngrams.size(); ++n)
        for (const auto& [ngram, count] : ngrams[n]) {
          int64_t& merged = ref_ngrams[n][ngram];
          merged = std::max(merged, count);
        }
    }
    const TokenizedSegment hyp = bleu_segment(hypotheses[i], options);
    const int64_t hyp_len = int64_t(hyp.spans.size());
    // Closest reference length; ties go to the shorter reference.
    int64_t closest_diff = -1, closest_len = -1;
    for (int64_t len : ref_lens) {
      const int64_t diff = std::abs(hyp_len - len);
      if (closest_diff == -1 || diff < closest_diff) {
        closest_diff = diff;
        closest_len = len;
      } else if (diff == closest_diff && len < closest_len) {
        closest_len = len;
      }
    }
    hyp_len_sum += hyp_len;
    ref_len_sum += closest_len;
    const NgramCounts hyp_ngrams = word_ngrams(hyp, max_order);
    for (size_t n = 0; n < hyp_ngrams.size(); ++n)
      for (const auto& [ngram, count] : hyp_ngrams[n]) {
        totals[n] += count;
        const auto hit = ref_ngrams[n].find(ngram);
        if (hit != ref_ngrams[n].end()) counts[n] += std::min(count, hit->second);
      }
  }
  return compute_bleu(counts, totals, hyp_len_sum, ref_len_sum, options);
}

// ---- public: chrF ----

std::string ChrfScore::name() const {
  return "chrF" + std::to_string(beta);
}

std::string ChrfScore::format() const {
  return name() + " = " + format_fixed(score, 2);
}

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const ChrfOptions& options) {
  check_streams(hypotheses.size(), references);
  if (options.char_order < 1) throw Error("chrF character order must be at least 1");
  const size_t order = size_t(options.char_order);
  std::vector<int64_t> corpus_stats(3 * order, 0);
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const std::vector<const std::string*> refs = segment_references(references, i);
    const std::u32string hyp_text = chrf_text(hypotheses[i], options);
    const CharNgrams hyp = char_ngrams(hyp_text, options.char_order);
    std::vector<int64_t> best_stats;
    double best_f = -1.0;
    for (const std::string* ref_text : refs) {
      const std::u32string ref_chars = chrf_text(*ref_text, options);
      const CharNgrams ref = char_ngrams(ref_chars, options.char_order);
      std::vector<int64_t> stats(3 * order, 0);
      for (size_t n = 0; n < order; ++n) {
        int64_t hyp_count = 0, match_count = 0, ref_count = 0;
        for (const auto& [ngram, count] : hyp[n]) {
          hyp_count += count;
          const auto hit = ref[n].find(ngram);
          if (hit != ref[n].end()) match_count += std::min(count, hit->second);
        }
        for (const auto& entry : ref[n]) ref_count += entry.second;
        // No hypothesis n-grams are counted when the reference has none of this order.
        stats[3 * n] = ref[n].empty() ? 0 : hyp_count;
        stats[3 * n + 1] = ref_count;
        stats[3 * n + 2] = match_count;
      }
      const double f = chrf_f_score(stats, options);
      if (f > best_f) {
        best_f = f;
        best_stats = std::move(stats);
      }
    }
    for (size_t k = 0; k < corpus_stats.size(); ++k) corpus_stats[k] += best_stats[k];
  }
  ChrfScore result;
  result.beta = options.beta;
  result.score = chrf_f_score(corpus_stats, options);
  return result;
}

// ---- public: signatures ----

std::string reference_count(const std::vector<std::vector<std::string>>& references) {
  return std::to_string(references.size());
}

std::string bleu_signature(const BleuOptions& options, const std::string& nrefs) {
  std::string smooth;
  switch (options.smoothing) {
    case BleuSmoothing::kNone:
      smooth = "none";
      break;
    case BleuSmoothing::kExp:
      smooth = "exp";
      break;
    case BleuSmoothing::kFloor:
      smooth = "floor";
      break;
    case BleuSmoothing::kAddK:
      smooth = "add-k";
      break;
  }
  if (options.smoothing == BleuSmoothing::kFloor || options.smoothing == BleuSmoothing::kAddK)
    smooth += "[" +
              format_fixed(options.smooth_value.value_or(smoothing_default(options.smoothing)), 2) +
              "]";
  return "nrefs:" + nrefs + "|case:" + (options.lowercase ? "lc" : "mixed") +
         "|eff:" + (options.effective_order ? "yes" : "no") +
         "|tok:" + bleu_tokenizer_name(options.tokenizer) + "|smooth:" + smooth +
         "|version:" + kSacrebleuVersion;
}

std::string chrf_signature(const ChrfOptions& options, const std::string& nrefs) {
  return "nrefs:" + nrefs + "|case:" + (options.lowercase ? "lc" : "mixed") +
         "|eff:" + (options.eps_smoothing ? "no" : "yes") +
         "|nc:" + std::to_string(options.char_order) +
         "|nw:0|space:" + (options.whitespace ? "yes" : "no") + "|version:" + kSacrebleuVersion;
}

}  // namespace tfm
