// --device and --compute-type (see device_options.h).
#include "cli/device_options.h"

#include "api/compute_type.h"
#include "tensor/error.h"

namespace tfm {

void DeviceOption::add_to(CLI::App& app) {
  // The help names every kind, whatever this build and machine have: asking which devices are
  // here would start the GPU runtime in every command, and --help would differ by machine
  // (`--version` and the error for an absent device say what this one has).
  app.add_option("--device", name,
                 "Where the model runs: cpu, cuda or cuda:N (an NVIDIA GPU, in a build with the "
                 "CUDA backend), or auto (the first GPU if there is one, else the CPU)")
      ->capture_default_str();
}

const Backend& DeviceOption::resolve() const {
  return find_backend(name);
}

void ComputeTypeOption::add_to(CLI::App& app) {
  app.add_option("--compute-type", name,
                 "Number format of every weight product (encoder, decoder, output projection), "
                 "by CTranslate2's names: default (the model file's own: int8 if it stores int8 "
                 "weights, else float32); auto (int8 on a CPU with VNNI, else float32, as "
                 "CTranslate2's auto prefers int8 on CPUs); float32 (or float); "
                 "bfloat16 (half the weight memory, faster on CPUs with AVX512-BF16; "
                 "log-probabilities move by ~1e-2; decoding keeps its cached keys and values in "
                 "bfloat16 too); int8 (or int8_float32: a quarter of the weight memory, a scale "
                 "per weight row and per activation row, integer products; CPUs with VNNI); "
                 "int8_bfloat16 (int8 products, decoding's cached keys and values in bfloat16: "
                 "half the bytes a step reads; score: the same as int8); on GPUs also float16 "
                 "(as bfloat16 with float16's 11-bit mantissa and range to 65504) and "
                 "int8_float16 (int8 products, the cache in float16)")
      ->check(CLI::Validator([](std::string& input) { return compute_type_problem(input); },
                             "COMPUTE_TYPE"))
      ->capture_default_str();
}

}  // namespace tfm
