// Fuzz target: the safetensors reader (header length, JSON header, dtypes, shapes, offsets,
// metadata), and, when the bytes parse, the model built from them (config metadata, tensor
// names and shapes) exactly as `load_model` does it.
#include "fuzz_common.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/transformer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tfm::fuzzing::expect_clean_rejection([&] {
    tfm::SafetensorsFile file = tfm::parse_safetensors(tfm::fuzzing::as_string(data, size), "fuzz");
    auto config = file.metadata.find("config");
    if (config == file.metadata.end()) return;
    tfm::ModelConfig c = tfm::config_from_json_text(config->second, "fuzz");
    tfm::check_finite_parameters(file.tensors, "fuzz");
    tfm::Model model(std::move(c), std::move(file.tensors), "fuzz", tfm::cpu_backend());
  });
  return 0;
}
