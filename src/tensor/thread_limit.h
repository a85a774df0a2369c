// The most worker threads this process runs: a thread count from an option or from
// OMP_NUM_THREADS is checked against it before any parallel region starts, because libgomp
// creates the teams it is asked for — 100,000 threads crashed in its first parallel region
// (SIGSEGV while loading a model), and 4,096 turned a 0.09 s translation into 19 s.
#pragma once

#include <string>

namespace tfm {

// 4 × the CPUs this process may run on (its affinity mask; at least 1): room for
// oversubscription on purpose, none for a typo.
int max_worker_threads();

// Why the OpenMP environment asks for too many threads (OMP_NUM_THREADS's first value above
// max_worker_threads()), or "" when it does not.
std::string thread_environment_problem();

// The OpenMP team size the library's own parallel regions ask for: omp_get_max_threads(),
// never above max_worker_threads().
int worker_threads();

}  // namespace tfm
