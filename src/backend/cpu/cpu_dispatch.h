// The instruction set of the CPU backend's own loops, chosen when the program runs. A portable
// build (-march=x86-64-v3, CMake's default) compiles every function marked TFM_CPU_KERNEL twice,
// for x86-64-v4 (AVX-512) and for the build's own target, and the dynamic loader resolves each
// to the clone this CPU runs (GCC's target_clones: an ifunc, resolved once at load); the OpenMP
// bodies inside a function are cloned with it. So a binary built for every AVX2 machine runs its
// softmax, layer-norm, loss and quantisation loops in AVX-512 where the CPU has it. A build
// whose target has AVX-512 already (-march=native on such a machine) compiles each once. The
// matrix products need none of this: oneDNN picks its kernels for the CPU itself.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512F__) && \
    defined(__linux__)
#define TFM_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define TFM_CPU_KERNEL
#endif
