// PyTorch's own published test vectors for nn.TransformerEncoderLayer and
// nn.TransformerDecoderLayer (d_model 4, nhead 2, dim_feedforward 16, dropout 0, every
// parameter = cos(arange(numel)) reshaped), mapped onto our layers: in_proj is [q; k; v].
#include <gtest/gtest.h>

#include <cmath>

#include "model/transformer.h"

namespace tfm {
namespace {

// Fills each parameter the way the PyTorch test does: cos(0), cos(1), ... per parameter.
Tensor cos_arange(Shape shape) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data[size_t(i)] = float(std::cos(double(i)));
  return t;
}

// PyTorch's packed in_proj_weight [3D, D] / in_proj_bias [3D] split into our q, k, v.
void add_attention(TensorMap& p, const std::string& prefix, int64_t d) {
  Tensor in_w = cos_arange({3 * d, d}), in_b = cos_arange({3 * d});
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    Tensor w({d, d}), b({d});
    std::copy_n(in_w.data.begin() + i * d * d, d * d, w.data.begin());
    std::copy_n(in_b.data.begin() + i * d, d, b.data.begin());
    p[prefix + "." + names[i] + ".weight"] = w;
    p[prefix + "." + names[i] + ".bias"] = b;
  }
  p[prefix + ".o.weight"] = cos_arange({d, d});
  p[prefix + ".o.bias"] = cos_arange({d});
}

void add_ffn_and_norms(TensorMap& p, const std::string& prefix, int64_t d, int64_t ff, int norms) {
  p[prefix + ".ffn.fc1.weight"] = cos_arange({ff, d});
  p[prefix + ".ffn.fc1.bias"] = cos_arange({ff});
  p[prefix + ".ffn.fc2.weight"] = cos_arange({d, ff});
  p[prefix + ".ffn.fc2.bias"] = cos_arange({d});
  for (int n = 1; n <= norms; ++n) {
    p[prefix + ".norm" + std::to_string(n) + ".weight"] = cos_arange({d});
    p[prefix + ".norm" + std::to_string(n) + ".bias"] = cos_arange({d});
  }
}

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 4;
  c.heads = 2;
  c.d_ff = 16;
  return c;
}

TEST(PublishedVectors, TorchTransformerEncoderLayer) {
  const ModelConfig c = small_config();
  TensorMap p;
  add_attention(p, "l.self_attn", 4);
  add_ffn_and_norms(p, "l", 4, 16, 2);
  const EncoderLayerWeights w = bind_encoder_layer(p, "l");
  std::vector<float> x = {20, 30, 40, 50};  // [1, 1, 4]
  const int32_t lengths[] = {1};
  EncoderLayerCache cache;
  encoder_layer_forward(cpu_backend(), c, w, x.data(), 1, 1, lengths, {}, 0, cache);
  const float expected[] = {2.258703f, 0.127985f, -0.697881f, 0.170862f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(cache.output()[i], expected[i], 1e-5);
}

TEST(PublishedVectors, TorchTransformerDecoderLayer) {
  const ModelConfig c = small_config();
  TensorMap p;
  add_attention(p, "l.self_attn", 4);
  add_attention(p, "l.cross_attn", 4);
  add_ffn_and_norms(p, "l", 4, 16, 3);
  const DecoderLayerWeights w = bind_decoder_layer(p, "l");
  std::vector<float> x = {20, 30, 40, 50};       // tgt [1, 1, 4]
  std::vector<float> memory = {60, 70, 80, 90};  // [1, 1, 4]
  const int32_t lengths[] = {1};
  DecoderLayerCache cache;
  decoder_layer_forward(cpu_backend(), c, w, x.data(), 1, 1, lengths, memory.data(), 1, lengths, {},
                        0, cache);
  const float expected[] = {2.314351f, 0.094805f, -0.671322f, 0.101977f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(cache.output()[i], expected[i], 1e-5);
}

}  // namespace
}  // namespace tfm
