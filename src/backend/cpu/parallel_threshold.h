// When a CPU loop over independent elements or rows is worth splitting over the threads. One
// constant for every such loop, so that tuning it is one edit: below it, waking the other
// threads costs more than they save (a fork/join is about a microsecond). At 16k elements a
// greedy decoder step of 32 sentences × d_model 512 runs its additions, layer norms, copies
// and quantisations in parallel: 2–3% faster whole-process greedy decoding than a threshold of
// 32k, which left them serial (2026-11-25, bench/ctranslate2_speed.py's base model). Loops
// that sum across elements keep their own fixed split (results must not depend on the thread
// count).
#pragma once

#include <cstdint>

namespace tfm {

constexpr int64_t kParallelElements = int64_t(1) << 14;

}  // namespace tfm
