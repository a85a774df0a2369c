// What every fuzz target shares: the input as a std::string, and the rule that a parser may
// reject input only with tfm::Error (any other exception, crash or sanitizer report is a bug).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/error.h"

namespace tfm::fuzzing {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Runs `parse`; tfm::Error is the accepted way to refuse input.
template <typename Parse>
void expect_clean_rejection(Parse&& parse) {
  try {
    parse();
  } catch (const tfm::Error&) {
  }
}

}  // namespace tfm::fuzzing
