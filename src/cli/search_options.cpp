// Decoding flags shared by `translate` and `serve` (see search_options.h).
#include "cli/search_options.h"

#include "cli/option_ranges.h"

namespace tfm {

void SearchFlags::add_to(CLI::App& app) {
  app.add_option("--beam", search.beam_size,
                 with_default("Beam size; 1 is greedy search", search.beam_size))
      ->check(in_range(1, 1 << 20));
  app.add_option("--alpha", search.length_penalty,
                 with_default("Length penalty α: hypotheses are ranked by log p / ((5+|Y|)/6)^α",
                              search.length_penalty))
      ->check(in_range(0, 10));
  app.add_option("--max-length-a", search.max_decoding_length_a,
                 "At most a·(source length) + b output tokens (default a 1)")
      ->check(in_range(0, 1000));
  app.add_option("--max-length-b", search.max_decoding_length_b,
                 with_default("... + b", search.max_decoding_length_b))
      ->check(in_range(0, 1 << 20));
  app.add_option("--max-length", search.max_decoding_length,
                 "Hard cap on output tokens (default: none)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--min-length", search.min_decoding_length,
                 "At least this many output tokens before eos")
      ->check(in_range(0, 1 << 20));
  device.add_to(app);
  compute_type.add_to(app);
}

TranslatorOptions SearchFlags::translator_options() const {
  TranslatorOptions t;
  t.device = device.name;
  t.compute_type = compute_type.name;
  return t;
}

}  // namespace tfm
