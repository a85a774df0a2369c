// The CUDA backend's kernels over whole rows of the vocabulary: log-softmax, the picked
// log-probability, the label-smoothed cross-entropy fused with its gradient, and the k best
// tokens of each row for beam search. One block per row; the loss's per-row totals stay in device
// memory until the caller copies a whole batch's back (no wait per call).
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace cuda {

namespace {

constexpr int kRowThreads = 512;

// Whether a row can be read as float4: its length a multiple of 4 and its start 16-byte aligned
// (every row of a matrix is, when the first is and the length is a multiple of 4).
__device__ __forceinline__ bool reads_as_float4(const void* row, int64_t cols) {
  return (cols & 3) == 0 && aligned(row, 16);
}

// visit_word(word, i) for this thread's 16-byte words (Word: float4 or uint4) of a row of
// `words` such words, in increasing order, four loads issued before the first is visited: one
// load in flight per thread kept too few bytes in flight to cover the memory's latency.
template <typename Word, typename VisitWord>
__device__ __forceinline__ void for_each_word(const void* row, int64_t words,
                                              VisitWord visit_word) {
  const Word* row_words = static_cast<const Word*>(row);
  const int64_t step = blockDim.x;
  constexpr int kInFlight = 4;
  int64_t i = threadIdx.x;
  for (; i + (kInFlight - 1) * step < words; i += kInFlight * step) {
    Word x[kInFlight];
#pragma unroll
    for (int n = 0; n < kInFlight; ++n) x[n] = row_words[i + n * step];
#pragma unroll
    for (int n = 0; n < kInFlight; ++n) visit_word(x[n], i + n * step);
  }
  for (; i < words; i += step) visit_word(row_words[i], i);
}

// visit_word(x, i) for this thread's float4 words of a row that reads_as_float4 (word i holds
// columns 4i to 4i + 3), as for_each_word visits them.
template <typename VisitWord>
__device__ __forceinline__ void for_each_word_in_row(const float* row, int64_t cols,
                                                     VisitWord visit_word) {
  for_each_word<float4>(row, cols / 4, visit_word);
}

// visit(x, c) for this thread's columns of a row, in increasing order: four at a time from
// for_each_word_in_row where the row allows, else one at a time.
template <typename Visit>
__device__ __forceinline__ void for_each_in_row(const float* row, int64_t cols, Visit visit) {
  if (reads_as_float4(row, cols)) {
    for_each_word_in_row(row, cols, [&](const float4& x, int64_t i) {
      visit(x.x, 4 * i);
      visit(x.y, 4 * i + 1);
      visit(x.z, 4 * i + 2);
      visit(x.w, 4 * i + 3);
    });
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) visit(row[c], c);
  }
}

// The same over a row of bfloat16 values (widened to float), eight to a 16-byte word where the
// row allows (its length a multiple of 8, its start 16-byte aligned), else one at a time;
// visit_word(x[8], i) for word i (columns 8i to 8i + 7), four loads in flight.
__device__ __forceinline__ bool reads_as_words_of_eight(const uint16_t* row, int64_t cols) {
  return (cols & 7) == 0 && aligned(row, 16);
}
__device__ __forceinline__ void widen_eight(const uint4& word, float* x) {
  const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    x[2 * n] = __uint_as_float(halves[n] << 16);
    x[2 * n + 1] = __uint_as_float(halves[n] & 0xffff0000u);
  }
}
template <typename VisitWord>
__device__ __forceinline__ void for_each_word_of_eight(const uint16_t* row, int64_t cols,
                                                       VisitWord visit_word) {
  for_each_word<uint4>(row, cols / 8, [&](const uint4& word, int64_t i) {
    float x[8];
    widen_eight(word, x);
    visit_word(x, i);
  });
}
template <typename Visit>
__device__ __forceinline__ void for_each_in_row(const uint16_t* row, int64_t cols, Visit visit) {
  if (reads_as_words_of_eight(row, cols)) {
    for_each_word_of_eight(row, cols, [&](const float* x, int64_t i) {
#pragma unroll
      for (int n = 0; n < 8; ++n) visit(x[n], 8 * i + n);
    });
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) visit(from_bfloat16(row[c]), c);
  }
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

// One thread's part of a row, read once (online softmax: the sum so far rescaled whenever the
// maximum grows); the first index is not tracked.
__device__ __forceinline__ SoftmaxPart thread_softmax_part(const float* row, int64_t cols) {
  SoftmaxPart part{-INFINITY, 0, 0.f};
  for_each_in_row(row, cols, [&](float x, int64_t) {
    if (x > part.largest) {
      part.sum = part.sum * scaled_exp(part.largest, x) + 1.f;
      part.largest = x;
    } else {
      part.sum += scaled_exp(x, part.largest);
    }
  });
  return part;
}

// log Σ exp(row[cols]) for the whole block, in one read (the maximum and the sum together):
// what log-softmax subtracts. Every thread of the block must call it, and gets the value.
__device__ float block_log_sum_exp(const float* row, int64_t cols) {
  __shared__ SoftmaxPart shared[32];
  const SoftmaxPart whole = block_combine(thread_softmax_part(row, cols), shared);
  return whole.largest + logf(whole.sum);
}

// out = the target's logit − log Σ exp(row), one read of the row.
__global__ void log_softmax_pick_kernel(const float* logits, const int32_t* targets, int64_t cols,
                                        float* out) {
  const float* in = logits + int64_t(blockIdx.x) * cols;
  const float log_sum = block_log_sum_exp(in, cols);
  if (threadIdx.x == 0) out[blockIdx.x] = in[targets[blockIdx.x]] - log_sum;
}

// Per row, in one read of the logits: the loss terms in double and whether the first maximum is
// the target; then a second pass makes the row grad_scale · (softmax − smoothed one-hot), in
// float32 in place, or only in bfloat16 into rounded_gradient where that is given. The second
// pass reads the row again, from L2 where it is still there: keeping the row in shared memory
// between the passes (8c89ef0: 160 KB, one block of 1,024 threads an SM) took 0.73 ms for a chunk
// of 3,627 × 37,000 on an H200, where reading it twice with several blocks an SM, each loading
// while another reduces, took 0.47. Logit is float, or uint16_t: the logits in bfloat16 in
// rounded_gradient itself (Backend::cross_entropy_forward_backward's null logits), half the
// bytes each pass, each thread writing its words' gradient over the words it read.
template <typename Logit>
__global__ void __launch_bounds__(kRowThreads, 3)
    cross_entropy_kernel(Logit* logits, const int32_t* targets, int64_t vocab, float smoothing,
                         float grad_scale, double* row_totals, uint16_t* rounded_gradient) {
  constexpr bool kBFloat16 = std::is_same_v<Logit, uint16_t>;
  __shared__ SoftmaxPart shared_parts[32];
  __shared__ double shared_double[32];
  Logit* row = logits + int64_t(blockIdx.x) * vocab;
  const int32_t y = targets[blockIdx.x];
  float target_logit;
  if constexpr (kBFloat16)
    target_logit = from_bfloat16(row[y]);
  else
    target_logit = row[y];
  SoftmaxPart part{-INFINITY, vocab, 0.f};
  double sum_logits = 0;
  for_each_in_row(row, vocab, [&](float x, int64_t c) {
    sum_logits += double(x);
    if (x > part.largest) {  // online softmax: the sum so far rescaled to the new maximum
      part.sum = part.sum * scaled_exp(part.largest, x) + 1.f;
      part.largest = x;
      part.first = c;
    } else {
      if (x == part.largest && part.first == vocab) part.first = c;  // −∞ everywhere so far
      part.sum += scaled_exp(x, part.largest);
    }
  });
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
  const float target_term = grad_scale * (1.f - smoothing);
  const auto gradient = [&](float x, int64_t c) {
    const float g = expf(x - largest) * scale - uniform;
    return c == y ? g - target_term : g;
  };
  if constexpr (kBFloat16) {
    if (reads_as_words_of_eight(row, vocab)) {
      uint4* row8 = reinterpret_cast<uint4*>(row);
      for_each_word_of_eight(row, vocab, [&](const float* x, int64_t i) {
        uint16_t g[8];
#pragma unroll
        for (int n = 0; n < 8; ++n) g[n] = to_bfloat16(gradient(x[n], 8 * i + n));
        const uint2 low = pack_16_bits(g[0], g[1], g[2], g[3]);
        const uint2 high = pack_16_bits(g[4], g[5], g[6], g[7]);
        row8[i] = make_uint4(low.x, low.y, high.x, high.y);
      });
      return;
    }
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x)
      row[c] = to_bfloat16(gradient(from_bfloat16(row[c]), c));
    return;
  } else {
    if (reads_as_float4(row, vocab) && aligned(rounded, 8)) {
      float4* row4 = reinterpret_cast<float4*>(row);
      for_each_word_in_row(row, vocab, [&](const float4& x, int64_t i) {
        const float4 g = make_float4(gradient(x.x, 4 * i), gradient(x.y, 4 * i + 1),
                                     gradient(x.z, 4 * i + 2), gradient(x.w, 4 * i + 3));
        if (rounded) {
          const uint2 packed =
              pack_16_bits(to_bfloat16(g.x), to_bfloat16(g.y), to_bfloat16(g.z), to_bfloat16(g.w));
          reinterpret_cast<uint2*>(rounded)[i] = packed;
        } else {
          row4[i] = g;
        }
      });
      return;
    }
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      const float g = gradient(row[c], c);
      if (rounded)
        rounded[c] = to_bfloat16(g);
      else
        row[c] = g;
    }
  }
}

// best_tokens' normaliser of a row of logits: block_log_sum_exp, as log_softmax_pick_kernel
// subtracts it (the ranking's read then finds the row in L2), stored into log_sums[blockIdx.x]
// by thread 0; 0 where log_sums is null (the scores are log-probabilities already). Every
// thread of the block must call it.
__device__ float row_log_sum(const float* row, int64_t vocab, float* log_sums) {
  if (!log_sums) return 0.f;
  const float log_sum = block_log_sum_exp(row, vocab);
  if (threadIdx.x == 0) log_sums[blockIdx.x] = log_sum;
  return log_sum;
}

// (value, id) pairs in the order of best_tokens: larger value first, then lower id.
__device__ __forceinline__ bool ranks_before(float v, int32_t id, float w, int32_t other) {
  return v > w || (v == w && id < other);
}

// The keep best entries of one row, one selection round per entry: round i takes the best pair
// that ranks after round i − 1's (the order is total), so no set of taken ids is kept.
__global__ void best_tokens_kernel(const float* scores, int64_t vocab, int64_t keep, int32_t banned,
                                   float* values, int32_t* tokens, float* log_sums) {
  __shared__ float best_value[32];
  __shared__ int32_t best_id[32];
  const float* row = scores + int64_t(blockIdx.x) * vocab;
  const float log_sum = row_log_sum(row, vocab, log_sums);
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
      values[int64_t(blockIdx.x) * keep + i] = v_best - log_sum;
      tokens[int64_t(blockIdx.x) * keep + i] = id_best;
    }
    previous_value = v_best;
    previous_id = id_best;
  }
}

// A warp's list of at most kMaxWarpKeep best (value, id) pairs, best first, across its lanes:
// lane i holds entry i; lanes past the list's length hold (−∞, INT32_MAX), which ranks after
// every pair of a row. The warp offers candidates together (offer_all), and only the lanes'
// candidates that beat the list's last entry, found by one ballot, are inserted, one at a time
// by the whole warp; after the first few hundred entries of a row that is rare. Every lane must
// call every member (warp-collective).
constexpr int kMaxWarpKeep = 32;
struct WarpBest {
  int length;  // the list's capacity, 1..kMaxWarpKeep
  float value = -INFINITY;
  int32_t id = INT32_MAX;
  float last_value = -INFINITY;  // entry length − 1, in every lane
  int32_t last_id = INT32_MAX;

  __device__ explicit WarpBest(int keep) : length(keep) {}

  // Offers each lane's pair (v, i); pairs not worth a place cost only the ballot.
  __device__ void offer_all(float v, int32_t i) {
    uint32_t beating = __ballot_sync(0xffffffffu, ranks_before(v, i, last_value, last_id));
    while (beating) {
      const int from = __ffs(beating) - 1;
      beating &= beating - 1;
      insert(__shfl_sync(0xffffffffu, v, from), __shfl_sync(0xffffffffu, i, from));
    }
  }

  // One pair offered by the whole warp (the same in every lane).
  __device__ void insert(float v, int32_t i) {
    if (!ranks_before(v, i, last_value, last_id)) return;  // the list improved meanwhile
    const int lane = threadIdx.x & 31;
    const bool before = lane < length && ranks_before(value, id, v, i);
    const int at = __popc(__ballot_sync(0xffffffffu, before));
    const float above_value = __shfl_up_sync(0xffffffffu, value, 1);
    const int32_t above_id = __shfl_up_sync(0xffffffffu, id, 1);
    if (lane < length) {
      if (lane == at)
        value = v, id = i;
      else if (lane > at)
        value = above_value, id = above_id;
    }
    last_value = __shfl_sync(0xffffffffu, value, length - 1);
    last_id = __shfl_sync(0xffffffffu, id, length - 1);
  }
};

// best_tokens for keep ≤ kMaxWarpKeep in one read of the row: each warp ranks its share of the
// row (32 words of four at a time where the row reads as float4; 0.31 ms for 2,048 × 37,000 on
// an H200 with one load in flight a thread, 5 times its bytes' time), then warp 0 ranks the
// warps' lists. The per-entry kernel above reads the row keep times.
__global__ void best_tokens_warp_kernel(const float* scores, int64_t vocab, int64_t keep,
                                        int32_t banned, float* values, int32_t* tokens,
                                        float* log_sums) {
  __shared__ float list_value[kRowThreads / 32][kMaxWarpKeep];
  __shared__ int32_t list_id[kRowThreads / 32][kMaxWarpKeep];
  const float* row = scores + int64_t(blockIdx.x) * vocab;
  const float log_sum = row_log_sum(row, vocab, log_sums);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const auto offered = [&](float v, int64_t c) {  // banned, NaN and past the row: −∞
    return c < vocab && c != banned && v == v ? v : -INFINITY;
  };
  WarpBest best{int(keep)};
  // Offers word w's four entries (past the row where !inside: the sentinel, never offered);
  // warp-collective.
  const auto rank_word = [&](const float4& x, int64_t w, bool inside) {
    const int32_t c = int32_t(4 * w);
    float v[4] = {offered(x.x, c), offered(x.y, c + 1), offered(x.z, c + 2), offered(x.w, c + 3)};
    int32_t id[4] = {c, c + 1, c + 2, c + 3};
    bool any = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!inside) v[e] = -INFINITY, id[e] = INT32_MAX;
      any = any || ranks_before(v[e], id[e], best.last_value, best.last_id);
    }
    if (!__any_sync(0xffffffffu, any)) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) best.offer_all(v[e], id[e]);
  };
  if (reads_as_float4(row, vocab)) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    // The warp's words first + lane, first + step + lane, ... as for_each_word_in_row visits a
    // thread's, four loads in flight (46 registers: two blocks an SM, which keep twice the bytes
    // in flight that four blocks of one load did), the whole warp iterating while any lane has
    // a word (offer_all is warp-collective).
    const int64_t words = vocab / 4, step = blockDim.x;
    constexpr int kInFlight = 4;
    for (int64_t first = int64_t(warp) * 32; first < words; first += kInFlight * step) {
      float4 loaded[kInFlight];
#pragma unroll
      for (int n = 0; n < kInFlight; ++n) {
        const int64_t w = first + n * step + lane;
        loaded[n] = w < words ? row4[w] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int n = 0; n < kInFlight; ++n) {
        const int64_t base = first + n * step;
        if (base >= words) break;  // the same in every lane
        rank_word(loaded[n], base + lane, base + lane < words);
      }
    }
  } else {
    for (int64_t base = int64_t(warp) * 32; base < vocab; base += blockDim.x) {
      const int64_t c = base + lane;
      best.offer_all(offered(c < vocab ? row[c] : 0.f, c), int32_t(c < vocab ? c : INT32_MAX));
    }
  }
  if (lane < keep) list_value[warp][lane] = best.value, list_id[warp][lane] = best.id;
  __syncthreads();
  if (warp != 0) return;
  WarpBest whole{int(keep)};
  for (int from = 0; from < warps; ++from)
    whole.offer_all(lane < keep ? list_value[from][lane] : -INFINITY,
                    lane < keep ? list_id[from][lane] : INT32_MAX);
  if (lane < keep) {
    values[int64_t(blockIdx.x) * keep + lane] = whole.value - log_sum;
    tokens[int64_t(blockIdx.x) * keep + lane] = whole.id;
  }
}

}  // namespace

void log_softmax_pick(cudaStream_t s, const float* logits, const int32_t* targets, int64_t rows,
                      int64_t cols, float* out) {
  if (rows == 0) return;
  launch_kernel(log_softmax_pick_kernel, unsigned(rows), kRowThreads, 0, s, logits, targets, cols,
                out);
  check_launch("log_softmax_pick");
}

void cross_entropy_forward_backward(cudaStream_t s, float* logits, const int32_t* targets,
                                    int64_t rows, int64_t vocab, float smoothing, float grad_scale,
                                    double* row_totals, uint16_t* rounded_gradient) {
  if (rows == 0) return;
  if (!logits && !rounded_gradient)
    throw std::invalid_argument("cross_entropy_forward_backward: no logits");
  if (logits)
    launch_kernel(cross_entropy_kernel<float>, unsigned(rows), kRowThreads, 0, s, logits, targets,
                  vocab, smoothing, grad_scale, row_totals, rounded_gradient);
  else  // the logits in bfloat16 in rounded_gradient, the gradient over them
    launch_kernel(cross_entropy_kernel<uint16_t>, unsigned(rows), kRowThreads, 0, s,
                  rounded_gradient, targets, vocab, smoothing, grad_scale, row_totals,
                  rounded_gradient);
  check_launch("cross_entropy_forward_backward");
}

void best_tokens(cudaStream_t s, const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                 int32_t banned, float* values, int32_t* tokens, float* log_sums) {
  if (rows == 0) return;
  if (keep <= kMaxWarpKeep)
    launch_kernel(best_tokens_warp_kernel, unsigned(rows), kRowThreads, 0, s, scores, vocab, keep,
                  banned, values, tokens, log_sums);
  else  // a wide beam: one pass over the row per entry
    launch_kernel(best_tokens_kernel, unsigned(rows), kRowThreads, 0, s, scores, vocab, keep,
                  banned, values, tokens, log_sums);
  check_launch("best_tokens");
}

}  // namespace cuda
}  // namespace tfm
