// A real model nobody here trained: CTranslate2's Arabic→English transliteration test models
// (tests/data, MIT), imported and scored against the values CTranslate2 itself produces.
#include "io/ctranslate2.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "text/vocabulary.h"

namespace tfm {
namespace {

const std::string kDataDir =
    std::string(TFM_FIXTURE_DIR) + "/../data/ctranslate2-aren-transliteration";

struct Imported {
  Model model;
  Vocabulary source, target;
};

Imported import(const std::string& variant) {
  ImportedModel m = import_ctranslate2(kDataDir + "/" + variant);
  return {Model(m.config, std::move(m.parameters), variant, tfm::cpu_backend()),
          Vocabulary::from_tokens(m.source_tokens, "source"),
          Vocabulary::from_tokens(m.target_tokens, "target")};
}

std::vector<float> score(const Imported& m, const std::string& src, const std::string& tgt) {
  TokenBatch batch = make_batch(m.model.config(), {m.source.encode(src)}, {m.target.encode(tgt)});
  ScoringWorkspace ws;
  std::vector<float> logprobs;
  score_forward(m.model, batch, ws, logprobs);
  logprobs.resize(size_t(batch.tgt_lengths[0]));
  return logprobs;
}

TEST(CTranslate2, ImportedConfigFollowsCTranslate2Conventions) {
  const Imported m = import("aren-transliteration");
  const ModelConfig& c = m.model.config();
  EXPECT_EQ(c.encoder_layers, 6);
  EXPECT_EQ(c.decoder_layers, 6);
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.heads, 8);
  EXPECT_EQ(c.d_ff, 128);
  EXPECT_EQ(c.norm, NormPosition::kPre);
  EXPECT_EQ(c.sinusoid_layout, SinusoidLayout::kConcat);
  EXPECT_EQ(c.position_offset, 1);
  EXPECT_FALSE(c.src_append_eos);
  // No config.json names one: CTranslate2's ops::LayerNorm default (include/ctranslate2/ops/
  // layer_norm.h, epsilon = 1e-5). The scores cannot tell: with 1e-6 planted, the pair below
  // scores -1.061749 as with 1e-5.
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.src_vocab_size, 51);  // 50 lines + <unk>
  EXPECT_EQ(c.tgt_vocab_size, 43);
  EXPECT_EQ(m.source.encode("آ zzz"), (std::vector<int32_t>{m.source.encode("آ")[0], 50}));
}

TEST(CTranslate2, FloatModelScoresMatchCTranslate2) {
  const Imported m = import("aren-transliteration");
  const auto first = score(m, "آ ت ز م و ن", "a t z m o n");
  const std::vector<float> expected_first = {-0.106023f, -0.065410f, -0.056002f, -0.447953f,
                                             -0.230714f, -0.092184f, -0.063463f};
  ASSERT_EQ(first.size(), expected_first.size());
  double total = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(first[i], expected_first[i], 1e-5) << i;
    total += first[i];
  }
  EXPECT_NEAR(total, -1.061750, 1e-5);
  const auto second = score(m, "آ ت ش ي س و ن", "a c h i s o n");
  const std::vector<float> expected_second = {-0.072660f, -0.300309f, -0.181187f, -0.395671f,
                                              -0.025631f, -0.123466f, -0.002034f, -0.012639f};
  ASSERT_EQ(second.size(), expected_second.size());
  for (size_t i = 0; i < second.size(); ++i) EXPECT_NEAR(second[i], expected_second[i], 1e-5) << i;
}

// Per position, the most likely next token under teacher forcing.
std::vector<int32_t> best_tokens(const Imported& m, const std::string& src,
                                 const std::string& tgt) {
  const ModelConfig& c = m.model.config();
  TokenBatch batch = make_batch(c, {m.source.encode(src)}, {m.target.encode(tgt)});
  ScoringWorkspace ws;
  std::vector<float> unused;
  score_forward(m.model, batch, ws, unused);
  std::vector<int32_t> best;
  for (int64_t t = 0; t < batch.tgt_lengths[0]; ++t) {
    const float* state = ws.cache.decoder_output + t * c.d_model;
    int32_t arg = 0;
    double best_logit = -1e30;
    for (int64_t v = 0; v < c.tgt_vocab_size; ++v) {
      double logit = m.model.weights().output.bias[v];
      for (int64_t k = 0; k < c.d_model; ++k)
        logit += double(state[k]) * m.model.weights().output.weight[v * c.d_model + k];
      if (logit > best_logit) best_logit = logit, arg = int32_t(v);
    }
    best.push_back(arg);
  }
  return best;
}

// Per-token log-probabilities of CTranslate2's int8 and int16 exports of its test model against
// its float32 one, each bounded at 2–2.5× the largest difference measured (2026-11-28, these
// two pairs: int8 0.0175, int16 0.0040), and the same best token at every step.
TEST(CTranslate2, QuantizedModelsAgreeWithFloat) {
  const Imported reference = import("aren-transliteration");
  for (auto [variant, bound] :
       {std::pair{"aren-transliteration-i8", 0.035}, std::pair{"aren-transliteration-i16", 0.01}}) {
    const Imported quantized = import(variant);
    for (auto [src, tgt] :
         {std::pair{"آ ت ز م و ن", "a t z m o n"}, {"آ ت ش ي س و ن", "a c h i s o n"}}) {
      const auto a = score(reference, src, tgt), b = score(quantized, src, tgt);
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(a[i], b[i], bound) << variant << " token " << i;
      EXPECT_EQ(best_tokens(reference, src, tgt), best_tokens(quantized, src, tgt)) << variant;
    }
  }
}

TEST(CTranslate2, CorruptModelBinIsAClearError) {
  std::string bytes = "\x02\x00\x00\x00";
  EXPECT_THROW(parse_ctranslate2_model(bytes, "model.bin"), Error);
  bytes = std::string("\x09\x00\x00\x00", 4);
  EXPECT_THROW(parse_ctranslate2_model(bytes, "model.bin"), Error);
  EXPECT_THROW(import_ctranslate2("/nonexistent/dir"), Error);
}

}  // namespace
}  // namespace tfm

namespace tfm {
namespace {

TEST(CTranslate2, EveryTruncationIsRejectedCleanly) {
  std::string bytes = read_file_bytes(kDataDir + "/aren-transliteration/model.bin");
  for (size_t cut = 0; cut < bytes.size(); cut += 1499)
    EXPECT_THROW(parse_ctranslate2_model(bytes.substr(0, cut), "model.bin"), Error) << cut;
}

}  // namespace
}  // namespace tfm

namespace tfm {
namespace {

// Writes variables in model.bin version 6 layout: dtype ids + byte counts, then aliases.
class ModelBinWriter {
 public:
  void string(const std::string& s) {
    const uint16_t n = uint16_t(s.size() + 1);
    raw(&n, 2);
    bytes_ += s;
    bytes_ += '\0';
  }
  void raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  template <typename T>
  void value(T v) {
    raw(&v, sizeof v);
  }
  // dtype 0: f32 as given; 4: f16 (values must be f16-representable for an exact check).
  void variable(const std::string& name, const Tensor& t, uint8_t dtype) {
    string(name);
    value(uint8_t(t.shape.size()));
    for (int64_t d : t.shape) value(uint32_t(d));
    value(dtype);
    if (dtype == 0) {
      value(uint32_t(t.numel() * 4));
      raw(t.ptr(), size_t(t.numel()) * 4);
    } else {
      value(uint32_t(t.numel() * 2));
      for (float f : t.data) {  // f32 -> f16 by truncation, exact for the rounded inputs below
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint32_t sign = (bits >> 16) & 0x8000;
        const int32_t exponent = int32_t((bits >> 23) & 0xff) - 127 + 15;
        uint16_t h = uint16_t(sign);
        if (exponent > 0 && exponent < 31)
          h = uint16_t(sign | uint32_t(exponent) << 10 | ((bits >> 13) & 0x3ff));
        value(h);
      }
    }
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

TEST(CTranslate2, Version6WithFloat16AndAliasesImports) {
  CTranslate2Variables v2 = parse_ctranslate2_model(
      read_file_bytes(kDataDir + "/aren-transliteration/model.bin"), "model.bin");
  TensorMap vars = v2.variables;
  // Round the encoder embeddings to f16 precision, so an f16 copy must read back exactly.
  for (float& f : vars["encoder/embeddings/weight"].data) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits &= 0xffffe000u;
    std::memcpy(&f, &bits, 4);
  }
  ModelBinWriter w;
  w.value(uint32_t(6));
  w.string("TransformerSpec");
  w.value(uint32_t(7));
  w.value(uint32_t(vars.size() - 1));  // projection weight becomes an alias
  for (const auto& [name, t] : vars)
    if (name != "decoder/projection/weight")
      w.variable(name, t, name == "encoder/embeddings/weight" ? 4 : 0);
  w.value(uint32_t(1));
  w.string("decoder/projection/weight");
  w.string("decoder/embeddings/weight");

  const std::string dir = std::filesystem::temp_directory_path() / "tfm_ct2_v6";
  std::filesystem::create_directories(dir);
  for (const char* vocab : {"source_vocabulary.txt", "target_vocabulary.txt"})
    std::filesystem::copy_file(kDataDir + "/aren-transliteration/" + vocab, dir + "/" + vocab,
                               std::filesystem::copy_options::overwrite_existing);
  write_bytes_atomically(dir + "/model.bin", w.bytes());
  ImportedModel m = import_ctranslate2(dir);
  EXPECT_EQ(m.parameters.at("src_embed.weight").data, vars["encoder/embeddings/weight"].data);
  // The projection is an alias of the target embeddings: one tied matrix.
  EXPECT_EQ(m.config.share_embeddings, EmbeddingSharing::kTarget);
  EXPECT_EQ(m.parameters.at("tgt_embed.weight").data, vars["decoder/embeddings/weight"].data);
  EXPECT_EQ(m.parameters.count("out_proj.weight"), 0u);
  EXPECT_EQ(m.parameters.at("encoder.layers.3.self_attn.v.bias").data.size(), 32u);
  Model model(m.config, std::move(m.parameters), dir,
              tfm::cpu_backend());  // every tensor present, right shapes
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tfm
