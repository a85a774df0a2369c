// Optimizer kernels.
#include "backend/cpu/optimizer.h"

#include <cmath>

namespace tfm {

void adam_update(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamHyperparameters& h, int64_t step) {
  const double bias_correction1 = 1.0 - std::pow(double(h.beta1), double(step));
  const double bias_correction2 = 1.0 - std::pow(double(h.beta2), double(step));
  const float step_size = float(double(h.lr) / bias_correction1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bias_correction2));
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] = b1 * m[i] + (1.f - b1) * g;
    v[i] = b2 * v[i] + (1.f - b2) * g * g;
    param[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}

void sgd_update(float* param, const float* grad, int64_t n, float lr) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) param[i] -= lr * grad[i];
}

double sum_of_squares(const float* x, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += double(x[i]) * x[i];
  return total;
}

}  // namespace tfm
