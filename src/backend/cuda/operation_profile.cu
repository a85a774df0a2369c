// See operation_profile.h.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/operation_profile.h"

namespace tfm {
namespace cuda {

namespace {

struct Record {
  const char* name;
  int64_t dims[3];
  cudaEvent_t start, stop;
};

// Whether TFM_CUDA_PROFILE=shapes asks for a row per operation and shape.
bool by_shape() {
  static const bool on = [] {
    const char* value = std::getenv("TFM_CUDA_PROFILE");
    return value && std::string(value) == "shapes";
  }();
  return on;
}

// The table's key of one record: its name, and its dimensions where rows are per shape.
std::string record_key(const Record& r) {
  std::string key = r.name;
  if (!by_shape() || r.dims[0] == 0) return key;
  key += " ";
  for (int i = 0; i < 3 && r.dims[i] != 0; ++i)
    key += (i ? "x" : "") + std::to_string(static_cast<long long>(r.dims[i]));
  return key;
}

struct Profile {
  std::mutex mutex;
  std::vector<Record> records;  // in the order enqueued
  double host_wait_seconds = 0;
  int64_t host_waits = 0;
};

Profile& profile() {
  static Profile* instance = new Profile;  // never destroyed: read by the exit handler
  return *instance;
}

// At exit: every recorded pair's time summed per name, printed largest first.
void print_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.records.empty()) return;
  cudaDeviceSynchronize();
  std::map<std::string, std::pair<int64_t, double>> by_name;  // calls, milliseconds
  double total = 0;
  for (const Record& r : p.records) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, r.start, r.stop) != cudaSuccess) continue;
    auto& entry = by_name[record_key(r)];
    ++entry.first;
    entry.second += ms;
    total += ms;
  }
  float span = 0;
  cudaEventElapsedTime(&span, p.records.front().start, p.records.back().stop);
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> rows(by_name.begin(),
                                                                       by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::fprintf(stderr, "cuda profile: %zu operations, %.1f ms on the GPU, stream span %.1f ms\n",
               p.records.size(), total, double(span));
  std::fprintf(stderr, "%-48s %9s %11s %10s %7s\n", "operation", "calls", "total ms", "ms/call",
               "share");
  for (const auto& [name, entry] : rows)
    std::fprintf(stderr, "%-48s %9lld %11.2f %10.4f %6.1f%%\n", name.c_str(),
                 static_cast<long long>(entry.first), entry.second,
                 entry.second / double(entry.first), 100.0 * entry.second / std::max(total, 1e-9));
  std::fprintf(stderr, "%-48s %9s %11.2f\n", "unaccounted (gaps, launches)", "",
               std::max(0.0, double(span) - total));
  std::fprintf(stderr, "%-48s %9lld %11.2f   (host clock)\n", "host waits for the GPU",
               static_cast<long long>(p.host_waits), 1e3 * p.host_wait_seconds);
}

}  // namespace

bool profiling() {
  static const bool on = [] {
    const char* value = std::getenv("TFM_CUDA_PROFILE");
    if (!value || !*value || std::string(value) == "0") return false;
    std::atexit(print_profile);
    return true;
  }();
  return on;
}

void restart_profile() {
  if (!profiling()) return;
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  cudaDeviceSynchronize();  // every recorded event has happened before it is destroyed
  for (const Record& r : p.records) {
    cudaEventDestroy(r.start);
    cudaEventDestroy(r.stop);
  }
  p.records.clear();
  p.host_wait_seconds = 0;
  p.host_waits = 0;
}

ProfiledOperation::ProfiledOperation(const Context& c, const char* name, int64_t dim0, int64_t dim1,
                                     int64_t dim2)
    : dims_{dim0, dim1, dim2} {
  // Never throws: operations run in destructors too (a buffer freed at exit).
  if (!profiling() || cudaEventCreate(&start_) != cudaSuccess) return;
  if (cudaEventRecord(start_, c.stream) != cudaSuccess) return;
  context_ = &c;
  name_ = name;
}

ProfiledOperation::~ProfiledOperation() {
  if (!context_) return;
  cudaEvent_t stop = nullptr;
  if (cudaEventCreate(&stop) != cudaSuccess) return;
  cudaEventRecord(stop, context_->stream);
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.records.push_back({name_, {dims_[0], dims_[1], dims_[2]}, start_, stop});
}

ProfiledWait::ProfiledWait() : on_(profiling()) {
  if (on_) start_ = std::chrono::steady_clock::now();
}

ProfiledWait::~ProfiledWait() {
  if (!on_) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.host_wait_seconds += seconds;
  ++p.host_waits;
}

}  // namespace cuda
}  // namespace tfm
