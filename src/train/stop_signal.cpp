// StopSignalGuard: SIGINT / SIGTERM become a flag the training loop reads between steps.
#include "train/stop_signal.h"

#include <omp.h>
#include <pthread.h>

#include <ctime>

namespace tfm {

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_guarded{false};  // a StopSignalGuard has the signals blocked

extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

}  // namespace

const std::atomic<int>& stop_signal() {
  // A signal already sent but not yet taken by the waiting thread (not scheduled since, on a
  // busy machine) counts too: a check right after loading must see a SIGTERM that came during
  // it, or the run would go on to save a checkpoint it should not have written.
  if (g_stop_signal == 0 && g_guarded) {
    sigset_t pending;
    int signal = 0;
    if (sigpending(&pending) == 0)
      signal = sigismember(&pending, SIGTERM) == 1  ? SIGTERM
               : sigismember(&pending, SIGINT) == 1 ? SIGINT
                                                    : 0;
    int none = 0;
    if (signal) g_stop_signal.compare_exchange_strong(none, signal);
  }
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
  g_guarded = true;
  waiter_ = std::thread([this] {
    while (!quit_) {
      const timespec tick{0, 100 * 1000 * 1000};  // 0.1 s: how soon the destructor returns
      const int signal = sigtimedwait(&signals_, nullptr, &tick);
      if (signal > 0) g_stop_signal = signal;
    }
  });
}

StopSignalGuard::~StopSignalGuard() {
  g_guarded = false;
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
