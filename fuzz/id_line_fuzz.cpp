// Fuzz target: `--ids` input lines (space-separated token ids below the vocabulary size), as
// train / translate / score read them.
#include "fuzz_common.h"
#include "text/vocabulary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int64_t vocab_size = int64_t(data[0]) * 1000 + 1;  // first byte picks a vocabulary size
  tfm::fuzzing::expect_clean_rejection([&] {
    for (int32_t id :
         tfm::parse_id_line(tfm::fuzzing::as_string(data + 1, size - 1), vocab_size, "fuzz", 1))
      if (id < 0 || id >= vocab_size) __builtin_trap();
  });
  return 0;
}
