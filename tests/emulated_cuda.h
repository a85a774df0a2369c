// What a source file of the CUDA backend (src/backend/cuda/*.cu) needs to compile for the CPU,
// included before it: the emulation of the kernels' built-ins and launches (warp_emulation.h),
// the few CUDA runtime calls those files make, answered on host memory for an emulated device of
// kEmulatedProcessors multiprocessors, and the backend's namespace renamed tfm::emulated_cuda, so
// that a test binary holding the real backend (libtransformer) holds these copies beside it.
// tests/emulated_cuda_*.cpp compile the kernels' files so (a translation unit each, as in the
// backend's own build); tests/emulated_cuda_backend.cpp puts them behind the Backend interface
// and emulates the rest they call, tests/emulated_cuda_blas.cpp cuBLAS and cuBLASLt.
#pragma once

#define TFM_EMULATED_WARPS
#include "warp_emulation.h"

// Everything the backend's files include, before `cuda` names another namespace.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/operation_types.h"
#include "tensor/error.h"
#include "tensor/int8_weights.h"

namespace warp_emulation {

// The emulated device: enough multiprocessors that the launches which size their grids by them
// (the layer norm's backward: three chunks each) take several blocks.
constexpr int kEmulatedProcessors = 4;

// The shared memory a block may ask for: an H100's or H200's.
constexpr int kEmulatedSharedBytesPerBlock = 227 * 1024;

inline cudaError_t device_attribute(int* value, cudaDeviceAttr attribute, int) {
  *value = attribute == cudaDevAttrMultiProcessorCount            ? kEmulatedProcessors
           : attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin ? kEmulatedSharedBytesPerBlock
                                                                  : 0;
  return cudaSuccess;
}
// Device memory is the host's: copies are copies, and the stream is done at once.
inline cudaError_t copy_async(void* to, const void* from, size_t bytes, cudaMemcpyKind,
                              cudaStream_t = nullptr) {
  if (bytes > 0) std::memcpy(to, from, bytes);
  return cudaSuccess;
}
inline cudaError_t set_async(void* to, int value, size_t bytes, cudaStream_t = nullptr) {
  if (bytes > 0) std::memset(to, value, bytes);
  return cudaSuccess;
}
inline cudaError_t synchronize_stream(cudaStream_t) {
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t set_function_attribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > kEmulatedSharedBytesPerBlock) return cudaErrorInvalidValue;
    allowed_shared_bytes[reinterpret_cast<const void*>(kernel)] = size_t(value);
  }
  return cudaSuccess;
}

// Device memory the backend keeps for a context's life (cuBLASLt's workspace), from the host.
inline cudaError_t device_malloc(void** memory, size_t bytes) {
  *memory = std::malloc(bytes > 0 ? bytes : 1);
  return *memory ? cudaSuccess : cudaErrorMemoryAllocation;
}

// The emulated device's clock, in milliseconds: the emulated cuBLASLt products advance it by a
// cost of their shape and algorithm (tests/emulated_cuda_blas.cpp), so that timing them with
// events (lt_product.cu's tuning) picks among algorithms as a GPU's clock would, the same way in
// every run. An event holds the clock's reading when recorded.
inline double emulated_clock_ms = 0;
struct EmulatedEvent {
  double recorded_ms = 0;
};
inline cudaError_t event_create(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new EmulatedEvent);
  return cudaSuccess;
}
inline cudaError_t event_destroy(cudaEvent_t event) {
  delete reinterpret_cast<EmulatedEvent*>(event);
  return cudaSuccess;
}
inline cudaError_t event_record(cudaEvent_t event, cudaStream_t = nullptr) {
  reinterpret_cast<EmulatedEvent*>(event)->recorded_ms = emulated_clock_ms;
  return cudaSuccess;
}
inline cudaError_t event_synchronize(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t event_elapsed_time(float* milliseconds, cudaEvent_t start, cudaEvent_t stop) {
  *milliseconds = float(reinterpret_cast<EmulatedEvent*>(stop)->recorded_ms -
                        reinterpret_cast<EmulatedEvent*>(start)->recorded_ms);
  return cudaSuccess;
}

}  // namespace warp_emulation

#define cudaMalloc warp_emulation::device_malloc
#define cudaEventCreate warp_emulation::event_create
#define cudaEventDestroy warp_emulation::event_destroy
#define cudaEventRecord warp_emulation::event_record
#define cudaEventSynchronize warp_emulation::event_synchronize
#define cudaEventElapsedTime warp_emulation::event_elapsed_time
#define cudaDeviceGetAttribute warp_emulation::device_attribute
#define cudaMemcpyAsync warp_emulation::copy_async
#define cudaMemsetAsync warp_emulation::set_async
#define cudaStreamSynchronize warp_emulation::synchronize_stream
#define cudaFuncSetAttribute warp_emulation::set_function_attribute

#define cuda emulated_cuda
