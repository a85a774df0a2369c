// Where a GPU pass spends its time, one operation at a time: with TFM_CUDA_PROFILE set in the
// environment, every Backend operation of the CUDA backend records a pair of CUDA events around
// what it enqueues, and the host's waits for the GPU (copies back, loss totals, Σ x²) are timed
// on the host clock; at exit the totals per operation go to stderr as a table, largest first.
// Without the variable nothing is recorded (one branch per operation). TFM_CUDA_PROFILE=shapes
// keys the table by operation and shape (the dimensions an operation names, e.g. a product's
// m×n×k), for the operations that give one. Events do not stop the
// stream, so the GPU runs as it does unprofiled; what the table leaves out is launch overhead
// and the gaps between operations (the "unaccounted" line: the stream's span less the sum).
#pragma once

#include <chrono>

#include "backend/cuda/cuda_common.h"

namespace tfm {
namespace cuda {

// Whether TFM_CUDA_PROFILE is set (read once).
bool profiling();
// Drops everything recorded so far (Backend::restart_profile): the table at exit then covers
// what ran after the call only.
void restart_profile();

// Events around one operation of `name` (a string literal) on the context's stream.
class ProfiledOperation {
 public:
  // dims: up to three dimensions for TFM_CUDA_PROFILE=shapes (0: none).
  ProfiledOperation(const Context& c, const char* name, int64_t dim0 = 0, int64_t dim1 = 0,
                    int64_t dim2 = 0);
  ~ProfiledOperation();
  // The name it is recorded under, where the operation learns which way it went after it began
  // (a prepared product on cuBLASLt, or its fallback).
  void rename(const char* name) { name_ = name; }
  ProfiledOperation(const ProfiledOperation&) = delete;
  ProfiledOperation& operator=(const ProfiledOperation&) = delete;

 private:
  const Context* context_ = nullptr;  // null: not profiling
  const char* name_ = nullptr;
  cudaEvent_t start_ = nullptr;
  int64_t dims_[3] = {0, 0, 0};
};

// Host time spent waiting for the stream, counted under "host waits".
class ProfiledWait {
 public:
  ProfiledWait();
  ~ProfiledWait();
  ProfiledWait(const ProfiledWait&) = delete;
  ProfiledWait& operator=(const ProfiledWait&) = delete;

 private:
  bool on_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cuda
}  // namespace tfm

// The first line of every CUDA backend operation: the device made current, the operation
// profiled when TFM_CUDA_PROFILE is set.
#define TFM_CUDA_OPERATION(context, name) \
  (context).activate();                   \
  const ::tfm::cuda::ProfiledOperation profiled_operation((context), (name))
// The same with the operation's dimensions, for TFM_CUDA_PROFILE=shapes.
#define TFM_CUDA_OPERATION_SHAPED(context, name, ...) \
  (context).activate();                               \
  const ::tfm::cuda::ProfiledOperation profiled_operation((context), (name), __VA_ARGS__)
