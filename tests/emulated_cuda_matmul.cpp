// The CUDA backend's products (matmul.cu: Backend::matmul's paths through cuBLAS and cuBLASLt, the
// passes around them, the prepared weights in every format) compiled for the CPU through
// tests/emulated_cuda.h, over the emulated libraries of tests/emulated_cuda_blas.cpp: a file of
// its own, as each of the backend's source files is its own translation unit.
#include "emulated_cuda.h"

// The backend's file, after it.
#include "backend/cuda/matmul.cu"
