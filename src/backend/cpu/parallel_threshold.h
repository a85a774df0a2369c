// When a CPU loop over independent elements or rows is worth splitting over the threads. One
// constant for every such loop, so that tuning it is one edit: below it, waking the other
// threads costs more than they save (a fork/join is ~1 µs; 32k float adds take ~5 µs). At it,
// a decoder step of 64 hypotheses × d_model 512 already runs in parallel. Loops that sum
// across elements keep their own fixed split (results must not depend on the thread count).
#pragma once

#include <cstdint>

namespace tfm {

constexpr int64_t kParallelElements = int64_t(1) << 15;

}  // namespace tfm
