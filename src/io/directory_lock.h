// An exclusive lock on a directory for the lifetime of one process's use of it (a training run's
// --model-dir), so that two runs, or a --resume beside a running one, never interleave their
// checkpoints, best model and log. flock(2) on DIR/.lock: the kernel releases it when the
// process ends however it ends, so a crash never leaves a stale lock behind.
#pragma once

#include <string>

namespace tfm {

class DirectoryLock {
 public:
  // Takes the lock or throws Error naming the holder's pid; `what` names the user ("training run").
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace tfm
