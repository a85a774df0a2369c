// Greedy and beam search over the incremental decoder, batched over sentences and beams:
// GEMMs for all live hypotheses of all sentences together, finished sentences dropped from the
// batch. Hypotheses are ranked by log p / lp(Y) with GNMT's lp(Y) = ((5 + |Y|) / 6)^α.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "decode/sampling.h"
#include "model/transformer.h"
#include "tensor/error.h"

namespace tfm {

struct SearchOptions {
  int64_t beam = 4;           // 1: greedy
  double alpha = 0.6;         // length penalty exponent (0: raw log-probability)
  double max_length_a = 1.0;  // generated tokens <= a · source length + b (and <= max_length)
  int64_t max_length_b = 50;
  int64_t max_length = 0;  // hard cap; 0: the model's positions limit
  int64_t min_length = 0;  // eos is not allowed before this many tokens
  int64_t nbest = 1;       // with sampling: how many draws of each sentence
  // Random sampling instead of the best token (sampling.h; beam 1 only): each sentence's nbest
  // draws decode as its live hypotheses.
  SamplingOptions sampling;
  bool attention = false;           // keep cross-attention weights of one decoder layer:
  int64_t attention_layer = -1;     // which (0-based; -1: the last)
  bool attention_per_head = false;  // every head, else the mean over heads
  // The number format of every weight product (encoder, decoder, output projection).
  Precision precision = Precision::kFloat32;
  // The element type of the decoder's cached keys/values (self- and cross-attention).
  CacheFormat cache = CacheFormat::kFloat32;
};

struct Hypothesis {
  std::vector<int32_t> tokens;  // without bos / eos
  double logprob = 0;           // Σ log p of tokens (+ eos when it ended with one)
  double score = 0;             // logprob / lp(length), what ranks hypotheses
  bool finished_with_eos = false;
  // When requested, per step (eos included): [source positions], or [heads · source positions]
  // (head-major) with attention_per_head.
  std::vector<std::vector<float>> attention;
};

// How many hypotheses of one sentence a search holds at once: its beam, or its draws.
inline int64_t hypotheses_per_sentence(const SearchOptions& o) {
  return is_sampling(o.sampling) ? std::max<int64_t>(o.nbest, 1) : o.beam;
}

// How many sentences one search() call takes under a budget of batch_tokens, counted as
// sentences × (longest source + eos) × beam; at least one.
inline int64_t sentences_within_budget(int64_t batch_tokens, int64_t longest_source, int64_t beam) {
  return std::max<int64_t>(1, batch_tokens / ((longest_source + 1) * beam));
}

// The most tokens the search generates for a source of this many tokens (eos excluded): a ·
// source + b, within max_length and the model's positions, at least 1, and never below a forced
// prefix's length.
int64_t generation_limit(const ModelConfig& config, const SearchOptions& options,
                         int64_t source_tokens, int64_t prefix_tokens = 0);

// What search() throws when its `cancelled` callback says so (checked before every step): the
// caller no longer wants the answer (serve: every request of the batch timed out or left).
struct SearchCancelled : Error {
  SearchCancelled() : Error("the search was cancelled") {}
};

// sources: raw ids (no eos); prefixes: forced target starts (empty vectors, or none at all).
// Returns up to nbest hypotheses per sentence, best first. Sampling draws each sentence's tokens
// by its key (sampling_keys[s], or s where none are given: a caller that batches sentences
// passes each one's index in its input, so that its draws do not depend on its batch).
std::vector<std::vector<Hypothesis>> search(const Model& model,
                                            const std::vector<std::vector<int32_t>>& sources,
                                            const std::vector<std::vector<int32_t>>& prefixes,
                                            const SearchOptions& options,
                                            const std::vector<uint64_t>& sampling_keys = {},
                                            const std::function<bool()>& cancelled = {});

}  // namespace tfm
