// The CUDA backend's kernels that need neither cuBLAS nor tensor-core instructions (element-wise
// passes, layer norms, the loss, the search's best tokens, the float32 and decoding attention),
// compiled for the CPU through tests/emulated_cuda.h, with the little of the backend's other
// files they call: what tests/emulated_cuda_backend.cpp runs them through.
#include "emulated_cuda.h"

// The kernels' files, after it.
#include "backend/cuda/attention.cu"
#include "backend/cuda/attention_short.cu"
#include "backend/cuda/elementwise.cu"
#include "backend/cuda/loss_and_search.cu"
