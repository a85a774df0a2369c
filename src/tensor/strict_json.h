// JSON as this project reads it from files (--config, a CTranslate2 config.json, a model's
// config) and from serve's request bodies. It exists because nlohmann's parser keeps the last of
// a key given twice (a request {"beam": 1, "beam": 64} would be read as 64 without a word) and
// reports a number too large for a double (1e999) without naming its key, which callers then
// turned into "not a JSON object". Here both are errors that name the key.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tfm {

// What is wrong with a JSON text, in words for a user (no file name: the caller adds it).
struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses `text`. Throws JsonError: "duplicate key \"k\"", "the number 1e999 (\"d_model\") is out
// of range", or "not valid JSON: <the parser's reason>".
nlohmann::json parse_json_strictly(std::string_view text);

// The same for a file's JSON: throws Error("<where>: <what is wrong>").
nlohmann::json parse_json_strictly(std::string_view text, const std::string& where);

}  // namespace tfm
