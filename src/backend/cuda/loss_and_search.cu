// The CUDA backend's kernels over whole rows of the vocabulary: log-softmax, the picked
// log-probability, the label-smoothed cross-entropy fused with its gradient, and the k best
// tokens of each row for beam search. One block per row; the loss's per-row totals come back to
// the host and are summed there in row order (deterministic).
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/operation_profile.h"

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

// Per row: the loss terms in double and whether the first maximum is the target; the row becomes
// grad_scale · (softmax − smoothed one-hot).
__global__ void cross_entropy_kernel(float* logits, const int32_t* targets, int64_t vocab,
                                     float smoothing, float grad_scale, double* row_loss,
                                     double* row_nll, int32_t* row_correct) {
  __shared__ float shared[32];
  __shared__ double shared_double[32];
  __shared__ int64_t first_index[32];
  float* row = logits + int64_t(blockIdx.x) * vocab;
  const int32_t y = targets[blockIdx.x];
  float largest = -INFINITY;
  double sum_logits = 0;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    largest = fmaxf(largest, row[c]);
    sum_logits += double(row[c]);
  }
  largest = block_max(largest, shared);
  sum_logits = block_sum(sum_logits, shared_double);
  // The first index holding the maximum (vocab: none, when every entry is NaN).
  int64_t first = vocab;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x)
    if (row[c] == largest) {
      first = c;
      break;
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const int64_t other = __shfl_xor_sync(0xffffffffu, first, offset);
    first = other < first ? other : first;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) first_index[warp] = first;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < int(blockDim.x >> 5); ++w)
      first_index[0] = first_index[w] < first_index[0] ? first_index[w] : first_index[0];
  const float target_logit = row[y];
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) sum += expf(row[c] - largest);
  sum = block_sum(sum, shared);  // its barriers also publish first_index[0]
  const double log_sum = double(largest) + log(double(sum));
  const double nll_row = log_sum - double(target_logit);
  if (threadIdx.x == 0) {
    row_loss[blockIdx.x] =
        (1.0 - smoothing) * nll_row + smoothing * (log_sum - sum_logits / double(vocab));
    row_nll[blockIdx.x] = nll_row;
    row_correct[blockIdx.x] = first_index[0] == y ? 1 : 0;
  }
  __syncthreads();  // every thread has read row[y] and the maximum before the row is rewritten
  const float scale = grad_scale / sum;
  const float uniform = grad_scale * smoothing / float(vocab);
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    float g = expf(row[c] - largest) * scale - uniform;
    if (c == y) g -= grad_scale * (1.f - smoothing);
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

CrossEntropyTotals cross_entropy_forward_backward(const Context& c, float* logits,
                                                  const int32_t* targets, int64_t rows,
                                                  int64_t vocab, float smoothing,
                                                  float grad_scale) {
  CrossEntropyTotals totals;
  if (rows == 0) return totals;
  // [rows] loss, [rows] nll (double), [rows] correct (int32)
  Scratch per_row(c, rows * int64_t(2 * sizeof(double) + sizeof(int32_t)));
  double* loss = per_row.as<double>();
  double* nll = loss + rows;
  int32_t* correct = reinterpret_cast<int32_t*>(nll + rows);
  cross_entropy_kernel<<<unsigned(rows), kRowThreads, 0, c.stream>>>(
      logits, targets, vocab, smoothing, grad_scale, loss, nll, correct);
  check_launch("cross_entropy_forward_backward");
  const ProfiledWait wait;  // the host waits for the result from here on
  std::vector<double> host(static_cast<size_t>(2 * rows));
  std::vector<int32_t> host_correct(static_cast<size_t>(rows));
  TFM_CUDA(cudaMemcpyAsync(host.data(), loss, size_t(2 * rows) * sizeof(double),
                           cudaMemcpyDeviceToHost, c.stream));
  TFM_CUDA(cudaMemcpyAsync(host_correct.data(), correct, size_t(rows) * sizeof(int32_t),
                           cudaMemcpyDeviceToHost, c.stream));
  TFM_CUDA(cudaStreamSynchronize(c.stream));
  for (int64_t r = 0; r < rows; ++r) {
    totals.loss += host[size_t(r)];
    totals.nll += host[size_t(rows + r)];
    totals.correct += host_correct[size_t(r)];
  }
  return totals;
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
