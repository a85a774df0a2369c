// The registry of the backends built into this binary, and --device's lookup.
#include "backend/backend.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "tensor/error.h"

#ifdef TRANSFORMER_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace tfm {

const std::vector<const Backend*>& available_backends() {
  // A new backend adds itself here (under its build option).
  static const std::vector<const Backend*> backends = [] {
    std::vector<const Backend*> list = {&cpu_backend()};
#ifdef TRANSFORMER_WITH_CUDA
    for (const Backend* gpu : cuda_backends()) list.push_back(gpu);
#endif
    return list;
  }();
  return backends;
}

std::string Backend::unsupported_reason(Precision) const {
  return "is not supported by device " + name();
}

int64_t Backend::relu_mask_bytes(int64_t, int64_t) const {
  return 0;
}

int64_t Backend::dropout_mask_bytes(int64_t n) const {
  return n;
}

bool Backend::attention_reads_rounded_inputs(const AttentionShape&, const AttentionMask&,
                                             const AttentionDropout&) const {
  return false;
}

int64_t Backend::attention_weights_floats(const AttentionShape& shape, const AttentionMask&,
                                          const AttentionDropout&) const {
  return shape.batch * shape.heads * shape.query_len * shape.key_len;
}

CollectiveDeadline::CollectiveDeadline(const CollectiveWait& wait, std::string prefix,
                                       const char* peers)
    : wait_(wait),
      prefix_(std::move(prefix)),
      peers_(peers),
      start_(std::chrono::steady_clock::now()) {}

void CollectiveDeadline::check(const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  if (wait_.stop && *wait_.stop && signalled_ == Clock::time_point{}) signalled_ = now;
  const double grace_seconds = std::min(wait_.timeout_seconds, 60.0);
  if (signalled_ != Clock::time_point{} &&
      std::chrono::duration<double>(now - signalled_).count() > grace_seconds)
    throw Error(prefix_ + "stopped by a signal while waiting for the other " + peers_ + " (" +
                what + "); a rank has probably failed. The last checkpoint is intact");
  if (std::chrono::duration<double>(now - start_).count() > wait_.timeout_seconds)
    throw Error(prefix_ + "no answer from the other " + peers_ + " for " +
                std::to_string(int64_t(wait_.timeout_seconds)) + " s (" + what +
                "); a rank has failed or hangs (--replica-timeout sets the limit)");
}

std::unique_ptr<DeviceCollectives> Backend::join_collectives(int, int,
                                                             const CollectiveBootstrap& bootstrap,
                                                             const CollectiveWait&,
                                                             std::string* why_not) const {
  // Every rank answers the agreement the GPU backends ask for, so a job whose ranks run on
  // backends of different kinds falls back on every rank alike.
  bootstrap.all_agree(false);
  if (why_not) *why_not = "device " + name() + " has no collectives of its own";
  return nullptr;
}

void Backend::round_each_to_16_bits(const std::vector<RoundingJob>& jobs, Precision format) const {
  if (!is_16_bit_float(format))
    throw std::invalid_argument("round_each_to_16_bits: the format is bfloat16 or float16");
  // A job as rows of kRow floats and one shorter row: a backend that shares rows among its
  // threads (the CPU's) keeps them all busy on one long job.
  constexpr int64_t kRow = 1024;
  for (const RoundingJob& job : jobs) {
    if (job.count <= 0) continue;
    const int64_t rows = job.count / kRow, done = rows * kRow;
    if (rows > 0) round_to_16_bits(job.x, rows, kRow, kRow, format, job.out);
    if (job.count > done)
      round_to_16_bits(job.x + done, 1, job.count - done, job.count - done, format, job.out + done);
  }
}

std::vector<std::string> built_backend_kinds() {
  std::vector<std::string> kinds = {"cpu"};
#ifdef TRANSFORMER_WITH_CUDA
  kinds.push_back("cuda");
#endif
  return kinds;
}

std::string available_backend_names() {
  std::string names;
  for (const Backend* backend : available_backends()) {
    if (!names.empty()) names += ", ";
    names += backend->name();
  }
  return names;
}

const Backend& find_backend(const std::string& device) {
  const auto& backends = available_backends();
  // "auto": the first accelerator this machine has, else the CPU.
  if (device == "auto") return *backends[backends.size() > 1 ? 1 : 0];
  for (const Backend* backend : backends)
    if (backend->name() == device || (device == backend->name() + ":0")) return *backend;
  std::string why;
#ifdef TRANSFORMER_WITH_CUDA
  if (device.rfind("cuda", 0) == 0 && cuda_backends().empty())
    why = "; " + cuda_unavailable_reason();
#else
  if (device.rfind("cuda", 0) == 0) why = "; this build has no CUDA backend (built without nvcc)";
#endif
  throw Error("unknown device \"" + device + "\" (this build has: " + available_backend_names() +
              why + ")");
}

const Backend& find_backend(const std::string& device, int local_rank) {
  const auto& backends = available_backends();
  const size_t accelerators = backends.size() - 1;  // every backend after the CPU
  if (accelerators > 0 && local_rank > 0 && (device == "auto" || device == backends[1]->name()))
    return *backends[1 + size_t(local_rank) % accelerators];
  return find_backend(device);
}

}  // namespace tfm
