// parse_json_strictly: nlohmann's parser with a callback that sees every key.
#include "tensor/strict_json.h"

#include <set>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace tfm {

namespace {

// The text between the first pair of single quotes in nlohmann's message (the number it could
// not hold), or "" when there is none.
std::string quoted_token(const std::string& message) {
  const size_t open = message.find('\'');
  const size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
  return close == std::string::npos ? "" : message.substr(open + 1, close - open - 1);
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string reason_of(const nlohmann::json::exception& e) {
  const std::string message = e.what();
  const size_t end = message.find("] ");
  return end == std::string::npos ? message : message.substr(end + 2);
}

}  // namespace

nlohmann::json parse_json_strictly(std::string_view text, int64_t max_values) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> keys_of_open_objects;
  std::string last_key;
  int64_t values = 0, depth = 0;
  const nlohmann::json::parser_callback_t check_keys = [&](int, Event event,
                                                           nlohmann::json& parsed) {
    const bool starts_a_value =
        event == Event::object_start || event == Event::array_start || event == Event::value;
    if (starts_a_value && max_values > 0 && ++values > max_values)
      throw JsonTooLarge("more than " + std::to_string(max_values) + " values");
    if (event == Event::object_start || event == Event::array_start) {
      if (++depth > kMaxJsonDepth)
        throw JsonError("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (event == Event::object_end || event == Event::array_end) {
      --depth;
    }
    if (event == Event::object_start) {
      keys_of_open_objects.emplace_back();
    } else if (event == Event::object_end) {
      keys_of_open_objects.pop_back();
    } else if (event == Event::key) {
      last_key = parsed.get<std::string>();
      if (!keys_of_open_objects.back().insert(last_key).second)
        throw JsonError("duplicate key " + quoted_for_message(last_key));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check_keys);
  } catch (const nlohmann::json::out_of_range& e) {  // 406: a number past a double's range
    const std::string number = quoted_token(e.what());
    throw JsonError("the number " + (number.empty() ? std::string("") : number + " ") +
                    (last_key.empty() ? "" : "(" + quoted_for_message(last_key) + ") ") +
                    "is out of range (larger than a double)");
  } catch (const nlohmann::json::exception& e) {
    throw JsonError("not valid JSON: " + reason_of(e));
  }
}

nlohmann::json parse_json_strictly(std::string_view text, const std::string& where) {
  try {
    return parse_json_strictly(text);
  } catch (const JsonError& e) {
    throw Error(where + ": " + e.what());
  }
}

}  // namespace tfm
