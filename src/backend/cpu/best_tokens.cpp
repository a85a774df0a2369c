// best_tokens(): one pass over each row, rows spread over the threads. A chunk of 16 entries
// whose maximum does not beat the current keep-th best is skipped after one vector compare, so
// a row costs about one read of it. (A serial partial_sort of every token id per hypothesis
// was ~4% of a base model's beam-4 decoding.)
#include "backend/cpu/best_tokens.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/parallel_threshold.h"

namespace tfm {

namespace {

void best_tokens_of_row(const float* row, int64_t vocab, int64_t keep, int32_t banned,
                        float* values, int32_t* tokens) {
  int64_t count = 0;  // values[0, count) hold the best so far, largest first
  auto offer = [&](int64_t id) {
    float v = row[id];
    if (id == banned || v != v) v = -INFINITY;
    if (count == keep && !(v > values[keep - 1])) return;  // equal: the lower id stays
    int64_t i = count < keep ? count++ : keep - 1;
    for (; i > 0 && v > values[i - 1]; --i) {
      values[i] = values[i - 1];
      tokens[i] = tokens[i - 1];
    }
    values[i] = v;
    tokens[i] = int32_t(id);
  };
  constexpr int64_t kChunk = 16;
  int64_t id = 0;
  for (; id < vocab && count < keep; ++id) offer(id);
  for (; id + kChunk <= vocab; id += kChunk) {
    float chunk_max = -INFINITY;  // NaN never wins a comparison, so it never raises this
#pragma omp simd reduction(max : chunk_max)
    for (int64_t j = id; j < id + kChunk; ++j) chunk_max = std::max(chunk_max, row[j]);
    if (!(chunk_max > values[keep - 1])) continue;
    for (int64_t j = id; j < id + kChunk; ++j) offer(j);
  }
  for (; id < vocab; ++id) offer(id);
}

}  // namespace

TFM_CPU_KERNEL void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                                int32_t banned, float* values, int32_t* tokens, float* log_sums) {
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = scores + r * vocab;
    best_tokens_of_row(row, vocab, keep, banned, values + r * keep, tokens + r * keep);
    if (!log_sums) continue;
    const float log_sum = log_sum_exp(row, vocab);  // log_softmax_pick's, as it computes it
    log_sums[r] = log_sum;
    for (int64_t i = r * keep; i < (r + 1) * keep; ++i) values[i] -= log_sum;
  }
}

}  // namespace tfm
