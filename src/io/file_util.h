// Whole-file reads and atomic writes (temp file in the same directory + fsync + rename), so an
// interrupted run never leaves a half-written model, checkpoint or output behind.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

namespace tfm {

// Throws Error naming the file if it cannot be read.
std::string read_file_bytes(const std::string& path);

// Calls write(stream) on a temp file next to `path`, then renames it over `path`.
// On any failure the temp file is removed and Error is thrown; `path` is untouched.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// write_file_atomically for bytes already in memory.
void write_bytes_atomically(const std::string& path, const std::string& bytes);

// A command's main output: calls write(stdout) and flushes it when `path` is empty or "-",
// otherwise writes `path` through write_file_atomically.
void write_output(const std::string& path, const std::function<void(std::FILE*)>& write);

// Creates the directory (and parents) if missing; throws Error on failure.
void make_directories(const std::string& path);

}  // namespace tfm
