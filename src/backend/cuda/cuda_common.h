// What every file of the CUDA backend shares: error checks that turn a failed CUDA or cuBLAS call
// into a tfm::Error naming the call, the device context one backend instance works in (its
// device ordinal, one stream, one cuBLAS handle), stream-ordered scratch memory, and the launch
// shape of the element-wise kernels. Compiled by nvcc only (src/backend/cuda/*.cu).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tfm {
namespace cuda {

// Throws Error("CUDA: <call>: <reason>") when `status` is not cudaSuccess.
void check(cudaError_t status, const char* call);
void check(cublasStatus_t status, const char* call);
// After a kernel launch: the launch's own error (bad configuration), as check() reports it.
void check_launch(const char* kernel);
// Whether the environment sets `variable` to "0": how TFM_CUDA_GRAPHS, TFM_CUDA_LT,
// TFM_CUDA_TENSOR_CORE_ATTENTION, TFM_CUDA_ATTENTION_IN_REGISTERS, TFM_CUDA_ONE_PASS_NORM,
// TFM_CUDA_INT8_TENSOR_CORES, TFM_CUDA_DRAWN_DROPOUT and the others docs/gpu.md lists turn a path
// off (each caller reads it once).
inline bool turned_off(const char* variable) {
  const char* setting = std::getenv(variable);
  return setting && std::strcmp(setting, "0") == 0;
}

#define TFM_CUDA(call) ::tfm::cuda::check((call), #call)

// One GPU as one backend sees it. Every operation makes the device current (activate()),
// enqueues on `stream` and returns; only copies to the host and results the host needs (loss
// totals, Σ x²) wait for the stream. The stream, the cuBLAS handle and the memory pool's setting
// are made by the first activate(), so that a process which only lists the devices (--help, a
// CPU run) creates nothing on the GPU. cuBLAS calls are serialised by `blas_mutex`.
struct Context {
  int device = 0;
  mutable cudaStream_t stream = nullptr;
  mutable cublasHandle_t blas = nullptr;
  mutable std::mutex blas_mutex;
  // cuBLASLt's handle and the workspace its products may use (lt_product.h), made by the first
  // such product, under blas_mutex like every cuBLAS call.
  mutable cublasLtHandle_t blas_lt = nullptr;
  mutable void* lt_workspace = nullptr;
  // What StagedOperand lends: kept between products, grown to the largest asked for.
  mutable std::mutex staging_mutex;
  mutable void* staging = nullptr;
  mutable int64_t staging_bytes = 0;
  mutable std::once_flag created;
  // Recording (operation_recording.h): the thread capturing `stream` into a CUDA graph, or no
  // thread; it holds recording_mutex meanwhile, which other threads' operations wait for when
  // they begin. A backend whose steps are recorded is used by one thread at a time (the
  // decoder's callers: a search, serve's one decoding thread): an operation another thread
  // began before a capture would be captured with it.
  mutable std::mutex recording_mutex;
  mutable std::atomic<std::thread::id> recording_thread{};
  // Allocations and frees of memory that outlives an operation (Backend::allocate, the staging
  // memory): a graph that names such memory is replayed only while this count is unchanged.
  mutable std::atomic<uint64_t> memory_changes{0};
  // Frees asked for by the recording thread while it records: done when the capture ends, which
  // then keeps nothing (the graph could not run without that memory).
  mutable std::vector<void*> frees_after_recording;
  // The ReLU masks cuBLASLt's forward products wrote (MatmulEpilogue::relu_mask, by address),
  // with the [m, n] of their outputs: matmul.cu's record, which the backward products consult.
  mutable std::mutex relu_masks_mutex;
  mutable std::map<const void*, std::pair<int64_t, int64_t>> relu_masks;
  // Makes this context's device current on the calling thread (creating the stream and handle
  // the first time); waits while another thread records.
  void activate() const;
  // Counts an allocation or free (memory_changes); throws RecordingRefused where the calling
  // thread is recording: memory a graph allocates is the graph's, not the caller's to keep.
  void change_memory() const;
  // Whether the calling thread is capturing this context's stream.
  bool recording_here() const;
  // Returns once no other thread is capturing this context's stream (never throws).
  void wait_for_other_recording() const;
};

// Thrown by an allocation attempted while recording: the recording is dropped and its
// operations run without it.
struct RecordingRefused : std::runtime_error {
  RecordingRefused() : std::runtime_error("an allocation while recording a CUDA graph") {}
};

// n bytes of device memory ordered on `stream` (cudaMallocAsync from the device's pool, which
// keeps freed memory for reuse), freed on the same stream when the object goes: the scratch an
// operation needs for the duration of its own launches.
class Scratch {
 public:
  Scratch(const Context& context, int64_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(memory_);
  }

 private:
  const Context& context_;
  void* memory_ = nullptr;
};

// The operand of a prepared product converted for it (rounded to 16 bits, quantised to int8), in
// the context's staging memory, held (staging_mutex) from the conversion's launch to the
// product's: a decoding step makes some 37 such products, and a Scratch for each was two more
// calls into the driver. Stream order makes the next product's conversion wait for this one.
class StagedOperand {
 public:
  StagedOperand(const Context& context, int64_t bytes);
  template <typename T>
  T* as() const {
    return static_cast<T*>(memory_);
  }

 private:
  std::unique_lock<std::mutex> lock_;
  void* memory_ = nullptr;
};

// Runs `kernel` over `grid` blocks of `block` threads with `shared_bytes` of dynamic shared
// memory on stream `s`, its parameters from `arguments` as a launch converts them: every kernel
// of the backend is launched here, so that tests/warp_emulation.h, which defines its own
// launch_kernel (and TFM_EMULATED_WARPS), runs the same kernels and launch shapes on the CPU.
#ifndef TFM_EMULATED_WARPS
template <typename... Parameters, typename... Arguments>
void launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t s, const Arguments&... arguments) {
  kernel<<<grid, block, shared_bytes, s>>>(arguments...);
}
#endif

// A kernel's dynamic shared memory (launch_kernel's shared_bytes) as an array `name` of `Type`,
// 16-byte aligned, or `bytes`-aligned (WMMA's pointers: 32).
#ifndef TFM_EMULATED_WARPS
#define TFM_DYNAMIC_SHARED(Type, name) extern __shared__ __align__(16) Type name[]
#define TFM_DYNAMIC_SHARED_ALIGNED(Type, name, bytes) \
  extern __shared__ __align__(bytes)                  \
  Type name[]
#endif

// Element-wise launches: 256 threads, enough blocks for n elements up to a grid that fills the
// device several times over (kernels loop with a grid stride beyond that).
constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

}  // namespace cuda
}  // namespace tfm

namespace tfm {
namespace cuda {

// float → bfloat16 bits, nearest with ties to even, NaN kept quiet: tensor/float16.h's
// float_to_bfloat16, bit for bit.
__device__ __forceinline__ uint16_t to_bfloat16(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
// Two floats → bfloat16 bits packed in a word, `low` in the low half (the first in memory): one
// cvt.rn.bf16x2 on sm_80 and later, where to_bfloat16 takes five instructions a value; the same
// bits as to_bfloat16's but for a NaN's (the instruction's canonical 0x7FFF).
__device__ __forceinline__ uint32_t to_bfloat16_pair(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
#else  // the emulation (tests/warp_emulation.h): the instruction's result, its NaN included
  const auto rounded = [](float f) -> uint32_t { return f != f ? 0x7fffu : to_bfloat16(f); };
  return rounded(low) | rounded(high) << 16;
#endif
}
__device__ __forceinline__ float from_bfloat16(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
// float → IEEE float16 bits, nearest with ties to even (past 65504: ±Inf), as tensor/float16.h's
// float_to_half; and back, exactly.
__device__ __forceinline__ uint16_t to_float16(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ float from_float16(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
// One of the two to a format given at compile time (true: float16, false: bfloat16).
template <bool kFloat16>
__device__ __forceinline__ uint16_t to_16_bits(float f) {
  return kFloat16 ? to_float16(f) : to_bfloat16(f);
}

// Four 16-bit values as they lie in memory, the first in the low half: one 8-byte store.
__device__ __forceinline__ uint2 pack_16_bits(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
  return make_uint2(uint32_t(a) | uint32_t(b) << 16, uint32_t(c) | uint32_t(d) << 16);
}

// Whether pointer p is aligned to `bytes` (a power of two; a null pointer counts as aligned):
// the condition of the kernels' 8- and 16-byte loads and stores.
__host__ __device__ __forceinline__ bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The grid-stride loop of the element-wise kernels.
#define TFM_FOR_EACH(i, n)                                                  \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Element (r, c) of a [rows, cols] matrix per iteration: columns along the block's and the
// grid's x, rows along their y, both grid-strided, so that no thread divides a flat index by
// cols (a 64-bit division costs several times the load it addresses). Launch with
// launch_kernel's grid matrix_blocks(rows, cols) and block matrix_threads(cols).
#define TFM_FOR_EACH_ELEMENT(r, c, rows, cols)                                   \
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < (rows);   \
       r += int64_t(gridDim.y) * blockDim.y)                                     \
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < (cols); \
         c += int64_t(gridDim.x) * blockDim.x)
// kThreads per block: a power-of-two run of columns from a warp up to kThreads, the rest as
// rows, so that narrow matrices (a decoding step's source positions) fill their blocks too.
inline dim3 matrix_threads(int64_t cols) {
  int64_t x = 32;
  while (x < cols && x < kThreads) x *= 2;
  return dim3(unsigned(x), unsigned(kThreads / x));
}
inline dim3 matrix_blocks(int64_t rows, int64_t cols) {
  const dim3 threads = matrix_threads(cols);
  const int64_t x = (cols + threads.x - 1) / threads.x, y = (rows + threads.y - 1) / threads.y;
  return dim3(unsigned(x < 1 ? 1 : (x > 1024 ? 1024 : x)),
              unsigned(y < 1 ? 1 : (y > 65535 ? 65535 : y)));
}

// Σ and maximum over the 32 lanes of a warp (every lane calling), every lane getting the result.
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Σ over a block of `value` (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds 32 entries; the block must not use it between calls without a barrier.
template <typename T>
__device__ __forceinline__ T block_sum(T value, T* shared) {
  value = warp_sum(value);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : T(0));
}
template <typename T>
__device__ __forceinline__ T block_max(T value, T* shared) {
  value = warp_max(value);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  return warp_max(lane < warps ? shared[lane] : T(-INFINITY));
}

}  // namespace cuda
}  // namespace tfm
