// File helpers shared by every writer of files that matter.
#include "io/file_util.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tensor/error.h"

namespace tfm {

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw Error(path + ": read failed");
  return buffer.str();
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
      !std::filesystem::is_directory(status)) {
    // A device or pipe (e.g. /dev/null, a FIFO): write straight into it, never replace it.
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(path + ": cannot write (" + std::strerror(errno) + ")");
    try {
      write(f);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    if (std::fclose(f) != 0) throw Error(path + ": write failed");
    return;
  }
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (!f) throw Error(path + ": cannot write (" + std::strerror(errno) + ")");
  try {
    write(f);
    if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0)
      throw Error(path + ": write failed (" + std::strerror(errno) + ")");
  } catch (...) {
    std::fclose(f);
    std::remove(temp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    std::remove(temp.c_str());
    throw Error(path + ": write failed (" + std::strerror(errno) + ")");
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temp.c_str());
    throw Error(path + ": cannot replace (" + reason + ")");
  }
}

void write_bytes_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, [&](std::FILE* f) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
      throw Error(path + ": write failed");
  });
}

void write_output(const std::string& path, const std::function<void(std::FILE*)>& write) {
  if (path.empty() || path == "-") {
    write(stdout);
    std::fflush(stdout);
  } else {
    write_file_atomically(path, write);
  }
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error(path + ": cannot create directory (" + ec.message() + ")");
}

}  // namespace tfm
