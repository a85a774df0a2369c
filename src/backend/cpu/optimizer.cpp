// Optimizer kernels.
#include "backend/cpu/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/parallel_threshold.h"

namespace tfm {

TFM_CPU_KERNEL void adam_update(float* param, const float* grad, float* m, float* v, int64_t n,
                                const AdamHyperparameters& h, int64_t step) {
  const double bias_correction1 = 1.0 - std::pow(double(h.beta1), double(step));
  const double bias_correction2 = 1.0 - std::pow(double(h.beta2), double(step));
  const float step_size = float(double(h.lr) / bias_correction1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bias_correction2));
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] = b1 * m[i] + (1.f - b1) * g;
    v[i] = b2 * v[i] + (1.f - b2) * g * g;
    param[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}

TFM_CPU_KERNEL void sgd_update(float* param, const float* grad, int64_t n, float lr) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) param[i] -= lr * grad[i];
}

TFM_CPU_KERNEL double sum_of_squares(const float* x, int64_t n) {
  // Blocks of a fixed size summed in parallel (8 double lanes each), then the block sums in
  // order: the result depends on n alone, not on the thread count, and a whole model's
  // gradients (one block of memory) take one pass at memory speed.
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));  // [blocks]
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const float* block = x + b * kBlock;
    const int64_t count = std::min(kBlock, n - b * kBlock);
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= count; i += 8)
      for (int lane = 0; lane < 8; ++lane) lanes[lane] += double(block[i + lane]) * block[i + lane];
    for (; i < count; ++i) lanes[i % 8] += double(block[i]) * block[i];
    partial[size_t(b)] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace tfm
