// Compute type names (see compute_type.h).
#include "api/compute_type.h"

#include "io/model_directory.h"
#include "tensor/error.h"

namespace tfm {

const char* const kComputeTypeNames =
    "default, auto, float32 (float), bfloat16, float16, int8 (int8_float32), int8_bfloat16 or "
    "int8_float16";

std::string compute_type_problem(const std::string& name) {
  Precision precision;
  CacheFormat cache;
  if (name == "default" || name == "auto" || parse_compute_type(name, precision, cache)) return "";
  if (name == "int16")
    return "int16 products are not supported (CTranslate2 has them only with Intel MKL); "
           "int8 or float32 run here";
  return "must be " + std::string(kComputeTypeNames) + ", not \"" + name + "\"";
}

std::string unsupported_reason(const ComputeType& type, const Backend& backend) {
  if (!backend.supports(type.precision)) return backend.unsupported_reason(type.precision);
  if (type.cache == CacheFormat::kFloat16 && !backend.supports(Precision::kFloat16))
    return backend.unsupported_reason(Precision::kFloat16);
  return "";
}

ComputeType resolve_compute_type(const std::string& name, const Backend& backend,
                                 const std::string& model_path) {
  ComputeType type;
  if (name == "default") {
    type.precision = stored_precision(model_path);
    if (!backend.supports(type.precision))
      throw Error(model_path + " stores int8 weights, which device " + backend.name() +
                  " cannot multiply here (int8 " + backend.unsupported_reason(type.precision) +
                  "); --compute-type float32 runs it in float32");
    return type;
  }
  if (name == "auto") {
    type.precision = backend.supports(Precision::kInt8) ? Precision::kInt8 : Precision::kFloat32;
    return type;
  }
  if (!parse_compute_type(name, type.precision, type.cache))
    throw UsageError("--compute-type: " + compute_type_problem(name));
  if (const std::string why = unsupported_reason(type, backend); !why.empty())
    throw Error("--compute-type " + name + " " + why);
  return type;
}

}  // namespace tfm
