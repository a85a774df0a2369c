// --compute-type (see compute_type_option.h).
#include "cli/compute_type_option.h"

#include "tensor/error.h"

namespace tfm {

void ComputeTypeOption::add_to(CLI::App& app) {
  app.add_option("--compute-type", name,
                 "Number format of every weight product (encoder, decoder, output projection): "
                 "float32 (default) or bfloat16 (half the weight memory, faster on CPUs with "
                 "AVX512-BF16; log-probabilities move by ~1e-2)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
}

Precision ComputeTypeOption::resolve() const {
  if (name != "bfloat16") return Precision::kFloat32;
  if (!bfloat16_supported())
    throw Error("--compute-type bfloat16 needs a CPU with AVX512-BF16 instructions");
  return Precision::kBFloat16;
}

}  // namespace tfm
