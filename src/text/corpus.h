// Reading line-oriented text files (one sentence per line), and turning lines into token ids
// with a vocabulary or as --ids, with errors that name file and line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/vocabulary.h"

namespace tfm {

// All lines of `path` ("-" = stdin); a final line without newline counts; "\r\n" accepted; a
// UTF-8 byte-order mark at the start is dropped. Every text command reads its input here, so
// all refuse the same things, with file:line: bytes that are not UTF-8, NUL bytes, and a line
// longer than max_line_bytes() (read as a stream: /dev/zero fails at the cap, not at OOM).
std::vector<std::string> read_lines(const std::string& path);

// The line-length cap of read_lines (the CLI's --max-line-bytes; default 1 MiB).
inline constexpr int64_t kDefaultMaxLineBytes = int64_t(1) << 20;  // 1 MiB
void set_max_line_bytes(int64_t bytes);
int64_t max_line_bytes();

// Encodes every line: with ids (vocabulary unused) or with the vocabulary.
std::vector<std::vector<int32_t>> encode_lines(const std::vector<std::string>& lines,
                                               const Vocabulary* vocabulary, bool ids,
                                               int64_t vocab_size, const std::string& where);

// Encodes every line with a segmentation sampled at `alpha` (Vocabulary::sample_encode), the
// same for the same (lines, vocabulary, alpha, seed). SentencePiece draws from a thread-local
// std::mt19937 seeded from its global seed when a thread first samples, so the lines are
// encoded in a thread started for this call after setting that seed: the result does not depend
// on what the caller's threads sampled before. Not to be called from two threads at once.
std::vector<std::vector<int32_t>> sample_encode_lines(const std::vector<std::string>& lines,
                                                      const Vocabulary& vocabulary, float alpha,
                                                      uint32_t seed, const std::string& where);

}  // namespace tfm
