// The warp-level matrix instructions of attention_in_registers.cu's kernels (ldmatrix and
// mma.sync's m16n8k16 bfloat16 product, sm_80 and later), with the layouts of their operands
// that the kernels rely on: one place, which
// tests/attention_in_registers_emulated.cpp replaces with a host emulation of the same
// layouts, so that the kernels' index arithmetic runs and is checked without a GPU.
#pragma once

#include <cstdint>

namespace tfm {
namespace cuda {

__device__ __forceinline__ uint32_t shared_address_of(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8 × 8 bfloat16 matrices from shared memory, lane l giving the address of row l % 8 of
// matrix l / 8 (16 bytes each). Lane l gets, of matrix i, in r[i]: row l / 4, columns 2 (l % 4)
// and the next; transposed, rows 2 (l % 4) and the next of column l / 4 (the first value in the
// low half either way). "memory": not moved across the barriers that order the stores it reads.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address_of(row))
               : "memory");
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address_of(row))
               : "memory");
}

// d += a·b for one tile, with g = lane / 4 and q = lane % 4: a 16 × 16 bfloat16 left operand
// (a[0]: row g, columns 2q and 2q + 1; a[1]: row g + 8; a[2]: row g, columns + 8; a[3]: both),
// a 16 × 8 right one (b0: rows 2q and 2q + 1 of column g; b1: those rows + 8) and 16 × 8 float
// sums (d[0], d[1]: row g, columns 2q and 2q + 1; d[2], d[3]: row g + 8).
// volatile: .sync.aligned needs every lane of the warp to execute it together, so the compiler
// must not move it into a branch some lanes skip.
__device__ __forceinline__ void multiply_add(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace cuda
}  // namespace tfm
