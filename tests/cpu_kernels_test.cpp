// What only the CPU backend's kernels have, beyond the backend-ops test: gemm's second path
// (dnnl_sgemm inside OpenMP parallel regions, where attention calls it) and fast_exp's accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/fast_exp.h"
#include "backend/cpu/gemm.h"
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
