// See thread_limit.h.
#include "tensor/thread_limit.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tfm {

int max_worker_threads() {
  static const int limit = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return 4 * std::max(cpus, 1);
  }();
  return limit;
}

std::string thread_environment_problem() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (!value || !*value) return "";
  // A list ("8,2") sets nested levels; the first is the team size of a region.
  const char* end = value + std::strcspn(value, ",");
  char* parsed_end = nullptr;
  const long long threads = std::strtoll(value, &parsed_end, 10);
  if (parsed_end != end || threads <= max_worker_threads()) return "";
  return "OMP_NUM_THREADS=" + std::string(value) + " asks for more than " +
         std::to_string(max_worker_threads()) +
         " threads (4 × the CPUs this process may use); set it lower or pass --threads";
}

int worker_threads() {
  return std::min(omp_get_max_threads(), max_worker_threads());
}

}  // namespace tfm
