// Runs the `transformer` binary (TFM_CLI_PATH) the way a user does, for the command-line tests
// (cli_test, translate_cli_test, train_test, bleu_test). It exists so that those files share one
// scratch directory helper, one file writer and one way of capturing exit code, stdout and
// stderr, instead of each keeping its own copy.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace tfm::testing_support {

struct CliResult {
  int exit_code;  // the command's exit status, or 128 + signal when it was killed
  std::string out, err;
};

// A scratch directory for one test file and this process:
// <temp dir>/<test_name>_<pid>, emptied and created on first use.
class CliWorkDir {
 public:
  explicit CliWorkDir(std::string test_name) : test_name_(std::move(test_name)) {}
  // Removed with everything in it when the test program ends (every test process makes one,
  // and thousands of them filled /tmp), unless TFM_KEEP_TEST_DIRS is set, to look into after a
  // failure.
  ~CliWorkDir() {
    if (dir_.empty() || std::getenv("TFM_KEEP_TEST_DIRS")) return;
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  CliWorkDir(const CliWorkDir&) = delete;
  CliWorkDir& operator=(const CliWorkDir&) = delete;

  const std::string& dir() const {
    if (dir_.empty()) {
      namespace fs = std::filesystem;
      const fs::path d =
          fs::temp_directory_path() / (test_name_ + "_" + std::to_string(::getpid()));
      fs::remove_all(d);
      fs::create_directories(d);
      dir_ = d.string();
    }
    return dir_;
  }

  std::string path(const std::string& name) const { return dir() + "/" + name; }

  // Writes `text` byte for byte to path(name) and returns that path.
  std::string write_file(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // Runs `launcher TFM_CLI_PATH args` through the shell (so args may quote), stdin from
  // `stdin_path`; launcher is e.g. "mpirun -np 2 " or empty.
  CliResult run_cli(const std::string& args, const std::string& stdin_path = "/dev/null",
                    const std::string& launcher = "") const {
    return run_program(TFM_CLI_PATH, args, stdin_path, launcher);
  }
  // The same for another program of the build (a test's helper).
  CliResult run_program(const std::string& program, const std::string& args,
                        const std::string& stdin_path = "/dev/null",
                        const std::string& launcher = "") const {
    const std::string err_file = path("stderr.txt");
    const std::string command =
        launcher + program + " " + args + " 2>" + err_file + " <" + stdin_path;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) return {-1, "", "popen failed: " + command};
    std::string out;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
    const int status = ::pclose(pipe);
    std::ifstream err_in(err_file, std::ios::binary);
    std::ostringstream err;
    err << err_in.rdbuf();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out, err.str()};
  }

 private:
  std::string test_name_;
  mutable std::string dir_;
};

// Imports CTranslate2's Arabic→English transliteration test model (tests/data) into work/aren
// with `import-ctranslate2` and returns that directory (callers keep it in a static).
inline std::string import_transliteration_model(const CliWorkDir& work) {
  const std::string data = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  EXPECT_EQ(
      work.run_cli("import-ctranslate2 --force " + data + " -o " + work.path("aren")).exit_code, 0);
  return work.path("aren");
}

// Starts `argv` (argv[0] is the program's path) in the background in a new process group,
// stdout to /dev/null and stderr to `stderr_path`, through posix_spawn (no code runs between
// fork and exec in this multithreaded test process). Returns the pid (its process group id).
inline pid_t spawn_in_background(const std::vector<std::string>& argv,
                                 const std::string& stderr_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&files, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &files, &attributes, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attributes);
  return pid;
}

// Kills the process group of a spawn_in_background pid (SIGKILL) when it goes out of scope,
// so that a test that fails or returns before its own kill() and wait leaves no process
// running (such a leftover training run would hold the cores for the rest of the suite).
struct KillGroupOnExit {
  pid_t group;
  ~KillGroupOnExit() {
    if (group <= 0) return;
    kill(-group, SIGKILL);
    waitpid(group, nullptr, WNOHANG);
  }
};

// The --device name of this binary's first backend whose memory is not the host's (a GPU), or
// "" with the reason in `why`: what the GPU tests run on, or skip with.
inline std::string first_gpu_backend(std::string& why) {
  for (const Backend* backend : available_backends())
    if (!backend->memory_is_host()) return backend->name();
  why = "no GPU backend on this machine (this build has: " + available_backend_names() + ")";
  return "";
}

// The reversal task on token ids: work/prefix.src holds random sequences of ids 4..31 (lengths
// min_len..max_len), work/prefix.tgt their reversals, one pair per line.
inline void write_reversal_data(const CliWorkDir& work, const std::string& prefix, int pairs,
                                int min_len, int max_len, unsigned seed) {
  std::mt19937 random(seed);
  std::ofstream src(work.path(prefix + ".src")), tgt(work.path(prefix + ".tgt"));
  for (int i = 0; i < pairs; ++i) {
    const int len = min_len + int(random() % unsigned(max_len - min_len + 1));
    std::vector<int> tokens(static_cast<size_t>(len));
    for (int& t : tokens) t = 4 + int(random() % 28);
    for (int j = 0; j < len; ++j) src << tokens[size_t(j)] << (j + 1 < len ? " " : "\n");
    for (int j = len - 1; j >= 0; --j) tgt << tokens[size_t(j)] << (j > 0 ? " " : "\n");
  }
}

}  // namespace tfm::testing_support
