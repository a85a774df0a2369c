// A host emulation of what the CUDA backend's kernels are written for, so that they run on the
// CPU: the launch (launch_kernel, cuda_common.h's one way to start a kernel), the built-ins they
// name (threadIdx, blockIdx, blockDim, gridDim, __syncthreads, the warp's shuffles, votes and
// __syncwarp, atomicAdd, the bit casts), shared memory (static __shared__ arrays, and the dynamic
// bytes of TFM_DYNAMIC_SHARED), and what warp_matrix.h gives attention_in_registers.cu (ldmatrix,
// mma.sync's m16n8k16 bfloat16 product). Each thread of a block is a fiber (its own stack) that one
// OS thread runs in turn; a warp's collective instructions exchange their lanes' operands through
// slots between two barriers of its threads. The operand layouts are the PTX ISA's (mma.m16n8k16
// with .bf16 operands; ldmatrix .m8n8.x4, plain and .trans), written here from its tables, not
// from the kernels. Slow (two switches of fiber a lane and collective): small launches, in tests.
//
// Include it first, with TFM_EMULATED_WARPS defined (cuda_common.h then leaves launch_kernel and
// TFM_DYNAMIC_SHARED to it), and then the kernels' source files.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/float16.h"

// The bounds of the static __shared__ arrays' section (the linker's, where any kernel has one).
extern "C" __attribute__((weak)) char __start_tfm_emulated_shared[];
extern "C" __attribute__((weak)) char __stop_tfm_emulated_shared[];

namespace warp_emulation {

// A fiber's saved state is its stack pointer: switch_fiber(&from, to) saves the calling fiber's
// callee-saved registers and floating-point control words on its stack, stores its stack pointer
// in `from` and resumes the fiber whose stack pointer is `to`. Written for x86-64 (System V)
// because swapcontext asks the kernel for the signal mask at every switch, which made the
// emulation spend half its time in system calls. Weak: every test binary including this header
// may define it.
extern "C" void tfm_emulation_switch_fiber(void** from, void* to);
asm(R"(
  .pushsection .text
  .weak tfm_emulation_switch_fiber
  .type tfm_emulation_switch_fiber, @function
tfm_emulation_switch_fiber:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tfm_emulation_switch_fiber, .-tfm_emulation_switch_fiber
  .popsection
)");
static_assert(sizeof(void*) == 8, "the fiber switch is x86-64's");

// The stack pointer of a fiber that starts in `entry` (which must never return) on the stack
// [stack, stack + bytes): the frame tfm_emulation_switch_fiber pops, its return address entry's.
inline void* start_fiber(char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* words = reinterpret_cast<uint64_t*>(top);
  *--words = 0;                                  // entry's own return address: none
  *--words = reinterpret_cast<uint64_t>(entry);  // where the switch's ret goes
  for (int i = 0; i < 6; ++i) *--words = 0;      // rbp, rbx, r12-r15
  *--words = uint64_t(0x037F) << 32 | 0x1F80;    // x87 control word, MXCSR: the defaults
  return words;
}

// One block's threads (fibers), its barriers, the slots its warps exchange through and its
// dynamic shared memory. Threads are numbered as CUDA numbers them (x fastest), warps as runs of
// 32 of those numbers; the last warp may have fewer lanes.
struct Block {
  Block(int threads, size_t shared_bytes)
      : threads(threads),
        warps((threads + 31) / 32),
        shared_bytes(shared_bytes),
        slots(3, std::vector<uint64_t>(size_t(32 * warps))),
        shared(shared_bytes + 128, 0xAB),
        fibers(size_t(threads)),
        finished(size_t(threads), false),
        waiting_group(size_t(threads), -1),
        waiting_generation(size_t(threads), 0),
        arrived(size_t(1 + warps), 0),
        generation(size_t(1 + warps), 0) {
    // 128-byte aligned: at least what any kernel declares its dynamic shared memory (16, or 32
    // for WMMA's pointers).
    base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(shared.data()) + 127) &
                                            ~uintptr_t(127));
  }
  int threads, warps;
  size_t shared_bytes;                       // what the launch gave, from base on
  std::vector<std::vector<uint64_t>> slots;  // [3][32 · warps]: what each lane hands its warp
  std::vector<unsigned char> shared;
  unsigned char* base = nullptr;
  void* scheduler = nullptr;  // the scheduler's stack pointer while a fiber runs
  std::vector<void*> fibers;  // each suspended fiber's
  std::vector<bool> finished;
  int finished_count = 0;
  // Per thread: the barrier group it waits at (-1: none) and that group's generation then.
  std::vector<int> waiting_group;
  std::vector<uint64_t> waiting_generation;
  std::vector<int> arrived;  // per barrier group: 0 the block, 1 + w warp w
  std::vector<uint64_t> generation;
  int lanes_of(int warp) const { return threads - 32 * warp < 32 ? threads - 32 * warp : 32; }
  // The threads a barrier of `group` waits for: the block's that have not returned (a thread that
  // has returned no longer holds up __syncthreads), or every lane of a warp.
  int expected(int group) const {
    return group == 0 ? threads - finished_count : lanes_of(group - 1);
  }
  void release(int group) {
    arrived[size_t(group)] = 0;
    ++generation[size_t(group)];
  }
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
// The dynamic shared memory each kernel was allowed beyond the default 48 KB
// (cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize), by the kernel's address.
inline std::map<const void*, size_t> allowed_shared_bytes;

// Returns once all the threads `group` expects have called it, the other fibers running
// meanwhile.
inline void wait(int group) {
  Block& block = *current;
  const uint64_t generation = block.generation[size_t(group)];
  if (++block.arrived[size_t(group)] == block.expected(group)) {
    block.release(group);
    return;
  }
  const int self = thread_index;
  block.waiting_group[size_t(self)] = group;
  block.waiting_generation[size_t(self)] = generation;
  while (block.generation[size_t(group)] == generation)
    tfm_emulation_switch_fiber(&block.fibers[size_t(self)], block.scheduler);
  block.waiting_group[size_t(self)] = -1;
}
inline void warp_wait() {
  wait(1 + thread_index / 32);
}
// Slot k of lane `lane` of the calling thread's warp.
inline uint64_t& slot(int k, int lane) {
  return current->slots[size_t(k)][size_t((thread_index & ~31) + lane)];
}
inline int lane() {
  return thread_index % 32;
}
inline int lanes() {
  return current->lanes_of(thread_index / 32);
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
// A value of up to 8 bytes through a slot, and back.
template <typename T>
uint64_t to_slot(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  return word;
}
template <typename T>
T from_slot(uint64_t word) {
  T value;
  std::memcpy(&value, &word, sizeof(T));
  return value;
}
// Every lane of the warp hands in `value` and gets lane source(lane)'s (its own where source
// gives a lane the warp does not have).
template <typename T, typename Source>
T exchange(T value, Source source) {
  const int self = lane();
  slot(0, self) = to_slot(value);
  warp_wait();
  const int from = source(self);
  const T got = from >= 0 && from < lanes() ? from_slot<T>(slot(0, from)) : value;
  warp_wait();
  return got;
}

// Runs kernel() over `grid` blocks of `block` threads with `shared_bytes` of dynamic shared memory.
void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel);
void run_block(dim3 grid, dim3 block, unsigned b, size_t shared_bytes);

}  // namespace warp_emulation

// The CUDA built-ins, as the kernels name them. __shared__ arrays are one per kernel (static),
// which is a block's own because blocks run one after another; they lie in a section of their
// own, which each launch starts with as 0xFF bytes (NaN; later blocks find what the last one
// left, as on a GPU): a kernel that reads before it writes shows.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ static __attribute__((section("tfm_emulated_shared")))
#define TFM_DYNAMIC_SHARED(Type, name) \
  Type* name = reinterpret_cast<Type*>(warp_emulation::current->base)
#define TFM_DYNAMIC_SHARED_ALIGNED(Type, name, bytes) TFM_DYNAMIC_SHARED(Type, name)
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline void __syncthreads() {
  warp_emulation::wait(0);
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  warp_emulation::warp_wait();
}
inline uint32_t __float_as_uint(float f) {
  return warp_emulation::float_bits(f);
}
inline float __uint_as_float(uint32_t u) {
  return warp_emulation::bits_float(u);
}
inline int __float_as_int(float f) {
  return int(warp_emulation::float_bits(f));
}
inline float __int_as_float(int i) {
  return warp_emulation::bits_float(uint32_t(i));
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float rsqrtf(float x) {
  return 1.f / std::sqrt(x);
}
// The device's __expf: x · log2 e rounded to float, then ex2.approx.ftz of it (here the exact
// power, rounded; the device's is within 2 units in the last place), a result below float's
// smallest normal flushed to 0.
inline float __expf(float x) {
  const float power = float(std::exp2(double(x * 1.44269504088896341f)));
  return std::fabs(power) < 1.17549435e-38f ? 0.f : power;
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
// One OS thread runs every fiber, switching only inside the built-ins above: each read-modify-write
// is whole, as an atomic is.
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
  return warp_emulation::exchange(value, [&](int lane) {
    const int from = lane ^ lane_mask;  // a later group's lane: the caller's own value
    return from / width <= lane / width ? from : lane;
  });
}
template <typename T>
T __shfl_sync(unsigned, T value, int source_lane, int width = 32) {
  return warp_emulation::exchange(
      value, [&](int lane) { return lane / width * width + (source_lane & (width - 1)); });
}
template <typename T>
T __shfl_up_sync(unsigned, T value, unsigned delta, int width = 32) {
  return warp_emulation::exchange(
      value, [&](int lane) { return lane % width >= int(delta) ? lane - int(delta) : lane; });
}
inline unsigned __ballot_sync(unsigned, int predicate) {
  using namespace warp_emulation;
  slot(0, lane()) = predicate ? 1 : 0;
  warp_wait();
  unsigned bits = 0;
  for (int l = 0; l < lanes(); ++l) bits |= unsigned(slot(0, l)) << l;
  warp_wait();
  return bits;
}
inline int __any_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) != 0;
}

// Block b (numbered x fastest) of a launch, its fibers run in turn until every one has returned.
inline void warp_emulation::run_block(dim3 grid, dim3 block_shape, unsigned b,
                                      size_t shared_bytes) {
  constexpr size_t kStackBytes = 256 << 10;
  // Stacks kept from launch to launch (not cleared: a fiber writes before it reads), each above
  // an inaccessible page, so that a fiber overflowing its stack faults instead of writing over
  // another's.
  static std::vector<char*> stacks;
  const int threads = int(block_shape.x * block_shape.y * block_shape.z);
  while (stacks.size() < size_t(threads)) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    void* memory = mmap(nullptr, page + kStackBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED || mprotect(memory, page, PROT_NONE) != 0) std::abort();
    stacks.push_back(static_cast<char*>(memory) + page);
  }
  Block block(threads, shared_bytes);
  current = &block;
  for (int t = 0; t < threads; ++t)
    block.fibers[size_t(t)] = start_fiber(
        stacks[size_t(t)], kStackBytes, +[] {
          (*current_kernel)();
          Block& finishing = *current;
          finishing.finished[size_t(thread_index)] = true;
          ++finishing.finished_count;
          // A __syncthreads the others wait at no longer waits for this thread.
          if (finishing.arrived[0] > 0 && finishing.arrived[0] == finishing.expected(0))
            finishing.release(0);
          void* done;  // never resumed
          tfm_emulation_switch_fiber(&done, finishing.scheduler);
        });
  // Each warp in turn runs as far as it can (to a barrier the others have not reached, or its
  // end) before the next starts: warps far apart, as a GPU may run them, so that a barrier
  // missing between one warp's reads and another's next stores of shared memory shows. Even
  // blocks take the warps in order, odd ones in reverse (a missing barrier between stores and
  // another warp's reads shows in one of the two). A round in which no thread can go on is a
  // barrier some threads never reach: abort, as a GPU would hang.
  const int warps = block.warps;
  const auto run = [&](int t) {
    threadIdx = make_uint3(unsigned(t) % block_shape.x, unsigned(t) / block_shape.x % block_shape.y,
                           unsigned(t) / (block_shape.x * block_shape.y));
    blockIdx = make_uint3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
    blockDim = block_shape;
    gridDim = grid;
    thread_index = t;
    tfm_emulation_switch_fiber(&block.scheduler, block.fibers[size_t(t)]);
  };
  while (block.finished_count < threads) {
    bool any_ran = false;
    for (int turn = 0; turn < warps; ++turn) {
      const int warp = b % 2 == 0 ? turn : warps - 1 - turn;
      for (bool ran = true; ran;) {
        ran = false;
        for (int t = 32 * warp; t < 32 * warp + block.lanes_of(warp); ++t)
          if (block.runnable(t)) {
            run(t);
            ran = any_ran = true;
          }
      }
    }
    if (!any_ran) std::abort();
  }
  current = nullptr;
}

inline void warp_emulation::launch(dim3 grid, dim3 block, size_t shared_bytes,
                                   const std::function<void()>& kernel) {
  current_kernel = &kernel;
  char* const shared_begin = &__start_tfm_emulated_shared[0];
  char* const shared_end = &__stop_tfm_emulated_shared[0];
  if (shared_begin != shared_end)
    std::memset(shared_begin, 0xFF, size_t(shared_end - shared_begin));
  const unsigned blocks = grid.x * grid.y * grid.z;
  for (unsigned b = 0; b < blocks; ++b) run_block(grid, block, b, shared_bytes);
  current_kernel = nullptr;  // the kernel lives no longer than the call
}

namespace tfm {
// cuda_common.h's launch_kernel: the kernel over the grid, its parameters converted as a launch
// converts them.
// A configuration a GPU would refuse (cudaErrorInvalidConfiguration, which check_launch turns into
// an error) throws here: an empty grid or block, more than 1,024 threads, a grid's y or z past
// 65,535, dynamic shared memory past 48 KB that cudaFuncSetAttribute did not allow or past an
// H100's 227 KB.
template <typename... Parameters, typename... Arguments>
void launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t, const Arguments&... arguments) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const auto allowed =
      warp_emulation::allowed_shared_bytes.find(reinterpret_cast<const void*>(kernel));
  const size_t shared_limit =
      allowed == warp_emulation::allowed_shared_bytes.end() ? 48 * 1024 : allowed->second;
  if (grid.x * grid.y * grid.z == 0 || threads == 0 || threads > 1024 || grid.y > 65535 ||
      grid.z > 65535 || block.z > 64 || shared_bytes > shared_limit || shared_bytes > 227 * 1024)
    throw std::logic_error("emulated launch: invalid configuration (grid " +
                           std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                           std::to_string(grid.z) + ", " + std::to_string(threads) + " threads, " +
                           std::to_string(shared_bytes) + " bytes of shared memory)");
  warp_emulation::launch(grid, block, shared_bytes, [&] { kernel(arguments...); });
}
}  // namespace tfm

// warp_matrix.h's interface (in tfm, where the kernels' namespace, tfm::cuda or its emulated
// copy's, finds it).
namespace tfm {

// ldmatrix .m8n8.x4 (.trans): lane l addresses row l % 8 of matrix l / 8; lane l receives, of
// matrix i, row l / 4's elements 2 (l % 4) and 2 (l % 4) + 1 (transposed: column l / 4's), the
// first in the low half. A row address off a 16-byte boundary, or past the block's shared
// memory, aborts, as it faults on a GPU.
inline void emulated_load_matrices(uint32_t (&r)[4], const uint16_t* row, bool transposed) {
  using namespace warp_emulation;
  const int lane = warp_emulation::lane();
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

}  // namespace tfm

// WMMA (mma.h) as attention_tensor_cores.cu uses it: 16 × 16 × 16 tiles, bfloat16 operands,
// float sums. Every lane holds the whole tile (a fragment's layout across lanes is the
// hardware's own, and the kernels never look inside one), each operation waits for the whole
// warp first, as a .sync instruction does, and a product sums in double and rounds once.
namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "emulated: 16 x 16 x 16 tiles");
  float tile[16][16];  // [row][column] of the operand or the sums
};

// Element (i, j) of the operand tile at p (rows or columns ldm apart, as Layout says).
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  warp_emulation::warp_wait();
  constexpr bool by_rows = std::is_same_v<Layout, row_major>;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      uint16_t bits;
      std::memcpy(&bits, p + (by_rows ? i * ldm + j : j * ldm + i), 2);
      f.tile[i][j] = tfm::bfloat16_to_float(bits);
    }
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float value) {
  warp_emulation::warp_wait();
  for (auto& row : f.tile)
    for (float& x : row) x = value;
}
template <typename T, typename ALayout, typename BLayout>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, ALayout>& a,
              const fragment<matrix_b, 16, 16, 16, T, BLayout>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  warp_emulation::warp_wait();
  float result[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double sum = c.tile[i][j];
      for (int k = 0; k < 16; ++k) sum += double(a.tile[i][k]) * b.tile[k][j];
      result[i][j] = float(sum);
    }
  std::memcpy(d.tile, result, sizeof result);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  warp_emulation::warp_wait();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      p[layout == mem_row_major ? i * ldm + j : j * ldm + i] = f.tile[i][j];
}

}  // namespace wmma
}  // namespace nvcuda
