// The CUDA backend's kernels over whole rows of the vocabulary: log-softmax, the picked
// log-probability, the label-smoothed cross-entropy fused with its gradient, and the k best
// tokens of each row for beam search. One block per row; the loss's per-row totals stay in device
// memory until the caller copies a whole batch's back (no wait per call).
#include <cmath>

#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kRowThreads = 512;

// log Σ exp(row) of one row, every thread of the block getting it.
__device__ float row_log_sum_exp(const float* row, int64_t cols, float* shared) {
  float largest = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) largest = fmaxf(largest, row[c]);
  largest = block_max(largest, shared);
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - largest);
  sum = block_sum(sum, shared);
  return largest + logf(sum);
}

__global__ void log_softmax_kernel(const float* x, float* y, int64_t cols) {
  __shared__ float shared[32];
  const float* in = x + int64_t(blockIdx.x) * cols;
  float* out = y + int64_t(blockIdx.x) * cols;
  const float log_sum = row_log_sum_exp(in, cols, shared);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = in[c] - log_sum;
}

__global__ void log_softmax_pick_kernel(const float* logits, const int32_t* targets, int64_t cols,
                                        float* out) {
  __shared__ float shared[32];
  const float* in = logits + int64_t(blockIdx.x) * cols;
  const float log_sum = row_log_sum_exp(in, cols, shared);
  if (threadIdx.x == 0) out[blockIdx.x] = in[targets[blockIdx.x]] - log_sum;
}

// A part of one row as one pass leaves it: its largest value, the first index holding it (vocab:
// none yet) and Σ exp(x − largest) over the part.
struct SoftmaxPart {
  float largest;
  int64_t first;
  float sum;
};

// exp(x − largest) that treats −∞ − −∞ as an empty term rather than NaN.
__device__ __forceinline__ float scaled_exp(float x, float largest) {
  return x == -INFINITY ? 0.f : expf(x - largest);
}

// Two parts as one: the larger maximum (the lower first index on a tie), the sums rescaled to it.
__device__ __forceinline__ SoftmaxPart combine(SoftmaxPart a, SoftmaxPart b) {
  const float largest = fmaxf(a.largest, b.largest);
  SoftmaxPart out;
  out.largest = largest;
  out.sum = a.sum * scaled_exp(a.largest, largest) + b.sum * scaled_exp(b.largest, largest);
  const int64_t first_a = a.largest == largest ? a.first : INT64_MAX;
  const int64_t first_b = b.largest == largest ? b.first : INT64_MAX;
  out.first = first_a < first_b ? first_a : first_b;
  return out;
}

// The whole block's part, every thread getting it.
__device__ SoftmaxPart block_combine(SoftmaxPart part, SoftmaxPart* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    SoftmaxPart other;
    other.largest = __shfl_xor_sync(0xffffffffu, part.largest, offset);
    other.first = __shfl_xor_sync(0xffffffffu, part.first, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, part.sum, offset);
    part = combine(part, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = part;
  __syncthreads();
  part = shared[0];
  for (int w = 1; w < warps; ++w) part = combine(part, shared[w]);
  return part;
}

// Per row, in one read of the logits: the loss terms in double and whether the first maximum is
// the target; then a second pass makes the row grad_scale · (softmax − smoothed one-hot), in
// float32 in place, or only in bfloat16 into rounded_gradient where that is given.
__global__ void cross_entropy_kernel(float* logits, const int32_t* targets, int64_t vocab,
                                     float smoothing, float grad_scale, double* row_totals,
                                     uint16_t* rounded_gradient) {
  __shared__ SoftmaxPart shared_parts[32];
  __shared__ double shared_double[32];
  float* row = logits + int64_t(blockIdx.x) * vocab;
  const int32_t y = targets[blockIdx.x];
  const float target_logit = row[y];
  SoftmaxPart part{-INFINITY, vocab, 0.f};
  double sum_logits = 0;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float x = row[c];
    sum_logits += double(x);
    if (x > part.largest) {  // online softmax: the sum so far rescaled to the new maximum
      part.sum = part.sum * scaled_exp(part.largest, x) + 1.f;
      part.largest = x;
      part.first = c;
    } else {
      if (x == part.largest && part.first == vocab) part.first = c;  // −∞ everywhere so far
      part.sum += scaled_exp(x, part.largest);
    }
  }
  sum_logits = block_sum(sum_logits, shared_double);
  const SoftmaxPart whole = block_combine(part, shared_parts);
  const float largest = whole.largest, sum = whole.sum;
  const double log_sum = double(largest) + log(double(sum));
  const double nll_row = log_sum - double(target_logit);
  if (threadIdx.x == 0) {
    double* totals = row_totals + 3 * int64_t(blockIdx.x);  // [3]
    totals[0] = (1.0 - smoothing) * nll_row + smoothing * (log_sum - sum_logits / double(vocab));
    totals[1] = nll_row;
    totals[2] = whole.first == y ? 1 : 0;
  }
  // Every thread read row[y] before the combine's barriers, so the row may be rewritten now.
  const float scale = grad_scale / sum;
  const float uniform = grad_scale * smoothing / float(vocab);
  uint16_t* rounded = rounded_gradient ? rounded_gradient + int64_t(blockIdx.x) * vocab : nullptr;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    float g = expf(row[c] - largest) * scale - uniform;
    if (c == y) g -= grad_scale * (1.f - smoothing);
    if (rounded)
      rounded[c] = to_bfloat16(g);
    else
      row[c] = g;
  }
}

// (value, id) pairs in the order of best_tokens: larger value first, then lower id.
__device__ __forceinline__ bool ranks_before(float v, int32_t id, float w, int32_t other) {
  return v > w || (v == w && id < other);
}

// The keep best entries of one row, one selection round per entry: round i takes the best pair
// that ranks after round i − 1's (the order is total), so no set of taken ids is kept.
__global__ void best_tokens_kernel(const float* logprobs, int64_t vocab, int64_t keep,
                                   int32_t banned, float* values, int32_t* tokens) {
  __shared__ float best_value[32];
  __shared__ int32_t best_id[32];
  const float* row = logprobs + int64_t(blockIdx.x) * vocab;
  float previous_value = INFINITY;
  int32_t previous_id = -1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t i = 0; i < keep; ++i) {
    float v_best = -INFINITY;
    int32_t id_best = INT32_MAX;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      float v = row[c];
      if (c == banned || v != v) v = -INFINITY;
      const int32_t id = int32_t(c);
      if (ranks_before(previous_value, previous_id, v, id) && ranks_before(v, id, v_best, id_best))
        v_best = v, id_best = id;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, v_best, offset);
      const int32_t id = __shfl_xor_sync(0xffffffffu, id_best, offset);
      if (ranks_before(v, id, v_best, id_best)) v_best = v, id_best = id;
    }
    if (lane == 0) best_value[warp] = v_best, best_id[warp] = id_best;
    __syncthreads();
    v_best = best_value[0];
    id_best = best_id[0];
    for (int w = 1; w < warps; ++w)
      if (ranks_before(best_value[w], best_id[w], v_best, id_best))
        v_best = best_value[w], id_best = best_id[w];
    __syncthreads();
    if (threadIdx.x == 0) {
      values[int64_t(blockIdx.x) * keep + i] = v_best;
      tokens[int64_t(blockIdx.x) * keep + i] = id_best;
    }
    previous_value = v_best;
    previous_id = id_best;
  }
}

}  // namespace

void log_softmax(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  log_softmax_kernel<<<unsigned(rows), kRowThreads, 0, s>>>(x, y, cols);
  check_launch("log_softmax");
}

void log_softmax_pick(cudaStream_t s, const float* logits, const int32_t* targets, int64_t rows,
                      int64_t cols, float* out) {
  if (rows == 0) return;
  log_softmax_pick_kernel<<<unsigned(rows), kRowThreads, 0, s>>>(logits, targets, cols, out);
  check_launch("log_softmax_pick");
}

void cross_entropy_forward_backward(cudaStream_t s, float* logits, const int32_t* targets,
                                    int64_t rows, int64_t vocab, float smoothing, float grad_scale,
                                    double* row_totals, uint16_t* rounded_gradient) {
  if (rows == 0) return;
  cross_entropy_kernel<<<unsigned(rows), kRowThreads, 0, s>>>(
      logits, targets, vocab, smoothing, grad_scale, row_totals, rounded_gradient);
  check_launch("cross_entropy_forward_backward");
}

void best_tokens(cudaStream_t s, const float* logprobs, int64_t rows, int64_t vocab, int64_t keep,
                 int32_t banned, float* values, int32_t* tokens) {
  if (rows == 0) return;
  best_tokens_kernel<<<unsigned(rows), kRowThreads, 0, s>>>(logprobs, vocab, keep, banned, values,
                                                            tokens);
  check_launch("best_tokens");
}

}  // namespace cuda
}  // namespace tfm
