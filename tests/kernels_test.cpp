// Every kernel against a plain double-precision reference loop, at odd sizes (1, 7, 63, 65...)
// so that SIMD tails and blocking edges are covered.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "tensor/random.h"

namespace tfm {
namespace {

std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.f) {
  Random random(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = random.normal() * scale;
  return v;
}

// gemm() has two paths: a cached oneDNN matmul primitive (alpha 1, beta 0 or 1, outside OpenMP
// regions) and dnnl_sgemm (other alpha/beta, or inside a parallel region). Every case runs both.
void check_gemm_against_reference(float alpha, float beta, bool inside_parallel_region) {
  const int64_t sizes[] = {1, 7, 63, 65};
  uint64_t seed = 1;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : {int64_t(1), int64_t(7), int64_t(65)})
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb) {
            const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
            auto a = random_vector((ta ? k : m) * lda, seed++);
            auto b = random_vector((tb ? n : k) * ldb, seed++);
            auto c = random_vector(m * ldc, seed++);
            auto expected = c;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double sum = 0;
                for (int64_t p = 0; p < k; ++p)
                  sum += double(ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]) *
                         double(tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
                expected[size_t(i * ldc + j)] = float(alpha * sum + beta * c[size_t(i * ldc + j)]);
              }
            if (inside_parallel_region) {
#pragma omp parallel num_threads(2)
#pragma omp single
              gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            } else {
              gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            }
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j)
                ASSERT_NEAR(c[size_t(i * ldc + j)], expected[size_t(i * ldc + j)], 1e-4)
                    << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                    << " alpha=" << alpha << " beta=" << beta
                    << " parallel region=" << inside_parallel_region;
          }
}

TEST(Gemm, MatchesReferenceForAllTransposesAndOddSizes) {
  for (bool parallel : {false, true}) {
    check_gemm_against_reference(0.75f, 0.5f, parallel);
    check_gemm_against_reference(1.f, 0.f, parallel);
    check_gemm_against_reference(1.f, 1.f, parallel);
  }
}

TEST(Gemm, ZeroInnerDimensionLeavesBetaTimesC) {
  std::vector<float> c = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.f, c.data(), 2);
  for (float v : c) EXPECT_EQ(v, 0.f);
}

TEST(LayerNorm, MatchesReference) {
  for (int64_t cols : {1, 7, 63, 65, 512}) {
    const int64_t rows = 5;
    auto x = random_vector(rows * cols, 11, 3.f);
    auto gamma = random_vector(cols, 12), beta = random_vector(cols, 13);
    std::vector<float> y(x.size());
    layer_norm(x.data(), gamma.data(), beta.data(), y.data(), rows, cols, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mean += x[size_t(r * cols + c)];
      mean /= double(cols);
      for (int64_t c = 0; c < cols; ++c) var += std::pow(x[size_t(r * cols + c)] - mean, 2);
      var /= double(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double e =
            (x[size_t(r * cols + c)] - mean) / std::sqrt(var + 1e-5) * gamma[size_t(c)] +
            beta[size_t(c)];
        ASSERT_NEAR(y[size_t(r * cols + c)], e, 1e-4) << cols;
      }
    }
  }
}

TEST(Elementwise, BiasActivationsAndLogSoftmax) {
  const int64_t rows = 3, cols = 65;
  auto x = random_vector(rows * cols, 21, 2.f);
  auto bias = random_vector(cols, 22);
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    auto pre = x;
    std::vector<float> y(x.size());
    add_bias_activation(pre.data(), bias.data(), y.data(), rows, cols, act);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double v = double(x[size_t(i)]) + bias[size_t(i % cols)];
      const double e = act == Activation::kRelu ? std::max(v, 0.0)
                                                : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      ASSERT_NEAR(y[size_t(i)], e, 1e-5);
    }
  }
  std::vector<float> logp(x.size());
  log_softmax(x.data(), logp.data(), rows, cols);
  std::vector<int32_t> targets = {0, 64, 17};
  std::vector<float> picked(3);
  log_softmax_pick(x.data(), targets.data(), rows, cols, picked.data());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(double(x[size_t(r * cols + c)]));
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_NEAR(logp[size_t(r * cols + c)], x[size_t(r * cols + c)] - std::log(sum), 1e-5);
    ASSERT_NEAR(picked[size_t(r)], x[size_t(r * cols + targets[size_t(r)])] - std::log(sum), 1e-5);
  }
}

// Whether key j (of `valid` keys) is visible to the query at `position`, by AttentionMask's rule.
bool reference_visible(const AttentionMask& mask, int64_t valid, int64_t position, int64_t j) {
  bool visible = j < valid && (!mask.causal || j <= position);
  if (mask.window >= 0)
    visible = visible &&
              (mask.causal ? position - j <= mask.window : std::abs(position - j) <= mask.window);
  return visible;
}

// The logit of query i and key j of sequence b, head h, in double: (scaled) dot product or
// v_hᵀ·tanh(q + k) (s.score.additive_v).
double reference_score(const AttentionShape& s, const std::vector<float>& q,
                       const std::vector<float>& k, int64_t b, int64_t h, int64_t i, int64_t j) {
  double sum = 0;
  for (int64_t c = 0; c < s.head_dim; ++c) {
    const double qc = q[size_t((b * s.query_len + i) * s.q_row_stride + h * s.head_dim + c)];
    const double kc = k[size_t((b * s.key_len + j) * s.k_row_stride + h * s.head_dim + c)];
    sum += s.score.kind == AttentionScoring::kAdditive
               ? double(s.score.additive_v[h * s.head_dim + c]) * std::tanh(qc + kc)
               : qc * kc;
  }
  return s.score.kind == AttentionScoring::kScaledDot ? sum / std::sqrt(double(s.head_dim)) : sum;
}

// Naive attention for one configuration; returns out [B, Tq, H*d].
std::vector<float> reference_attention(const AttentionShape& s, const AttentionMask& mask,
                                       const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v) {
  std::vector<float> out(size_t(s.batch * s.query_len * s.out_row_stride), 0.f);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.query_len; ++i) {
        const int64_t position = i + mask.query_offset;
        const int64_t valid = mask.key_lengths ? mask.key_lengths[b] : s.key_len;
        std::vector<double> scores(size_t(s.key_len), -INFINITY);
        double max_score = -INFINITY;
        for (int64_t j = 0; j < s.key_len; ++j) {
          if (!reference_visible(mask, valid, position, j)) continue;
          scores[size_t(j)] = reference_score(s, q, k, b, h, i, j);
          max_score = std::max(max_score, scores[size_t(j)]);
        }
        if (max_score == -INFINITY) continue;  // no visible key: zero output
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - max_score));
        for (int64_t c = 0; c < s.head_dim; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < s.key_len; ++j)
            acc += scores[size_t(j)] / sum *
                   v[size_t((b * s.key_len + j) * s.v_row_stride + h * s.head_dim + c)];
          out[size_t((b * s.query_len + i) * s.out_row_stride + h * s.head_dim + c)] = float(acc);
        }
      }
  return out;
}

// Every scoring kind; additive_v gets values large enough to matter.
const AttentionScoring kScorings[] = {AttentionScoring::kScaledDot, AttentionScoring::kDot,
                                      AttentionScoring::kAdditive};

TEST(Attention, MatchesReferenceWithEveryMask) {
  for (AttentionScoring scoring : kScorings)
    for (int64_t head_dim : {1, 7, 64})
      for (int64_t query_len : {1, 7, 37})
        for (int variant = 0; variant < 5; ++variant) {
          AttentionShape s;
          const auto additive_v = random_vector(3 * head_dim, 34, 1.5f);
          s.score = {scoring, additive_v.data()};
          s.batch = 3;
          s.heads = 3;
          s.head_dim = head_dim;
          s.query_len = query_len;
          s.key_len = variant == 4 ? 1 : (variant % 2 ? query_len : 9);
          s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = s.heads * head_dim;
          std::vector<int32_t> lengths = {int32_t(s.key_len),
                                          int32_t(std::max<int64_t>(s.key_len - 2, 1)), 0};
          AttentionMask mask;
          mask.key_lengths = lengths.data();
          mask.causal = variant == 1 || variant == 3;
          mask.window = variant >= 2 && variant < 4 ? 2 : -1;
          mask.query_offset = variant == 3 ? 1 : 0;
          auto q = random_vector(s.batch * s.query_len * s.q_row_stride, 31);
          auto k = random_vector(s.batch * s.key_len * s.k_row_stride, 32);
          auto v = random_vector(s.batch * s.key_len * s.v_row_stride, 33);
          std::vector<float> probs(size_t(s.batch * s.heads * s.query_len * s.key_len));
          std::vector<float> out(size_t(s.batch * s.query_len * s.out_row_stride), 123.f);
          attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data());
          auto expected = reference_attention(s, mask, q, k, v);
          for (size_t i = 0; i < out.size(); ++i) {
            ASSERT_FALSE(std::isnan(out[i]));
            ASSERT_NEAR(out[i], expected[i], 1e-4)
                << "variant " << variant << " d " << head_dim << " T " << query_len << " scoring "
                << int(scoring);
          }
        }
}

// Weights not kept (probs null): the streamed online-softmax path, at lengths that span several
// query blocks (64) and key blocks (256), with the band restricted by causal and window masks.
TEST(Attention, StreamedMatchesReferenceAcrossBlocks) {
  struct Case {
    int64_t query_len, key_len;
    bool causal;
    int64_t window, offset;
  };
  const auto additive_v = random_vector(2 * 16, 44, 1.f);
  for (AttentionScoring scoring : kScorings)
    for (const Case& c :
         {Case{300, 300, false, -1, 0}, Case{300, 300, true, -1, 0}, Case{300, 300, false, 5, 0},
          Case{300, 300, true, 40, 0}, Case{70, 600, false, -1, 0}, Case{1, 600, true, 3, 599},
          Case{65, 65, false, 0, 0}}) {
      AttentionShape s;
      s.score = {scoring, additive_v.data()};
      s.batch = 2;
      s.heads = 2;
      s.head_dim = 16;
      s.query_len = c.query_len;
      s.key_len = c.key_len;
      s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = s.heads * s.head_dim;
      std::vector<int32_t> lengths = {int32_t(c.key_len), int32_t(c.key_len * 2 / 3)};
      AttentionMask mask;
      mask.key_lengths = lengths.data();
      mask.causal = c.causal;
      mask.window = c.window;
      mask.query_offset = c.offset;
      auto q = random_vector(s.batch * s.query_len * s.q_row_stride, 41, 2.f);
      auto k = random_vector(s.batch * s.key_len * s.k_row_stride, 42, 2.f);
      auto v = random_vector(s.batch * s.key_len * s.v_row_stride, 43);
      auto expected = reference_attention(s, mask, q, k, v);
      std::vector<float> probs(size_t(s.batch * s.heads * s.query_len * s.key_len));
      for (bool keep_weights : {true, false}) {
        std::vector<float> out(expected.size(), 123.f);
        attention_forward(s, mask, q.data(), k.data(), v.data(),
                          keep_weights ? probs.data() : nullptr, out.data());
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], expected[i], 2e-5)
              << "Tq " << c.query_len << " Tk " << c.key_len << " causal " << c.causal << " window "
              << c.window << " kept " << keep_weights << " scoring " << int(scoring) << " at " << i;
      }
    }
}

// Double-precision gradients of reference_attention: dq, dk, dv for upstream d_out.
void reference_attention_backward(const AttentionShape& s, const AttentionMask& mask,
                                  const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<float>& d_out,
                                  std::vector<double>& dq, std::vector<double>& dk,
                                  std::vector<double>& dv, std::vector<double>& d_additive_v) {
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  d_additive_v.assign(size_t(s.heads * s.head_dim), 0.0);
  const bool additive = s.score.kind == AttentionScoring::kAdditive;
  const double scale =
      s.score.kind == AttentionScoring::kScaledDot ? 1.0 / std::sqrt(double(s.head_dim)) : 1.0;
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t c, int64_t len, int64_t stride) {
    return size_t((b * len + t) * stride + h * s.head_dim + c);
  };
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.query_len; ++i) {
        const int64_t position = i + mask.query_offset;
        const int64_t valid = mask.key_lengths ? mask.key_lengths[b] : s.key_len;
        std::vector<double> p(size_t(s.key_len), 0.0);
        std::vector<bool> visible(size_t(s.key_len));
        double max_score = -INFINITY;
        for (int64_t j = 0; j < s.key_len; ++j) {
          visible[size_t(j)] = reference_visible(mask, valid, position, j);
          if (!visible[size_t(j)]) continue;
          p[size_t(j)] = reference_score(s, q, k, b, h, i, j);
          max_score = std::max(max_score, p[size_t(j)]);
        }
        if (max_score == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < s.key_len; ++j)
          sum += (p[size_t(j)] = visible[size_t(j)] ? std::exp(p[size_t(j)] - max_score) : 0.0);
        std::vector<double> dp(size_t(s.key_len), 0.0);
        double weighted = 0;
        for (int64_t j = 0; j < s.key_len; ++j) {
          p[size_t(j)] /= sum;
          for (int64_t c = 0; c < s.head_dim; ++c) {
            const double g = d_out[at(b, i, h, c, s.query_len, s.out_row_stride)];
            dp[size_t(j)] += g * v[at(b, j, h, c, s.key_len, s.v_row_stride)];
            dv[at(b, j, h, c, s.key_len, s.v_row_stride)] += p[size_t(j)] * g;
          }
          weighted += p[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < s.key_len; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - weighted) * scale;
          for (int64_t c = 0; c < s.head_dim; ++c) {
            const double qc = q[at(b, i, h, c, s.query_len, s.q_row_stride)];
            const double kc = k[at(b, j, h, c, s.key_len, s.k_row_stride)];
            if (additive) {  // d/dq = d/dk = v_c (1 - tanh²), d/dv_c = tanh(q_c + k_c)
              const double t = std::tanh(qc + kc);
              const double u = ds * s.score.additive_v[h * s.head_dim + c] * (1 - t * t);
              dq[at(b, i, h, c, s.query_len, s.q_row_stride)] += u;
              dk[at(b, j, h, c, s.key_len, s.k_row_stride)] += u;
              d_additive_v[size_t(h * s.head_dim + c)] += ds * t;
              continue;
            }
            dq[at(b, i, h, c, s.query_len, s.q_row_stride)] += ds * kc;
            dk[at(b, j, h, c, s.key_len, s.k_row_stride)] += ds * qc;
          }
        }
      }
}

// Restricted (windowed) and causal attention computes only the band, per block of 64 queries:
// forward and backward against float64, at lengths spanning several blocks.
TEST(Attention, BandedForwardAndBackwardMatchFloat64) {
  struct Case {
    int64_t len;
    bool causal;
    int64_t window;
  };
  const auto additive_v = random_vector(2 * 8, 55, 1.f);
  for (AttentionScoring scoring : kScorings)
    for (const Case& c : {Case{150, false, 7}, Case{150, true, 7}, Case{150, true, -1},
                          Case{130, false, 64}, Case{129, true, 0}}) {
      AttentionShape s;
      s.score = {scoring, additive_v.data()};
      s.batch = 2;
      s.heads = 2;
      s.head_dim = 8;
      s.query_len = s.key_len = c.len;
      s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = s.heads * s.head_dim;
      std::vector<int32_t> lengths = {int32_t(c.len), int32_t(c.len - 20)};
      AttentionMask mask;
      mask.key_lengths = lengths.data();
      mask.causal = c.causal;
      mask.window = c.window;
      auto q = random_vector(s.batch * c.len * s.q_row_stride, 51);
      auto k = random_vector(s.batch * c.len * s.k_row_stride, 52);
      auto v = random_vector(s.batch * c.len * s.v_row_stride, 53);
      auto d_out = random_vector(s.batch * c.len * s.out_row_stride, 54);
      std::vector<float> probs(size_t(s.batch * s.heads * c.len * c.len), 7.f);
      std::vector<float> out(q.size());
      attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data());
      auto expected = reference_attention(s, mask, q, k, v);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-5) << i;
      std::vector<float> dq(q.size(), 9.f), dk(k.size(), 9.f), dv(v.size(), 9.f);
      std::vector<float> d_additive_v(additive_v.size(), 0.5f);  // accumulated into
      attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), {}, d_out.data(),
                         dq.data(), dk.data(), dv.data(), d_additive_v.data());
      std::vector<double> rq, rk, rv, r_additive_v;
      reference_attention_backward(s, mask, q, k, v, d_out, rq, rk, rv, r_additive_v);
      for (size_t i = 0; i < d_additive_v.size(); ++i) {
        const double expected =
            scoring == AttentionScoring::kAdditive ? 0.5 + r_additive_v[i] : 0.5;
        ASSERT_NEAR(d_additive_v[i], expected, 1e-4 * (1 + std::abs(expected))) << "dv_add " << i;
      }
      for (size_t i = 0; i < dq.size(); ++i) {
        ASSERT_NEAR(dq[i], rq[i], 1e-4) << "dq " << i << " len " << c.len << " window " << c.window;
        ASSERT_NEAR(dk[i], rk[i], 1e-4) << "dk " << i << " len " << c.len << " window " << c.window;
        ASSERT_NEAR(dv[i], rv[i], 1e-4) << "dv " << i << " len " << c.len << " window " << c.window;
      }
    }
}

// PackedMatrix: stacked parts in oneDNN's blocked layout, against the plain product.
TEST(PackedMatrix, StackedProductMatchesReference) {
  for (int64_t k : {1, 7, 64, 513}) {
    const std::vector<int64_t> part_rows = {5, 1, 33};
    std::vector<std::vector<float>> parts;
    std::vector<const float*> pointers;
    for (size_t i = 0; i < part_rows.size(); ++i) {
      parts.push_back(random_vector(part_rows[i] * k, 60 + i));
      pointers.push_back(parts.back().data());
    }
    const PackedMatrix packed(pointers, part_rows, k);
    ASSERT_EQ(packed.rows(), 39);
    ASSERT_EQ(packed.cols(), k);
    for (int64_t m : {1, 3, 32, 100}) {
      const int64_t ldx = k + 2, ldy = 41;
      auto x = random_vector(m * ldx, 70 + m);
      std::vector<float> y(size_t(m * ldy), 5.f);
      packed.multiply(x.data(), m, ldx, y.data(), ldy);
      for (int64_t r = 0; r < m; ++r) {
        int64_t row = 0;
        for (size_t part = 0; part < parts.size(); ++part)
          for (int64_t j = 0; j < part_rows[part]; ++j, ++row) {
            double sum = 0;
            for (int64_t c = 0; c < k; ++c)
              sum += double(x[size_t(r * ldx + c)]) * parts[part][size_t(j * k + c)];
            ASSERT_NEAR(y[size_t(r * ldy + row)], sum, 1e-4) << "m " << m << " k " << k;
          }
        for (int64_t j = 39; j < ldy; ++j) ASSERT_EQ(y[size_t(r * ldy + j)], 5.f);  // untouched
      }
    }
  }
}

// bfloat16 packing: weights and inputs rounded to 8-bit mantissas, float32 accumulation. The
// error bound is relative to Σ|x·w| (each product carries at most ~2 · 2^-8 relative error).
TEST(PackedMatrix, BFloat16ProductWithinRoundingOfFloat32) {
  if (!bfloat16_supported()) GTEST_SKIP() << "this CPU has no AVX512-BF16 instructions";
  const int64_t k = 300, n = 70, m = 9;
  auto w = random_vector(n * k, 80);
  auto x = random_vector(m * k, 81);
  x[5] = 1e30f;  // far outside float16's range, inside bfloat16's
  const PackedMatrix packed({w.data()}, {n}, k, Precision::kBFloat16);
  std::vector<float> y(size_t(m * n));
  packed.multiply(x.data(), m, k, y.data(), n);
  double worst = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = double(x[size_t(r * k + c)]) * w[size_t(j * k + c)];
        sum += p;
        magnitude += std::abs(p);
      }
      const double error = std::abs(y[size_t(r * n + j)] - sum) / magnitude;
      ASSERT_LT(error, 2.0 / 256) << r << " " << j;
      worst = std::max(worst, error);
    }
  EXPECT_GT(worst, 1e-6) << "no rounding at all: not a bfloat16 product";
}

}  // namespace
}  // namespace tfm

#include "kernels/fast_exp.h"

namespace tfm {
namespace {

TEST(FastExp, RelativeErrorBelowOneMillionthAcrossTheRange) {
  for (double x = -87.0; x < 88.0; x += 0.00731) {
    const float xf = float(x);
    const double e = std::exp(double(xf));
    ASSERT_LT(std::abs(fast_exp(xf) - e) / e, 1e-6) << x;
  }
  EXPECT_EQ(fast_exp(-1000.f), 0.f);
  EXPECT_EQ(fast_exp(-INFINITY), 0.f);
  EXPECT_EQ(fast_exp(0.f), 1.f);
}

}  // namespace
}  // namespace tfm
