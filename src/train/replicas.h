// Data-parallel training across processes (`mpirun -np P transformer train ...`): the few
// collective operations the trainer needs, over MPI when the process was started by an MPI
// launcher, and nothing at all (no MPI call, no copy) in a single process. Every wait has a
// deadline and watches for SIGINT / SIGTERM, so a rank that dies or hangs ends the job with an
// error on the survivors instead of a silent hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/device_tensors.h"
#include "tensor/tensor.h"

namespace tfm {

class Replicas {
 public:
  // The process's replica group: joins the MPI job when an MPI launcher started this process
  // (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment) and this build has MPI;
  // otherwise one replica. Throws Error when launched by mpirun but built without MPI.
  static Replicas& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }
  bool primary() const { return rank_ == 0; }
  // Ranks on this machine (they share its memory), and this rank's number among them (0 to
  // local_size() − 1, in the order of their global ranks: which GPU it takes).
  int local_size() const { return local_size_; }
  int local_rank() const { return local_rank_; }
  // "rank 1 of 4: " in a distributed job, "" otherwise (for messages).
  std::string prefix() const;

  // Seconds a collective may wait for the other ranks before the job is declared broken.
  void set_timeout(double seconds) { timeout_seconds_ = seconds; }
  // A flag set by the trainer's signal handler: a signal while waiting for the other ranks ends
  // the wait after a short grace period (mpirun signals every rank when one of them dies).
  void watch_stop_signal(const std::atomic<int>* flag) { stop_signal_ = flag; }

  // In place: every rank ends with the element-wise sum over ranks. No-ops with one replica.
  void sum(double* values, int64_t count);
  // Sums all tensors of `tensors` (same names and shapes on every rank) in place, their one
  // block reduced in buckets; returns the seconds spent on it. MPI reads the block where it is
  // in host memory (Backend::memory_is_host). A GPU's gradients are summed by the backend's own
  // collectives (NCCL: Backend::join_collectives, joined at the first call, which rank 0 logs),
  // or where it has none, through a copy in host memory (copied to the host, summed there by
  // MPI, copied back). TFM_DEVICE_COLLECTIVES=0 (on any rank) keeps the host copies.
  double sum_tensors(DeviceTensors& tensors);
  // Copies rank 0's tensors to every rank (the same way as sum_tensors).
  void broadcast_tensors(DeviceTensors& tensors);
  // True when `value` is the same on every rank.
  bool all_equal(uint64_t value);

  Replicas(const Replicas&) = delete;
  Replicas& operator=(const Replicas&) = delete;

 private:
  Replicas() = default;
  void join_mpi();
  // Polls `request` (an MPI_Request) until done, at most the timeout and extra_seconds
  // (CollectiveDeadline: its errors name this rank and `what`).
  void wait(void* request, const char* what, double extra_seconds = 0);
  // A device collective (DeviceCollectives' sum or broadcast) given this job's wait, its errors
  // prefixed with this rank.
  template <typename Collective>
  void on_device(Collective&& collective);
  // The collectives of `backend`'s memory (joined on first use; every rank calls this at the
  // same points), or null where it has none: MPI then reads host memory, the tensors' own or a
  // copy (how, and why, logged once by rank 0).
  DeviceCollectives* device_collectives(const Backend& backend);

  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  // [the largest numel handed over]: the host copy of device memory that sum_tensors and
  // broadcast_tensors give MPI.
  std::vector<float> staging_;
  const Backend* collectives_backend_ = nullptr;    // whose collectives were tried, if any
  std::unique_ptr<DeviceCollectives> collectives_;  // null: none (host copies)
  double timeout_seconds_ = 300;
  const std::atomic<int>* stop_signal_ = nullptr;
};

// After an error on this rank: ends the whole MPI job (MPI_Abort) so the other ranks do not
// wait for it. Does nothing outside a distributed job.
void abort_replicas(int exit_code);

// 64-bit FNV-1a, for replica checks: continued from `hash` over `text`, or over every tensor's
// name and bytes (read where they are, or through a host copy of one tensor at a time).
inline constexpr uint64_t kChecksumStart = 0xcbf29ce484222325ull;
uint64_t checksum_text(const std::string& text, uint64_t hash = kChecksumStart);
uint64_t checksum_tensors(const DeviceTensors& tensors, uint64_t hash = kChecksumStart);
// Over every sequence's length and ids, in order.
uint64_t checksum_sequences(const std::vector<std::vector<int32_t>>& sequences,
                            uint64_t hash = kChecksumStart);

}  // namespace tfm
