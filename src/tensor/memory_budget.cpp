// The memory limit: physical memory by default.
#include "tensor/memory_budget.h"

#include <malloc.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tensor/error.h"

namespace tfm {

namespace {

int64_t g_limit = 0;  // 0: physical memory

int64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return INT64_MAX;
  return int64_t(pages) * int64_t(page_size);
}

// "2.50 GiB", or "137.4 MiB" below a GiB (where two decimals of GiB would read 0.13).
std::string readable_size(int64_t bytes) {
  char text[32];
  if (bytes < (int64_t(1) << 30))
    std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(1 << 20));
  else
    std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return text;
}

}  // namespace

void set_memory_limit(int64_t bytes) {
  g_limit = bytes;
}

int64_t memory_limit() {
  return g_limit > 0 ? g_limit : physical_memory();
}

void check_memory(int64_t bytes, const std::string& what) {
  const int64_t limit = memory_limit();
  if (bytes < 0 || bytes > limit)
    throw Error(what + " needs " +
                (bytes < 0 ? std::string("more than 8 EiB") : readable_size(bytes)) +
                ", more than the " + readable_size(limit) +
                (g_limit > 0 ? " allowed by --max-memory" : " of memory this machine has"));
}

int64_t parse_memory_size(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  double scale = 1;
  const std::string unit = end ? std::string(end) : "";
  if (unit == "K" || unit == "k" || unit == "KiB")
    scale = 1024.0;
  else if (unit == "M" || unit == "MiB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty())
    throw UsageError("--max-memory: unknown unit in \"" + text + "\" (use e.g. 512M or 8G)");
  if (text.empty() || end == text.c_str() || !std::isfinite(value) || value <= 0 ||
      value * scale < 1)
    throw UsageError("--max-memory: \"" + text + "\" is not a positive size (use e.g. 512M or 8G)");
  if (value * scale >= 9.2e18)
    throw UsageError("--max-memory: \"" + text + "\" is more than 8 EiB");
  return int64_t(value * scale);
}

int64_t resident_memory_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long total = 0, resident = 0;
  const bool ok = std::fscanf(f, "%lld %lld", &total, &resident) == 2;
  std::fclose(f);
  return ok ? resident * int64_t(::sysconf(_SC_PAGESIZE)) : 0;
}

void retain_freed_memory() {
  // Blocks come from the heap up to 1 GiB (never mmap'd on their own), and a free top of the heap
  // is returned to the system only beyond 1 GiB. A glibc that refuses the threshold keeps its
  // defaults: setting only the trim threshold would turn off its adaptive mmap threshold.
  if (mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1) mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void release_freed_memory() {
  malloc_trim(0);
}

void limit_heaps(int heaps) {
  mallopt(M_ARENA_MAX, heaps);
}

}  // namespace tfm
