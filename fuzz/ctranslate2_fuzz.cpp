// Fuzz target: the CTranslate2 model.bin reader (versions 1–6, every dtype, quantisation
// scales, aliases).
#include "fuzz_common.h"
#include "io/ctranslate2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tfm::fuzzing::expect_clean_rejection(
      [&] { tfm::parse_ctranslate2_model(tfm::fuzzing::as_string(data, size), "fuzz/model.bin"); });
  return 0;
}
