// CTranslate2 interchange against outside references: spec-revision-7 model directories written
// by tests/fixtures/make_ctranslate2_models.py (CTranslate2's documented layout, independent of
// our exporter) from the PyTorch fixtures must import to models whose log-probabilities equal
// the float64 PyTorch references; export must reproduce those files byte for byte where the
// generator's arithmetic is ours, and import(export(m)) == m for every fixture model; each
// CTranslate2 feature we do not implement is refused by name only when switched on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "fixture_batch.h"
#include "io/ctranslate2.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/float16.h"

namespace tfm {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = TFM_FIXTURE_DIR;
const std::string kSpec7 = kFixtures + "/../data/ctranslate2-spec7";
const testing_support::CliWorkDir work("tfm_ct2_interchange_test");

// Largest |ours - PyTorch| over the fixture's target tokens (eos included).
double worst_logprob_error(const Model& model, const std::string& fixture) {
  TensorMap io = read_safetensors(kFixtures + "/" + fixture + ".io.safetensors").tensors;
  TokenBatch batch = testing_support::fixture_batch(model.config(), io);
  ScoringWorkspace ws;
  std::vector<float> logprobs;
  score_forward(model, batch, ws, logprobs);
  const Tensor& expected = io.at("token_logprobs");
  double worst = 0;
  for (int64_t b = 0; b < batch.batch; ++b)
    for (int64_t t = 0; t < batch.tgt_lengths[size_t(b)]; ++t)
      worst = std::max(worst, std::fabs(double(logprobs[size_t(b * batch.tgt_len + t)]) -
                                        expected.data[size_t(b * expected.shape[1] + t)]));
  return worst;
}

Model import_model(const std::string& dir) {
  ImportedModel m = import_ctranslate2(dir);
  return Model(m.config, std::move(m.parameters), dir, tfm::cpu_backend());
}

struct Spec7Case {
  std::string variant, fixture;
};

class Spec7Import : public ::testing::TestWithParam<Spec7Case> {};

TEST_P(Spec7Import, LogProbabilitiesMatchPyTorch) {
  const Spec7Case& p = GetParam();
  const Model fixture =
      load_model(kFixtures + "/" + p.fixture + ".safetensors", tfm::cpu_backend());
  const Model imported = import_model(kSpec7 + "/" + p.variant);
  const ModelConfig &want = fixture.config(), &got = imported.config();
  EXPECT_EQ(got.norm, want.norm);
  EXPECT_EQ(got.activation, want.activation);  // CTranslate2's enum: RELU 0, GELU 3
  EXPECT_EQ(got.share_embeddings, want.share_embeddings);
  EXPECT_EQ(got.output_bias, want.output_bias);
  EXPECT_EQ(got.scale_embeddings, want.scale_embeddings);
  EXPECT_EQ(got.position_encoding, want.position_encoding);
  EXPECT_EQ(got.src_append_eos, want.src_append_eos);
  EXPECT_EQ(got.layer_norm_eps, want.layer_norm_eps);
  EXPECT_EQ((std::tuple{got.bos_id, got.eos_id}), (std::tuple{want.bos_id, want.eos_id}));
  if (want.position_encoding == PositionEncoding::kSinusoidal) {
    EXPECT_EQ(got.sinusoid_layout, want.sinusoid_layout);  // recognised from the float32 table
    EXPECT_EQ(got.position_offset, want.position_offset);
  }
  const bool quantized = p.variant != p.fixture;
  EXPECT_LT(worst_logprob_error(imported, p.fixture), quantized ? 0.05 : 1e-4);
}

// Each stored weight within its format's rounding of the float32 original.
class Spec7Quantised : public ::testing::TestWithParam<Spec7Case> {};

TEST_P(Spec7Quantised, WeightsWithinTheirRoundingOfTheOriginal) {
  const Spec7Case& p = GetParam();
  const Model fixture =
      load_model(kFixtures + "/" + p.fixture + ".safetensors", tfm::cpu_backend());
  const Model imported = import_model(kSpec7 + "/" + p.variant);
  const bool int8 = p.variant.find("int8") != std::string::npos,
             int16 = p.variant.find("int16") != std::string::npos,
             bf16 = p.variant.find("bfloat16") != std::string::npos;
  const TensorMap fixture_host = fixture.parameters().to_host(),
                  imported_host = imported.parameters().to_host();
  for (const auto& [name, original] : fixture_host) {
    if (name.find("pos_embed") != std::string::npos) continue;
    const Tensor& got = imported_host.at(name);
    ASSERT_EQ(got.shape, original.shape) << name;
    const bool weight = name.find("norm") == std::string::npos && name.size() > 7 &&
                        name.compare(name.size() - 7, 7, ".weight") == 0;
    const int64_t rows = original.shape[0], cols = original.numel() / rows;
    // int16 has one scale per CTranslate2 matrix: q/k/v and cross-attention k/v are fused.
    float matrix_max = 0;
    std::vector<std::string> fused = {name};
    for (const char* group : {".self_attn.", ".cross_attn."}) {
      const size_t at = name.find(group);
      if (at == std::string::npos || name.compare(at + std::strlen(group) + 1, 7, ".weight") != 0 ||
          name[at + std::strlen(group)] == 'o' ||
          (name[at + 1] == 'c' && name[at + std::strlen(group)] == 'q'))
        continue;
      fused.clear();
      for (const char* part : {"q", "k", "v"})
        if (std::string(group) == ".self_attn." || std::string(part) != "q")
          fused.push_back(name.substr(0, at) + group + part + ".weight");
    }
    for (const std::string& member : fused)
      for (float v : fixture_host.at(member).data) matrix_max = std::max(matrix_max, std::fabs(v));
    for (int64_t r = 0; r < rows; ++r) {
      float row_max = 0;
      for (int64_t k = 0; k < cols; ++k)
        row_max = std::max(row_max, std::fabs(original.data[size_t(r * cols + k)]));
      for (int64_t k = 0; k < cols; ++k) {
        const double w = original.data[size_t(r * cols + k)], q = got.data[size_t(r * cols + k)];
        double bound;  // half a quantisation step, or half an ulp of the 16-bit format
        if (int8 && weight)
          bound = 0.5 * row_max / 127.0;
        else if (int16 && weight)
          bound = 0.5 * matrix_max / 1024.0;
        else if (int8 || int16)
          bound = 0;
        else
          bound = std::fabs(w) * (bf16 ? 1.0 / 256 : 1.0 / 2048) + 6e-8;
        EXPECT_LE(std::fabs(w - q), bound * (1 + 1e-5) + 1e-9)
            << name << " [" << r << "," << k << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Spec7Import,
    ::testing::Values(Spec7Case{"paper_post", "paper_post"},
                      Spec7Case{"pre_gelu_target", "pre_gelu_target"},
                      Spec7Case{"none_learned", "none_learned"},
                      Spec7Case{"pre_nope_noscale", "pre_nope_noscale"},
                      Spec7Case{"single", "single"}, Spec7Case{"paper_post_int8", "paper_post"},
                      Spec7Case{"pre_gelu_target_int16", "pre_gelu_target"},
                      Spec7Case{"none_learned_float16", "none_learned"},
                      Spec7Case{"pre_nope_noscale_bfloat16", "pre_nope_noscale"}),
    [](const auto& info) { return info.param.variant; });

INSTANTIATE_TEST_SUITE_P(Variants, Spec7Quantised,
                         ::testing::Values(Spec7Case{"paper_post_int8", "paper_post"},
                                           Spec7Case{"pre_gelu_target_int16", "pre_gelu_target"},
                                           Spec7Case{"none_learned_float16", "none_learned"},
                                           Spec7Case{"pre_nope_noscale_bfloat16",
                                                     "pre_nope_noscale"}),
                         [](const auto& info) { return info.param.variant; });

std::vector<std::string> synthetic_vocabulary(int64_t size) {
  std::vector<std::string> tokens = {"<blank>", "<s>", "</s>", "<unk>"};
  for (int64_t i = 4; i < size; ++i) {
    std::string token = "w";  // appended, not "w" + …: GCC 12 warns falsely (-Wrestrict) on that
    token += std::to_string(i);
    tokens.push_back(token);
  }
  return tokens;
}

CTranslate2Tokens tokens_for(const ModelConfig& c) {
  return {synthetic_vocabulary(c.src_vocab_size), synthetic_vocabulary(c.tgt_vocab_size), "<unk>"};
}

std::string export_to(const Model& model, const std::string& name, CtQuantization q) {
  const std::string dir = work.path(name);
  fs::remove_all(dir);
  export_ctranslate2(model, tokens_for(model.config()), q, dir);
  return dir;
}

// Vocabularies CTranslate2 would read differently from ours are refused before anything is
// written: a size that is not the model's; no unknown token (its loader would append one); a
// target bos or eos token that also sits at a lower id (its token-to-id map keeps the first); a
// source vocabulary without the end token at eos_id when every source gets one appended.
TEST(CTranslate2Export, VocabulariesCTranslate2WouldReadOtherwiseAreRefused) {
  const Model model = load_model(kFixtures + "/paper_post.safetensors", tfm::cpu_backend());
  ASSERT_TRUE(model.config().src_append_eos);
  const CTranslate2Tokens good = tokens_for(model.config());
  struct Case {
    const char* what;
    std::function<void(CTranslate2Tokens&)> spoil;
    const char* message;
  };
  const Case cases[] = {
      {"a source token short", [](CTranslate2Tokens& t) { t.source.pop_back(); },
       "do not match the model's vocabulary sizes"},
      {"a target token more", [](CTranslate2Tokens& t) { t.target.push_back("extra"); },
       "do not match the model's vocabulary sizes"},
      {"no unknown token", [](CTranslate2Tokens& t) { t.unk_token = "<oov>"; },
       "need the unknown token"},
      {"the target's unknown token missing", [](CTranslate2Tokens& t) { t.target[3] = "w3"; },
       "need the unknown token"},
      {"bos also at id 0", [](CTranslate2Tokens& t) { t.target[0] = t.target[1]; },
       "the target token of bos_id"},
      {"eos also at id 1", [](CTranslate2Tokens& t) { t.target[1] = t.target[2]; },
       "the target token of eos_id"},
      {"the source without the end token", [](CTranslate2Tokens& t) { t.source[2] = "</source>"; },
       "the source vocabulary does not hold the end token"},
  };
  for (const Case& c : cases) {
    CTranslate2Tokens tokens = good;
    c.spoil(tokens);
    const std::string dir = work.path("refused_vocabulary");
    fs::remove_all(dir);
    try {
      export_ctranslate2(model, tokens, CtQuantization::kFloat32, dir);
      ADD_FAILURE() << c.what << ": exported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << c.what << ": " << e.what();
    }
    EXPECT_FALSE(fs::exists(dir)) << c.what;
  }
  // The unspoiled tokens export (the cases above fail for their own reason).
  const std::string dir = work.path("accepted_vocabulary");
  fs::remove_all(dir);
  export_ctranslate2(model, good, CtQuantization::kFloat32, dir);
  EXPECT_TRUE(fs::exists(dir + "/model.bin"));
}

// The generator and the exporter are separate writers of the same spec: where the generator's
// arithmetic is ours (no float32 sinusoid table), their model.bin must be the same bytes.
TEST(CTranslate2Export, SameBytesAsTheSpecGenerator) {
  const Model model = load_model(kFixtures + "/pre_gelu_target.safetensors", tfm::cpu_backend());
  for (auto [variant, q] : {std::pair{"pre_gelu_target", CtQuantization::kFloat32},
                            std::pair{"pre_gelu_target_int16", CtQuantization::kInt16}}) {
    const std::string dir = export_to(model, variant, q);
    EXPECT_TRUE(read_file_bytes(dir + "/model.bin") ==
                read_file_bytes(kSpec7 + "/" + variant + "/model.bin"))
        << variant;
    EXPECT_EQ(nlohmann::json::parse(read_file_bytes(dir + "/config.json")),
              nlohmann::json::parse(read_file_bytes(kSpec7 + "/" + variant + "/config.json")));
    for (const char* vocab : {"source_vocabulary.json", "target_vocabulary.json"})
      EXPECT_EQ(nlohmann::json::parse(read_file_bytes(dir + "/" + vocab)),
                nlohmann::json::parse(read_file_bytes(kSpec7 + "/" + variant + "/" + vocab)));
  }
}

TEST(CTranslate2Export, RoundTripIsIdentityForEveryFixtureModel) {
  int exported = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures)) {
    const std::string file = entry.path().filename().string();
    if (file.find('.') != file.rfind('.') || entry.path().extension() != ".safetensors") continue;
    const Model model = load_model(entry.path().string(), tfm::cpu_backend());
    const ModelConfig& c = model.config();
    if (c.self_attention_window >= 0 || c.attention == AttentionScoring::kAdditive) {
      try {
        export_to(model, "refused", CtQuantization::kFloat32);
        ADD_FAILURE() << file << ": restricted or additive attention exported";
      } catch (const Error& e) {
        EXPECT_NE(
            std::string(e.what()).find(c.self_attention_window >= 0 ? "restricted self-attention"
                                                                    : "additive attention"),
            std::string::npos)
            << e.what();
      }
      continue;
    }
    const Model back = import_model(export_to(model, file + ".ct2", CtQuantization::kFloat32));
    EXPECT_EQ(config_to_json_text(back.config()), config_to_json_text(c)) << file;
    const TensorMap back_host = back.parameters().to_host();
    ASSERT_EQ(back_host.size(), model.parameters().size()) << file;
    for (const auto& [name, t] : model.parameters().to_host()) {
      const Tensor& u = back_host.at(name);
      EXPECT_EQ(u.shape, t.shape) << file << " " << name;
      EXPECT_TRUE(u.data == t.data) << file << " " << name;
    }
    ++exported;
  }
  EXPECT_GE(exported, 5);
}

TEST(CTranslate2Export, QuantisedExportsImportWithinTheirRounding) {
  const Model model = load_model(kFixtures + "/paper_post.safetensors", tfm::cpu_backend());
  for (CtQuantization q :
       {CtQuantization::kInt8, CtQuantization::kInt8Float16, CtQuantization::kInt8BFloat16,
        CtQuantization::kInt16, CtQuantization::kFloat16, CtQuantization::kBFloat16}) {
    const Model back =
        import_model(export_to(model, std::string("q_") + ct_quantization_name(q), q));
    EXPECT_EQ(config_to_json_text(back.config()), config_to_json_text(model.config()));
    EXPECT_LT(worst_logprob_error(back, "paper_post"), 0.05) << ct_quantization_name(q);
  }
  // As ModelSpec._quantize stores them: int8_float16 / int8_bfloat16 hold the very int8 weights
  // and scales of int8, and every other float tensor (biases, norms) in float16 / bfloat16;
  // "int8_float32" is CTranslate2's other name for int8 of a float32 model.
  EXPECT_EQ(parse_ct_quantization("int8_float32"), CtQuantization::kInt8);
  const auto stored = [](const std::string& name) {
    return parse_ctranslate2_model(read_file_bytes(work.path(name + "/model.bin")), name);
  };
  const CTranslate2Variables int8 = stored("q_int8");
  for (const auto& [name, half] : std::vector<std::pair<std::string, CtDtype>>{
           {"q_int8_float16", CtDtype::kF16}, {"q_int8_bfloat16", CtDtype::kBF16}}) {
    const CTranslate2Variables file = stored(name);
    ASSERT_EQ(file.stored_dtypes.size(), int8.stored_dtypes.size()) << name;
    int halves = 0;
    for (const auto& [variable, dtype] : int8.stored_dtypes) {
      const CtDtype got = file.stored_dtypes.at(variable);
      if (int8.int8_matrices.count(variable)) {
        EXPECT_EQ(got, CtDtype::kI8) << name << " " << variable;
        EXPECT_TRUE(file.int8_matrices.at(variable).values ==
                    int8.int8_matrices.at(variable).values)
            << name << " " << variable;
        EXPECT_TRUE(file.int8_matrices.at(variable).scales ==
                    int8.int8_matrices.at(variable).scales)
            << name << " " << variable;
      } else if (dtype == CtDtype::kF32 && !file.variables.at(variable).shape.empty()) {
        EXPECT_EQ(got, half) << name << " " << variable;  // a bias, a norm's gain or shift
        ++halves;
      } else {
        EXPECT_EQ(got, dtype) << name << " " << variable;  // scalars and flags as they were
      }
    }
    EXPECT_GT(halves, 10) << name;
    EXPECT_EQ(file.int8_matrices.size(), int8.int8_matrices.size()) << name;
  }
  // int8 exactly as CTranslate2 stores it: round(w * 127 / max|row|) / (127 / max|row|).
  const Model back = import_model(work.path("q_int8"));
  const Tensor w = model.parameters().to_host().at("encoder.layers.0.ffn.fc1.weight");
  const Tensor got = back.parameters().to_host().at("encoder.layers.0.ffn.fc1.weight");
  const int64_t cols = w.shape[1];
  for (int64_t r = 0; r < w.shape[0]; ++r) {
    float amax = 0;
    for (int64_t k = 0; k < cols; ++k)
      amax = std::max(amax, std::fabs(w.data[size_t(r * cols + k)]));
    const float scale = 127.f / amax;
    for (int64_t k = 0; k < cols; ++k)
      EXPECT_EQ(got.data[size_t(r * cols + k)],
                float(std::nearbyint(w.data[size_t(r * cols + k)] * scale)) / scale);
  }
}

// int8 rows as CTranslate2 4.8's ModelSpec._quantize stores them (numpy, float32): a row of zeros
// gets the scale 1 (max|row| taken as 127), and a row of magnitudes below 127 / FLT_MAX the scale
// FLT_MAX rather than inf (numpy: scale 3.4028235e+38, values rint([3.4028232, -1.7014116])).
TEST(CTranslate2Export, Int8ScalesOfZeroAndTinyRows) {
  Tensor w({3, 2});
  w.data = {0.f, 0.f, 1e-38f, -5e-39f, 0.5f, -1.f};
  std::vector<CtVariable> out;
  append_ct_variable(out, "w", w, true, CtQuantization::kInt8);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype, CtDtype::kI8);
  std::vector<int8_t> values(6);
  std::memcpy(values.data(), out[0].bytes.data(), 6);
  EXPECT_EQ(values, (std::vector<int8_t>{0, 0, 3, -2, 64, -127}));
  std::vector<float> scales(3);
  ASSERT_EQ(out[1].bytes.size(), 12u);
  std::memcpy(scales.data(), out[1].bytes.data(), 12);
  EXPECT_EQ(scales, (std::vector<float>{1.f, std::numeric_limits<float>::max(), 127.f}));
}

// int16: one scale per matrix, 2^10 / max|w|. A matrix of zeros (where CTranslate2's converter
// writes the scale inf and values cast from NaN) gets the scale 1 and zeros; one of magnitudes
// below 2^10 / FLT_MAX a finite scale near FLT_MAX instead of inf.
TEST(CTranslate2Export, Int16ScalesOfZeroAndTinyMatrices) {
  auto exported = [](const std::vector<float>& data) {
    Tensor w({1, 2});
    w.data = data;
    std::vector<CtVariable> out;
    append_ct_variable(out, "w", w, true, CtQuantization::kInt16);
    EXPECT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].dtype, CtDtype::kI16);
    std::pair<std::vector<int16_t>, float> values_and_scale{std::vector<int16_t>(2), 0.f};
    std::memcpy(values_and_scale.first.data(), out[0].bytes.data(), 4);
    std::memcpy(&values_and_scale.second, out[1].bytes.data(), 4);
    return values_and_scale;
  };
  const auto [zero_values, zero_scale] = exported({0.f, 0.f});
  EXPECT_EQ(zero_values, (std::vector<int16_t>{0, 0}));
  EXPECT_EQ(zero_scale, 1.f);
  // 2^10 / (2^10 / FLT_MAX) rounds to 3.4028233e38, just below FLT_MAX (numpy agrees); the
  // values are rint([3.402823, -0.6805648]).
  const auto [tiny_values, tiny_scale] = exported({1e-38f, -2e-39f});
  EXPECT_TRUE(std::isfinite(tiny_scale));
  EXPECT_GT(tiny_scale, 3.4e38f);
  EXPECT_EQ(tiny_values, (std::vector<int16_t>{3, -1}));
  const auto [values, scale] = exported({0.5f, -2.f});
  EXPECT_EQ(scale, 512.f);
  EXPECT_EQ(values, (std::vector<int16_t>{256, -1024}));
}

// Rewrites model.bin of a copy of a spec-7 directory through `edit` (variables by name).
std::string edited_copy(
    const std::string& variant, const std::string& name,
    const std::function<void(TensorMap&, std::map<std::string, CtDtype>&)>& edit) {
  const std::string dir = work.path(name);
  fs::remove_all(dir);
  fs::copy(kSpec7 + "/" + variant, dir);
  CTranslate2Variables file =
      parse_ctranslate2_model(read_file_bytes(dir + "/model.bin"), dir + "/model.bin");
  edit(file.variables, file.stored_dtypes);
  std::vector<CtVariable> out;
  for (const auto& [n, t] : file.variables) {
    const CtDtype d = file.stored_dtypes.count(n) ? file.stored_dtypes[n] : CtDtype::kF32;
    if (t.shape.empty() && d == CtDtype::kI8)
      out.push_back(ct_int8_scalar(n, int8_t(t.data[0])));
    else if (t.shape.empty() && d == CtDtype::kI16)
      out.push_back(ct_int16_scalar(n, int16_t(t.data[0])));
    else
      append_ct_variable(out, n, t, false, CtQuantization::kFloat32);
  }
  const std::string bytes = serialize_ctranslate2_model("TransformerSpec", 7, std::move(out), {});
  write_bytes_atomically(dir + "/model.bin", bytes);
  return dir;
}

Tensor scalar(float v) {
  Tensor t{Shape{}};
  t.data = {v};
  return t;
}

void expect_refused(const std::string& dir, const std::string& fragment) {
  try {
    import_ctranslate2(dir);
    ADD_FAILURE() << "imported " << dir;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << e.what() << " (" << fragment << ")";
  }
}

TEST(CTranslate2Import, FeaturesAreRefusedOnlyWhenSwitchedOn) {
  using Edit = std::function<void(TensorMap&, std::map<std::string, CtDtype>&)>;
  auto set_i8 = [](const std::string& n, float v) -> Edit {
    return [=](TensorMap& m, std::map<std::string, CtDtype>& d) {
      m[n] = scalar(v);
      d[n] = CtDtype::kI8;
    };
  };
  // Every default flag written (alibi 0, alignment -1/1, multi_query 0, ...) imports.
  EXPECT_NO_THROW(import_ctranslate2(kSpec7 + "/paper_post"));
  const std::vector<std::tuple<std::string, Edit, std::string>> cases = {
      {"gelu_tanh", set_i8("encoder/activation", 1), "GELUTanh"},
      {"swish", set_i8("decoder/activation", 2), "Swish"},
      {"alibi", set_i8("decoder/alibi", 1), "ALiBi"},
      {"mqa", set_i8("encoder/multi_query_attention", 1), "multi-query"},
      {"mixed_norm", set_i8("decoder/pre_norm", 1), "pre-norm in one stack"},
      {"zero_start", set_i8("decoder/start_from_zero_embedding", 1), "zero embedding"},
      {"rotary",
       [](TensorMap& m, std::map<std::string, CtDtype>& d) {
         m["decoder/layer_0/self_attention/rotary_dim"] = scalar(0);
         d["decoder/layer_0/self_attention/rotary_dim"] = CtDtype::kI8;
       },
       "rotary"},
      {"relative",
       [](TensorMap& m, auto&) {
         m["encoder/layer_0/self_attention/relative_position_keys"] = Tensor({5, 12});
       },
       "relative position"},
      {"glu",
       [](TensorMap& m, auto&) {
         m["encoder/layer_0/ffn/linear_0_noact/weight"] = Tensor({20, 12});
       },
       "GLU"},
      {"rms", [](TensorMap& m, auto&) { m.erase("encoder/layer_1/ffn/layer_norm/beta"); }, "RMS"},
      {"factors",
       [](TensorMap& m, auto&) {
         m["encoder/embeddings_1/weight"] = Tensor({4, 12});
       },
       "source factors"},
      {"unknown", [](TensorMap& m, auto&) { m["encoder/mystery"] = Tensor({3}); },
       "unsupported variable \"encoder/mystery\""},
  };
  for (const auto& [name, edit, fragment] : cases)
    expect_refused(edited_copy("paper_post", name, edit), fragment);
  // At their default values the same flags are accepted.
  EXPECT_NO_THROW(
      import_ctranslate2(edited_copy("paper_post", "defaults", [](TensorMap& m, auto& d) {
        m["decoder/layer_0/self_attention/num_heads_kv"] = scalar(3);
        d["decoder/layer_0/self_attention/num_heads_kv"] = CtDtype::kI16;
        m["encoder/layer_0/self_attention/queries_scale"] = scalar(float(1 / std::sqrt(4.0)));
        m["decoder/sliding_window"] = scalar(0);
        d["decoder/sliding_window"] = CtDtype::kI16;
      })));
  // queries_scale: 1/sqrt(d_k) is the paper's attention, 1 on every layer unscaled dot products
  // (what the exporter writes for attention "dot"); anything else, or a mix, is refused.
  auto set_queries_scale = [](float encoder, float decoder) {
    return [=](TensorMap& m, auto& d) {
      for (const char* name : {"encoder/layer_0/self_attention/queries_scale",
                               "encoder/layer_1/self_attention/queries_scale"}) {
        m[name] = scalar(encoder);
        d[name] = CtDtype::kF32;
      }
      for (const char* name : {"decoder/layer_0/self_attention/queries_scale",
                               "decoder/layer_1/attention/queries_scale"}) {
        m[name] = scalar(decoder);
        d[name] = CtDtype::kF32;
      }
    };
  };
  EXPECT_EQ(import_ctranslate2(edited_copy("paper_post", "unscaled", set_queries_scale(1.f, 1.f)))
                .config.attention,
            AttentionScoring::kDot);
  EXPECT_EQ(import_ctranslate2(
                edited_copy("paper_post", "scaled", set_queries_scale(0.5f, 1.f / std::sqrt(4.f))))
                .config.attention,
            AttentionScoring::kScaledDot);
  expect_refused(edited_copy("paper_post", "scale_mixed", set_queries_scale(1.f, 0.5f)),
                 "a query scale other than 1/sqrt(d_k) or 1");
  expect_refused(edited_copy("paper_post", "scale_other", set_queries_scale(0.3f, 0.3f)),
                 "a query scale other than 1/sqrt(d_k) or 1");
  // The embedding scale may be a float (fairseq's converter): sqrt(d_model) or 1.
  const ModelConfig scaled =
      import_ctranslate2(edited_copy("paper_post", "scale_f", [](TensorMap& m, auto& d) {
        for (const char* s : {"encoder/scale_embeddings", "decoder/scale_embeddings"}) {
          m[s] = scalar(std::sqrt(12.f));
          d[s] = CtDtype::kF32;
        }
      })).config;
  EXPECT_TRUE(scaled.scale_embeddings);
  expect_refused(edited_copy("paper_post", "scale_odd",
                             [](TensorMap& m, auto& d) {
                               m["encoder/scale_embeddings"] = scalar(2.5f);
                               d["encoder/scale_embeddings"] = CtDtype::kF32;
                             }),
                 "embedding scale");
}

TEST(CTranslate2Import, SpecialTokensComeFromConfigJson) {
  const std::string dir = work.path("tokens");
  fs::remove_all(dir);
  fs::copy(kSpec7 + "/single", dir);
  auto write_config = [&](const nlohmann::json& j) {
    write_bytes_atomically(dir + "/config.json", j.dump());
  };
  nlohmann::json j = nlohmann::json::parse(read_file_bytes(dir + "/config.json"));
  j["decoder_start_token"] = "</s>";  // fairseq's converters start the decoder with </s>
  j["add_source_eos"] = true;
  j["layer_norm_epsilon"] = nullptr;  // CTranslate2's default: 1e-5
  write_config(j);
  ModelConfig c = import_ctranslate2(dir).config;
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_TRUE(c.src_append_eos);
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  j["decoder_start_token"] = nullptr;
  write_config(j);
  expect_refused(dir, "decoder_start_token null");
  j["decoder_start_token"] = "<nowhere>";
  write_config(j);
  expect_refused(dir, "<nowhere>");
  j["decoder_start_token"] = "<s>";
  j["unk_token"] = "<oov>";  // appended to both vocabularies, which then no longer fit
  write_config(j);
  expect_refused(dir, "vocabulary sizes");
}

TEST(CTranslate2Cli, ExportThenImportKeepsScores) {
  const std::string aren =
      kFixtures + "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  using testing_support::CliResult;
  CliResult r = work.run_cli("import-ctranslate2 " + aren + " -o " + work.path("cli_aren"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli("export-ctranslate2 --model " + work.path("cli_aren") + " -o " +
                   work.path("cli_aren_ct2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(work.path("cli_aren_ct2/model.bin")));
  EXPECT_TRUE(fs::exists(work.path("cli_aren_ct2/source_vocabulary.json")));
  r = work.run_cli("export-ctranslate2 --model " + work.path("cli_aren") + " -o " +
                   work.path("cli_aren_ct2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = work.run_cli("export-ctranslate2 --force --quantization int8 --model " +
                   work.path("cli_aren") + " -o " + work.path("cli_aren_ct2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli("import-ctranslate2 " + work.path("cli_aren_ct2") + " -o " +
                   work.path("cli_aren_back"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  work.write_file("ar.txt", "آ ت ز م و ن\n");
  work.write_file("en.txt", "a t z m o n\n");
  // CTranslate2's score of the pair; the float32 import matches it to the printed digits
  // (measured 1e-6), the int8 round trip within 2.3× its measured 0.011.
  for (auto [model, bound] : {std::pair{"cli_aren", 1e-5}, std::pair{"cli_aren_back", 0.025}}) {
    r = work.run_cli("score --model " + work.path(model) + " --src " + work.path("ar.txt") +
                     " --tgt " + work.path("en.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NEAR(std::stod(r.out), -1.061750, bound) << model;
  }
  r = work.run_cli("export-ctranslate2 --model " + kFixtures + "/window2.safetensors -o " +
                   work.path("nope"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  r = work.run_cli("export-ctranslate2 --quantization int4 --model x -o y");
  EXPECT_EQ(r.exit_code, 2);
  // int8_float32, CTranslate2's other name for int8 here: the same file.
  r = work.run_cli("export-ctranslate2 --quantization int8_float32 --model " +
                   work.path("cli_aren") + " -o " + work.path("cli_aren_int8_float32"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(read_file_bytes(work.path("cli_aren_int8_float32/model.bin")) ==
              read_file_bytes(work.path("cli_aren_ct2/model.bin")));
}

}  // namespace
}  // namespace tfm

namespace tfm {
namespace {

// Position tables as other toolkits compute them in float32 before a converter stores them.
TEST(CTranslate2Import, SinusoidTablesOfOtherToolkitsAreRecognised) {
  const int64_t d = 16, rows = 5000;
  auto table = [&](bool interleaved, int64_t first_position) {
    Tensor t({rows, d});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d / 2; ++i) {
        const float position = float(r + first_position);
        const float frequency = interleaved
                                    ? std::exp(float(2 * i) * (-std::log(10000.f) / float(d)))
                                    : std::exp(float(i) * (-std::log(10000.f) / float(d / 2 - 1)));
        const float angle = position * frequency;
        t.data[size_t(r * d + (interleaved ? 2 * i : i))] = std::sin(angle);
        t.data[size_t(r * d + (interleaved ? 2 * i + 1 : d / 2 + i))] = std::cos(angle);
      }
    return t;
  };
  SinusoidLayout layout;
  int64_t offset = -1;
  // OpenNMT-py: interleaved from position 0.
  ASSERT_TRUE(match_sinusoid_table(table(true, 0), 2e-3, layout, offset));
  EXPECT_EQ(layout, SinusoidLayout::kInterleaved);
  EXPECT_EQ(offset, 0);
  // fairseq: concat, rows after padding_idx 1, i.e. from position 2.
  ASSERT_TRUE(match_sinusoid_table(table(false, 2), 2e-3, layout, offset));
  EXPECT_EQ(layout, SinusoidLayout::kConcat);
  EXPECT_EQ(offset, 2);
  // A learned table (or a sinusoid with one row disturbed) is not one.
  Tensor disturbed = table(true, 0);
  disturbed.data[size_t(4321 * d + 3)] += 0.01f;
  EXPECT_FALSE(match_sinusoid_table(disturbed, 2e-3, layout, offset));
  Tensor learned({64, d});
  for (size_t i = 0; i < learned.data.size(); ++i) learned.data[i] = std::sin(float(i) * 0.37f);
  EXPECT_FALSE(match_sinusoid_table(learned, 2e-3, layout, offset));
}

}  // namespace
}  // namespace tfm
