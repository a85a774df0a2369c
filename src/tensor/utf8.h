// Whether bytes are well-formed UTF-8: every text reader, the vocabularies, the server's request
// parser and the quoting of file-derived names in error messages (tensor/error.h) check with
// this one definition. Here at the bottom layer so that error messages need nothing above it.
#pragma once

#include <string>

namespace tfm {

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool is_valid_utf8(const std::string& text);

}  // namespace tfm
