// File helpers shared by every writer of files that matter.
#include "tensor/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// The pid of a temp name `<base>.tmp.<pid>`, or -1 when `name` is not one.
long temp_name_pid(const std::string& name) {
  const size_t mark = name.rfind(".tmp.");
  if (mark == std::string::npos || mark + 5 == name.size()) return -1;
  const std::string digits = name.substr(mark + 5);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stol(digits);
}

// Makes what was renamed into or out of `dir` durable.
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(dir + ": cannot open (" + reason(errno) + ")");
  const int result = ::fsync(fd);
  const int error_number = errno;
  ::close(fd);
  if (result != 0 && error_number != EINVAL)  // EINVAL: a file system without directory sync
    throw Error(dir + ": cannot sync (" + reason(error_number) + ")");
}

// The directory write_directory_atomically replaces for `dir`: absolute, without a trailing
// separator, a symbolic link resolved (the link stays, its directory is replaced).
std::filesystem::path directory_to_replace(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = fs::absolute(dir, ec).lexically_normal();
  if (ec) throw Error(dir + ": cannot resolve (" + ec.message() + ")");
  if (!path.has_filename()) path = path.parent_path();
  if (fs::is_symlink(path, ec)) {
    path = fs::canonical(path, ec);
    if (ec) throw Error(dir + ": cannot resolve (" + ec.message() + ")");
  }
  return path;
}

// True when `path` is a directory to replace: refuses one that holds anything not named in
// `replaceable`, and anything else that is not a directory. False when there is none.
bool existing_replaceable_directory(const std::filesystem::path& path, const std::string& dir,
                                    const std::vector<std::string>& replaceable) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (status.type() == fs::file_type::not_found) return false;
  if (ec) throw Error(dir + ": cannot open (" + ec.message() + ")");
  if (!fs::is_directory(status)) throw Error(dir + ": exists and is not a directory");
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::find(replaceable.begin(), replaceable.end(), name) == replaceable.end())
      throw Error(dir + ": holds " + quoted_for_message(name) +
                  ", which this command does not write; it replaces only a directory holding "
                  "nothing but what it writes: choose a new or empty directory");
  }
  if (ec) throw Error(dir + ": cannot list (" + ec.message() + ")");
  return true;
}

// Puts the complete directory `temp` in the place of `target`; returns where the directory it
// replaced now is ("" when there was none), to be removed.
std::string swap_into_place(const std::string& temp, const std::string& target, bool replacing,
                            const std::string& dir) {
  if (!replacing) {
    if (std::rename(temp.c_str(), target.c_str()) != 0)
      throw Error(dir + ": cannot create (" + reason(errno) + ")");
    return "";
  }
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0)
    return temp;
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    throw Error(dir + ": cannot replace (" + reason(errno) + ")");
  // No exchange on this file system: the old one aside first, under a name that the next
  // remove_stale_temp_files puts back should this process die before the new one is in place.
  const std::filesystem::path path(target);
  const std::string aside =
      (path.parent_path() / (path.filename().string() + ".old.tmp." + std::to_string(::getpid())))
          .string();
  if (std::rename(target.c_str(), aside.c_str()) != 0)
    throw Error(dir + ": cannot replace (" + reason(errno) + ")");
  if (std::rename(temp.c_str(), target.c_str()) != 0) {
    const int error_number = errno;
    std::rename(aside.c_str(), target.c_str());
    throw Error(dir + ": cannot replace (" + reason(error_number) + ")");
  }
  return aside;
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

namespace {

// The path a write to `path` lands on: `path` with its symbolic links followed, so that the
// file replaced is the link's target and the link stays (a rename onto the link replaced the
// link itself, and -o /dev/stdout replaced the system's /dev/stdout). `through_proc` is set
// where the way leads through /proc: a descriptor's link (/dev/stdout is /proc/self/fd/1), the
// stream someone opened, which is written into as it is.
std::string follow_links(const std::string& path, bool& through_proc) {
  namespace fs = std::filesystem;
  fs::path at = path;
  through_proc = path.rfind("/proc/", 0) == 0;
  for (int hops = 0; hops < 40; ++hops) {  // as many as the kernel follows
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) return at.string();
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) return at.string();
    at = target.is_absolute() ? target : at.parent_path() / target;
    through_proc = through_proc || at.string().rfind("/proc/", 0) == 0;
  }
  throw Error(path + ": cannot write (" + reason(ELOOP) + ")");
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  auto failed = [&](int error_number) {
    return Error(path + ": write failed (" + reason(error_number) + ")");
  };
  bool through_proc = false;
  const std::string file = follow_links(path, through_proc);
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (through_proc ||
      (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
       !std::filesystem::is_directory(status))) {
    // A device, a pipe or an open descriptor (/dev/null, a FIFO, /dev/stdout): write straight
    // into it, never replace it.
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
  const std::filesystem::path target(file);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  remove_stale_temp_files(dir, target.filename().string() + ".tmp.");
  const std::string temp = file + ".tmp." + std::to_string(::getpid());
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
  if (std::rename(temp.c_str(), file.c_str()) != 0) {
    const int error_number = errno;
    discard();
    throw Error(path + ": cannot replace (" + reason(error_number) + ")");
  }
  unregister_temp_file(slot);
}

void write_bytes_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, [&](std::FILE* f) { write_text(f, bytes); });
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error_a, error_b;
  const std::filesystem::path canonical_a = std::filesystem::weakly_canonical(a, error_a);
  const std::filesystem::path canonical_b = std::filesystem::weakly_canonical(b, error_b);
  if (error_a || error_b) return a == b;
  return canonical_a == canonical_b;
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

void write_directory_atomically(const std::string& dir, const std::vector<std::string>& replaceable,
                                const std::function<void(const std::string& temp)>& write) {
  namespace fs = std::filesystem;
  const fs::path target = directory_to_replace(dir);
  const std::string parent = target.parent_path().string(), name = target.filename().string();
  remove_stale_temp_files(parent, name + ".");  // first: it may put `dir` back in place
  const bool replacing = existing_replaceable_directory(target, dir, replaceable);
  if (!replacing) make_directories(parent);
  const std::string temp =
      (target.parent_path() / (name + ".tmp." + std::to_string(::getpid()))).string();
  std::error_code ec;
  fs::remove_all(temp, ec);
  if (::mkdir(temp.c_str(), 0777) != 0)
    throw Error(temp + ": cannot create directory (" + reason(errno) + ")");
  std::string old;
  try {
    struct stat info;
    if (replacing && ::stat(target.c_str(), &info) == 0)
      ::chmod(temp.c_str(), info.st_mode & 07777);
    write(temp);
    sync_directory(temp);
    old = swap_into_place(temp, target.string(), replacing, dir);
    sync_directory(parent);
  } catch (const Error& e) {  // named as the user knows it, not by the temp directory
    fs::remove_all(temp, ec);
    std::string message = e.what();
    for (size_t at; (at = message.find(temp)) != std::string::npos;)
      message.replace(at, temp.size(), target.string());
    throw Error(message);
  } catch (...) {
    fs::remove_all(temp, ec);
    throw;
  }
  if (!old.empty()) fs::remove_all(old, ec);  // else removed as stale by a later writer
}

std::vector<std::string> make_directories(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> missing;
  std::error_code ec;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty() && !fs::exists(p, ec);
       p = p.parent_path()) {
    if (p.has_filename()) missing.insert(missing.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(path, ec);
  if (ec) throw Error(path + ": cannot create directory (" + ec.message() + ")");
  return missing;
}

void remove_stale_temp_files(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = temp_name_pid(name);
    std::error_code entry_ec;
    const bool is_directory = it->is_directory(entry_ec);
    if (pid < 0 || !(is_directory || it->is_regular_file(entry_ec)) || !process_is_gone(pid))
      continue;
    const size_t aside = name.rfind(".old.tmp.");
    const fs::path base = it->path().parent_path() / name.substr(0, aside);
    if (is_directory && aside != std::string::npos &&
        !fs::exists(fs::symlink_status(base, entry_ec)))
      fs::rename(it->path(), base, entry_ec);  // the only complete copy: back in its place
    else
      fs::remove_all(it->path(), entry_ec);
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
