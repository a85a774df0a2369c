// --device and --compute-type (see device_options.h).
#include "cli/device_options.h"

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
                 "float32 (default) or bfloat16 (half the weight memory, faster on CPUs with "
                 "AVX512-BF16; log-probabilities move by ~1e-2)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
}

Precision ComputeTypeOption::resolve(const Backend& backend) const {
  if (name != "bfloat16") return Precision::kFloat32;
  if (!backend.supports(Precision::kBFloat16))
    throw Error("--compute-type bfloat16 needs a CPU with AVX512-BF16 instructions");
  return Precision::kBFloat16;
}

}  // namespace tfm
