// SIGINT / SIGTERM during a training run: they ask the run to stop at the end of its step and
// save, instead of killing it mid-update. A handler running inside a GEMM or an allocation on a
// compute thread is what this avoids, so the signals are blocked in the calling thread and in
// every OpenMP worker (threads created later inherit the mask) and taken by one waiting thread.
#pragma once

#include <atomic>
#include <csignal>
#include <thread>

namespace tfm {

// For its lifetime, SIGINT / SIGTERM set stop_signal() and interrupt nothing; afterwards the
// handlers and masks are as they were (a signal still pending then acts as it would have). The
// handler stays installed for threads that do not block them (e.g. an MPI library's own).
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
  sigset_t signals_{}, old_mask_{};
  std::atomic<bool> quit_{false};
  std::thread waiter_;
};

// The signal that asked the run to stop (SIGINT or SIGTERM); 0 while none has. Reset when a
// StopSignalGuard is created. While one lives, a signal sent but not yet taken by its waiting
// thread counts as soon as this is read.
const std::atomic<int>& stop_signal();

}  // namespace tfm
