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
                 "AVX512-BF16; log-probabilities move by ~1e-2); int8 (a quarter of the weight "
                 "memory, a scale per weight row and per activation row, integer products; "
                 "CPUs with VNNI)")
      ->check(CLI::IsMember({"default", "float32", "bfloat16", "int8"}))
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
  if (!parse_precision(name, precision))
    throw Error("--compute-type must be default, float32, bfloat16 or int8, not \"" + name + "\"");
  if (backend.supports(precision)) return precision;
  if (backend.name() != "cpu")
    throw Error("--compute-type " + name + " is not supported by device " + backend.name());
  throw Error(precision == Precision::kBFloat16
                  ? "--compute-type bfloat16 needs a CPU with AVX512-BF16 instructions"
                  : "--compute-type int8 needs a CPU with int8 dot-product instructions "
                    "(AVX512-VNNI or AVX-VNNI)");
}

}  // namespace tfm
