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
// The cross-entropy's blocks: 256 threads, five an SM (48 registers: its four words in flight
// and a word's eight values each, which spilled under three blocks of 512's 40).
constexpr int kLossThreads = 256;
constexpr int kLossBlocksPerProcessor = 5;

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

// Whether a row of bfloat16 values reads as 16-byte words of eight: its length a multiple of 8 and
// its start 16-byte aligned.
__device__ __forceinline__ bool reads_as_words_of_eight(const uint16_t* row, int64_t cols) {
  return (cols & 7) == 0 && aligned(row, 16);
}
__device__ __forceinline__ void widen_eight(const uint4& word, float (&x)[8]) {
  const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    x[2 * n] = __uint_as_float(halves[n] << 16);
    x[2 * n + 1] = __uint_as_float(halves[n] & 0xffff0000u);
  }
}

// visit(x, column) for this thread's values of a row, a word at a time in increasing order: x is
// a float[N] holding columns column to column + N − 1. N is 4 (float4 words) for a row of floats
// that reads_as_float4, 8 (16-byte words, widened) for one of bfloat16 values that
// reads_as_words_of_eight, else 1; words four loads in flight (for_each_word). Visiting a word
// rather than a value lets the kernels below work on its N values independently.
template <typename Visit>
__device__ __forceinline__ void for_each_word_of(const float* row, int64_t cols, Visit visit) {
  if (reads_as_float4(row, cols)) {
    for_each_word<float4>(row, cols / 4, [&](const float4& word, int64_t i) {
      const float x[4] = {word.x, word.y, word.z, word.w};
      visit(x, 4 * i);
    });
    return;
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float x[1] = {row[c]};
    visit(x, c);
  }
}
template <typename Visit>
__device__ __forceinline__ void for_each_word_of(const uint16_t* row, int64_t cols, Visit visit) {
  if (reads_as_words_of_eight(row, cols)) {
    for_each_word<uint4>(row, cols / 8, [&](const uint4& word, int64_t i) {
      float x[8];
      widen_eight(word, x);
      visit(x, 8 * i);
    });
    return;
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float x[1] = {from_bfloat16(row[c])};
    visit(x, c);
  }
}

// The sum of a word's values, in pairs (N a power of two): log2 N dependent additions.
template <int N>
__device__ __forceinline__ float word_sum(const float (&x)[N]) {
  if constexpr (N == 1) {
    return x[0];
  } else {
    float pairs[N / 2];
#pragma unroll
    for (int n = 0; n < N / 2; ++n) pairs[n] = x[2 * n] + x[2 * n + 1];
    return word_sum(pairs);
  }
}

// e^x for a softmax's terms (x ≤ 0): __expf, x · log2 e and the multiprocessor's approximate
// base-2 exponential, within 2 + 1.2 |x| units in the last place (CUDA's table), two
// instructions where expf's accurate one takes about ten; these rows' passes issue one a value.
__device__ __forceinline__ float softmax_exp(float x) {
  return __expf(x);
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
  // The warps' parts as combine would chain them, but the maximum first and then the sums
  // rescaled to it, independent terms (a chain of combines waited on two exponentials a warp).
  SoftmaxPart whole{shared[0].largest, INT64_MAX, 0.f};
  for (int w = 1; w < warps; ++w) whole.largest = fmaxf(whole.largest, shared[w].largest);
  for (int w = 0; w < warps; ++w) {
    const SoftmaxPart p = shared[w];
    whole.sum += p.sum * scaled_exp(p.largest, whole.largest);
    if (p.largest == whole.largest && p.first < whole.first) whole.first = p.first;
  }
  return whole;
}

// Adds a word of N values (columns column to column + N − 1, visited in increasing order) to a
// thread's part of a row: the word's maximum, one comparison with the part's (and the sum
// rescaled only where it grows: rare past a row's first words), then the N terms
// exp(x − largest), independent of each other, summed. A value at a time, each comparison
// branched before its exponential could start. kFirst: part.first tracks the first column
// holding the maximum (`none` until one does).
template <bool kFirst, int N>
__device__ __forceinline__ void add_word(SoftmaxPart& part, const float (&x)[N], int64_t column,
                                         int64_t none) {
  float word_largest = x[0];
#pragma unroll
  for (int n = 1; n < N; ++n) word_largest = fmaxf(word_largest, x[n]);
  const bool grows = word_largest > part.largest;
  if (grows) {
    part.sum *= scaled_exp(part.largest, word_largest);
    part.largest = word_largest;
  }
  // A word whose maximum equals the part's without growing it sets the first column only while
  // none is set: every value so far −∞.
  if (kFirst && (grows || (word_largest == part.largest && part.first == none))) {
    int first = N - 1;
#pragma unroll
    for (int n = N - 2; n >= 0; --n)
      if (x[n] == word_largest) first = n;
    part.first = column + first;
  }
  float terms[N];
  if (part.largest > -INFINITY && part.largest < INFINITY) {
#pragma unroll
    for (int n = 0; n < N; ++n) terms[n] = softmax_exp(x[n] - part.largest);  // NaN stays NaN
  } else {  // every value so far −∞ (each an empty term), or a +∞ (each +∞ a term of 1; the
            // combines' rescaling, +∞ − +∞, still makes such a row's sum NaN, as before)
#pragma unroll
    for (int n = 0; n < N; ++n)
      terms[n] = x[n] == -INFINITY      ? 0.f
                 : x[n] == part.largest ? 1.f
                                        : softmax_exp(x[n] - part.largest);
  }
  part.sum += word_sum(terms);
}

// One thread's part of a row, read once (the sum so far rescaled whenever the maximum grows); the
// first index is not tracked.
__device__ __forceinline__ SoftmaxPart thread_softmax_part(const float* row, int64_t cols) {
  SoftmaxPart part{-INFINITY, 0, 0.f};
  for_each_word_of(row, cols,
                   [&](const auto& x, int64_t column) { add_word<false>(part, x, column, 0); });
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

// Stores a word's gradient g[N] (columns column to column + N − 1 of a row): in bfloat16 over
// the bfloat16 logits it came from (Logit uint16_t), else in bfloat16 into `rounded` where given
// (a word of four as one 8-byte store where rounded_in_words), else over the float logits.
template <typename Logit, int N>
__device__ __forceinline__ void store_gradient(Logit* row, uint16_t* rounded, bool rounded_in_words,
                                               const float (&g)[N], int64_t column) {
  if constexpr (std::is_same_v<Logit, uint16_t>) {
    if constexpr (N == 8) {
      *reinterpret_cast<uint4*>(row + column) =
          make_uint4(to_bfloat16_pair(g[0], g[1]), to_bfloat16_pair(g[2], g[3]),
                     to_bfloat16_pair(g[4], g[5]), to_bfloat16_pair(g[6], g[7]));
      return;
    }
    rounded = row;  // the one-value words: below
  } else if (!rounded) {
    if constexpr (N == 4) {
      *reinterpret_cast<float4*>(row + column) = make_float4(g[0], g[1], g[2], g[3]);
    } else {
#pragma unroll
      for (int n = 0; n < N; ++n) row[column + n] = g[n];
    }
    return;
  } else if constexpr (N == 4) {
    if (rounded_in_words) {
      *reinterpret_cast<uint2*>(rounded + column) =
          make_uint2(to_bfloat16_pair(g[0], g[1]), to_bfloat16_pair(g[2], g[3]));
      return;
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) rounded[column + n] = to_bfloat16(g[n]);
}

// Per row, in one read of the logits: the loss terms in double and whether the first maximum is
// the target; then a second pass makes the row grad_scale · (softmax − smoothed one-hot), in
// float32 in place, or only in bfloat16 into rounded_gradient where that is given. The second
// pass reads the row again, from L2 where it is still there: keeping the row in shared memory
// between the passes (8c89ef0: 160 KB, one block of 1,024 threads an SM) took 0.73 ms for a chunk
// of 3,627 × 37,000 on an H200, where reading it twice with several blocks an SM, each loading
// while another reduces, took 0.47. Logit is float, or uint16_t: the logits in bfloat16 in
// rounded_gradient itself (Backend::cross_entropy_forward_backward's null logits), half the
// bytes each pass, each thread writing its words' gradient over the words it read. At fe8bad6
// that bfloat16 chunk still took 0.69 ms, with half the bytes of 0.47's: a value at a time, its
// branches, accurate exponential, double addition and rounding (about 25 instructions a value
// a pass) cost more than the bytes. Both passes now work a word at a time (add_word,
// softmax_exp, to_bfloat16_pair, the target's column found once a word).
template <typename Logit>
__global__ void __launch_bounds__(kLossThreads, kLossBlocksPerProcessor)
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
  double sum_logits = 0;  // a word's values summed in float, the words in double
  for_each_word_of(row, vocab, [&](const auto& x, int64_t column) {
    sum_logits += double(word_sum(x));
    add_word<true>(part, x, column, vocab);
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
  const bool rounded_in_words = aligned(rounded, 8);  // as a float4 word's four: 8 bytes
  const float target_term = grad_scale * (1.f - smoothing);
  for_each_word_of(row, vocab, [&](const auto& x, int64_t column) {
    constexpr int N = int(sizeof(x) / sizeof(x[0]));
    float g[N];
#pragma unroll
    for (int n = 0; n < N; ++n) g[n] = softmax_exp(x[n] - largest) * scale - uniform;
    const int64_t target_at = int64_t(y) - column;
    if (target_at >= 0 && target_at < N) {  // one word of the row
#pragma unroll
      for (int n = 0; n < N; ++n)
        if (n == target_at) g[n] -= target_term;
    }
    store_gradient(row, rounded, rounded_in_words, g, column);
  });
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
    // The warp's words first + lane, first + step + lane, ... as for_each_word visits a
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
    launch_kernel(cross_entropy_kernel<float>, unsigned(rows), kLossThreads, 0, s, logits, targets,
                  vocab, smoothing, grad_scale, row_totals, rounded_gradient);
  else  // the logits in bfloat16 in rounded_gradient, the gradient over them
    launch_kernel(cross_entropy_kernel<uint16_t>, unsigned(rows), kLossThreads, 0, s,
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
