// The backend-ops test (in the spirit of ggml's test-backend-ops): every operation of the
// Backend interface, on every backend built into this binary (available_backends()), in every
// precision it supports, against plain float64 loops written here, forward and backward, at odd
// sizes (1, 7, 63, 65...) so that SIMD tails and blocking edges are covered. A new backend joins
// by registering in available_backends(); it needs no test of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "backend/device_tensors.h"
#ifdef TFM_EMULATED_CUDA_TESTS
#include "emulated_cuda_backend.h"
#endif
#include "guard_page_backend.h"
#include "host_staged_backend.h"
#include "skip_report.h"
#include "tensor/float16.h"
#include "tensor/random.h"

namespace tfm {
namespace {

std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.f) {
  Random random(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = random.normal() * scale;
  return v;
}

class BackendOps : public ::testing::TestWithParam<const Backend*> {
 protected:
  const Backend& be() const { return *GetParam(); }
  // The precisions of a prepared matrix that be() multiplies in; each of the others is reported
  // as a skipped part of the calling test.
  std::vector<Precision> prepared_precisions() const {
    std::vector<Precision> supported;
    for (Precision precision :
         {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16, Precision::kInt8}) {
      if (be().supports(precision))
        supported.push_back(precision);
      else
        testing_support::skip_precision(be(), precision);
    }
    return supported;
  }
};

std::string backend_name(const ::testing::TestParamInfo<const Backend*>& info) {
  return info.param->name();
}

#ifdef TFM_EMULATED_CUDA_TESTS
// The emulated_cuda_tests binary: the CUDA backend's own kernels, run on the CPU
// (emulated_cuda_backend.h), through every test below, staged as a GPU's are.
const Backend* staged_emulated_cuda() {
  static const HostStagedBackend staged(emulated_cuda_backend());
  return &staged;
}
INSTANTIATE_TEST_SUITE_P(EmulatedCuda, BackendOps, ::testing::Values(staged_emulated_cuda()),
                         backend_name);
#else
// The tests pass host pointers (std::vector data): a backend whose memory is the host's is
// tested as it is, any other through a HostStagedBackend that copies each operation's arguments
// into its memory and the results back (host_staged_backend.h).
const std::vector<const Backend*>& backends_under_test() {
  static const std::vector<const Backend*> backends = [] {
    static std::deque<HostStagedBackend> staged;  // live as long as the tests
    std::vector<const Backend*> list;
    for (const Backend* backend : available_backends())
      list.push_back(backend->memory_is_host() ? backend : &staged.emplace_back(*backend));
    return list;
  }();
  return backends;
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BackendOps, ::testing::ValuesIn(backends_under_test()),
                         backend_name);

// The staging adapter itself, checked without a GPU: the CPU's operations behind it on memory
// that is "not the host's" and ends at guard pages (guard_page_backend.h), so an argument range
// it computes too small faults, and an output it stages but the operation does not write reads
// back as NaN.
const Backend* staged_guarded_cpu() {
  static const GuardPageBackend device;
  static const HostStagedBackend staged(device);
  return &staged;
}

INSTANTIATE_TEST_SUITE_P(StagedCpu, BackendOps, ::testing::Values(staged_guarded_cpu()),
                         backend_name);

TEST(Backends, CpuIsRegisteredFirstAndUnknownDevicesAreRefused) {
  ASSERT_FALSE(available_backends().empty());
  EXPECT_EQ(available_backends()[0], &cpu_backend());
  EXPECT_EQ(&find_backend("cpu"), &cpu_backend());
  try {
    find_backend("tpu");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device \"tpu\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos);
  }
}
#endif  // TFM_EMULATED_CUDA_TESTS

// --- Matrix products --------------------------------------------------------------------------

// In float32 against float64 on the inputs as given; in bfloat16 (training's products) and
// float16 (GPUs only) against float64 on the inputs rounded to that format (nearest, ties to
// even), so the bound is float32 accumulation's in each: the rounding itself is checked exactly,
// not within a tolerance. Each product also as training's, which a backend may run on an
// algorithm it timed for the shape (MatmulEpilogue::may_tune; the CUDA backend's under
// TFM_CUDA_LT_TUNING=all, for every shape).
TEST_P(BackendOps, MatmulMatchesFloat64ForAllTransposesAndOddSizes) {
  const int64_t sizes[] = {1, 7, 63, 65};
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    SCOPED_TRACE(precision_name(precision));
    const bool bfloat16 = precision == Precision::kBFloat16;
    const bool float16 = precision == Precision::kFloat16;
    if (!be().supports(precision)) {
      std::vector<float> one = {1.f};
      EXPECT_THROW(be().matmul(false, false, 1, 1, 1, 1.f, one.data(), 1, one.data(), 1, 0.f,
                               one.data(), 1, precision),
                   std::invalid_argument);
      testing_support::skip_precision(be(), precision);
      continue;
    }
    auto as_multiplied = [bfloat16, float16](float x) {
      if (float16) return double(half_to_float(float_to_half(x)));
      return bfloat16 ? double(bfloat16_to_float(float_to_bfloat16(x))) : double(x);
    };
    uint64_t seed = 1;
    int64_t rounded_differently = 0;
    for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{1.f, 1.f}, std::pair{0.75f, 0.5f}})
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
                    double sum = 0, exact = 0;
                    for (int64_t p = 0; p < k; ++p) {
                      const float x = ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
                      const float y = tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)];
                      sum += as_multiplied(x) * as_multiplied(y);
                      exact += double(x) * double(y);
                    }
                    expected[size_t(i * ldc + j)] =
                        float(alpha * sum + beta * double(c[size_t(i * ldc + j)]));
                    rounded_differently += std::abs(sum - exact) > 1e-3;
                  }
                for (bool tuned : {false, true}) {
                  auto got = c;
                  MatmulEpilogue training;
                  training.may_tune = tuned;
                  be().matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                              got.data(), ldc, precision, training);
                  for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < ldc; ++j)
                      ASSERT_NEAR(got[size_t(i * ldc + j)], expected[size_t(i * ldc + j)], 1e-4)
                          << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                          << " alpha=" << alpha << " beta=" << beta << " tuned=" << tuned;
                }
              }
    // bfloat16's reference really differs from float32's (the test can tell them apart).
    if (bfloat16) {
      EXPECT_GT(rounded_differently, 1000);
    }
  }
  std::vector<float> one = {1.f};
  EXPECT_THROW(be().matmul(false, false, 1, 1, 1, 1.f, one.data(), 1, one.data(), 1, 0.f,
                           one.data(), 1, Precision::kInt8),
               std::invalid_argument);
}

// Inference's products (may_tune false) give the same bits before and after training's products
// of the same shapes (may_tune) had their algorithm timed: a backend may tune training's, never
// inference's, whose results must not change within a run or from one run to the next. Plain
// x·Wᵀ and with a bias (the shapes a GPU's library runs with its epilogue), bfloat16 and float32,
// several shapes (an emulated library's timing picks another algorithm for some).
TEST_P(BackendOps, InferenceProductsKeepTheirBitsAfterTrainingTunedTheShape) {
  uint64_t seed = 4000;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!be().supports(precision)) {
      testing_support::skip_precision(be(), precision);
      continue;
    }
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{9, 33, 65},
                           {40, 24, 130},
                           {70, 64, 31},
                           {128, 48, 96}})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(precision_name(precision)) + " m=" + std::to_string(m) + " n=" +
                     std::to_string(n) + " k=" + std::to_string(k) + (with_bias ? " bias" : ""));
        const auto x = random_vector(m * k, seed++), w = random_vector(n * k, seed++);
        const auto bias = random_vector(n, seed++);
        MatmulEpilogue inference;
        inference.bias = with_bias ? bias.data() : nullptr;
        MatmulEpilogue training = inference;
        training.may_tune = true;
        std::vector<float> before(size_t(m * n)), tuned(size_t(m * n)), after(size_t(m * n));
        be().matmul(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 0.f, before.data(), n,
                    precision, inference);
        be().matmul(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 0.f, tuned.data(), n,
                    precision, training);
        be().matmul(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 0.f, after.data(), n,
                    precision, inference);
        EXPECT_EQ(after, before);
      }
  }
}

// round_each_to_16_bits (training's weights, all rounded at once) rounds every job's floats as
// round_to_16_bits does: element for element float_to_bfloat16 / float_to_half (NaN kept), for
// more jobs than a GPU's launch takes (64 with elements), of sizes around its words of four and its
// blocks of 4,096 floats, empty ones, and jobs off 16-byte alignment; nothing between the jobs'
// outputs is written.
TEST_P(BackendOps, RoundEachTo16BitsRoundsEveryJobAsRoundTo16Bits) {
  const int64_t sizes[] = {0, 1, 3, 4, 28, 4095, 4096, 4097, 9000, 12288};
  for (Precision format : {Precision::kBFloat16, Precision::kFloat16}) {
    const bool float16 = format == Precision::kFloat16;
    std::vector<int64_t> x_at, out_at, counts;  // each job's place in x and out
    int64_t x_size = 0, out_size = 0;
    for (int64_t j = 0; j < 80; ++j) {  // 72 with elements: two launches of a GPU
      counts.push_back(sizes[j % 10]);
      x_at.push_back(x_size + j % 3);  // 0, 1 or 2 floats past the last job's end
      out_at.push_back(out_size + (j + 1) % 3);
      x_size = x_at.back() + counts.back();
      out_size = out_at.back() + counts.back();
    }
    auto x = random_vector(x_size, 13, float16 ? 1.f : 100.f);
    x[5] = std::numeric_limits<float>::quiet_NaN();
    x[size_t(x_size - 2)] = std::numeric_limits<float>::infinity();
    std::vector<uint16_t> out(size_t(out_size), 0xdead);
    std::vector<RoundingJob> jobs;
    for (size_t j = 0; j < counts.size(); ++j)
      jobs.push_back({x.data() + x_at[j], counts[j], out.data() + out_at[j]});
    be().round_each_to_16_bits(jobs, format);
    std::vector<bool> written(out.size(), false);
    for (size_t j = 0; j < counts.size(); ++j)
      for (int64_t i = 0; i < counts[j]; ++i) {
        const float v = x[size_t(x_at[j] + i)];
        const uint16_t got = out[size_t(out_at[j] + i)];
        written[size_t(out_at[j] + i)] = true;
        if (std::isnan(v))
          EXPECT_TRUE(std::isnan(float16 ? half_to_float(got) : bfloat16_to_float(got)));
        else
          ASSERT_EQ(got, float16 ? float_to_half(v) : float_to_bfloat16(v))
              << precision_name(format) << " job " << j << " element " << i;
      }
    for (size_t i = 0; i < out.size(); ++i)
      if (!written[i]) {
        ASSERT_EQ(out[i], 0xdead) << "between the jobs, element " << i;
      }
  }
  std::vector<float> one = {1.f};
  std::vector<uint16_t> bits(1);
  for (Precision other : {Precision::kFloat32, Precision::kInt8})
    EXPECT_THROW(be().round_each_to_16_bits({{one.data(), 1, bits.data()}}, other),
                 std::invalid_argument);
}

// round_to_16_bits is the rounding bfloat16 products and 16-bit caches apply (nearest, ties to
// even, NaN kept): element for element float_to_bfloat16 / float_to_half, from a strided matrix
// into a dense one, including exact ties, values that round up into the next exponent or past
// the format's range, infinities, subnormals and NaN, whose bits are spelled out (the float16
// ones as numpy's float32 → float16 cast gives them).
TEST_P(BackendOps, RoundTo16BitsRoundsEachElementToNearestEven) {
  struct Special {
    uint32_t input;     // float32 bits
    uint16_t expected;  // in the format
  };
  const std::vector<Special> bfloat16_specials = {
      {0x3f808000u, 0x3f80},  // a tie: down to the even 0x3f80
      {0x3f818000u, 0x3f82},  // a tie: up to the even 0x3f82
      {0x3fffffffu, 0x4000},  // carries into the exponent: 2.0
      {0x7f7fffffu, 0x7f80},  // the largest float rounds up to +inf
      {0x7f800000u, 0x7f80},  // +inf
      {0xff800000u, 0xff80},  // -inf
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x000116c2u, 0x0001},  // 1e-40, subnormal: rounds to 0x0001
  };
  const std::vector<Special> float16_specials = {
      {0x3f801000u, 0x3c00},  // 1 + 2^-11, a tie: down to the even 1.0
      {0x3f803000u, 0x3c02},  // 1 + 3·2^-11, a tie: up to the even 0x3c02
      {0x477fef00u, 0x7bff},  // 65519: the largest float16, 65504
      {0x477ff000u, 0x7c00},  // 65520, half way past it: +inf
      {0x7f7fffffu, 0x7c00},  // the largest float: +inf
      {0xff800000u, 0xfc00},  // -inf
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x33c00000u, 0x0002},  // 1.5 · 2^-24, a tie between subnormals: up to the even 2 · 2^-24
      {0x33000000u, 0x0000},  // 2^-25, a tie with 0: down to 0
      {0x3dcccccdu, 0x2e66},  // 0.1
  };
  // 29 of 32 columns: one element at a time; 28 of 36: a GPU rounds four at a time.
  const int64_t rows = 37;
  for (const auto& [cols, ldx] : {std::pair<int64_t, int64_t>{29, 32}, {28, 36}})
    for (Precision format : {Precision::kBFloat16, Precision::kFloat16}) {
      const bool float16 = format == Precision::kFloat16;
      const std::vector<Special>& specials = float16 ? float16_specials : bfloat16_specials;
      // Standard normal values (float16 holds them with room to spare) and, for bfloat16, large
      // ones; special i in row i, column 3i % cols; a NaN in the row after them.
      auto x = random_vector(rows * ldx, 11, float16 ? 1.f : 100.f);
      const auto special_at = [&](size_t i) { return int64_t(i) * ldx + 3 * int64_t(i) % cols; };
      for (size_t i = 0; i < specials.size(); ++i)
        x[size_t(special_at(i))] = std::bit_cast<float>(specials[i].input);
      x[size_t(special_at(specials.size()))] = std::numeric_limits<float>::quiet_NaN();
      std::vector<uint16_t> out(size_t(rows * cols), 0xdead);
      be().round_to_16_bits(x.data(), rows, cols, ldx, format, out.data());
      const auto widen = [&](uint16_t bits) {
        return float16 ? half_to_float(bits) : bfloat16_to_float(bits);
      };
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = x[size_t(r * ldx + c)];
          const uint16_t got = out[size_t(r * cols + c)];
          if (std::isnan(v))
            EXPECT_TRUE(std::isnan(widen(got))) << r << "," << c;
          else
            ASSERT_EQ(got, float16 ? float_to_half(v) : float_to_bfloat16(v))
                << precision_name(format) << " " << r << "," << c << " " << v;
        }
      for (size_t i = 0; i < specials.size(); ++i)
        EXPECT_EQ(out[size_t(int64_t(i) * cols + 3 * int64_t(i) % cols)], specials[i].expected)
            << precision_name(format) << " special " << i;
    }
  std::vector<float> one = {1.f};
  std::vector<uint16_t> bits(1);
  for (Precision other : {Precision::kFloat32, Precision::kInt8})
    EXPECT_THROW(be().round_to_16_bits(one.data(), 1, 1, 1, other, bits.data()),
                 std::invalid_argument);
}

// A bfloat16 product reads an operand's rounded copy where one is given (MatmulOperand): with
// the copy of the operand itself the result is bit for bit the product that rounds it, and with
// a copy of other values it is those values' product (the copy, not `values`, is multiplied).
TEST_P(BackendOps, MatmulReadsTheRoundedCopyOfAnOperand) {
  if (!be().supports(Precision::kBFloat16))
    GTEST_SKIP() << testing_support::cannot_compute(be(), Precision::kBFloat16);
  const int64_t m = 33, n = 70, k = 65;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k,
                    b_cols = tb ? k : n;
      const int64_t lda = a_cols + 3, ldb = b_cols + 1;
      auto a = random_vector(a_rows * lda, 21 + ta);
      auto b = random_vector(b_rows * ldb, 31 + tb);
      auto other = random_vector(a_rows * lda, 41);
      std::vector<uint16_t> a16(size_t(a_rows * a_cols)), b16(size_t(b_rows * b_cols)),
          other16(size_t(a_rows * a_cols));
      be().round_to_16_bits(a.data(), a_rows, a_cols, lda, Precision::kBFloat16, a16.data());
      be().round_to_16_bits(b.data(), b_rows, b_cols, ldb, Precision::kBFloat16, b16.data());
      be().round_to_16_bits(other.data(), a_rows, a_cols, lda, Precision::kBFloat16,
                            other16.data());
      for (float beta : {0.f, 1.f}) {
        SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                     " beta=" + std::to_string(beta));
        const auto c0 = random_vector(m * n, 51);
        auto expected = c0, both = c0, only_a = c0, only_b = c0, swapped = c0, of_other = c0;
        be().matmul(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, beta, expected.data(), n,
                    Precision::kBFloat16);
        be().matmul(ta, tb, m, n, k, 1.f, {a.data(), a16.data()}, lda, {b.data(), b16.data()}, ldb,
                    beta, both.data(), n, Precision::kBFloat16);
        be().matmul(ta, tb, m, n, k, 1.f, {a.data(), a16.data()}, lda, b.data(), ldb, beta,
                    only_a.data(), n, Precision::kBFloat16);
        be().matmul(ta, tb, m, n, k, 1.f, a.data(), lda, {b.data(), b16.data()}, ldb, beta,
                    only_b.data(), n, Precision::kBFloat16);
        EXPECT_EQ(both, expected);
        EXPECT_EQ(only_a, expected);
        EXPECT_EQ(only_b, expected);
        be().matmul(ta, tb, m, n, k, 1.f, other.data(), lda, b.data(), ldb, beta, of_other.data(),
                    n, Precision::kBFloat16);
        be().matmul(ta, tb, m, n, k, 1.f, {a.data(), other16.data()}, lda, b.data(), ldb, beta,
                    swapped.data(), n, Precision::kBFloat16);
        EXPECT_EQ(swapped, of_other);
        EXPECT_NE(swapped, expected);
        // The copies as column blocks of wider matrices (MatmulOperand::rounded_ld: the stacked
        // Q|K|V gradients), their padding NaN, and no values: the same product, within 1e-5 of
        // Σ|a·b| (a backend may pick another algorithm for another stride).
        const int64_t a16_ld = a_cols + 5, b16_ld = b_cols + 2;
        std::vector<uint16_t> a16_wide(size_t(a_rows * a16_ld), 0x7fc0),
            b16_wide(size_t(b_rows * b16_ld), 0x7fc0);
        for (int64_t r = 0; r < a_rows; ++r)
          std::copy_n(a16.begin() + r * a_cols, a_cols, a16_wide.begin() + r * a16_ld + 3);
        for (int64_t r = 0; r < b_rows; ++r)
          std::copy_n(b16.begin() + r * b_cols, b_cols, b16_wide.begin() + r * b16_ld + 1);
        auto strided = c0;
        be().matmul(ta, tb, m, n, k, 1.f, {nullptr, a16_wide.data() + 3, a16_ld}, lda,
                    {nullptr, b16_wide.data() + 1, b16_ld}, ldb, beta, strided.data(), n,
                    Precision::kBFloat16);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double magnitude = std::abs(double(c0[size_t(i * n + j)]));
            for (int64_t p = 0; p < k; ++p)
              magnitude += std::abs(double(a[size_t(ta ? p * lda + i : i * lda + p)]) *
                                    b[size_t(tb ? j * ldb + p : p * ldb + j)]);
            ASSERT_NEAR(strided[size_t(i * n + j)], expected[size_t(i * n + j)], 1e-5 * magnitude)
                << "strided copies, row " << i << " col " << j;
          }
      }
    }
}

// matmul's epilogue (MatmulEpilogue: + bias on every row, then ReLU) applies to the finished
// product: the product without it followed by c + bias and max(·, 0), in float32 and bfloat16,
// for every transpose, beta 0 (where the CPU backend applies it inside the product's own pass)
// and beta 1, alpha 1 and not, strided C (its padding untouched), shapes of one and many
// primitive blocks, inside a parallel region (another path), and with no inner dimension: bit
// for bit, but that a backend may run the fused product x·Wᵀ with alpha 1 and beta 0 (a linear
// layer's) on another algorithm (the CUDA backend's cuBLASLt), whose sums may then differ in their
// float rounding: within 1e-5 of
// |alpha|·Σ|a·b| + |beta·c| + |bias| per element, as PreparedMatrixAppliesItsEpilogueToTheFinished-
// Product allows. The result written in bfloat16 is the plain product's, epilogue applied,
// rounded: bit for bit.
TEST_P(BackendOps, MatmulAppliesItsEpilogueToTheFinishedProduct) {
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    if (!be().supports(precision)) {
      testing_support::skip_precision(be(), precision);
      continue;
    }
    uint64_t seed = 600;
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7},
                           {300, 129, 65},
                           {64, 512, 512},
                           {4, 6, 0}})
      for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{1.f, 1.f}, std::pair{0.75f, 0.f}})
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb)
            for (int nested = 0; nested < 2; ++nested)
              for (int form = 0; form < 3; ++form) {  // bias, ReLU, both
                const bool with_bias = form != 1, relu = form != 0;
                SCOPED_TRACE("precision=" + std::to_string(int(precision)) +
                             " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                             " k=" + std::to_string(k) + " alpha=" + std::to_string(alpha) +
                             " beta=" + std::to_string(beta) + " ta=" + std::to_string(ta) +
                             " tb=" + std::to_string(tb) + " nested=" + std::to_string(nested) +
                             " bias=" + std::to_string(with_bias) +
                             " relu=" + std::to_string(relu));
                const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
                const auto a = random_vector(std::max<int64_t>(1, (ta ? k : m) * lda), seed++);
                const auto b = random_vector(std::max<int64_t>(1, (tb ? n : k) * ldb), seed++);
                const auto bias = random_vector(n, seed++, 10.f);
                const auto c0 = random_vector(m * ldc, seed++, 10.f);
                const MatmulEpilogue epilogue{with_bias ? bias.data() : nullptr, relu};
                auto expected = c0, got = c0;
                const auto run = [&](std::vector<float>& c, MatmulEpilogue e) {
                  if (!nested) {
                    be().matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                                c.data(), ldc, precision, e);
                    return;
                  }
#pragma omp parallel num_threads(1)
                  be().matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
                              ldc, precision, e);
                };
                run(expected, {});
                int64_t clamped = 0;
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 0; j < n; ++j) {
                    float& v = expected[size_t(i * ldc + j)];
                    if (with_bias) v += bias[size_t(j)];
                    if (relu && !(v > 0.f)) v = 0.f, ++clamped;
                  }
                if (relu && m * n > 100) {
                  ASSERT_GT(clamped, m * n / 4);  // the ReLU has work to do
                }
                run(got, epilogue);
                for (int64_t i = 0; i < m; ++i) {
                  for (int64_t j = 0; j < n; ++j) {
                    const double want = expected[size_t(i * ldc + j)];
                    const float value = got[size_t(i * ldc + j)];
                    if (value == want) continue;  // the same algorithm's sums
                    ASSERT_TRUE(!ta && tb && alpha == 1.f && beta == 0.f && k > 0)
                        << "another algorithm's sums where no backend fuses: row " << i << " col "
                        << j << ", " << value << " against " << want;
                    double magnitude = 0;
                    for (int64_t p = 0; p < k; ++p)
                      magnitude += std::abs(double(a[size_t(ta ? p * lda + i : i * lda + p)]) *
                                            b[size_t(tb ? j * ldb + p : p * ldb + j)]);
                    const double bound = 1e-5 * (std::abs(alpha) * magnitude +
                                                 std::abs(double(beta) * c0[size_t(i * ldc + j)]) +
                                                 (with_bias ? std::abs(bias[size_t(j)]) : 0.0));
                    if (relu && want <= bound) {  // at or near 0: 0, or what is left above it
                      ASSERT_GE(value, 0.f) << "row " << i << " col " << j;
                      ASSERT_LE(value, std::max(want, 0.0) + bound) << "row " << i << " col " << j;
                      continue;
                    }
                    ASSERT_NEAR(value, want, bound) << "row " << i << " col " << j;
                  }
                  for (int64_t j = n; j < ldc; ++j)
                    ASSERT_EQ(got[size_t(i * ldc + j)], c0[size_t(i * ldc + j)]);
                }
                if (precision != Precision::kBFloat16 || beta != 0.f) continue;
                // The same result written in bfloat16 instead (c untouched: null), each element
                // rounded to nearest even; the padding between rows untouched.
                std::vector<uint16_t> rounded(size_t(m * ldc), 0xdead);
                MatmulEpilogue to_bfloat16 = epilogue;
                to_bfloat16.rounded_output = rounded.data();
                if (!nested) {
                  be().matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, 0.f, nullptr,
                              ldc, precision, to_bfloat16);
                } else {
#pragma omp parallel num_threads(1)
                  be().matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, 0.f, nullptr,
                              ldc, precision, to_bfloat16);
                }
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 0; j < ldc; ++j) {
                    const uint16_t want =
                        j < n ? float_to_bfloat16(expected[size_t(i * ldc + j)]) : uint16_t(0xdead);
                    ASSERT_EQ(rounded[size_t(i * ldc + j)], want) << i << "," << j;
                  }
              }
  }
}

// x rounded to bfloat16 (nearest even), and the same values widened back to float: what a
// bfloat16 key/value cache holds, and the float copy a float32 reference reads instead.
struct RoundedCopy {
  std::vector<uint16_t> bits;
  std::vector<float> widened;
};
// x rounded to `format` (kBFloat16 or kFloat16): the bits, and their values widened back.
RoundedCopy rounded_copy(const std::vector<float>& x, Precision format) {
  RoundedCopy r;
  for (float v : x) {
    const bool float16 = format == Precision::kFloat16;
    r.bits.push_back(float16 ? float_to_half(v) : float_to_bfloat16(v));
    r.widened.push_back(float16 ? half_to_float(r.bits.back()) : bfloat16_to_float(r.bits.back()));
  }
  return r;
}

// A bfloat16 output the product may round itself (MatmulEpilogue::rounded_by_the_product: a
// GPU's library writing it directly, the logits and fc1's hidden layer of training in bfloat16):
// each element within an ulp of the float32 product's value rounded, plus its sums' rounding
// error (1e-5 · Σ|a·b|) and, with the bias given in bfloat16 too (rounded_bias), that bias's
// rounding — another algorithm's float sums rounded to nearest; a ReLU's output never negative;
// the padding between rows untouched, in both layouts (x·Wᵀ, and dy·W: the feed-forward's hidden
// gradient). With a float bias alone it is the float32 product's rounding to the bit.
TEST_P(BackendOps, BFloat16OutputRoundedByTheProductStaysWithinAnUlp) {
  if (!be().supports(Precision::kBFloat16))
    GTEST_SKIP() << testing_support::cannot_compute(be(), Precision::kBFloat16);
  uint64_t seed = 900;
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7},
                         {300, 129, 65},
                         {64, 512, 512},
                         {37, 1000, 64}})
    for (int tb = 0; tb < 2; ++tb)
      for (int form = 0; form < 4; ++form) {  // none; float bias; bfloat16 bias; and a ReLU
        const bool with_bias = form > 0, rounded_bias = form > 1, relu = form == 3;
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + " tb=" + std::to_string(tb) +
                     " form=" + std::to_string(form));
        const int64_t lda = k + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
        const auto a = random_vector(m * lda, seed++);
        const auto b = random_vector((tb ? n : k) * ldb, seed++);
        const auto bias = random_vector(n, seed++, 10.f);
        const RoundedCopy bias16 = rounded_copy(bias, Precision::kBFloat16);
        // The float32 product, and its bias and ReLU added here (as the test above: a product
        // with its bias inside may take another algorithm than one rounded after a pass).
        std::vector<float> expected(size_t(m * ldc), 0.f);
        be().matmul(false, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, expected.data(),
                    ldc, Precision::kBFloat16, {});
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            float& v = expected[size_t(i * ldc + j)];
            if (with_bias) v += bias[size_t(j)];
            if (relu && !(v > 0.f)) v = 0.f;
          }
        MatmulEpilogue plain;
        plain.bias = with_bias ? bias.data() : nullptr;
        plain.relu = relu;
        std::vector<uint16_t> rounded(size_t(m * ldc), 0xdead);
        MatmulEpilogue itself = plain;
        itself.rounded_output = rounded.data();
        itself.rounded_by_the_product = true;
        itself.rounded_bias = rounded_bias ? bias16.bits.data() : nullptr;
        be().matmul(false, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, nullptr, ldc,
                    Precision::kBFloat16, itself);
        const bool may_differ = !with_bias || rounded_bias;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const uint16_t got = rounded[size_t(i * ldc + j)];
            if (j >= n) {
              ASSERT_EQ(got, 0xdead) << "padding " << i << "," << j;
              continue;
            }
            const float want = expected[size_t(i * ldc + j)];
            if (got == float_to_bfloat16(want)) continue;
            ASSERT_TRUE(may_differ) << "not the float32 product's rounding: " << i << "," << j;
            double magnitude = 0;
            for (int64_t p = 0; p < k; ++p)
              magnitude += std::abs(double(a[size_t(i * lda + p)]) *
                                    b[size_t(tb ? j * ldb + p : p * ldb + j)]);
            const float value = bfloat16_to_float(got);
            const float larger = std::max({std::abs(want), std::abs(value), 1e-30f});
            const double ulp = std::ldexp(1.0, std::ilogb(larger) - 7);
            const double bias_error =
                rounded_bias ? std::abs(double(bias[size_t(j)]) - bias16.widened[size_t(j)]) : 0.0;
            const double bound = ulp + 1e-5 * magnitude + bias_error;
            if (relu) {
              ASSERT_GE(value, 0.f) << i << "," << j;
            }
            ASSERT_NEAR(value, want, bound) << i << "," << j;
          }
      }
}

// Training's feed-forward in bfloat16 through a ReLU: fc1's product with its bias and ReLU keeps
// its record of the ReLU where the backend has one (relu_mask), and fc2's input-gradient product
// dy·W gated by it (relu_output, and the record) gives the ReLU's backward of its own product: each
// element 0 where the forward's output is not positive, else within an ulp of the float32
// product's (plus its sums' rounding error, as a product rounding its own sums), and fc1's bias
// gradient added to what it held within the sums' error and a bfloat16 rounding of the sum (a GPU
// library's epilogue sums it so). Gates without a dense bfloat16 output alone are refused.
TEST_P(BackendOps, MatmulThroughAReluGivesTheGatedGradient) {
  if (!be().supports(Precision::kBFloat16))
    GTEST_SKIP() << testing_support::cannot_compute(be(), Precision::kBFloat16);
  // On the device itself, unstaged: a GPU's record of the ReLU is read only at the address its
  // forward product wrote it to, which staging would move.
  const auto* staged = dynamic_cast<const HostStagedBackend*>(&be());
  const Backend& device = staged ? staged->device() : be();
  const auto on_device = [&device](const auto& host, auto& buffer) {
    using T = typename std::decay_t<decltype(host)>::value_type;
    T* at = buffer.allocate_uninitialized(device, int64_t(host.size()));
    device.copy_from_host(host.data(), int64_t(host.size() * sizeof(T)), at);
    return at;
  };
  const auto to_host = [&device](const auto* at, auto& host) {
    using T = typename std::decay_t<decltype(host)>::value_type;
    device.copy_to_host(at, int64_t(host.size() * sizeof(T)), host.data());
  };
  uint64_t seed = 1300;
  bool inside_the_product = true;  // every bias gradient a bfloat16 sum (a library's epilogue)
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{37, 300, 64}, {64, 2048, 512}, {5, 16, 8}}) {
    SCOPED_TRACE(testing::Message() << m << " x " << n << " x " << k);
    const int64_t d = k;  // fc1: [m, d] · [n, d]ᵀ; fc2's gradient: [m, k] · [k, n]
    const auto x = random_vector(m * d, seed++), w1 = random_vector(n * d, seed++, 0.2f);
    const auto b1 = random_vector(n, seed++, 0.5f);
    const RoundedCopy b1_16 = rounded_copy(b1, Precision::kBFloat16);
    const auto dy = random_vector(m * k, seed++), w2 = random_vector(k * n, seed++);
    DeviceBuffer<float> x_at, w1_at, b1_at, dy_at, w2_at, product_at, bias_gradient_at;
    DeviceBuffer<uint16_t> b1_16_at, hidden_at, gradient_at;
    DeviceBuffer<uint8_t> mask_at;
    std::vector<uint16_t> hidden(size_t(m * n), 0xdead), gradient(size_t(m * n), 0xdead);
    std::vector<float> product(size_t(m * n)), bias_gradient(size_t(n), 0.25f);
    const int64_t mask_bytes = device.relu_mask_bytes(m, n);
    MatmulEpilogue forward;
    forward.bias = on_device(b1, b1_at);
    forward.relu = true;
    forward.rounded_output = on_device(hidden, hidden_at);
    forward.rounded_by_the_product = true;
    forward.rounded_bias = on_device(b1_16.bits, b1_16_at);
    forward.relu_mask =
        mask_bytes > 0 ? on_device(std::vector<uint8_t>(size_t(mask_bytes)), mask_at) : nullptr;
    device.matmul(false, true, m, n, d, 1.f, on_device(x, x_at), d, on_device(w1, w1_at), d, 0.f,
                  nullptr, n, Precision::kBFloat16, forward);
    const float* dy_on = on_device(dy, dy_at);
    const float* w2_on = on_device(w2, w2_at);
    device.matmul(false, false, m, n, k, 1.f, dy_on, k, w2_on, n, 0.f,
                  on_device(product, product_at), n, Precision::kBFloat16, {});  // ungated
    MatmulEpilogue backward;
    backward.rounded_output = on_device(gradient, gradient_at);
    backward.rounded_by_the_product = true;
    backward.relu_output = forward.rounded_output;
    backward.relu_mask = forward.relu_mask;
    backward.bias_gradient = on_device(bias_gradient, bias_gradient_at);
    device.matmul(false, false, m, n, k, 1.f, dy_on, k, w2_on, n, 0.f, nullptr, n,
                  Precision::kBFloat16, backward);
    to_host(forward.rounded_output, hidden);
    to_host(product_at.data(), product);
    to_host(backward.rounded_output, gradient);
    to_host(backward.bias_gradient, bias_gradient);
    for (int64_t j = 0; j < n; ++j) {
      // The column's sum, Σ |terms| (each term's rounding: a library may sum the float32 terms),
      // and the products' error.
      double sum = 0.25, absolute = 0.25, error = 0;
      for (int64_t i = 0; i < m; ++i) {
        const size_t at = size_t(i * n + j);
        const float got = bfloat16_to_float(gradient[at]);
        if (!(bfloat16_to_float(hidden[at]) > 0.f)) {
          ASSERT_EQ(gradient[at], 0) << i << "," << j << ": not stopped by the ReLU";
          continue;
        }
        double terms = 0;
        for (int64_t p = 0; p < k; ++p)
          terms += std::abs(double(dy[size_t(i * k + p)]) * w2[size_t(p * n + j)]);
        const float want = product[at];
        const float larger = std::max({std::abs(want), std::abs(got), 1e-30f});
        ASSERT_NEAR(got, want, std::ldexp(1.0, std::ilogb(larger) - 7) + 1e-5 * terms)
            << i << "," << j;
        sum += got;
        absolute += std::abs(got);
        error += 1e-5 * terms;
      }
      const float summed = bias_gradient[size_t(j)];
      ASSERT_NEAR(summed, sum, std::ldexp(std::abs(sum) + absolute, -8) + error + 1e-6 * absolute)
          << "bias gradient " << j;
      const float added = summed - 0.25f;  // exact for these magnitudes
      inside_the_product =
          inside_the_product && bfloat16_to_float(float_to_bfloat16(added)) == added;
    }
  }
  // Which path a GPU took (its library may have no algorithm for the mask): said, not required.
  if (!device.memory_is_host())
    std::cout << "[ relu mask ] " << device.name() << ": the ReLU's gradient "
              << (inside_the_product
                      ? "inside the library's product (its bias gradient summed in bfloat16)"
                      : "in a pass of its own")
              << "\n";
  // A gate takes a dense bfloat16 output alone.
  std::vector<float> one(4, 1.f), c(4);
  std::vector<uint16_t> out16(8), relu16(4, 0x3f80);  // out16: room for ldc 3
  MatmulEpilogue gate;
  gate.rounded_output = out16.data();
  gate.relu_output = relu16.data();
  EXPECT_THROW(be().matmul(false, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, nullptr,
                           3, Precision::kBFloat16, gate),
               std::invalid_argument);  // ldc ≠ n
  gate.relu = true;
  EXPECT_THROW(be().matmul(false, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, nullptr,
                           2, Precision::kBFloat16, gate),
               std::invalid_argument);
  MatmulEpilogue sums_alone;
  sums_alone.bias_gradient = c.data();
  EXPECT_THROW(be().matmul(false, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, c.data(),
                           2, Precision::kBFloat16, sums_alone),
               std::invalid_argument);
}

// A weight gradient's product with its bias gradient (MatmulEpilogue::a_column_sums): C += Aᵀ·B
// as without it, and the sums of A over its k rows added to the [m] given, from A's bfloat16 copy
// where it comes with one (in its own row stride), else from its values, never scaled by alpha:
// float32 and bfloat16, tuned (a GPU library's bias-gradient epilogue inside the product) and
// not, odd sizes; and refused where A is not read transposed or the product has a ReLU or its gate.
TEST_P(BackendOps, MatmulSumsAWeightGradientsOperandIntoItsBiasGradient) {
  uint64_t seed = 1500;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    if (!be().supports(precision)) {
      testing_support::skip_precision(be(), precision);
      continue;
    }
    const bool bfloat16 = precision == Precision::kBFloat16;
    for (auto [k, m, n] :
         {std::tuple<int64_t, int64_t, int64_t>{7, 5, 9}, {65, 63, 33}, {130, 40, 24}, {1, 1, 1}})
      for (bool given_copy : {false, true}) {
        if (given_copy && !bfloat16) continue;
        for (auto [tuned, alpha] :
             {std::pair{false, 1.f}, std::pair{true, 1.f}, std::pair{true, 0.75f}}) {
          SCOPED_TRACE(testing::Message() << precision_name(precision) << " k=" << k << " m=" << m
                                          << " n=" << n << (given_copy ? " copy" : "")
                                          << (tuned ? " tuned" : "") << " alpha=" << alpha);
          const int64_t lda = m + 3, ldb = n + 2, ldc = n + 1;
          const auto a = random_vector(k * lda, seed++), b = random_vector(k * ldb, seed++);
          const auto c0 = random_vector(m * ldc, seed++);
          const RoundedCopy a16 = rounded_copy(a, Precision::kBFloat16);
          const RoundedCopy b16 = rounded_copy(b, Precision::kBFloat16);
          const auto a_read = [&](int64_t p, int64_t i) {  // as the product reads A(p, i)
            const size_t at = size_t(p * lda + i);
            return bfloat16 ? double(a16.widened[at]) : double(a[at]);
          };
          std::vector<float> c = c0, sums(size_t(m), 0.5f);
          MatmulEpilogue epilogue;
          epilogue.may_tune = tuned;
          epilogue.a_column_sums = sums.data();
          be().matmul(true, false, m, n, k, alpha,
                      {a.data(), given_copy ? a16.bits.data() : nullptr, given_copy ? lda : 0}, lda,
                      b.data(), ldb, 1.f, c.data(), ldc, precision, epilogue);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double product = 0, terms = 0;
              for (int64_t p = 0; p < k; ++p) {
                const size_t at = size_t(p * ldb + j);
                const double y = bfloat16 ? double(b16.widened[at]) : double(b[at]);
                product += a_read(p, i) * y;
                terms += std::abs(a_read(p, i) * y);
              }
              ASSERT_NEAR(c[size_t(i * ldc + j)], c0[size_t(i * ldc + j)] + alpha * product,
                          1e-5 * terms + 1e-5)
                  << i << "," << j;
            }
            double sum = 0.5, absolute = 0.5;
            for (int64_t p = 0; p < k; ++p) {
              const size_t at = size_t(p * lda + i);
              const double summed = given_copy ? double(a16.widened[at]) : double(a[at]);
              sum += summed;
              absolute += std::abs(summed);
            }
            ASSERT_NEAR(sums[size_t(i)], sum, 1e-6 * absolute + 1e-6) << "column " << i;
          }
        }
      }
  }
  std::vector<float> one(4, 1.f), c(4), sums(2);
  MatmulEpilogue not_transposed;
  not_transposed.a_column_sums = sums.data();
  EXPECT_THROW(be().matmul(false, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, c.data(),
                           2, Precision::kFloat32, not_transposed),
               std::invalid_argument);
  if (be().supports(Precision::kBFloat16)) {
    std::vector<uint16_t> out16(4), relu16(4, 0x3f80);
    MatmulEpilogue gated;
    gated.rounded_output = out16.data();
    gated.relu_output = relu16.data();
    gated.a_column_sums = sums.data();
    EXPECT_THROW(be().matmul(true, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, nullptr,
                             2, Precision::kBFloat16, gated),
                 std::invalid_argument);
  }
  MatmulEpilogue with_relu;
  with_relu.relu = true;
  with_relu.a_column_sums = sums.data();
  EXPECT_THROW(be().matmul(true, false, 2, 2, 2, 1.f, one.data(), 2, one.data(), 2, 0.f, c.data(),
                           2, Precision::kFloat32, with_relu),
               std::invalid_argument);
}

// A bfloat16 output flushes results below the smallest normal float to zero, as AVX512-BF16's
// conversion does, on every path (the primitive's, and the float fallback inside a parallel
// region); normal results stay.
TEST_P(BackendOps, BFloat16OutputFlushesSubnormalResultsOnEveryPath) {
  if (!be().supports(Precision::kBFloat16))
    GTEST_SKIP() << testing_support::cannot_compute(be(), Precision::kBFloat16);
  const int64_t m = 8, k = 4;
  for (int64_t n : {16, 15})  // a GPU's epilogue four columns at a time, and one at a time
    for (int nested = 0; nested < 2; ++nested) {
      std::vector<float> a(size_t(m * k), 1e-20f), b(size_t(k * n), 1e-20f);  // products 4e-40
      for (int64_t j = 0; j < k; ++j) b[size_t(j * n)] = 1e-17f;  // column 0: 4e-37, normal
      std::vector<uint16_t> out(size_t(m * n), 0xdead);
      MatmulEpilogue to_bfloat16;
      to_bfloat16.rounded_output = out.data();
      if (!nested) {
        be().matmul(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, nullptr, n,
                    Precision::kBFloat16, to_bfloat16);
      } else {
#pragma omp parallel num_threads(1)
        be().matmul(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, nullptr, n,
                    Precision::kBFloat16, to_bfloat16);
      }
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_GT(bfloat16_to_float(out[size_t(i * n)]), 3e-37f)
            << "n=" << n << " nested=" << nested;
        for (int64_t j = 1; j < n; ++j)
          ASSERT_EQ(out[size_t(i * n + j)], 0)
              << "n=" << n << " nested=" << nested << " " << i << "," << j;
      }
    }
}

// MatmulEpilogue::rounded_output is refused where it cannot apply: beta ≠ 0, float32 products.
TEST_P(BackendOps, MatmulRefusesABFloat16OutputItCannotWrite) {
  std::vector<float> one = {1.f};
  std::vector<uint16_t> out(1);
  MatmulEpilogue to_bfloat16;
  to_bfloat16.rounded_output = out.data();
  EXPECT_THROW(be().matmul(false, false, 1, 1, 1, 1.f, one.data(), 1, one.data(), 1, 0.f, nullptr,
                           1, Precision::kFloat32, to_bfloat16),
               std::invalid_argument);
  if (!be().supports(Precision::kBFloat16))
    return testing_support::skip_precision(be(), Precision::kBFloat16);
  EXPECT_THROW(be().matmul(false, false, 1, 1, 1, 1.f, one.data(), 1, one.data(), 1, 1.f, nullptr,
                           1, Precision::kBFloat16, to_bfloat16),
               std::invalid_argument);
}

// relu_backward_bfloat16 is activation_backward's ReLU on the bfloat16 output widened: gradients
// pass where the output is positive and stop at zeros (both signs), negatives and NaN; it writes
// their bfloat16 rounding, and adds their column sums (the bias gradient) to what the sums held,
// within float32 rounding of float64's; with d null, the same from the bfloat16 gradient it
// finds in the output, which it overwrites. Shapes: a GPU's four columns a thread (2048) and one
// (7, 129, 512), the CPU's rows split over threads (300 × 512).
TEST_P(BackendOps, ReluBackwardFromABFloat16Output) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 7}, {37, 129}, {300, 512}, {50, 2048}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    const int64_t n = rows * cols;
    auto output = random_vector(n, 77);
    std::vector<uint16_t> output16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) output16[size_t(i)] = float_to_bfloat16(output[size_t(i)]);
    output16[0] = 0x0000;  // +0
    output16[1] = 0x8000;  // -0
    output16[2] = 0x7fc0;  // NaN
    output16[3] = 0x0001;  // the smallest positive (subnormal) bfloat16
    std::vector<float> widened(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) widened[size_t(i)] = bfloat16_to_float(output16[size_t(i)]);
    const auto d = random_vector(n, 78);
    auto expected = d;
    be().activation_backward(expected.data(), widened.data(), n, Activation::kRelu);
    EXPECT_EQ(expected[0], 0.f);
    EXPECT_EQ(expected[2], 0.f);
    EXPECT_EQ(expected[3], d[3]);
    const RoundedCopy d16 = rounded_copy(d, Precision::kBFloat16);
    auto expected_from_rounded = d16.widened;
    be().activation_backward(expected_from_rounded.data(), widened.data(), n, Activation::kRelu);
    for (bool in_place : {false, true})
      for (bool sums : {false, true}) {
        SCOPED_TRACE(std::string(in_place ? "from the bfloat16 gradient" : "from d") +
                     (sums ? ", with the column sums" : ", without"));
        const std::vector<float>& gradient = in_place ? expected_from_rounded : expected;
        std::vector<uint16_t> rounded =
            in_place ? d16.bits : std::vector<uint16_t>(static_cast<size_t>(n), 0xABCD);
        std::vector<float> column_sums(size_t(cols), 0.5f);
        be().relu_backward_bfloat16(in_place ? nullptr : d.data(), output16.data(), rows, cols,
                                    rounded.data(), sums ? column_sums.data() : nullptr);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(rounded[size_t(i)], float_to_bfloat16(gradient[size_t(i)])) << i;
        for (int64_t c = 0; c < cols; ++c) {
          double want = 0.5, magnitude = 0.5;
          for (int64_t r = 0; r < rows; ++r) {
            want += gradient[size_t(r * cols + c)];
            magnitude += std::abs(gradient[size_t(r * cols + c)]);
          }
          if (!sums) want = 0.5;
          ASSERT_NEAR(column_sums[size_t(c)], want, 1e-5 * magnitude) << c;
        }
      }
  }
  // Nowhere to write the gradient is refused.
  std::vector<float> d(4, 1.f);
  std::vector<uint16_t> output16(4, 0x3f80);
  EXPECT_THROW(be().relu_backward_bfloat16(d.data(), output16.data(), 2, 2, nullptr, nullptr),
               std::invalid_argument);
}

TEST_P(BackendOps, MatmulWithNoInnerDimensionLeavesBetaTimesC) {
  std::vector<float> c = {1, 2, 3, 4};
  be().matmul(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2,
              Precision::kFloat32);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  be().matmul(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.f, c.data(), 2,
              Precision::kFloat32);
  for (float v : c) EXPECT_EQ(v, 0.f);
}

// Stacked parts, any row count, strided input and output, in every precision the backend
// supports, against float64. The bounds:
// - float32: float rounding.
// - bfloat16: inputs and weights rounded to 8-bit mantissas with float32 accumulation, so each
//   product carries at most ~2 · 2^-8 relative error: 2/256 of Σ|x·w|; float16 (GPUs only) the
//   same with 11-bit mantissas: 2/2048 of Σ|x·w|.
// - int8: weight row j is stored as round(w/s_j)·s_j with s_j = max|w_j|/127, input row r as
//   round(x/a_r)·a_r with a_r = max|x_r|/127, so each element moves by at most half a step and
//   the product by at most (s_j/2)·Σ|x| + (a_r/2)·Σ|w_j| + k·a_r·s_j/4 (plus float rounding).
TEST_P(BackendOps, PreparedMatrixMatchesFloat64InEverySupportedPrecision) {
  ASSERT_TRUE(be().supports(Precision::kFloat32));
  for (Precision precision :
       {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16, Precision::kInt8}) {
    SCOPED_TRACE(precision_name(precision));
    if (!be().supports(precision)) {
      const float w = 1.f;
      EXPECT_THROW(be().prepare_matrix({&w}, {1}, 1, precision), std::invalid_argument);
      testing_support::skip_precision(be(), precision);
      continue;
    }
    double worst = 0;
    for (int64_t k : {1, 7, 64, 513}) {
      const std::vector<int64_t> part_rows = {5, 1, 33};
      std::vector<std::vector<float>> parts;
      std::vector<const float*> pointers;
      for (size_t i = 0; i < part_rows.size(); ++i) {
        parts.push_back(random_vector(part_rows[i] * k, 60 + i));
        pointers.push_back(parts.back().data());
      }
      // Far outside float16's range, inside bfloat16's (float16 cannot hold it: left out there).
      if (k == 513 && precision != Precision::kFloat16) parts[0][3] = 1e30f;
      if (k == 64) std::fill_n(parts[2].begin() + 2 * k, k, 0.f);  // an all-zero weight row
      const auto prepared = be().prepare_matrix(pointers, part_rows, k, precision);
      ASSERT_EQ(prepared->rows(), 39);
      ASSERT_EQ(prepared->cols(), k);
      ASSERT_EQ(prepared->precision(), precision);
      for (int64_t m : {1, 3, 32, 100}) {
        const int64_t ldx = k + 2, ldy = 41;
        auto x = random_vector(m * ldx, 70 + m);
        if (m == 3) std::fill_n(x.begin() + ldx, k, 0.f);  // an all-zero input row
        std::vector<float> y(size_t(m * ldy), 5.f);
        prepared->multiply(x.data(), m, ldx, y.data(), ldy);
        for (int64_t r = 0; r < m; ++r) {
          double x_magnitude = 0, x_largest = 0;
          for (int64_t c = 0; c < k; ++c) {
            x_magnitude += std::abs(x[size_t(r * ldx + c)]);
            x_largest = std::max<double>(x_largest, std::abs(x[size_t(r * ldx + c)]));
          }
          int64_t row = 0;
          for (size_t part = 0; part < parts.size(); ++part)
            for (int64_t j = 0; j < part_rows[part]; ++j, ++row) {
              double sum = 0, magnitude = 0, w_magnitude = 0, w_largest = 0;
              for (int64_t c = 0; c < k; ++c) {
                const double w = parts[part][size_t(j * k + c)];
                const double p = double(x[size_t(r * ldx + c)]) * w;
                sum += p;
                magnitude += std::abs(p);
                w_magnitude += std::abs(w);
                w_largest = std::max(w_largest, std::abs(w));
              }
              const double error = std::abs(y[size_t(r * ldy + row)] - sum);
              double bound = 1e-4 + 1e-6 * magnitude;
              if (precision == Precision::kBFloat16) bound = 2.0 / 256 * magnitude;
              if (precision == Precision::kFloat16) bound = 2.0 / 2048 * magnitude + 1e-6;
              if (precision == Precision::kInt8) {
                const double s = w_largest / 127, a = x_largest / 127;
                bound += s / 2 * x_magnitude + a / 2 * w_magnitude + double(k) * a * s / 4;
                bound *= 1 + 1e-5;
              }
              ASSERT_LE(error, bound) << "m " << m << " k " << k << " row " << row;
              worst = std::max(worst, error / std::max(magnitude, 1e-30));
            }
          for (int64_t j = 39; j < ldy; ++j) ASSERT_EQ(y[size_t(r * ldy + j)], 5.f);  // untouched
        }
      }
    }
    if (precision != Precision::kFloat32) {
      EXPECT_GT(worst, 1e-6) << "no rounding at all: not a reduced-precision product";
    }
  }
}

// A prepared product's epilogue (bias on every row, ReLU, both) applies to the finished product:
// what the product without it followed by + bias and max(·, 0) gives, in every precision the
// backend supports, for one row and many, strided input and output (the padding untouched). A
// backend may run the fused product on another algorithm (the CUDA backend's cuBLASLt), so the
// sums may differ in their float rounding: within 1e-5 of Σ|x·w| (and of the bias) per element,
// a thousandth of the least bound PreparedMatrixMatchesFloat64InEverySupportedPrecision allows a
// reduced precision. A bfloat16 matrix may write the result in bfloat16 instead; the others
// refuse to.
TEST_P(BackendOps, PreparedMatrixAppliesItsEpilogueToTheFinishedProduct) {
  for (Precision precision : prepared_precisions()) {
    SCOPED_TRACE(precision_name(precision));
    uint64_t seed = 700;
    for (auto [n, k] : {std::pair<int64_t, int64_t>{5, 7}, {130, 96}, {512, 512}}) {
      const auto w = random_vector(n * k, seed++);
      const auto bias = random_vector(n, seed++, 2.f);
      const auto prepared = be().prepare_matrix({w.data()}, {n}, k, precision);
      for (int64_t m : {1, 3, 64}) {
        const int64_t ldx = k + 1, ldy = n + 3;
        const auto x = random_vector(m * ldx, seed++);
        std::vector<float> plain(size_t(m * ldy), 7.f);
        prepared->multiply(x.data(), m, ldx, plain.data(), ldy);
        for (int form = 0; form < 3; ++form) {  // bias, ReLU, both
          const bool with_bias = form != 1, relu = form != 0;
          SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + " m " +
                       std::to_string(m) + " bias " + std::to_string(with_bias) + " relu " +
                       std::to_string(relu));
          std::vector<float> got(size_t(m * ldy), 7.f);
          prepared->multiply(x.data(), m, ldx, got.data(), ldy,
                             {with_bias ? bias.data() : nullptr, relu});
          int64_t clamped = 0;
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              double magnitude = 0;
              for (int64_t c = 0; c < k; ++c)
                magnitude += std::abs(double(x[size_t(r * ldx + c)]) * w[size_t(j * k + c)]);
              double expected = plain[size_t(r * ldy + j)];
              if (with_bias) expected += bias[size_t(j)];
              const double bound =
                  1e-5 * (magnitude + (with_bias ? std::abs(bias[size_t(j)]) : 0.0));
              if (relu && expected <= bound) {  // at or near 0: 0, or what is left above it
                ++clamped;
                ASSERT_GE(got[size_t(r * ldy + j)], 0.f) << "row " << r << " col " << j;
                ASSERT_LE(got[size_t(r * ldy + j)], std::max(expected, 0.0) + bound);
                continue;
              }
              ASSERT_NEAR(got[size_t(r * ldy + j)], expected, bound) << "row " << r << " col " << j;
            }
            for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(got[size_t(r * ldy + j)], 7.f);
          }
          if (relu && m * n > 100) {
            ASSERT_GT(clamped, m * n / 4);  // the ReLU has work to do
          }
          // Written in bfloat16 instead (y not touched: null): each element the float result
          // rounded to nearest (within one bfloat16 step of it, and the float bound above for
          // another algorithm's sums), the padding between rows untouched. Bfloat16 matrices
          // only.
          std::vector<uint16_t> rounded(size_t(m * ldy), 0xdead);
          const MatmulEpilogue to_bfloat16{with_bias ? bias.data() : nullptr, relu, rounded.data()};
          if (precision != Precision::kBFloat16) {
            EXPECT_THROW(prepared->multiply(x.data(), m, ldx, nullptr, ldy, to_bfloat16),
                         std::invalid_argument);
            continue;
          }
          prepared->multiply(x.data(), m, ldx, nullptr, ldy, to_bfloat16);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              const double v = got[size_t(r * ldy + j)];
              double magnitude = with_bias ? std::abs(bias[size_t(j)]) : 0.0;
              for (int64_t c = 0; c < k; ++c)
                magnitude += std::abs(double(x[size_t(r * ldx + c)]) * w[size_t(j * k + c)]);
              const double bound = std::abs(v) / 128 + 1e-5 * magnitude;
              ASSERT_NEAR(bfloat16_to_float(rounded[size_t(r * ldy + j)]), v, bound)
                  << "row " << r << " col " << j;
            }
            for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(rounded[size_t(r * ldy + j)], 0xdead);
          }
        }
      }
    }
  }
}

// A bfloat16 prepared product given its input already rounded (MatmulOperand::rounded, dense, as
// a post-norm sublayer's norm writes it) reads that copy instead of rounding the values: the
// same product as from the values (within 1e-5 of Σ|x·w|: a backend may pick another algorithm
// for another operand address), even with no values at all. The other precisions read the
// values and ignore a copy (one of other values here), and refuse a copy alone.
TEST_P(BackendOps, PreparedMatrixReadsAGivenBFloat16Copy) {
  const int64_t n = 48, k = 80, m = 5, ldx = k + 3;
  const auto w = random_vector(n * k, 800);
  const auto x = random_vector(m * ldx, 801), other = random_vector(m * k, 802);
  std::vector<uint16_t> rounded(size_t(m * k)), rounded_other(size_t(m * k));
  be().round_to_16_bits(x.data(), m, k, ldx, Precision::kBFloat16, rounded.data());
  be().round_to_16_bits(other.data(), m, k, k, Precision::kBFloat16, rounded_other.data());
  for (Precision precision : prepared_precisions()) {
    SCOPED_TRACE(precision_name(precision));
    const auto prepared = be().prepare_matrix({w.data()}, {n}, k, precision);
    std::vector<float> from_values(size_t(m * n)), got(size_t(m * n), 3.f);
    prepared->multiply(x.data(), m, ldx, from_values.data(), n);
    EXPECT_THROW(prepared->multiply({nullptr, nullptr}, m, ldx, got.data(), n),
                 std::invalid_argument);
    if (precision != Precision::kBFloat16) {
      EXPECT_THROW(prepared->multiply({nullptr, rounded.data()}, m, ldx, got.data(), n),
                   std::invalid_argument);
      prepared->multiply({x.data(), rounded_other.data()}, m, ldx, got.data(), n);
      EXPECT_EQ(got, from_values);
      continue;
    }
    prepared->multiply({nullptr, rounded.data()}, m, ldx, got.data(), n);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double magnitude = 0;
        for (int64_t c = 0; c < k; ++c)
          magnitude += std::abs(double(x[size_t(r * ldx + c)]) * w[size_t(j * k + c)]);
        ASSERT_NEAR(got[size_t(r * n + j)], from_values[size_t(r * n + j)], 1e-5 * magnitude)
            << "row " << r << " col " << j;
      }
    // The copy is what is read: another copy gives another product.
    std::vector<float> from_other(size_t(m * n));
    prepared->multiply({x.data(), rounded_other.data()}, m, ldx, from_other.data(), n);
    EXPECT_NE(from_other, from_values);
  }
}

// Weights held in int8 (tensor/int8_weights.h), stacked from parts, multiply exactly as the
// same float weights prepared in int8: both quantise by the same rule.
TEST_P(BackendOps, Int8HeldWeightsMultiplyAsTheirFloatOriginalsInInt8) {
  const std::vector<int64_t> part_rows = {3, 1, 17};
  const int64_t k = 45;
  std::vector<Tensor> parts;
  std::vector<const float*> floats;
  std::vector<Int8Matrix> quantised;
  std::vector<Int8Rows> int8;
  for (size_t i = 0; i < part_rows.size(); ++i) {
    Tensor t({part_rows[i], k});
    t.data = random_vector(part_rows[i] * k, 80 + i);
    parts.push_back(std::move(t));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    floats.push_back(parts[i].ptr());
    quantised.push_back(quantize_weight_rows(parts[i]));
  }
  for (const Int8Matrix& q : quantised) int8.push_back(q.view());
  if (!be().supports(Precision::kInt8)) {
    EXPECT_THROW(be().prepare_int8_matrix(int8, part_rows, k), std::invalid_argument);
    return testing_support::skip_precision(be(), Precision::kInt8);
  }
  const auto held = be().prepare_int8_matrix(int8, part_rows, k);
  const auto from_float = be().prepare_matrix(floats, part_rows, k, Precision::kInt8);
  ASSERT_EQ(held->rows(), 21);
  ASSERT_EQ(held->precision(), Precision::kInt8);
  for (int64_t m : {1, 6, 40}) {
    const auto x = random_vector(m * k, 90 + m);
    std::vector<float> a(size_t(m * 21)), b(size_t(m * 21));
    held->multiply(x.data(), m, k, a.data(), 21);
    from_float->multiply(x.data(), m, k, b.data(), 21);
    EXPECT_EQ(a, b) << "m " << m;
  }
}

// A backend's int8 products are the CPU's to the bit: both sum the quantised rows exactly in
// int32 and scale the sums back with the same float operations (the bias added after, never
// fused). On CUDA, shapes whose rows are multiples of 4 bytes run on cuBLAS's int8 tensor-core
// product and the others on a kernel of the backend's own; both are covered here (k 512, 64
// and 4, output strides 516, 41 and 8, against k 45).
TEST_P(BackendOps, Int8ProductsAreTheCpusToTheBit) {
  if (&be() == &cpu_backend()) return;  // the reference itself (the staged CPU still runs it)
  for (const Backend* backend : {&be(), &cpu_backend()})
    if (!backend->supports(Precision::kInt8))
      return testing_support::skip_precision(*backend, Precision::kInt8);
  uint64_t seed = 900;
  for (auto [n, k, ldy] : {std::tuple<int64_t, int64_t, int64_t>{512, 512, 516},
                           {37, 64, 41},
                           {21, 45, 21},
                           {8, 4, 8}}) {
    const auto w = random_vector(n * k, seed++);
    const auto bias = random_vector(n, seed++, 2.f);
    const auto ours = be().prepare_matrix({w.data()}, {n}, k, Precision::kInt8);
    const auto cpu = cpu_backend().prepare_matrix({w.data()}, {n}, k, Precision::kInt8);
    for (int64_t m : {1, 5, 64}) {
      const int64_t ldx = k + 3;
      auto x = random_vector(m * ldx, seed++, 3.f);
      if (m == 5) std::fill_n(x.begin() + ldx, k, 0.f);  // an all-zero row: scale 1, sums 0
      for (int form = 0; form < 4; ++form) {             // plain, bias, ReLU, both
        const MatmulEpilogue epilogue{form & 1 ? bias.data() : nullptr, (form & 2) != 0};
        std::vector<float> got(size_t(m * ldy), 7.f), want(size_t(m * ldy), 7.f);
        ours->multiply(x.data(), m, ldx, got.data(), ldy, epilogue);
        cpu->multiply(x.data(), m, ldx, want.data(), ldy, epilogue);
        ASSERT_EQ(got, want) << "n " << n << " k " << k << " m " << m << " form " << form;
      }
    }
  }
}

// --- Attention --------------------------------------------------------------------------------

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

// The factor attention dropout applies to weight (b, h, i, j): mask / (1 - p), or 1 without.
double dropout_factor(const AttentionShape& s, const AttentionDropout& dropout, int64_t b,
                      int64_t h, int64_t i, int64_t j) {
  if (dropout.p <= 0.f) return 1.0;
  const int64_t at = ((b * s.heads + h) * s.query_len + i) * s.key_len + j;
  return dropout.mask[at] ? 1.0 / (1.0 - double(dropout.p)) : 0.0;
}

// Naive attention for one configuration; returns out [B, Tq, H*d].
std::vector<float> reference_attention(const AttentionShape& s, const AttentionMask& mask,
                                       const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v,
                                       const AttentionDropout& dropout = {}) {
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
            acc += scores[size_t(j)] / sum * dropout_factor(s, dropout, b, h, i, j) *
                   v[size_t((b * s.key_len + j) * s.v_row_stride + h * s.head_dim + c)];
          out[size_t((b * s.query_len + i) * s.out_row_stride + h * s.head_dim + c)] = float(acc);
        }
      }
  return out;
}

// Every scoring kind; additive_v gets values large enough to matter.
const AttentionScoring kScorings[] = {AttentionScoring::kScaledDot, AttentionScoring::kDot,
                                      AttentionScoring::kAdditive};

TEST_P(BackendOps, AttentionMatchesReferenceWithEveryMask) {
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
          be().attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data(),
                                 {});
          auto expected = reference_attention(s, mask, q, k, v);
          for (size_t i = 0; i < out.size(); ++i) {
            ASSERT_FALSE(std::isnan(out[i]));
            ASSERT_NEAR(out[i], expected[i], 1e-4)
                << "variant " << variant << " d " << head_dim << " T " << query_len << " scoring "
                << int(scoring);
          }
        }
}

// batch × heads heads of head_dim, query_len queries over key_len keys, rows dense.
AttentionShape dense_attention_shape(int64_t batch, int64_t heads, int64_t head_dim,
                                     int64_t query_len, int64_t key_len) {
  AttentionShape s;
  s.batch = batch;
  s.heads = heads;
  s.head_dim = head_dim;
  s.query_len = query_len;
  s.key_len = key_len;
  s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = heads * head_dim;
  return s;
}

// Weights not kept (probs null): the streamed online-softmax path, at lengths that span several
// query blocks (64) and key blocks (256), with the band restricted by causal and window masks.
TEST_P(BackendOps, AttentionStreamedMatchesReferenceAcrossBlocks) {
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
      AttentionShape s = dense_attention_shape(2, 2, 16, c.query_len, c.key_len);
      s.score = {scoring, additive_v.data()};
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
        be().attention_forward(s, mask, q.data(), k.data(), v.data(),
                               keep_weights ? probs.data() : nullptr, out.data(), {});
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
                                  std::vector<double>& dv, std::vector<double>& d_additive_v,
                                  const AttentionDropout& dropout = {}) {
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
          const double kept = dropout_factor(s, dropout, b, h, i, j);
          for (int64_t c = 0; c < s.head_dim; ++c) {
            const double g = d_out[at(b, i, h, c, s.query_len, s.out_row_stride)];
            dp[size_t(j)] += kept * g * v[at(b, j, h, c, s.key_len, s.v_row_stride)];
            dv[at(b, j, h, c, s.key_len, s.v_row_stride)] += kept * p[size_t(j)] * g;
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
// forward and backward against float64, at lengths spanning several blocks (and full attention,
// one block). The gradients' buffers start at 9: every element of dQ, dK, dV is written, the
// padded keys' rows too.
TEST_P(BackendOps, AttentionBandedForwardAndBackwardMatchFloat64) {
  struct Case {
    int64_t len;
    bool causal;
    int64_t window;
  };
  const auto additive_v = random_vector(2 * 8, 55, 1.f);
  for (AttentionScoring scoring : kScorings)
    for (const Case& c : {Case{150, false, 7}, Case{150, true, 7}, Case{150, true, -1},
                          Case{130, false, 64}, Case{129, true, 0}, Case{150, false, -1}}) {
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
      be().attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data(), {});
      auto expected = reference_attention(s, mask, q, k, v);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-5) << i;
      std::vector<float> dq(q.size(), 9.f), dk(k.size(), 9.f), dv(v.size(), 9.f);
      std::vector<float> d_additive_v(additive_v.size(), 0.5f);  // accumulated into
      be().attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), {}, d_out.data(),
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

// Training's short sequences with heads of 64 (a GPU's forward takes a block per sequence and
// head up to 64 queries and keys, 65 its whole-matrix path): forward, weights and backward
// against float64, with a key length of 0 among them, causal and not, queries and keys of
// different lengths. The gradients' buffers start at 9: every element is written.
TEST_P(BackendOps, AttentionOverShortSequencesMatchesFloat64) {
  struct Case {
    int64_t query_len, key_len;
    bool causal;
  };
  for (const Case& c : {Case{1, 1, false}, Case{7, 9, false}, Case{37, 37, true},
                        Case{64, 64, true}, Case{64, 50, false}, Case{65, 65, true}}) {
    AttentionShape s = dense_attention_shape(3, 2, 64, c.query_len, c.key_len);
    s.k_row_stride = s.v_row_stride = 2 * s.heads * s.head_dim;  // keys and values interleaved
    std::vector<int32_t> lengths = {int32_t(c.key_len),
                                    int32_t(std::max<int64_t>(c.key_len - 3, 1)), 0};
    AttentionMask mask;
    mask.key_lengths = lengths.data();
    mask.causal = c.causal;
    auto q = random_vector(s.batch * c.query_len * s.q_row_stride, 71);
    auto kv = random_vector(s.batch * c.key_len * s.k_row_stride, 72);
    // The reference's own dense copies of the keys and the values.
    AttentionShape dense = s;
    dense.k_row_stride = dense.v_row_stride = s.heads * s.head_dim;
    std::vector<float> k_dense, v_dense;
    for (size_t i = 0; i < kv.size(); ++i) {
      const size_t column = i % size_t(s.k_row_stride);
      if (column < size_t(s.heads * s.head_dim))
        k_dense.push_back(kv[i]);
      else
        v_dense.push_back(kv[i]);
    }
    auto d_out = random_vector(s.batch * c.query_len * s.out_row_stride, 74);
    std::vector<float> probs(size_t(s.batch * s.heads * c.query_len * c.key_len), 7.f);
    std::vector<float> out(q.size(), 9.f);
    const float* keys = kv.data();
    const float* values = kv.data() + s.heads * s.head_dim;
    be().attention_forward(s, mask, q.data(), keys, values, probs.data(), out.data(), {});
    const auto expected = reference_attention(dense, mask, q, k_dense, v_dense);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], expected[i], 1e-5) << "out " << i << " Tq " << c.query_len;
    std::vector<float> dq(q.size(), 9.f), dkv(kv.size(), 9.f);
    std::vector<float> d_additive_v(size_t(s.heads * s.head_dim), 0.f);  // unused: dot scores
    be().attention_backward(s, mask, q.data(), keys, values, probs.data(), {}, d_out.data(),
                            dq.data(), dkv.data(), dkv.data() + s.heads * s.head_dim,
                            d_additive_v.data());
    std::vector<double> rq, rk, rv, r_additive_v;
    reference_attention_backward(dense, mask, q, k_dense, v_dense, d_out, rq, rk, rv, r_additive_v);
    for (size_t i = 0; i < dq.size(); ++i)
      ASSERT_NEAR(dq[i], rq[i], 1e-4) << "dq " << i << " Tq " << c.query_len;
    size_t next_k = 0, next_v = 0;
    for (size_t i = 0; i < dkv.size(); ++i) {
      const bool value_half = (i % size_t(s.k_row_stride)) >= size_t(s.heads * s.head_dim);
      const double want = value_half ? rv[next_v++] : rk[next_k++];
      ASSERT_NEAR(dkv[i], want, 1e-4) << (value_half ? "dv " : "dk ") << i << " Tq " << c.query_len;
    }
  }
}

// max |got − want| / max |want|: an output's error relative to its largest value (infinite
// where got holds a NaN or an infinity).
template <typename Want>
double relative_to_largest(const std::vector<float>& got, const std::vector<Want>& want) {
  double error = 0, largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    error = std::max(error, std::abs(double(got[i]) - double(want[i])));
    largest = std::max(largest, std::abs(double(want[i])));
  }
  return error / std::max(largest, 1e-30);
}

// Training in bfloat16 lets the attention's own products round their operands to bfloat16
// (AttentionShape::products): CUDA's bfloat16 tensor cores for these heads of 64 (blocks of up
// to 64 and of up to 128 queries and keys, tiles of 64 beyond: 129 × 129; with
// TFM_CUDA_ATTENTION_IN_REGISTERS=0, TF32 in its whole-matrix path there), the CPU's float32. Each
// output (out, dQ, dK, dV) within 2^-6 of its largest value of float64's, either on the operands as
// given (float32, TF32) or rounded to bfloat16 (the tensor cores', where the weights P and dS round
// too: 2^-9 each); a wrong operand, transpose or mask moves them by ~100%. On CUDA the output is
// nearer the rounded operands' where the bfloat16 path runs (the 128-row blocks need a device that
// lends a block 152 KB of shared memory, as A100, H100 and H200 do). Keys and values interleaved in
// their rows, padding (a sequence of no keys among them), causal and window masks; the rounded
// copies of the output and of dQ, dK, dV are theirs, rounded (dK's and dV's interleaved as dK and
// dV are), and the same where they are asked for alone (rounded_out_only, rounded_gradients_only);
// with the weights kept for the backward alone (weights_for_backward_only: CUDA's tensor-core
// blocks rebuild them from Q·Kᵀ) every output and gradient is the same to the bit.
TEST_P(BackendOps, AttentionInBFloat16ProductsStaysNearFloat64) {
  struct Case {
    int64_t query_len, key_len;
    bool causal;
    int64_t window;
  };
  for (const Case& c :
       {Case{64, 64, true, -1}, Case{37, 50, false, -1}, Case{7, 9, false, 2},
        Case{64, 64, true, 5}, Case{65, 65, true, -1}, Case{128, 128, true, -1},
        Case{100, 77, false, -1}, Case{50, 120, false, 9}, Case{129, 129, true, -1}}) {
    AttentionShape s = dense_attention_shape(3, 2, 64, c.query_len, c.key_len);
    s.products = Precision::kBFloat16;
    s.k_row_stride = s.v_row_stride = 2 * s.heads * s.head_dim;  // keys and values interleaved
    const int64_t width = s.heads * s.head_dim;
    std::vector<int32_t> lengths = {int32_t(c.key_len), int32_t(c.key_len - 5), 0};
    AttentionMask mask;
    mask.key_lengths = lengths.data();
    mask.causal = c.causal;
    mask.window = c.window;
    const auto q = random_vector(s.batch * c.query_len * width, 81);
    const auto kv = random_vector(s.batch * c.key_len * s.k_row_stride, 82);
    const auto d_out = random_vector(s.batch * c.query_len * width, 84);
    std::vector<float> probs(size_t(s.batch * s.heads * c.query_len * c.key_len), 7.f);
    std::vector<float> out(q.size(), 9.f);
    std::vector<uint16_t> rounded_out(q.size(), 9);
    s.rounded_out = rounded_out.data();
    be().attention_forward(s, mask, q.data(), kv.data(), kv.data() + width, probs.data(),
                           out.data(), {});
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(rounded_out[i], float_to_bfloat16(out[i])) << "rounded out " << i;
    // Where CUDA's bfloat16 tensor-core blocks (or their emulated copy's) take this case (unless
    // TFM_CUDA_TENSOR_CORE_ATTENTION is "0"): up to 128 queries and keys, and beyond in tiles
    // (unless TFM_CUDA_ATTENTION_IN_REGISTERS is "0").
    const char* cores = std::getenv("TFM_CUDA_TENSOR_CORE_ATTENTION");
    const char* registers = std::getenv("TFM_CUDA_ATTENTION_IN_REGISTERS");
    const bool whole_heads = c.query_len <= 128 && c.key_len <= 128;
    const bool tiles = !(registers && std::string(registers) == "0");
    const bool tensor_core_blocks = be().name().find("cuda") != std::string::npos &&
                                    !(cores && std::string(cores) == "0") && (whole_heads || tiles);
    // Whether a float output comes back as staged (0xFF bytes, NaN): the kernel left it alone.
    const auto left_as_staged = [](const std::vector<float>& values) {
      return std::all_of(values.begin(), values.end(), [](float x) { return std::isnan(x); });
    };
    {  // Asked for the rounded output only (out becomes scratch): the same copy and weights.
      AttentionShape only = s;
      only.rounded_out_only = true;
      std::vector<uint16_t> only_out(q.size(), 9);
      only.rounded_out = only_out.data();
      std::vector<float> scratch_out(q.size()), only_probs(probs.size(), 7.f);
      be().attention_forward(only, mask, q.data(), kv.data(), kv.data() + width, only_probs.data(),
                             scratch_out.data(), {});
      ASSERT_EQ(only_out, rounded_out) << "Tq " << c.query_len;
      ASSERT_EQ(only_probs, probs) << "Tq " << c.query_len;
      // CUDA's tensor-core blocks store the copy alone: the float out comes back as staged
      // (0xFF bytes, NaN), which shows the flag was heeded.
      if (tensor_core_blocks) {
        EXPECT_TRUE(left_as_staged(scratch_out))
            << "Tq " << c.query_len << ": the float out was stored as well";
      }
    }
    std::vector<float> dq(q.size(), 9.f), dkv(kv.size(), 9.f);
    std::vector<float> d_additive_v(size_t(width), 0.f);  // unused: dot scores
    std::vector<uint16_t> rounded_dq(q.size(), 9), rounded_dkv(kv.size(), 9);
    s.rounded_out = nullptr;
    s.rounded_dq = rounded_dq.data();
    s.rounded_dk = rounded_dkv.data();
    s.rounded_dv = rounded_dkv.data() + width;
    be().attention_backward(s, mask, q.data(), kv.data(), kv.data() + width, probs.data(), {},
                            d_out.data(), dq.data(), dkv.data(), dkv.data() + width,
                            d_additive_v.data());
    // The reference's dense keys and values, and the gradients' halves as such.
    AttentionShape dense = s;
    dense.k_row_stride = dense.v_row_stride = width;
    auto halves = [&](const std::vector<float>& rows, std::vector<float>& keys,
                      std::vector<float>& values) {
      for (size_t i = 0; i < rows.size(); ++i)
        (int64_t(i % size_t(s.k_row_stride)) < width ? keys : values).push_back(rows[i]);
    };
    std::vector<float> k, v, dk, dv;
    halves(kv, k, v);
    halves(dkv, dk, dv);
    for (size_t i = 0; i < dq.size(); ++i)
      ASSERT_EQ(rounded_dq[i], float_to_bfloat16(dq[i])) << "rounded dq " << i;
    for (size_t i = 0; i < dkv.size(); ++i)
      ASSERT_EQ(rounded_dkv[i], float_to_bfloat16(dkv[i])) << "rounded dk | dv " << i;
    {  // Asked for the rounded copies only (the float gradients become scratch): the same copies.
      AttentionShape only = s;
      only.rounded_gradients_only = true;
      std::vector<uint16_t> only_dq(q.size(), 9), only_dkv(kv.size(), 9);
      only.rounded_dq = only_dq.data();
      only.rounded_dk = only_dkv.data();
      only.rounded_dv = only_dkv.data() + width;
      std::vector<float> scratch_dq(q.size()), scratch_dkv(kv.size());
      be().attention_backward(only, mask, q.data(), kv.data(), kv.data() + width, probs.data(), {},
                              d_out.data(), scratch_dq.data(), scratch_dkv.data(),
                              scratch_dkv.data() + width, d_additive_v.data());
      ASSERT_EQ(only_dq, rounded_dq) << "Tq " << c.query_len;
      ASSERT_EQ(only_dkv, rounded_dkv) << "Tq " << c.query_len;
      // CUDA's tensor-core blocks store the copies alone: the float dq comes back as staged
      // (0xFF bytes, NaN), which shows the flag was heeded.
      if (tensor_core_blocks) {
        EXPECT_TRUE(left_as_staged(scratch_dq))
            << "Tq " << c.query_len << ": the float dq was stored as well";
      }
    }
    // The backward with `shape` (its rounded copies of dq, dk, dv given here) gives the gradients
    // and copies above, to the bit.
    const auto expect_the_same_gradients = [&](AttentionShape shape, const float* q_in,
                                               const float* k_in, const float* v_in,
                                               const float* probs_in, const float* d_out_in) {
      std::vector<float> same_dq(q.size(), 9.f), same_dkv(kv.size(), 9.f);
      std::vector<uint16_t> same_rounded_dq(q.size(), 9), same_rounded_dkv(kv.size(), 9);
      shape.rounded_dq = same_rounded_dq.data();
      shape.rounded_dk = same_rounded_dkv.data();
      shape.rounded_dv = same_rounded_dkv.data() + width;
      be().attention_backward(shape, mask, q_in, k_in, v_in, probs_in, {}, d_out_in, same_dq.data(),
                              same_dkv.data(), same_dkv.data() + width, d_additive_v.data());
      ASSERT_EQ(same_dq, dq) << "Tq " << c.query_len;
      ASSERT_EQ(same_dkv, dkv) << "Tq " << c.query_len;
      ASSERT_EQ(same_rounded_dq, rounded_dq) << "Tq " << c.query_len;
      ASSERT_EQ(same_rounded_dkv, rounded_dkv) << "Tq " << c.query_len;
    };
    {  // The weights kept for the backward alone (weights_for_backward_only, in both calls): the
       // same output, gradients and copies, to the bit.
      AttentionShape only = s;
      only.weights_for_backward_only = true;
      std::vector<float> only_probs(probs.size(), 7.f), only_out(q.size(), 9.f);
      be().attention_forward(only, mask, q.data(), kv.data(), kv.data() + width, only_probs.data(),
                             only_out.data(), {});
      ASSERT_EQ(only_out, out) << "Tq " << c.query_len;
      ASSERT_NO_FATAL_FAILURE(expect_the_same_gradients(
          only, q.data(), kv.data(), kv.data() + width, only_probs.data(), d_out.data()));
      // CUDA's tensor-core blocks keep each row's shift and inverse sum instead of the weights,
      // [B, H, Tq, 2], and say so (attention_weights_floats, which the model allocates, and the
      // staging backend stages): past those the buffer is left as it was. Elsewhere the weights,
      // all of them.
      const char* rebuilt = std::getenv("TFM_CUDA_REBUILT_WEIGHTS");
      const bool statistics_only = tensor_core_blocks && !(rebuilt && std::string(rebuilt) == "0");
      const int64_t kept = be().attention_weights_floats(only, mask, {});
      EXPECT_EQ(kept, statistics_only ? s.batch * s.heads * c.query_len * 2 : int64_t(probs.size()))
          << "Tq " << c.query_len;
      if (statistics_only) {
        EXPECT_TRUE(std::all_of(only_probs.begin() + kept, only_probs.end(),
                                [](float x) { return x == 7.f; }))
            << "Tq " << c.query_len << ": the weights were stored as well";
      }
    }
    {  // Q, K and V in bfloat16 alone (AttentionShape::rounded_q, _k, _v; q, k, v null), and the
       // backward's d_out (rounded_d_out), as a training step gives them, its weights kept for
       // the backward alone: where the backend reads them so (CUDA's tensor-core blocks), the
       // same output and gradients as from the float ones it rounds as it loads them, to the
       // bit; elsewhere the call is refused, and so is a backward given the one without the
       // other.
      AttentionShape alone = s;
      alone.weights_for_backward_only = true;
      const std::vector<uint16_t> q16 = rounded_copy(q, Precision::kBFloat16).bits;
      const std::vector<uint16_t> kv16 = rounded_copy(kv, Precision::kBFloat16).bits;
      const std::vector<uint16_t> d_out16 = rounded_copy(d_out, Precision::kBFloat16).bits;
      alone.rounded_q = q16.data();
      alone.rounded_k = kv16.data();
      alone.rounded_v = kv16.data() + width;
      const bool reads = be().attention_reads_rounded_inputs(alone, mask, {});
      const char* switched = std::getenv("TFM_CUDA_BFLOAT16_QKV");
      EXPECT_EQ(reads, tensor_core_blocks && !(switched && std::string(switched) == "0"))
          << "Tq " << c.query_len;
      std::vector<float> alone_probs(probs.size(), 7.f), alone_out(q.size(), 9.f);
      std::vector<float> unused_dq(q.size()), unused_dkv(kv.size());  // a refused call's outputs
      const auto refused_backward = [&](const AttentionShape& shape) {
        EXPECT_THROW(be().attention_backward(
                         shape, mask, nullptr, nullptr, nullptr, alone_probs.data(), {},
                         shape.rounded_d_out ? nullptr : d_out.data(), unused_dq.data(),
                         unused_dkv.data(), unused_dkv.data() + width, d_additive_v.data()),
                     std::invalid_argument);
      };
      if (!reads) {
        EXPECT_THROW(be().attention_forward(alone, mask, nullptr, nullptr, nullptr,
                                            alone_probs.data(), alone_out.data(), {}),
                     std::invalid_argument);
        AttentionShape backward = alone;
        backward.rounded_d_out = d_out16.data();
        refused_backward(backward);
      } else {
        be().attention_forward(alone, mask, nullptr, nullptr, nullptr, alone_probs.data(),
                               alone_out.data(), {});
        ASSERT_EQ(alone_out, out) << "Tq " << c.query_len;
        refused_backward(alone);  // Q, K, V in bfloat16 without dO so
        alone.rounded_d_out = d_out16.data();
        ASSERT_NO_FATAL_FAILURE(expect_the_same_gradients(alone, nullptr, nullptr, nullptr,
                                                          alone_probs.data(), nullptr));
      }
    }
    struct Reference {
      std::vector<float> out;
      std::vector<double> dq, dk, dv;
    };
    auto reference = [&](const std::vector<float>& rq, const std::vector<float>& rk,
                         const std::vector<float>& rv, const std::vector<float>& r_d_out) {
      Reference r;
      r.out = reference_attention(dense, mask, rq, rk, rv);
      std::vector<double> unused;
      reference_attention_backward(dense, mask, rq, rk, rv, r_d_out, r.dq, r.dk, r.dv, unused);
      return r;
    };
    auto bfloat16 = [](const std::vector<float>& x) {
      return rounded_copy(x, Precision::kBFloat16).widened;
    };
    const Reference given = reference(q, k, v, d_out);
    const Reference rounded = reference(bfloat16(q), bfloat16(k), bfloat16(v), bfloat16(d_out));
    auto check = [&](const char* name, const std::vector<float>& got, const auto& want_given,
                     const auto& want_rounded) {
      const double on_given = relative_to_largest(got, want_given);
      const double on_rounded = relative_to_largest(got, want_rounded);
      EXPECT_LE(std::min(on_given, on_rounded), 1.0 / 64)
          << name << " Tq " << c.query_len << " Tk " << c.key_len << ": " << on_given
          << " of the float64 result on the operands as given, " << on_rounded
          << " on them rounded to bfloat16";
      return on_rounded < on_given;
    };
    const bool rounded_nearer = check("out", out, given.out, rounded.out);
    check("dq", dq, given.dq, rounded.dq);
    check("dk", dk, given.dk, rounded.dk);
    check("dv", dv, given.dv, rounded.dv);
    if (tensor_core_blocks) {
      EXPECT_TRUE(rounded_nearer) << "Tq " << c.query_len << ": the bfloat16 path did not run";
    }
  }
}

// Incremental decoding's single query over cached rows (key_rows) and the hypotheses of one
// sentence sharing its encoder keys (key_batch), against the dense reference on gathered copies.
// Head sizes 5 and 64 (the base and big models', which the CPU compiles separately, with AVX-512
// in blocks of 16 keys), 6 and 37 keys (two whole blocks and a part, a window starting inside
// the first; on a GPU, a part of its four keys at a time). Dot-product scores take a GPU's warp
// per query, additive ones its block per query. The same over bfloat16 and float16 caches
// (attention_forward_16_bit_cache): the reference reads the rounded values widened to float, so
// only float rounding separates the two.
TEST_P(BackendOps, AttentionOverCachedRowsAndSharedKeyBatches) {
  for (int64_t head_dim : {5, 64})
    for (int64_t key_len : {6, 37})
      for (AttentionScoring scoring : kScorings) {
        const auto additive_v = random_vector(3 * head_dim, 91, 1.f);
        AttentionShape s;
        s.score = {scoring, additive_v.data()};
        s.batch = 4;
        s.heads = 3;
        s.head_dim = head_dim;
        s.query_len = 1;
        s.key_len = key_len;
        const int64_t d = s.heads * s.head_dim;
        // A pool of cached rows (stride d + 2, or d + 8: rows of whole 16-byte words, which a
        // GPU reads a key per lane); hypothesis b reads its key_len rows through its row table,
        // so shared prefixes read the same rows.
        const int64_t pool_rows = 2 * key_len + 11, row_stride = d + (key_len > 16 ? 8 : 2),
                      table_stride = key_len + 3;
        auto pool_k = random_vector(pool_rows * row_stride, 92);
        auto pool_v = random_vector(pool_rows * row_stride, 93);
        std::vector<int32_t> table(size_t(s.batch * table_stride));
        Random random(94);
        for (auto& r : table) r = int32_t(random.next_u64() % uint64_t(pool_rows));
        auto q = random_vector(s.batch * d, 95);
        AttentionShape cached = s;
        cached.q_row_stride = cached.out_row_stride = d;
        cached.k_row_stride = cached.v_row_stride = row_stride;
        cached.key_rows = table.data();
        cached.key_rows_stride = table_stride;
        AttentionMask mask;
        mask.causal = true;
        mask.query_offset = s.key_len - 1;
        mask.window = key_len > 16 ? 22 : -1;  // 37 keys: the last 23 visible, from key 14
        std::vector<float> out(size_t(s.batch * d), 7.f);
        be().attention_forward(cached, mask, q.data(), pool_k.data(), pool_v.data(), nullptr,
                               out.data(), {});
        AttentionShape dense = s;
        dense.q_row_stride = dense.k_row_stride = dense.v_row_stride = dense.out_row_stride = d;
        std::vector<float> k(size_t(s.batch * s.key_len * d)), v(k.size());
        for (int64_t b = 0; b < s.batch; ++b)
          for (int64_t j = 0; j < s.key_len; ++j) {
            const int64_t row = table[size_t(b * table_stride + j)];
            std::copy_n(pool_k.data() + row * row_stride, d, k.data() + (b * s.key_len + j) * d);
            std::copy_n(pool_v.data() + row * row_stride, d, v.data() + (b * s.key_len + j) * d);
          }
        auto expected = reference_attention(dense, mask, q, k, v);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], expected[i], 1e-5)
              << "cached rows, scoring " << int(scoring) << ", head size " << head_dim;
        for (Precision format : {Precision::kBFloat16, Precision::kFloat16}) {
          // the same rows cached in 16 bits
          const RoundedCopy pool_k16 = rounded_copy(pool_k, format),
                            pool_v16 = rounded_copy(pool_v, format);
          std::fill(out.begin(), out.end(), 7.f);
          be().attention_forward_16_bit_cache(cached, mask, q.data(), format, pool_k16.bits.data(),
                                              pool_v16.bits.data(), nullptr, out.data());
          be().attention_forward(cached, mask, q.data(), pool_k16.widened.data(),
                                 pool_v16.widened.data(), nullptr, expected.data(), {});
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], expected[i], 1e-6)
                << precision_name(format) << " cached rows, scoring " << int(scoring)
                << ", head size " << head_dim;
        }

        // key_batch: queries 0..3 read key sequences {1, 1, 0, 2} of 3 (6 keys: lengths 5, 2, 4).
        const int32_t key_batch[] = {1, 1, 0, 2};
        const int32_t lengths[] = {int32_t(key_len - 1), 2, int32_t(key_len * 2 / 3)};
        auto keys = random_vector(3 * s.key_len * d, 96);
        auto values = random_vector(3 * s.key_len * d, 97);
        AttentionMask shared;
        shared.key_batch = key_batch;
        shared.key_lengths = lengths;
        std::vector<float> probs(size_t(s.batch * s.heads * s.key_len));
        be().attention_forward(dense, shared, q.data(), keys.data(), values.data(), probs.data(),
                               out.data(), {});
        std::vector<int32_t> per_query_lengths;
        for (int64_t b = 0; b < s.batch; ++b) {
          const int64_t from = key_batch[b];
          std::copy_n(keys.data() + from * s.key_len * d, s.key_len * d,
                      k.data() + b * s.key_len * d);
          std::copy_n(values.data() + from * s.key_len * d, s.key_len * d,
                      v.data() + b * s.key_len * d);
          per_query_lengths.push_back(lengths[from]);
        }
        AttentionMask unshared;
        unshared.key_lengths = per_query_lengths.data();
        expected = reference_attention(dense, unshared, q, k, v);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], expected[i], 1e-5)
              << "key batches, scoring " << int(scoring) << ", head size " << head_dim;
        for (Precision format : {Precision::kBFloat16, Precision::kFloat16}) {
          // the shared keys and values in 16 bits, the weights kept
          const RoundedCopy keys16 = rounded_copy(keys, format),
                            values16 = rounded_copy(values, format);
          std::vector<float> out16(out.size(), 7.f), probs16(probs.size(), 7.f);
          be().attention_forward_16_bit_cache(dense, shared, q.data(), format, keys16.bits.data(),
                                              values16.bits.data(), probs16.data(), out16.data());
          std::vector<float> widened_probs(probs.size());
          be().attention_forward(dense, shared, q.data(), keys16.widened.data(),
                                 values16.widened.data(), widened_probs.data(), expected.data(),
                                 {});
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out16[i], expected[i], 1e-6)
                << precision_name(format) << " key batches, scoring " << int(scoring)
                << ", head size " << head_dim;
          for (size_t i = 0; i < probs.size(); ++i)
            ASSERT_NEAR(probs16[i], widened_probs[i], 1e-6)
                << precision_name(format) << " weights " << i;
          // Rounding moved the output, but only by rounding: each key and value element moves by at
          // most 2^-9 of itself (bfloat16: nearest, 8-bit mantissa; float16 2^-12), which moves
          // these outputs (standard normal inputs, up to 64 terms a logit) by 0.016 at most.
          double moved = 0;
          for (size_t i = 0; i < out.size(); ++i)
            moved = std::max(moved, double(std::abs(out16[i] - out[i])));
          EXPECT_GT(moved, 0.0);
          EXPECT_LT(moved, 5e-2);
        }
        for (int64_t b = 0; b < s.batch; ++b)  // the kept weights: [batch, heads, key_len]
          for (int64_t h = 0; h < s.heads; ++h) {
            double sum = 0;
            for (int64_t j = 0; j < s.key_len; ++j) {
              const float p = probs[size_t((b * s.heads + h) * s.key_len + j)];
              if (j >= lengths[key_batch[b]]) {
                ASSERT_EQ(p, 0.f) << "padded key " << j;
              }
              sum += p;
            }
            ASSERT_NEAR(sum, 1.0, 1e-5) << "weights of query " << b << ", head " << h;
          }
      }
}

// AttentionShape::rounded_out: every forward path (on a GPU: a warp or a block per query, a block
// per short sequence, the whole-matrix path, the streamed one, a warp per decoding query and a key
// per lane, over float and 16-bit caches) writes its output rounded to bfloat16 into the dense
// copy, exactly tensor/float16.h's rounding of the float output it writes as before (out rows
// wider than the heads, so the copy's layout is its own).
TEST_P(BackendOps, AttentionWritesItsOutputInBFloat16Too) {
  struct Case {
    const char* path;
    AttentionScoring scoring;
    int64_t head_dim, query_len, key_len;
    bool keep_weights, cached, cache_16_bits;
  };
  const Case cases[] = {
      {"heads of 7", AttentionScoring::kScaledDot, 7, 37, 9, true, false, false},
      {"short sequences", AttentionScoring::kScaledDot, 64, 37, 37, true, false, false},
      {"whole matrix", AttentionScoring::kScaledDot, 64, 65, 65, true, false, false},
      {"streamed", AttentionScoring::kDot, 16, 300, 300, false, false, false},
      {"additive scores", AttentionScoring::kAdditive, 8, 5, 6, true, false, false},
      {"cached, key per lane", AttentionScoring::kScaledDot, 64, 1, 37, false, true, false},
      {"cached, warp per query", AttentionScoring::kScaledDot, 5, 1, 37, false, true, false},
      {"cached additive", AttentionScoring::kAdditive, 8, 1, 6, false, true, false},
      {"16-bit cache, key per lane", AttentionScoring::kScaledDot, 64, 1, 37, false, true, true},
      {"16-bit cache, weights kept", AttentionScoring::kScaledDot, 64, 1, 6, true, true, true},
  };
  for (const Case& c : cases) {
    AttentionShape s;
    const auto additive_v = random_vector(2 * c.head_dim, 111, 1.f);
    s.score = {c.scoring, additive_v.data()};
    s.batch = 3;
    s.heads = 2;
    s.head_dim = c.head_dim;
    s.query_len = c.query_len;
    s.key_len = c.key_len;
    const int64_t width = s.heads * s.head_dim, rows = s.batch * s.query_len;
    s.q_row_stride = s.k_row_stride = s.v_row_stride = width;
    s.out_row_stride = width + 4;
    std::vector<int32_t> lengths = {int32_t(c.key_len), int32_t(c.key_len - 2), 1};
    AttentionMask mask;
    mask.key_lengths = lengths.data();
    std::vector<int32_t> table;  // cached: sequence b reads rows b · key_len + j, reversed
    if (c.cached) {
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < c.key_len; ++j)
          table.push_back(int32_t((s.batch - 1 - b) * c.key_len + j));
      s.key_rows = table.data();
      s.key_rows_stride = c.key_len;
      mask = {};
      mask.causal = true;
      mask.query_offset = c.key_len - 1;
    } else {
      mask.causal = c.query_len == c.key_len;
    }
    const auto q = random_vector(rows * width, 112);
    const auto k = random_vector(s.batch * c.key_len * width, 113);
    const auto v = random_vector(s.batch * c.key_len * width, 114);
    const RoundedCopy k16 = rounded_copy(k, Precision::kBFloat16),
                      v16 = rounded_copy(v, Precision::kBFloat16);
    std::vector<float> probs(size_t(s.batch * s.heads * c.query_len * c.key_len));
    const auto forward = [&](const AttentionShape& shape, std::vector<float>& out) {
      float* p = c.keep_weights ? probs.data() : nullptr;
      if (c.cache_16_bits)
        be().attention_forward_16_bit_cache(shape, mask, q.data(), Precision::kBFloat16,
                                            k16.bits.data(), v16.bits.data(), p, out.data());
      else
        be().attention_forward(shape, mask, q.data(), k.data(), v.data(), p, out.data(), {});
    };
    std::vector<float> plain(size_t(rows * s.out_row_stride), 7.f), out = plain;
    forward(s, plain);
    std::vector<uint16_t> rounded(size_t(rows * width), 0x7fc1);
    AttentionShape rounding = s;
    rounding.rounded_out = rounded.data();
    forward(rounding, out);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < width; ++i) {
        const float x = out[size_t(r * s.out_row_stride + i)];
        ASSERT_EQ(std::bit_cast<uint32_t>(x),
                  std::bit_cast<uint32_t>(plain[size_t(r * s.out_row_stride + i)]))
            << c.path << ": the float output moved, row " << r << " column " << i;
        ASSERT_EQ(rounded[size_t(r * width + i)], float_to_bfloat16(x))
            << c.path << ", row " << r << " column " << i << " (" << x << ")";
      }
  }
}

// Dropout on the attention weights: the forward writes the mask and scales the kept weights,
// the backward reads the same mask; both against float64.
TEST_P(BackendOps, AttentionDropoutForwardAndBackwardMatchFloat64) {
  const auto additive_v = random_vector(2 * 3, 101, 1.f);
  for (AttentionScoring scoring : kScorings) {
    AttentionShape s;
    s.score = {scoring, additive_v.data()};
    s.batch = 2;
    s.heads = 2;
    s.query_len = 5;
    s.key_len = 7;
    s.head_dim = 3;
    s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = 6;
    const int32_t lengths[] = {7, 4};
    AttentionMask mask;
    mask.key_lengths = lengths;
    mask.causal = true;
    mask.window = 3;
    mask.query_offset = 2;
    std::vector<uint8_t> dropout_mask(size_t(s.batch * s.heads * s.query_len * s.key_len), 9);
    const AttentionDropout dropout{0.3f, dropout_mask.data(), 99};
    auto q = random_vector(2 * 5 * 6, 102), k = random_vector(2 * 7 * 6, 103);
    auto v = random_vector(2 * 7 * 6, 104), d_out = random_vector(2 * 5 * 6, 105);
    std::vector<float> probs(dropout_mask.size()), out(q.size());
    be().attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data(),
                           dropout);
    int64_t kept = 0;
    for (uint8_t m : dropout_mask) {
      ASSERT_TRUE(m == 0 || m == 1);
      kept += m;
    }
    ASSERT_GT(kept, 0);
    ASSERT_LT(kept, int64_t(dropout_mask.size()));
    auto expected = reference_attention(s, mask, q, k, v, dropout);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-5) << i;
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), d_additive_v(6, 0.f);
    be().attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), dropout,
                            d_out.data(), dq.data(), dk.data(), dv.data(), d_additive_v.data());
    std::vector<double> rq, rk, rv, r_additive_v;
    reference_attention_backward(s, mask, q, k, v, d_out, rq, rk, rv, r_additive_v, dropout);
    for (size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dq[i], rq[i], 1e-4) << "dq " << i;
    for (size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(dk[i], rk[i], 1e-4) << "dk " << i;
    for (size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(dv[i], rv[i], 1e-4) << "dv " << i;
    if (scoring == AttentionScoring::kAdditive) {
      for (size_t i = 0; i < d_additive_v.size(); ++i)
        ASSERT_NEAR(d_additive_v[i], r_additive_v[i], 1e-4) << "d_additive_v " << i;
    }
  }
}

// --- Layer normalisation and the residual connection -------------------------------------------

TEST_P(BackendOps, LayerNormForwardAndBackwardMatchFloat64) {
  const float eps = 1e-5f;
  // On a GPU: rows of 1, 7, 63 and 65 one float a lane at a time, 96, 512 and 1024 in float4
  // words, 1500 a block per row; 9 rows are one chunk of the backward's column sums, 300 and
  // 4,100 several (a GPU's blocks, the CPU's threads), the last one shorter.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{9, 1},
                                   {9, 7},
                                   {9, 63},
                                   {9, 65},
                                   {9, 96},
                                   {9, 512},
                                   {9, 1024},
                                   {9, 1500},
                                   {300, 65},
                                   {300, 512},
                                   {4100, 7},
                                   {300, 1500}}) {
    auto x = random_vector(rows * cols, 11, 3.f);
    auto gamma = random_vector(cols, 12), beta = random_vector(cols, 13);
    auto dy = random_vector(rows * cols, 14);
    std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)),
        rstd(static_cast<size_t>(rows));
    be().layer_norm(x.data(), gamma.data(), beta.data(), y.data(), rows, cols, eps, mean.data(),
                    rstd.data());
    std::vector<double> rdx(x.size()), rdgamma(static_cast<size_t>(cols), 0.0), rdbeta(rdgamma);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      double mu = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mu += xr[c];
      mu /= double(cols);
      for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      var /= double(cols);
      const double s = 1.0 / std::sqrt(var + double(eps));
      ASSERT_NEAR(mean[size_t(r)], mu, 1e-5 * (1 + std::abs(mu)));
      ASSERT_NEAR(rstd[size_t(r)], s, 1e-4 * s);
      double mean_gy = 0, mean_gy_xhat = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double xhat = (xr[c] - mu) * s, g = dy[size_t(r * cols + c)];
        ASSERT_NEAR(y[size_t(r * cols + c)], xhat * gamma[size_t(c)] + beta[size_t(c)], 1e-4)
            << cols;
        mean_gy += g * gamma[size_t(c)] / double(cols);
        mean_gy_xhat += g * gamma[size_t(c)] * xhat / double(cols);
        rdgamma[size_t(c)] += g * xhat;
        rdbeta[size_t(c)] += g;
      }
      for (int64_t c = 0; c < cols; ++c) {
        const double xhat = (xr[c] - mu) * s, g = dy[size_t(r * cols + c)];
        rdx[size_t(r * cols + c)] = s * (g * gamma[size_t(c)] - mean_gy - xhat * mean_gy_xhat);
      }
    }
    // = into a separate buffer, += into one holding 0.25, and = in place over dy itself.
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> dx(x.size(), mode == 1 ? 0.25f : 9.f), dgamma(size_t(cols), 0.5f),
          dbeta(size_t(cols), 0.5f);
      std::vector<float> dy_copy = dy;
      float* target = mode == 2 ? dy_copy.data() : dx.data();
      be().layer_norm_backward(dy_copy.data(), x.data(), mean.data(), rstd.data(), gamma.data(),
                               target, dgamma.data(), dbeta.data(), rows, cols, mode == 1);
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(target[i], rdx[i] + (mode == 1 ? 0.25 : 0.0), 1e-4 * (1 + std::abs(rdx[i])))
            << "dx mode " << mode << " cols " << cols;
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_NEAR(dgamma[size_t(c)], 0.5 + rdgamma[size_t(c)],
                    1e-4 * (1 + std::abs(rdgamma[size_t(c)])));
        ASSERT_NEAR(dbeta[size_t(c)], 0.5 + rdbeta[size_t(c)],
                    1e-4 * (1 + std::abs(rdbeta[size_t(c)])));
      }
    }
  }
}

// The post-norm sublayer's end fused into one operation each way gives what its parts give on
// the same backend (those are checked against float64 above and below): the same mask; the sum
// (a multiply-add may be fused), the norm and its gradients within float32 rounding; the dropped
// gradient, and bfloat16 copies that are exactly the rounding of the values written; the dropped
// gradient's column sums within float32 rounding of float64's, and, where only its bfloat16
// copy is written, everything else as when both are. Shapes: rows a warp holds on a GPU, in
// words of four (96, 512) or not (1, 7, 65), and longer ones (1500).
TEST_P(BackendOps, ResidualLayerNormIsItsPartsInOnePass) {
  const float eps = 1e-5f;
  const uint64_t key = 777;
  // Float32 rounding (one fused multiply-add may differ), far inside the parts' own bounds
  // against float64.
  auto near = [](float got, float want) {
    return std::abs(double(got) - double(want)) <= 1e-5 * (1 + std::abs(double(want)));
  };
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{9, 1},
                                   {9, 7},
                                   {5, 65},
                                   {7, 96},
                                   {300, 512},
                                   {40, 1000},
                                   {3, 1500}})
    for (float p : {0.f, 0.3f})
      for (bool rounded : {true, false}) {
        SCOPED_TRACE(testing::Message()
                     << rows << " x " << cols << " p " << p << " rounded " << rounded);
        const int64_t n = rows * cols;
        const auto x = random_vector(n, 31), f0 = random_vector(n, 32, 2.f);
        const auto gamma = random_vector(cols, 33), beta = random_vector(cols, 34);
        const auto dy0 = random_vector(n, 35);
        // The parts: dropout_mask, apply_dropout, add, layer_norm.
        std::vector<uint8_t> mask_parts(size_t(n), 7);
        auto sum_parts = f0;
        if (p > 0.f) {
          be().dropout_mask(mask_parts.data(), n, p, key);
          be().apply_dropout(sum_parts.data(), mask_parts.data(), n, p, key);
        }
        be().add(sum_parts.data(), x.data(), n);
        std::vector<float> y_parts(static_cast<size_t>(n)), mean_parts(static_cast<size_t>(rows)),
            rstd_parts(static_cast<size_t>(rows));
        be().layer_norm(sum_parts.data(), gamma.data(), beta.data(), y_parts.data(), rows, cols,
                        eps, mean_parts.data(), rstd_parts.data());
        // The fused forward.
        std::vector<uint8_t> mask(size_t(n), 7);
        auto sum = f0;
        std::vector<float> y(static_cast<size_t>(n)), mean(static_cast<size_t>(rows)),
            rstd(static_cast<size_t>(rows));
        std::vector<uint16_t> rounded_y(size_t(n), 0xABCD);
        be().residual_layer_norm(sum.data(), x.data(), rows, cols, p, key,
                                 p > 0.f ? mask.data() : nullptr, gamma.data(), beta.data(), eps,
                                 y.data(), mean.data(), rstd.data(),
                                 rounded ? rounded_y.data() : nullptr);
        if (p > 0.f) {
          ASSERT_EQ(mask, mask_parts);
          // The decisions not kept (a backend that keeps no mask: dropout_mask_bytes): the same
          // values, bit for bit.
          auto sum_drawn = f0;
          std::vector<float> y_drawn(y.size()), mean_drawn(mean.size()), rstd_drawn(rstd.size());
          std::vector<uint16_t> rounded_drawn(size_t(n), 0xABCD);
          be().residual_layer_norm(sum_drawn.data(), x.data(), rows, cols, p, key, nullptr,
                                   gamma.data(), beta.data(), eps, y_drawn.data(),
                                   mean_drawn.data(), rstd_drawn.data(),
                                   rounded ? rounded_drawn.data() : nullptr);
          EXPECT_EQ(sum_drawn, sum);
          EXPECT_EQ(y_drawn, y);
          EXPECT_EQ(mean_drawn, mean);
          EXPECT_EQ(rstd_drawn, rstd);
          EXPECT_EQ(rounded_drawn, rounded_y);
        }
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(near(sum[size_t(i)], sum_parts[size_t(i)])) << i;
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_TRUE(near(mean[size_t(r)], mean_parts[size_t(r)])) << r;
          ASSERT_TRUE(near(rstd[size_t(r)], rstd_parts[size_t(r)])) << r;
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(near(y[size_t(i)], y_parts[size_t(i)])) << i;
          ASSERT_EQ(rounded_y[size_t(i)], rounded ? float_to_bfloat16(y[size_t(i)]) : 0xABCD) << i;
        }
        // The parts of the backward: layer_norm_backward, then the dropout on a copy.
        std::vector<float> dx_parts(static_cast<size_t>(n)), dgamma_parts(size_t(cols), 0.5f),
            dbeta_parts(dgamma_parts);
        be().layer_norm_backward(dy0.data(), sum.data(), mean.data(), rstd.data(), gamma.data(),
                                 dx_parts.data(), dgamma_parts.data(), dbeta_parts.data(), rows,
                                 cols, false);
        // The fused backward, in place over dy, with d_f's column sums (bias_backward's) but in
        // one case.
        const bool sums = !(p > 0.f && !rounded);
        auto dy = dy0;
        std::vector<float> d_f(size_t(n), 9.f), dgamma(size_t(cols), 0.5f), dbeta(dgamma),
            d_f_sums(size_t(cols), 0.25f);
        std::vector<uint16_t> rounded_d_f(size_t(n), 0xABCD);
        be().residual_layer_norm_backward(
            dy.data(), sum.data(), mean.data(), rstd.data(), gamma.data(), dgamma.data(),
            dbeta.data(), p > 0.f ? mask.data() : nullptr, p, key, d_f.data(),
            rounded ? rounded_d_f.data() : nullptr, sums ? d_f_sums.data() : nullptr, rows, cols);
        if (p > 0.f) {
          // Without the mask the backward draws the forward's decisions again: the same values.
          auto dy_drawn = dy0;
          std::vector<float> d_f_drawn(size_t(n), 9.f), dgamma_drawn(size_t(cols), 0.5f),
              dbeta_drawn(dgamma_drawn), d_f_sums_drawn(size_t(cols), 0.25f);
          std::vector<uint16_t> rounded_d_f_drawn(size_t(n), 0xABCD);
          be().residual_layer_norm_backward(dy_drawn.data(), sum.data(), mean.data(), rstd.data(),
                                            gamma.data(), dgamma_drawn.data(), dbeta_drawn.data(),
                                            nullptr, p, key, d_f_drawn.data(),
                                            rounded ? rounded_d_f_drawn.data() : nullptr,
                                            sums ? d_f_sums_drawn.data() : nullptr, rows, cols);
          EXPECT_EQ(dy_drawn, dy);
          EXPECT_EQ(d_f_drawn, d_f);
          EXPECT_EQ(rounded_d_f_drawn, rounded_d_f);
          EXPECT_EQ(dgamma_drawn, dgamma);
          EXPECT_EQ(dbeta_drawn, dbeta);
          EXPECT_EQ(d_f_sums_drawn, d_f_sums);
        }
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_TRUE(near(dgamma[size_t(c)], dgamma_parts[size_t(c)])) << c;
          ASSERT_TRUE(near(dbeta[size_t(c)], dbeta_parts[size_t(c)])) << c;
        }
        const float keep_scale = 1.f / (1.f - p);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(near(dy[size_t(i)], dx_parts[size_t(i)])) << i;
          const float dropped = p == 0.f          ? dy[size_t(i)]
                                : mask[size_t(i)] ? dy[size_t(i)] * keep_scale
                                                  : 0.f;
          ASSERT_EQ(d_f[size_t(i)], dropped) << i;
          ASSERT_EQ(rounded_d_f[size_t(i)], rounded ? float_to_bfloat16(dropped) : 0xABCD) << i;
        }
        for (int64_t c = 0; c < cols; ++c) {
          double want = 0.25, magnitude = 0.25;
          for (int64_t r = 0; r < rows && sums; ++r) {
            want += d_f[size_t(r * cols + c)];
            magnitude += std::abs(d_f[size_t(r * cols + c)]);
          }
          ASSERT_NEAR(d_f_sums[size_t(c)], want, 1e-5 * magnitude) << c;
        }
        // Only in bfloat16 (d_f null): the same gradients, copy and sums, bit for bit.
        if (!rounded) continue;
        auto dy_again = dy0;
        std::vector<float> dgamma_again(size_t(cols), 0.5f), dbeta_again(dgamma_again),
            d_f_sums_again(size_t(cols), 0.25f);
        std::vector<uint16_t> rounded_again(size_t(n), 0xABCD);
        be().residual_layer_norm_backward(dy_again.data(), sum.data(), mean.data(), rstd.data(),
                                          gamma.data(), dgamma_again.data(), dbeta_again.data(),
                                          p > 0.f ? mask.data() : nullptr, p, key, nullptr,
                                          rounded_again.data(), d_f_sums_again.data(), rows, cols);
        EXPECT_EQ(dy_again, dy);
        EXPECT_EQ(dgamma_again, dgamma);
        EXPECT_EQ(dbeta_again, dbeta);
        EXPECT_EQ(rounded_again, rounded_d_f);
        EXPECT_EQ(d_f_sums_again, d_f_sums);
      }
  // A gradient with nowhere to go is refused, not skipped.
  std::vector<float> f(8, 1.f), x(8, 1.f), gamma(4, 1.f), beta(4, 0.f), stats(2);
  EXPECT_THROW(be().residual_layer_norm_backward(f.data(), x.data(), stats.data(), stats.data(),
                                                 gamma.data(), gamma.data(), beta.data(), nullptr,
                                                 0.f, 0, nullptr, nullptr, nullptr, 2, 4),
               std::invalid_argument);
}

TEST_P(BackendOps, AddScaleAndBias) {
  for (int64_t n : {1, 7, 65, 70001}) {
    auto x = random_vector(n, 15), y = random_vector(n, 16);
    auto sum = y;
    be().add(sum.data(), x.data(), n);
    auto scaled = x;
    be().scale(scaled.data(), -0.375f, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum[size_t(i)], y[size_t(i)] + x[size_t(i)]);
      ASSERT_EQ(scaled[size_t(i)], x[size_t(i)] * -0.375f);
    }
  }
  // And 300 × 129, a size the CPU's element-wise loops split over threads: the bias gradient is
  // each column summed in row order, bit for bit, on the CPU. 300 × 2048: a GPU's four columns a
  // thread.
  for (int64_t cols : {1, 7, 65, 129, 2048}) {
    const int64_t rows = cols >= 129 ? 300 : 5;
    auto y = random_vector(rows * cols, 17), bias = random_vector(cols, 18);
    auto with_bias = y;
    be().add_bias(with_bias.data(), bias.data(), rows, cols);
    std::vector<float> dbias(size_t(cols), 1.f);
    be().bias_backward(y.data(), nullptr, rows, cols, cols, dbias.data());
    // The same columns as a block of a matrix three times as wide (rows 3 · cols apart, at column
    // cols: the stacked Q|K|V gradients' middle block): the same sums, bit for bit.
    std::vector<float> wide(size_t(rows * 3 * cols), 1e30f);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(y.begin() + r * cols, cols, wide.begin() + r * 3 * cols + cols);
    std::vector<float> dbias_of_block(size_t(cols), 1.f);
    be().bias_backward(wide.data() + cols, nullptr, rows, cols, 3 * cols, dbias_of_block.data());
    ASSERT_EQ(dbias_of_block, dbias) << cols << " columns";
    // From a bfloat16 copy (a bfloat16 step's gradient), the same middle block of one three
    // times as wide, NaN around it; the float values given beside it are NaN too, so only the
    // copy can give the sums: each column of the widened copy, summed in float.
    std::vector<uint16_t> wide_rounded(size_t(rows * 3 * cols), 0x7FC0);  // NaN
    for (int64_t i = 0; i < rows * cols; ++i)
      wide_rounded[size_t(i / cols * 3 * cols + cols + i % cols)] = float_to_bfloat16(y[size_t(i)]);
    const std::vector<float> not_read(size_t(rows * 3 * cols), NAN);
    std::vector<float> dbias_rounded(size_t(cols), 1.f);
    be().bias_backward(not_read.data() + cols, wide_rounded.data() + cols, rows, cols, 3 * cols,
                       dbias_rounded.data());
    for (int64_t c = 0; c < cols; ++c) {
      double column = 1;
      float in_row_order = 1.f;
      for (int64_t r = 0; r < rows; ++r) {
        const float widened = bfloat16_to_float(float_to_bfloat16(y[size_t(r * cols + c)]));
        column += widened;
        in_row_order += widened;
      }
      ASSERT_NEAR(dbias_rounded[size_t(c)], column, 1e-5 * std::max(1.0, double(rows) / 5))
          << cols << " columns, rounded";
      if (&be() == &cpu_backend()) {
        ASSERT_EQ(dbias_rounded[size_t(c)], in_row_order);
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      double column = 1;
      float in_row_order = 1.f;
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(with_bias[size_t(r * cols + c)], y[size_t(r * cols + c)] + bias[size_t(c)]);
        column += y[size_t(r * cols + c)];
        in_row_order += y[size_t(r * cols + c)];
      }
      // 1e-5 for 5 rows, as before; a float sum's error grows with its terms.
      ASSERT_NEAR(dbias[size_t(c)], column, 1e-5 * std::max(1.0, double(rows) / 5));
      if (&be() == &cpu_backend()) {
        ASSERT_EQ(dbias[size_t(c)], in_row_order);
      }
    }
  }
}

// Bias + activation forward (with and without a bias, out separate or aliasing pre) and the
// activation's backward, against erf-exact GELU and its derivative Φ(v) + v·φ(v).
TEST_P(BackendOps, BiasActivationForwardAndBackwardMatchFloat64) {
  const int64_t rows = 3, cols = 65;
  auto x = random_vector(rows * cols, 21, 2.f);
  auto bias = random_vector(cols, 22);
  auto d = random_vector(rows * cols, 23);
  for (Activation act : {Activation::kRelu, Activation::kGelu})
    for (bool with_bias : {true, false})
      for (bool in_place : {false, true}) {
        auto pre = x;
        std::vector<float> separate(x.size());
        float* out = in_place ? pre.data() : separate.data();
        be().add_bias_activation(pre.data(), with_bias ? bias.data() : nullptr, out, rows, cols,
                                 act);
        std::vector<float> pre_activation(x.size());
        for (int64_t i = 0; i < rows * cols; ++i)
          pre_activation[size_t(i)] = x[size_t(i)] + (with_bias ? bias[size_t(i % cols)] : 0.f);
        if (!in_place) {
          for (int64_t i = 0; i < rows * cols; ++i)
            ASSERT_EQ(pre[size_t(i)], pre_activation[size_t(i)]) << "pre keeps the biased input";
        }
        auto grad = d;
        be().activation_backward(grad.data(), pre_activation.data(), rows * cols, act);
        for (int64_t i = 0; i < rows * cols; ++i) {
          const double v = pre_activation[size_t(i)];
          const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
          const double value = act == Activation::kRelu ? std::max(v, 0.0) : v * cdf;
          const double slope =
              act == Activation::kRelu
                  ? (v > 0 ? 1.0 : 0.0)
                  : cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * 3.14159265358979323846);
          ASSERT_NEAR(out[i], value, 1e-5) << "act " << int(act);
          ASSERT_NEAR(grad[size_t(i)], d[size_t(i)] * slope, 1e-5) << "act' " << int(act);
        }
      }
}

// --- Dropout ----------------------------------------------------------------------------------

// The mask is a function of (key, index) only: the same on every backend (bit-exact resume and
// data-parallel replicas depend on it), reproducible, a fraction 1 - p kept, and drawn again
// where no mask is given.
TEST_P(BackendOps, DropoutMaskIsReproducibleAndAgreesWithTheCpu) {
  const int64_t n = 100003;
  for (float p : {0.1f, 0.5f}) {
    std::vector<uint8_t> mask(static_cast<size_t>(n)), again(mask), other(mask), cpu(mask);
    be().dropout_mask(mask.data(), n, p, 1234);
    be().dropout_mask(again.data(), n, p, 1234);
    be().dropout_mask(other.data(), n, p, 1235);
    cpu_backend().dropout_mask(cpu.data(), n, p, 1234);
    EXPECT_EQ(mask, again);
    EXPECT_EQ(mask, cpu);
    EXPECT_NE(mask, other);
    int64_t kept = 0;
    for (uint8_t m : mask) {
      ASSERT_TRUE(m == 0 || m == 1);
      kept += m;
    }
    EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 0.01);
    auto x = random_vector(n, 24);
    auto dropped = x;
    be().apply_dropout(dropped.data(), mask.data(), n, p, 1234);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(dropped[size_t(i)], mask[size_t(i)] ? double(x[size_t(i)]) / (1.0 - p) : 0.0,
                  1e-6 * (1 + std::abs(x[size_t(i)])));
    // Without the mask, the decisions drawn from the key: the same values, bit for bit (the
    // backward of a backend that keeps no mask: Backend::dropout_mask_bytes).
    auto drawn = x;
    be().apply_dropout(drawn.data(), nullptr, n, p, 1234);
    EXPECT_EQ(drawn, dropped);
  }
}

// --- Embeddings -------------------------------------------------------------------------------

TEST_P(BackendOps, EmbeddingGatherAndScatterAddMatchFloat64) {
  const int64_t vocab = 11, d = 13, batch = 3, len = 5, rows = batch * len, positions = 9;
  auto table = random_vector(vocab * d, 31), position_table = random_vector(positions * d, 32);
  auto d_out = random_vector(rows * d, 33);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t((r * 7) % 4);  // ids repeat
  const float scale = 3.5f;
  const int64_t first = 2;
  for (bool with_positions : {true, false}) {
    const float* pe = with_positions ? position_table.data() : nullptr;
    std::vector<float> out(size_t(rows * d));
    be().embedding_forward(table.data(), pe, ids.data(), rows, len, d, scale, first, out.data());
    std::vector<float> d_table(size_t(vocab * d), 0.5f), d_positions(size_t(positions * d), 0.5f);
    be().embedding_backward(d_out.data(), ids.data(), rows, len, d, scale, first, d_table.data(),
                            with_positions ? d_positions.data() : nullptr);
    std::vector<double> r_table(d_table.size(), 0.5), r_positions(d_positions.size(), 0.5);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const int64_t position = first + r % len;
        const double e = double(table[size_t(ids[size_t(r)] * d + c)]) * scale +
                         (with_positions ? position_table[size_t(position * d + c)] : 0.0);
        ASSERT_NEAR(out[size_t(r * d + c)], e, 1e-5);
        r_table[size_t(ids[size_t(r)] * d + c)] += scale * double(d_out[size_t(r * d + c)]);
        r_positions[size_t(position * d + c)] += d_out[size_t(r * d + c)];
      }
    for (size_t i = 0; i < d_table.size(); ++i) ASSERT_NEAR(d_table[i], r_table[i], 1e-4);
    for (size_t i = 0; i < d_positions.size(); ++i)
      ASSERT_NEAR(d_positions[i], with_positions ? r_positions[i] : 0.5, 1e-5);
  }
}

// An int8-held table (a model loaded for int8): row i is values[i] · scales[i], then the same
// scale and positions as float32's gather, against float64 at odd sizes.
TEST_P(BackendOps, Int8EmbeddingGatherMatchesFloat64) {
  const int64_t vocab = 11, d = 13, batch = 3, len = 5, rows = batch * len, positions = 9;
  std::vector<int8_t> values(size_t(vocab * d));
  std::vector<float> scales(static_cast<size_t>(vocab));
  for (size_t i = 0; i < values.size(); ++i) values[i] = int8_t(int(i * 37 % 255) - 127);
  for (int64_t v = 0; v < vocab; ++v) scales[size_t(v)] = 0.003f * float(v + 1);
  auto position_table = random_vector(positions * d, 34);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t((r * 5) % vocab);
  const float scale = 3.5f;
  const int64_t first = 2;
  for (bool with_positions : {true, false}) {
    const float* pe = with_positions ? position_table.data() : nullptr;
    std::vector<float> out(size_t(rows * d));
    be().embedding_forward_int8({values.data(), scales.data()}, pe, ids.data(), rows, len, d, scale,
                                first, out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const int64_t id = ids[size_t(r)], position = first + r % len;
        const double e = double(values[size_t(id * d + c)]) * scales[size_t(id)] * scale +
                         (with_positions ? position_table[size_t(position * d + c)] : 0.0);
        ASSERT_NEAR(out[size_t(r * d + c)], e, 1e-5 * (1 + std::abs(e))) << r << "," << c;
      }
  }
}

// A prepared float32 matrix serves as an embedding table (a tied output projection of a model
// prepared for inference): its rows read back exactly as they were given, whatever blocked
// layout the backend packed them in, so the gather equals the plain table's bit for bit. Odd
// sizes and the base model's 512-wide rows; other precisions refuse to read rows.
TEST_P(BackendOps, PreparedMatrixRowsServeAsAnEmbeddingTable) {
  for (auto [vocab, d] : {std::pair<int64_t, int64_t>{11, 13}, {37, 64}, {203, 512}}) {
    const int64_t batch = 3, len = 5, rows = batch * len, positions = 9;
    const auto table = random_vector(vocab * d, 51);
    const auto position_table = random_vector(positions * d, 52);
    const auto matrix = be().prepare_matrix({table.data()}, {vocab}, d, Precision::kFloat32);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t((r * 7 + 3) % vocab);
    ids.back() = int32_t(vocab - 1);
    std::vector<float> read(size_t(rows * d));
    matrix->read_rows(ids.data(), rows, read.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c)
        ASSERT_EQ(read[size_t(r * d + c)], table[size_t(ids[size_t(r)] * d + c)]) << r << "," << c;
    for (bool with_positions : {true, false}) {
      const float* pe = with_positions ? position_table.data() : nullptr;
      std::vector<float> plain(size_t(rows * d)), prepared(size_t(rows * d));
      be().embedding_forward(table.data(), pe, ids.data(), rows, len, d, 3.5f, 2, plain.data());
      be().embedding_forward_prepared(*matrix, pe, ids.data(), rows, len, d, 3.5f, 2,
                                      prepared.data());
      ASSERT_EQ(prepared, plain) << vocab << "x" << d;
    }
  }
  if (!be().supports(Precision::kBFloat16)) {
    testing_support::skip_precision(be(), Precision::kBFloat16, "read_rows of a prepared matrix");
  } else {
    const auto table = random_vector(4 * 8, 53);
    const auto matrix = be().prepare_matrix({table.data()}, {4}, 8, Precision::kBFloat16);
    const int32_t id = 1;
    std::vector<float> out(8);
    EXPECT_THROW(matrix->read_rows(&id, 1, out.data()), std::logic_error);
  }
}

// --- Output distribution and loss ---------------------------------------------------------------

TEST_P(BackendOps, LogSoftmaxPickMatchesFloat64) {
  for (int64_t cols : {1, 7, 65, 1000, 1003}) {  // 1000: a GPU reads four at a time
    const int64_t rows = 3;
    auto x = random_vector(rows * cols, 41, 4.f);
    std::vector<int32_t> targets = {0, int32_t(cols - 1), int32_t(cols / 2)};
    std::vector<float> picked(static_cast<size_t>(rows));
    be().log_softmax_pick(x.data(), targets.data(), rows, cols, picked.data());
    for (int64_t r = 0; r < rows; ++r) {
      double max = -INFINITY, sum = 0;
      for (int64_t c = 0; c < cols; ++c) max = std::max(max, double(x[size_t(r * cols + c)]));
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(double(x[size_t(r * cols + c)]) - max);
      const double log_z = max + std::log(sum);
      ASSERT_NEAR(picked[size_t(r)], x[size_t(r * cols + targets[size_t(r)])] - log_z, 1e-5);
    }
  }
}

// Beam search's ranking: per row the keep largest entries, largest first, against a stable
// sort of (value, id) — so ties go to the lower id — with the banned token and NaN as −∞.
// Values on a grid of 0.25 make ties common; sizes around the kernel's chunks of 16.
TEST_P(BackendOps, BestTokensRankEachRowLikeAStableSort) {
  // keep up to 32 takes a GPU's one-pass kernel (a list per warp), a whole row of 37 or more the
  // per-entry one; vocabulary 16, 64 and 1000 are read four at a time there. With log_sums the
  // rows are logits: the same ranking, each value less the row's log Σ exp (float64's, to float
  // rounding), which log_sums holds. Under compute-sanitizer's racecheck (scripts/gpu_check.sh
  // sets TFM_TEST_SHORT_RANKINGS) whole rows are ranked up to 64 entries only: the per-entry
  // kernel's rounds for a row of 1,003 did not end in minutes there, and 37 and 64 take the
  // same kernel's two ways of reading.
  const char* short_setting = std::getenv("TFM_TEST_SHORT_RANKINGS");
  const bool short_rankings = short_setting && std::strcmp(short_setting, "0") != 0;
  for (int64_t vocab : {1, 7, 16, 37, 64, 1000, 1003})
    for (int64_t keep : {int64_t(1), int64_t(3), int64_t(8), int64_t(16), int64_t(17), vocab})
      for (int32_t banned : {-1, 0, int32_t(vocab / 2)})
        for (bool normalise : {false, true}) {
          if (keep > vocab || (short_rankings && keep > 64)) continue;
          const int64_t rows = 4;
          auto x = random_vector(rows * vocab, 61, 2.f);
          for (float& v : x) v = std::round(v * 4.f) / 4.f;
          if (vocab > 2) x[size_t(vocab + 2)] = NAN;     // row 1
          x[size_t(2 * vocab + vocab - 1)] = -INFINITY;  // row 2, last token
          std::vector<float> values(size_t(rows * keep));
          std::vector<int32_t> tokens(values.size());
          std::vector<float> log_sums(size_t(rows), 7.f);
          be().best_tokens(x.data(), rows, vocab, keep, banned, values.data(), tokens.data(),
                           normalise ? log_sums.data() : nullptr);
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<std::pair<float, int32_t>> ranked;
            double largest = -INFINITY, sum = 0;
            bool has_nan = false;
            for (int64_t id = 0; id < vocab; ++id) {
              const float v = x[size_t(r * vocab + id)];
              ranked.push_back({id == banned || std::isnan(v) ? -INFINITY : v, int32_t(id)});
              has_nan = has_nan || std::isnan(v);
              if (!std::isnan(v)) largest = std::max(largest, double(v));
            }
            for (int64_t id = 0; id < vocab; ++id)
              if (!std::isnan(x[size_t(r * vocab + id)]))
                sum += std::exp(double(x[size_t(r * vocab + id)]) - largest);
            const float log_sum = normalise ? log_sums[size_t(r)] : 0.f;
            // With a NaN, or no finite entry, log Σ exp is the backend's own.
            if (normalise && !has_nan && largest > -INFINITY) {
              ASSERT_NEAR(log_sum, largest + std::log(sum), 1e-5 * (1 + std::abs(largest)))
                  << "vocab " << vocab << " row " << r;
            }
            std::stable_sort(ranked.begin(), ranked.end(),
                             [](const auto& a, const auto& b) { return a.first > b.first; });
            for (int64_t i = 0; i < keep; ++i) {
              ASSERT_EQ(tokens[size_t(r * keep + i)], ranked[size_t(i)].second)
                  << "vocab " << vocab << " keep " << keep << " banned " << banned << " row " << r
                  << " rank " << i << " normalised " << normalise;
              const float want = ranked[size_t(i)].first - log_sum;
              const float got = values[size_t(r * keep + i)];
              ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
                  << got << " against " << want << ", vocab " << vocab << " row " << r;
            }
          }
        }
}

// The loss exactly as torch.nn.CrossEntropyLoss(label_smoothing=ε, reduction='none') gives it
// per row, and its gradient grad_scale · (softmax − ((1-ε)·onehot + ε/V)), in place of the
// logits; and of logits given in bfloat16 (as autocast's linear gives them to that loss), the
// gradient over them in bfloat16.
TEST_P(BackendOps, LabelSmoothedCrossEntropyAndItsGradientMatchFloat64) {
  // 1000, 37,000 and 50,000: a GPU reads four at a time; 50,000 and 50,001: more than the
  // 40,960 a GPU keeps in shared memory between its two passes.
  for (int64_t vocab : {2, 7, 65, 1000, 1003, 37000, 50000, 50001})
    for (float smoothing : {0.f, 0.1f}) {
      const int64_t rows = 5;
      auto logits = random_vector(rows * vocab, 51, 3.f);
      std::vector<int32_t> targets;
      for (int64_t r = 0; r < rows; ++r) targets.push_back(int32_t((r * 5 + 1) % vocab));
      const float grad_scale = 0.25f;
      auto grad = logits;
      std::vector<double> row_totals(size_t(rows * 3), -1.0);  // [rows, 3]
      be().cross_entropy_forward_backward(grad.data(), targets.data(), rows, vocab, smoothing,
                                          grad_scale, row_totals.data(), nullptr);
      // With a bfloat16 output, the same gradient rounded (float_to_bfloat16) element for element.
      auto scratch_logits = logits;
      std::vector<uint16_t> rounded(size_t(rows * vocab), 0xFFFF);  // [rows, vocab]
      std::vector<double> rounded_totals(size_t(rows * 3), -1.0);   // [rows, 3]
      be().cross_entropy_forward_backward(scratch_logits.data(), targets.data(), rows, vocab,
                                          smoothing, grad_scale, rounded_totals.data(),
                                          rounded.data());
      for (int64_t i = 0; i < rows * vocab; ++i)
        ASSERT_EQ(rounded[size_t(i)], float_to_bfloat16(grad[size_t(i)]))
            << "vocab " << vocab << " element " << i;
      EXPECT_EQ(rounded_totals, row_totals) << "vocab " << vocab;
      // The logits in bfloat16 (null logits: in rounded_gradient, the gradient over them): the
      // loss of their values widened, within the float path's tolerance of float64's on those
      // values, and the gradient to within a bfloat16 rounding of it. Forward only (a zero scale):
      // the same totals.
      // float64's loss terms of row r of z [rows, vocab] against got [3] (what names the case),
      // and its gradient grad_scale · (softmax − smoothed one-hot) at each column.
      const auto check_row = [&](const float* z_rows, int64_t r, const double* got, float scale,
                                 const std::string& what) {
        const float* z = z_rows + r * vocab;
        double max = -INFINITY, sum = 0, mean_nll = 0;
        int64_t argmax = 0;
        for (int64_t c = 0; c < vocab; ++c)
          if (z[c] > max) max = z[c], argmax = c;
        for (int64_t c = 0; c < vocab; ++c) sum += std::exp(z[c] - max);
        const double log_z = max + std::log(sum);
        for (int64_t c = 0; c < vocab; ++c) mean_nll += (log_z - z[c]) / double(vocab);
        const double target_nll = log_z - z[targets[size_t(r)]];
        const double loss = (1 - smoothing) * target_nll + smoothing * mean_nll;
        EXPECT_NEAR(got[0], loss, 1e-5 * (1 + loss)) << what << " row " << r;
        EXPECT_NEAR(got[1], target_nll, 1e-5 * (1 + target_nll)) << what << " row " << r;
        EXPECT_EQ(got[2], argmax == targets[size_t(r)] ? 1.0 : 0.0) << what << " row " << r;
        std::vector<double> gradient(static_cast<size_t>(vocab));
        for (int64_t c = 0; c < vocab; ++c)
          gradient[size_t(c)] =
              scale * (std::exp(z[c] - log_z) - ((c == targets[size_t(r)] ? 1 - smoothing : 0.0) +
                                                 smoothing / double(vocab)));
        return gradient;
      };
      const RoundedCopy logits16 = rounded_copy(logits, Precision::kBFloat16);
      for (float scale : {grad_scale, 0.f}) {
        std::vector<uint16_t> in_place = logits16.bits;
        std::vector<double> totals16(size_t(rows * 3), -1.0);  // [rows, 3]
        be().cross_entropy_forward_backward(nullptr, targets.data(), rows, vocab, smoothing, scale,
                                            totals16.data(), in_place.data());
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<double> want =
              check_row(logits16.widened.data(), r, totals16.data() + 3 * r, scale,
                        "bfloat16, vocab " + std::to_string(vocab));
          for (int64_t c = 0; c < vocab; ++c)
            ASSERT_NEAR(bfloat16_to_float(in_place[size_t(r * vocab + c)]), want[size_t(c)],
                        std::abs(want[size_t(c)]) / 256 + 1e-6)
                << "bfloat16, vocab " << vocab << " row " << r << " column " << c;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<double> want = check_row(logits.data(), r, row_totals.data() + 3 * r,
                                                   grad_scale, "vocab " + std::to_string(vocab));
        for (int64_t c = 0; c < vocab; ++c)
          ASSERT_NEAR(grad[size_t(r * vocab + c)], want[size_t(c)], 1e-6) << "vocab " << vocab;
      }
    }
}

// A row's prediction is its first largest logit, wherever the ties fall (the CPU kernel finds
// the maximum in blocks of 64 and scans only the first block holding it).
TEST_P(BackendOps, CrossEntropyCountsTheFirstLargestLogitAsThePrediction) {
  const int64_t vocab = 300;
  for (int64_t first : {0, 63, 64, 70, 250})
    for (int64_t second : {first + 1, first + 49, int64_t(299)}) {
      if (second <= first || second >= vocab) continue;
      for (int32_t target : {int32_t(first), int32_t(second)}) {
        std::vector<float> logits(size_t(vocab), 0.5f);
        logits[size_t(first)] = logits[size_t(second)] = 4.f;
        double row_totals[3] = {-1, -1, -1};
        be().cross_entropy_forward_backward(logits.data(), &target, 1, vocab, 0.1f, 1.f, row_totals,
                                            nullptr);
        EXPECT_EQ(row_totals[2], target == first ? 1.0 : 0.0)
            << "maxima at " << first << " and " << second << ", target " << target;
      }
    }
}

// --- Optimizer and gradient clipping ------------------------------------------------------------

// torch.optim.Adam: m = β1·m + (1-β1)·g, v = β2·v + (1-β2)·g², then
// p -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε); three steps, one call a step over
// a set of tensors (sizes 1, 7, 0, 70001 and 3: one alone, an empty one among them, one larger
// than a launch's first wave) whose gradients and moments are one block each.
TEST_P(BackendOps, AdamAndSgdUpdatesMatchFloat64) {
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{1}, std::vector<int64_t>{7, 0, 70001, 3}}) {
    std::vector<int64_t> offsets = {0};
    for (int64_t size : sizes) offsets.push_back(offsets.back() + size);
    const int64_t n = offsets.back(), count = int64_t(sizes.size());
    std::vector<std::vector<float>> params;
    std::vector<float*> addresses;
    for (size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(random_vector(std::max<int64_t>(sizes[i], 1), 61 + i));
      addresses.push_back(params.back().data());
    }
    std::vector<float> m(size_t(n), 0.f), v(size_t(n), 0.f);
    std::vector<double> rp(static_cast<size_t>(n)), rm(static_cast<size_t>(n), 0.0),
        rv(static_cast<size_t>(n), 0.0);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t j = 0; j < sizes[size_t(t)]; ++j)
        rp[size_t(offsets[size_t(t)] + j)] = params[size_t(t)][size_t(j)];
    const AdamHyperparameters h{0.01f, 0.9f, 0.98f, 1e-9f};
    for (int64_t step = 1; step <= 3; ++step) {
      auto grad = random_vector(n, 62 + uint64_t(step));
      be().adam_update(addresses.data(), offsets.data(), count, n, grad.data(), m.data(), v.data(),
                       h, step);
      const double c1 = 1 - std::pow(double(h.beta1), double(step));
      const double c2 = 1 - std::pow(double(h.beta2), double(step));
      for (int64_t i = 0; i < n; ++i) {
        const double g = grad[size_t(i)];
        rm[size_t(i)] = h.beta1 * rm[size_t(i)] + (1 - double(h.beta1)) * g;
        rv[size_t(i)] = h.beta2 * rv[size_t(i)] + (1 - double(h.beta2)) * g * g;
        rp[size_t(i)] -=
            h.lr / c1 * rm[size_t(i)] / (std::sqrt(rv[size_t(i)]) / std::sqrt(c2) + h.eps);
      }
    }
    for (int64_t t = 0; t < count; ++t)
      for (int64_t j = 0; j < sizes[size_t(t)]; ++j) {
        const size_t i = size_t(offsets[size_t(t)] + j);
        ASSERT_NEAR(params[size_t(t)][size_t(j)], rp[i], 1e-5) << "tensor " << t << " " << j;
        ASSERT_NEAR(m[i], rm[i], 1e-5) << i;
        ASSERT_NEAR(v[i], rv[i], 1e-5) << i;
      }
  }
  {
    const int64_t n = 70001;
    auto param = random_vector(n, 65);
    auto sgd = param;
    auto grad = random_vector(n, 66);
    be().sgd_update(sgd.data(), grad.data(), n, 0.125f);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(sgd[size_t(i)], double(param[size_t(i)]) - 0.125 * grad[size_t(i)], 1e-6);
  }
}

TEST_P(BackendOps, SumOfSquaresIsDeterministicAndMatchesFloat64) {
  for (int64_t n : {0, 1, 7, 1000003}) {
    auto x = random_vector(n, 71, 3.f);
    double want = 0;
    for (float v : x) want += double(v) * v;
    const double got = be().sum_of_squares(x.data(), n);
    EXPECT_NEAR(got, want, 1e-9 * (1 + want)) << n;
    EXPECT_EQ(got, be().sum_of_squares(x.data(), n)) << "the same order every time";
  }
}

// --- Copies, fills and row movement -------------------------------------------------------------

TEST_P(BackendOps, CopyFillGatherAndScatterRows) {
  auto x = random_vector(1001, 81);
  std::vector<float> y(1001, 0.f);
  be().copy(x.data(), 1001, y.data());
  EXPECT_EQ(x, y);
  be().fill(y.data() + 3, 995, -2.5f);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], i < 3 || i >= 998 ? x[i] : -2.5f);

  const int64_t d = 7, ldx = 9, ldy = 8, source_rows = 6;
  auto source = random_vector(source_rows * ldx, 82);
  const std::vector<int64_t> rows = {4, 0, 5, 2};
  std::vector<float> gathered(size_t(4 * ldy), 3.f);
  be().gather_rows(source.data(), ldx, rows.data(), 4, d, gathered.data(), ldy);
  std::vector<float> scattered(size_t(source_rows * ldy), 3.f);
  be().scatter_rows(gathered.data(), ldy, rows.data(), 4, d, scattered.data(), ldy);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < ldy; ++c)
      ASSERT_EQ(gathered[size_t(r * ldy + c)],
                c < d ? source[size_t(rows[size_t(r)] * ldx + c)] : 3.f);
  for (int64_t r = 0; r < source_rows; ++r) {
    const bool written = std::find(rows.begin(), rows.end(), r) != rows.end();
    for (int64_t c = 0; c < ldy; ++c)
      ASSERT_EQ(scattered[size_t(r * ldy + c)],
                written && c < d ? source[size_t(r * ldx + c)] : 3.f);
  }
  // Into a bfloat16 or float16 cache: each element rounded to nearest even, the rest untouched.
  for (Precision format : {Precision::kBFloat16, Precision::kFloat16}) {
    const bool float16 = format == Precision::kFloat16;
    std::vector<uint16_t> scattered16(size_t(source_rows * ldy), 0x4040);
    be().scatter_rows_to_16_bits(gathered.data(), ldy, rows.data(), 4, d, format,
                                 scattered16.data(), ldy);
    for (int64_t r = 0; r < source_rows; ++r) {
      const bool written = std::find(rows.begin(), rows.end(), r) != rows.end();
      for (int64_t c = 0; c < ldy; ++c) {
        const float v = source[size_t(r * ldx + c)];
        ASSERT_EQ(scattered16[size_t(r * ldy + c)],
                  written && c < d ? (float16 ? float_to_half(v) : float_to_bfloat16(v)) : 0x4040)
            << precision_name(format);
      }
    }
  }
}

// Backend::run_and_record and replay (CUDA graphs on a GPU): the recorded operations run at
// once; a replay queues them again with the arguments they were recorded with, on what the
// memory they name holds by then; an allocation since refuses the replay. A backend that records
// nothing (the CPU) runs them once and returns no recording.
TEST_P(BackendOps, RecordedOperationsReplayOnTheMemoryTheyName) {
  const auto* staged = dynamic_cast<const HostStagedBackend*>(&be());
  const Backend& device = staged ? staged->device() : be();  // its own memory, unstaged
  const int64_t n = 1000;
  DeviceBuffer<float> x_buffer, y_buffer;
  float* x = x_buffer.allocate_uninitialized(device, n);
  float* y = y_buffer.allocate_uninitialized(device, n);
  std::vector<float> host = random_vector(n, 61), out(static_cast<size_t>(n));
  const auto check_y = [&](const char* when) {
    device.copy_to_host(y, n * int64_t(sizeof(float)), out.data());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out[size_t(i)], 2.f * host[size_t(i)] + host[size_t(i)]) << when << ", " << i;
  };
  device.copy_from_host(host.data(), n * int64_t(sizeof(float)), x);
  const auto operations = [&] {  // y = 2x + x
    device.copy(x, n, y);
    device.scale(y, 2.f, n);
    device.add(y, x, n);
  };
  const std::shared_ptr<const RecordedOperations> recording = device.run_and_record(operations);
  check_y("recorded");
  if (!device.records_operations()) {
    EXPECT_EQ(recording, nullptr);
    return;
  }
  ASSERT_NE(recording, nullptr) << device.name() << " records, but kept nothing";
  host = random_vector(n, 62);
  device.copy_from_host(host.data(), n * int64_t(sizeof(float)), x);
  ASSERT_TRUE(device.replay(*recording));
  check_y("replayed");
  const std::vector<float> replayed = out;
  DeviceBuffer<float> moved;
  moved.allocate_uninitialized(device, 4);
  device.copy_from_host(random_vector(n, 63).data(), n * int64_t(sizeof(float)), x);
  EXPECT_FALSE(device.replay(*recording));  // memory changed since: nothing queued
  device.copy_to_host(y, n * int64_t(sizeof(float)), out.data());
  EXPECT_EQ(out, replayed);
}

// The mean of each group of consecutive rows (decoding's cross-attention averaged over heads):
// against float64 for groups of 1 (a copy), 3 and 16 rows, widths 1, 7 and 65.
TEST_P(BackendOps, MeanOfRowGroupsMatchesFloat64) {
  uint64_t seed = 700;
  for (int64_t group_size : {1, 3, 16})
    for (int64_t cols : {1, 7, 65}) {
      const int64_t groups = 5;
      const auto x = random_vector(groups * group_size * cols, seed++);
      std::vector<float> y(size_t(groups * cols), 123.f);
      be().mean_of_row_groups(x.data(), groups, group_size, cols, y.data());
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t c = 0; c < cols; ++c) {
          double sum = 0;
          for (int64_t k = 0; k < group_size; ++k)
            sum += double(x[size_t((g * group_size + k) * cols + c)]);
          ASSERT_NEAR(y[size_t(g * cols + c)], sum / double(group_size), 1e-6)
              << "group size " << group_size << " cols " << cols << " at " << g << "," << c;
        }
    }
}

// --- Memory -------------------------------------------------------------------------------------

// Host -> device -> device -> host round trips, alignment, zeroed blocks, and a DeviceBuffer
// that grows keeping its contents (the rest zero) as std::vector::resize would.
TEST_P(BackendOps, AllocationsCopiesAndGrowingBuffers) {
  const auto x = random_vector(1001, 91);
  const int64_t bytes = 1001 * int64_t(sizeof(float));
  void* a = be().allocate(bytes, false);
  void* b = be().allocate(bytes + 13, true);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % alignof(std::max_align_t), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % alignof(std::max_align_t), 0u);
  std::vector<uint8_t> zeros(size_t(bytes + 13), 0xff);
  be().copy_to_host(b, bytes + 13, zeros.data());
  EXPECT_EQ(std::count(zeros.begin(), zeros.end(), 0), bytes + 13);
  be().copy_from_host(x.data(), bytes, a);
  be().copy_bytes(a, bytes, b);
  std::vector<float> back(1001, 0.f);
  be().copy_to_host(b, bytes, back.data());
  EXPECT_EQ(back, x);
  be().deallocate(a);
  be().deallocate(b);
  be().deallocate(nullptr);
  void* empty = be().allocate(0, true);  // a unique block, freed like any other
  be().deallocate(empty);

  DeviceBuffer<float> buffer;
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(buffer.backend(), nullptr);
  float* first = ensure_size(be(), buffer, 100);
  EXPECT_EQ(buffer.size(), 100);
  EXPECT_EQ(buffer.backend(), &be());
  be().copy_from_host(x.data(), 100 * int64_t(sizeof(float)), first);
  EXPECT_EQ(ensure_size(be(), buffer, 40), first);  // big enough: not reallocated
  float* grown = ensure_size(be(), buffer, 1001);
  EXPECT_EQ(buffer.size(), 1001);
  be().copy_to_host(grown, bytes, back.data());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i < 100 ? x[i] : 0.f) << i;
  DeviceBuffer<float> moved = std::move(buffer);
  EXPECT_EQ(moved.data(), grown);
  EXPECT_TRUE(buffer.empty());
  moved.allocate_uninitialized(be(), 7);
  EXPECT_EQ(moved.size(), 7);
  moved.reset();
  EXPECT_EQ(moved.data(), nullptr);
}

// A named set in one block (gradients, Adam's moments): name order, zero at first, whole-set
// operations on flat(), and host round trips by name and for the whole set.
TEST_P(BackendOps, NamedTensorsShareOneBlockInNameOrder) {
  DeviceTensors set(be(), {{"b", {2, 3}}, {"a", {4}}, {"c", {1}}});
  EXPECT_EQ(&set.backend(), &be());
  EXPECT_EQ(set.numel(), 11);
  EXPECT_EQ(set.at("a").offset, 0);
  EXPECT_EQ(set.at("b").offset, 4);
  EXPECT_EQ(set.at("c").offset, 10);
  EXPECT_EQ(set.at("b").ptr(), set.flat() + 4);
  EXPECT_EQ(set.at("b").shape, Shape({2, 3}));
  EXPECT_EQ(set.find("d"), set.end());
  EXPECT_THROW(set.at("d"), std::out_of_range);
  const std::vector<float> b = {1, 2, 3, 4, 5, 6};
  set.copy_from_host("b", b.data());
  be().fill(set.at("c").ptr(), 1, 7.f);
  const TensorMap host = set.to_host("grad.");
  ASSERT_EQ(host.size(), 3u);
  EXPECT_EQ(host.at("grad.a").data, std::vector<float>(4, 0.f));
  EXPECT_EQ(host.at("grad.b").data, b);
  EXPECT_EQ(host.at("grad.b").shape, Shape({2, 3}));
  EXPECT_EQ(host.at("grad.c").data, std::vector<float>{7.f});
  be().scale(set.flat(), 2.f, set.numel());
  EXPECT_EQ(be().sum_of_squares(set.flat(), set.numel()), 4.0 * (91 + 49));
  DeviceTensors moved = std::move(set);
  EXPECT_EQ(moved.to_host().at("c").data, std::vector<float>{14.f});
  moved.set_zero();
  for (const auto& [name, t] : moved.to_host())
    EXPECT_EQ(t.data, std::vector<float>(t.data.size(), 0.f)) << name;
}

// A set allocated per tensor (a model's parameters): each tensor its own block of the backend,
// uploaded from the host, released one by one (a packed weight of an inference-only model)
// with its name and shape kept, and checked for NaN / Inf where it is.
TEST_P(BackendOps, NamedTensorsPerTensorCanBeReleasedOneByOne) {
  TensorMap host;
  host.emplace("w", Tensor({2, 2}));
  host.at("w").data = {1, 2, 3, 4};
  host.emplace("held", Tensor());  // a weight held otherwise (int8): shape, no data
  host.at("held").shape = {3};
  host.emplace("b", Tensor({2}));
  host.at("b").data = {5, 6};
  DeviceTensors set = DeviceTensors::upload(be(), std::move(host));
  EXPECT_TRUE(host.at("w").data.empty());  // freed once copied
  EXPECT_EQ(set.layout(), DeviceTensors::Layout::kPerTensor);
  EXPECT_THROW(set.flat(), std::logic_error);
  EXPECT_EQ(set.at("held").ptr(), nullptr);
  EXPECT_EQ(set.at("held").shape, Shape{3});
  EXPECT_NE(set.at("w").ptr() + 4, set.at("b").ptr());
  EXPECT_TRUE(all_finite(set));
  const float bad[2] = {5, std::numeric_limits<float>::infinity()};
  set.copy_from_host("b", bad);
  EXPECT_FALSE(all_finite(set));
  set.release("b");
  EXPECT_TRUE(all_finite(set));
  const TensorMap back = set.to_host();
  EXPECT_EQ(back.at("w").data, std::vector<float>({1, 2, 3, 4}));
  EXPECT_TRUE(back.at("b").data.empty());
  EXPECT_EQ(back.at("b").shape, Shape{2});
  EXPECT_THROW(set.copy_from_host("b", bad), std::logic_error);
  DeviceTensors zeros = DeviceTensors::zeros_like(set);
  EXPECT_EQ(zeros.layout(), DeviceTensors::Layout::kOneBlock);
  EXPECT_EQ(zeros.numel(), 9);
  EXPECT_EQ(zeros.at("held").ptr(), zeros.flat() + 2);
}

}  // namespace
}  // namespace tfm
