// What the CUDA backend's two attention paths share (attention.cu's per-query kernels and
// attention_dense.cu's whole-matrix products): which keys a query sees, and where a sequence's
// keys start. Device code; included by those two files only.
#pragma once

#include <cstdint>

#include "backend/operation_types.h"

namespace tfm {
namespace cuda {

// Visible keys [begin, end) of the query at absolute `position` among `key_count` valid keys
// (backend/cpu/attention.cpp's rule: causal, window), clamped to them: a query past the last
// valid key gets an empty range.
__device__ __forceinline__ void visible_keys(const AttentionMask& mask, int64_t key_count,
                                             int64_t position, int64_t* begin, int64_t* end) {
  int64_t lo = 0, hi = key_count;
  if (mask.causal && position + 1 < hi) hi = position + 1;
  if (mask.window >= 0) {
    if (position - mask.window > lo) lo = position - mask.window;
    if (!mask.causal && position + mask.window + 1 < hi) hi = position + mask.window + 1;
  }
  lo = lo < key_count ? lo : key_count;
  hi = hi < key_count ? hi : key_count;
  *begin = lo;
  *end = hi > lo ? hi : lo;
}

// Elements from one sequence's keys (or values) to the next: AttentionShape's batch stride, or
// key_len rows when it is 0 (a dense batch).
__host__ __device__ __forceinline__ int64_t sequence_stride(int64_t given, int64_t key_len,
                                                            int64_t row_stride) {
  return given ? given : key_len * row_stride;
}

}  // namespace cuda
}  // namespace tfm
