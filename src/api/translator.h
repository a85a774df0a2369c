// The library API: load a model directory once, then translate and score batches of sentences
// from code, the way ctranslate2.Translator is used. `transformer translate` and `score` run
// through it, and the Python module (python/) wraps it.
//
//   tfm::Translator translator("model_dir", {.device = "cpu", .compute_type = "int8"});
//   auto results = translator.translate_batch({"the house is small"}, {.beam_size = 4});
//   results[0].hypotheses[0].text
//
// Sentences are sorted by length and decoded in batches under max_batch_tokens; a sentence's
// result does not depend on the batch it lands in beyond float rounding. A Translator may be
// used from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decode/beam_search.h"
#include "io/model_directory.h"
#include "tensor/error.h"

namespace tfm {

// How the model is loaded: where it runs and the number format of its products (CTranslate2's
// names: default, auto, float32, bfloat16, int8, int8_bfloat16; float16 and int8_float16 on
// GPUs).
struct TranslatorOptions {
  std::string device = "cpu";
  std::string compute_type = "default";
  // Refuse a model without vocabularies (a bare model file, a directory without one) at load;
  // false lets token-id calls run on one.
  bool need_vocabulary = true;
};

// The default batch budget of translating and scoring: sentences × longest source × beam.
inline constexpr int64_t kDefaultMaxBatchTokens = 4096;

// One call's search, with CTranslate2's names.
struct TranslationOptions {
  int64_t beam_size = 4;               // 1: greedy
  double length_penalty = 0.6;         // α of log p / ((5 + |Y|) / 6)^α
  int64_t num_hypotheses = 1;          // the n best, at most beam_size; or n draws (sampling)
  double max_decoding_length_a = 1.0;  // at most a · source length + b tokens
  int64_t max_decoding_length_b = 50;
  int64_t max_decoding_length = 0;                    // hard cap; 0: the model's positions
  int64_t min_decoding_length = 0;                    // eos is not allowed before this many tokens
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;  // per batch
  bool return_attention = false;        // each hypothesis' cross-attention averaged over heads
  bool return_attention_heads = false;  // and every head's, [heads][steps][source]
  int64_t attention_layer = -1;         // the decoder layer it comes from (-1: the last)
  bool replace_unknowns = false;        // each <unk> becomes the source piece it attends to most
  // Random sampling instead of the best token (beam_size 1; decode/sampling.h): each token drawn
  // from the sampling_topk most probable (0: the whole vocabulary; 1: no sampling), within the
  // nucleus sampling_topp, after the log-probabilities are divided by sampling_temperature;
  // num_hypotheses draws of each input, ranked by score.
  int64_t sampling_topk = 1;
  double sampling_topp = 1.0;
  double sampling_temperature = 1.0;
  // The same seed, inputs and options draw the same tokens (a sentence's draws depend on its
  // index in the call, not on its batch); 0: a new seed for every call.
  uint64_t sampling_seed = 0;

  // Sentences may share one search only when every option is the same (serve's batcher).
  bool operator==(const TranslationOptions&) const = default;
};

// Whether these options draw tokens at random (sampling_topk other than 1; is_sampling).
bool samples(const TranslationOptions& options);

// How many hypotheses of each source a call holds at once (its batch budget's beam): beam_size,
// or num_hypotheses when sampling.
int64_t hypotheses_per_source(const TranslationOptions& options);

struct TranslationHypothesis {
  std::string text;                 // the pieces decoded (empty without a target vocabulary)
  std::vector<std::string> tokens;  // target pieces, without eos (likewise)
  std::vector<int32_t> ids;
  double log_prob = 0;             // natural-log probability of the tokens and eos
  double score = 0;                // log_prob / length penalty: what ranks hypotheses
  bool finished_with_eos = false;  // false when it reached the length limit
  // With return_attention: per output token (eos included), over source positions (with eos
  // where the model appends one to sources).
  std::vector<std::vector<float>> attention;
  // With return_attention_heads: the same for every head, [heads][output tokens][source].
  std::vector<std::vector<std::vector<float>>> attention_heads;
};

struct TranslationResult {
  // Best first; none for an input that was not translated (empty, or longer than the model's
  // positions: see too_long()).
  std::vector<TranslationHypothesis> hypotheses;
  int64_t source_tokens = 0;  // the source's length in tokens (without eos)
};

// What score_ids throws for a pair longer than the model's positions allow: which pair and
// which side, so that a caller can name the line it came from.
struct SequenceTooLong : Error {
  SequenceTooLong(size_t index, bool target, size_t tokens);
  size_t index;        // of the pair
  bool target;         // the target side (else the source)
  std::string detail;  // "N tokens is longer than ...", what() without the pair
};

struct ScoringResult {
  std::vector<float> log_probs;  // per target token, then eos
  double log_prob = 0;           // their sum
};

class Translator {
 public:
  // Loads `model_path`: a model directory (model.safetensors + vocabulary), or a bare model file
  // (then only the *_ids calls work). Throws Error.
  explicit Translator(const std::string& model_path, const TranslatorOptions& options = {});
  ~Translator();
  Translator(Translator&&) noexcept;

  // Texts in, texts out (SentencePiece vocabularies).
  std::vector<TranslationResult> translate_batch(
      const std::vector<std::string>& sources, const TranslationOptions& options = {},
      const std::vector<std::string>& target_prefixes = {},
      const std::function<void(int64_t)>& progress = {}) const;
  // Pre-tokenized pieces in, pieces out (and their text).
  std::vector<TranslationResult> translate_tokens(
      const std::vector<std::vector<std::string>>& sources, const TranslationOptions& options = {},
      const std::vector<std::vector<std::string>>& target_prefixes = {}) const;
  // Token ids in; ids out, with their pieces and text where the model has a target vocabulary.
  // `progress`, when given, is told how many sentences are done. With replace_unknowns,
  // `source_pieces` holds each source's pieces. `cancelled`, when given, is asked before every
  // decoding step; once it says true the call throws SearchCancelled.
  std::vector<TranslationResult> translate_ids(
      const std::vector<std::vector<int32_t>>& sources, const TranslationOptions& options = {},
      const std::vector<std::vector<int32_t>>& target_prefixes = {},
      const std::function<void(int64_t)>& progress = {},
      const std::vector<std::vector<std::string>>* source_pieces = nullptr,
      const std::function<bool()>& cancelled = {}) const;

  // log p(target + eos | source) per pair, teacher-forced.
  std::vector<ScoringResult> score_batch(const std::vector<std::string>& sources,
                                         const std::vector<std::string>& targets,
                                         int64_t max_batch_tokens = kDefaultMaxBatchTokens) const;
  std::vector<ScoringResult> score_ids(const std::vector<std::vector<int32_t>>& sources,
                                       const std::vector<std::vector<int32_t>>& targets,
                                       int64_t max_batch_tokens = kDefaultMaxBatchTokens,
                                       const std::function<void(int64_t)>& progress = {}) const;

  const ModelConfig& config() const;
  const Vocabulary* source_vocabulary() const;  // null for a bare model file
  const Vocabulary* target_vocabulary() const;
  const Backend& backend() const;
  const SearchOptions& search_defaults() const;  // the compute type resolved
  // Throws UsageError, naming the option, for options out of range or beyond this model
  // (attention_layer past its decoder layers); every translate call checks them first, and a
  // caller may check once before it reads its input.
  void check_options(const TranslationOptions& options) const;
  // The most tokens a translation of a source of this many tokens may have under `options`
  // (eos excluded), for bounding what a call can return before making it.
  int64_t max_output_tokens(const TranslationOptions& options, int64_t source_tokens,
                            int64_t prefix_tokens = 0) const;
  // Whether a source of this many tokens is beyond the model's positions (never translated).
  bool too_long(int64_t source_tokens) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tfm
