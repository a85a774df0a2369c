// Line reading and encoding.
#include "text/corpus.h"

#include <iostream>
#include <iterator>

#include "io/file_util.h"
#include "tensor/error.h"

namespace tfm {

std::vector<std::string> read_lines(const std::string& path) {
  std::string bytes;
  if (path == "-") {
    bytes.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    bytes = read_file_bytes(path);
  }
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < bytes.size()) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    std::string line = bytes.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    begin = end + 1;
  }
  return lines;
}

std::vector<std::vector<int32_t>> encode_lines(const std::vector<std::string>& lines,
                                               const Vocabulary* vocabulary, bool ids,
                                               int64_t vocab_size, const std::string& where) {
  std::vector<std::vector<int32_t>> encoded;
  encoded.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (ids) {
      encoded.push_back(parse_id_line(lines[i], vocab_size, where, int64_t(i) + 1));
    } else {
      try {
        encoded.push_back(vocabulary->encode(lines[i]));
      } catch (const Error& e) {
        throw Error(where + ":" + std::to_string(i + 1) + ": " + e.what());
      }
    }
  }
  return encoded;
}

}  // namespace tfm
