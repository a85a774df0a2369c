// See nccl_collectives.h. The communicator is non-blocking (ncclConfig_t::blocking = 0), so that
// no call waits on the other ranks inside NCCL: each returns at once, and the host polls the
// communicator's state and the stream against the job's deadline and stop flag, as Replicas
// polls MPI's requests. A failure aborts the communicator (ncclCommAbort), which ends its
// kernels on this GPU.
#include <dlfcn.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/nccl_collectives.h"
#include "tensor/error.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define TFM_NCCL_HEADER 1
#endif

namespace tfm {
namespace cuda {

#ifdef TFM_NCCL_HEADER

namespace {

// The functions used, with nccl.h's types, looked up by their exported names.
struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;  // the message behind the result code
  std::string missing;  // why it could not be loaded; empty where it was
};

NcclLibrary load_nccl() {
  NcclLibrary library;
  void* handle = nullptr;
  std::string tried;
  for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
    if (handle) break;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(name) + ": " + (why ? why : "not found");
  }
  if (!handle) {
    library.missing = "NCCL could not be loaded (" + tried + ")";
    return library;
  }
  const auto look_up = [&](const char* name, auto& function) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, name));
    if (!function && library.missing.empty())
      library.missing = std::string("NCCL: the library has no ") + name;
  };
  look_up("ncclGetVersion", library.get_version);
  look_up("ncclGetUniqueId", library.get_unique_id);
  look_up("ncclCommInitRankConfig", library.init_rank_config);
  look_up("ncclCommGetAsyncError", library.async_error);
  look_up("ncclCommAbort", library.abort);
  look_up("ncclCommDestroy", library.destroy);
  look_up("ncclAllReduce", library.all_reduce);
  look_up("ncclBroadcast", library.broadcast);
  look_up("ncclGetErrorString", library.error_string);
  look_up("ncclGetLastError", library.last_error);
  return library;
}

const NcclLibrary& nccl() {
  static const NcclLibrary library = load_nccl();
  return library;
}

// "NCCL: invalid usage: Duplicate GPU detected ..." (the last error's text where NCCL has one).
std::string nccl_error(ncclResult_t result, ncclComm_t comm = nullptr) {
  std::string text = std::string("NCCL: ") + nccl().error_string(result);
  const char* detail = nccl().last_error(comm);
  if (detail && *detail) text += std::string(": ") + detail;
  return text;
}

// Polls until ready() says so, checking the communicator's state: Error where it reports an
// error, or where the wait ends (CollectiveDeadline). `what` names the wait in the message.
template <typename Ready>
void poll(ncclComm_t comm, const CollectiveWait& wait, const char* what, Ready&& ready) {
  CollectiveDeadline deadline(wait, "", "GPUs");
  for (int64_t polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = nccl().async_error(comm, &state);
    if (queried != ncclSuccess) throw Error(nccl_error(queried, comm) + " (" + what + ")");
    if (state != ncclSuccess && state != ncclInProgress)
      throw Error(nccl_error(state, comm) + " (" + what + ")");
    if (state == ncclSuccess && ready()) return;
    if (polls < 1024) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    deadline.check(what);
  }
}

class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(const Context& c, ncclComm_t comm) : context_(c), comm_(comm) {}
  ~NcclCollectives() override {
    if (!comm_) return;
    if (cudaSetDevice(context_.device) != cudaSuccess) return;  // never throws (a destructor)
    // Destroy waits for the communicator's work, which the collectives have waited for.
    nccl().destroy(comm_);
  }

  void sum(float* data, int64_t n, const CollectiveWait& wait) override {
    run(wait, "gradient all-reduce on the GPUs", [&] {
      return nccl().all_reduce(data, data, size_t(n), ncclFloat32, ncclSum, comm_, context_.stream);
    });
  }
  void broadcast(float* data, int64_t n, const CollectiveWait& wait) override {
    run(wait, "parameter broadcast on the GPUs", [&] {
      return nccl().broadcast(data, data, size_t(n), ncclFloat32, 0, comm_, context_.stream);
    });
  }
  std::string description() const override {
    int version = 0;
    nccl().get_version(&version);  // e.g. 22803: major · 10000 + minor · 100 + patch
    return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
           "." + std::to_string(version % 100);
  }

 private:
  // Enqueues the collective on the stream (after the work before it), then waits for the stream:
  // the collective and everything before it done. On any failure the communicator is aborted.
  template <typename Enqueue>
  void run(const CollectiveWait& wait, const char* what, Enqueue&& enqueue) {
    if (!comm_)
      throw Error(std::string("NCCL: the communicator was aborted earlier (") + what + ")");
    context_.activate();
    try {
      const ncclResult_t enqueued = enqueue();
      if (enqueued != ncclSuccess && enqueued != ncclInProgress)
        throw Error(nccl_error(enqueued, comm_) + " (" + what + ")");
      poll(comm_, wait, what, [&] {
        const cudaError_t status = cudaStreamQuery(context_.stream);
        if (status == cudaErrorNotReady) return false;
        check(status, "cudaStreamQuery (the collective's stream)");
        return true;
      });
    } catch (...) {
      nccl().abort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  const Context& context_;
  ncclComm_t comm_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> join_nccl(const Context& c, int rank, int size,
                                             const CollectiveBootstrap& bootstrap,
                                             const CollectiveWait& wait, std::string* why_not) {
  const NcclLibrary& library = nccl();
  const bool loaded = library.missing.empty();
  // Every rank's answer first: a rank without NCCL would leave the others waiting in its
  // initialisation.
  if (!bootstrap.all_agree(loaded)) {
    if (why_not)
      *why_not = loaded ? "another rank has no NCCL, or no collectives (not a GPU, or "
                          "TFM_DEVICE_COLLECTIVES=0)"
                        : library.missing;
    return nullptr;
  }
  // Rank 0's unique id, and a last byte saying whether it made one (else every rank gives up).
  std::vector<char> id(sizeof(ncclUniqueId) + 1, 0);
  std::string failure;
  if (rank == 0) {
    ncclUniqueId unique{};
    const ncclResult_t made = library.get_unique_id(&unique);
    if (made == ncclSuccess) {
      std::memcpy(id.data(), &unique, sizeof unique);
      id.back() = 1;
    } else {
      failure = nccl_error(made) + " (rank 0's unique id)";
    }
  }
  bootstrap.share(id);
  if (id.back() != 1 && failure.empty()) failure = "NCCL could not make a unique id on rank 0";
  ncclComm_t comm = nullptr;
  if (failure.empty()) {
    try {
      c.activate();  // NCCL takes the current device
      ncclUniqueId unique;
      std::memcpy(&unique, id.data(), sizeof unique);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t started = library.init_rank_config(&comm, size, unique, rank, &config);
      if (started != ncclSuccess && started != ncclInProgress)
        throw Error(nccl_error(started, comm) + " (joining the other GPUs)");
      poll(comm, wait, "joining the other GPUs", [] { return true; });
    } catch (const std::exception& e) {
      failure = e.what();
      if (comm) library.abort(comm);
      comm = nullptr;
    }
  }
  if (!bootstrap.all_agree(failure.empty())) {
    if (comm) library.abort(comm);
    if (why_not) *why_not = failure.empty() ? "NCCL failed to join on another rank" : failure;
    return nullptr;
  }
  return std::make_unique<NcclCollectives>(c, comm);
}

#else  // no nccl.h where this was built

std::unique_ptr<DeviceCollectives> join_nccl(const Context&, int, int,
                                             const CollectiveBootstrap& bootstrap,
                                             const CollectiveWait&, std::string* why_not) {
  bootstrap.all_agree(false);
  if (why_not) *why_not = "this build has no NCCL (nccl.h was not found)";
  return nullptr;
}

#endif

}  // namespace cuda
}  // namespace tfm
