// Replicas over MPI (non-blocking collectives polled against a deadline), or a single process.
#include "train/replicas.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tensor/error.h"

#ifdef TRANSFORMER_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: MPI's deprecated C++ bindings need another library
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace tfm {

namespace {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

}  // namespace

Replicas& Replicas::world() {
  static Replicas* replicas = [] {
    // Never destroyed (MPI_Finalize runs at exit); freed when joining throws, and then tried
    // again by the next call.
    auto r = std::unique_ptr<Replicas>(new Replicas());
    if (launched_by_mpi()) r->join_mpi();
    return r.release();
  }();
  return *replicas;
}

std::string Replicas::prefix() const {
  if (!distributed()) return "";
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
}

namespace {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace

uint64_t checksum_text(const std::string& text, uint64_t hash) {
  return fnv1a(text.data(), text.size(), hash);
}

uint64_t checksum_tensors(const DeviceTensors& tensors, uint64_t hash) {
  std::vector<float> staged;  // one tensor, where the host cannot read the backend's memory
  for (const auto& [name, entry] : tensors) {
    hash = fnv1a(name.data(), name.size(), hash);
    if (!entry.data) continue;  // released
    const float* values = host_readable(tensors.backend(), entry.ptr(), entry.numel(), staged);
    hash = fnv1a(values, size_t(entry.numel()) * sizeof(float), hash);
  }
  return hash;
}

uint64_t checksum_sequences(const std::vector<std::vector<int32_t>>& sequences, uint64_t hash) {
  for (const auto& ids : sequences) {
    const uint64_t length = ids.size();
    hash = fnv1a(&length, sizeof length, hash);
    hash = fnv1a(ids.data(), ids.size() * sizeof(int32_t), hash);
  }
  return hash;
}

#ifdef TRANSFORMER_WITH_MPI

namespace {

// 16 Mi floats (64 MiB) per non-blocking all-reduce: large enough to run at link speed, small
// enough that the wait loop checks its deadline and signals often.
constexpr int64_t kBucketFloats = int64_t(1) << 24;

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(std::string("MPI ") + what + " failed: " + std::string(text, size_t(length)));
}

}  // namespace

void Replicas::join_mpi() {
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
  if (provided < MPI_THREAD_FUNNELED)
    throw Error("the MPI library does not support threads (MPI_THREAD_FUNNELED)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // The ranks that share this machine's memory, from MPI itself (whatever the launcher: mpirun,
  // srun, a PMIx server), numbered by their global rank.
  MPI_Comm machine;
  check_mpi(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &machine),
      "split by machine");
  MPI_Comm_rank(machine, &local_rank_);
  MPI_Comm_size(machine, &local_size_);
  MPI_Comm_free(&machine);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

void Replicas::wait(void* request_ptr, const char* what, double extra_seconds) {
  auto* request = static_cast<MPI_Request*>(request_ptr);
  // mpirun sends SIGTERM to every rank when one dies; live ranks finish this collective (rank 0
  // may be saving a checkpoint meanwhile) within the deadline's grace period and then stop
  // together at the end of the step.
  CollectiveDeadline deadline({timeout_seconds_ + extra_seconds, stop_signal_}, prefix(), "ranks");
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    sched_yield();  // lets OpenMP / other processes on this core run; MPI_Test drives progress
    if (polls % 256 == 0) deadline.check(what);
  }
}

void Replicas::sum(double* values, int64_t count) {
  if (!distributed() || count == 0) return;
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values, int(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
                           &request),
            "all-reduce");
  wait(&request, "all-reduce of step totals");
}

namespace {

// Runs `collective` over `n` floats at `data` in `backend`'s memory where MPI can reach them: in
// place in host memory, else on a host copy in `staging` (a GPU's memory: MPI is handed host
// pointers only), which is filled first where `download` and copied back after.
template <typename Collective>
void on_host_copy(const Backend& backend, float* data, int64_t n, bool download,
                  std::vector<float>& staging, Collective&& collective) {
  if (backend.memory_is_host() || n == 0) return collective(data);
  staging.resize(size_t(n));
  if (download) backend.copy_to_host(data, n * int64_t(sizeof(float)), staging.data());
  collective(staging.data());
  backend.copy_from_host(staging.data(), n * int64_t(sizeof(float)), data);
}

}  // namespace

template <typename Collective>
void Replicas::on_device(Collective&& collective) {
  try {
    collective(CollectiveWait{timeout_seconds_, stop_signal_});
  } catch (const Error& e) {
    throw Error(prefix() + e.what());
  }
}

DeviceCollectives* Replicas::device_collectives(const Backend& backend) {
  // Every rank joins, whatever its backend (the CPU's answers no, and so do the others then),
  // at the first sum or broadcast of a backend's tensors.
  if (collectives_backend_ == &backend) return collectives_.get();
  collectives_backend_ = &backend;
  collectives_.reset();
  CollectiveBootstrap bootstrap;
  bootstrap.all_agree = [this](bool ok) {
    int all_ok = ok ? 1 : 0;
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &request),
              "all-reduce");
    // A minute longer than the collectives' own waits: a rank whose joining failed at once waits
    // here for the others, which give up on it only when their wait ends.
    wait(&request, "joining the devices' collectives", 60);
    return all_ok != 0;
  };
  bootstrap.share = [this](std::vector<char>& bytes) {
    MPI_Request request;
    check_mpi(MPI_Ibcast(bytes.data(), int(bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD, &request),
              "broadcast");
    wait(&request, "joining the devices' collectives");
  };
  std::string why_not;
  const char* setting = std::getenv("TFM_DEVICE_COLLECTIVES");
  if (setting && std::strcmp(setting, "0") == 0) {
    bootstrap.all_agree(false);  // the one call a rank without collectives makes
    why_not = "TFM_DEVICE_COLLECTIVES=0";
  } else {
    // What escapes is MPI's (Replicas::wait's errors, which name the rank): the backend's own
    // failures come back as why_not, agreed on.
    collectives_ = backend.join_collectives(rank_, size_, bootstrap,
                                            {timeout_seconds_, stop_signal_}, &why_not);
  }
  const std::string how = collectives_ ? "on the devices with " + collectives_->description()
                                       : "with MPI in host memory (" + why_not + ")";
  if (primary()) std::fprintf(stderr, "data parallel: gradients summed %s\n", how.c_str());
  return collectives_.get();
}

double Replicas::sum_tensors(DeviceTensors& tensors) {
  if (!distributed()) return 0;
  const int64_t total = tensors.numel();
  const auto start = std::chrono::steady_clock::now();
  if (DeviceCollectives* collectives = device_collectives(tensors.backend())) {
    on_device([&](const CollectiveWait& wait) {  // in place in the devices' memory
      collectives->sum(tensors.flat(), total, wait);
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  on_host_copy(tensors.backend(), tensors.flat(), total, true, staging_, [&](float* flat) {
    std::vector<MPI_Request> requests;
    for (int64_t begin = 0; begin < total; begin += kBucketFloats) {
      const int64_t count = std::min(kBucketFloats, total - begin);
      requests.emplace_back();
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, flat + begin, int(count), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD, &requests.back()),
                "gradient all-reduce");
    }
    for (MPI_Request& request : requests) wait(&request, "gradient all-reduce");
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Replicas::broadcast_tensors(DeviceTensors& tensors) {
  if (!distributed()) return;
  if (DeviceCollectives* collectives = device_collectives(tensors.backend())) {
    for (auto& [name, entry] : tensors) {
      if (!entry.data || entry.numel() == 0) continue;
      on_device([&](const CollectiveWait& wait) {
        collectives->broadcast(entry.ptr(), entry.numel(), wait);
      });
    }
    return;
  }
  for (auto& [name, entry] : tensors)
    on_host_copy(
        tensors.backend(), entry.ptr(), entry.numel(), primary(), staging_, [&](float* values) {
          for (int64_t begin = 0; begin < entry.numel(); begin += kBucketFloats) {
            MPI_Request request;
            check_mpi(
                MPI_Ibcast(values + begin, int(std::min(kBucketFloats, entry.numel() - begin)),
                           MPI_FLOAT, 0, MPI_COMM_WORLD, &request),
                "broadcast");
            wait(&request, "parameter broadcast");
          }
        });
}

bool Replicas::all_equal(uint64_t value) {
  if (!distributed()) return true;
  uint64_t low = value, high = value;
  MPI_Request requests[2];
  check_mpi(
      MPI_Iallreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &requests[0]),
      "all-reduce");
  check_mpi(
      MPI_Iallreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &requests[1]),
      "all-reduce");
  wait(&requests[0], "replica check");
  wait(&requests[1], "replica check");
  return low == high;
}

void abort_replicas(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
}

#else  // built without MPI: one replica, and a clear error under mpirun

void Replicas::join_mpi() {
  throw Error(
      "this transformer was built without MPI, so it cannot join an mpirun job (install "
      "libopenmpi-dev and rebuild)");
}

void Replicas::wait(void*, const char*, double) {}
void Replicas::sum(double*, int64_t) {}
double Replicas::sum_tensors(DeviceTensors&) {
  return 0;
}
void Replicas::broadcast_tensors(DeviceTensors&) {}
bool Replicas::all_equal(uint64_t) {
  return true;
}
void abort_replicas(int) {}

#endif

}  // namespace tfm
