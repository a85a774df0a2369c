// The compute types a model runs in, by CTranslate2's names ("default", "auto", "float32",
// "bfloat16", "int8", "int8_bfloat16", and its aliases), resolved against a device and a model
// file: one definition for the command line, the server and the library API.
#pragma once

#include <string>

#include "backend/backend.h"

namespace tfm {

// What a compute type asks of decoding: the precision of every weight product and the element
// type of the decoder's cached keys and values.
struct ComputeType {
  Precision precision = Precision::kFloat32;
  CacheFormat cache = CacheFormat::kFloat32;
};

// The names resolve_compute_type takes, in words, for help texts.
extern const char* const kComputeTypeNames;

// Why `name` is not a compute type (a name CTranslate2 knows but this program cannot run says
// so); empty for the names it takes.
std::string compute_type_problem(const std::string& name);

// Why `backend` cannot run `type`, as the end of a sentence about it (Backend::unsupported_reason
// of the products' precision, or of float16 for a float16 cache: float16 storage goes with
// float16 products, so int8_float16 is refused where float16 is, as on CTranslate2's CPUs);
// empty where it can.
std::string unsupported_reason(const ComputeType& type, const Backend& backend);

// The compute type `name` means for the model at `model_path` on `backend`: "default" is the
// precision the file stores its linear weights in (int8 or float32), "auto" int8 where `backend`
// multiplies in it, else float32 (CTranslate2's auto on CPUs). Throws UsageError for an unknown
// name, Error when `backend` cannot multiply in it (bfloat16 on a CPU without AVX512-BF16).
ComputeType resolve_compute_type(const std::string& name, const Backend& backend,
                                 const std::string& model_path);

}  // namespace tfm
