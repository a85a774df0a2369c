// Which bfloat16 training attention a call takes (attention_tensor_cores.cu: the register
// blocks of attention_in_registers.cu, or its own WMMA blocks), compiled for the
// CPU through tests/emulated_cuda.h: a file of its own, as each of the backend's source files is
// its own translation unit.
#include "emulated_cuda.h"

// The kernels' file, after it.
#include "backend/cuda/attention_tensor_cores.cu"
