// What only the CPU backend's kernels have, beyond the backend-ops test: gemm's second path
// (dnnl_sgemm inside OpenMP parallel regions, where attention calls it), fast_exp's accuracy, and
// the exact integer values of int8 quantisation, and sum_of_squares' independence of the thread
// count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "backend/cpu/fast_exp.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/int8_quantization.h"
#include "backend/cpu/optimizer.h"
#include "tensor/int8_weights.h"
#include "tensor/random.h"

namespace tfm {
namespace {

TEST(CpuGemm, InsideAParallelRegionMatchesFloat64) {
  Random random(5);
  uint64_t cases = 0;
  for (int64_t m : {1, 7, 65})
    for (int64_t n : {1, 7, 65})
      for (int64_t k : {1, 7, 65})
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb) {
            const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
            std::vector<float> a(size_t((ta ? k : m) * lda)), b(size_t((tb ? n : k) * ldb)),
                c(size_t(m * ldc));
            for (float& x : a) x = random.normal();
            for (float& x : b) x = random.normal();
            for (float& x : c) x = random.normal();
            auto expected = c;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double sum = 0;
                for (int64_t p = 0; p < k; ++p)
                  sum += double(ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]) *
                         double(tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
                expected[size_t(i * ldc + j)] = float(sum + 1.0 * c[size_t(i * ldc + j)]);
              }
#pragma omp parallel num_threads(2)
#pragma omp single
            gemm(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 1.f, c.data(), ldc);
            for (size_t i = 0; i < c.size(); ++i)
              ASSERT_NEAR(c[i], expected[i], 1e-4) << m << " " << n << " " << k;
            ++cases;
          }
  EXPECT_EQ(cases, 108u);
}

// Gradient clipping's Σ x² is summed in blocks by whichever threads run: its value must depend
// on the data alone, or a resumed run on a machine with another thread count would diverge.
TEST(CpuOptimizer, SumOfSquaresIsTheSameOnAnyThreadCount) {
  Random random(9);
  std::vector<float> x(1000003);
  for (float& v : x) v = random.normal();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_of_squares(x.data(), int64_t(x.size()));
  omp_set_num_threads(3);
  const double three = sum_of_squares(x.data(), int64_t(x.size()));
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);
  EXPECT_EQ(one, sum_of_squares(x.data(), int64_t(x.size())));
}

// Values chosen by hand: the scale is the row's largest magnitude over 127, values round to the
// nearest step (activations then + 128), and an all-zero row gets scale 1. No value sits on a
// half step, where float rounding of the scale could decide.
TEST(Int8Quantization, RowsQuantiseToTheNearestStepOfTheirOwnScale) {
  const std::vector<float> w = {2.54f, -1.3f, 0.004f, 0.06f,    // scale 0.02
                                0.f,   0.f,   0.f,    0.f,      // scale 1
                                -5.f,  0.5f,  1.f,    -0.02f};  // scale 5/127
  std::vector<int8_t> q(12);
  std::vector<float> scales(3);
  std::vector<int32_t> sums(3);
  quantize_weight_rows(w.data(), 3, 4, q.data(), scales.data());
  int8_row_sums(q.data(), 3, 4, sums.data());
  EXPECT_FLOAT_EQ(scales[0], 0.02f);
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 4), (std::vector<int8_t>{127, -65, 0, 3}));
  EXPECT_EQ(sums[0], 127 - 65 + 0 + 3);
  EXPECT_EQ(scales[1], 1.f);
  EXPECT_EQ(sums[1], 0);
  EXPECT_EQ(std::vector<int8_t>(q.begin() + 8, q.end()), (std::vector<int8_t>{-127, 13, 25, -1}));

  const std::vector<float> x = {1.f, -0.4f, 99.f, 0.25f, /* row 1, stride 4: */ 0.f, 0.f, 7.f, 7.f};
  std::vector<uint8_t> qx(4);
  std::vector<float> x_scales(2);
  quantize_activation_rows(x.data(), 2, 2, 4, qx.data(), x_scales.data());  // 2 of each 4
  EXPECT_FLOAT_EQ(x_scales[0], 1.f / 127);
  EXPECT_EQ(qx[0], 255);
  EXPECT_EQ(qx[1], 128 - 51);  // −0.4 · 127 = −50.8
  EXPECT_EQ(x_scales[1], 1.f);
  EXPECT_EQ(qx[2], 128);
  EXPECT_EQ(qx[3], 128);

  // (products − 128 · Σ) · row scale · column scale, with the products of the shifted input.
  const std::vector<int32_t> products = {128 * 10 + 6, 128 * -3 - 4};  // [1, 2]
  const std::vector<int32_t> column_sums = {10, -3};
  const std::vector<float> row_scale = {0.5f}, column_scales = {2.f, 0.25f};
  std::vector<float> y(3, 9.f);
  dequantize_products(products.data(), 1, 2, column_sums.data(), row_scale.data(),
                      column_scales.data(), y.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{6.f, -0.5f, 9.f}));
}

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
