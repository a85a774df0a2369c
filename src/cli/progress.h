// Progress for long work: a live line on a terminal, a plain log line every few seconds
// otherwise (so logs from batch jobs stay readable).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace tfm {

class Progress {
 public:
  Progress(std::string what, int64_t total)
      : what_(std::move(what)),
        total_(total),
        terminal_(::isatty(2)),
        start_(Clock::now()),
        last_(start_) {}

  void update(int64_t done) {
    const auto now = Clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    if (since_last < (terminal_ ? 0.2 : 10.0)) return;
    last_ = now;
    print(done, terminal_ ? "\r" : "", terminal_ ? "" : "\n");
  }

  void finish(int64_t done) {
    if (terminal_ && std::chrono::duration<double>(Clock::now() - start_).count() > 0.5)
      print(done, "\r", "\n");
  }

 private:
  using Clock = std::chrono::steady_clock;
  void print(int64_t done, const char* prefix, const char* suffix) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "%s%s: %lld/%lld (%.0f%%) %.1fs%s", prefix, what_.c_str(), (long long)done,
                 (long long)total_, total_ ? 100.0 * double(done) / double(total_) : 100.0, seconds,
                 suffix);
    std::fflush(stderr);
  }
  std::string what_;
  int64_t total_;
  bool terminal_;
  Clock::time_point start_, last_;
};

}  // namespace tfm
