// Gradients of the label-smoothed loss (ε = 0.1, no dropout) for every parameter of every
// fixture variant against float64 PyTorch autograd (tests/fixtures/*.grads.safetensors), and
// finite-difference checks of the backward kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixture_batch.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "tensor/random.h"
#include "train/loss.h"

namespace tfm {
namespace {

std::vector<std::string> fixtures_with_gradients() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(TFM_FIXTURE_DIR)) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".grads.safetensors";
    if (file.size() > suffix.size() &&
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(file.substr(0, file.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

using testing_support::fixture_batch;

TensorMap zero_gradients(const Model& model) {
  TensorMap g;
  for (const auto& [name, t] : model.parameters()) g.emplace(name, Tensor(t.shape));
  return g;
}

// |actual − expected| ≤ 1e-4 · (|expected| + max|expected| over the tensor) + 1e-6.
void expect_tensor_near(const Tensor& actual, const Tensor& expected, const std::string& name) {
  ASSERT_EQ(actual.shape, expected.shape) << name;
  double scale = 0, worst = 0;
  for (float e : expected.data) scale = std::max(scale, double(std::abs(e)));
  for (size_t i = 0; i < actual.data.size(); ++i) {
    const double excess = std::abs(double(actual.data[i]) - expected.data[i]) -
                          (1e-4 * (std::abs(expected.data[i]) + scale) + 1e-6);
    worst = std::max(worst, excess);
  }
  EXPECT_LE(worst, 0.0) << name << " (scale " << scale << ")";
}

class GradientParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientParity, EveryParameterGradientMatchesPyTorch) {
  const std::string dir = TFM_FIXTURE_DIR;
  Model model = load_model(dir + "/" + GetParam() + ".safetensors");
  const TensorMap io = read_safetensors(dir + "/" + GetParam() + ".io.safetensors").tensors;
  const TensorMap expected =
      read_safetensors(dir + "/" + GetParam() + ".grads.safetensors").tensors;
  const TokenBatch batch = fixture_batch(model.config(), io);
  TensorMap gradients = zero_gradients(model);
  const TransformerGradients g = bind_gradients(model.config(), gradients);
  TrainingWorkspace ws;
  int64_t tokens = 0;
  for (int32_t n : batch.tgt_lengths) tokens += n;
  const LossTotals totals = loss_and_gradients(model, g, batch, {}, 0.1f, 1.f / float(tokens), ws);
  EXPECT_EQ(totals.tokens, tokens);
  EXPECT_NEAR(totals.loss / double(tokens), expected.at("loss").data[0], 1e-5);
  for (const auto& [name, grad] : gradients)
    expect_tensor_near(grad, expected.at("grad." + name), name);

  // ε = 0: the loss is the plain negative log-likelihood.
  TensorMap unused = zero_gradients(model);
  const LossTotals plain =
      loss_and_gradients(model, bind_gradients(model.config(), unused), batch, {}, 0.f, 0.f, ws);
  EXPECT_NEAR(plain.loss / double(tokens), expected.at("loss_eps0").data[0], 1e-5);
  EXPECT_NEAR(plain.nll, plain.loss, 1e-6 * std::abs(plain.loss));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GradientParity, ::testing::ValuesIn(fixtures_with_gradients()),
                         [](const auto& info) { return info.param; });

// Central differences of a scalar function of x, compared with an analytic gradient.
template <typename Loss>
void check_finite_differences(std::vector<float>& x, const std::vector<float>& analytic, Loss loss,
                              const std::string& what, double tolerance = 2e-2) {
  const float h = 1e-2f;
  for (size_t i = 0; i < x.size(); i += std::max<size_t>(1, x.size() / 23)) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(analytic[i], numeric, tolerance * (1.0 + std::abs(numeric)))
        << what << " index " << i;
  }
}

std::vector<float> randoms(int64_t n, uint64_t seed) {
  Random r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = r.normal();
  return v;
}

// A fixed random linear functional of the output turns each kernel into a scalar loss.
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

TEST(FiniteDifferences, LayerNormBackward) {
  const int64_t rows = 3, cols = 7;
  auto x = randoms(rows * cols, 1), gamma = randoms(cols, 2), beta = randoms(cols, 3);
  auto probe = randoms(rows * cols, 4);
  std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dgamma(cols, 0.f),
      dbeta(cols, 0.f);
  auto loss = [&] {
    layer_norm(x.data(), gamma.data(), beta.data(), y.data(), rows, cols, 1e-5f, mean.data(),
               rstd.data());
    return dot(y, probe);
  };
  loss();
  layer_norm_backward(probe.data(), x.data(), mean.data(), rstd.data(), gamma.data(), dx.data(),
                      dgamma.data(), dbeta.data(), rows, cols, false);
  check_finite_differences(x, dx, loss, "dx");
  check_finite_differences(gamma, dgamma, loss, "dgamma");
}

TEST(FiniteDifferences, AttentionBackwardWithMasksAndDropout) {
  AttentionShape s;
  s.batch = 2;
  s.heads = 2;
  s.query_len = 5;
  s.key_len = 6;
  s.head_dim = 3;
  s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = 6;
  const int32_t lengths[] = {6, 4};
  AttentionMask mask;
  mask.key_lengths = lengths;
  mask.causal = true;
  mask.window = 3;
  mask.query_offset = 1;
  std::vector<uint8_t> dropout_mask(size_t(s.batch * s.heads * s.query_len * s.key_len));
  for (float p : {0.f, 0.3f}) {
    AttentionDropout dropout{p, dropout_mask.data(), 99};
    auto q = randoms(2 * 5 * 6, 11), k = randoms(2 * 6 * 6, 12), v = randoms(2 * 6 * 6, 13);
    auto probe = randoms(2 * 5 * 6, 14);
    std::vector<float> probs(dropout_mask.size()), out(q.size());
    auto loss = [&] {
      attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data(), dropout);
      return dot(out, probe);
    };
    loss();
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), dropout, probe.data(),
                       dq.data(), dk.data(), dv.data());
    check_finite_differences(q, dq, loss, "dq");
    check_finite_differences(k, dk, loss, "dk");
    check_finite_differences(v, dv, loss, "dv");
  }
}

TEST(FiniteDifferences, CrossEntropyAndActivations) {
  const int64_t rows = 3, vocab = 11;
  auto logits = randoms(rows * vocab, 21);
  const int32_t targets[] = {0, 5, 10};
  auto grad = logits;
  cross_entropy_forward_backward(grad.data(), targets, rows, vocab, 0.1f, 1.f);
  auto loss = [&] {
    auto copy = logits;
    return cross_entropy_forward_backward(copy.data(), targets, rows, vocab, 0.1f, 1.f).loss;
  };
  check_finite_differences(logits, grad, loss, "logits", 1e-2);

  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    auto x = randoms(40, 31), probe = randoms(40, 32);
    for (float& v : x)
      if (std::abs(v) < 0.05f) v += 0.5f;  // keep central differences off ReLU's kink
    std::vector<float> y(40), pre(40);
    auto f = [&] {
      pre = x;
      add_bias_activation(pre.data(), nullptr, y.data(), 1, 40, act);
      return dot(y, probe);
    };
    f();
    auto d = probe;
    activation_backward(d.data(), pre.data(), 40, act);
    check_finite_differences(x, d, f, "activation");
  }
}

}  // namespace
}  // namespace tfm
