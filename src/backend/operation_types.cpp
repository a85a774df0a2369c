// The names of the number formats (operation_types.h), in one place for every command and file.
#include "backend/operation_types.h"

namespace tfm {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return "bfloat16";
    case Precision::kFloat16:
      return "float16";
    case Precision::kInt8:
      return "int8";
    case Precision::kFloat32:
      break;
  }
  return "float32";
}

bool parse_precision(const std::string& name, Precision& precision) {
  for (Precision candidate :
       {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16, Precision::kInt8})
    if (name == precision_name(candidate)) {
      precision = candidate;
      return true;
    }
  return false;
}

bool parse_compute_type(const std::string& name, Precision& precision, CacheFormat& cache) {
  // CTranslate2's other spellings of the same two: "float" and, for int8 with everything else
  // in float32 (what its "int8" means on CPUs), "int8_float32".
  if (name == "float") return parse_compute_type("float32", precision, cache);
  if (name == "int8_float32") return parse_compute_type("int8", precision, cache);
  if (name == "int8_bfloat16" || name == "int8_float16") {
    precision = Precision::kInt8;
    cache = name == "int8_bfloat16" ? CacheFormat::kBFloat16 : CacheFormat::kFloat16;
    return true;
  }
  if (!parse_precision(name, precision)) return false;
  cache = precision == Precision::kBFloat16  ? CacheFormat::kBFloat16
          : precision == Precision::kFloat16 ? CacheFormat::kFloat16
                                             : CacheFormat::kFloat32;
  return true;
}

std::string compute_type_name(Precision precision, CacheFormat cache) {
  if (precision == Precision::kInt8 && cache == CacheFormat::kBFloat16) return "int8_bfloat16";
  if (precision == Precision::kInt8 && cache == CacheFormat::kFloat16) return "int8_float16";
  return precision_name(precision);
}

}  // namespace tfm
