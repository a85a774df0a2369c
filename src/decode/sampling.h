// Random sampling of the next token instead of the search's best (CTranslate2's sampling_topk,
// sampling_topp and sampling_temperature; Marian's --output-sampling): back-translation draws
// its synthetic sources this way, and several draws of one source give varied outputs. Every
// draw is a function of a seed, the sentence's key, the sample's index and the step, never of
// the batch or the row it decodes in, so that a seeded run repeats itself on any backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tfm {

struct SamplingOptions {
  // Draw from the k most probable tokens; 0: from the whole vocabulary; 1: no sampling (the
  // search's own choice, whatever the other fields say), as in CTranslate2.
  int64_t topk = 1;
  // Then keep the fewest most probable of those whose probability (after the temperature)
  // reaches topp (nucleus sampling); 1: all of them.
  double topp = 1.0;
  // The log-probabilities are divided by this before the softmax the draw follows: below 1
  // sharpens the distribution, above 1 flattens it.
  double temperature = 1.0;
  uint64_t seed = 0;  // with the keys, what every draw is a function of

  bool operator==(const SamplingOptions&) const = default;
};

inline bool is_sampling(const SamplingOptions& o) {
  return o.topk != 1;
}

// What is wrong with sampling under these options and a beam of `beam`, in the library's names
// (CTranslate2's: sampling_topk, ...); empty where nothing is. Sampling takes a beam of 1.
std::string sampling_options_error(const SamplingOptions& options, int64_t beam);

// A uniform draw in [0, 1) that depends on its four keys alone (SplitMix64's finaliser over
// them in turn): sample `sample` of sentence `sentence` at step `step`.
double sampling_draw(uint64_t seed, uint64_t sentence, uint64_t sample, uint64_t step);

// One token's log-probability, the unit a draw chooses among.
struct SamplingCandidate {
  float logprob;
  int32_t token;
};

// The candidate a draw `u` in [0, 1) chooses among `ranked`, the best `count` candidates best
// first (by log-probability, ties by token), or -1 where they are too few to say. With
// temperature T each weighs exp((logprob − best) / T); the nucleus is the fewest best whose
// weight reaches topp × the weight of every candidate (`total_weight`; 0: `ranked` holds every
// candidate, and the total is theirs), and u picks among it in proportion to the weights: -1
// where `ranked` ends before the nucleus does. −∞ candidates weigh nothing and are chosen only
// where every one is −∞.
int64_t choose_ranked(const SamplingCandidate* ranked, int64_t count, double temperature,
                      double topp, double total_weight, double u);

// The token a draw `u` chooses in a whole row of log-probabilities (or logits: only their
// differences count) [vocab]: the k best where topk > 0, then the nucleus, then in proportion
// to the weights as above. −∞ and NaN entries are impossible; -1 where every entry is. Ranks
// only as many entries as the nucleus needs, in `scratch` (kept between calls).
int32_t choose_in_row(const float* logprobs, int64_t vocab, const SamplingOptions& options,
                      double u, std::vector<SamplingCandidate>& scratch);

}  // namespace tfm
