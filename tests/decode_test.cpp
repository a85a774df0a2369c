// Decoding: CTranslate2's own expectations on its transliteration test model (greedy, beam,
// length limits, prefixes), and incremental (KV-cached) decoding agreeing with a full forward
// pass of the final hypothesis for every fixture variant.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cli_runner.h"
#include "decode/beam_search.h"
#include "fixture_batch.h"
#include "io/ctranslate2.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "model/prepared_weights.h"
#include "skip_report.h"
#include "tensor/error.h"
#include "text/vocabulary.h"

namespace tfm {
namespace {

struct Transliterator {
  Model model;
  Vocabulary source, target;

  static Transliterator load() {
    ImportedModel m =
        import_ctranslate2(std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration");
    return {Model(m.config, std::move(m.parameters), "aren", tfm::cpu_backend()),
            Vocabulary::from_tokens(m.source_tokens, "s"),
            Vocabulary::from_tokens(m.target_tokens, "t")};
  }

  Hypothesis best(const std::string& text, SearchOptions o, const std::string& prefix = "") {
    std::vector<std::vector<int32_t>> prefixes;
    if (!prefix.empty()) prefixes.push_back(target.encode(prefix));
    return search(model, {source.encode(text)}, prefixes, o)[0][0];
  }
  std::string translate(const std::string& text, SearchOptions o, const std::string& prefix = "") {
    return target.decode(best(text, o, prefix).tokens);
  }
};

SearchOptions beam(int64_t size) {
  SearchOptions o;
  o.beam = size;
  return o;
}

constexpr EmbeddingSharing kEverySharing[] = {EmbeddingSharing::kAll, EmbeddingSharing::kTarget,
                                              EmbeddingSharing::kNone};

// The tiny preset with `sharing`: a vocabulary of `vocab` on both sides, the target's
// `tgt_vocab` where the two sides have tables of their own.
ModelConfig tiny_config(EmbeddingSharing sharing, int64_t vocab, int64_t tgt_vocab) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = c.tgt_vocab_size = vocab;
  c.share_embeddings = sharing;
  if (sharing != EmbeddingSharing::kAll) c.tgt_vocab_size = tgt_vocab;
  return c;
}

TEST(Decode, CTranslate2TransliterationExpectations) {
  Transliterator t = Transliterator::load();
  for (int64_t size : {1, 2, 4})
    EXPECT_EQ(t.translate("آ ت ز م و ن", beam(size)), "a t z m o n") << size;
  EXPECT_EQ(t.translate("آ ز ا", beam(4)), "a z z a");
  EXPECT_EQ(t.translate("آ ت ش ي س و ن", beam(4)), "a c h i s o n");
  SearchOptions short_output = beam(4);
  short_output.max_length = 3;
  EXPECT_EQ(t.best("آ ت ز م و ن", short_output).tokens.size(), 3u);
  SearchOptions long_output = beam(1);
  long_output.min_length = 8;
  EXPECT_EQ(t.translate("آ ت ز م و ن", long_output), "a t z m o n e n");
  const Hypothesis greedy = t.best("آ ت ز م و ن", beam(1));
  const Hypothesis two = t.best("آ ت ز م و ن", beam(2));
  EXPECT_NEAR(greedy.logprob, two.logprob, 1e-5);
  EXPECT_NEAR(greedy.logprob, -1.061750, 1e-4);  // = `transformer score` of the same pair
  EXPECT_EQ(t.translate("آ ت ز م و ن", beam(2), "a t s"), "a t s u m o n");
}

// --compute-type bfloat16, int8 and int8_bfloat16: every product (encoder, decoder, output
// projection) in the reduced format, and with bfloat16 / int8_bfloat16 the decoder's cached keys
// and values in bfloat16. bfloat16 rounds weights and inputs to 8-bit mantissas; int8 to 255
// steps of each row's largest magnitude. Each bound is 2-3x the error measured on an AMD EPYC
// (AVX512-BF16, VNNI) on 2026-11-28, given beside it, so that a rounding or quantisation that
// goes wrong by a few times its size fails.
struct ReducedPrecisionCase {
  const char* name;  // the --compute-type
  Precision precision;
  CacheFormat cache;
  // Each token's log-probability against float32's: |reduced - full| <= relative * |full| +
  // absolute (tokens from -0.002 to -0.4: relative, with a floor for the smallest).
  double token_relative, token_absolute;
  double sentence;         // the best hypothesis's log-probability (-1.06) against float32's
  double search_vs_score;  // the search's log-probability against scoring its output
};

// |reduced - full| within relative * |full| + absolute.
void expect_within(double reduced, double full, double relative, double absolute,
                   const std::string& what) {
  EXPECT_LE(std::fabs(reduced - full), relative * std::fabs(full) + absolute)
      << what << ": " << reduced << " against " << full;
}

class ReducedPrecision : public ::testing::TestWithParam<ReducedPrecisionCase> {
 protected:
  void SetUp() override {
    if (!cpu_backend().supports(GetParam().precision))
      GTEST_SKIP() << testing_support::cannot_compute(cpu_backend(), GetParam().precision);
  }
};

// CTranslate2's expected outputs, and log-probabilities within the tolerance of float32's.
TEST_P(ReducedPrecision, SearchKeepsTheOutputs) {
  Transliterator t = Transliterator::load();
  for (int64_t size : {1, 4}) {
    SearchOptions o = beam(size);
    o.precision = GetParam().precision;
    o.cache = GetParam().cache;
    EXPECT_EQ(t.translate("آ ت ز م و ن", o), "a t z m o n") << size;
    EXPECT_EQ(t.translate("آ ت ش ي س و ن", o), "a c h i s o n") << size;
    const Hypothesis reduced = t.best("آ ت ز م و ن", o);
    const Hypothesis full = t.best("آ ت ز م و ن", beam(size));
    ASSERT_EQ(reduced.tokens, full.tokens);
    EXPECT_NEAR(reduced.logprob, full.logprob, GetParam().sentence) << size;
    EXPECT_NE(reduced.logprob, full.logprob) << "the reduced format was not used";
  }
}

// Scoring in the reduced format: each token's log-probability within the tolerance of float32's,
// and the search in the same format (whose incremental decoder runs the same layers) scores its
// output the same way (up to the bfloat16 cache's rounding, which scoring has no use for).
TEST_P(ReducedPrecision, ScoringMatchesFloat32AndTheSearch) {
  Transliterator t = Transliterator::load();
  SearchOptions o = beam(1);
  o.precision = GetParam().precision;
  o.cache = GetParam().cache;
  const Hypothesis h = t.best("آ ت ش ي س و ن", o);
  const TokenBatch batch =
      make_batch(t.model.config(), {t.source.encode("آ ت ش ي س و ن")}, {h.tokens});
  ScoringWorkspace cache;
  std::vector<float> full, reduced;
  score_forward(t.model, batch, cache, full, Precision::kFloat32);
  score_forward(t.model, batch, cache, reduced, GetParam().precision);
  double total = 0;
  bool moved = false;
  for (int64_t i = 0; i < batch.tgt_lengths[0]; ++i) {
    expect_within(reduced[size_t(i)], full[size_t(i)], GetParam().token_relative,
                  GetParam().token_absolute, "token " + std::to_string(i));
    moved |= reduced[size_t(i)] != full[size_t(i)];
    total += reduced[size_t(i)];
  }
  EXPECT_TRUE(moved) << "the reduced format was not used";
  // The bfloat16 cache moves it (int8_bfloat16 most: each activation row is quantised afresh,
  // so the cache's rounding can move a value by a quantisation step); a float32 cache only by
  // the order of summation.
  EXPECT_NEAR(h.logprob, total, GetParam().search_vs_score);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, ReducedPrecision,
    // Measured: tokens 1.3% (bfloat16) and 6.2% (int8) of their value at
    // most; sentences 0.0047, 0.011, 0.013; search against scoring 0.001,
    // 1e-6, 0.0145.
    ::testing::Values(ReducedPrecisionCase{"bfloat16", Precision::kBFloat16, CacheFormat::kBFloat16,
                                           0.03, 2e-5, 0.012, 3e-3},
                      ReducedPrecisionCase{"int8", Precision::kInt8, CacheFormat::kFloat32, 0.15,
                                           2e-4, 0.03, 5e-6},
                      ReducedPrecisionCase{"int8_bfloat16", Precision::kInt8,
                                           CacheFormat::kBFloat16, 0.15, 2e-4, 0.035, 0.035}),
    [](const auto& info) { return std::string(info.param.name); });

// A 16-bit key/value cache alone (float32 products), bfloat16 or float16: CTranslate2's expected
// outputs kept, with greedy, beam and kept attention, and the log-probability within the rounding
// of the cached keys and values (bfloat16's 8-bit mantissa, 2^-9 relative at most, measured
// 0.0014 of 1.11; float16's 11 bits, 2^-12). Every backend keeps both caches; float16 products
// are the GPU's only, so a CPU runs the float16 cache under float32 products here alone.
TEST(Decode, SixteenBitCachesKeepTheOutputs) {
  Transliterator t = Transliterator::load();
  for (CacheFormat cache : {CacheFormat::kBFloat16, CacheFormat::kFloat16})
    for (int64_t size : {1, 4}) {
      const std::string what =
          std::string(precision_name(cache_precision(cache))) + " beam " + std::to_string(size);
      SearchOptions o = beam(size);
      o.cache = cache;
      o.attention = true;
      EXPECT_EQ(t.translate("آ ت ز م و ن", o), "a t z m o n") << what;
      EXPECT_EQ(t.translate("آ ت ش ي س و ن", o), "a c h i s o n") << what;
      const Hypothesis rounded = t.best("آ ت ش ي س و ن", o);
      SearchOptions f = beam(size);
      f.attention = true;
      const Hypothesis full = t.best("آ ت ش ي س و ن", f);
      ASSERT_EQ(rounded.tokens, full.tokens) << what;
      const double bound = cache == CacheFormat::kFloat16 ? 2e-3 : 1e-2;
      EXPECT_NEAR(rounded.logprob, full.logprob, bound) << what;
      EXPECT_NE(rounded.logprob, full.logprob) << "the 16-bit cache was not used: " << what;
      ASSERT_EQ(rounded.attention.size(), full.attention.size());
      for (size_t step = 0; step < full.attention.size(); ++step)
        for (size_t j = 0; j < full.attention[step].size(); ++j)
          EXPECT_NEAR(rounded.attention[step][j], full.attention[step][j], 2 * bound)
              << what << " step " << step;
    }
}

// On a GPU: device memory stays flat while one model decodes batch after batch, 150 searches of
// at least 20 steps each (3,000 steps and more) per setting: float32 and float16, greedy and
// beam 4. What the first searches allocate (prepared weights, the pool's blocks) is kept; what a
// search allocates for itself is freed when it ends. A leak grows with the searches: after the
// 30th, the 90th and the 150th, the memory in use must not grow.
TEST(Decode, GpuMemoryStaysFlatOverThousandsOfSteps) {
  std::string why;
  const std::string gpu = testing_support::first_gpu_backend(why);
  if (gpu.empty()) GTEST_SKIP() << why;
  const Backend& backend = find_backend(gpu);
  ImportedModel m =
      import_ctranslate2(std::string(TFM_FIXTURE_DIR) +
                         "/../data/ctranslate2-aren-transliteration/aren-transliteration");
  const Vocabulary source = Vocabulary::from_tokens(m.source_tokens, "s");
  const Model model(m.config, std::move(m.parameters), "aren", backend);
  const std::vector<std::vector<int32_t>> sentences = {
      source.encode("آ ت ز م و ن"), source.encode("آ ز ا"), source.encode("آ ت ش ي س و ن"),
      source.encode("آ ب")};
  for (Precision precision : {Precision::kFloat32, Precision::kFloat16})
    for (int64_t size : {1, 4}) {
      SCOPED_TRACE(std::string(precision_name(precision)) + " beam " + std::to_string(size));
      SearchOptions o = beam(size);
      o.precision = precision;
      o.cache = precision == Precision::kFloat16 ? CacheFormat::kFloat16 : CacheFormat::kFloat32;
      o.min_length = 20;
      o.max_length = 24;
      std::vector<int64_t> in_use;  // after searches 30, 90 and 150
      for (int i = 1; i <= 150; ++i) {
        const auto results = search(model, sentences, {}, o);
        ASSERT_EQ(results.size(), sentences.size());
        ASSERT_GE(results[0][0].tokens.size(), 20u);
        if (i == 30 || i == 90 || i == 150) in_use.push_back(backend.device_memory().in_use);
      }
      ASSERT_GT(in_use[0], 0);
      EXPECT_LE(in_use[1], in_use[0] + (1 << 20)) << in_use[0] << " then " << in_use[1];
      EXPECT_LE(in_use[2], in_use[1] + (1 << 20)) << in_use[1] << " then " << in_use[2];
      const DeviceMemory memory = backend.device_memory();  // the peaks hold what is held now
      EXPECT_GE(memory.peak_in_use, memory.in_use);
      EXPECT_GE(memory.peak_reserved, memory.peak_in_use);
    }
}

// A model loaded for int8 (io/model_file.h: linear weights quantised as they are read, float32
// never kept) multiplies exactly as the float32-loaded model does in int8: the same rule
// quantises both. It refuses every other precision and any change to its weights.
TEST(Decode, Int8LoadedModelEqualsInt8ProductsOfTheFloatModel) {
  if (!cpu_backend().supports(Precision::kInt8))
    GTEST_SKIP() << testing_support::cannot_compute(cpu_backend(), Precision::kInt8);
  Transliterator t = Transliterator::load();
  const std::string path = ::testing::TempDir() + "/aren_int8_test.safetensors";
  save_model(t.model, path);
  Model int8 = load_model(path, cpu_backend(), ModelWeights::kInt8);
  std::remove(path.c_str());
  ASSERT_TRUE(int8.holds_int8_weights());
  EXPECT_FALSE(t.model.holds_int8_weights());
  size_t released = 0;
  const std::map<std::string, ParameterRole> roles = parameter_roles(int8.config());
  for (const auto& [name, tensor] : int8.parameters())
    if (roles.at(name) == ParameterRole::kLinearWeight) {
      EXPECT_EQ(tensor.data, nullptr) << name;
      ++released;
    }
  const ModelConfig& c = t.model.config();
  EXPECT_EQ(released, size_t(c.encoder_layers * 6 + c.decoder_layers * 10 +
                             (c.share_embeddings == EmbeddingSharing::kNone ? 1 : 0)));
  for (int64_t size : {1, 4}) {
    SearchOptions o = beam(size);
    o.precision = Precision::kInt8;
    const std::vector<int32_t> source = t.source.encode("آ ت ش ي س و ن");
    const Hypothesis from_float = search(t.model, {source}, {}, o)[0][0];
    const Hypothesis from_int8 = search(int8, {source}, {}, o)[0][0];
    EXPECT_EQ(from_int8.tokens, from_float.tokens);
    EXPECT_EQ(from_int8.logprob, from_float.logprob) << size;
  }
  const TokenBatch batch =
      make_batch(int8.config(), {t.source.encode("آ ت ز م و ن")}, {t.target.encode("a t z m o n")});
  ScoringWorkspace cache;
  std::vector<float> from_float, from_int8;
  score_forward(t.model, batch, cache, from_float, Precision::kInt8);
  score_forward(int8, batch, cache, from_int8, Precision::kInt8);
  EXPECT_EQ(from_int8, from_float);
  EXPECT_THROW(score_forward(int8, batch, cache, from_int8, Precision::kFloat32), Error);
  EXPECT_THROW(int8.prepared(Precision::kBFloat16), Error);
  EXPECT_THROW(int8.mutable_parameters(), Error);
}

// A model loaded for inference only (translate, score, serve: Model::set_inference_only) frees
// each linear weight once its packed copy exists (in float32 also an embedding tied to the
// output projection, read from the packed projection), so it holds one copy of the weights, and
// decodes and scores as the model that keeps them: bit for bit in bfloat16 (the same prepared
// products), within float rounding in float32 (where it packs the encoder's products too). It
// refuses other precisions, changes and saving.
TEST(Decode, InferenceOnlyModelFreesItsFloatWeightsAndKeepsTheOutputs) {
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!cpu_backend().supports(precision)) {
      testing_support::skip_precision(cpu_backend(), precision);
      continue;
    }
    Transliterator t = Transliterator::load();
    Transliterator only = Transliterator::load();
    only.model.set_inference_only(precision);
    const std::vector<int32_t> source = t.source.encode("آ ت ش ي س و ن");
    for (int64_t size : {1, 4}) {
      SearchOptions o = beam(size);
      o.precision = precision;
      const Hypothesis kept = search(t.model, {source}, {}, o)[0][0];
      const Hypothesis freed = search(only.model, {source}, {}, o)[0][0];
      EXPECT_EQ(freed.tokens, kept.tokens) << precision_name(precision);
      if (precision == Precision::kFloat32)
        EXPECT_NEAR(freed.logprob, kept.logprob, 1e-4) << size;
      else
        EXPECT_EQ(freed.logprob, kept.logprob) << size;
    }
    const ModelConfig& c = t.model.config();
    const bool tied = c.share_embeddings != EmbeddingSharing::kNone;
    size_t released = 0;
    const std::map<std::string, ParameterRole> roles = parameter_roles(c);
    for (const auto& [name, tensor] : only.model.parameters()) {
      const bool tied_table = precision == Precision::kFloat32 && tied &&
                              (name == "embed.weight" || name == "tgt_embed.weight");
      EXPECT_EQ(tensor.data == nullptr,
                roles.at(name) == ParameterRole::kLinearWeight || tied_table)
          << name;
      released += tensor.data == nullptr;
    }
    EXPECT_EQ(released, size_t(c.encoder_layers * 6 + c.decoder_layers * 10 + 1 -
                               (tied && precision != Precision::kFloat32 ? 1 : 0)));
    const TokenBatch batch = make_batch(c, {source}, {t.target.encode("a c h i s o n")});
    ScoringWorkspace cache;
    std::vector<float> kept, freed;
    score_forward(t.model, batch, cache, kept, precision);
    score_forward(only.model, batch, cache, freed, precision);
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_NEAR(freed[i], kept[i], 1e-5) << i;
    const Precision other =
        precision == Precision::kFloat32 ? Precision::kBFloat16 : Precision::kFloat32;
    EXPECT_THROW(only.model.prepared(other), Error);
    EXPECT_THROW(only.model.set_inference_only(other), Error);
    EXPECT_THROW(only.model.mutable_parameters(), Error);
    EXPECT_THROW(save_model(only.model, ::testing::TempDir() + "/never.safetensors"),
                 std::logic_error);
  }
}

// A float32 model prepared for inference only reads a tied embedding's rows from the packed
// output projection and frees the table (one copy of the largest matrix): for every sharing,
// the same translations, scores within float rounding (the encoder's products are packed too),
// and the table gone exactly when it is tied; a shared source embedding reads the same rows.
TEST(Decode, InferenceOnlyFloat32ReadsTiedEmbeddingsFromThePackedProjection) {
  for (EmbeddingSharing sharing : kEverySharing) {
    const ModelConfig c = tiny_config(sharing, 37, 29);
    const Model kept = init_model(c, 5, tfm::cpu_backend());
    Model only = init_model(c, 5, tfm::cpu_backend());
    only.set_inference_only(Precision::kFloat32);
    SearchOptions o = beam(3);
    o.min_length = 4;
    o.max_length = 7;
    const std::vector<std::vector<int32_t>> sources = {{5, 6, 7, 8, 28}, {9, 10}, {36, 4, 3}};
    const auto from_kept = search(kept, sources, {}, o);
    const auto from_only = search(only, sources, {}, o);
    for (size_t s = 0; s < sources.size(); ++s) {
      EXPECT_EQ(from_only[s][0].tokens, from_kept[s][0].tokens) << int(sharing);
      EXPECT_NEAR(from_only[s][0].logprob, from_kept[s][0].logprob, 1e-4) << int(sharing);
    }
    const auto prepared = only.prepared(Precision::kFloat32);
    const TransformerWeights& w = prepared->steps;
    const bool tied = sharing != EmbeddingSharing::kNone;
    EXPECT_EQ(w.tgt_embed == nullptr, tied);
    EXPECT_EQ(w.tgt_embed_prepared == w.output.prepared, tied);
    EXPECT_EQ(w.src_embed_prepared != nullptr, sharing == EmbeddingSharing::kAll);
    const std::string table =
        sharing == EmbeddingSharing::kAll ? "embed.weight" : "tgt_embed.weight";
    EXPECT_EQ(only.parameters().at(table).data == nullptr, tied) << int(sharing);
    const TokenBatch batch = make_batch(c, {sources[0]}, {{11, 12, 13}});
    ScoringWorkspace cache;
    std::vector<float> a, b;
    score_forward(kept, batch, cache, a, Precision::kFloat32);
    score_forward(only, batch, cache, b, Precision::kFloat32);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5) << i;
  }
}

// Every way of sharing embeddings, held in int8: the lookup reads the int8 rows, a tied output
// projection multiplies by them, and the result equals the float model's int8 inference (which
// quantises its embeddings by the same rule).
TEST(Decode, Int8EmbeddingsForEverySharing) {
  if (!cpu_backend().supports(Precision::kInt8))
    GTEST_SKIP() << testing_support::cannot_compute(cpu_backend(), Precision::kInt8);
  for (EmbeddingSharing sharing : kEverySharing) {
    const ModelConfig c = tiny_config(sharing, 24, 21);
    const Model float_model = init_model(c, 11, tfm::cpu_backend());
    const std::string path = ::testing::TempDir() + "/int8_sharing.safetensors";
    save_model(float_model, path);
    const Model int8 = load_model(path, cpu_backend(), ModelWeights::kInt8);
    std::remove(path.c_str());
    const TransformerWeights& w = int8.weights();
    EXPECT_EQ(w.src_embed, nullptr);
    EXPECT_EQ(w.tgt_embed, nullptr);
    ASSERT_NE(w.src_embed_int8.values, nullptr);
    ASSERT_NE(w.tgt_embed_int8.values, nullptr);
    EXPECT_EQ(w.src_embed_int8.values == w.tgt_embed_int8.values,
              sharing == EmbeddingSharing::kAll);
    if (sharing != EmbeddingSharing::kNone) {
      EXPECT_EQ(w.output.int8.values, w.tgt_embed_int8.values);
    }
    SearchOptions o = beam(3);
    o.precision = Precision::kInt8;
    o.min_length = 4;
    o.max_length = 6;
    const std::vector<std::vector<int32_t>> sources = {{5, 6, 7, 8}, {9, 10}};
    const auto from_float = search(float_model, sources, {}, o);
    const auto from_int8 = search(int8, sources, {}, o);
    for (size_t s = 0; s < sources.size(); ++s) {
      EXPECT_EQ(from_int8[s][0].tokens, from_float[s][0].tokens) << int(sharing);
      EXPECT_EQ(from_int8[s][0].logprob, from_float[s][0].logprob) << int(sharing);
    }
    SearchOptions f = o;
    f.precision = Precision::kFloat32;
    const auto exact = search(float_model, sources, {}, f);
    EXPECT_NE(exact[0][0].logprob, from_int8[0][0].logprob) << "int8 was not used";
  }
}

TEST(Decode, BatchedSearchEqualsOneSentenceAtATime) {
  Transliterator t = Transliterator::load();
  const std::vector<std::string> inputs = {"آ ت ز م و ن", "آ ز ا", "آ ت ش ي س و ن", "ن"};
  std::vector<std::vector<int32_t>> sources;
  for (const auto& s : inputs) sources.push_back(t.source.encode(s));
  for (int64_t size : {1, 3}) {
    SearchOptions o = beam(size);
    o.nbest = size;
    const auto together = search(t.model, sources, {}, o);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto alone = search(t.model, {sources[i]}, {}, o);
      ASSERT_EQ(together[i].size(), alone[0].size());
      for (size_t k = 0; k < alone[0].size(); ++k) {
        EXPECT_EQ(together[i][k].tokens, alone[0][k].tokens);
        EXPECT_NEAR(together[i][k].logprob, alone[0][k].logprob, 1e-4);
      }
    }
  }
}

// The cross-attention a search keeps: per step, the mean over heads equals the mean of the
// per-head rows it returns with attention_per_head, each row a distribution over the source.
TEST(Decode, KeptAttentionIsTheMeanOfItsHeads) {
  Transliterator t = Transliterator::load();
  const std::vector<std::vector<int32_t>> sources = {t.source.encode("آ ت ز م و ن"),
                                                     t.source.encode("ن")};
  SearchOptions o = beam(3);
  o.attention = true;
  const auto mean = search(t.model, sources, {}, o);
  o.attention_per_head = true;
  const auto per_head = search(t.model, sources, {}, o);
  const int64_t heads = t.model.config().heads;
  ASSERT_GT(heads, 1);
  for (size_t i = 0; i < sources.size(); ++i) {
    const Hypothesis& a = mean[i][0];
    const Hypothesis& b = per_head[i][0];
    ASSERT_EQ(a.tokens, b.tokens);
    ASSERT_EQ(a.attention.size(), b.attention.size());
    ASSERT_FALSE(a.attention.empty());
    const size_t src_len = a.attention[0].size();  // the source's positions (eos if it has one)
    ASSERT_GE(src_len, sources[i].size());
    for (size_t step = 0; step < a.attention.size(); ++step) {
      ASSERT_EQ(a.attention[step].size(), src_len);
      ASSERT_EQ(b.attention[step].size(), src_len * size_t(heads));
      double total = 0;
      for (size_t j = 0; j < src_len; ++j) {
        double sum = 0;
        for (int64_t h = 0; h < heads; ++h) sum += b.attention[step][size_t(h) * src_len + j];
        EXPECT_NEAR(a.attention[step][j], sum / double(heads), 1e-6) << "step " << step;
        total += a.attention[step][j];
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << "step " << step;
    }
  }
}

class IncrementalDecoding : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalDecoding, LogProbsEqualAFullForwardOfTheHypothesis) {
  const std::string dir = TFM_FIXTURE_DIR;
  Model model = load_model(dir + "/" + GetParam() + ".safetensors", tfm::cpu_backend());
  const TensorMap io = read_safetensors(dir + "/" + GetParam() + ".io.safetensors").tensors;
  const Tensor& src = io.at("src_tokens");
  std::vector<std::vector<int32_t>> sources(static_cast<size_t>(src.shape[0]));
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t j = 0; j < src.shape[1]; ++j)
      if (src.data[size_t(b * src.shape[1] + j)] >= 0)
        sources[size_t(b)].push_back(int32_t(src.data[size_t(b * src.shape[1] + j)]));
  for (int64_t size : {1, 3}) {
    SearchOptions o = beam(size);
    o.max_length = 12;
    o.nbest = size;
    const auto results = search(model, sources, {}, o);
    ScoringWorkspace cache;
    for (size_t s = 0; s < sources.size(); ++s)
      for (const Hypothesis& h : results[s]) {
        std::vector<float> logprobs;
        const TokenBatch batch = make_batch(model.config(), {sources[s]}, {h.tokens});
        score_forward(model, batch, cache, logprobs);
        // score_forward scores tokens + eos; a hypothesis cut by the length limit has no eos.
        double total = 0;
        const size_t count = h.tokens.size() + (h.finished_with_eos ? 1 : 0);
        for (size_t t = 0; t < count; ++t) total += logprobs[t];
        EXPECT_NEAR(h.logprob, total, 1e-4) << "sentence " << s << " beam " << size;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, IncrementalDecoding,
                         ::testing::ValuesIn(testing_support::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tfm
