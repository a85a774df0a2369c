// The CUDA backend's cuBLASLt products (lt_product.cu: descriptors, epilogues, the ReLU mask, the
// tuning of training's products) compiled for the CPU through tests/emulated_cuda.h, over the
// emulated cuBLASLt of tests/emulated_cuda_blas.cpp: a file of its own, as each of the backend's
// source files is its own translation unit.
#include "emulated_cuda.h"

// The backend's file, after it.
#include "backend/cuda/lt_product.cu"
