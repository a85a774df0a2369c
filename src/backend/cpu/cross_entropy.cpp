// Fused label-smoothed cross-entropy forward + backward: two passes over each row of logits and
// one exp per element (the softmax numerators are kept in the row and scaled into the gradient).
#include "backend/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "tensor/float16.h"

namespace tfm {

namespace {

// Sums over a row are float sums of kSumBlock terms (a loop that vectorises), added up in double,
// so the float rounding error is that of a 512-term sum whatever the vocabulary size and however
// the compiler orders the float additions.
constexpr int64_t kSumBlock = 512;

// Σ row[c], so.
double sum_in_blocks(const float* row, int64_t n) {
  double total = 0;
  for (int64_t start = 0; start < n; start += kSumBlock) {
    const int64_t end = std::min(n, start + kSumBlock);
    float block = 0.f;
#pragma omp simd reduction(+ : block)
    for (int64_t c = start; c < end; ++c) block += row[c];
    total += double(block);
  }
  return total;
}

}  // namespace

TFM_CPU_KERNEL void cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                   int64_t rows, int64_t vocab, float smoothing,
                                                   float grad_scale, double* row_totals,
                                                   uint16_t* rounded_gradient) {
#pragma omp parallel for schedule(static) if (rows * vocab > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    // [vocab] logits, then exp(logit − max), then the gradient: the row itself, or a float copy
    // of the row's bfloat16 logits (logits null), which rounded_gradient's row then receives.
    float* row = logits ? logits + r * vocab : nullptr;
    if (!row) {
      thread_local std::vector<float> widened;
      widened.resize(size_t(vocab));
      const uint16_t* given = rounded_gradient + r * vocab;  // [vocab]
#pragma omp simd
      for (int64_t c = 0; c < vocab; ++c) widened[size_t(c)] = bfloat16_to_float(given[c]);
      row = widened.data();
    }
    const int32_t y = targets[r];
    // The maximum in blocks of kMaxBlock (vector loops), remembering the first block that holds
    // it, so that finding the first maximum scans one block rather than half the row.
    constexpr int64_t kMaxBlock = 64;
    float max_value = -INFINITY;
    int64_t max_block = 0;
    for (int64_t start = 0; start < vocab; start += kMaxBlock) {
      const int64_t end = std::min(vocab, start + kMaxBlock);
      float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
      for (int64_t c = start; c < end; ++c) block_max = std::max(block_max, row[c]);
      if (block_max > max_value) max_value = block_max, max_block = start;
    }
    float* block_end = row + std::min(vocab, max_block + kMaxBlock);
    float* first = std::find(row + max_block, block_end, max_value);
    // Not in that block only when no block's maximum was larger than −∞ (NaN or −∞ everywhere):
    // the rest of the row, as one std::find over the whole row would have gone on.
    if (first == block_end) first = std::find(block_end, row + vocab, max_value);
    const int64_t argmax = first - row;  // the first maximum (vocab: none)
    const double sum_logits = sum_in_blocks(row, vocab);
    const float target_logit = row[y];
    // Σ exp(logit − max) in blocks too (one float sum of 50,000 terms, unvectorised, put the
    // gradient 5e-5 off float64's).
    double total = 0;
    for (int64_t start = 0; start < vocab; start += kSumBlock) {
      const int64_t end = std::min(vocab, start + kSumBlock);
      float block = 0.f;
#pragma omp simd reduction(+ : block)
      for (int64_t c = start; c < end; ++c) {
        const float e = fast_exp(row[c] - max_value);
        row[c] = e;
        block += e;
      }
      total += double(block);
    }
    const float sum = float(total);
    const double log_sum = double(max_value) + std::log(total);
    const double nll_row = log_sum - double(target_logit);
    const double smooth_row = log_sum - sum_logits / double(vocab);  // mean_k(−log p_k)
    double* totals = row_totals + 3 * r;  // [3] smoothed loss, −log p_y, argmax == y
    totals[0] = (1.0 - smoothing) * nll_row + smoothing * smooth_row;
    totals[1] = nll_row;
    totals[2] = argmax == y ? 1 : 0;
    const float scale = grad_scale / sum;  // softmax_c = row[c] / sum
    const float uniform = grad_scale * smoothing / float(vocab);
#pragma omp simd
    for (int64_t c = 0; c < vocab; ++c) row[c] = row[c] * scale - uniform;
    row[y] -= grad_scale * (1.f - smoothing);
    if (rounded_gradient) {
      uint16_t* rounded = rounded_gradient + r * vocab;  // [vocab]
#pragma omp simd
      for (int64_t c = 0; c < vocab; ++c) rounded[c] = float_to_bfloat16(row[c]);
    }
  }
}

}  // namespace tfm
