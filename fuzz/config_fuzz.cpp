// Fuzz target: the model config (JSON text → validated ModelConfig), then everything derived
// from a config that passed validation: parameter names and shapes, the exact count, the JSON
// written back (which must parse to the same config).
#include "fuzz_common.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tfm::fuzzing::expect_clean_rejection([&] {
    const tfm::ModelConfig c =
        tfm::config_from_json_text(tfm::fuzzing::as_string(data, size), "fuzz");
    (void)tfm::parameter_specs(c);
    (void)tfm::parameter_count(c);
    const tfm::ModelConfig again = tfm::config_from_json_text(tfm::config_to_json_text(c), "again");
    if (tfm::config_to_json_text(again) != tfm::config_to_json_text(c)) __builtin_trap();
  });
  return 0;
}
