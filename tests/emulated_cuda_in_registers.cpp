// The bfloat16 training attention's register blocks and tiles (attention_in_registers.cu) with
// their launches, compiled for the CPU through tests/emulated_cuda.h: a file of its own, as each
// of the backend's source files is its own translation unit.
#include "emulated_cuda.h"

// The kernels' file, after it.
#include "backend/cuda/attention_in_registers.cu"
