// Range checks for numeric command-line options, so that an out-of-range value (a negative
// learning rate, `--max-length-a inf`, `--nbest 0`) is a usage error naming the option and its
// range in words, instead of a silent misbehaviour or CLI11's "Value 0 not in range 0.000000 to
// 1797693...". Every numeric option of every command is declared with one of these.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace tfm {

// A finite number in the interval from `low` to `high`; each end open or closed.
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
        const bool above = low_closed ? v >= low : v > low;
        const bool below = high_closed ? v <= high : v < high;
        if (!above || !below) return "must be " + words + ", not " + input;
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

}  // namespace tfm
