// Corpus loading and length-grouped token batching.
#include "text/batching.h"

#include <algorithm>
#include <numeric>

#include "tensor/error.h"
#include "tensor/random.h"
#include "text/corpus.h"

namespace tfm {

ParallelText read_parallel_text(const std::string& src_path, const std::string& tgt_path) {
  ParallelText text{src_path, tgt_path, read_lines(src_path), read_lines(tgt_path)};
  if (text.sources.size() != text.targets.size())
    throw Error(src_path + " has " + std::to_string(text.sources.size()) + " lines but " +
                tgt_path + " has " + std::to_string(text.targets.size()));
  return text;
}

ParallelCorpus encode_parallel_text(const ParallelText& text, const CorpusEncoding& e) {
  // One generator seed per side, both from the run's (seed, epoch) value.
  Random seeds(e.sampling_seed);
  auto encode_side = [&](const std::vector<std::string>& lines, const Vocabulary* vocabulary,
                         float alpha, int64_t vocab_size, const std::string& where) {
    const auto seed = uint32_t(seeds.next_u64() >> 32);
    return alpha > 0 && !e.ids ? sample_encode_lines(lines, *vocabulary, alpha, seed, where)
                               : encode_lines(lines, vocabulary, e.ids, vocab_size, where);
  };
  auto sources = encode_side(text.sources, e.source_vocabulary, e.source_sampling_alpha,
                             e.src_vocab_size, text.src_path);
  auto targets = encode_side(text.targets, e.target_vocabulary, e.target_sampling_alpha,
                             e.tgt_vocab_size, text.tgt_path);
  ParallelCorpus corpus;
  corpus.lines = int64_t(text.sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].empty() || targets[i].empty()) {
      ++corpus.skipped_empty;
    } else if (e.max_length > 0 && (int64_t(sources[i].size()) > e.max_length ||
                                    int64_t(targets[i].size()) > e.max_length)) {
      ++corpus.skipped_too_long;
    } else {
      corpus.sources.push_back(std::move(sources[i]));
      corpus.targets.push_back(std::move(targets[i]));
    }
  }
  return corpus;
}

ParallelCorpus load_parallel_corpus(const std::string& src_path, const std::string& tgt_path,
                                    const CorpusEncoding& e) {
  return encode_parallel_text(read_parallel_text(src_path, tgt_path), e);
}

BatchPlan plan_batches(const ParallelCorpus& corpus, int64_t batch_tokens, int64_t extra_source,
                       uint64_t seed, int64_t epoch, bool shuffle) {
  const size_t n = corpus.sources.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  Random random(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch) + 1);
  auto shuffle_in_place = [&](auto& items) {  // Fisher–Yates with our portable generator
    for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[random.next_u64() % i]);
  };
  if (shuffle) shuffle_in_place(order);  // random order among pairs of equal length
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const size_t ta = corpus.targets[size_t(a)].size(), tb = corpus.targets[size_t(b)].size();
    if (ta != tb) return ta < tb;
    return corpus.sources[size_t(a)].size() < corpus.sources[size_t(b)].size();
  });
  BatchPlan plan;
  std::vector<int64_t> current;
  int64_t max_src = 0, max_tgt = 0;
  for (int64_t index : order) {
    const int64_t s =
        std::max<int64_t>(max_src, int64_t(corpus.sources[size_t(index)].size()) + extra_source);
    const int64_t t = std::max<int64_t>(max_tgt, int64_t(corpus.targets[size_t(index)].size()) + 1);
    if (!current.empty() && int64_t(current.size() + 1) * (s + t) > batch_tokens) {
      plan.push_back(std::move(current));
      current.clear();
      max_src = max_tgt = 0;
    }
    max_src =
        std::max<int64_t>(max_src, int64_t(corpus.sources[size_t(index)].size()) + extra_source);
    max_tgt = std::max<int64_t>(max_tgt, int64_t(corpus.targets[size_t(index)].size()) + 1);
    current.push_back(index);
  }
  if (!current.empty()) plan.push_back(std::move(current));
  if (shuffle) shuffle_in_place(plan);
  return plan;
}

}  // namespace tfm
