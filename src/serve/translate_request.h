// The requests `transformer serve` accepts, parsed and checked before any work is queued: its
// own `POST /v1/translate` body and LibreTranslate's `POST /translate` fields. Pure functions
// of the bytes (no model, no sockets), so the fuzz target and the tests call them directly.
// Every problem is a RequestError carrying the HTTP status and a message naming the field or
// the limit.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/translator.h"

namespace tfm {

// A client's mistake: answered with `status` and {"error": message}, never a crash.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// What one request may ask for; each is a `serve` option, named in the errors.
struct ServeLimits {
  int64_t max_body_bytes = 1 << 20;   // --max-body-bytes → 413
  int64_t max_sentences = 64;         // --max-sentences, per request → 413
  int64_t max_sentence_tokens = 256;  // --max-sentence-tokens, source pieces → 400
  int64_t max_beam = 16;              // --max-beam → 400
  int64_t max_length = 256;           // the largest per-request max_length → 400
  int64_t decoder_layers = 1;         // attention_layer must be below this
  // --max-attention-cells → 413: the attention weights a request's answer may hold at most
  // (heads × target tokens × source positions, summed over its sentences, at their length
  // limits), which bounds the memory and the bytes of an "attention": true answer.
  int64_t max_attention_cells = 1 << 22;
};

// A request body's JSON, parsed with a bound on its values: the sentences and prefixes (two
// lists of at most max_sentences strings) and the few other fields, twice over. A body past it
// ({"text": [{}, {}, ...]}: 1 MiB of it would build ~350,000 values, tens of MB) is refused with
// 413 as it is parsed. Other problems are parse_json_strictly's JsonError, for the caller.
nlohmann::json parse_request_json(const std::string& body, const ServeLimits& limits);

// The fields of an urlencoded form body (LibreTranslate's POST /translate as curl -d and HTML
// forms send it): name=value pairs split at '&', each name and value with '+' and %XX decoded
// (a '%' without two hex digits after it stays as it is), the first of a repeated name kept,
// empty pairs skipped. The pairs are counted before any is stored: past parse_request_json's
// bound on values, 413 (1 MiB of "a&a&..." would otherwise build ~500,000 entries).
std::map<std::string, std::string> parse_form_fields(const std::string& body,
                                                     const ServeLimits& limits);

struct TranslateRequest {
  std::vector<std::string> texts;     // [sentences], each valid UTF-8
  bool text_was_list = false;         // answer with a list even for one sentence
  std::vector<std::string> prefixes;  // empty, or [sentences]: forced target starts
  TranslationOptions search;          // the server's defaults with this request's overrides
  bool nbest_requested = false;       // the answer lists hypotheses
  bool attention = false;             // the answer carries the best hypothesis' attention
};

// `POST /v1/translate`: {"text": "..." | ["...", ...], "beam", "alpha", "nbest", "max_length",
// "prefix": "..." | [...], "attention", "attention_layer"}; unknown fields are refused.
TranslateRequest parse_translate_request(const std::string& body,
                                         const TranslationOptions& defaults,
                                         const ServeLimits& limits);

// LibreTranslate's `POST /translate`, its fields gathered into one JSON object by the caller
// (from a JSON body, or from form fields as strings): q, source, target, format, alternatives,
// api_key. `source_language` / `target_language`: the codes the server was told its model
// translates between ("" accepts any code). Error messages follow LibreTranslate's wording.
struct LibreTranslateRequest {
  TranslateRequest translate;
  bool detect_source = false;  // source was "auto"
  int64_t alternatives = 0;
};
LibreTranslateRequest parse_libretranslate_request(const nlohmann::json& fields,
                                                   const TranslationOptions& defaults,
                                                   const ServeLimits& limits,
                                                   const std::string& source_language,
                                                   const std::string& target_language);

// LibreTranslate's `GET /languages` for a server told its pair: every language it knows, each
// with its English name (from ICU's locale data; the code itself for a code ICU does not know)
// and the codes it translates into — the source into the target, the target into none. Empty
// when the pair was not given.
nlohmann::json libretranslate_languages(const std::string& source_language,
                                        const std::string& target_language);

// LibreTranslate's `POST /detect`: q (one text or a list) checked as /translate checks it, and
// the candidates for it: the one source language this server translates, with confidence 100,
// or "auto" with confidence 0 when the server was not told its source language (what
// /translate's detectedLanguage says then too).
nlohmann::json libretranslate_detect(const nlohmann::json& fields, const ServeLimits& limits,
                                     const std::string& source_language);

// A language code's English name ("es" → "Spanish"), or the code when it names no language.
std::string language_name(const std::string& code);

}  // namespace tfm
