// cuBLAS and cuBLASLt, loaded with dlopen when a GPU is first used rather than linked: a process
// that links libcublas pays about 210 MB of resident memory at start (the loader's relocations of
// libcublasLt), CPU runs and --help included, where the CPU-only build starts in 6 MB. The
// functions the backend calls are looked up once, by their exported names, with the types of
// cublas_v2.h's and cublasLt.h's declarations.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace tfm {
namespace cuda {

struct BlasLibrary {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  // cublasGemmEx as exported (C++ also sees an inline overload taking cudaDataType as the
  // compute type, which is not in the library).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasSgemmBatched) sgemm_batched;
  // cublasGemmBatchedEx as exported (the same inline overload as cublasGemmEx's beside it).
  cublasStatus_t (*gemm_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void* const[], cudaDataType, int,
                                    const void* const[], cudaDataType, int, const void*,
                                    void* const[], cudaDataType, int, int, cublasComputeType_t,
                                    cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;
};

// cuBLASLt's: the products whose epilogue (bias, ReLU) runs in the product's own kernel, and
// training's products on the algorithm found fastest for their shape (lt_product.h).
struct BlasLtLibrary {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmulAlgoCheck) algo_check;
  decltype(&cublasLtMatmul) matmul;
};

// The library's functions; the first call loads libcublas.so.13 (the runtime's search path:
// LD_LIBRARY_PATH, the binary's run path, ld.so.conf). Throws Error saying what is missing.
const BlasLibrary& blas_library();
// The same for libcublasLt.so.13 (which libcublas itself needs, so found where it is).
const BlasLtLibrary& blas_lt_library();

}  // namespace cuda
}  // namespace tfm
