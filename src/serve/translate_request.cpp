// Parsing and checking of serve's request bodies (see translate_request.h).
#include "serve/translate_request.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <set>
#include <string_view>

#include "tensor/strict_json.h"
#include "text/vocabulary.h"

namespace tfm {

namespace {

std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump();
}

// A whole number in [low, high] from field `name`, or a RequestError naming it.
int64_t integer_field(const nlohmann::json& value, const std::string& name, int64_t low,
                      int64_t high, const std::string& limit_option = "") {
  if (!value.is_number_integer())
    throw RequestError(400, name + " must be a whole number, not " + value.dump());
  const bool is_unsigned = value.is_number_unsigned();  // nlohmann parses 0, 1, ... as unsigned
  const bool too_big =
      is_unsigned ? value.get<uint64_t>() > uint64_t(high) : value.get<int64_t>() > high;
  const bool too_small =
      is_unsigned ? low > 0 && value.get<uint64_t>() < uint64_t(low) : value.get<int64_t>() < low;
  if (too_big || too_small) {
    std::string message = name + " must be between " + std::to_string(low) + " and " +
                          std::to_string(high) + ", not " + value.dump();
    if (too_big && !limit_option.empty()) message += " (the server's " + limit_option + ")";
    throw RequestError(400, message);
  }
  return value.get<int64_t>();
}

// One sentence of the request: a string of valid UTF-8 without NUL bytes.
std::string text_field(const nlohmann::json& value, const std::string& name) {
  if (!value.is_string()) throw RequestError(400, name + " must be a string, not " + value.dump());
  const std::string& s = value.get_ref<const std::string&>();
  if (!is_valid_utf8(s)) throw RequestError(400, name + " is not valid UTF-8");
  if (s.find('\0') != std::string::npos) throw RequestError(400, name + " contains a NUL byte");
  return s;
}

// "text" / "q": one string or a non-empty list of strings, at most limits.max_sentences.
void read_texts(const nlohmann::json& value, const std::string& name, const ServeLimits& limits,
                TranslateRequest& r) {
  if (value.is_string()) {
    r.texts.push_back(text_field(value, name));
    return;
  }
  if (!value.is_array())
    throw RequestError(400, name + " must be a string or a list of strings, not " + value.dump());
  if (value.empty()) throw RequestError(400, name + " must hold at least one sentence");
  if (int64_t(value.size()) > limits.max_sentences)
    throw RequestError(413, name + " has " + std::to_string(value.size()) +
                                " sentences; this server takes at most " +
                                std::to_string(limits.max_sentences) +
                                " per request (--max-sentences)");
  r.text_was_list = true;
  for (size_t i = 0; i < value.size(); ++i)
    r.texts.push_back(text_field(value[i], name + "[" + std::to_string(i) + "]"));
}

void check_body_size(const std::string& body, const ServeLimits& limits) {
  if (int64_t(body.size()) > limits.max_body_bytes)
    throw RequestError(413, "the request body has " + std::to_string(body.size()) +
                                " bytes; this server takes at most " +
                                std::to_string(limits.max_body_bytes) + " (--max-body-bytes)");
}

// nbest hypotheses: the beam grows to nbest when the request did not set it.
// When the server samples (--sampling-topk), nbest draws of each text instead.
void set_nbest(TranslateRequest& r, int64_t nbest, bool beam_given, const ServeLimits& limits) {
  if (samples(r.search)) {
    r.search.num_hypotheses = nbest;
    return;
  }
  if (!beam_given && r.search.beam_size < nbest) {
    if (nbest > limits.max_beam)
      throw RequestError(400, "nbest must be at most " + std::to_string(limits.max_beam) +
                                  ", not " + std::to_string(nbest) + " (the server's --max-beam)");
    r.search.beam_size = nbest;
  }
  if (nbest > r.search.beam_size)
    throw RequestError(400, "nbest (" + std::to_string(nbest) + ") cannot exceed beam (" +
                                std::to_string(r.search.beam_size) + ")");
  r.search.num_hypotheses = nbest;
}

}  // namespace

nlohmann::json parse_request_json(const std::string& body, const ServeLimits& limits) {
  const int64_t max_values = 2 * (2 * limits.max_sentences + 16);
  try {
    return parse_json_strictly(body, max_values);
  } catch (const JsonTooLarge&) {
    throw RequestError(413, "the request holds more than " + std::to_string(max_values) +
                                " JSON values; this server takes at most 2 × (2 × --max-sentences "
                                "+ 16)");
  }
}

namespace {

// '+' and %XX decoded (see parse_form_fields).
std::string decode_form_text(std::string_view text) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 &&
               hex(text[i + 2]) >= 0) {
      out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> parse_form_fields(const std::string& body,
                                                     const ServeLimits& limits) {
  const int64_t max_fields = 2 * (2 * limits.max_sentences + 16);  // parse_request_json's bound
  const int64_t pairs = 1 + int64_t(std::count(body.begin(), body.end(), '&'));
  if (pairs > max_fields)
    throw RequestError(413, "the form holds " + std::to_string(pairs) +
                                " fields; this server takes at most 2 × (2 × --max-sentences + "
                                "16) = " +
                                std::to_string(max_fields));
  std::map<std::string, std::string> fields;
  const std::string_view text(body);
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = text.find('&', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view pair = text.substr(begin, end - begin);
    begin = end + 1;
    if (pair.empty()) continue;
    const size_t equals = pair.find('=');
    std::string name = decode_form_text(pair.substr(0, equals));
    if (fields.count(name)) continue;
    fields.emplace(std::move(name), equals == std::string_view::npos
                                        ? std::string()
                                        : decode_form_text(pair.substr(equals + 1)));
  }
  return fields;
}

TranslateRequest parse_translate_request(const std::string& body,
                                         const TranslationOptions& defaults,
                                         const ServeLimits& limits) {
  check_body_size(body, limits);
  nlohmann::json j;
  try {
    j = parse_request_json(body, limits);
  } catch (const JsonError& e) {
    // A syntax error (with the byte offset), a number too large for a double, a key given twice.
    throw RequestError(400, std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object()) throw RequestError(400, "the request must be a JSON object");
  static const std::set<std::string> known = {
      "text", "beam", "alpha", "nbest", "max_length", "prefix", "attention", "attention_layer"};
  for (const auto& [key, value] : j.items())
    if (!known.count(key))
      throw RequestError(400, "unknown field " + quoted(key) +
                                  " (known: text, beam, alpha, nbest, max_length, prefix, "
                                  "attention, attention_layer)");
  if (!j.contains("text")) throw RequestError(400, "missing field \"text\"");

  TranslateRequest r;
  r.search = defaults;
  read_texts(j["text"], "text", limits, r);
  const bool beam_given = j.contains("beam");
  if (beam_given)
    r.search.beam_size = integer_field(j["beam"], "beam", 1, limits.max_beam, "--max-beam");
  if (samples(r.search) && r.search.beam_size != 1)
    throw RequestError(400,
                       "this server samples its translations (--sampling-topk): beam must be 1");
  if (j.contains("alpha")) {
    const nlohmann::json& a = j["alpha"];
    if (!a.is_number() || !(a.get<double>() >= 0 && a.get<double>() <= 10))
      throw RequestError(400, "alpha must be a number between 0 and 10, not " + a.dump());
    r.search.length_penalty = a.get<double>();
  }
  r.search.num_hypotheses = 1;
  if (j.contains("nbest")) {
    set_nbest(r, integer_field(j["nbest"], "nbest", 1, limits.max_beam, "--max-beam"), beam_given,
              limits);
    r.nbest_requested = true;
  }
  if (j.contains("max_length"))
    r.search.max_decoding_length = integer_field(j["max_length"], "max_length", 1,
                                                 limits.max_length, "model's position limit");
  if (r.search.max_decoding_length > 0 &&
      r.search.max_decoding_length < r.search.min_decoding_length)
    throw RequestError(400, "max_length " + std::to_string(r.search.max_decoding_length) +
                                " is less than this server's --min-length " +
                                std::to_string(r.search.min_decoding_length));
  if (j.contains("prefix")) {
    const nlohmann::json& p = j["prefix"];
    if (p.is_string()) {
      r.prefixes.assign(r.texts.size(), text_field(p, "prefix"));
    } else if (p.is_array()) {
      if (p.size() != r.texts.size())
        throw RequestError(400, "prefix has " + std::to_string(p.size()) +
                                    " entries but text has " + std::to_string(r.texts.size()));
      for (size_t i = 0; i < p.size(); ++i)
        r.prefixes.push_back(text_field(p[i], "prefix[" + std::to_string(i) + "]"));
    } else {
      throw RequestError(400, "prefix must be a string or a list of strings, not " + p.dump());
    }
  }
  if (j.contains("attention")) {
    if (!j["attention"].is_boolean())
      throw RequestError(400, "attention must be true or false, not " + j["attention"].dump());
    r.attention = j["attention"].get<bool>();
  }
  if (j.contains("attention_layer")) {
    r.search.attention_layer = integer_field(j["attention_layer"], "attention_layer", 0,
                                             limits.decoder_layers - 1, "model's decoder layers");
    r.attention = true;
  }
  r.search.return_attention_heads = r.attention;
  return r;
}

LibreTranslateRequest parse_libretranslate_request(const nlohmann::json& fields,
                                                   const TranslationOptions& defaults,
                                                   const ServeLimits& limits,
                                                   const std::string& source_language,
                                                   const std::string& target_language) {
  if (!fields.is_object()) throw RequestError(400, "Invalid JSON format");
  auto present = [&](const char* key) {
    return fields.contains(key) && !fields[key].is_null() &&
           !(fields[key].is_string() && fields[key].get_ref<const std::string&>().empty()) &&
           !(fields[key].is_array() && fields[key].empty());
  };
  if (!present("q")) throw RequestError(400, "Invalid request: missing q parameter");
  if (!present("source")) throw RequestError(400, "Invalid request: missing source parameter");
  if (!present("target")) throw RequestError(400, "Invalid request: missing target parameter");
  auto code = [&](const char* key) {
    if (!fields[key].is_string())
      throw RequestError(400, std::string("Invalid request: ") + key + " must be a string");
    std::string c = fields[key].get<std::string>();
    std::transform(c.begin(), c.end(), c.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    return c;
  };
  LibreTranslateRequest r;
  r.translate.search = defaults;
  r.translate.search.num_hypotheses = 1;
  read_texts(fields["q"], "q", limits, r.translate);
  const std::string source = code("source"), target = code("target");
  r.detect_source = source == "auto";
  if (!r.detect_source && !source_language.empty() && source != source_language)
    throw RequestError(400, source + " is not supported");
  if (!target_language.empty() && target != target_language)
    throw RequestError(400, target + " is not supported");
  if (fields.contains("format") && !fields["format"].is_null()) {
    if (!fields["format"].is_string())
      throw RequestError(400, "Invalid request: format must be a string");
    const std::string format = fields["format"].get<std::string>();
    if (format == "html")
      throw RequestError(400, "html format is not supported by this server (only text)");
    if (format != "text") throw RequestError(400, format + " format is not supported");
  }
  if (fields.contains("alternatives") && !fields["alternatives"].is_null()) {
    nlohmann::json a = fields["alternatives"];
    if (a.is_string()) {  // form fields arrive as text
      const std::string& s = a.get_ref<const std::string&>();
      const size_t digits = s.size() - (s.rfind('-', 0) == 0 ? 1 : 0);
      if (digits == 0 || digits > 9 || !std::all_of(s.end() - long(digits), s.end(), ::isdigit))
        throw RequestError(400, "Invalid request: alternatives parameter is not a number");
      a = std::stoll(s);
    }
    if (!a.is_number_integer())
      throw RequestError(400, "Invalid request: alternatives parameter is not a number");
    // LibreTranslate clamps a negative count to 0; a negative count is a client's mistake, so
    // it is refused here rather than answered as if it were 0.
    if (!a.is_number_unsigned() && a.get<int64_t>() < 0)
      throw RequestError(400, "Invalid request: alternatives parameter must be >= 0");
    if (a.get<uint64_t>() >= uint64_t(limits.max_beam))  // each alternative is one more beam
      throw RequestError(400, "Invalid request: alternatives parameter must be <= " +
                                  std::to_string(limits.max_beam - 1));
    const int64_t alternatives = a.get<int64_t>();
    r.alternatives = alternatives;
    if (alternatives > 0) set_nbest(r.translate, alternatives + 1, false, limits);
  }
  return r;
}

std::string language_name(const std::string& code) {
  if (code.empty() || code.size() > 16) return code;
  const icu::Locale locale(code.c_str());
  if (locale.isBogus() || std::string(locale.getLanguage()).empty()) return code;
  icu::UnicodeString name;
  locale.getDisplayLanguage(icu::Locale::getEnglish(), name);
  std::string utf8;
  name.toUTF8String(utf8);
  // ICU gives the code back for a language it has no name for.
  return utf8.empty() || utf8 == locale.getLanguage() ? code : utf8;
}

nlohmann::json libretranslate_languages(const std::string& source_language,
                                        const std::string& target_language) {
  nlohmann::json languages = nlohmann::json::array();
  if (source_language.empty() || target_language.empty()) return languages;
  languages.push_back({{"code", source_language},
                       {"name", language_name(source_language)},
                       {"targets", {target_language}}});
  if (target_language != source_language)
    languages.push_back({{"code", target_language},
                         {"name", language_name(target_language)},
                         {"targets", nlohmann::json::array()}});
  return languages;
}

nlohmann::json libretranslate_detect(const nlohmann::json& fields, const ServeLimits& limits,
                                     const std::string& source_language) {
  if (!fields.is_object()) throw RequestError(400, "Invalid JSON format");
  const bool missing =
      !fields.contains("q") || fields["q"].is_null() ||
      (fields["q"].is_string() && fields["q"].get_ref<const std::string&>().empty()) ||
      (fields["q"].is_array() && fields["q"].empty());
  if (missing) throw RequestError(400, "Invalid request: missing q parameter");
  TranslateRequest checked;  // q as /translate reads it: types, sizes, UTF-8
  read_texts(fields["q"], "q", limits, checked);
  const bool known = !source_language.empty();
  return nlohmann::json::array(
      {{{"confidence", known ? 100.0 : 0.0}, {"language", known ? source_language : "auto"}}});
}

}  // namespace tfm
