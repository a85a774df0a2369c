// See blas_library.h.
#include <dlfcn.h>

#include <string>

#include "backend/cuda/blas_library.h"
#include "tensor/error.h"

namespace tfm {
namespace cuda {

namespace {

// `base` (libcublas.so, libcublasLt.so) with the major version this build was compiled against
// (CUBLAS_VER_MAJOR), then the unversioned development link.
void* open_library(const std::string& base, std::string& tried) {
  const std::string versioned = base + "." + std::to_string(CUBLAS_VER_MAJOR);
  for (const std::string& name : {versioned, base}) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + name + ": " + (why ? why : "not found");
  }
  return nullptr;
}

// The library `base` names (open_library), or Error naming `what` and every name tried.
void* open_or_throw(const std::string& base, const char* what) {
  std::string tried;
  void* handle = open_library(base, tried);  // kept open for the process's life
  if (!handle) throw Error(std::string(what) + " could not be loaded (" + tried + ")");
  return handle;
}

template <typename Function>
void look_up(void* handle, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(handle, name));
  if (!function) throw Error(std::string("cuBLAS: the library has no ") + name);
}

BlasLibrary load() {
  void* handle = open_or_throw("libcublas.so", "cuBLAS");
  BlasLibrary library{};
  look_up(handle, "cublasCreate_v2", library.create);
  look_up(handle, "cublasSetStream_v2", library.set_stream);
  look_up(handle, "cublasSgemm_v2", library.sgemm);
  look_up(handle, "cublasGemmEx", library.gemm_ex);
  look_up(handle, "cublasSgemmBatched", library.sgemm_batched);
  look_up(handle, "cublasGemmBatchedEx", library.gemm_batched_ex);
  look_up(handle, "cublasGetStatusString", library.status_string);
  return library;
}

BlasLtLibrary load_lt() {
  void* handle = open_or_throw("libcublasLt.so", "cuBLASLt");
  BlasLtLibrary library{};
  look_up(handle, "cublasLtCreate", library.create);
  look_up(handle, "cublasLtMatmulDescCreate", library.desc_create);
  look_up(handle, "cublasLtMatmulDescDestroy", library.desc_destroy);
  look_up(handle, "cublasLtMatmulDescSetAttribute", library.desc_set);
  look_up(handle, "cublasLtMatrixLayoutCreate", library.layout_create);
  look_up(handle, "cublasLtMatrixLayoutDestroy", library.layout_destroy);
  look_up(handle, "cublasLtMatmulPreferenceCreate", library.preference_create);
  look_up(handle, "cublasLtMatmulPreferenceDestroy", library.preference_destroy);
  look_up(handle, "cublasLtMatmulPreferenceSetAttribute", library.preference_set);
  look_up(handle, "cublasLtMatmulAlgoGetHeuristic", library.heuristic);
  look_up(handle, "cublasLtMatmulAlgoCheck", library.algo_check);
  look_up(handle, "cublasLtMatmul", library.matmul);
  return library;
}

}  // namespace

const BlasLibrary& blas_library() {
  static const BlasLibrary library = load();
  return library;
}

const BlasLtLibrary& blas_lt_library() {
  static const BlasLtLibrary library = load_lt();
  return library;
}

}  // namespace cuda
}  // namespace tfm
