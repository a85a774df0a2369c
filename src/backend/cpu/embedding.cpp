// Embedding gather and scatter-add on the CPU: OpenMP over rows, SIMD over d_model.
#include "backend/cpu/embedding.h"

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/parallel_threshold.h"

namespace tfm {

TFM_CPU_KERNEL void embedding_forward(const float* table, const float* positions,
                                      const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                      float scale, int64_t first_position, float* out) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelElements)
  for (int64_t row = 0; row < rows; ++row) {
    const float* embedding = table + int64_t(ids[row]) * d;
    float* o = out + row * d;  // [d]
    if (positions) {
      const float* pe = positions + (first_position + row % len) * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] = embedding[c] * scale + pe[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] = embedding[c] * scale;
    }
  }
}

TFM_CPU_KERNEL void embedding_forward(const Int8Rows& table, const float* positions,
                                      const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                      float scale, int64_t first_position, float* out) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelElements)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t id = ids[row];
    const int8_t* embedding = table.values + id * d;
    const float row_scale = table.scales[id] * scale;
    const float* pe = positions ? positions + (first_position + row % len) * d : nullptr;
    float* o = out + row * d;  // [d]
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] = float(embedding[c]) * row_scale + (pe ? pe[c] : 0.f);
  }
}

TFM_CPU_KERNEL void scale_and_add_positions(const float* positions, int64_t rows, int64_t len,
                                            int64_t d, float scale, int64_t first_position,
                                            float* out) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelElements)
  for (int64_t row = 0; row < rows; ++row) {
    float* o = out + row * d;  // [d]
    const float* pe = positions ? positions + (first_position + row % len) * d : nullptr;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] = o[c] * scale + (pe ? pe[c] : 0.f);
  }
}

TFM_CPU_KERNEL void embedding_backward(const float* d_out, const int32_t* ids, int64_t rows,
                                       int64_t len, int64_t d, float scale, int64_t first_position,
                                       float* d_table, float* d_positions) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* g = d_out + row * d;
    float* table_row = d_table + int64_t(ids[row]) * d;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) table_row[c] += scale * g[c];
    if (d_positions) {
      float* position_row = d_positions + (first_position + row % len) * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) position_row[c] += g[c];
    }
  }
}

}  // namespace tfm
