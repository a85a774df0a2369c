// A host emulation of what src/backend/cuda/warp_matrix.h gives a kernel (ldmatrix, mma.sync's
// m16n8k16 bfloat16 product, the block's dynamic shared memory) and of the CUDA built-ins those
// kernels use (threadIdx, blockIdx, __syncthreads, __shfl_xor_sync), so that a kernel written
// for them runs on the CPU: each thread of a block is a fiber (ucontext) that one OS thread runs
// in turn, and a warp's collective instructions exchange their lanes' operands through slots
// between two barriers of its 32 threads. The operand layouts are the PTX ISA's (mma.m16n8k16
// with .bf16 operands; ldmatrix .m8n8.x4, plain and .trans), written here from its tables, not
// from the kernels. Slow (two switches of fiber a lane and collective): small blocks, in tests.
#pragma once

#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "tensor/float16.h"

namespace warp_emulation {

// One block's threads (fibers), its barriers, the slots its warps exchange through and its
// shared memory.
struct Block {
  Block(int threads, size_t shared_bytes)
      : threads(threads),
        shared_bytes(shared_bytes),
        slots(3, std::vector<uint64_t>(size_t(threads))),
        shared(shared_bytes + 16, 0xAB),
        fibers(size_t(threads)),
        stacks(size_t(threads)),
        finished(size_t(threads), false),
        waiting_group(size_t(threads), -1),
        waiting_generation(size_t(threads), 0),
        arrived(size_t(1 + threads / 32), 0),
        generation(size_t(1 + threads / 32), 0) {
    // 16-byte aligned, as the kernels' dynamic shared memory is.
    base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(shared.data()) + 15) &
                                            ~uintptr_t(15));
  }
  int threads;
  size_t shared_bytes;                       // what the launch gave, from base on
  std::vector<std::vector<uint64_t>> slots;  // [3][threads]: what each lane hands its warp
  std::vector<unsigned char> shared;
  unsigned char* base = nullptr;
  ucontext_t scheduler;
  std::vector<ucontext_t> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<bool> finished;
  // Per thread: the barrier group it waits at (-1: none) and that group's generation then.
  std::vector<int> waiting_group;
  std::vector<uint64_t> waiting_generation;
  std::vector<int> arrived;  // per barrier group: 0 the block, 1 + w warp w
  std::vector<uint64_t> generation;
  // Whether thread t can go on: not finished, and not held at a barrier.
  bool runnable(int t) const {
    const int group = waiting_group[size_t(t)];
    return !finished[size_t(t)] &&
           (group < 0 || generation[size_t(group)] != waiting_generation[size_t(t)]);
  }
};

inline Block* current = nullptr;
inline int thread_index = 0;
inline const std::function<void()>* current_kernel = nullptr;

// Returns once all `count` threads of `group` have called it, the other fibers running meanwhile.
inline void wait(int group, int count) {
  Block& block = *current;
  const uint64_t generation = block.generation[size_t(group)];
  if (++block.arrived[size_t(group)] == count) {
    block.arrived[size_t(group)] = 0;
    ++block.generation[size_t(group)];
    return;
  }
  const int self = thread_index;
  block.waiting_group[size_t(self)] = group;
  block.waiting_generation[size_t(self)] = generation;
  while (block.generation[size_t(group)] == generation)
    swapcontext(&block.fibers[size_t(self)], &block.scheduler);
  block.waiting_group[size_t(self)] = -1;
}
inline void warp_wait() {
  wait(1 + thread_index / 32, 32);
}
// Slot k of lane `lane` of the calling thread's warp.
inline uint64_t& slot(int k, int lane) {
  return current->slots[size_t(k)][size_t((thread_index & ~31) + lane)];
}
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Runs kernel() as `blocks` blocks of `threads` threads with `shared_bytes` of shared memory.
void launch(int blocks, int threads, size_t shared_bytes, const std::function<void()>& kernel);
void run_block(int b, int threads, size_t shared_bytes);

}  // namespace warp_emulation

// The CUDA built-ins, as the kernels name them.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline void __syncthreads() {
  warp_emulation::wait(0, warp_emulation::current->threads);
}
inline uint32_t __float_as_uint(float f) {
  return warp_emulation::float_bits(f);
}
inline float __uint_as_float(uint32_t u) {
  return warp_emulation::bits_float(u);
}
inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  using namespace warp_emulation;
  const int lane = thread_index % 32;
  slot(0, lane) = float_bits(value);
  warp_wait();
  const float other = bits_float(uint32_t(slot(0, lane ^ lane_mask)));
  warp_wait();
  return other;
}

// Block b of a launch, its fibers run in turn until every one has returned.
inline void warp_emulation::run_block(int b, int threads, size_t shared_bytes) {
  constexpr size_t kStackBytes = 256 << 10;
  Block block(threads, shared_bytes);
  current = &block;
  for (int t = 0; t < threads; ++t) {
    ucontext_t& fiber = block.fibers[size_t(t)];
    block.stacks[size_t(t)].resize(kStackBytes);
    getcontext(&fiber);
    fiber.uc_stack.ss_sp = block.stacks[size_t(t)].data();
    fiber.uc_stack.ss_size = kStackBytes;
    fiber.uc_link = &block.scheduler;  // where a fiber goes when its kernel returns
    makecontext(
        &fiber,
        +[] {
          (*current_kernel)();
          current->finished[size_t(thread_index)] = true;
        },
        0);
  }
  // Each warp in turn runs as far as it can (to a __syncthreads the others have not reached, or
  // its end) before the next starts: warps far apart, as a GPU may run them, so that a barrier
  // missing between one warp's reads and another's next stores of shared memory shows. Even
  // blocks take the warps in order, odd ones in reverse (a missing barrier between stores and
  // another warp's reads shows in one of the two). A round in which no thread can go on is a
  // barrier some threads never reach: abort, as a GPU would hang.
  const int warps = threads / 32;
  const auto run = [&](int t) {
    threadIdx = make_uint3(unsigned(t), 0, 0);
    blockIdx = make_uint3(unsigned(b), 0, 0);
    blockDim = dim3(unsigned(threads));
    thread_index = t;
    swapcontext(&block.scheduler, &block.fibers[size_t(t)]);
  };
  for (int unfinished = threads; unfinished > 0;) {
    bool any_ran = false;
    for (int turn = 0; turn < warps; ++turn) {
      const int warp = b % 2 == 0 ? turn : warps - 1 - turn;
      for (bool ran = true; ran;) {
        ran = false;
        for (int t = 32 * warp; t < 32 * warp + 32; ++t)
          if (block.runnable(t)) {
            run(t);
            ran = any_ran = true;
          }
      }
    }
    if (!any_ran) std::abort();
    unfinished = 0;
    for (int t = 0; t < threads; ++t) unfinished += block.finished[size_t(t)] ? 0 : 1;
  }
  current = nullptr;
}

inline void warp_emulation::launch(int blocks, int threads, size_t shared_bytes,
                                   const std::function<void()>& kernel) {
  current_kernel = &kernel;
  for (int b = 0; b < blocks; ++b) run_block(b, threads, shared_bytes);
  current_kernel = nullptr;  // the kernel lives no longer than the call
}

// warp_matrix.h's interface.
namespace tfm {
namespace cuda {

#define TFM_DYNAMIC_SHARED_BYTES(name) unsigned char* name = warp_emulation::current->base

// ldmatrix .m8n8.x4 (.trans): lane l addresses row l % 8 of matrix l / 8; lane l receives, of
// matrix i, row l / 4's elements 2 (l % 4) and 2 (l % 4) + 1 (transposed: column l / 4's), the
// first in the low half. A row address off a 16-byte boundary, or past the block's shared
// memory, aborts, as it faults on a GPU.
inline void emulated_load_matrices(uint32_t (&r)[4], const uint16_t* row, bool transposed) {
  using namespace warp_emulation;
  const int lane = thread_index % 32;
  const auto* bytes = reinterpret_cast<const unsigned char*>(row);
  if (bytes < current->base || (bytes - current->base) % 16 != 0 ||
      size_t(bytes - current->base) + 16 > current->shared_bytes)
    std::abort();
  slot(0, lane) = uint64_t(bytes - current->base);
  warp_wait();
  for (int i = 0; i < 4; ++i) {
    const auto element = [&](int row_of_matrix, int column) {
      uint16_t value;
      std::memcpy(&value, current->base + slot(0, 8 * i + row_of_matrix) + 2 * column, 2);
      return uint32_t(value);
    };
    const int g = lane / 4, q = lane % 4;
    r[i] = transposed ? element(2 * q, g) | element(2 * q + 1, g) << 16
                      : element(g, 2 * q) | element(g, 2 * q + 1) << 16;
  }
  warp_wait();
}
inline void load_matrices(uint32_t (&r)[4], const uint16_t* row) {
  emulated_load_matrices(r, row, false);
}
inline void load_matrices_transposed(uint32_t (&r)[4], const uint16_t* row) {
  emulated_load_matrices(r, row, true);
}

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, d += a·b, with the PTX ISA's fragments (g = lane
// / 4, q = lane % 4): A's registers {a0,a1} row g, {a2,a3} row g + 8, {a4,a5} row g columns + 8,
// {a6,a7} row g + 8 columns + 8, columns 2q + (i & 1); B's {b0,b1} rows 2q + (i & 1) of column g,
// {b2,b3} those rows + 8; D's d0, d1 row g, d2, d3 row g + 8, columns 2q and 2q + 1. Summed in
// double, rounded once (the GPU's order of summation is its own).
inline void multiply_add(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace warp_emulation;
  const int lane = thread_index % 32;
  slot(0, lane) = uint64_t(a[0]) | uint64_t(a[1]) << 32;
  slot(1, lane) = uint64_t(a[2]) | uint64_t(a[3]) << 32;
  slot(2, lane) = uint64_t(b0) | uint64_t(b1) << 32;
  warp_wait();
  float left[16][16], right[16][8];
  // The h-th bfloat16 value of a slot (four a slot, the first in the low bits).
  const auto half = [](uint64_t word, int h) {
    return tfm::bfloat16_to_float(uint16_t(word >> (16 * h)));
  };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    for (int e = 0; e < 2; ++e) {
      left[g][2 * q + e] = half(slot(0, l), e);
      left[g + 8][2 * q + e] = half(slot(0, l), 2 + e);
      left[g][2 * q + 8 + e] = half(slot(1, l), e);
      left[g + 8][2 * q + 8 + e] = half(slot(1, l), 2 + e);
      right[2 * q + e][g] = half(slot(2, l), e);
      right[2 * q + 8 + e][g] = half(slot(2, l), 2 + e);
    }
  }
  warp_wait();
  const int g = lane / 4, q = lane % 4;
  const auto dot = [&](int i, int j) {
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += double(left[i][k]) * right[k][j];
    return float(sum);
  };
  d[0] += dot(g, 2 * q);
  d[1] += dot(g, 2 * q + 1);
  d[2] += dot(g + 8, 2 * q);
  d[3] += dot(g + 8, 2 * q + 1);
}

}  // namespace cuda
}  // namespace tfm
