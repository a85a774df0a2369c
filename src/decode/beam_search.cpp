// Beam search: per step, every live hypothesis of every unfinished sentence is extended by the
// decoder in one call; each sentence keeps its `beam` best continuations by cumulative
// log-probability, moves those ending in eos to its finished list, and is done once it has
// `beam` finished hypotheses or reaches its length limit. Sampling (sampling.h) runs the same
// steps with each sentence's nbest draws as its live hypotheses, each extended by a token drawn
// for it rather than the best. A BeamSearch runs one search() call in named steps:
// plan_lengths, encode, then per step decode_step and select (candidates per sentence, the beam
// kept), and best_finished at the end.
#include "decode/beam_search.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "backend/device_buffer.h"
#include "decode/incremental_decoder.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"

namespace tfm {

namespace {

double length_penalty(double alpha, int64_t length) {
  return alpha == 0 ? 1.0 : std::pow((5.0 + double(length)) / 6.0, alpha);
}

// What one search() call can allocate, in bytes, at most: the encoder's activations, the
// decoder's self-attention cache (layers × K,V × steps × hypotheses × d) and cross-attention
// K,V, every hypothesis' row of logits, the per-sentence candidates, the live
// hypotheses' tokens and histories (twice: this step's and the next) and, if kept, attention.
// Saturates instead of overflowing: a beam of 10⁹ must be refused, not wrap around.
int64_t search_memory_bytes(const ModelConfig& c, int64_t sentences, int64_t src_len, int64_t steps,
                            const SearchOptions& o) {
  auto mul = [](std::initializer_list<int64_t> factors) {
    long double p = 1;
    for (int64_t f : factors) p *= (long double)std::max<int64_t>(f, 0);
    return p;
  };
  const int64_t n = sentences, beam = hypotheses_per_sentence(o);  // n · beam hypotheses at most
  const int64_t d = c.d_model, layers = c.decoder_layers, vocab = c.tgt_vocab_size;
  long double bytes = 0;
  bytes += mul({n, src_len, 12 * d + c.d_ff + c.heads * src_len, 4});               // encoder
  bytes += mul({layers, 2, steps, n, beam, d, 4});                                  // self K, V
  bytes += mul({layers, n, src_len, 2 * d, 4});                                     // cross K, V
  bytes += mul({n, beam, 6 * d + c.d_ff + c.heads * std::max(steps, src_len), 4});  // scratch
  bytes += mul({n, beam, vocab, 4});                                                // log-probs
  if (is_sampling(o.sampling)) bytes += mul({n, beam, vocab, 4});  // their host copy, at most
  bytes += mul({beam, 2 * std::min<int64_t>(vocab, beam), 16});    // candidates
  bytes += mul({n, beam, steps, 4, 4});  // tokens and histories, this step's and the next
  if (o.attention)
    bytes += mul({n, beam, steps, o.attention_per_head ? c.heads : 1, src_len, 4, 2});
  return bytes >= (long double)INT64_MAX ? INT64_MAX : int64_t(bytes);
}

// One search() call. Hypotheses live in `live_`, grouped by sentence in ascending sentence
// order (the decoder's row order); a step turns them into the next step's.
class BeamSearch {
 public:
  BeamSearch(const Model& model, const std::vector<std::vector<int32_t>>& sources,
             const std::vector<std::vector<int32_t>>& prefixes, const SearchOptions& options,
             const std::vector<uint64_t>& sampling_keys, const std::function<bool()>& cancelled)
      : model_(model),
        c_(model.config()),
        sources_(sources),
        prefixes_(prefixes),
        o_(options),
        sentences_(int64_t(sources.size())),
        sampling_(is_sampling(options.sampling)),
        width_(hypotheses_per_sentence(options)),
        sampling_keys_(sampling_keys),
        cancelled_(cancelled) {
    if (o_.beam < 1) throw Error("the beam size must be at least 1");
    if (const std::string error = sampling_options_error(o_.sampling, o_.beam); !error.empty())
      throw Error(error);
    if (!sampling_keys_.empty() && sampling_keys_.size() != sources_.size())
      throw Error("one sampling key per source sentence is needed");
    if (o_.attention_layer >= c_.decoder_layers)
      throw Error("attention layer " + std::to_string(o_.attention_layer) +
                  " does not exist (the decoder has " + std::to_string(c_.decoder_layers) +
                  " layers)");
    if (!prefixes_.empty() && prefixes_.size() != sources_.size())
      throw Error("one prefix per source sentence is needed");
  }

  std::vector<std::vector<Hypothesis>> run() {
    batch_ = make_batch(c_, sources_, std::vector<std::vector<int32_t>>(sources_.size()));
    plan_lengths();
    encode();
    IncrementalDecoder decoder(model_, memory_.data(), sentences_, batch_.src_len,
                               batch_.src_lengths.data(), longest_ + 1, sentences_ * width_,
                               o_.precision, o_.cache);
    live_.resize(size_t(sentences_));
    live_sentence_.resize(size_t(sentences_));
    std::iota(live_sentence_.begin(), live_sentence_.end(), 0);
    decoder.start(live_sentence_);
    finished_.resize(size_t(sentences_));
    for (int64_t t = 0; !live_.empty(); ++t) {
      if (cancelled_ && cancelled_()) throw SearchCancelled();
      decode_step(decoder);
      select(t);
      if (!live_.empty()) decoder.reorder(parents_);
    }
    return best_finished();
  }

 private:
  struct Live {
    std::vector<int32_t> tokens;
    double logprob = 0;
    std::vector<std::vector<float>> attention;
    int64_t sample = 0;  // which of its sentence's draws, when sampling
  };
  struct Candidate {  // a continuation: cumulative log-prob, the hypothesis it extends, its token
    double logprob;
    int64_t hypothesis;
    int32_t token;
    int64_t sample = 0;  // the draw it continues, when sampling
  };

  // Length limits per sentence (generated tokens, eos excluded), prefix lengths, and the
  // memory the whole search may take, checked before anything is allocated.
  void plan_lengths() {
    max_len_.assign(size_t(sentences_), 0);
    prefix_len_.assign(size_t(sentences_), 0);
    for (int64_t s = 0; s < sentences_; ++s) {
      if (!prefixes_.empty()) {
        prefix_len_[size_t(s)] = int64_t(prefixes_[size_t(s)].size());
        for (int32_t id : prefixes_[size_t(s)])
          if (id < 0 || id >= c_.tgt_vocab_size)
            throw Error("prefix token id " + std::to_string(id) +
                        " is outside the target vocabulary");
      }
      const int64_t limit =
          generation_limit(c_, o_, int64_t(sources_[size_t(s)].size()), prefix_len_[size_t(s)]);
      max_len_[size_t(s)] = limit;
      longest_ = std::max(longest_, limit);
    }
    check_memory(search_memory_bytes(c_, sentences_, batch_.src_len, longest_ + 1, o_),
                 "decoding " + std::to_string(sentences_) + " sentence" +
                     (sentences_ > 1 ? "s" : "") + " of " + std::to_string(batch_.src_len) +
                     " tokens with " +
                     (sampling_ ? std::to_string(width_) + " draws each"
                                : "beam " + std::to_string(width_)) +
                     " (up to " + std::to_string(longest_) + " steps)");
  }

  // The encoder, once for the batch. Only its output outlives it: the layer buffers are freed
  // before the decoder allocates its caches, which then reuse that memory.
  void encode() {
    StackCache cache;
    std::shared_ptr<const PreparedWeights> hold;
    encoder_forward(model_, model_.sequence_weights(o_.precision, hold), batch_, {}, cache);
    memory_ = std::move(cache.memory);
  }

  // The decoder's logits (and, if kept, cross-attention) for every live hypothesis' next token.
  void decode_step(IncrementalDecoder& decoder) {
    const int64_t n = int64_t(live_.size());
    inputs_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i)
      inputs_[size_t(i)] =
          live_[size_t(i)].tokens.empty() ? int32_t(c_.bos_id) : live_[size_t(i)].tokens.back();
    const int64_t rows = decoder.step_rows();  // n, or a few more where steps are recorded
    float* logits = ensure_size(model_.backend(), logits_, rows * c_.tgt_vocab_size);
    float* attention = o_.attention
                           ? ensure_size(model_.backend(), attention_, rows * attention_width())
                           : nullptr;
    decoder.step(inputs_.data(), logits, attention, o_.attention_layer, o_.attention_per_head);
    if (attention) {
      host_attention_.resize(size_t(n * attention_width()));
      model_.backend().copy_to_host(attention, n * attention_width() * int64_t(sizeof(float)),
                                    host_attention_.data());
    }
  }

  int64_t attention_width() const {  // [heads or 1, S] per hypothesis
    return (o_.attention_per_head ? c_.heads : 1) * batch_.src_len;
  }

  // Step t's choice: each sentence's live hypotheses [begin, end) give their candidates, and
  // the best of those become the sentence's next live hypotheses or finish it.
  void select(int64_t t) {
    const int64_t n = int64_t(live_.size());
    next_live_.clear();
    parents_.clear();
    next_sentence_.clear();
    rank_tokens(t);
    // A row's log Σ exp is finite whenever its logits are; NaN or inf there would make every
    // candidate impossible and end the sentence empty, as if that were a translation.
    for (int64_t h = 0; h < n; ++h)
      if (!std::isfinite(log_sum(h)))
        throw Error("the model's output at step " + std::to_string(t + 1) +
                    " is not finite: its activations overflow float32 or its weights hold NaN, "
                    "so it cannot translate");
    for (int64_t begin = 0; begin < n;) {
      const int32_t s = live_sentence_[size_t(begin)];
      int64_t end = begin;
      while (end < n && live_sentence_[size_t(end)] == s) ++end;
      collect_candidates(s, begin, end, t);
      keep_best(s, t);
      begin = end;
    }
    std::swap(live_, next_live_);
    std::swap(live_sentence_, next_sentence_);
  }

  // Each live hypothesis' best continuations (the arg max for greedy, else its best 2·beam
  // tokens — enough to fill the beam even if beam of them end the sentence), ranked by the
  // backend where the logits are, which gives them their log-probabilities in the same pass;
  // only these candidates and each hypothesis' log Σ exp come back to the host. eos counts as
  // impossible before min_length.
  void rank_tokens(int64_t t) {
    const Backend& backend = model_.backend();
    const int64_t n = int64_t(live_.size()), vocab = c_.tgt_vocab_size;
    const int32_t banned = t >= o_.min_length ? -1 : int32_t(c_.eos_id);
    if (sampling_ && !ranks_samples_on_backend()) return copy_rows_back(n, banned);
    keep_ = sampling_      ? std::min(vocab, o_.sampling.topk)
            : o_.beam == 1 ? 1
                           : std::min<int64_t>(vocab, 2 * o_.beam);
    ranked_count_ = n * keep_;
    const int64_t words = 2 * ranked_count_ + n;
    int32_t* ranked = ensure_size(backend, best_ranked_, words);  // [2 · live · keep_ + live]
    float* values = reinterpret_cast<float*>(ranked);             // [live, keep_]
    int32_t* tokens = ranked + ranked_count_;                     // [live, keep_]
    float* log_sums = reinterpret_cast<float*>(tokens + ranked_count_);  // [live]
    backend.best_tokens(logits_.data(), n, vocab, keep_, banned, values, tokens, log_sums);
    host_ranked_.resize(size_t(words));  // one copy back (one wait) for all three
    backend.copy_to_host(ranked, words * int64_t(sizeof(int32_t)), host_ranked_.data());
  }
  // Sampling from the k best where the backend ranks them (k ≤ kBackendSamplingTopk): only
  // they come back. Else (the whole vocabulary, or a larger k) the rows themselves do.
  bool ranks_samples_on_backend() const {
    return o_.sampling.topk > 0 && o_.sampling.topk <= kBackendSamplingTopk;
  }
  static constexpr int64_t kBackendSamplingTopk = 64;

  // The live hypotheses' logits, copied back whole for sampling over whole rows, the banned
  // token made impossible there, and each row's log Σ exp (over every entry, as best_tokens'
  // log_sums) in host_log_sums_.
  void copy_rows_back(int64_t n, int32_t banned) {
    const int64_t vocab = c_.tgt_vocab_size;
    host_rows_.resize(size_t(n * vocab));
    model_.backend().copy_to_host(logits_.data(), n * vocab * int64_t(sizeof(float)),
                                  host_rows_.data());
    host_log_sums_.resize(size_t(n));
    for (int64_t h = 0; h < n; ++h) {
      float* row = host_rows_.data() + h * vocab;
      double most = -INFINITY, sum = 0;
      for (int64_t v = 0; v < vocab; ++v) most = std::max(most, double(row[v]));
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - most);
      host_log_sums_[size_t(h)] = most + std::log(sum);
      if (banned >= 0) row[banned] = -INFINITY;
    }
  }

  // Hypothesis h's token for draw `sample` of sentence s at step t, and its log-prob: from its
  // ranked candidates, or from its whole row. false where every token is impossible.
  bool draw(int32_t s, int64_t h, int64_t sample, int64_t t, Candidate& out) {
    const uint64_t key = sampling_keys_.empty() ? uint64_t(s) : sampling_keys_[size_t(s)];
    const double u = sampling_draw(o_.sampling.seed, key, uint64_t(sample), uint64_t(t));
    const double base = live_[size_t(h)].logprob;
    if (ranks_samples_on_backend()) {
      ranked_scratch_.clear();
      for (int64_t r = h * keep_; r < (h + 1) * keep_; ++r)
        ranked_scratch_.push_back({ranked_logprob(r), ranked_token(r)});
      const int64_t chosen = choose_ranked(ranked_scratch_.data(), keep_, o_.sampling.temperature,
                                           o_.sampling.topp, 0, u);
      if (chosen < 0 || !(ranked_scratch_[size_t(chosen)].logprob > -INFINITY)) return false;
      out = {base + ranked_scratch_[size_t(chosen)].logprob, h,
             ranked_scratch_[size_t(chosen)].token, sample};
      return true;
    }
    const int64_t vocab = c_.tgt_vocab_size;
    const float* row = host_rows_.data() + h * vocab;
    const int32_t token = choose_in_row(row, vocab, o_.sampling, u, ranked_scratch_);
    if (token < 0) return false;
    out = {base + (double(row[token]) - host_log_sums_[size_t(h)]), h, token, sample};
    return true;
  }

  // Candidate r of rank_tokens' [live, keep_]: its log-prob and its token.
  float ranked_logprob(int64_t r) const { return std::bit_cast<float>(host_ranked_[size_t(r)]); }
  int32_t ranked_token(int64_t r) const { return host_ranked_[size_t(ranked_count_ + r)]; }
  // Hypothesis h's log Σ exp of its logits (its log-softmax's normaliser).
  double log_sum(int64_t h) const {
    if (sampling_ && !ranks_samples_on_backend()) return host_log_sums_[size_t(h)];
    return std::bit_cast<float>(host_ranked_[size_t(2 * ranked_count_ + h)]);
  }

  // candidates_: every continuation worth considering of hypotheses [begin, end) of sentence s,
  // best first (a forced prefix token, else each hypothesis' best tokens from rank_tokens).
  void collect_candidates(int32_t s, int64_t begin, int64_t end, int64_t t) {
    const int64_t vocab = c_.tgt_vocab_size;
    candidates_.clear();
    const bool forced = t < prefix_len_[size_t(s)];
    for (int64_t h = begin; h < end; ++h) {
      const double base = live_[size_t(h)].logprob;
      if (forced) {
        const int32_t token = prefixes_[size_t(s)][size_t(t)];
        float logit;  // its log-prob: the logit less the row's log Σ exp (log_softmax's)
        model_.backend().copy_to_host(logits_.data() + h * vocab + token, sizeof(float), &logit);
        candidates_.push_back({base + (logit - log_sum(h)), h, token, live_[size_t(h)].sample});
        continue;
      }
      if (sampling_) {
        // The sentence's first free step fans its one hypothesis out into its draws; after it
        // each draw continues itself.
        const bool fan_out = t == prefix_len_[size_t(s)];
        Candidate drawn;
        for (int64_t sample = fan_out ? 0 : live_[size_t(h)].sample;
             sample < (fan_out ? width_ : live_[size_t(h)].sample + 1); ++sample)
          if (draw(s, h, sample, t, drawn)) candidates_.push_back(drawn);
        continue;
      }
      for (int64_t r = h * keep_; r < (h + 1) * keep_; ++r)
        if (ranked_logprob(r) > -INFINITY)
          candidates_.push_back({base + ranked_logprob(r), h, ranked_token(r)});
    }
    std::stable_sort(candidates_.begin(), candidates_.end(),
                     [](const Candidate& a, const Candidate& b) { return a.logprob > b.logprob; });
  }

  // Walks sentence s's candidates best first: one ending in eos (not forced) or at the length
  // limit finishes a hypothesis, the others become live, until the beam is full. A sentence
  // with `beam` finished hypotheses stops and its live ones are dropped.
  void keep_best(int32_t s, int64_t t) {
    const bool forced = t < prefix_len_[size_t(s)];
    std::vector<Hypothesis>& finished = finished_[size_t(s)];
    int64_t kept = 0;
    for (const Candidate& candidate : candidates_) {
      if (kept >= width_ || int64_t(finished.size()) >= width_) break;
      const Live& parent = live_[size_t(candidate.hypothesis)];
      Live extended;
      extended.tokens = parent.tokens;
      extended.logprob = candidate.logprob;
      extended.sample = candidate.sample;
      if (o_.attention) {
        extended.attention = parent.attention;
        extended.attention.push_back(attention_row(s, candidate.hypothesis));
      }
      if (candidate.token == c_.eos_id && !forced) {
        finish(s, std::move(extended), true, t + 1);
        continue;
      }
      extended.tokens.push_back(candidate.token);
      if (t + 1 >= max_len_[size_t(s)] && t + 1 >= prefix_len_[size_t(s)]) {
        finish(s, std::move(extended), false, t + 1);  // length limit: ends without eos
        continue;
      }
      next_live_.push_back(std::move(extended));
      parents_.push_back(int32_t(candidate.hypothesis));
      next_sentence_.push_back(s);
      ++kept;
    }
    if (int64_t(finished.size()) >= width_) {
      while (!next_sentence_.empty() && next_sentence_.back() == s) {
        next_sentence_.pop_back();
        parents_.pop_back();
        next_live_.pop_back();
      }
    }
  }

  // This step's attention of hypothesis h over sentence s's real source positions, per head
  // (head-major) or averaged: [heads or 1, source length].
  std::vector<float> attention_row(int32_t s, int64_t h) const {
    const int64_t src_len = batch_.src_len,
                  heads = attention_width() / std::max<int64_t>(src_len, 1);
    const float* a = host_attention_.data() + h * attention_width();
    std::vector<float> row;
    for (int64_t head = 0; head < heads; ++head)
      row.insert(row.end(), a + head * src_len, a + head * src_len + batch_.src_lengths[size_t(s)]);
    return row;
  }

  void finish(int64_t s, Live&& h, bool with_eos, int64_t length) {
    Hypothesis out;
    out.tokens = std::move(h.tokens);
    out.logprob = h.logprob;
    out.score = h.logprob / length_penalty(o_.alpha, length);
    out.finished_with_eos = with_eos;
    out.attention = std::move(h.attention);
    finished_[size_t(s)].push_back(std::move(out));
  }

  // Each sentence's nbest finished hypotheses by score, best first (an empty one when every
  // continuation was impossible).
  std::vector<std::vector<Hypothesis>> best_finished() {
    const int64_t nbest = std::min(std::max<int64_t>(o_.nbest, 1), width_);
    std::vector<std::vector<Hypothesis>> results(static_cast<size_t>(sentences_));
    for (int64_t s = 0; s < sentences_; ++s) {
      std::vector<Hypothesis>& f = finished_[size_t(s)];
      if (f.empty()) f.emplace_back();
      std::stable_sort(f.begin(), f.end(),
                       [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
      if (int64_t(f.size()) > nbest) f.resize(size_t(nbest));
      results[size_t(s)] = std::move(f);
    }
    return results;
  }

  const Model& model_;
  const ModelConfig& c_;
  const std::vector<std::vector<int32_t>>& sources_;
  const std::vector<std::vector<int32_t>>& prefixes_;  // empty, or one (maybe empty) per source
  const SearchOptions& o_;
  const int64_t sentences_;
  const bool sampling_;                                 // drawing tokens (o_.sampling) instead
  const int64_t width_;                                 // hypotheses_per_sentence: beam, or draws
  const std::vector<uint64_t>& sampling_keys_;          // [sentences] or empty: s
  const std::function<bool()>& cancelled_;              // checked before every step; may be empty
  TokenBatch batch_;                                    // the sources, padded
  std::vector<int64_t> max_len_, prefix_len_;           // [sentences]
  int64_t longest_ = 0;                                 // the largest max_len_
  DeviceBuffer<float> memory_;                          // [sentences, S, D] the encoder's output
  std::vector<Live> live_, next_live_;                  // this step's hypotheses, the next step's
  std::vector<int32_t> live_sentence_, next_sentence_;  // the sentence of each
  std::vector<int32_t> parents_;                   // [next live] the live hypothesis each extends
  std::vector<std::vector<Hypothesis>> finished_;  // [sentences]
  std::vector<int32_t> inputs_;  // [live] the token each hypothesis feeds the decoder
  // In the backend's memory, for the decoder's step_rows() (the live hypotheses, or a few more):
  DeviceBuffer<float> logits_;         // [rows, V]
  DeviceBuffer<float> attention_;      // [rows, heads or 1, S]
  std::vector<float> host_attention_;  // [live, heads or 1, S] its host copy
  std::vector<Candidate> candidates_;  // one sentence's, best first
  int64_t keep_ = 1;                   // continuations ranked per hypothesis
  // [2 · live · keep_ + live]: each hypothesis' best log-probs (float bits), best first, then
  // their tokens, then each hypothesis' log Σ exp (float bits): one buffer, so that one copy
  // brings all back
  DeviceBuffer<int32_t> best_ranked_;
  std::vector<int32_t> host_ranked_;  // its host copy
  int64_t ranked_count_ = 0;          // live · keep_ of the last rank_tokens
  // Sampling over whole rows: the live hypotheses' logits and their log Σ exp on the host.
  std::vector<float> host_rows_;                   // [live, V]
  std::vector<double> host_log_sums_;              // [live]
  std::vector<SamplingCandidate> ranked_scratch_;  // one hypothesis' candidates, best first
};

}  // namespace

int64_t generation_limit(const ModelConfig& config, const SearchOptions& options,
                         int64_t source_tokens, int64_t prefix_tokens) {
  const int64_t max_tokens = max_target_tokens(config);
  int64_t limit =
      int64_t(std::floor(options.max_length_a * double(source_tokens))) + options.max_length_b;
  if (options.max_length > 0) limit = std::min(limit, options.max_length);
  limit = std::max<int64_t>(1, std::min(limit, max_tokens));
  return std::max(limit, std::min(prefix_tokens, max_tokens));
}

std::vector<std::vector<Hypothesis>> search(const Model& model,
                                            const std::vector<std::vector<int32_t>>& sources,
                                            const std::vector<std::vector<int32_t>>& prefixes,
                                            const SearchOptions& options,
                                            const std::vector<uint64_t>& sampling_keys,
                                            const std::function<bool()>& cancelled) {
  if (sources.empty()) return {};
  return BeamSearch(model, sources, prefixes, options, sampling_keys, cancelled).run();
}

}  // namespace tfm
