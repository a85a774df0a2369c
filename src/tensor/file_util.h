// Whole-file reads and atomic writes (temp file in the same directory + fsync + rename), so an
// interrupted run never leaves a half-written model, checkpoint or output behind; the same for a
// directory of several files written as one (a model directory, a CTranslate2 export); checked
// writes to standard output; the cleanup of temp files on signals and after a crash.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tfm {

// Throws Error unless `path` is a regular file: a FIFO or device where a model, vocabulary or
// config is expected would block in open() or never end.
void require_regular_file(const std::string& path);

// The bytes of a regular file; throws Error naming the file if it cannot be read.
std::string read_file_bytes(const std::string& path);

// Writes `text` to `f`; throws WriteFailed (errno) when the stream refuses it. Writers passed to
// write_file_atomically / write_output use this; those name the file in the Error they throw.
void write_text(std::FILE* f, std::string_view text);
struct WriteFailed {
  int error_number;
};

// Whether two paths name the same file (after "." and "..", symbolic links and a relative
// start are resolved; a file that does not exist yet by its would-be path): a command given one
// file for two of its outputs would keep only the last it wrote.
bool same_file(const std::string& a, const std::string& b);

// Calls write(stream) on a temp file next to `path`, then renames it over `path`.
// On any failure the temp file is removed and Error is thrown; `path` is untouched.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// write_file_atomically for bytes already in memory.
void write_bytes_atomically(const std::string& path, const std::string& bytes);

// A command's main output: calls write(stdout) and flushes it when `path` is empty or "-",
// otherwise writes `path` through write_file_atomically.
void write_output(const std::string& path, const std::function<void(std::FILE*)>& write);

// Flushes standard output; throws Error("standard output: write failed (<reason>)") if anything
// written to it was lost (a full disk, /dev/full, a closed pipe).
void flush_standard_output();

// Writes a directory as a whole: write(temp) fills a new directory `dir`.tmp.<pid> beside `dir`
// (files written there through write_file_atomically are synced), then it takes the place of
// `dir` in one rename (RENAME_EXCHANGE where the file system has it, else the old one moved
// aside first) and the old one is removed. On any failure the new one is removed and `dir` is
// as it was, complete. An existing `dir` is replaced only when it holds nothing but entries
// named in `replaceable` (what the writer writes): a directory holding anything else is refused,
// never deleted. A symbolic link to a directory stays; the directory it names is replaced.
void write_directory_atomically(const std::string& dir, const std::vector<std::string>& replaceable,
                                const std::function<void(const std::string& temp)>& write);

// Creates the directory (and parents) if missing; throws Error on failure. Returns those it
// created, the deepest last (empty when `path` existed).
std::vector<std::string> make_directories(const std::string& path);

// Removes the temp files and directories (`<name>.tmp.<pid>`) in `dir` that a process that no
// longer runs left behind (kill -9, power loss); only those whose name starts with `prefix` when
// it is given. A directory such a process had moved aside (`<name>.old.tmp.<pid>`) goes back to
// `<name>` when nothing took that name.
void remove_stale_temp_files(const std::string& dir, const std::string& prefix = "");

// SIGINT, SIGTERM and SIGHUP remove the temp files this process is writing, then end it as the
// signal would have. Called once at program start; a command that handles these signals itself
// (training) installs its own handlers for its lifetime.
void remove_temp_files_on_signals();

}  // namespace tfm
