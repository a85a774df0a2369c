// The library API (see translator.h): the text → ids → batched search → text pipeline that
// `translate`, `score` and the Python module share.
#include "api/translator.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "api/compute_type.h"
#include "decode/hypothesis_text.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"
#include "text/batching.h"
#include "text/vocabulary.h"

namespace tfm {

struct Translator::State {
  const Backend& backend;
  SearchOptions defaults;  // the compute type resolved; every call starts from it
  ModelBundle bundle;
  std::mutex busy;  // one call at a time: a model's workspaces are not shared between passes
};

namespace {

ModelBundle load_for(const std::string& path, const Backend& backend, SearchOptions& defaults,
                     const std::string& compute_type, bool need_vocabulary) {
  const ComputeType type = resolve_compute_type(compute_type, backend, path);
  defaults.precision = type.precision;
  defaults.cache = type.cache;
  return load_model_bundle(path, need_vocabulary, backend, type.precision);
}

const Vocabulary& required(const std::optional<Vocabulary>& vocabulary, const char* side) {
  if (!vocabulary)
    throw Error(std::string("this model has no ") + side +
                " vocabulary (a bare model file): translate and score token ids instead");
  return *vocabulary;
}

void check_ids(const std::vector<std::vector<int32_t>>& sequences, int64_t vocabulary_size,
               const char* what) {
  for (size_t i = 0; i < sequences.size(); ++i)
    for (int32_t id : sequences[i])
      if (id < 0 || id >= vocabulary_size)
        throw Error(std::string(what) + " " + std::to_string(i) + ": token id " +
                    std::to_string(id) + " is outside the vocabulary (size " +
                    std::to_string(vocabulary_size) + ")");
}

// Each text encoded with `vocabulary`; `what` names a text in errors ("source 3: invalid UTF-8").
std::vector<std::vector<int32_t>> encode_texts(const Vocabulary& vocabulary,
                                               const std::vector<std::string>& texts,
                                               const char* what) {
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!is_valid_utf8(texts[i]))
      throw Error(std::string(what) + " " + std::to_string(i) + ": invalid UTF-8");
    ids.push_back(vocabulary.encode(texts[i]));
  }
  return ids;
}

// The decoder's search settings for one call: the loaded compute type, the call's options.
SearchOptions search_settings(const SearchOptions& defaults, const TranslationOptions& options) {
  SearchOptions settings = defaults;
  settings.beam = options.beam_size;
  settings.alpha = options.length_penalty;
  settings.nbest = options.num_hypotheses;
  settings.max_length_a = options.max_decoding_length_a;
  settings.max_length_b = options.max_decoding_length_b;
  settings.max_length = options.max_decoding_length;
  settings.min_length = options.min_decoding_length;
  settings.attention =
      options.return_attention || options.return_attention_heads || options.replace_unknowns;
  settings.attention_per_head = options.return_attention_heads;
  settings.attention_layer = options.attention_layer;
  settings.sampling = {options.sampling_topk, options.sampling_topp, options.sampling_temperature,
                       options.sampling_seed};
  return settings;
}

// A seed for a call that asks for none: from the system's entropy, never 0.
uint64_t fresh_sampling_seed() {
  std::random_device entropy;
  const uint64_t seed = (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
  return seed ? seed : 1;
}

// Every head's weights, [heads][steps][source], from a hypothesis that kept all of them.
std::vector<std::vector<std::vector<float>>> split_heads(const Hypothesis& h, int64_t heads) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(heads));
  for (const std::vector<float>& step : h.attention) {
    const size_t width = step.size() / size_t(heads);
    for (int64_t head = 0; head < heads; ++head)
      out[size_t(head)].emplace_back(step.begin() + long(size_t(head) * width),
                                     step.begin() + long(size_t(head + 1) * width));
  }
  return out;
}

}  // namespace

Translator::Translator(const std::string& model_path, const TranslatorOptions& options) {
  const Backend& backend = find_backend(options.device);
  SearchOptions defaults;
  ModelBundle bundle =
      load_for(model_path, backend, defaults, options.compute_type, options.need_vocabulary);
  state_.reset(new State{backend, defaults, std::move(bundle), {}});
}

Translator::~Translator() = default;
Translator::Translator(Translator&&) noexcept = default;

const ModelConfig& Translator::config() const {
  return state_->bundle.model.config();
}
const Backend& Translator::backend() const {
  return state_->backend;
}
const SearchOptions& Translator::search_defaults() const {
  return state_->defaults;
}

const Vocabulary* Translator::source_vocabulary() const {
  return state_->bundle.source_vocabulary ? &*state_->bundle.source_vocabulary : nullptr;
}
const Vocabulary* Translator::target_vocabulary() const {
  return state_->bundle.target_vocabulary ? &*state_->bundle.target_vocabulary : nullptr;
}

bool samples(const TranslationOptions& options) {
  return is_sampling(search_settings({}, options).sampling);
}

int64_t hypotheses_per_source(const TranslationOptions& options) {
  return hypotheses_per_sentence(search_settings({}, options));
}

void Translator::check_options(const TranslationOptions& o) const {
  auto bad = [](const std::string& what) { throw UsageError(what); };
  if (o.beam_size < 1) bad("beam_size must be at least 1");
  const SearchOptions settings = search_settings(state_->defaults, o);
  if (const std::string error = sampling_options_error(settings.sampling, o.beam_size);
      !error.empty())
    bad(error);
  const bool sampling = samples(o);
  if (!sampling && (o.num_hypotheses < 1 || o.num_hypotheses > o.beam_size))
    bad("num_hypotheses must be between 1 and beam_size");
  if (sampling && (o.num_hypotheses < 1 || o.num_hypotheses > (1 << 20)))
    bad("num_hypotheses (draws of each input when sampling) must be between 1 and 1048576");
  if (!(o.length_penalty >= 0 && o.length_penalty <= 10)) bad("length_penalty must be in [0, 10]");
  if (!(o.max_decoding_length_a >= 0 && o.max_decoding_length_a <= 1000))
    bad("max_decoding_length_a must be in [0, 1000]");
  if (o.max_decoding_length_b < 0 || o.max_decoding_length < 0 || o.min_decoding_length < 0)
    bad("decoding lengths cannot be negative");
  if (o.max_decoding_length > 0 && o.min_decoding_length > o.max_decoding_length)
    bad("min_decoding_length " + std::to_string(o.min_decoding_length) +
        " is greater than max_decoding_length " + std::to_string(o.max_decoding_length));
  if (o.max_batch_tokens < 1) bad("max_batch_tokens must be at least 1");
  const int64_t layers = config().decoder_layers;
  if (o.attention_layer < -1 || o.attention_layer >= layers)
    bad("attention_layer " + std::to_string(o.attention_layer) + " is beyond the model's " +
        std::to_string(layers) + " decoder layers (-1 is the last)");
}

int64_t Translator::max_output_tokens(const TranslationOptions& options, int64_t source_tokens,
                                      int64_t prefix_tokens) const {
  return generation_limit(config(), search_settings(state_->defaults, options), source_tokens,
                          prefix_tokens);
}

bool Translator::too_long(int64_t source_tokens) const {
  return source_tokens > max_source_tokens(config());
}

std::vector<TranslationResult> Translator::translate_ids(
    const std::vector<std::vector<int32_t>>& sources, const TranslationOptions& options,
    const std::vector<std::vector<int32_t>>& target_prefixes,
    const std::function<void(int64_t)>& progress,
    const std::vector<std::vector<std::string>>* source_pieces,
    const std::function<bool()>& cancelled) const {
  check_options(options);
  if (options.replace_unknowns && !source_pieces)
    throw UsageError("replace_unknowns needs the source pieces (text or token input)");
  const ModelConfig& config = this->config();
  check_ids(sources, config.src_vocab_size, "source");
  check_ids(target_prefixes, config.tgt_vocab_size, "target prefix");
  for (size_t i = 0; i < target_prefixes.size(); ++i)
    if (int64_t(target_prefixes[i].size()) > max_target_tokens(config))
      throw Error("target prefix " + std::to_string(i) + " has " +
                  std::to_string(target_prefixes[i].size()) +
                  " tokens; the model generates at most " +
                  std::to_string(max_target_tokens(config)));
  if (!target_prefixes.empty() && target_prefixes.size() != sources.size())
    throw UsageError("target prefixes: " + std::to_string(target_prefixes.size()) + " for " +
                     std::to_string(sources.size()) + " sources");
  SearchOptions settings = search_settings(state_->defaults, options);
  if (is_sampling(settings.sampling) && settings.sampling.seed == 0)
    settings.sampling.seed = fresh_sampling_seed();
  const int64_t heads = settings.attention_per_head ? config.heads : 1;
  const Vocabulary* target_vocabulary = this->target_vocabulary();

  // Longest first, batched so that sentences × longest source × beam stays within budget.
  std::vector<size_t> order;
  for (size_t i = 0; i < sources.size(); ++i)
    if (!sources[i].empty() && !too_long(int64_t(sources[i].size()))) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sources[a].size() > sources[b].size(); });
  std::vector<TranslationResult> results(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) results[i].source_tokens = int64_t(sources[i].size());
  std::lock_guard<std::mutex> lock(state_->busy);
  for (size_t next = 0; next < order.size();) {
    const int64_t count =
        sentences_within_budget(options.max_batch_tokens, int64_t(sources[order[next]].size()),
                                hypotheses_per_sentence(settings));
    std::vector<std::vector<int32_t>> batch_sources, batch_prefixes;
    std::vector<size_t> members;
    std::vector<uint64_t> sampling_keys;  // each sentence's index in the call
    for (; next < order.size() && int64_t(members.size()) < count; ++next) {
      members.push_back(order[next]);
      sampling_keys.push_back(uint64_t(order[next]));
      batch_sources.push_back(sources[order[next]]);
      if (!target_prefixes.empty()) batch_prefixes.push_back(target_prefixes[order[next]]);
    }
    const auto found = search(state_->bundle.model, batch_sources, batch_prefixes, settings,
                              sampling_keys, cancelled);
    for (size_t m = 0; m < members.size(); ++m) {
      for (const Hypothesis& h : found[m]) {
        TranslationHypothesis out;
        out.ids = h.tokens;
        out.log_prob = h.logprob;
        out.score = h.score;
        out.finished_with_eos = h.finished_with_eos;
        if (options.return_attention)
          for (size_t t = 0; t < h.attention.size(); ++t)
            out.attention.push_back(mean_attention(h, t, heads));
        if (options.return_attention_heads) out.attention_heads = split_heads(h, heads);
        if (target_vocabulary) {
          for (int32_t id : h.tokens) out.tokens.push_back(target_vocabulary->piece(id));
          out.text =
              hypothesis_text(h, *target_vocabulary, heads,
                              options.replace_unknowns ? &(*source_pieces)[members[m]] : nullptr);
        }
        results[members[m]].hypotheses.push_back(std::move(out));
      }
    }
    if (progress) progress(int64_t(next));
  }
  return results;
}

std::vector<TranslationResult> Translator::translate_batch(
    const std::vector<std::string>& sources, const TranslationOptions& options,
    const std::vector<std::string>& target_prefixes,
    const std::function<void(int64_t)>& progress) const {
  const Vocabulary& source_vocabulary = required(state_->bundle.source_vocabulary, "source");
  const Vocabulary& target_vocabulary = required(state_->bundle.target_vocabulary, "target");
  const auto source_ids = encode_texts(source_vocabulary, sources, "source");
  const auto prefix_ids = encode_texts(target_vocabulary, target_prefixes, "target prefix");
  std::vector<std::vector<std::string>> source_pieces(sources.size());  // for replace_unknowns
  if (options.replace_unknowns)
    for (size_t i = 0; i < sources.size(); ++i)
      source_pieces[i] = source_vocabulary.to_pieces(sources[i]);
  return translate_ids(source_ids, options, prefix_ids, progress, &source_pieces);
}

std::vector<TranslationResult> Translator::translate_tokens(
    const std::vector<std::vector<std::string>>& sources, const TranslationOptions& options,
    const std::vector<std::vector<std::string>>& target_prefixes) const {
  const Vocabulary& source_vocabulary = required(state_->bundle.source_vocabulary, "source");
  const Vocabulary& target_vocabulary = required(state_->bundle.target_vocabulary, "target");
  std::vector<std::vector<int32_t>> source_ids, prefix_ids;
  for (const auto& pieces : sources) source_ids.push_back(source_vocabulary.piece_ids(pieces));
  for (const auto& pieces : target_prefixes)
    prefix_ids.push_back(target_vocabulary.piece_ids(pieces));
  return translate_ids(source_ids, options, prefix_ids, {}, &sources);
}

namespace {
std::string too_long_detail(size_t tokens) {
  return std::to_string(tokens) + " tokens is longer than the model's max_positions allow";
}
}  // namespace

SequenceTooLong::SequenceTooLong(size_t index, bool target, size_t tokens)
    : Error(std::string(target ? "target " : "source ") + std::to_string(index) + ": " +
            too_long_detail(tokens)),
      index(index),
      target(target),
      detail(too_long_detail(tokens)) {}

std::vector<ScoringResult> Translator::score_batch(const std::vector<std::string>& sources,
                                                   const std::vector<std::string>& targets,
                                                   int64_t max_batch_tokens) const {
  const Vocabulary& source_vocabulary = required(state_->bundle.source_vocabulary, "source");
  const Vocabulary& target_vocabulary = required(state_->bundle.target_vocabulary, "target");
  return score_ids(encode_texts(source_vocabulary, sources, "source"),
                   encode_texts(target_vocabulary, targets, "target"), max_batch_tokens);
}

std::vector<ScoringResult> Translator::score_ids(
    const std::vector<std::vector<int32_t>>& sources,
    const std::vector<std::vector<int32_t>>& targets, int64_t max_batch_tokens,
    const std::function<void(int64_t)>& progress) const {
  const ModelConfig& config = this->config();
  if (sources.size() != targets.size())
    throw UsageError(std::to_string(sources.size()) + " sources but " +
                     std::to_string(targets.size()) + " targets");
  if (max_batch_tokens < 1) throw UsageError("max_batch_tokens must be at least 1");
  check_ids(sources, config.src_vocab_size, "source");
  check_ids(targets, config.tgt_vocab_size, "target");
  for (size_t i = 0; i < sources.size(); ++i) {
    if (int64_t(sources[i].size()) > max_source_tokens(config))
      throw SequenceTooLong(i, false, sources[i].size());
    if (int64_t(targets[i].size()) > max_target_tokens(config))
      throw SequenceTooLong(i, true, targets[i].size());
  }
  const Precision precision = state_->defaults.precision;
  const Model& model = state_->bundle.model;
  // Pairs of similar length batched together (little padding), as training batches them.
  ParallelCorpus pairs;
  pairs.sources = sources;
  pairs.targets = targets;
  const BatchPlan plan =
      plan_batches(pairs, max_batch_tokens, config.src_append_eos ? 1 : 0, 0, 0, false);
  std::lock_guard<std::mutex> lock(state_->busy);
  // The activations of every batch, planned from their shapes and allocated as one block before
  // the first: a batch budget that does not fit is refused here.
  ScoringWorkspace ws;
  for (const std::vector<int64_t>& members : plan)
    plan_score_forward(model, batch_shape(config, pairs.sources, pairs.targets, members), ws,
                       precision);
  check_memory(ws.plan.block_bytes(), "scoring in batches of up to " +
                                          std::to_string(max_batch_tokens) +
                                          " tokens (--batch-tokens: the activations)");
  ws.memory.allocate(model.backend(), ws.plan);
  std::vector<ScoringResult> results(pairs.sources.size());
  std::vector<float> logprobs;
  int64_t done = 0;
  for (const std::vector<int64_t>& members : plan) {
    const TokenBatch batch = make_batch(config, pairs.sources, pairs.targets, members);
    score_forward(model, batch, ws, logprobs, precision);
    for (size_t m = 0; m < members.size(); ++m) {
      const float* row = logprobs.data() + int64_t(m) * batch.tgt_len;
      ScoringResult& r = results[size_t(members[m])];
      r.log_probs.assign(row, row + batch.tgt_lengths[m]);
      for (float v : r.log_probs) r.log_prob += v;
      // NaN (or +inf) comes only from a model whose activations overflow float32 or that holds
      // NaN; printed, it would pass for a score.
      if (std::isnan(r.log_prob) || r.log_prob == INFINITY)
        throw Error("the model's log-probability of pair " + std::to_string(members[m] + 1) +
                    " is not a number: its activations overflow float32 or its weights hold "
                    "NaN, so it cannot score");
    }
    done += int64_t(members.size());
    if (progress) progress(done);
  }
  return results;
}

}  // namespace tfm
