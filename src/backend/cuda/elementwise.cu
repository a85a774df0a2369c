// The CUDA backend's element-wise, row and reduction kernels: rounding to bfloat16, bias and
// activations, dropout, layer normalisation, embeddings, the optimizer, row movement and int8
// quantisation. Each computes what the CPU kernel of the same name does (backend/cpu/), with the
// same rounding where results must agree bit for bit (bfloat16, the dropout hash, int8).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/operation_profile.h"

namespace tfm {
namespace cuda {

namespace {

// A [rows, cols] matrix with row stride ld can be read and written four columns at a time
// (float4, or four 16-bit values as 8 bytes) when cols and ld are multiples of 4 and its
// pointer is aligned to such a word (aligned(); a null pointer counts as aligned).
__host__ __forceinline__ bool four_columns_at_a_time(int64_t cols, int64_t ld) {
  return cols % 4 == 0 && ld % 4 == 0;
}

// float → bfloat16 with float32's subnormals flushed to a signed zero (the bfloat16-output
// product's contract: the CPU's product kernels flush them).
__device__ __forceinline__ uint16_t to_bfloat16_flushing(float v) {
  return fabsf(v) < 1.17549435e-38f ? uint16_t(signbit(v) ? 0x8000u : 0u) : to_bfloat16(v);
}

// The conversions of a 16-bit store (RowWord::store_16).
struct ToBFloat16 {
  __device__ uint16_t operator()(float v) const { return to_bfloat16(v); }
};
struct ToBFloat16Flushing {
  __device__ uint16_t operator()(float v) const { return to_bfloat16_flushing(v); }
};
template <bool kFloat16>
struct To16Bits {
  __device__ uint16_t operator()(float v) const { return to_16_bits<kFloat16>(v); }
};

// kWidth consecutive elements of a row as one load or store: a float4 (four 16-bit values as 8
// bytes, four mask bytes as 4) where kWidth is 4, the pointer aligned to it. The element-wise
// and row kernels are written once over kWidth: 1 is the one-at-a-time form every shape takes,
// 4 the form of rows and pointers aligned to words of four.
template <int kWidth>
struct RowWord;
template <>
struct RowWord<1> {
  __device__ static void load(const float* p, float* v) { v[0] = *p; }
  __device__ static void store(float* p, const float* v) { *p = v[0]; }
  __device__ static void load_bfloat16(const uint16_t* p, float* v) { v[0] = from_bfloat16(*p); }
  template <typename Convert>
  __device__ static void store_16(uint16_t* p, const float* v, Convert convert) {
    *p = convert(v[0]);
  }
  __device__ static void load_mask(const uint8_t* p, bool* keep) { keep[0] = *p != 0; }
  __device__ static void store_mask(uint8_t* p, const bool* keep) { *p = keep[0] ? 1 : 0; }
};
template <>
struct RowWord<4> {
  __device__ static void load(const float* p, float* v) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  }
  __device__ static void store(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  __device__ static void load_bfloat16(const uint16_t* p, float* v) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    v[0] = from_bfloat16(uint16_t(x.x & 0xffffu)), v[1] = from_bfloat16(uint16_t(x.x >> 16));
    v[2] = from_bfloat16(uint16_t(x.y & 0xffffu)), v[3] = from_bfloat16(uint16_t(x.y >> 16));
  }
  template <typename Convert>
  __device__ static void store_16(uint16_t* p, const float* v, Convert convert) {
    *reinterpret_cast<uint2*>(p) =
        pack_16_bits(convert(v[0]), convert(v[1]), convert(v[2]), convert(v[3]));
  }
  __device__ static void load_mask(const uint8_t* p, bool* keep) {
    const uint32_t bytes = *reinterpret_cast<const uint32_t*>(p);
    for (int e = 0; e < 4; ++e) keep[e] = ((bytes >> (8 * e)) & 0xffu) != 0;
  }
  __device__ static void store_mask(uint8_t* p, const bool* keep) {
    *reinterpret_cast<uint32_t*>(p) = uint32_t(keep[0]) | uint32_t(keep[1]) << 8 |
                                      uint32_t(keep[2]) << 16 | uint32_t(keep[3]) << 24;
  }
};

// Calls launch(width) with std::integral_constant<int, 4> where `words_of_four`, else with
// <int, 1>: the kWidth of a kernel written over RowWord.
template <typename Launch>
void launch_by_width(bool words_of_four, Launch launch) {
  if (words_of_four)
    launch(std::integral_constant<int, 4>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// out[rows, cols] (row stride ldo) = x rounded to 16 bits, kWidth columns a thread.
template <int kWidth, bool kFloat16>
__global__ void round_kernel(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint16_t* out,
                             int64_t ldo) {
  TFM_FOR_EACH_ELEMENT(r, w, rows, cols / kWidth) {
    float v[kWidth];
    RowWord<kWidth>::load(x + r * ldx + w * kWidth, v);
    RowWord<kWidth>::store_16(out + r * ldo + w * kWidth, v, To16Bits<kFloat16>{});
  }
}

// round_each_to_16_bits' jobs of one launch, passed by value as the kernel's parameter (2,128
// bytes of the 4 KB a parameter may take: nothing to copy to the device first, which a CUDA graph
// could record too). Job j takes blocks first_block[j] to first_block[j + 1] − 1, each rounding
// kRoundChunk of its floats: kRoundWordsPerThread words a thread, all loaded before any is
// stored, of four floats where the job's count and pointers allow (words_of_four) and of one
// otherwise.
constexpr int kRoundJobsPerLaunch = 64;
constexpr int kRoundWordsPerThread = 4;
constexpr int64_t kRoundChunk = int64_t(kThreads) * kRoundWordsPerThread * 4;  // floats a block
struct RoundingTable {
  const float* x[kRoundJobsPerLaunch];
  uint16_t* out[kRoundJobsPerLaunch];
  int64_t count[kRoundJobsPerLaunch];
  int64_t first_block[kRoundJobsPerLaunch + 1];
  bool words_of_four[kRoundJobsPerLaunch];
  int jobs;
};

// The chunk [begin, end) of one job in words of kWidth floats (end − begin a multiple of kWidth
// where kWidth is 4: the job's count is).
template <int kWidth, bool kFloat16>
__device__ __forceinline__ void round_chunk(const float* x, uint16_t* out, int64_t begin,
                                            int64_t end) {
  constexpr int kWordsPerChunk = int(kRoundChunk / kWidth);
  for (int done = 0; done < kWordsPerChunk; done += kThreads * kRoundWordsPerThread) {
    float v[kRoundWordsPerThread][kWidth];
#pragma unroll
    for (int n = 0; n < kRoundWordsPerThread; ++n) {
      const int64_t i = begin + int64_t(done + threadIdx.x + n * kThreads) * kWidth;
      if (i < end) RowWord<kWidth>::load(x + i, v[n]);
    }
#pragma unroll
    for (int n = 0; n < kRoundWordsPerThread; ++n) {
      const int64_t i = begin + int64_t(done + threadIdx.x + n * kThreads) * kWidth;
      if (i < end) RowWord<kWidth>::store_16(out + i, v[n], To16Bits<kFloat16>{});
    }
  }
}

template <bool kFloat16>
__global__ void round_each_kernel(const RoundingTable table) {
  int j = 0;  // the block's job: the last whose first block is at or before it (block-uniform)
  while (j + 1 < table.jobs && table.first_block[j + 1] <= int64_t(blockIdx.x)) ++j;
  const int64_t begin = (int64_t(blockIdx.x) - table.first_block[j]) * kRoundChunk;
  const int64_t end = begin + kRoundChunk < table.count[j] ? begin + kRoundChunk : table.count[j];
  if (table.words_of_four[j])
    round_chunk<4, kFloat16>(table.x[j], table.out[j], begin, end);
  else
    round_chunk<1, kFloat16>(table.x[j], table.out[j], begin, end);
}

// A word of a product's result with the bias (null: none) added and ReLU applied where asked:
// the product epilogues' step.
template <int kWidth>
__device__ __forceinline__ void load_biased_word(const float* result, const float* bias, bool relu,
                                                 float* v) {
  RowWord<kWidth>::load(result, v);
  float b[kWidth];
  if (bias) RowWord<kWidth>::load(bias, b);
#pragma unroll
  for (int e = 0; e < kWidth; ++e) {
    if (bias) v[e] += b[e];
    if (relu) v[e] = v[e] > 0.f ? v[e] : 0.f;
  }
}

// A float product's result with bias and ReLU, rounded to bfloat16 with subnormals flushed.
template <int kWidth>
__global__ void round_flushing_kernel(const float* result, int64_t ldr, const float* bias,
                                      bool relu, int64_t rows, int64_t cols, uint16_t* out,
                                      int64_t ldo) {
  TFM_FOR_EACH_ELEMENT(r, w, rows, cols / kWidth) {
    const int64_t c = w * kWidth;
    float v[kWidth];
    load_biased_word<kWidth>(result + r * ldr + c, bias ? bias + c : nullptr, relu, v);
    RowWord<kWidth>::store_16(out + r * ldo + c, v, ToBFloat16Flushing{});
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  TFM_FOR_EACH(i, n) y[i] += x[i];
}
__global__ void add_bfloat16_kernel(float* y, const uint16_t* x, int64_t n) {
  TFM_FOR_EACH(i, n) y[i] += from_bfloat16(x[i]);
}
__global__ void scale_kernel(float* x, float s, int64_t n) {
  TFM_FOR_EACH(i, n) x[i] *= s;
}
__global__ void fill_kernel(float* y, int64_t n, float value) {
  TFM_FOR_EACH(i, n) y[i] = value;
}

__global__ void scale_matrix_kernel(float* c, int64_t ldc, int64_t rows, int64_t cols, float beta) {
  TFM_FOR_EACH_ELEMENT(r, col, rows, cols) {
    float& v = c[r * ldc + col];
    v = beta == 0.f ? 0.f : v * beta;
  }
}

template <int kWidth>
__global__ void bias_relu_kernel(float* y, int64_t ldy, const float* bias, bool relu, int64_t rows,
                                 int64_t cols) {
  TFM_FOR_EACH_ELEMENT(r, w, rows, cols / kWidth) {
    const int64_t c = w * kWidth;
    float v[kWidth];
    load_biased_word<kWidth>(y + r * ldy + c, bias ? bias + c : nullptr, relu, v);
    RowWord<kWidth>::store(y + r * ldy + c, v);
  }
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f));
}

template <int kWidth>
__global__ void bias_activation_kernel(float* pre, const float* bias, float* out, int64_t rows,
                                       int64_t cols, bool apply, Activation act) {
  TFM_FOR_EACH_ELEMENT(r, w, rows, cols / kWidth) {
    const int64_t c = w * kWidth, i = r * cols + c;
    float x[kWidth], b[kWidth];
    RowWord<kWidth>::load(pre + i, x);
    if (bias) {
      RowWord<kWidth>::load(bias + c, b);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) x[e] += b[e];
      RowWord<kWidth>::store(pre + i, x);
    }
    if (!apply) continue;
#pragma unroll
    for (int e = 0; e < kWidth; ++e)
      x[e] = act == Activation::kRelu ? (x[e] > 0.f ? x[e] : 0.f) : gelu(x[e]);
    RowWord<kWidth>::store(out + i, x);
  }
}

__global__ void activation_backward_kernel(float* d, const float* pre, int64_t n, Activation act) {
  TFM_FOR_EACH(i, n) {
    const float x = pre[i];
    if (act == Activation::kRelu) {
      d[i] = x > 0.f ? d[i] : 0.f;
    } else {
      const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752440f));
      const float pdf = 0.39894228040143267794f * expf(-0.5f * x * x);
      d[i] *= cdf + x * pdf;
    }
  }
}

// kWidth elements of the ReLU's backward from its bfloat16 output at element i: d where that
// output is positive, else 0, into g, and rounded into rounded_d (d null: the gradient comes in
// bfloat16 in rounded_d, and g is written over it).
template <int kWidth>
__device__ __forceinline__ void relu_backward_word(const float* d, const uint16_t* relu_output,
                                                   int64_t i, uint16_t* rounded_d, float* g) {
  float out[kWidth];
  if (d)
    RowWord<kWidth>::load(d + i, g);
  else
    RowWord<kWidth>::load_bfloat16(rounded_d + i, g);
  RowWord<kWidth>::load_bfloat16(relu_output + i, out);
#pragma unroll
  for (int e = 0; e < kWidth; ++e) g[e] = out[e] > 0.f ? g[e] : 0.f;
  RowWord<kWidth>::store_16(rounded_d + i, g, ToBFloat16{});
}

// relu_backward_bfloat16 without column sums, kWidth elements a thread.
template <int kWidth>
__global__ void relu_backward_bfloat16_kernel(const float* d, const uint16_t* relu_output,
                                              int64_t n, uint16_t* rounded_d) {
  TFM_FOR_EACH(w, n / kWidth) {
    float g[kWidth];
    relu_backward_word<kWidth>(d, relu_output, w * kWidth, rounded_d, g);
  }
}

// Column sums over many rows in two deterministic passes: chunks of rows summed per column into
// partial[chunk, cols] (threads along the columns: coalesced), then each column's chunks added
// in chunk order. A single pass of one thread per column left the GPU nearly idle (cols threads
// each walking every row). Σ over rows of f(r, c), with f one of the two below.
struct RowsPerChunk {
  int64_t rows, chunk_rows, chunks;
};
RowsPerChunk column_chunks(int64_t rows) {
  const int64_t chunk_rows = rows > 64 * 256 ? (rows + 255) / 256 : 64;
  return {rows, chunk_rows, (rows + chunk_rows - 1) / chunk_rows};
}

// Whether the first pass of a column sum takes four columns a thread: only where that leaves as
// many blocks as one column a thread gives 512 columns (4 blocks of 128 columns per chunk). On an
// H200, 25,600 × 2048 took 0.063 ms four a thread against 0.073 one a thread, but 25,600 × 512
// 0.032 against 0.026: a quarter of the blocks left the memory short of requests.
bool four_columns_per_thread(int64_t cols) {
  return cols % 4 == 0 && cols >= 2048;
}

// The terms a column sum adds, a word of kWidth at row r, column c of the matrix: the values of
// dy themselves (bias_backward; rows ld apart), or of its bfloat16 copy, or the ReLU's backward
// of d, rounded into rounded_d on the way (relu_backward_bfloat16; dense).
struct ValueTerms {
  const float* dy;
  int64_t ld;
  template <int kWidth>
  __device__ void word(int64_t r, int64_t c, float* v) const {
    RowWord<kWidth>::load(dy + r * ld + c, v);
  }
};
struct RoundedValueTerms {  // the same from dy's bfloat16 copy
  const uint16_t* dy;
  int64_t ld;
  template <int kWidth>
  __device__ void word(int64_t r, int64_t c, float* v) const {
    RowWord<kWidth>::load_bfloat16(dy + r * ld + c, v);
  }
};
struct ReluBackwardTerms {
  const float* d;
  const uint16_t* relu_output;
  uint16_t* rounded_d;
  int64_t cols;
  template <int kWidth>
  __device__ void word(int64_t r, int64_t c, float* v) const {
    relu_backward_word<kWidth>(d, relu_output, r * cols + c, rounded_d, v);
  }
};

// partial[chunk, c] = Σ of terms at [r, c] over the chunk's rows, kWidth columns a thread, the
// rows added in order. Each thread reads kRowsInFlight rows' words before adding any: one row at
// a time left one load in flight a thread (on the H200, 25,600 × 512 bfloat16 summed at
// 1.5 TB/s, 0.017 ms), too few to cover the memory's latency.
constexpr int kRowsInFlight = 4;
template <int kWidth, typename Terms>
__global__ void column_partial_kernel(Terms terms, RowsPerChunk split, int64_t cols,
                                      float* partial) {
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth;
  if (c >= cols) return;
  const int64_t begin = int64_t(blockIdx.y) * split.chunk_rows;
  const int64_t end = begin + split.chunk_rows < split.rows ? begin + split.chunk_rows : split.rows;
  float sum[kWidth] = {};
  int64_t r = begin;
  for (; r + kRowsInFlight <= end; r += kRowsInFlight) {
    float v[kRowsInFlight][kWidth];
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) terms.template word<kWidth>(r + i, c, v[i]);
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i)
#pragma unroll
      for (int e = 0; e < kWidth; ++e) sum[e] += v[i][e];
  }
  for (; r < end; ++r) {
    float v[kWidth];
    terms.template word<kWidth>(r, c, v);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) sum[e] += v[e];
  }
  RowWord<kWidth>::store(partial + int64_t(blockIdx.y) * cols + c, sum);
}

// out[c] += Σ_chunks partial[chunk, c] (chunk rows ld apart): a block of kSumColumns columns ×
// kSumLanes threads per column, thread y summing chunks y, y + kSumLanes, ..., then the kSumLanes
// sums added in order (deterministic). One thread per column walking every chunk left the GPU
// nearly idle: a few hundred threads, each with a few hundred loads one after another.
constexpr int kSumColumns = 32, kSumLanes = 8;
__global__ void sum_chunks_kernel(const float* partial, int64_t chunks, int64_t cols, int64_t ld,
                                  float* out) {
  __shared__ float sums[kSumLanes][kSumColumns + 1];
  const int64_t c = int64_t(blockIdx.x) * kSumColumns + threadIdx.x;
  float sum = 0.f;
  if (c < cols)
    for (int64_t chunk = threadIdx.y; chunk < chunks; chunk += kSumLanes)
      sum += partial[chunk * ld + c];
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = 0.f;
  for (int y = 0; y < kSumLanes; ++y) total += sums[y][threadIdx.x];
  out[c] += total;
}
void launch_sum_chunks(cudaStream_t s, const float* partial, int64_t chunks, int64_t cols,
                       float* out, int64_t ld) {
  launch_kernel(sum_chunks_kernel, unsigned((cols + kSumColumns - 1) / kSumColumns),
                dim3(kSumColumns, kSumLanes), 0, s, partial, chunks, cols, ld, out);
}

// out[cols] += the column sums of `terms` over rows × cols in those two passes, four columns a
// thread where four_columns_per_thread(cols) and the terms' pointers allow words of four
// (words_of_four); `name` names the launches in errors.
template <typename Terms>
void sum_columns(const Context& c, Terms terms, int64_t rows, int64_t cols, bool words_of_four,
                 float* out, const char* name) {
  const RowsPerChunk split = column_chunks(rows);
  Scratch partial(c, split.chunks * cols * int64_t(sizeof(float)));  // [chunks, cols]
  launch_by_width(four_columns_per_thread(cols) && words_of_four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    const dim3 grid(unsigned((cols / kWidth + 127) / 128), unsigned(split.chunks));
    launch_kernel(column_partial_kernel<kWidth, Terms>, grid, 128, 0, c.stream, terms, split, cols,
                  partial.as<float>());
  });
  check_launch(name);
  launch_sum_chunks(c.stream, partial.as<float>(), split.chunks, cols, out, cols);
  check_launch((std::string(name) + " (chunks)").c_str());
}

// Dropout's keep decision for element i: the CPU's counter-based hash of (key, i) against p in
// units of 2^-24 (dropout_threshold), so that any pass over any part of a matrix draws the same
// mask.
__host__ __device__ __forceinline__ uint32_t dropout_threshold(float p) {
  return uint32_t(double(p) * 16777216.0);
}
__device__ __forceinline__ bool dropout_keeps(uint64_t key, uint64_t i, uint32_t threshold) {
  uint64_t z = key + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return uint32_t(z >> 40) >= threshold;
}

__global__ void dropout_mask_kernel(uint8_t* mask, int64_t n, uint32_t threshold, uint64_t key) {
  TFM_FOR_EACH(i, n) mask[i] = dropout_keeps(key, uint64_t(i), threshold) ? 1 : 0;
}

// A dropout as the kernels that apply it read it: `active` where p > 0, each element's keep
// decision read from the forward's mask or, mask null, drawn again from (key, element) as the
// forward drew it (Backend::dropout_mask_bytes: this backend keeps no mask).
struct KeepDecisions {
  bool active = false;
  const uint8_t* mask = nullptr;  // [elements] or null
  uint64_t key = 0;
  uint32_t threshold = 0;
  float keep_scale = 1.f;
  // v[kWidth], the elements from i on, dropped.
  template <int kWidth>
  __device__ void apply(int64_t i, float* v) const {
    if (!active) return;
    bool keep[kWidth];
    if (mask) {
      RowWord<kWidth>::load_mask(mask + i, keep);
    } else {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) keep[e] = dropout_keeps(key, uint64_t(i + e), threshold);
    }
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] = keep[e] ? v[e] * keep_scale : 0.f;
  }
};
KeepDecisions keep_decisions(const uint8_t* mask, float p, uint64_t key) {
  if (!(p > 0.f)) return {};
  return {true, mask, key, dropout_threshold(p), 1.f / (1.f - p)};
}

__global__ void apply_dropout_kernel(float* x, int64_t n, KeepDecisions drop) {
  TFM_FOR_EACH(i, n) {
    float v = x[i];
    drop.apply<1>(i, &v);
    x[i] = v;
  }
}

// One row normalised by the block (the mean, then the variance about it: two passes, as the
// CPU's), its statistics stored by thread 0 where asked for. out may alias in.
__device__ __forceinline__ void normalize_row(const float* in, const float* gamma,
                                              const float* beta, float* out, int64_t cols,
                                              float eps, float* mean_out, float* rstd_out,
                                              float* shared) {
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += in[c];
  const float mean = block_sum(sum, shared) / float(cols);
  float sum_sq = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = in[c] - mean;
    sum_sq += d * d;
  }
  const float inv_std = rsqrtf(block_sum(sum_sq, shared) / float(cols) + eps);
  if (threadIdx.x == 0) {
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = inv_std;
  }
  __syncthreads();  // out may alias in: every thread has read its row before any writes
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = (in[c] - mean) * inv_std * gamma[c] + beta[c];
}

// One block per row.
__global__ void layer_norm_kernel(const float* x, const float* gamma, const float* beta, float* y,
                                  int64_t cols, float eps, float* mean_out, float* rstd_out) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  normalize_row(x + r * cols, gamma, beta, y + r * cols, cols, eps,
                mean_out ? mean_out + r : nullptr, rstd_out ? rstd_out + r : nullptr, shared);
}

// Backend::residual_layer_norm, one block per row: f = x + dropout(f) (where `dropping`, the
// decisions drawn here and kept in mask where it is given), then the row normalised into y, and
// y rounded to bfloat16 where asked. Each thread reads back only the sum elements it wrote
// itself before the first barrier.
__global__ void residual_layer_norm_kernel(float* f, const float* x, int64_t cols, bool dropping,
                                           uint32_t threshold, float keep_scale, uint64_t key,
                                           uint8_t* mask, const float* gamma, const float* beta,
                                           float eps, float* y, float* mean_out, float* rstd_out,
                                           uint16_t* rounded_y) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  float* sum = f + r * cols;
  const float* in = x + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float value = sum[c];
    if (dropping) {
      const bool keep = dropout_keeps(key, uint64_t(r * cols + c), threshold);
      if (mask) mask[r * cols + c] = keep ? 1 : 0;
      value = keep ? value * keep_scale : 0.f;
    }
    sum[c] = value + in[c];
  }
  float* out = y + r * cols;
  normalize_row(sum, gamma, beta, out, cols, eps, mean_out ? mean_out + r : nullptr,
                rstd_out ? rstd_out + r : nullptr, shared);
  if (rounded_y)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      rounded_y[r * cols + c] = to_bfloat16(out[c]);
}

// The same three kernels with a warp per row, for rows of at most 32 · kPerLane words of kWidth
// floats: the row stays in registers (lane l holds words l, l + 32, ...; each warp load
// coalesced), so the statistics need only warp shuffles and no block barrier, and every thread
// has kPerLane loads in flight, of 16 bytes each where the row is float4 words (kWidth 4). A
// block of 256 threads for 256 / 32 rows; the block kernels above serve longer rows.
constexpr int kWarpRows = kThreads / 32;
// The longest rows the warp-per-row kernels hold (launch_warp_rows).
constexpr int64_t kWarpRowColumns = 1024;

// Backend::layer_norm (f null) or residual_layer_norm (f: the branch, dropped where `dropping` by
// the decisions drawn here, kept in mask where it is given, and added to x, the sum kept in f)
// of row blockIdx.x · kWarpRows + warp.
template <int kWidth, int kPerLane>
__global__ void layer_norm_warp_kernel(float* f, const float* x, int64_t rows, int64_t cols,
                                       bool dropping, uint32_t threshold, float keep_scale,
                                       uint64_t key, uint8_t* mask, const float* gamma,
                                       const float* beta, float eps, float* y, float* mean_out,
                                       float* rstd_out, uint16_t* rounded_y) {
  using Word = RowWord<kWidth>;
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (r >= rows) return;
  float value[kPerLane][kWidth];
  float sum = 0.f;
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int64_t c = int64_t(lane + 32 * m) * kWidth, i = r * cols + c;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) value[m][e] = 0.f;
    if (c >= cols) continue;
    float v[kWidth];
    Word::load(x + i, v);
    if (f) {
      float branch[kWidth];
      Word::load(f + i, branch);
      if (dropping) {
        bool keep[kWidth];
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          keep[e] = dropout_keeps(key, uint64_t(i + e), threshold);
          branch[e] = keep[e] ? branch[e] * keep_scale : 0.f;
        }
        if (mask) Word::store_mask(mask + i, keep);
      }
#pragma unroll
      for (int e = 0; e < kWidth; ++e) v[e] = branch[e] + v[e];
      Word::store(f + i, v);
    }
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      value[m][e] = v[e];
      sum += v[e];
    }
  }
  const float mean = warp_sum(sum) / float(cols);
  float sum_sq = 0.f;
#pragma unroll
  for (int m = 0; m < kPerLane; ++m)
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      const float d = int64_t(lane + 32 * m) * kWidth < cols ? value[m][e] - mean : 0.f;
      sum_sq += d * d;
    }
  const float inv_std = rsqrtf(warp_sum(sum_sq) / float(cols) + eps);
  if (lane == 0) {
    if (mean_out) mean_out[r] = mean;
    if (rstd_out) rstd_out[r] = inv_std;
  }
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int64_t c = int64_t(lane + 32 * m) * kWidth, i = r * cols + c;
    if (c >= cols) continue;
    float g[kWidth], b[kWidth], out[kWidth];
    Word::load(gamma + c, g);
    Word::load(beta + c, b);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) out[e] = (value[m][e] - mean) * inv_std * g[e] + b[e];
    Word::store(y + i, out);
    if (rounded_y) Word::store_16(rounded_y + i, out, ToBFloat16{});
  }
}

// The columns a warp kernel's lane holds: (lane + 32·m)·kWidth + e, m < kPerLane, e < kWidth.
template <int kWidth, int kPerLane>
constexpr int kWarpColumns = 32 * kPerLane* kWidth;

// out[c] = Σ rows[w][c] over the block's warps in warp order (deterministic), for c < cols; the
// rows complete (after a barrier).
template <int kColumns>
__device__ void sum_warp_rows(const float (&rows)[kWarpRows][kColumns], int64_t cols, float* out) {
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpRows; ++w) sum += rows[w][c];
    out[c] = sum;
  }
}

// A warp's running sums of its lanes' columns over the rows it takes, in the block's shared
// memory where the kernel lends it (kShared: a row of kWarpColumns per warp, so that the
// registers hold the rows being read rather than the sums), else in registers; total() adds the
// block's warps in warp order into out[cols]. The same additions in the same order either way.
// Every thread of the block calls total().
template <int kWidth, int kPerLane, bool kShared>
struct WarpColumnSums;

template <int kWidth, int kPerLane>
struct WarpColumnSums<kWidth, kPerLane, true> {
  using Rows = float[kWarpRows][kWarpColumns<kWidth, kPerLane>];
  Rows& rows;
  float* mine;  // this lane's first column of its warp's row

  __device__ explicit WarpColumnSums(Rows& block_rows)
      : rows(block_rows), mine(&block_rows[threadIdx.x >> 5][(threadIdx.x & 31) * kWidth]) {
    const float zero[kWidth] = {};
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) RowWord<kWidth>::store(mine + 32 * m * kWidth, zero);
  }
  // Column block m += a · b (elementwise), or += a.
  __device__ void add(int m, const float (&a)[kWidth], const float (&b)[kWidth]) {
    float v[kWidth];
    RowWord<kWidth>::load(mine + 32 * m * kWidth, v);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] += a[e] * b[e];
    RowWord<kWidth>::store(mine + 32 * m * kWidth, v);
  }
  __device__ void add(int m, const float (&a)[kWidth]) {
    float v[kWidth];
    RowWord<kWidth>::load(mine + 32 * m * kWidth, v);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] += a[e];
    RowWord<kWidth>::store(mine + 32 * m * kWidth, v);
  }
  __device__ void total(int64_t cols, float* out) {
    __syncthreads();  // every warp's row complete
    sum_warp_rows(rows, cols, out);
  }
};

template <int kWidth, int kPerLane>
struct WarpColumnSums<kWidth, kPerLane, false> {
  using Rows = float[kWarpRows][kWarpColumns<kWidth, kPerLane>];
  Rows& stage;  // the block's scratch for total()
  float v[kPerLane][kWidth] = {};

  __device__ explicit WarpColumnSums(Rows& block_stage) : stage(block_stage) {}
  __device__ void add(int m, const float (&a)[kWidth], const float (&b)[kWidth]) {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[m][e] += a[e] * b[e];
  }
  __device__ void add(int m, const float (&a)[kWidth]) {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[m][e] += a[e];
  }
  __device__ void total(int64_t cols, float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the stage's last use is over
#pragma unroll
    for (int m = 0; m < kPerLane; ++m)
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        const int64_t c = int64_t(lane + 32 * m) * kWidth + e;
        if (c < cols) stage[warp][c] = v[m][e];
      }
    __syncthreads();
    sum_warp_rows(stage, cols, out);
  }
};

// Whether layer_norm_backward_chunk_kernel keeps its three column sums in shared memory: rows
// up to 512 columns (3 × 8 × 512 floats, the 48 KB a block holds without asking). Longer rows
// (to 1024) keep them in registers, one block an SM.
template <int kWidth, int kPerLane>
constexpr bool kNormSumsShared = kWarpColumns<kWidth, kPerLane> <= 512;

// The chunks of layer_norm_backward_chunk_kernel: one for each of the three blocks an SM of
// `device` holds where the sums are in shared memory (a whole number of waves: 400 chunks on an
// H200's 132 SMs would leave 4 blocks a wave of their own), each of at least a row a warp.
// column_chunks' 64-row minimum would leave 4,096 rows 64 blocks.
RowsPerChunk warp_row_chunks(int device, int64_t rows) {
  int processors = 0;
  TFM_CUDA(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = 3 * int64_t(std::max(processors, 1));
  const int64_t chunk_rows = std::max<int64_t>(kWarpRows, (rows + blocks - 1) / blocks);
  return {rows, chunk_rows, (rows + chunk_rows - 1) / chunk_rows};
}

// layer_norm_backward in one pass over the rows, for rows a warp holds (launch_warp_rows):
// block b takes the rows of chunk b of split (warp_row_chunks), its warps a row each in turn (warp
// w: rows begin + w, begin + w + kWarpRows, ...). Each row's dx (= or += when accumulate; dy may
// alias dx: the warp holds its row before writing) and, for the residual sublayer's backward, the
// gradient dropped as `drop` decides (KeepDecisions) into d_f and rounded_d_f where
// given; meanwhile each lane adds its columns' terms of dgamma (dy·x̂), dbeta (dy) and, where
// sum_d_f, the dropped gradient (WarpColumnSums); the block's warps then add theirs in warp order
// into partial[b, 3, cols] (deterministic: the chunks depend on the rows and the device alone),
// whose chunks sum_chunks adds up: the rows are read once (a pass for the column sums and another
// for dx read them twice, and the bias gradient's own pass read d_f again). With the sums in
// registers rows of 512 columns took 116 registers, two blocks an SM, and 0.1 ms for 25,600 rows on
// an H200 (twice their bytes' time); in shared memory, three blocks. Rows to 1024 columns: 204
// registers, one block (two blocks' 128 spilled).
template <int kWidth, int kPerLane>
__global__ void __launch_bounds__(kThreads, kNormSumsShared<kWidth, kPerLane> ? 3 : 1)
    layer_norm_backward_chunk_kernel(const float* dy, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, float* dx,
                                     RowsPerChunk split, int64_t cols, bool accumulate,
                                     KeepDecisions drop, float* d_f, uint16_t* rounded_d_f,
                                     bool sum_d_f, float* partial) {
  using Word = RowWord<kWidth>;
  constexpr bool kShared = kNormSumsShared<kWidth, kPerLane>;
  using Sums = WarpColumnSums<kWidth, kPerLane, kShared>;
  // Shared: the three sums' rows; registers: one stage for total().
  __shared__ __align__(
      16) float block_rows[kShared ? 3 : 1][kWarpRows][kWarpColumns<kWidth, kPerLane>];
  Sums sum_gamma(block_rows[0]), sum_beta(block_rows[kShared ? 1 : 0]),
      sum_f(block_rows[kShared ? 2 : 0]);
  const int lane = threadIdx.x & 31;
  const int64_t begin = int64_t(blockIdx.x) * split.chunk_rows;
  const int64_t end = begin + split.chunk_rows < split.rows ? begin + split.chunk_rows : split.rows;
  const bool dropped_out = d_f || rounded_d_f;  // the residual sublayer's backward
  for (int64_t r = begin + (threadIdx.x >> 5); r < end; r += kWarpRows) {
    const float m_r = mean[r], s = rstd[r];
    float g[kPerLane][kWidth], in[kPerLane][kWidth];
    float sum_gy = 0.f, sum_gy_xhat = 0.f;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const int64_t c = int64_t(lane + 32 * m) * kWidth, i = r * cols + c;
#pragma unroll
      for (int e = 0; e < kWidth; ++e) g[m][e] = in[m][e] = 0.f;
      if (c >= cols) continue;
      float gam[kWidth], x_hat[kWidth];
      Word::load(dy + i, g[m]);
      Word::load(x + i, in[m]);
      Word::load(gamma + c, gam);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        x_hat[e] = (in[m][e] - m_r) * s;
        const float gy = g[m][e] * gam[e];
        sum_gy += gy;
        sum_gy_xhat += gy * x_hat[e];
      }
      sum_gamma.add(m, g[m], x_hat);
      sum_beta.add(m, g[m]);
    }
    const float mean_gy = warp_sum(sum_gy) / float(cols);
    const float mean_gy_xhat = warp_sum(sum_gy_xhat) / float(cols);
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const int64_t c = int64_t(lane + 32 * m) * kWidth, i = r * cols + c;
      if (c >= cols) continue;
      float gam[kWidth], d[kWidth];
      Word::load(gamma + c, gam);
      if (accumulate) Word::load(dx + i, d);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        const float x_hat = (in[m][e] - m_r) * s;
        const float v = s * (g[m][e] * gam[e] - mean_gy - x_hat * mean_gy_xhat);
        d[e] = accumulate ? d[e] + v : v;
      }
      Word::store(dx + i, d);
      if (!dropped_out) continue;
      drop.apply<kWidth>(i, d);
      if (sum_d_f) sum_f.add(m, d);
      if (d_f) Word::store(d_f + i, d);
      if (rounded_d_f) Word::store_16(rounded_d_f + i, d, ToBFloat16{});
    }
  }
  float* block_partial = partial + int64_t(blockIdx.x) * 3 * cols;  // [3, cols]
  sum_gamma.total(cols, block_partial);
  sum_beta.total(cols, block_partial + cols);
  if (sum_d_f) sum_f.total(cols, block_partial + 2 * cols);
}

// Calls launch(width, per_lane) (std::integral_constant tags of the warp kernels' kWidth and
// kPerLane) for rows of `cols` columns, read in words of four where `words_of_four`; false where
// a row is too long for the warp kernels (the block kernels then).
template <typename Launch>
bool launch_warp_rows(int64_t cols, bool words_of_four, Launch launch) {
  using One = std::integral_constant<int, 1>;
  using Four = std::integral_constant<int, 4>;
  if (cols > kWarpRowColumns) return false;
  if (words_of_four) {
    if (cols <= 128)
      launch(Four{}, std::integral_constant<int, 1>{});
    else if (cols <= 256)
      launch(Four{}, std::integral_constant<int, 2>{});
    else if (cols <= 512)
      launch(Four{}, std::integral_constant<int, 4>{});
    else
      launch(Four{}, std::integral_constant<int, 8>{});
  } else {
    if (cols <= 128)
      launch(One{}, std::integral_constant<int, 4>{});
    else if (cols <= 256)
      launch(One{}, std::integral_constant<int, 8>{});
    else if (cols <= 512)
      launch(One{}, std::integral_constant<int, 16>{});
    else
      launch(One{}, std::integral_constant<int, 32>{});
  }
  return true;
}
unsigned warp_row_blocks(int64_t rows) {
  return unsigned((rows + kWarpRows - 1) / kWarpRows);
}

// dx of one row per block. dy may alias dx row by row: every thread's two sums are complete
// (a barrier inside block_sum) before any element is written. With d_f (the residual sublayer's
// backward), each dx element is also dropped into d_f (a copy where the dropout is not active)
// and rounded into rounded_d_f where that is given.
__global__ void layer_norm_dx_kernel(const float* dy, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, float* dx, int64_t cols,
                                     bool accumulate, KeepDecisions drop, float* d_f,
                                     uint16_t* rounded_d_f) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* g = dy + r * cols;
  const float* in = x + r * cols;
  float* out = dx + r * cols;
  const float m = mean[r], s = rstd[r];
  float sum_gy = 0.f, sum_gy_xhat = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float gy = g[c] * gamma[c];
    sum_gy += gy;
    sum_gy_xhat += gy * (in[c] - m) * s;
  }
  const float mean_gy = block_sum(sum_gy, shared) / float(cols);
  const float mean_gy_xhat = block_sum(sum_gy_xhat, shared) / float(cols);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = s * (g[c] * gamma[c] - mean_gy - (in[c] - m) * s * mean_gy_xhat);
    const float d = accumulate ? out[c] + v : v;
    out[c] = d;
    if (d_f) {
      const int64_t i = r * cols + c;
      float dropped = d;
      drop.apply<1>(i, &dropped);
      d_f[i] = dropped;
      if (rounded_d_f) rounded_d_f[i] = to_bfloat16(dropped);
    }
  }
}

// dgamma, dbeta partials: [chunk, cols] of Σ dy·x̂ and then [chunk, cols] of Σ dy, for the
// chunk's rows (the two-pass column sum of column_partial_kernel). Runs before the dx kernel,
// which may overwrite dy.
template <int kWidth>
__global__ void layer_norm_partial_kernel(const float* dy, const float* x, const float* mean,
                                          const float* rstd, RowsPerChunk split, int64_t cols,
                                          float* partial_gamma, float* partial_beta) {
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth;
  if (c >= cols) return;
  const int64_t begin = int64_t(blockIdx.y) * split.chunk_rows;
  const int64_t end = begin + split.chunk_rows < split.rows ? begin + split.chunk_rows : split.rows;
  float sum_g[kWidth] = {}, sum_b[kWidth] = {};
  for (int64_t r = begin; r < end; ++r) {
    float g[kWidth], in[kWidth];
    RowWord<kWidth>::load(dy + r * cols + c, g);
    RowWord<kWidth>::load(x + r * cols + c, in);
    const float m = mean[r], s = rstd[r];
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      sum_g[e] += g[e] * (in[e] - m) * s;
      sum_b[e] += g[e];
    }
  }
  RowWord<kWidth>::store(partial_gamma + int64_t(blockIdx.y) * cols + c, sum_g);
  RowWord<kWidth>::store(partial_beta + int64_t(blockIdx.y) * cols + c, sum_b);
}

__global__ void embedding_forward_kernel(const float* table, int64_t table_ld, Int8Rows int8,
                                         const float* positions, const int32_t* ids, int64_t rows,
                                         int64_t len, int64_t d, float scale,
                                         int64_t first_position, float* out) {
  TFM_FOR_EACH_ELEMENT(row, c, rows, d) {
    const int64_t id = ids[row];
    float v = int8.values ? float(int8.values[id * d + c]) * (int8.scales[id] * scale)
                          : table[id * table_ld + c] * scale;
    if (positions) v += positions[(first_position + row % len) * d + c];
    out[row * d + c] = v;
  }
}

__global__ void scale_and_add_positions_kernel(const float* positions, int64_t rows, int64_t len,
                                               int64_t d, float scale, int64_t first_position,
                                               float* out) {
  TFM_FOR_EACH_ELEMENT(row, c, rows, d) {
    float& v = out[row * d + c];
    v = v * scale + (positions ? positions[(first_position + row % len) * d + c] : 0.f);
  }
}

__global__ void embedding_backward_kernel(const float* d_out, const int32_t* ids, int64_t rows,
                                          int64_t len, int64_t d, float scale,
                                          int64_t first_position, float* d_table,
                                          float* d_positions) {
  TFM_FOR_EACH_ELEMENT(row, c, rows, d) {
    const float g = d_out[row * d + c];
    atomicAdd(d_table + int64_t(ids[row]) * d + c, scale * g);
    if (d_positions) atomicAdd(d_positions + (first_position + row % len) * d + c, g);
  }
}

// Every tensor of the set in one launch, over the flat range of the gradient block, four
// elements a thread: element e belongs to the last tensor i with offsets[i] <= e (a binary search
// of the small offsets table, which stays in the cache, once per thread; that tensor is
// non-empty, as offsets[i + 1] > e). Four elements within one tensor, with every address
// aligned (the blocks' checked by the host), move as float4 words; elsewhere (a tensor's edge)
// one at a time.
// One Adam step of one element; returns the parameter's new value.
__device__ __forceinline__ float adam_element(float p, float g, float& m, float& v, float b1,
                                              float b2, float eps, float step_size,
                                              float inv_sqrt_bc2) {
  m = b1 * m + (1.f - b1) * g;
  v = b2 * v + (1.f - b2) * g * g;
  return p - step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
}

__global__ void adam_kernel(float* const* params, const int64_t* offsets, int64_t count,
                            int64_t total, const float* grad, float* m, float* v, float b1,
                            float b2, float eps, float step_size, float inv_sqrt_bc2,
                            bool blocks_aligned) {
  TFM_FOR_EACH(quad, (total + 3) / 4) {
    const int64_t first = 4 * quad;
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= first)
        lo = mid;
      else
        hi = mid - 1;
    }
    float* param = params[lo] + (first - offsets[lo]);
    if (blocks_aligned && first + 4 <= offsets[lo + 1] && aligned(param, 16)) {
      const float4 g = *reinterpret_cast<const float4*>(grad + first);
      float4 mw = *reinterpret_cast<const float4*>(m + first);
      float4 vw = *reinterpret_cast<const float4*>(v + first);
      float4 p = *reinterpret_cast<const float4*>(param);
      p.x = adam_element(p.x, g.x, mw.x, vw.x, b1, b2, eps, step_size, inv_sqrt_bc2);
      p.y = adam_element(p.y, g.y, mw.y, vw.y, b1, b2, eps, step_size, inv_sqrt_bc2);
      p.z = adam_element(p.z, g.z, mw.z, vw.z, b1, b2, eps, step_size, inv_sqrt_bc2);
      p.w = adam_element(p.w, g.w, mw.w, vw.w, b1, b2, eps, step_size, inv_sqrt_bc2);
      *reinterpret_cast<float4*>(m + first) = mw;
      *reinterpret_cast<float4*>(v + first) = vw;
      *reinterpret_cast<float4*>(param) = p;
      continue;
    }
    for (int64_t e = first; e < first + 4 && e < total; ++e) {
      while (offsets[lo + 1] <= e) ++lo;  // the next non-empty tensor
      float* target = params[lo] + (e - offsets[lo]);
      *target = adam_element(*target, grad[e], m[e], v[e], b1, b2, eps, step_size, inv_sqrt_bc2);
    }
  }
}

__global__ void sgd_kernel(float* param, const float* grad, int64_t n, float lr) {
  TFM_FOR_EACH(i, n) param[i] -= lr * grad[i];
}

// Partial Σ x² of fixed blocks of kSquaresBlock elements, each block's threads in a fixed tree:
// the result depends on n alone.
constexpr int64_t kSquaresBlock = 1 << 14;
__global__ void squares_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  const int64_t begin = int64_t(blockIdx.x) * kSquaresBlock;
  const int64_t end = begin + kSquaresBlock < n ? begin + kSquaresBlock : n;
  double sum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += double(x[i]) * x[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}
__global__ void sum_partials_kernel(const double* partial, int64_t count, double* total) {
  __shared__ double shared[32];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *total = sum;
}

__global__ void gather_rows_kernel(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                                   int64_t d, float* y, int64_t ldy) {
  TFM_FOR_EACH_ELEMENT(r, c, count, d) {
    y[r * ldy + c] = x[rows[r] * ldx + c];
  }
}
__global__ void scatter_rows_kernel(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                                    int64_t d, float* y, int64_t ldy) {
  TFM_FOR_EACH_ELEMENT(r, c, count, d) {
    y[rows[r] * ldy + c] = x[r * ldx + c];
  }
}
__global__ void mean_of_row_groups_kernel(const float* x, int64_t groups, int64_t group_size,
                                          int64_t cols, float inverse, float* y) {
  TFM_FOR_EACH_ELEMENT(g, c, groups, cols) {
    const float* first = x + g * group_size * cols + c;
    float sum = first[0];
    for (int64_t k = 1; k < group_size; ++k) sum += first[k * cols];
    y[g * cols + c] = sum * inverse;
  }
}
template <bool kFloat16>
__global__ void scatter_rows_16_bit_kernel(const float* x, int64_t ldx, const int64_t* rows,
                                           int64_t count, int64_t d, uint16_t* y, int64_t ldy) {
  TFM_FOR_EACH_ELEMENT(r, c, count, d) {
    y[rows[r] * ldy + c] = to_16_bits<kFloat16>(x[r * ldx + c]);
  }
}

// Whether a 16-bit format is float16 (else bfloat16); std::invalid_argument for other formats.
bool is_float16(Precision format, const char* operation) {
  if (!is_16_bit_float(format))
    throw std::invalid_argument(std::string(operation) + ": the format is bfloat16 or float16");
  return format == Precision::kFloat16;
}

// One block per row: its largest magnitude, then the row quantised. Activations as
// int8_quantization.cpp: trunc(x/scale + 128.5) clamped to [1, 255], less 128; weights as
// int8_weights.cpp: nearest (ties to even) of x/scale clamped to [−127, 127].
__global__ void quantize_rows_kernel(const float* x, int64_t k, int64_t ldx, int8_t* q,
                                     float* scales, bool activation) {
  __shared__ float shared[32];
  const float* row = x + int64_t(blockIdx.x) * ldx;
  float largest = 0.f;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) largest = fmaxf(largest, fabsf(row[c]));
  largest = block_max(largest, shared);
  const float scale = largest > 0.f ? largest / 127.f : 1.f;
  const float inverse = 1.f / scale;
  int8_t* out = q + int64_t(blockIdx.x) * k;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    if (activation) {
      float v = row[c] * inverse + 128.5f;
      v = v < 255.f ? v : 255.f;
      v = v > 1.f ? v : 1.f;
      out[c] = int8_t(int32_t(v) - 128);
    } else {
      const float v = fmaxf(-127.f, fminf(127.f, row[c] * inverse));
      out[c] = int8_t(int32_t(rintf(v)));
    }
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
}

// An int8 product's element from its exact int32 sum, as the CPU's int8 products give it
// (backend/cpu/int8_quantization.cpp's dequantize_products, then the bias and the ReLU): rounded
// multiplications and addition, never contracted into one fused multiply-add.
__device__ __forceinline__ float dequantized(int32_t sum, float x_scale, float w_scale,
                                             const float* bias, int64_t c, bool relu) {
  float v = __fmul_rn(float(sum), __fmul_rn(x_scale, w_scale));
  if (bias) v = __fadd_rn(v, bias[c]);
  return relu && !(v > 0.f) ? 0.f : v;
}

// A 32 × 32 tile of y per block, 8 k-values at a time through shared memory; exact int32 sums.
constexpr int kTile = 32;
__global__ void int8_product_kernel(const int8_t* qx, const float* x_scales, const int8_t* qw,
                                    const float* w_scales, int64_t m, int64_t n, int64_t k,
                                    float* y, int64_t ldy, const float* bias, bool relu) {
  __shared__ int32_t xs[kTile][kTile + 1];
  __shared__ int32_t ws[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;  // 32 × 8 threads
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  int32_t acc[4] = {0, 0, 0, 0};  // rows ty, ty + 8, ty + 16, ty + 24; column tx
  for (int64_t p0 = 0; p0 < k; p0 += kTile) {
    for (int i = ty; i < kTile; i += 8) {
      const int64_t p = p0 + tx;
      xs[i][tx] = row0 + i < m && p < k ? qx[(row0 + i) * k + p] : 0;
      ws[i][tx] = col0 + i < n && p < k ? qw[(col0 + i) * k + p] : 0;
    }
    __syncthreads();
    for (int p = 0; p < kTile; ++p) {
      const int32_t w = ws[tx][p];
      for (int j = 0; j < 4; ++j) acc[j] += xs[ty + 8 * j][p] * w;
    }
    __syncthreads();
  }
  const int64_t c = col0 + tx;
  if (c >= n) return;
  for (int j = 0; j < 4; ++j) {
    const int64_t r = row0 + ty + 8 * j;
    if (r < m) y[r * ldy + c] = dequantized(acc[j], x_scales[r], w_scales[c], bias, c, relu);
  }
}

// dequantize_int8_sums: each element's int32 bits read and its float written back in place.
__global__ void dequantize_int8_sums_kernel(float* y, int64_t m, int64_t n, int64_t ldy,
                                            const float* x_scales, const float* w_scales,
                                            const float* bias, bool relu) {
  TFM_FOR_EACH_ELEMENT(r, c, m, n) {
    float* at = y + r * ldy + c;
    *at = dequantized(__float_as_int(*at), x_scales[r], w_scales[c], bias, c, relu);
  }
}

__global__ void read_rows_kernel(const float* w, const int32_t* ids, int64_t count, int64_t d,
                                 float* out) {
  TFM_FOR_EACH_ELEMENT(r, c, count, d) out[r * d + c] = w[int64_t(ids[r]) * d + c];
}

}  // namespace

void round_to_16_bits(cudaStream_t s, const float* x, int64_t rows, int64_t cols, int64_t ldx,
                      Precision format, uint16_t* out, int64_t ldo) {
  const bool float16 = is_float16(format, "round_to_16_bits");
  if (rows * cols == 0) return;
  const bool four =
      four_columns_at_a_time(cols, ldx) && ldo % 4 == 0 && aligned(x, 16) && aligned(out, 8);
  launch_by_width(four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    const dim3 grid = matrix_blocks(rows, cols / kWidth), threads = matrix_threads(cols / kWidth);
    if (float16)
      launch_kernel(round_kernel<kWidth, true>, grid, threads, 0, s, x, rows, cols, ldx, out, ldo);
    else
      launch_kernel(round_kernel<kWidth, false>, grid, threads, 0, s, x, rows, cols, ldx, out, ldo);
  });
  check_launch("round_to_16_bits");
}

void round_each_to_16_bits(cudaStream_t s, const std::vector<RoundingJob>& jobs, Precision format) {
  const bool float16 = is_float16(format, "round_each_to_16_bits");
  RoundingTable table{};
  const auto launch = [&] {
    if (table.jobs == 0) return;
    const auto blocks = unsigned(table.first_block[table.jobs]);
    if (float16)
      launch_kernel(round_each_kernel<true>, blocks, kThreads, 0, s, table);
    else
      launch_kernel(round_each_kernel<false>, blocks, kThreads, 0, s, table);
    check_launch("round_each_to_16_bits");
    table = RoundingTable{};
  };
  for (const RoundingJob& job : jobs) {
    if (job.count <= 0) continue;
    if (table.jobs == kRoundJobsPerLaunch) launch();
    const int j = table.jobs++;
    table.x[j] = job.x;
    table.out[j] = job.out;
    table.count[j] = job.count;
    table.words_of_four[j] = job.count % 4 == 0 && aligned(job.x, 16) && aligned(job.out, 8);
    table.first_block[j + 1] = table.first_block[j] + (job.count + kRoundChunk - 1) / kRoundChunk;
  }
  launch();
}

void round_to_bfloat16_flushing(cudaStream_t s, const float* result, int64_t ldr, const float* bias,
                                bool relu, int64_t rows, int64_t cols, uint16_t* out, int64_t ldo) {
  if (rows * cols == 0) return;
  const bool four = four_columns_at_a_time(cols, ldr) && ldo % 4 == 0 && aligned(result, 16) &&
                    aligned(bias, 16) && aligned(out, 8);
  launch_by_width(four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    launch_kernel(round_flushing_kernel<kWidth>, matrix_blocks(rows, cols / kWidth),
                  matrix_threads(cols / kWidth), 0, s, result, ldr, bias, relu, rows, cols, out,
                  ldo);
  });
  check_launch("round_to_bfloat16_flushing");
}

void add(cudaStream_t s, float* y, const float* x, int64_t n) {
  if (n == 0) return;
  launch_kernel(add_kernel, blocks_for(n), kThreads, 0, s, y, x, n);
  check_launch("add");
}
void add_bfloat16(cudaStream_t s, float* y, const uint16_t* x, int64_t n) {
  if (n == 0) return;
  launch_kernel(add_bfloat16_kernel, blocks_for(n), kThreads, 0, s, y, x, n);
  check_launch("add (bfloat16)");
}
void scale(cudaStream_t s, float* x, float factor, int64_t n) {
  if (n == 0) return;
  launch_kernel(scale_kernel, blocks_for(n), kThreads, 0, s, x, factor, n);
  check_launch("scale");
}
void fill(cudaStream_t s, float* y, int64_t n, float value) {
  if (n == 0) return;
  launch_kernel(fill_kernel, blocks_for(n), kThreads, 0, s, y, n, value);
  check_launch("fill");
}

void scale_matrix(cudaStream_t s, float* c, int64_t ldc, int64_t rows, int64_t cols, float beta) {
  if (rows * cols == 0 || beta == 1.f) return;
  launch_kernel(scale_matrix_kernel, matrix_blocks(rows, cols), matrix_threads(cols), 0, s, c, ldc,
                rows, cols, beta);
  check_launch("scale_matrix");
}

void bias_relu_epilogue(cudaStream_t s, float* y, int64_t ldy, const float* bias, bool relu,
                        int64_t rows, int64_t cols) {
  if (rows * cols == 0 || (!bias && !relu)) return;
  const bool four = four_columns_at_a_time(cols, ldy) && aligned(y, 16) && aligned(bias, 16);
  launch_by_width(four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    launch_kernel(bias_relu_kernel<kWidth>, matrix_blocks(rows, cols / kWidth),
                  matrix_threads(cols / kWidth), 0, s, y, ldy, bias, relu, rows, cols);
  });
  check_launch("bias_relu_epilogue");
}

void add_bias_activation(cudaStream_t s, float* pre, const float* bias, float* out, int64_t rows,
                         int64_t cols, bool apply_activation, Activation act) {
  if (rows * cols == 0) return;
  const bool four = four_columns_at_a_time(cols, cols) && aligned(pre, 16) && aligned(bias, 16) &&
                    aligned(out, 16);
  launch_by_width(four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    launch_kernel(bias_activation_kernel<kWidth>, matrix_blocks(rows, cols / kWidth),
                  matrix_threads(cols / kWidth), 0, s, pre, bias, out, rows, cols, apply_activation,
                  act);
  });
  check_launch("add_bias_activation");
}

void activation_backward(cudaStream_t s, float* d, const float* pre, int64_t n, Activation act) {
  if (n == 0) return;
  launch_kernel(activation_backward_kernel, blocks_for(n), kThreads, 0, s, d, pre, n, act);
  check_launch("activation_backward");
}

void relu_backward_bfloat16(const Context& c, const float* d, const uint16_t* relu_output,
                            int64_t rows, int64_t cols, uint16_t* rounded_d, float* column_sums) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (column_sums) {  // bias_backward's two passes, their terms this operation's own
    sum_columns(c, ReluBackwardTerms{d, relu_output, rounded_d, cols}, rows, cols,
                aligned(d, 16) && aligned(relu_output, 8) && aligned(rounded_d, 8), column_sums,
                "relu_backward_bfloat16");
    return;
  }
  // Four elements a thread where every pointer allows: a 16-byte and an 8-byte load in flight
  // per step where one element a thread has 6 bytes, which leaves the memory idle between loads.
  const bool four =
      n % 4 == 0 && aligned(d, 16) && aligned(relu_output, 8) && aligned(rounded_d, 8);
  launch_by_width(four, [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    launch_kernel(relu_backward_bfloat16_kernel<kWidth>, blocks_for(n / kWidth), kThreads, 0,
                  c.stream, d, relu_output, n, rounded_d);
  });
  check_launch("relu_backward_bfloat16");
}

void bias_backward(const Context& c, const float* dy, const uint16_t* rounded_dy, int64_t rows,
                   int64_t cols, int64_t ld, float* dbias) {
  if (cols == 0 || rows == 0) return;
  if (rounded_dy)
    sum_columns(c, RoundedValueTerms{rounded_dy, ld}, rows, cols,
                ld % 4 == 0 && aligned(rounded_dy, 8), dbias, "bias_backward");
  else
    sum_columns(c, ValueTerms{dy, ld}, rows, cols, ld % 4 == 0 && aligned(dy, 16), dbias,
                "bias_backward");
}

void dropout_mask(cudaStream_t s, uint8_t* mask, int64_t n, float p, uint64_t key) {
  if (n == 0) return;
  launch_kernel(dropout_mask_kernel, blocks_for(n), kThreads, 0, s, mask, n, dropout_threshold(p),
                key);
  check_launch("dropout_mask");
}

void apply_dropout(cudaStream_t s, float* x, const uint8_t* mask, int64_t n, float p,
                   uint64_t key) {
  if (n == 0) return;
  launch_kernel(apply_dropout_kernel, blocks_for(n), kThreads, 0, s, x, n,
                keep_decisions(mask, p, key));
  check_launch("apply_dropout");
}

void layer_norm(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y,
                int64_t rows, int64_t cols, float eps, float* mean, float* rstd) {
  if (rows == 0) return;
  const bool words_of_four =
      cols % 4 == 0 && aligned(x, 16) && aligned(gamma, 16) && aligned(beta, 16) && aligned(y, 16);
  const bool by_warp = launch_warp_rows(cols, words_of_four, [&](auto width, auto per_lane) {
    launch_kernel(layer_norm_warp_kernel<decltype(width)::value, decltype(per_lane)::value>,
                  warp_row_blocks(rows), kThreads, 0, s, nullptr, x, rows, cols, false, 0u, 1.f, 0,
                  nullptr, gamma, beta, eps, y, mean, rstd, nullptr);
  });
  if (!by_warp)
    launch_kernel(layer_norm_kernel, unsigned(rows), kThreads, 0, s, x, gamma, beta, y, cols, eps,
                  mean, rstd);
  check_launch("layer_norm");
}

void residual_layer_norm(cudaStream_t s, float* f, const float* x, int64_t rows, int64_t cols,
                         float p, uint64_t key, uint8_t* mask, const float* gamma,
                         const float* beta, float eps, float* y, float* mean, float* rstd,
                         uint16_t* rounded_y) {
  if (rows == 0) return;
  const bool dropping = p > 0.f;
  uint8_t* drawn_mask = dropping ? mask : nullptr;  // null: the decisions not kept
  const bool words_of_four = cols % 4 == 0 && aligned(f, 16) && aligned(x, 16) &&
                             aligned(drawn_mask, 4) && aligned(gamma, 16) && aligned(beta, 16) &&
                             aligned(y, 16) && aligned(rounded_y, 8);
  const bool by_warp = launch_warp_rows(cols, words_of_four, [&](auto width, auto per_lane) {
    launch_kernel(layer_norm_warp_kernel<decltype(width)::value, decltype(per_lane)::value>,
                  warp_row_blocks(rows), kThreads, 0, s, f, x, rows, cols, dropping,
                  dropout_threshold(p), 1.f / (1.f - p), key, drawn_mask, gamma, beta, eps, y, mean,
                  rstd, rounded_y);
  });
  if (!by_warp)
    launch_kernel(residual_layer_norm_kernel, unsigned(rows), kThreads, 0, s, f, x, cols, dropping,
                  dropout_threshold(p), 1.f / (1.f - p), key, drawn_mask, gamma, beta, eps, y, mean,
                  rstd, rounded_y);
  check_launch("residual_layer_norm");
}

namespace {

// layer_norm_backward's kernels, finishing the residual sublayer's backward where d_f or
// rounded_d_f is given (residual_layer_norm_backward), with d_f's column sums into
// d_f_column_sums where that is given.
void layer_norm_backward_launches(const Context& c, const float* dy, const float* x,
                                  const float* mean, const float* rstd, const float* gamma,
                                  float* dx, float* dgamma, float* dbeta, int64_t rows,
                                  int64_t cols, bool accumulate, const uint8_t* mask, float p,
                                  uint64_t key, float* d_f, uint16_t* rounded_d_f,
                                  float* d_f_column_sums) {
  if (rows == 0 || cols == 0) return;
  const cudaStream_t s = c.stream;
  const KeepDecisions drop = keep_decisions(mask, p, key);
  const bool words_of_four = cols % 4 == 0 && aligned(dy, 16) && aligned(x, 16) &&
                             aligned(gamma, 16) && aligned(dx, 16) && aligned(drop.mask, 4) &&
                             aligned(d_f, 16) && aligned(rounded_d_f, 8);
  // TFM_CUDA_ONE_PASS_NORM=0 takes the longer rows' path below for every row, to compare.
  static const bool one_pass = !turned_off("TFM_CUDA_ONE_PASS_NORM");
  if (one_pass && cols <= kWarpRowColumns) {
    const RowsPerChunk split = warp_row_chunks(c.device, rows);
    Scratch partial(c, 3 * split.chunks * cols * int64_t(sizeof(float)));   // [chunks, 3, cols]
    launch_warp_rows(cols, words_of_four, [&](auto width, auto per_lane) {  // cols fits
      launch_kernel(
          layer_norm_backward_chunk_kernel<decltype(width)::value, decltype(per_lane)::value>,
          unsigned(split.chunks), kThreads, 0, s, dy, x, mean, rstd, gamma, dx, split, cols,
          accumulate, drop, d_f, rounded_d_f, d_f_column_sums != nullptr, partial.as<float>());
    });
    check_launch("layer_norm_backward");
    // The chunks' sums: [chunks, 3, cols] read as [chunks, cols] rows 3 apart.
    const float* sums = partial.as<float>();
    for (float* total : {dgamma, dbeta, d_f_column_sums}) {
      if (total) launch_sum_chunks(s, sums, split.chunks, cols, total, 3 * cols);
      sums += cols;
    }
    check_launch("layer_norm_backward (chunks)");
    return;
  }
  // Rows longer than a warp holds: the column sums' pass, then a block per row for dx.
  const RowsPerChunk split = column_chunks(rows);
  Scratch partial(c, 2 * split.chunks * cols * int64_t(sizeof(float)));  // 2 × [chunks, cols]
  float* partial_gamma = partial.as<float>();
  float* partial_beta = partial_gamma + split.chunks * cols;
  if (four_columns_per_thread(cols) && aligned(dy, 16) && aligned(x, 16)) {
    const dim3 grid(unsigned((cols / 4 + 127) / 128), unsigned(split.chunks));
    launch_kernel(layer_norm_partial_kernel<4>, grid, 128, 0, s, dy, x, mean, rstd, split, cols,
                  partial_gamma, partial_beta);
  } else {
    const dim3 grid(unsigned((cols + 127) / 128), unsigned(split.chunks));
    launch_kernel(layer_norm_partial_kernel<1>, grid, 128, 0, s, dy, x, mean, rstd, split, cols,
                  partial_gamma, partial_beta);
  }
  check_launch("layer_norm_backward (parameters)");
  launch_sum_chunks(s, partial_gamma, split.chunks, cols, dgamma, cols);
  launch_sum_chunks(s, partial_beta, split.chunks, cols, dbeta, cols);
  check_launch("layer_norm_backward (chunks)");
  // d_f's column sums are a column sum of d_f itself, kept here where it is not asked for.
  const bool keeps = !d_f && (rounded_d_f || d_f_column_sums);
  Scratch kept_d_f(c, keeps ? rows * cols * int64_t(sizeof(float)) : 0);
  float* dropped = keeps ? kept_d_f.as<float>() : d_f;  // [rows, cols] or null
  launch_kernel(layer_norm_dx_kernel, unsigned(rows), kThreads, 0, s, dy, x, mean, rstd, gamma, dx,
                cols, accumulate, drop, dropped, rounded_d_f);
  check_launch("layer_norm_backward");
  if (d_f_column_sums) bias_backward(c, dropped, nullptr, rows, cols, cols, d_f_column_sums);
}

}  // namespace

void layer_norm_backward(const Context& c, const float* dy, const float* x, const float* mean,
                         const float* rstd, const float* gamma, float* dx, float* dgamma,
                         float* dbeta, int64_t rows, int64_t cols, bool accumulate) {
  layer_norm_backward_launches(c, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, cols,
                               accumulate, nullptr, 0.f, 0, nullptr, nullptr, nullptr);
}

void residual_layer_norm_backward(const Context& c, float* dy, const float* sum, const float* mean,
                                  const float* rstd, const float* gamma, float* dgamma,
                                  float* dbeta, const uint8_t* mask, float p, uint64_t key,
                                  float* d_f, uint16_t* rounded_d_f, float* d_f_column_sums,
                                  int64_t rows, int64_t cols) {
  layer_norm_backward_launches(c, dy, sum, mean, rstd, gamma, dy, dgamma, dbeta, rows, cols, false,
                               mask, p, key, d_f, rounded_d_f, d_f_column_sums);
}

void embedding_forward(cudaStream_t s, const float* table, int64_t table_ld, Int8Rows int8,
                       const float* positions, const int32_t* ids, int64_t rows, int64_t len,
                       int64_t d, float scale, int64_t first_position, float* out) {
  if (rows * d == 0) return;
  launch_kernel(embedding_forward_kernel, matrix_blocks(rows, d), matrix_threads(d), 0, s, table,
                table_ld, int8, positions, ids, rows, len, d, scale, first_position, out);
  check_launch("embedding_forward");
}

void scale_and_add_positions(cudaStream_t s, const float* positions, int64_t rows, int64_t len,
                             int64_t d, float scale, int64_t first_position, float* out) {
  if (rows * d == 0) return;
  launch_kernel(scale_and_add_positions_kernel, matrix_blocks(rows, d), matrix_threads(d), 0, s,
                positions, rows, len, d, scale, first_position, out);
  check_launch("scale_and_add_positions");
}

void embedding_forward_prepared(cudaStream_t s, const PreparedMatrix& table, const float* positions,
                                const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                float scale, int64_t first_position, float* out) {
  if (table.cols() != d) throw std::invalid_argument("embedding_forward_prepared: width");
  table.read_rows(ids, rows, out);
  scale_and_add_positions(s, positions, rows, len, d, scale, first_position, out);
}

void embedding_backward(cudaStream_t s, const float* d_out, const int32_t* ids, int64_t rows,
                        int64_t len, int64_t d, float scale, int64_t first_position, float* d_table,
                        float* d_positions) {
  if (rows * d == 0) return;
  launch_kernel(embedding_backward_kernel, matrix_blocks(rows, d), matrix_threads(d), 0, s, d_out,
                ids, rows, len, d, scale, first_position, d_table, d_positions);
  check_launch("embedding_backward");
}

void adam_update(cudaStream_t s, float* const* params, const int64_t* offsets, int64_t count,
                 int64_t total, const float* grad, float* m, float* v, const AdamHyperparameters& h,
                 int64_t step) {
  if (count == 0 || total == 0) return;
  const double bias_correction1 = 1.0 - std::pow(double(h.beta1), double(step));
  const double bias_correction2 = 1.0 - std::pow(double(h.beta2), double(step));
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
  const float step_size = float(double(h.lr) / bias_correction1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bias_correction2));
  launch_kernel(adam_kernel, blocks_for((total + 3) / 4), kThreads, 0, s, params, offsets, count,
                total, grad, m, v, b1, b2, eps, step_size, inv_sqrt_bc2,
                aligned(grad, 16) && aligned(m, 16) && aligned(v, 16));
  check_launch("adam_update");
}

void sgd_update(cudaStream_t s, float* param, const float* grad, int64_t n, float lr) {
  if (n == 0) return;
  launch_kernel(sgd_kernel, blocks_for(n), kThreads, 0, s, param, grad, n, lr);
  check_launch("sgd_update");
}

double sum_of_squares(const Context& c, const float* x, int64_t n) {
  if (n == 0) return 0;
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  Scratch partial(c, (blocks + 1) * int64_t(sizeof(double)));
  launch_kernel(squares_kernel, unsigned(blocks), kThreads, 0, c.stream, x, n,
                partial.as<double>());
  check_launch("sum_of_squares");
  launch_kernel(sum_partials_kernel, 1, 1024, 0, c.stream, partial.as<double>(), blocks,
                partial.as<double>() + blocks);
  check_launch("sum_of_squares (total)");
  const ProfiledWait wait;  // the host waits for the result from here on
  double total = 0;
  TFM_CUDA(cudaMemcpyAsync(&total, partial.as<double>() + blocks, sizeof(double),
                           cudaMemcpyDeviceToHost, c.stream));
  TFM_CUDA(cudaStreamSynchronize(c.stream));
  return total;
}

void gather_rows(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                 int64_t d, float* y, int64_t ldy) {
  if (count * d == 0) return;
  launch_kernel(gather_rows_kernel, matrix_blocks(count, d), matrix_threads(d), 0, s, x, ldx, rows,
                count, d, y, ldy);
  check_launch("gather_rows");
}
void scatter_rows(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                  int64_t d, float* y, int64_t ldy) {
  if (count * d == 0) return;
  launch_kernel(scatter_rows_kernel, matrix_blocks(count, d), matrix_threads(d), 0, s, x, ldx, rows,
                count, d, y, ldy);
  check_launch("scatter_rows");
}
void mean_of_row_groups(cudaStream_t s, const float* x, int64_t groups, int64_t group_size,
                        int64_t cols, float* y) {
  if (groups * cols == 0) return;
  launch_kernel(mean_of_row_groups_kernel, matrix_blocks(groups, cols), matrix_threads(cols), 0, s,
                x, groups, group_size, cols, 1.f / float(group_size), y);
  check_launch("mean_of_row_groups");
}
void scatter_rows_to_16_bits(cudaStream_t s, const float* x, int64_t ldx, const int64_t* rows,
                             int64_t count, int64_t d, Precision format, uint16_t* y, int64_t ldy) {
  const bool float16 = is_float16(format, "scatter_rows_to_16_bits");
  if (count * d == 0) return;
  launch_kernel((float16 ? scatter_rows_16_bit_kernel<true> : scatter_rows_16_bit_kernel<false>),
                matrix_blocks(count, d), matrix_threads(d), 0, s, x, ldx, rows, count, d, y, ldy);
  check_launch("scatter_rows_to_16_bits");
}

void quantize_activation_rows(cudaStream_t s, const float* x, int64_t m, int64_t k, int64_t ldx,
                              int8_t* q, float* scales) {
  if (m == 0) return;
  launch_kernel(quantize_rows_kernel, unsigned(m), kThreads, 0, s, x, k, ldx, q, scales, true);
  check_launch("quantize_activation_rows");
}
void quantize_weight_rows(cudaStream_t s, const float* w, int64_t n, int64_t k, int8_t* values,
                          float* scales) {
  if (n == 0) return;
  launch_kernel(quantize_rows_kernel, unsigned(n), kThreads, 0, s, w, k, k, values, scales, false);
  check_launch("quantize_weight_rows");
}

void int8_product(cudaStream_t s, const int8_t* qx, const float* x_scales, const int8_t* qw,
                  const float* w_scales, int64_t m, int64_t n, int64_t k, float* y, int64_t ldy,
                  const float* bias, bool relu) {
  if (m * n == 0) return;
  // Rows in launches of at most 65,535 row tiles (the grid's y limit).
  constexpr int64_t kRowsPerLaunch = int64_t(65535) * kTile;
  for (int64_t first = 0; first < m; first += kRowsPerLaunch) {
    const int64_t rows = m - first < kRowsPerLaunch ? m - first : kRowsPerLaunch;
    const dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
    launch_kernel(int8_product_kernel, grid, kTile * 8, 0, s, qx + first * k, x_scales + first, qw,
                  w_scales, rows, n, k, y + first * ldy, ldy, bias, relu);
    check_launch("int8_product");
  }
}

void dequantize_int8_sums(cudaStream_t s, float* y, int64_t m, int64_t n, int64_t ldy,
                          const float* x_scales, const float* w_scales, const float* bias,
                          bool relu) {
  if (m * n == 0) return;
  launch_kernel(dequantize_int8_sums_kernel, matrix_blocks(m, n), matrix_threads(n), 0, s, y, m, n,
                ldy, x_scales, w_scales, bias, relu);
  check_launch("dequantize_int8_sums");
}

void read_rows(cudaStream_t s, const float* w, const int32_t* ids, int64_t count, int64_t d,
               float* out) {
  if (count * d == 0) return;
  launch_kernel(read_rows_kernel, matrix_blocks(count, d), matrix_threads(d), 0, s, w, ids, count,
                d, out);
  check_launch("read_rows");
}

}  // namespace cuda
}  // namespace tfm
