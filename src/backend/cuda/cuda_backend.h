// The CUDA backend's entry points for the registry (backend/backend.cpp): one Backend per GPU
// that the CUDA runtime sees, named "cuda" for the first and "cuda:N" for the others. Declared
// in plain C++ so that the registry compiles without nvcc; defined in cuda_backend.cu, built
// when TRANSFORMER_WITH_CUDA is (CMake's TRANSFORMER_CUDA option).
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace tfm {

// One backend per visible GPU, in device order; empty where there is none (no driver, no
// device), which cuda_unavailable_reason() then explains.
const std::vector<const Backend*>& cuda_backends();
std::string cuda_unavailable_reason();

}  // namespace tfm
