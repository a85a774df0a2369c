// Beam search: per step, every live hypothesis of every unfinished sentence is extended by the
// decoder in one call; each sentence keeps its `beam` best continuations by cumulative
// log-probability, moves those ending in eos to its finished list, and is done once it has
// `beam` finished hypotheses or reaches its length limit.
#include "decode/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "decode/incremental_decoder.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"

namespace tfm {

namespace {

double length_penalty(double alpha, int64_t length) {
  return alpha == 0 ? 1.0 : std::pow((5.0 + double(length)) / 6.0, alpha);
}

struct Live {
  std::vector<int32_t> tokens;
  double logprob = 0;
  std::vector<std::vector<float>> attention;
};

// What one search() call can allocate, in bytes, at most: the encoder's activations, the
// decoder's self-attention cache (layers × K,V × steps × hypotheses × d) and cross-attention
// K,V, every hypothesis' row of log-probabilities, the per-sentence candidates, the live
// hypotheses' tokens and histories (twice: this step's and the next) and, if kept, attention.
// Saturates instead of overflowing: a beam of 10⁹ must be refused, not wrap around.
int64_t search_memory_bytes(const ModelConfig& c, int64_t sentences, int64_t src_len, int64_t steps,
                            const SearchOptions& o) {
  auto mul = [](std::initializer_list<int64_t> factors) {
    long double p = 1;
    for (int64_t f : factors) p *= (long double)std::max<int64_t>(f, 0);
    return p;
  };
  const int64_t n = sentences, beam = o.beam;  // n · beam hypotheses at most
  const int64_t d = c.d_model, layers = c.decoder_layers, vocab = c.tgt_vocab_size;
  long double bytes = 0;
  bytes += mul({n, src_len, 12 * d + c.d_ff + c.heads * src_len, 4});               // encoder
  bytes += mul({layers, 2, steps, n, beam, d, 4});                                  // self K, V
  bytes += mul({layers, n, src_len, 2 * d, 4});                                     // cross K, V
  bytes += mul({n, beam, 6 * d + c.d_ff + c.heads * std::max(steps, src_len), 4});  // scratch
  bytes += mul({n, beam, vocab, 4});                                                // log-probs
  bytes += mul({beam, 2 * std::min<int64_t>(vocab, beam), 16});                     // candidates
  bytes += mul({n, beam, steps, 4, 4});  // tokens and histories, this step's and the next
  if (o.attention)
    bytes += mul({n, beam, steps, o.attention_per_head ? c.heads : 1, src_len, 4, 2});
  return bytes >= (long double)INT64_MAX ? INT64_MAX : int64_t(bytes);
}

}  // namespace

std::vector<std::vector<Hypothesis>> search(const Model& model,
                                            const std::vector<std::vector<int32_t>>& sources,
                                            const std::vector<std::vector<int32_t>>& prefixes,
                                            const SearchOptions& o) {
  const ModelConfig& c = model.config();
  const int64_t sentences = int64_t(sources.size());
  std::vector<std::vector<Hypothesis>> results(sources.size());
  if (sentences == 0) return results;
  if (o.beam < 1) throw Error("the beam size must be at least 1");
  if (o.attention_layer >= c.decoder_layers)
    throw Error("attention layer " + std::to_string(o.attention_layer) +
                " does not exist (the decoder has " + std::to_string(c.decoder_layers) +
                " layers)");
  if (!prefixes.empty() && prefixes.size() != sources.size())
    throw Error("one prefix per source sentence is needed");
  const int64_t beam = o.beam, vocab = c.tgt_vocab_size;
  const int64_t nbest = std::min(std::max<int64_t>(o.nbest, 1), beam);

  const TokenBatch batch =
      make_batch(c, sources, std::vector<std::vector<int32_t>>(sources.size()));

  // Length limits per sentence (generated tokens, eos excluded).
  const int64_t max_tokens = max_target_tokens(c);
  std::vector<int64_t> max_len(static_cast<size_t>(sentences)),
      prefix_len(static_cast<size_t>(sentences), 0);
  int64_t longest = 0;
  for (int64_t s = 0; s < sentences; ++s) {
    int64_t limit =
        int64_t(std::floor(o.max_length_a * double(sources[size_t(s)].size()))) + o.max_length_b;
    if (o.max_length > 0) limit = std::min(limit, o.max_length);
    limit = std::max<int64_t>(1, std::min(limit, max_tokens));
    if (!prefixes.empty()) {
      prefix_len[size_t(s)] = int64_t(prefixes[size_t(s)].size());
      for (int32_t id : prefixes[size_t(s)])
        if (id < 0 || id >= vocab)
          throw Error("prefix token id " + std::to_string(id) +
                      " is outside the target vocabulary");
      limit = std::max(limit, std::min(prefix_len[size_t(s)], max_tokens));
    }
    max_len[size_t(s)] = limit;
    longest = std::max(longest, limit);
  }
  check_memory(search_memory_bytes(c, sentences, batch.src_len, longest + 1, o),
               "decoding " + std::to_string(sentences) + " sentence" + (sentences > 1 ? "s" : "") +
                   " of " + std::to_string(batch.src_len) + " tokens with beam " +
                   std::to_string(beam) + " (up to " + std::to_string(longest) + " steps)");

  // Encoder, once for the batch. Only its output outlives it: the layer buffers are freed
  // before the decoder allocates its caches, which then reuse that memory.
  DeviceBuffer<float> memory;  // [sentences, S, D]
  {
    StackCache cache;
    std::shared_ptr<const PreparedWeights> hold;
    encoder_forward(model, model.sequence_weights(o.precision, hold), batch, {}, cache);
    memory = std::move(cache.memory);
  }
  IncrementalDecoder decoder(model, memory.data(), sentences, batch.src_len,
                             batch.src_lengths.data(), longest + 1, sentences * beam, o.precision);

  // Live hypotheses, grouped by sentence in ascending sentence order.
  std::vector<Live> live(static_cast<size_t>(sentences));
  std::vector<int32_t> live_sentence(static_cast<size_t>(sentences));
  std::iota(live_sentence.begin(), live_sentence.end(), 0);
  decoder.start(live_sentence);
  std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(sentences));
  std::vector<float> logprobs, attention;
  std::vector<int32_t> token_order;  // [V] scratch for the top-k selection
  std::vector<int32_t> inputs;

  auto finish = [&](int64_t s, Live&& h, bool with_eos, int64_t length) {
    Hypothesis out;
    out.tokens = std::move(h.tokens);
    out.logprob = h.logprob;
    out.score = h.logprob / length_penalty(o.alpha, length);
    out.finished_with_eos = with_eos;
    out.attention = std::move(h.attention);
    finished[size_t(s)].push_back(std::move(out));
  };

  for (int64_t t = 0; !live.empty(); ++t) {
    const int64_t n = int64_t(live.size());
    inputs.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i)
      inputs[size_t(i)] =
          live[size_t(i)].tokens.empty() ? int32_t(c.bos_id) : live[size_t(i)].tokens.back();
    logprobs.resize(size_t(n * vocab));
    const int64_t attention_width = (o.attention_per_head ? c.heads : 1) * batch.src_len;
    if (o.attention) attention.resize(size_t(n * attention_width));
    decoder.step(inputs.data(), logprobs.data(), o.attention ? attention.data() : nullptr,
                 o.attention_layer, o.attention_per_head);

    std::vector<Live> next_live;
    std::vector<int32_t> parents, next_sentence;
    for (int64_t begin = 0; begin < n;) {
      const int32_t s = live_sentence[size_t(begin)];
      int64_t end = begin;
      while (end < n && live_sentence[size_t(end)] == s) ++end;
      // Candidates (cumulative log-prob, hypothesis, token), best first.
      struct Candidate {
        double logprob;
        int64_t hypothesis;
        int32_t token;
      };
      std::vector<Candidate> candidates;
      const bool forced = t < prefix_len[size_t(s)];
      for (int64_t h = begin; h < end; ++h) {
        const float* row = logprobs.data() + h * vocab;
        const double base = live[size_t(h)].logprob;
        if (forced) {
          const int32_t token = prefixes[size_t(s)][size_t(t)];
          candidates.push_back({base + row[token], h, token});
          continue;
        }
        const bool eos_allowed = t >= o.min_length;
        auto value = [&](int32_t id) {
          return id == c.eos_id && !eos_allowed ? -INFINITY : row[id];
        };
        if (beam == 1) {  // greedy: the arg max is all that is needed
          int32_t best = 0;
          for (int32_t id = 1; id < int32_t(vocab); ++id)
            if (value(id) > value(best)) best = id;
          candidates.push_back({base + value(best), h, best});
          continue;
        }
        // The best 2·beam tokens of this hypothesis are enough to fill the beam even if
        // beam of them end the sentence.
        const int64_t keep = std::min<int64_t>(vocab, 2 * beam);
        std::vector<int32_t>& order = token_order;
        order.resize(static_cast<size_t>(vocab));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                          [&](int32_t a, int32_t b) {
                            return value(a) > value(b) || (value(a) == value(b) && a < b);
                          });
        for (int64_t r = 0; r < keep; ++r)
          if (value(order[size_t(r)]) > -INFINITY)
            candidates.push_back({base + value(order[size_t(r)]), h, order[size_t(r)]});
      }
      std::stable_sort(
          candidates.begin(), candidates.end(),
          [](const Candidate& a, const Candidate& b) { return a.logprob > b.logprob; });
      int64_t kept = 0;
      for (const Candidate& cand : candidates) {
        if (kept >= beam || int64_t(finished[size_t(s)].size()) >= beam) break;
        Live extended;
        extended.tokens = live[size_t(cand.hypothesis)].tokens;
        extended.logprob = cand.logprob;
        if (o.attention) {
          extended.attention = live[size_t(cand.hypothesis)].attention;
          const float* a = attention.data() + cand.hypothesis * attention_width;
          std::vector<float> row;
          for (int64_t head = 0; head < attention_width / std::max<int64_t>(batch.src_len, 1);
               ++head)
            row.insert(row.end(), a + head * batch.src_len,
                       a + head * batch.src_len + batch.src_lengths[size_t(s)]);
          extended.attention.push_back(std::move(row));
        }
        if (cand.token == c.eos_id && !forced) {
          finish(s, std::move(extended), true, t + 1);
          continue;
        }
        extended.tokens.push_back(cand.token);
        if (t + 1 >= max_len[size_t(s)] && t + 1 >= prefix_len[size_t(s)]) {
          finish(s, std::move(extended), false, t + 1);  // length limit: ends without eos
          continue;
        }
        next_live.push_back(std::move(extended));
        parents.push_back(int32_t(cand.hypothesis));
        next_sentence.push_back(s);
        ++kept;
      }
      // A sentence with enough finished hypotheses stops; its live ones are dropped.
      if (int64_t(finished[size_t(s)].size()) >= beam) {
        while (!next_sentence.empty() && next_sentence.back() == s) {
          next_sentence.pop_back();
          parents.pop_back();
          next_live.pop_back();
        }
      }
      begin = end;
    }
    live = std::move(next_live);
    live_sentence = std::move(next_sentence);
    if (!live.empty()) decoder.reorder(parents);
  }

  for (int64_t s = 0; s < sentences; ++s) {
    auto& f = finished[size_t(s)];
    if (f.empty()) f.emplace_back();  // every continuation was impossible: empty output
    std::stable_sort(f.begin(), f.end(),
                     [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
    if (int64_t(f.size()) > nbest) f.resize(size_t(nbest));
    results[size_t(s)] = std::move(f);
  }
  return results;
}

}  // namespace tfm
