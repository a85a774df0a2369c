// Line reading and encoding.
#include "text/corpus.h"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>

#include "tensor/file_util.h"
#include "tensor/error.h"

namespace tfm {

namespace {

int64_t g_max_line_bytes = kDefaultMaxLineBytes;

}  // namespace

void set_max_line_bytes(int64_t bytes) {
  g_max_line_bytes = bytes > 0 ? bytes : kDefaultMaxLineBytes;
}

int64_t max_line_bytes() {
  return g_max_line_bytes;
}

std::vector<std::string> read_lines(const std::string& path) {
  const std::string where = path == "-" ? "stdin" : path;
  std::FILE* f = stdin;
  if (path != "-") {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a file");
    f = std::fopen(path.c_str(), "rb");
    if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> owner(f == stdin ? nullptr : f, &std::fclose);
  std::vector<std::string> lines;
  std::string line;
  auto too_long = [&] {
    return Error(where + ":" + std::to_string(lines.size() + 1) + ": line longer than " +
                 std::to_string(g_max_line_bytes) + " bytes (raise --max-line-bytes)");
  };
  auto finish_line = [&] {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (int64_t(line.size()) > g_max_line_bytes) throw too_long();
    if (lines.empty() && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);
    const std::string at = where + ":" + std::to_string(lines.size() + 1);
    if (line.find('\0') != std::string::npos)
      throw Error(at + ": holds a NUL byte (binary data, or text in UTF-16?)");
    if (!is_valid_utf8(line)) throw Error(at + ": not valid UTF-8 text");
    lines.push_back(std::move(line));
    line.clear();
  };
  std::vector<char> buffer(1 << 16);
  bool pending = false;  // bytes of a line without its newline yet
  while (true) {
    const size_t got = std::fread(buffer.data(), 1, buffer.size(), f);
    for (size_t begin = 0; begin < got;) {
      const char* newline =
          static_cast<const char*>(std::memchr(buffer.data() + begin, '\n', got - begin));
      const size_t end = newline ? size_t(newline - buffer.data()) : got;
      line.append(buffer.data() + begin, end - begin);
      if (int64_t(line.size()) > g_max_line_bytes + 1) throw too_long();  // + 1: a "\r"
      pending = !newline;
      if (newline) finish_line();
      begin = end + 1;
    }
    if (got < buffer.size()) break;
  }
  if (std::ferror(f)) throw Error(where + ": read failed (" + std::strerror(errno) + ")");
  if (pending) finish_line();
  return lines;
}

namespace {

// Every line encoded by encode_one (a vocabulary's encode or sample_encode); an Error it throws
// comes back naming where:line.
template <typename EncodeOne>
std::vector<std::vector<int32_t>> encode_each_line(const std::vector<std::string>& lines,
                                                   const std::string& where,
                                                   const EncodeOne& encode_one) {
  std::vector<std::vector<int32_t>> encoded;
  encoded.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      encoded.push_back(encode_one(lines[i]));
    } catch (const Error& e) {
      throw Error(where + ":" + std::to_string(i + 1) + ": " + e.what());
    }
  }
  return encoded;
}

}  // namespace

std::vector<std::vector<int32_t>> encode_lines(const std::vector<std::string>& lines,
                                               const Vocabulary* vocabulary, bool ids,
                                               int64_t vocab_size, const std::string& where) {
  if (!ids)
    return encode_each_line(lines, where,
                            [&](const std::string& line) { return vocabulary->encode(line); });
  std::vector<std::vector<int32_t>> encoded;
  encoded.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    encoded.push_back(parse_id_line(lines[i], vocab_size, where, int64_t(i) + 1));
  return encoded;
}

std::vector<std::vector<int32_t>> sample_encode_lines(const std::vector<std::string>& lines,
                                                      const Vocabulary& vocabulary, float alpha,
                                                      uint32_t seed, const std::string& where) {
  std::vector<std::vector<int32_t>> encoded;
  std::exception_ptr failure;
  // ~0u would tell SentencePiece to seed from std::random_device instead.
  sentencepiece::SetRandomGeneratorSeed(seed == ~0u ? 0u : seed);
  std::thread sampler([&] {
    try {
      encoded = encode_each_line(lines, where, [&](const std::string& line) {
        return vocabulary.sample_encode(line, alpha);
      });
    } catch (...) {
      failure = std::current_exception();
    }
  });
  sampler.join();
  if (failure) std::rethrow_exception(failure);
  return encoded;
}

}  // namespace tfm
