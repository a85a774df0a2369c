// Directories written by CTranslate2's own converters, not by this project, from models built
// with the producing toolkits' own code (random weights):
//  - m2m100: a tiny M2M100 model of Hugging Face Transformers 4.40.2, converted by CTranslate2
//    4.6.2's ct2-transformers-converter (tests/fixtures/convert_with_ctranslate2.py);
//  - opennmt_py: a tiny OpenNMT-py 3.5.1 Transformer saved by its trainer's ModelSaver, converted
//    by CTranslate2 4.8.5's ct2-opennmt-py-converter
//    (tests/fixtures/convert_opennmt_py_with_ctranslate2.py);
//  - fairseq: a tiny fairseq `transformer` made by fairseq-preprocess and fairseq-train (source
//    of 0.12.2), converted by CTranslate2 4.8.5's ct2-fairseq-converter
//    (tests/fixtures/convert_fairseq_with_ctranslate2.py).
// Each NAME.expected.json holds what CTranslate2's runtime translated and scored with NAME/ (for
// m2m100, 4.8.5's runtime gives 4.6.2's tokens, scores within 3e-6;
// tests/data/ctranslate2-converted/README.md). Imported, a model must translate to CTranslate2's
// tokens and score CTranslate2's log-probabilities; m2m100, exported again, must be the
// converter's directory but for the differences listed in ExportIsWhatTheConverterWrote.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "decode/beam_search.h"
#ifdef TFM_EMULATED_CUDA_TESTS
#include "emulated_cuda_backend.h"
#endif
#include "fixture_batch.h"
#include "io/ctranslate2.h"
#include "model/transformer.h"
#include "tensor/file_util.h"

namespace tfm {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(TFM_FIXTURE_DIR) + "/../data/ctranslate2-converted";
const std::string kModel = kDir + "/m2m100";

nlohmann::json expected(const std::string& name = "m2m100") {
  return nlohmann::json::parse(read_file_bytes(kDir + "/" + name + ".expected.json"));
}

struct Converted {
  ImportedModel imported;
  Model model;
  std::map<std::string, int32_t> source_ids, target_ids;

  explicit Converted(const std::string& name = "m2m100", const Backend& backend = cpu_backend())
      : imported(import_ctranslate2(kDir + "/" + name)),
        model(imported.config, TensorMap(imported.parameters), name, backend) {
    for (size_t i = 0; i < imported.source_tokens.size(); ++i)
      source_ids.emplace(imported.source_tokens[i], int32_t(i));
    for (size_t i = 0; i < imported.target_tokens.size(); ++i)
      target_ids.emplace(imported.target_tokens[i], int32_t(i));
  }
  static std::vector<int32_t> encode(const std::map<std::string, int32_t>& ids,
                                     const nlohmann::json& tokens) {
    std::vector<int32_t> out;
    for (const auto& t : tokens) out.push_back(ids.at(t.get<std::string>()));
    return out;
  }
  std::vector<int32_t> source(const nlohmann::json& tokens) const {
    return encode(source_ids, tokens);
  }
  std::vector<int32_t> target(const nlohmann::json& tokens) const {
    return encode(target_ids, tokens);
  }
  std::vector<std::string> decode(const std::vector<int32_t>& tokens) const {
    std::vector<std::string> out;
    for (int32_t id : tokens) out.push_back(imported.target_tokens[size_t(id)]);
    return out;
  }
};

#ifndef TFM_EMULATED_CUDA_TESTS  // (the emulated_cuda_tests binary: the device tests alone)
TEST(CTranslate2Converted, ImportsAsAPlainPreNormTransformer) {
  const Converted m;
  const ModelConfig& c = m.model.config();
  EXPECT_EQ(c.encoder_layers, 1);
  EXPECT_EQ(c.decoder_layers, 1);
  EXPECT_EQ(c.d_model, 16);
  EXPECT_EQ(c.heads, 2);
  EXPECT_EQ(c.d_ff, 32);
  EXPECT_EQ(c.norm, NormPosition::kPre);
  EXPECT_EQ(c.activation, Activation::kRelu);
  EXPECT_EQ(c.share_embeddings, EmbeddingSharing::kAll);
  EXPECT_TRUE(c.scale_embeddings);  // the converter's float 4.0 = sqrt(16)
  EXPECT_FALSE(c.output_bias);
  // fairseq's sinusoid, stored by the converter as a table from position 2 (padding_idx + 1).
  EXPECT_EQ(c.position_encoding, PositionEncoding::kSinusoidal);
  EXPECT_EQ(c.sinusoid_layout, SinusoidLayout::kConcat);
  EXPECT_EQ(c.position_offset, 2);
  EXPECT_FALSE(c.src_append_eos);   // M2M100's tokenizer writes </s> itself
  EXPECT_EQ(c.src_vocab_size, 45);  // 29 pieces and specials, 8 languages, 8 madeupwords
  EXPECT_EQ(m.imported.target_tokens[size_t(c.eos_id)], "</s>");
  EXPECT_EQ(c.bos_id, c.eos_id);  // decoder_start_token </s>
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
}

// OpenNMT-py's Transformer as CTranslate2 reads it: pre-norm with final norms, its interleaved
// sinusoid from position 0, embeddings scaled, no query/key/value biases (zeros here), the output
// projection tied to the target embeddings with a bias of its own, <unk> <blank> <s> </s> first.
TEST(CTranslate2Converted, ImportsOpenNmtPysTransformer) {
  const Converted m("opennmt_py");
  const ModelConfig& c = m.model.config();
  EXPECT_EQ(c.encoder_layers, 2);
  EXPECT_EQ(c.decoder_layers, 2);
  EXPECT_EQ(c.d_model, 16);
  EXPECT_EQ(c.heads, 2);
  EXPECT_EQ(c.d_ff, 32);
  EXPECT_EQ(c.norm, NormPosition::kPre);
  EXPECT_EQ(c.activation, Activation::kRelu);
  EXPECT_EQ(c.share_embeddings, EmbeddingSharing::kTarget);
  EXPECT_TRUE(c.scale_embeddings);
  EXPECT_TRUE(c.output_bias);
  EXPECT_EQ(c.position_encoding, PositionEncoding::kSinusoidal);
  EXPECT_EQ(c.sinusoid_layout, SinusoidLayout::kInterleaved);
  EXPECT_EQ(c.position_offset, 0);
  EXPECT_FALSE(c.src_append_eos);
  EXPECT_EQ(c.src_vocab_size, 19);
  EXPECT_EQ(c.tgt_vocab_size, 18);
  EXPECT_EQ((std::vector<int64_t>{c.pad_id, c.bos_id, c.eos_id}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.layer_norm_eps, 1e-5);  // CTranslate2's default: the converter records none
  for (const char* bias :
       {"encoder.layers.0.self_attn.q.bias", "decoder.layers.1.cross_attn.v.bias"})
    for (float value : m.imported.parameters.at(bias).data) EXPECT_EQ(value, 0.f) << bias;
}

// fairseq's `transformer` as CTranslate2 reads it: post-norm (the paper's), its sinusoid from
// position 2 (padding_idx + 1), embeddings scaled, one dictionary for both sides and the output
// projection, </s> appended to every source and starting the decoder.
TEST(CTranslate2Converted, ImportsFairseqsTransformer) {
  const Converted m("fairseq");
  const ModelConfig& c = m.model.config();
  EXPECT_EQ(c.encoder_layers, 2);
  EXPECT_EQ(c.decoder_layers, 2);
  EXPECT_EQ(c.d_model, 16);
  EXPECT_EQ(c.heads, 2);
  EXPECT_EQ(c.d_ff, 32);
  EXPECT_EQ(c.norm, NormPosition::kPost);
  EXPECT_EQ(c.activation, Activation::kRelu);
  EXPECT_EQ(c.share_embeddings, EmbeddingSharing::kAll);
  EXPECT_TRUE(c.scale_embeddings);
  EXPECT_FALSE(c.output_bias);
  EXPECT_EQ(c.position_encoding, PositionEncoding::kSinusoidal);
  EXPECT_EQ(c.sinusoid_layout, SinusoidLayout::kConcat);
  EXPECT_EQ(c.position_offset, 2);
  EXPECT_TRUE(c.src_append_eos);
  EXPECT_EQ(c.src_vocab_size, 48);  // fairseq pads its dictionary to a multiple of 8
  EXPECT_EQ(m.imported.target_tokens[size_t(c.eos_id)], "</s>");
  EXPECT_EQ(c.bos_id, c.eos_id);  // decoder_start_token </s>
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
}

#endif  // TFM_EMULATED_CUDA_TESTS

class ConvertedModel : public ::testing::TestWithParam<std::string> {};
// The same models on every backend present (the CPU, and each GPU where there is one).
class ConvertedModelOnDevice : public ::testing::TestWithParam<testing_support::FixtureOnDevice> {};

// score_batch: per target token and </s>, CTranslate2's log-probabilities.
TEST_P(ConvertedModelOnDevice, ScoresAreCTranslate2s) {
  const Converted m(GetParam().fixture, testing_support::backend_of(GetParam()));
  const nlohmann::json cases = expected(GetParam().fixture)["score"];
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& e : cases) {
    const std::vector<int32_t> target = m.target(e["tokens"]);  // </s> included
    TokenBatch batch = make_batch(m.model.config(), {m.source(e["source"])},
                                  {std::vector<int32_t>(target.begin(), target.end() - 1)});
    ScoringWorkspace ws;
    std::vector<float> logprobs;
    score_forward(m.model, batch, ws, logprobs);
    const auto& want = e["log_probs"];
    ASSERT_EQ(batch.tgt_lengths[0], int64_t(want.size()));
    for (size_t t = 0; t < want.size(); ++t)
      EXPECT_NEAR(logprobs[t], want[t].get<double>(), 1e-5) << e["tokens"] << " position " << t;
  }
}

// Per token of `target` and then </s>, our log-probabilities under teacher forcing.
std::vector<float> token_logprobs(const Converted& m, const std::vector<int32_t>& source,
                                  const std::vector<int32_t>& target) {
  TokenBatch batch = make_batch(m.model.config(), {source}, {target});
  ScoringWorkspace ws;
  std::vector<float> logprobs;
  score_forward(m.model, batch, ws, logprobs);
  logprobs.resize(size_t(batch.tgt_lengths[0]));
  return logprobs;
}

// Sampling (SearchOptions::sampling) on this backend: the CPU's draws, each scored as the
// teacher-forced log-probabilities (CTranslate2's, above) of its tokens and </s> add up,
// untempered; from the backend's 10 best and from whole rows copied back.
TEST_P(ConvertedModelOnDevice, SampledDrawsAreTheCpusAndScoreAsScoring) {
  const Converted m(GetParam().fixture, testing_support::backend_of(GetParam()));
  const Converted on_cpu(GetParam().fixture);
  const nlohmann::json e = expected(GetParam().fixture)["translate"][0];
  const std::vector<int32_t> source = m.source(e["source"]), prefix = m.target(e["target_prefix"]);
  for (const SamplingOptions& sampling :
       {SamplingOptions{10, 0.9, 1.5, 3}, SamplingOptions{0, 1, 2, 4}}) {
    SCOPED_TRACE("topk " + std::to_string(sampling.topk));
    SearchOptions o;
    o.beam = 1;
    o.nbest = 3;
    o.max_length = 8;
    o.sampling = sampling;
    const std::vector<Hypothesis> drawn = search(m.model, {source}, {prefix}, o)[0];
    const std::vector<Hypothesis> cpu = search(on_cpu.model, {source}, {prefix}, o)[0];
    ASSERT_EQ(drawn.size(), 3u);
    ASSERT_EQ(cpu.size(), 3u);
    for (size_t i = 0; i < drawn.size(); ++i) {
      EXPECT_EQ(drawn[i].tokens, cpu[i].tokens) << i;
      const std::vector<float> lp = token_logprobs(m, source, drawn[i].tokens);
      double sum = 0;
      for (size_t t = 0; t < drawn[i].tokens.size() + (drawn[i].finished_with_eos ? 1 : 0); ++t)
        sum += lp[t];
      EXPECT_NEAR(drawn[i].logprob, sum, 1e-3) << i;
    }
  }
}

// translate_batch (m2m100: with a target_prefix), beam_size 1 / 2 / 4, length_penalty 0
// (hypotheses ranked by their log-probability, as our alpha 0) and max_decoding_length 12 (the
// prefix included). CTranslate2's score leaves out the forced prefix, which our
// Hypothesis::logprob counts; neither counts a </s> after a hypothesis stopped by the length cap.
TEST_P(ConvertedModelOnDevice, TranslationsAreCTranslate2s) {
  const Converted m(GetParam().fixture, testing_support::backend_of(GetParam()));
  const nlohmann::json cases = expected(GetParam().fixture)["translate"];
  ASSERT_EQ(cases.size(), 9u);
  int same = 0, capped = 0, ended = 0, better = 0;
  for (const auto& e : cases) {
    SCOPED_TRACE(e["source"].dump() + " beam " + e["beam_size"].dump());
    SearchOptions o;
    o.beam = e["beam_size"].get<int64_t>();
    o.alpha = e["length_penalty"].get<double>();
    o.max_length = e["max_decoding_length"].get<int64_t>();
    // CTranslate2's default min_decoding_length, 1 (m2m100's file predates the key).
    o.min_length = e.value("min_decoding_length", int64_t(1));
    const std::vector<int32_t> source = m.source(e["source"]),
                               prefix = m.target(e["target_prefix"]),
                               theirs = m.target(e["tokens"]);
    const Hypothesis h = search(m.model, {source}, {prefix}, o)[0][0];
    // Our model gives CTranslate2's hypothesis CTranslate2's score. At a step before
    // min_decoding_length CTranslate2 takes </s> out of the softmax, which raises the chosen
    // token's log-probability by -log(1 - p(</s>)); our search forbids </s> there too, and our
    // log-probabilities stay those of the whole vocabulary (as fairseq's and the score command's).
    const std::vector<float> lp = token_logprobs(m, source, theirs);
    const bool their_eos = int64_t(theirs.size()) < o.max_length;
    double prefix_logprob = 0, their_score = their_eos ? lp[theirs.size()] : 0.0;
    for (size_t t = 0; t < theirs.size(); ++t)
      (t < prefix.size() ? prefix_logprob : their_score) += lp[t];
    double renormalised = 0;  // what CTranslate2 adds
    for (size_t t = prefix.size(); t < size_t(o.min_length) && t < theirs.size(); ++t) {
      const std::vector<int32_t> before(theirs.begin(), theirs.begin() + long(t));
      renormalised -= std::log1p(-std::exp(double(token_logprobs(m, source, before)[t])));
    }
    EXPECT_NEAR(their_score + renormalised, e["score"].get<double>(), 1e-4);
    if (h.tokens == theirs) {
      ++same;
      capped += !their_eos;
      ended += their_eos;
      EXPECT_EQ(h.finished_with_eos, their_eos);
      EXPECT_NEAR(h.logprob - prefix_logprob + renormalised, e["score"].get<double>(), 1e-4);
      continue;
    }
    // Where the searches part, ours found the more likely translation: CTranslate2 keeps the
    // `beam` best candidates of a step and lets </s> end a hypothesis only among them, we keep
    // 2 x beam (as fairseq and Marian) and so finish a hypothesis that ranked below the beam.
    // m2m100: beam 4 ends "__de__ </s>" (-2.42 after the prefix), CTranslate2 "__de__ ▁book
    // <unk> </s>" (-3.10).
    ASSERT_GT(o.beam, 1) << "greedy search must give CTranslate2's tokens";
    ASSERT_TRUE(h.finished_with_eos);
    EXPECT_GT(h.logprob - prefix_logprob, e["score"].get<double>() + 0.1)
        << "ours: " << ::testing::PrintToString(m.decode(h.tokens));
    ++better;
  }
  // How the nine cases came out (same hypothesis, of which ended by </s> or capped; ours better).
  const std::map<std::string, std::array<int, 4>> outcomes = {
      {"m2m100", {8, 2, 6, 1}}, {"opennmt_py", {9, 3, 6, 0}}, {"fairseq", {9, 3, 6, 0}}};
  EXPECT_EQ((std::array<int, 4>{same, capped, ended, better}), outcomes.at(GetParam().fixture));
}

// Our exporter, on each imported model: the converter's variables, by name and shape, and the
// values of every weight, bias and layer norm (the flags and position tables differ in form:
// ExportIsWhatTheConverterWrote lists how for m2m100). The biases a model does not have
// (OpenNMT-py's query/key/value and feed-forward ones) are left out, as the converter leaves
// them out, though the import holds them as zeros.
TEST_P(ConvertedModel, ExportHasTheConvertersWeights) {
  const Converted m(GetParam());
  const std::string dir = fs::temp_directory_path() / ("tfm_ct2_export_" + GetParam());
  fs::remove_all(dir);
  export_ctranslate2(m.model,
                     {m.imported.source_tokens, m.imported.target_tokens, std::string("<unk>")},
                     CtQuantization::kFloat32, dir);
  const std::string theirs_path = kDir + "/" + GetParam() + "/model.bin",
                    ours_path = dir + "/model.bin";
  const CTranslate2Variables theirs =
      parse_ctranslate2_model(read_file_bytes(theirs_path), theirs_path);
  const CTranslate2Variables ours = parse_ctranslate2_model(read_file_bytes(ours_path), ours_path);
  std::vector<std::string> their_names, our_names;
  for (const auto& [name, t] : theirs.variables) their_names.push_back(name);
  for (const auto& [name, t] : ours.variables) our_names.push_back(name);
  EXPECT_EQ(our_names, their_names);
  for (const auto& [name, want] : theirs.variables) {
    const auto got = ours.variables.find(name);
    if (got == ours.variables.end()) continue;
    EXPECT_EQ(got->second.shape, want.shape) << name;
    const std::string last = name.substr(name.rfind('/') + 1);
    if (last == "weight" || last == "bias" || last == "gamma" || last == "beta") {
      EXPECT_TRUE(got->second.data == want.data) << name;
    }
  }
  fs::remove_all(dir);
}

const std::vector<std::string> kConverted = {"m2m100", "opennmt_py", "fairseq"};
#ifdef TFM_EMULATED_CUDA_TESTS
// The emulated_cuda_tests binary: the CUDA backend's kernels and products run on the CPU
// (emulated_cuda_backend.h); the export, no device's, is not its test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConvertedModel);
INSTANTIATE_TEST_SUITE_P(
    Converters, ConvertedModelOnDevice,
    ::testing::ValuesIn(testing_support::on_backend(kConverted, emulated_cuda_backend())),
    [](const auto& info) { return testing_support::fixture_on_device_name(info.param); });
#else
INSTANTIATE_TEST_SUITE_P(Converters, ConvertedModel, ::testing::ValuesIn(kConverted));
INSTANTIATE_TEST_SUITE_P(Converters, ConvertedModelOnDevice,
                         ::testing::ValuesIn(testing_support::on_every_device(kConverted)),
                         [](const auto& info) {
                           return testing_support::fixture_on_device_name(info.param);
                         });

// Our exporter, on the imported model, against the converter's own directory: every variable
// with the same name, type, shape and value, except
//  - the position table, which we write from our sinusoid (the converter copies Transformers'
//    float32 table: they differ by rounding, < 3e-6);
//  - scale_embeddings, which the converter writes as the float 4.0 (embed_scale) and we as the
//    boolean true that TransformerSpec.from_config writes (CTranslate2 reads it as sqrt(d_model));
// and config.json, where the converter writes bos_token "<s>" (the tokenizer's, unused by this
// model: our model has no token of that role, so we write the decoder's start token) and
// layer_norm_epsilon null (CTranslate2's default, 1e-5, which we write out). Aliases and the
// order of the variables are the converter's too (checked outside the suite); the vocabulary
// holds the same tokens (the converter escapes non-ASCII, we write UTF-8).
TEST(CTranslate2Converted, ExportIsWhatTheConverterWrote) {
  const Converted m;
  const std::string dir = fs::temp_directory_path() / "tfm_ct2_converted_export";
  fs::remove_all(dir);
  export_ctranslate2(m.model,
                     {m.imported.source_tokens, m.imported.target_tokens, std::string("<unk>")},
                     CtQuantization::kFloat32, dir);
  const std::string theirs_path = kModel + "/model.bin", ours_path = dir + "/model.bin";
  const CTranslate2Variables theirs =
      parse_ctranslate2_model(read_file_bytes(theirs_path), theirs_path);
  const CTranslate2Variables ours = parse_ctranslate2_model(read_file_bytes(ours_path), ours_path);
  EXPECT_EQ(ours.version, theirs.version);
  EXPECT_EQ(ours.spec_name, theirs.spec_name);
  EXPECT_EQ(ours.spec_revision, theirs.spec_revision);
  std::vector<std::string> their_names, our_names;
  for (const auto& [name, t] : theirs.variables) their_names.push_back(name);
  for (const auto& [name, t] : ours.variables) our_names.push_back(name);
  ASSERT_EQ(our_names, their_names);
  for (const auto& [name, want] : theirs.variables) {
    const Tensor& got = ours.variables.at(name);
    EXPECT_EQ(got.shape, want.shape) << name;
    if (name.find("scale_embeddings") != std::string::npos) {
      EXPECT_EQ(theirs.stored_dtypes.at(name), CtDtype::kF32);
      EXPECT_EQ(want.data, std::vector<float>{4.f});
      EXPECT_EQ(ours.stored_dtypes.at(name), CtDtype::kI8);
      EXPECT_EQ(got.data, std::vector<float>{1.f});
      continue;
    }
    EXPECT_EQ(ours.stored_dtypes.at(name), theirs.stored_dtypes.at(name)) << name;
    if (name.find("position_encodings") != std::string::npos) {
      ASSERT_EQ(got.data.size(), want.data.size());
      for (size_t i = 0; i < want.data.size(); ++i)
        ASSERT_NEAR(got.data[i], want.data[i], 3e-6) << name << " " << i;
      continue;
    }
    EXPECT_TRUE(got.data == want.data) << name;
  }
  nlohmann::json their_config = nlohmann::json::parse(read_file_bytes(kModel + "/config.json"));
  nlohmann::json our_config = nlohmann::json::parse(read_file_bytes(dir + "/config.json"));
  EXPECT_EQ(their_config["bos_token"], "<s>");
  EXPECT_EQ(our_config["bos_token"], "</s>");
  EXPECT_TRUE(their_config["layer_norm_epsilon"].is_null());
  EXPECT_EQ(our_config["layer_norm_epsilon"], 1e-5);
  for (const char* key : {"bos_token", "layer_norm_epsilon"}) {
    their_config.erase(key);
    our_config.erase(key);
  }
  EXPECT_EQ(our_config, their_config);
  EXPECT_EQ(nlohmann::json::parse(read_file_bytes(dir + "/shared_vocabulary.json")),
            nlohmann::json::parse(read_file_bytes(kModel + "/shared_vocabulary.json")));
  fs::remove_all(dir);
}
#endif  // TFM_EMULATED_CUDA_TESTS

}  // namespace
}  // namespace tfm
