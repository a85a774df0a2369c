// Reading line-oriented text files (one sentence per line), and turning lines into token ids
// with a vocabulary or as --ids, with errors that name file and line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/vocabulary.h"

namespace tfm {

// All lines of `path` ("-" = stdin); a final line without newline counts; "\r\n" accepted.
std::vector<std::string> read_lines(const std::string& path);

// Encodes every line: with ids (vocabulary unused) or with the vocabulary.
std::vector<std::vector<int32_t>> encode_lines(const std::vector<std::string>& lines,
                                               const Vocabulary* vocabulary, bool ids,
                                               int64_t vocab_size, const std::string& where);

}  // namespace tfm
