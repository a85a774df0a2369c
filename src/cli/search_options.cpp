// Decoding flags shared by `translate` and `serve` (see search_options.h).
#include "cli/search_options.h"

#include "cli/option_ranges.h"
#include "kernels/gemm.h"
#include "tensor/error.h"

namespace tfm {

void SearchFlags::add_to(CLI::App& app) {
  app.add_option("--beam", search.beam, "Beam size; 1 is greedy search (default 4)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--alpha", search.alpha,
                 "Length penalty α: hypotheses are ranked by log p / ((5+|Y|)/6)^α (default 0.6)")
      ->check(in_range(0, 10));
  app.add_option("--max-length-a", search.max_length_a,
                 "At most a·(source length) + b output tokens (default a 1)")
      ->check(in_range(0, 1000));
  app.add_option("--max-length-b", search.max_length_b, "... + b (default 50)")
      ->check(in_range(0, 1 << 20));
  app.add_option("--max-length", search.max_length, "Hard cap on output tokens (default: none)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--min-length", search.min_length, "At least this many output tokens before eos")
      ->check(in_range(0, 1 << 20));
  app.add_option("--compute-type", compute_type,
                 "Number format of the decoder's weight products: float32 (default) or "
                 "bfloat16 (half the weight memory, ~1.3x faster decoding on CPUs with "
                 "AVX512-BF16; log-probabilities move by ~1e-2)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
}

SearchOptions SearchFlags::resolve() const {
  SearchOptions s = search;
  if (compute_type == "bfloat16") {
    if (!bfloat16_supported())
      throw Error("--compute-type bfloat16 needs a CPU with AVX512-BF16 instructions");
    s.precision = Precision::kBFloat16;
  }
  return s;
}

}  // namespace tfm
