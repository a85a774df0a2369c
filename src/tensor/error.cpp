// quoted_for_message: file-derived names made safe to print in an Error.
#include "tensor/error.h"

#include <cstdio>

#include "tensor/utf8.h"

namespace tfm {

namespace {

// The length of the well-formed UTF-8 character that starts `rest`, or 0.
size_t utf8_character_length(std::string_view rest) {
  const auto lead = static_cast<unsigned char>(rest[0]);
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (length == 0 || length > rest.size()) return 0;
  return is_valid_utf8(std::string(rest.substr(0, length))) ? length : 0;
}

}  // namespace

std::string quoted_for_message(std::string_view bytes, size_t max_bytes) {
  std::string out = "\"";
  size_t i = 0;
  while (i < bytes.size() && i < max_bytes) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
      ++i;
    } else if (c >= 0x20 && c < 0x7F) {
      out += char(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_character_length(bytes.substr(i)) : 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
      ++i;
    }
  }
  out += '"';
  if (i < bytes.size()) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

}  // namespace tfm
