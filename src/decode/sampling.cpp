// Random sampling's draws and choices (sampling.h): the host's part of a sampled search step,
// over the candidates the backend ranked or over whole rows of logits.
#include "decode/sampling.h"

#include <algorithm>
#include <cmath>

namespace tfm {

namespace {

// SplitMix64's finaliser: every bit of x reaches every bit of the result.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Best first: the higher log-probability, then the lower token (best_tokens' order).
bool ranks_before(const SamplingCandidate& a, const SamplingCandidate& b) {
  return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
}

// A candidate's weight under temperature T against the best log-probability: 0 for −∞ or NaN.
double weight_of(float logprob, double best, double temperature) {
  return logprob > -INFINITY ? std::exp((double(logprob) - best) / temperature) : 0.0;
}

// Whichever of [0, count) the running sum of weight(i) first exceeds u × `total` at; the last
// positive one where rounding leaves it short; -1 where none weighs anything.
template <typename Weight>
int64_t pick(int64_t count, double total, double u, const Weight& weight) {
  const double target = u * total;
  double sum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < count; ++i) {
    const double w = weight(i);
    if (!(w > 0)) continue;
    sum += w;
    last = i;
    if (target < sum) return i;
  }
  return last;
}

}  // namespace

std::string sampling_options_error(const SamplingOptions& o, int64_t beam) {
  if (o.topk < 0) return "sampling_topk cannot be negative (0: the whole vocabulary)";
  if (!(o.topp > 0 && o.topp <= 1)) return "sampling_topp must be in (0, 1]";
  if (!(o.temperature > 0 && o.temperature <= 1e6))
    return "sampling_temperature must be above 0 (and at most 1e6)";
  if (is_sampling(o) && beam != 1)
    return "random sampling (sampling_topk other than 1) takes beam_size 1";
  return "";
}

double sampling_draw(uint64_t seed, uint64_t sentence, uint64_t sample, uint64_t step) {
  const uint64_t h = mix(mix(mix(mix(seed) ^ sentence) ^ sample) ^ step);
  return double(h >> 11) * 0x1.0p-53;
}

int64_t choose_ranked(const SamplingCandidate* ranked, int64_t count, double temperature,
                      double topp, double total_weight, double u) {
  if (count <= 0) return -1;
  const double best = ranked[0].logprob;
  if (!(best > -INFINITY)) return 0;  // every candidate is impossible
  auto weight = [&](int64_t i) { return weight_of(ranked[i].logprob, best, temperature); };
  const bool whole = total_weight == 0;
  if (whole && topp < 1)
    for (int64_t i = 0; i < count; ++i) total_weight += weight(i);
  const double threshold = topp < 1 ? topp * total_weight : INFINITY;
  double kept_weight = 0;
  int64_t kept = 0;
  while (kept < count && kept_weight < threshold) kept_weight += weight(kept++);
  if (kept_weight < threshold && !whole) return -1;  // the nucleus goes past the ranked ones
  return pick(kept, kept_weight, u, weight);
}

int32_t choose_in_row(const float* logprobs, int64_t vocab, const SamplingOptions& options,
                      double u, std::vector<SamplingCandidate>& scratch) {
  float best = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v)
    if (logprobs[v] > best) best = logprobs[v];
  if (!(best > -INFINITY)) return -1;
  const double t = options.temperature;
  auto row_weight = [&](int64_t v) { return weight_of(logprobs[v], best, t); };
  double total = 0;
  if (options.topk == 0) {
    for (int64_t v = 0; v < vocab; ++v) total += row_weight(v);
    if (options.topp >= 1) return int32_t(pick(vocab, total, u, row_weight));
  }
  scratch.clear();
  for (int64_t v = 0; v < vocab; ++v)
    if (logprobs[v] > -INFINITY) scratch.push_back({logprobs[v], int32_t(v)});
  const int64_t candidates = int64_t(scratch.size());
  if (options.topk > 0) {  // the k best are every candidate: rank them all
    const int64_t k = std::min(options.topk, candidates);
    std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), ranks_before);
    return scratch[size_t(choose_ranked(scratch.data(), k, t, options.topp, 0, u))].token;
  }
  // The whole vocabulary's nucleus: rank a few more of the best until it ends among them.
  for (int64_t ranked = std::min<int64_t>(candidates, 64);;
       ranked = std::min(candidates, 4 * ranked)) {
    std::partial_sort(scratch.begin(), scratch.begin() + ranked, scratch.end(), ranks_before);
    const int64_t chosen = ranked == candidates
                               ? choose_ranked(scratch.data(), ranked, t, options.topp, 0, u)
                               : choose_ranked(scratch.data(), ranked, t, options.topp, total, u);
    if (chosen >= 0) return scratch[size_t(chosen)].token;
  }
}

}  // namespace tfm
