// Fuzz target: the request parsers of `serve` (POST /v1/translate bodies, and LibreTranslate's
// /translate fields) on any bytes. A parser may refuse input only with RequestError 400 or
// 413; what it accepts must satisfy the limits the decoder relies on.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "serve/translate_request.h"
#include "text/vocabulary.h"

namespace {

void check_accepted(const tfm::TranslateRequest& r, const tfm::ServeLimits& limits) {
  if (r.texts.empty() || int64_t(r.texts.size()) > limits.max_sentences) __builtin_trap();
  for (const std::string& t : r.texts)
    if (!tfm::is_valid_utf8(t) || t.find('\0') != std::string::npos) __builtin_trap();
  if (!r.prefixes.empty() && r.prefixes.size() != r.texts.size()) __builtin_trap();
  const tfm::TranslationOptions& s = r.search;
  if (s.beam_size < 1 || s.beam_size > limits.max_beam || s.num_hypotheses < 1 ||
      s.num_hypotheses > s.beam_size)
    __builtin_trap();
  if (!(s.length_penalty >= 0 && s.length_penalty <= 10)) __builtin_trap();
  if (s.max_decoding_length < 0 || s.max_decoding_length > limits.max_length) __builtin_trap();
  if (s.attention_layer >= limits.decoder_layers) __builtin_trap();
}

template <typename Parse>
void expect_request_error(Parse&& parse) {
  try {
    parse();
  } catch (const tfm::RequestError& e) {
    if (e.status() != 400 && e.status() != 413) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body = tfm::fuzzing::as_string(data, size);
  tfm::TranslationOptions defaults;
  tfm::ServeLimits limits;
  limits.max_sentences = 8;
  limits.max_beam = 8;
  limits.max_length = 100;
  limits.decoder_layers = 6;
  limits.max_body_bytes = 1 << 16;
  expect_request_error(
      [&] { check_accepted(tfm::parse_translate_request(body, defaults, limits), limits); });
  const nlohmann::json fields = nlohmann::json::parse(body, nullptr, false);
  if (fields.is_discarded()) return 0;
  expect_request_error([&] {
    const auto r = tfm::parse_libretranslate_request(fields, defaults, limits, "en", "");
    check_accepted(r.translate, limits);
    if (r.alternatives < 0 ||
        (r.alternatives > 0 && r.translate.search.num_hypotheses != r.alternatives + 1))
      __builtin_trap();
  });
  return 0;
}
