// Fused label-smoothed cross-entropy forward + backward, one pass set per row.
#include "backend/cpu/cross_entropy.h"

#include <cmath>

#include "backend/cpu/fast_exp.h"

namespace tfm {

CrossEntropyTotals cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                  int64_t rows, int64_t vocab, float smoothing,
                                                  float grad_scale) {
  double loss = 0, nll = 0;
  int64_t correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss, nll, correct) if (rows * vocab > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits + r * vocab;
    const int32_t y = targets[r];
    float max_value = -INFINITY;
    int64_t argmax = 0;
    double sum_logits = 0;
    for (int64_t c = 0; c < vocab; ++c) {
      if (row[c] > max_value) max_value = row[c], argmax = c;
      sum_logits += row[c];
    }
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < vocab; ++c) sum += fast_exp(row[c] - max_value);
    const double log_sum = double(max_value) + std::log(double(sum));
    const double nll_row = log_sum - double(row[y]);
    const double smooth_row = log_sum - sum_logits / double(vocab);  // mean_k(−log p_k)
    loss += (1.0 - smoothing) * nll_row + smoothing * smooth_row;
    nll += nll_row;
    correct += argmax == y ? 1 : 0;
    const float shift = float(log_sum);
    const float uniform = smoothing / float(vocab);
#pragma omp simd
    for (int64_t c = 0; c < vocab; ++c) row[c] = grad_scale * (fast_exp(row[c] - shift) - uniform);
    row[y] -= grad_scale * (1.f - smoothing);
  }
  return {loss, nll, correct};
}

}  // namespace tfm
