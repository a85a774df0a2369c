// The CUDA backend's own kernels and its products run on the CPU, behind the Backend interface,
// so that tests/backend_ops_test.cpp checks them against its float64 references without a GPU
// (its EmulatedCuda instantiation, in the emulated_cuda_tests binary built wherever the CUDA
// backend is). The kernels are those of src/backend/cuda/attention*.cu (the float32, decoding,
// dense and bfloat16 register-block attention), elementwise.cu and loss_and_search.cu, compiled by
// the host compiler over an emulation of the CUDA built-ins they use (warp_emulation.h: each
// thread a fiber, warps' shuffles, votes and matrix instructions, barriers, shared memory), with
// the launch shapes the backend gives them, for an emulated H100-sized device; WMMA's tiles are
// emulated too (TFM_CUDA_ATTENTION_IN_REGISTERS=0 takes those blocks). The products are
// matmul.cu's and lt_product.cu's over an emulated cuBLAS and cuBLASLt (emulated_cuda_blas.cpp).
// Slow: small sizes only.
#pragma once

#include "backend/backend.h"

namespace tfm {

const Backend& emulated_cuda_backend();

}  // namespace tfm
