// Training data: a parallel corpus encoded into token ids — once, or each epoch anew with a
// sampled segmentation (subword regularisation) — (pairs with an empty side or longer than
// max_length skipped and counted), and token-based batches — sentences grouped by
// length to avoid padding, the batch order shuffled per epoch from the seed — so that a data
// position (epoch, batch index) identifies exactly where a run is, for resuming.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/vocabulary.h"

namespace tfm {

struct ParallelCorpus {
  std::vector<std::vector<int32_t>> sources;  // raw ids (no eos)
  std::vector<std::vector<int32_t>> targets;  // raw ids (no bos / eos)
  int64_t lines = 0;                          // pairs read
  int64_t skipped_empty = 0;
  int64_t skipped_too_long = 0;
};

struct CorpusEncoding {
  const Vocabulary* source_vocabulary = nullptr;  // used unless ids
  const Vocabulary* target_vocabulary = nullptr;
  bool ids = false;
  int64_t src_vocab_size = 0;
  int64_t tgt_vocab_size = 0;
  int64_t max_length = 0;  // tokens per side; 0: no limit
  // Subword regularisation (train --sentencepiece-alphas): a side's alpha > 0 samples each of
  // its lines' segmentation (Vocabulary::sample_encode), from generators seeded by sampling_seed.
  float source_sampling_alpha = 0, target_sampling_alpha = 0;
  uint64_t sampling_seed = 0;
};

// Both files' lines, kept for encoding again (a sampled segmentation is drawn anew each epoch).
struct ParallelText {
  std::string src_path, tgt_path;
  std::vector<std::string> sources, targets;
};

// Throws Error naming both files when their line counts differ.
ParallelText read_parallel_text(const std::string& src_path, const std::string& tgt_path);

// Throws Error with file:line on a bad id or text SentencePiece cannot encode.
ParallelCorpus encode_parallel_text(const ParallelText& text, const CorpusEncoding& encoding);

// read_parallel_text, then encode_parallel_text.
ParallelCorpus load_parallel_corpus(const std::string& src_path, const std::string& tgt_path,
                                    const CorpusEncoding& encoding);

// Indices into the corpus, one vector per batch. Padded size of a batch:
// count · (max source + extra_source + max target + 1) <= batch_tokens (a pair that is
// alone over the limit still forms its own batch).
using BatchPlan = std::vector<std::vector<int64_t>>;
BatchPlan plan_batches(const ParallelCorpus& corpus, int64_t batch_tokens, int64_t extra_source,
                       uint64_t seed, int64_t epoch, bool shuffle);

}  // namespace tfm
