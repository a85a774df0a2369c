// Random sampling (decode/sampling.h): the draws are uniform and a function of their keys, a
// choice follows the tempered, truncated distribution it is given, and a sampled search of
// CTranslate2's transliteration model draws its first tokens as often as the model's own
// first-step probabilities (read from an exhaustive beam over that step) say, on both ways of
// choosing (the backend's k best, whole rows on the host), repeatably for a seed and whatever
// batch a sentence is in.
#include "decode/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "decode/beam_search.h"
#include "io/ctranslate2.h"
#include "tensor/error.h"
#include "text/vocabulary.h"

namespace tfm {
namespace {

// Each of `expected` (probabilities summing to 1 over the outcomes that may occur) seen within
// 5 standard deviations of its binomial count among `draws`, and nothing else seen.
void expect_frequencies(const std::map<int32_t, int64_t>& seen,
                        const std::map<int32_t, double>& expected, int64_t draws,
                        const std::string& what) {
  for (const auto& [outcome, count] : seen)
    EXPECT_TRUE(expected.count(outcome) && expected.at(outcome) > 0)
        << what << ": drew " << outcome << ", which has no probability";
  for (const auto& [outcome, p] : expected) {
    const double mean = p * double(draws), sd = std::sqrt(double(draws) * p * (1 - p));
    const int64_t count = seen.count(outcome) ? seen.at(outcome) : 0;
    EXPECT_LE(std::abs(double(count) - mean), 5 * sd + 1)
        << what << ": outcome " << outcome << " drawn " << count << " times, expected " << mean;
  }
}

// The distribution a draw follows: softmax(logprob / T) over the candidates, then the fewest
// best reaching topp of it, renormalised (CTranslate2's and Holtzman et al.'s definitions),
// computed directly from the definition.
std::map<int32_t, double> tempered_nucleus(std::vector<SamplingCandidate> c, double temperature,
                                           double topp) {
  std::sort(c.begin(), c.end(), [](const SamplingCandidate& a, const SamplingCandidate& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
  });
  std::vector<double> q;
  double total = 0;
  for (const SamplingCandidate& x : c) {
    q.push_back(std::isfinite(x.logprob) ? std::exp(double(x.logprob) / temperature) : 0.0);
    total += q.back();
  }
  std::map<int32_t, double> out;
  double kept = 0;
  for (size_t i = 0; i < c.size() && kept < topp * total * (1 - 1e-12); ++i) {
    out[c[i].token] = q[i];
    kept += q[i];
  }
  for (auto& [token, p] : out) p /= kept;
  return out;
}

TEST(Sampling, DrawsAreUniformAndAFunctionOfEveryKey) {
  double sum = 0;
  int64_t low = 0;
  const int64_t n = 200000;
  for (int64_t i = 0; i < n; ++i) {
    const double u = sampling_draw(42, uint64_t(i) / 100, uint64_t(i) % 10, uint64_t(i) % 100 / 10);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    low += u < 0.25;
  }
  EXPECT_NEAR(sum / double(n), 0.5, 0.005);
  EXPECT_NEAR(double(low) / double(n), 0.25, 0.005);
  const double u = sampling_draw(1, 2, 3, 4);
  EXPECT_EQ(u, sampling_draw(1, 2, 3, 4));
  EXPECT_NE(u, sampling_draw(0, 2, 3, 4));
  EXPECT_NE(u, sampling_draw(1, 0, 3, 4));
  EXPECT_NE(u, sampling_draw(1, 2, 0, 4));
  EXPECT_NE(u, sampling_draw(1, 2, 3, 0));
  EXPECT_NE(sampling_draw(1, 2, 3, 4), sampling_draw(1, 3, 2, 4)) << "keys are not symmetric";
}

TEST(Sampling, ChoicesFollowTheTemperedNucleus) {
  // A row of 9 entries: six possible tokens, two impossible (−∞, NaN) and one tie.
  const std::vector<float> row = {std::log(0.30f), -INFINITY,       std::log(0.25f),
                                  std::log(0.15f), std::log(0.15f), NAN,
                                  std::log(0.10f), std::log(0.04f), std::log(0.01f)};
  std::vector<SamplingCandidate> candidates;
  for (int32_t v = 0; v < int32_t(row.size()); ++v)
    if (std::isfinite(row[size_t(v)])) candidates.push_back({row[size_t(v)], v});
  std::vector<SamplingCandidate> ranked = candidates, scratch;
  std::sort(ranked.begin(), ranked.end(),
            [](const SamplingCandidate& a, const SamplingCandidate& b) {
              return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
            });
  const int64_t draws = 40000;
  for (const double temperature : {1.0, 0.5, 2.0})
    for (const double topp : {1.0, 0.65, 0.35})
      for (const int64_t topk : {0, 3}) {
        const std::string what = "T " + std::to_string(temperature) + ", topp " +
                                 std::to_string(topp) + ", topk " + std::to_string(topk);
        const SamplingOptions o{topk, topp, temperature, 7};
        std::vector<SamplingCandidate> pool =
            topk ? std::vector<SamplingCandidate>(ranked.begin(), ranked.begin() + topk)
                 : candidates;
        const std::map<int32_t, double> expected = tempered_nucleus(pool, temperature, topp);
        std::map<int32_t, int64_t> in_row, among_ranked;
        const int64_t count = topk ? topk : int64_t(ranked.size());
        for (int64_t i = 0; i < draws; ++i) {
          const double u = sampling_draw(o.seed, uint64_t(i), 0, 0);
          ++in_row[choose_in_row(row.data(), int64_t(row.size()), o, u, scratch)];
          const int64_t chosen = choose_ranked(ranked.data(), count, temperature, topp, 0, u);
          ASSERT_GE(chosen, 0);
          ++among_ranked[ranked[size_t(chosen)].token];
        }
        expect_frequencies(in_row, expected, draws, what + ", whole row");
        expect_frequencies(among_ranked, expected, draws, what + ", ranked");
      }
}

TEST(Sampling, ARankedPrefixTooShortForTheNucleusSaysSo) {
  const std::vector<SamplingCandidate> ranked = {{std::log(0.5f), 0}, {std::log(0.3f), 1}};
  // Of a distribution whose total weight (against the best, 0.5) is 2: these two hold 0.8 of it.
  EXPECT_EQ(choose_ranked(ranked.data(), 2, 1.0, 0.9, 2.0, 0.5), -1);
  EXPECT_GE(choose_ranked(ranked.data(), 2, 1.0, 0.7, 2.0, 0.5), 0);
  EXPECT_EQ(choose_ranked(ranked.data(), 2, 1.0, 0.9, 0, 0.99), 1);
  const std::vector<float> impossible = {-INFINITY, NAN};
  std::vector<SamplingCandidate> scratch;
  EXPECT_EQ(choose_in_row(impossible.data(), 2, SamplingOptions{0, 1, 1, 1}, 0.5, scratch), -1);
  EXPECT_EQ(choose_in_row(impossible.data(), 2, SamplingOptions{0, 0.5, 1, 1}, 0.5, scratch), -1);
}

TEST(Sampling, OptionsOutOfRangeAreRefused) {
  EXPECT_EQ(sampling_options_error({}, 4), "");
  EXPECT_EQ(sampling_options_error({0, 0.9, 0.7, 1}, 1), "");
  EXPECT_NE(sampling_options_error({-1, 1, 1, 1}, 1), "");
  EXPECT_NE(sampling_options_error({0, 0, 1, 1}, 1), "");
  EXPECT_NE(sampling_options_error({0, 1.5, 1, 1}, 1), "");
  EXPECT_NE(sampling_options_error({0, 1, 0, 1}, 1), "");
  EXPECT_NE(sampling_options_error({0, 1, NAN, 1}, 1), "");
  EXPECT_NE(sampling_options_error({5, 1, 1, 1}, 4), "");
}

struct Transliterator {
  Model model;
  Vocabulary source;

  static Transliterator load() {
    ImportedModel m =
        import_ctranslate2(std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration");
    return {Model(m.config, std::move(m.parameters), "aren", tfm::cpu_backend()),
            Vocabulary::from_tokens(m.source_tokens, "s")};
  }
};

// The model's first-step distribution for `source`: every first token's log p from a beam as
// wide as the vocabulary over one step (each a hypothesis ended by the length limit; eos one
// that ended with it), as eos_id for eos.
std::map<int32_t, double> first_step_logprobs(const Transliterator& t,
                                              const std::vector<int32_t>& source) {
  SearchOptions o;
  o.beam = o.nbest = t.model.config().tgt_vocab_size;
  o.max_length = 1;
  o.alpha = 0;
  std::map<int32_t, double> out;
  const std::vector<std::vector<Hypothesis>> found = search(t.model, {source}, {}, o);
  for (const Hypothesis& h : found[0])
    out[h.tokens.empty() ? int32_t(t.model.config().eos_id) : h.tokens[0]] = h.logprob;
  return out;
}

TEST(Sampling, ASampledSearchDrawsTheModelsFirstTokensAsOftenAsItsProbabilities) {
  const Transliterator t = Transliterator::load();
  const std::vector<int32_t> source = t.source.encode("آ ت ز م و ن");
  const std::map<int32_t, double> logp = first_step_logprobs(t, source);
  ASSERT_GT(logp.size(), 10u);
  const int32_t eos = int32_t(t.model.config().eos_id);
  std::vector<SamplingCandidate> candidates;
  for (const auto& [token, lp] : logp) candidates.push_back({float(lp), token});
  const int64_t draws = 3000;
  // topk 5 ranks on the backend; 0 and 500 (beyond the vocabulary) take whole rows.
  for (const SamplingOptions& sampling :
       {SamplingOptions{0, 1, 3, 11}, SamplingOptions{5, 1, 2, 12},
        SamplingOptions{500, 0.8, 4, 13}, SamplingOptions{0, 0.6, 5, 14}}) {
    SearchOptions o;
    o.beam = 1;
    o.nbest = draws;
    o.max_length = 1;
    o.sampling = sampling;
    const std::string what = "topk " + std::to_string(sampling.topk) + ", topp " +
                             std::to_string(sampling.topp) + ", T " +
                             std::to_string(sampling.temperature);
    const std::vector<Hypothesis> drawn = search(t.model, {source}, {}, o)[0];
    ASSERT_EQ(int64_t(drawn.size()), draws) << what;
    std::map<int32_t, int64_t> seen;
    for (const Hypothesis& h : drawn) {
      const int32_t token = h.tokens.empty() ? eos : h.tokens[0];
      ++seen[token];
      ASSERT_TRUE(logp.count(token)) << what;
      EXPECT_NEAR(h.logprob, logp.at(token), 1e-4) << what << ": the model's log p, untempered";
      EXPECT_EQ(h.finished_with_eos, h.tokens.empty()) << what;
    }
    std::vector<SamplingCandidate> pool = candidates;
    std::sort(pool.begin(), pool.end(), [](const SamplingCandidate& a, const SamplingCandidate& b) {
      return a.logprob > b.logprob;
    });
    if (sampling.topk > 0 && sampling.topk < int64_t(pool.size()))
      pool.resize(size_t(sampling.topk));
    expect_frequencies(seen, tempered_nucleus(pool, sampling.temperature, sampling.topp), draws,
                       what);
    EXPECT_GT(seen.size(), 2u) << what << ": a flattened distribution draws several tokens";
  }
}

TEST(Sampling, ASeedRepeatsAndASentencesDrawsDoNotDependOnItsBatch) {
  const Transliterator t = Transliterator::load();
  const std::vector<std::vector<int32_t>> sources = {t.source.encode("آ ت ز م و ن"),
                                                     t.source.encode("آ ت ش ي س و ن")};
  SearchOptions greedy;
  greedy.beam = 1;
  SearchOptions o = greedy;
  o.sampling = {1, 0.5, 3, 9};  // topk 1: not sampling, whatever the rest says
  EXPECT_EQ(search(t.model, sources, {}, o)[1][0].tokens,
            search(t.model, sources, {}, greedy)[1][0].tokens);
  o.sampling = {0, 1, 2, 9};
  o.nbest = 6;
  const auto both = search(t.model, sources, {}, o, {40, 41});
  EXPECT_EQ(both.size(), 2u);
  for (const auto& draws : both) {
    ASSERT_EQ(draws.size(), 6u);
    for (size_t i = 1; i < draws.size(); ++i) EXPECT_GE(draws[i - 1].score, draws[i].score);
  }
  const auto again = search(t.model, sources, {}, o, {40, 41});
  const auto alone = search(t.model, {sources[1]}, {}, o, {41});
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(both[1][i].tokens, again[1][i].tokens);
    EXPECT_EQ(both[1][i].tokens, alone[0][i].tokens) << "its draws followed its batch";
  }
  std::set<std::vector<int32_t>> distinct;
  for (const Hypothesis& h : both[0]) distinct.insert(h.tokens);
  EXPECT_GT(distinct.size(), 1u) << "six draws at temperature 2 were all the same";
  o.sampling.seed = 10;
  const auto reseeded = search(t.model, sources, {}, o, {40, 41});
  bool differs = false;
  for (size_t i = 0; i < 6; ++i) differs |= reseeded[0][i].tokens != both[0][i].tokens;
  EXPECT_TRUE(differs) << "another seed drew the same six";
  o.beam = 2;
  EXPECT_THROW(search(t.model, sources, {}, o), Error);
}

}  // namespace
}  // namespace tfm
