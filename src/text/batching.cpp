// Corpus loading and length-grouped token batching.
#include "text/batching.h"

#include <algorithm>
#include <numeric>

#include "tensor/error.h"
#include "tensor/random.h"
#include "text/corpus.h"

namespace tfm {

ParallelCorpus load_parallel_corpus(const std::string& src_path, const std::string& tgt_path,
                                    const CorpusEncoding& e) {
  const std::vector<std::string> src_lines = read_lines(src_path);
  const std::vector<std::string> tgt_lines = read_lines(tgt_path);
  if (src_lines.size() != tgt_lines.size())
    throw Error(src_path + " has " + std::to_string(src_lines.size()) + " lines but " + tgt_path +
                " has " + std::to_string(tgt_lines.size()));
  auto sources = encode_lines(src_lines, e.source_vocabulary, e.ids, e.src_vocab_size, src_path);
  auto targets = encode_lines(tgt_lines, e.target_vocabulary, e.ids, e.tgt_vocab_size, tgt_path);
  ParallelCorpus corpus;
  corpus.lines = int64_t(src_lines.size());
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
