// JSON as this project reads it from files (--config, a CTranslate2 config.json, a model's
// config) and from serve's request bodies. It exists because nlohmann's parser keeps the last of
// a key given twice (a request {"beam": 1, "beam": 64} would be read as 64 without a word) and
// reports a number too large for a double (1e999) without naming its key, which callers then
// turned into "not a JSON object". Here both are errors that name the key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tfm {

// What is wrong with a JSON text, in words for a user (no file name: the caller adds it).
struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A JSON text with more values than its reader allows (parse_json_strictly's max_values).
struct JsonTooLarge : JsonError {
  using JsonError::JsonError;
};

// How deep objects and arrays may nest: no JSON this project reads nests more than a few
// levels, and a copy of a parsed value recurses once a level (100,000 levels overflowed the
// stack of the --config reader).
inline constexpr int64_t kMaxJsonDepth = 256;

// Parses `text`. Throws JsonError: "duplicate key \"k\"", "the number 1e999 (\"d_model\") is out
// of range", "nested deeper than 256 levels", or "not valid JSON: <the parser's reason>";
// JsonTooLarge when it holds more than `max_values` values (objects, arrays and scalars, nested
// ones included; 0: no limit), found while parsing, before they are all built: a parsed value takes
// tens of times the bytes of its text ("{}," is 3 bytes), so a request body's size alone does not
// bound its memory.
nlohmann::json parse_json_strictly(std::string_view text, int64_t max_values = 0);

// The same for a file's JSON: throws Error("<where>: <what is wrong>").
nlohmann::json parse_json_strictly(std::string_view text, const std::string& where);

}  // namespace tfm
