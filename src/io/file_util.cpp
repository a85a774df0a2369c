// File helpers shared by every writer of files that matter.
#include "io/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tensor/error.h"

namespace tfm {

namespace {

// The temp files this process is writing right now, for the signal handler: fixed slots of
// plain bytes, because a handler may neither allocate nor lock.
constexpr int kTempSlots = 16;
char g_temp_paths[kTempSlots][4096];
std::atomic<bool> g_temp_used[kTempSlots];

// Registers `path` for removal on a signal; returns its slot, or -1 if none is free or the path
// is too long (the file is then only removed by remove_stale_temp_files at a later start).
int register_temp_file(const std::string& path) {
  if (path.size() >= sizeof g_temp_paths[0]) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    bool expected = false;
    if (!g_temp_used[i].load() && g_temp_used[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      return i;
    }
  }
  return -1;
}

void unregister_temp_file(int slot) {
  if (slot >= 0) g_temp_used[slot] = false;
}

extern "C" void remove_temp_files_and_end(int signal) {
  for (int i = 0; i < kTempSlots; ++i)
    if (g_temp_used[i].load()) ::unlink(g_temp_paths[i]);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

std::string reason(int error_number) {
  return std::strerror(error_number);
}

bool process_is_gone(long pid) {
  return pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

void require_regular_file(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) throw Error(path + ": cannot open (" + reason(errno) + ")");
  if (S_ISDIR(info.st_mode)) throw Error(path + ": is a directory, not a file");
  if (!S_ISREG(info.st_mode))
    throw Error(path + ": not a regular file (a pipe or device cannot be read here)");
}

std::string read_file_bytes(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open (" + reason(errno) + ")");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw Error(path + ": read failed");
  return buffer.str();
}

void write_text(std::FILE* f, std::string_view text) {
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size())
    throw WriteFailed{errno};
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  auto failed = [&](int error_number) {
    return Error(path + ": write failed (" + reason(error_number) + ")");
  };
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
      !std::filesystem::is_directory(status)) {
    // A device or pipe (e.g. /dev/null, a FIFO): write straight into it, never replace it.
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(path + ": cannot write (" + reason(errno) + ")");
    try {
      write(f);
    } catch (const WriteFailed& e) {
      std::fclose(f);
      throw failed(e.error_number);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    if (std::fflush(f) != 0 || std::ferror(f)) {
      const int error_number = errno;
      std::fclose(f);
      throw failed(error_number);
    }
    if (std::fclose(f) != 0) throw failed(errno);
    return;
  }
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  remove_stale_temp_files(dir, target.filename().string() + ".tmp.");
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int slot = register_temp_file(temp);
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (!f) {
    const int error_number = errno;
    unregister_temp_file(slot);
    throw Error(path + ": cannot write (" + reason(error_number) + ")");
  }
  auto discard = [&] {
    std::remove(temp.c_str());
    unregister_temp_file(slot);
  };
  try {
    write(f);
    if (std::fflush(f) != 0 || std::ferror(f) || ::fsync(::fileno(f)) != 0)
      throw WriteFailed{errno};
  } catch (const WriteFailed& e) {
    std::fclose(f);
    discard();
    throw failed(e.error_number);
  } catch (...) {
    std::fclose(f);
    discard();
    throw;
  }
  if (std::fclose(f) != 0) {
    const int error_number = errno;
    discard();
    throw failed(error_number);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    discard();
    throw Error(path + ": cannot replace (" + reason(error_number) + ")");
  }
  unregister_temp_file(slot);
}

void write_bytes_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, [&](std::FILE* f) { write_text(f, bytes); });
}

void write_output(const std::string& path, const std::function<void(std::FILE*)>& write) {
  if (path.empty() || path == "-") {
    try {
      write(stdout);
    } catch (const WriteFailed& e) {
      throw Error("standard output: write failed (" + reason(e.error_number) + ")");
    }
    flush_standard_output();
  } else {
    write_file_atomically(path, write);
  }
}

void flush_standard_output() {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int error_number = errno;
    std::clearerr(stdout);
    throw Error("standard output: write failed (" +
                (error_number ? reason(error_number) : std::string("stream error")) + ")");
  }
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error(path + ": cannot create directory (" + ec.message() + ")");
}

void remove_stale_temp_files(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t mark = name.rfind(".tmp.");
    if (mark == std::string::npos || mark + 5 == name.size()) continue;
    const std::string digits = name.substr(mark + 5);
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    if (process_is_gone(std::stol(digits))) std::filesystem::remove(it->path(), type_ec);
  }
}

void remove_temp_files_on_signals() {
  struct sigaction action {};
  action.sa_handler = remove_temp_files_and_end;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // A signal the caller's parent set to be ignored (nohup, `trap '' TERM`) stays ignored.
    if (sigaction(signal, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(signal, &action, nullptr);
  }
}

}  // namespace tfm
