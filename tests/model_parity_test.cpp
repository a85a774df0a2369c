// The model against float64 PyTorch references (tests/fixtures/generate.py): embeddings and
// positional encodings, one encoder layer, one decoder layer, both attentions with their masks,
// the stacks and the per-token log-probabilities, for every variant in the fixtures folder.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixture_batch.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/embeddings.h"
#include "model/transformer.h"

namespace tfm {
namespace {

struct Fixture {
  Model model;
  TensorMap io;
  TokenBatch batch;
};

Fixture load_fixture(const std::string& name) {
  const std::string dir = TFM_FIXTURE_DIR;
  Model model = load_model(dir + "/" + name + ".safetensors", tfm::cpu_backend());
  TensorMap io = read_safetensors(dir + "/" + name + ".io.safetensors").tensors;
  TokenBatch batch = testing_support::fixture_batch(model.config(), io);
  return {std::move(model), std::move(io), std::move(batch)};
}

// Compares actual [B, L, D] with expected [B, L', D] at valid positions t < lengths[b].
void expect_valid_rows_near(const float* actual, int64_t actual_len, const Tensor& expected,
                            const std::vector<int32_t>& lengths, double tolerance,
                            const std::string& what) {
  const int64_t batch = expected.shape[0], len = expected.shape[1], d = expected.shape[2];
  double worst = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < lengths[size_t(b)]; ++t)
      for (int64_t c = 0; c < d; ++c) {
        const double e = expected.data[size_t((b * len + t) * d + c)];
        const double a = actual[(b * actual_len + t) * d + c];
        worst = std::max(worst, std::abs(a - e) / (1.0 + std::abs(e)));
      }
  EXPECT_LT(worst, tolerance) << what;
}

class ModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelParity, LayersAndLogProbsMatchPyTorch) {
  Fixture f = load_fixture(GetParam());
  const ModelConfig& config = f.model.config();
  const TokenBatch& batch = f.batch;
  const int64_t d = config.d_model, S = batch.src_len, T = batch.tgt_len, B = batch.batch;
  ScoringWorkspace ws;

  // Embeddings + positional encodings, encoder side.
  std::vector<float> x(size_t(B * std::max<int64_t>(S, 1) * d));
  embed_forward(f.model.backend(), config, source_embedding(f.model.weights()),
                f.model.encoder_positions(), batch.src_ids.data(), B, S, 0, x.data());
  expect_valid_rows_near(x.data(), S, f.io.at("enc_input"), batch.src_lengths, 1e-5, "enc_input");

  // One encoder layer from the reference input.
  EncoderLayerCache encoder_layer;
  encoder_layer_forward(f.model.backend(), config, f.model.weights().encoder_layers[0],
                        f.io.at("enc_input").ptr(), B, S, batch.src_lengths.data(), {}, 0,
                        encoder_layer);
  expect_valid_rows_near(encoder_layer.output(), S, f.io.at("enc_layer0_out"), batch.src_lengths,
                         1e-4, "enc_layer0_out");

  // Decoder input, both attentions and one decoder layer from the reference memory.
  const Tensor& memory = f.io.at("memory");
  const Tensor& dec_input = f.io.at("dec_input");
  std::vector<float> y(size_t(B * T * d));
  embed_forward(f.model.backend(), config, target_embedding(f.model.weights()),
                f.model.decoder_positions(), batch.tgt_in.data(), B, T, 0, y.data());
  expect_valid_rows_near(y.data(), T, dec_input, batch.tgt_lengths, 1e-5, "dec_input");

  const DecoderLayerWeights& layer0 = f.model.weights().decoder_layers[0];
  AttentionInputs self_in;
  self_in.query_input = self_in.memory_input = dec_input.ptr();
  self_in.batch = B;
  self_in.query_len = self_in.key_len = T;
  self_in.mask.key_lengths = batch.tgt_lengths.data();
  self_in.mask.causal = true;
  self_in.mask.window = config.self_attention_window;
  AttentionCache attention;
  multi_head_attention_forward(f.model.backend(), layer0.self_attn, config.heads, self_in,
                               attention, y.data());
  expect_valid_rows_near(y.data(), T, f.io.at("mha_self_out"), batch.tgt_lengths, 1e-5,
                         "mha_self_out");

  AttentionInputs cross_in;
  cross_in.query_input = dec_input.ptr();
  cross_in.memory_input = memory.ptr();
  cross_in.batch = B;
  cross_in.query_len = T;
  cross_in.key_len = S;
  cross_in.mask.key_lengths = batch.src_lengths.data();
  multi_head_attention_forward(f.model.backend(), layer0.cross_attn, config.heads, cross_in,
                               attention, y.data());
  expect_valid_rows_near(y.data(), T, f.io.at("mha_cross_out"), batch.tgt_lengths, 1e-5,
                         "mha_cross_out");

  DecoderLayerCache decoder_layer;
  decoder_layer_forward(f.model.backend(), config, layer0, dec_input.ptr(), B, T,
                        batch.tgt_lengths.data(), memory.ptr(), S, batch.src_lengths.data(), {}, 0,
                        decoder_layer);
  expect_valid_rows_near(decoder_layer.output(), T, f.io.at("dec_layer0_out"), batch.tgt_lengths,
                         1e-4, "dec_layer0_out");

  // Whole stacks and the log-probabilities of target + eos.
  std::vector<float> logprobs;
  score_forward(f.model, batch, ws, logprobs);
  expect_valid_rows_near(ws.cache.memory.data(), S, memory, batch.src_lengths, 1e-4, "memory");
  expect_valid_rows_near(ws.cache.decoder_output, T, f.io.at("dec_output"), batch.tgt_lengths,
                         1e-4, "dec_output");
  const Tensor& expected = f.io.at("token_logprobs");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < batch.tgt_lengths[size_t(b)]; ++t)
      EXPECT_NEAR(logprobs[size_t(b * T + t)], expected.data[size_t(b * expected.shape[1] + t)],
                  1e-4)
          << "sentence " << b << " position " << t;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelParity,
                         ::testing::ValuesIn(testing_support::fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(ModelParity, ScoresDoNotDependOnBatchComposition) {
  Fixture f = load_fixture("paper_post");
  ScoringWorkspace ws;
  std::vector<float> together;
  score_forward(f.model, f.batch, ws, together);
  const Tensor& src = f.io.at("src_tokens");
  const Tensor& tgt = f.io.at("tgt_tokens");
  for (int64_t b = 0; b < f.batch.batch; ++b) {
    std::vector<int32_t> s, t;
    for (int64_t j = 0; j < src.shape[1]; ++j)
      if (src.data[size_t(b * src.shape[1] + j)] >= 0)
        s.push_back(int32_t(src.data[size_t(b * src.shape[1] + j)]));
    for (int64_t j = 0; j < tgt.shape[1]; ++j)
      if (tgt.data[size_t(b * tgt.shape[1] + j)] >= 0)
        t.push_back(int32_t(tgt.data[size_t(b * tgt.shape[1] + j)]));
    TokenBatch alone = make_batch(f.model.config(), {s}, {t});
    std::vector<float> single;
    score_forward(f.model, alone, ws, single);
    for (int64_t j = 0; j < alone.tgt_lengths[0]; ++j)
      EXPECT_NEAR(single[size_t(j)], together[size_t(b * f.batch.tgt_len + j)], 1e-5);
  }
}

}  // namespace
}  // namespace tfm
