// --device and --compute-type (see device_options.h).
#include "cli/device_options.h"

#include "io/model_directory.h"
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

namespace {

// The names --compute-type takes: ours, which are CTranslate2's, and CTranslate2's aliases.
const char* const kComputeTypes =
    "default, auto, float32 (float), bfloat16, int8 (int8_float32) or "
    "int8_bfloat16";

// Why `name` is not a --compute-type (a name CTranslate2 knows but this program cannot run
// says so); empty for the names it takes.
std::string compute_type_problem(const std::string& name) {
  Precision precision;
  CacheFormat cache;
  if (name == "default" || name == "auto" || parse_compute_type(name, precision, cache)) return "";
  if (name == "float16" || name == "int8_float16")
    return name +
           " is not supported on the CPU (CTranslate2 runs float16 on GPUs only); "
           "bfloat16 or int8_bfloat16 are the CPU's 16-bit types";
  if (name == "int16")
    return "int16 products are not supported (CTranslate2 has them only with Intel MKL); "
           "int8 or float32 run here";
  return "must be " + std::string(kComputeTypes) + ", not \"" + name + "\"";
}

}  // namespace

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
                 "half the bytes a step reads; score: the same as int8)")
      ->check(CLI::Validator([](std::string& input) { return compute_type_problem(input); },
                             "COMPUTE_TYPE"))
      ->capture_default_str();
}

Precision ComputeTypeOption::resolve(const Backend& backend, const std::string& model_path) const {
  Precision precision = Precision::kFloat32;
  if (name == "default") {
    precision = stored_precision(model_path);
    if (!backend.supports(precision))
      throw Error(model_path + " stores int8 weights, which device " + backend.name() +
                  " cannot multiply here (int8 " + backend.unsupported_reason(precision) +
                  "); --compute-type float32 runs it in float32");
    return precision;
  }
  if (name == "auto")  // as CTranslate2's auto on CPUs: int8 where it runs here, else float32
    return backend.supports(Precision::kInt8) ? Precision::kInt8 : Precision::kFloat32;
  CacheFormat cache = CacheFormat::kFloat32;
  if (!parse_compute_type(name, precision, cache))
    throw UsageError("--compute-type: " + compute_type_problem(name));
  if (backend.supports(precision)) return precision;
  throw Error("--compute-type " + name + " " + backend.unsupported_reason(precision));
}

CacheFormat ComputeTypeOption::cache_format() const {
  Precision precision = Precision::kFloat32;
  CacheFormat cache = CacheFormat::kFloat32;  // "default" and "auto" as well
  parse_compute_type(name, precision, cache);
  return cache;
}

}  // namespace tfm
