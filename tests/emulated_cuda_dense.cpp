// The float32 training attention's dense path (attention_dense.cu: cuBLAS's batched products,
// emulated in tests/emulated_cuda_backend.cpp, around the masked softmax and its backward),
// compiled for the CPU through tests/emulated_cuda.h: a file of its own, as each of the
// backend's source files is its own translation unit.
#include "emulated_cuda.h"

// The kernels' file, after it.
#include "backend/cuda/attention_dense.cu"
