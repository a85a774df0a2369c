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
  app.add_option("--sampling-topk", search.sampling_topk,
                 with_default("Random sampling instead of the best token: draw each token from the "
                              "K most probable (0: the whole vocabulary); 1 is no sampling. Takes "
                              "--beam 1",
                              search.sampling_topk))
      ->check(in_range(0, 1 << 30));
  app.add_option("--sampling-topp", search.sampling_topp,
                 with_default("When sampling: draw from the fewest most probable tokens whose "
                              "probability reaches P (nucleus sampling)",
                              search.sampling_topp))
      ->check(in_range(0, 1, false));
  app.add_option("--sampling-temperature", search.sampling_temperature,
                 with_default("When sampling: divide the log-probabilities by T first (below 1 "
                              "sharpens the distribution, above 1 flattens it)",
                              search.sampling_temperature))
      ->check(in_range(0, 1e6, false));
  app.add_option("--seed", search.sampling_seed,
                 "When sampling: the seed of the draws; the same seed, input and options give "
                 "the same output (default: a new seed each run)")
      ->check(at_least(1));
  device.add_to(app);
  compute_type.add_to(app);
}

void SearchFlags::check() const {
  if (samples(search) && search.beam_size != 1)
    throw UsageError("--sampling-topk " + std::to_string(search.sampling_topk) +
                     " samples, which takes --beam 1 (not " + std::to_string(search.beam_size) +
                     ")");
  if (search.max_decoding_length > 0 && search.min_decoding_length > search.max_decoding_length)
    throw UsageError("--min-length " + std::to_string(search.min_decoding_length) +
                     " is greater than --max-length " + std::to_string(search.max_decoding_length));
}

TranslatorOptions SearchFlags::translator_options() const {
  TranslatorOptions t;
  t.device = device.name;
  t.compute_type = compute_type.name;
  return t;
}

}  // namespace tfm
