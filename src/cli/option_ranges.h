// Range checks for numeric command-line options, so that an out-of-range value (a negative
// learning rate, `--max-length-a inf`, `--nbest 0`) is a usage error naming the option and its
// range in words, instead of a silent misbehaviour or CLI11's "Value 0 not in range 0.000000 to
// 1797693...". Every numeric option of every command is declared with one of these.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace tfm {

// A finite number in the interval from `low` to `high`, also once rounded to a 32-bit float;
// each end open or closed.
inline CLI::Validator in_range(double low, double high, bool low_closed = true,
                               bool high_closed = true) {
  auto number = [](double v) {
    if (std::isinf(v)) return std::string(v > 0 ? "inf" : "-inf");
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.12g", v);
    return std::string(buffer);
  };
  std::string words;
  if (std::isinf(high))
    words = (low_closed ? "at least " : "greater than ") + number(low);
  else
    words = std::string("in ") + (low_closed ? "[" : "(") + number(low) + ", " + number(high) +
            (high_closed ? "]" : ")");
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        const char* begin = input.c_str();
        char* end = nullptr;
        const double v = std::strtod(begin, &end);
        if (end == begin || *end != '\0' || !std::isfinite(v))
          return "must be a finite number " + words + ", not \"" + input + "\"";
        auto inside = [&](double x) {
          return (low_closed ? x >= low : x > low) && (high_closed ? x <= high : x < high);
        };
        if (!inside(v)) return "must be " + words + ", not " + input;
        // The options are kept as 32-bit floats: the value as kept must be in range too
        // (--lr 1e39 became inf, --adam-eps 1e-50 became 0, --dropout 0.99999999 became 1,
        // each refused later with a message that did not fit what was typed).
        const double kept = std::fabs(v) > FLT_MAX ? v * INFINITY : double(float(v));
        if (!inside(kept) || std::isinf(kept))
          return "must be " + words + ", not " + input + " (" + number(kept) +
                 " as a 32-bit float)";
        return std::string();
      },
      words);
}

// An option's help text with its default, read from the variable the option sets (before the
// command line is parsed, it holds the default), so that the help cannot state another value:
// "TEXT (default VALUE)", or "TEXT (default VALUE; MEANING)".
template <typename Number>
std::string with_default(const std::string& text, Number value, const std::string& meaning = "") {
  std::string shown;
  if constexpr (std::is_floating_point_v<Number>) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%g", double(value));
    shown = buffer;
    // 1e-09 → 1e-9
    if (const size_t e = shown.find("e-0"); e != std::string::npos) shown.erase(e + 2, 1);
  } else {
    shown = std::to_string(value);
  }
  return text + " (default " + shown + (meaning.empty() ? "" : "; " + meaning) + ")";
}

// A finite number ≥ low (or > low when `closed` is false).
inline CLI::Validator at_least(double low, bool closed = true) {
  return in_range(low, INFINITY, closed);
}

// Every integer option of `app` and its commands (type INT or UINT) read in decimal, as users
// of other tools expect: CLI11 reads "010" as octal 8 and "0x10" as 16, and an unsigned option
// takes "-1" as 2^64 - 1. Leading zeros are dropped; a prefixed base, or a sign on an unsigned
// option, or a number that is not whole (1e3), is a usage error naming the option. Anything else
// is left to the option's own checks.
// Call once every option has been added.
inline void read_integers_as_decimal(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name().substr(0, option->get_type_name().find(':'));
    if (type != "INT" && type != "UINT") continue;
    const bool is_unsigned = type == "UINT";
    option->transform(CLI::Validator(
        [is_unsigned](std::string& input) -> std::string {
          size_t digits = input.find_first_not_of("+-") == 1 ? 1 : 0;
          if (input.size() > digits + 1 && input[digits] == '0' &&
              std::string("xXbBoO").find(input[digits + 1]) != std::string::npos)
            return "must be a whole number in decimal digits, not " + input;
          if (input.size() == digits ||
              input.find_first_not_of("0123456789", digits) != std::string::npos) {
            char* end = nullptr;  // a number, but not a whole one: 1e3, 2.5
            std::strtod(input.c_str(), &end);
            if (end != input.c_str() && *end == '\0')
              return "must be a whole number in decimal digits, not " + input;
            return std::string();  // not a number: the option's checks name the problem
          }
          if (is_unsigned && input[0] == '-')
            return "must be a whole number at least 0, not " + input;
          const size_t first = std::min(input.find_first_not_of('0', digits), input.size() - 1);
          input.erase(digits, first - digits);
          // CLI11 reads past 64 bits as the largest value (--seed 2^64 was 2^64 - 1).
          const std::string largest = is_unsigned       ? "18446744073709551615"
                                      : input[0] == '-' ? "9223372036854775808"
                                                        : "9223372036854775807";
          const std::string magnitude = input.substr(digits);
          if (magnitude.size() > largest.size() ||
              (magnitude.size() == largest.size() && magnitude > largest))
            return "is out of range (64 bits): " + input;
          return std::string();
        },
        ""));
  }
  for (CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    read_integers_as_decimal(*command);
}

}  // namespace tfm
