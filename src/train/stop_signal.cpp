// StopSignalGuard: SIGINT / SIGTERM become a flag the training loop reads between steps.
#include "train/stop_signal.h"

#include <omp.h>
#include <pthread.h>

#include <ctime>

namespace tfm {

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

}  // namespace

const std::atomic<int>& stop_signal() {
  return g_stop_signal;
}

StopSignalGuard::StopSignalGuard() {
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGTERM, &action, &old_term_);
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, &old_mask_);
#pragma omp parallel
  if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  waiter_ = std::thread([this] {
    while (!quit_) {
      const timespec tick{0, 100 * 1000 * 1000};  // 0.1 s: how soon the destructor returns
      const int signal = sigtimedwait(&signals_, nullptr, &tick);
      if (signal > 0) g_stop_signal = signal;
    }
  });
}

StopSignalGuard::~StopSignalGuard() {
  quit_ = true;
  waiter_.join();
  // Handlers first, then masks: a signal still pending acts as it would have without us.
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  const bool int_was_blocked = sigismember(&old_mask_, SIGINT) == 1;
  const bool term_was_blocked = sigismember(&old_mask_, SIGTERM) == 1;
  sigset_t unblock;
  sigemptyset(&unblock);
  if (!int_was_blocked) sigaddset(&unblock, SIGINT);
  if (!term_was_blocked) sigaddset(&unblock, SIGTERM);
#pragma omp parallel
  if (omp_get_thread_num() != 0) pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

}  // namespace tfm
