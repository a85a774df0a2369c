// --device and --compute-type (see device_options.h).
#include "cli/device_options.h"

#include "io/model_directory.h"
#include "tensor/error.h"

namespace tfm {

void DeviceOption::add_to(CLI::App& app) {
  app.add_option("--device", name,
                 "Where the model runs (this build has: " + available_backend_names() + ")")
      ->capture_default_str();
}

const Backend& DeviceOption::resolve() const {
  return find_backend(name);
}

void ComputeTypeOption::add_to(CLI::App& app) {
  app.add_option("--compute-type", name,
                 "Number format of every weight product (encoder, decoder, output projection): "
                 "default (the model file's own: int8 if it stores int8 weights, else "
                 "float32); float32; bfloat16 (half the weight memory, faster on CPUs with "
                 "AVX512-BF16; log-probabilities move by ~1e-2; decoding keeps its cached keys "
                 "and values in bfloat16 too); int8 (a quarter of the weight memory, a scale "
                 "per weight row and per activation row, integer products; CPUs with VNNI); "
                 "int8_bfloat16 (int8 products, decoding's cached keys and values in bfloat16: "
                 "half the bytes a step reads; score: the same as int8)")
      ->check(CLI::IsMember({"default", "float32", "bfloat16", "int8", "int8_bfloat16"}))
      ->capture_default_str();
}

Precision ComputeTypeOption::resolve(const Backend& backend, const std::string& model_path) const {
  Precision precision = Precision::kFloat32;
  if (name == "default") {
    precision = stored_precision(model_path);
    if (!backend.supports(precision))
      throw Error(model_path + " stores int8 weights, which device " + backend.name() +
                  " cannot multiply here (int8 needs AVX512-VNNI or AVX-VNNI on a CPU); "
                  "--compute-type float32 runs it in float32");
    return precision;
  }
  CacheFormat cache = CacheFormat::kFloat32;
  if (!parse_compute_type(name, precision, cache))
    throw Error("--compute-type must be default, float32, bfloat16, int8 or int8_bfloat16, not \"" +
                name + "\"");
  if (backend.supports(precision)) return precision;
  if (backend.name() != "cpu")
    throw Error("--compute-type " + name + " is not supported by device " + backend.name());
  throw Error(precision == Precision::kBFloat16
                  ? "--compute-type bfloat16 needs a CPU with AVX512-BF16 instructions"
                  : "--compute-type " + name +
                        " needs a CPU with int8 dot-product instructions (AVX512-VNNI or "
                        "AVX-VNNI)");
}

CacheFormat ComputeTypeOption::cache_format() const {
  Precision precision = Precision::kFloat32;
  CacheFormat cache = CacheFormat::kFloat32;  // "default" as well
  parse_compute_type(name, precision, cache);
  return cache;
}

}  // namespace tfm
