// The CUDA backend's kernels that run inside its matrix products (matmul.cu: the int8 path's
// quantisation, its own int8 product and the scaling of cuBLAS's int32 sums; the bfloat16
// output's rounding pass; a prepared matrix's row reads), which emulated_cuda_backend.h's
// products (the CPU's) never reach: called directly, emulated, against the CPU's int8 products to
// the bit (both sum the quantised rows exactly and scale back with the same float operations, as
// backend_ops' Int8ProductsAreTheCpusToTheBit holds a GPU to) and against host loops. (Not named
// *_test.cpp: those go into transformer_tests, which has no emulated kernels.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "skip_report.h"
#include "tensor/float16.h"
#include "tensor/random.h"
// The emulation, after which `cuda` names tfm::emulated_cuda,
#include "emulated_cuda.h"
// so that these are the emulated copies' declarations.
#include "backend/cuda/cuda_kernels.h"

namespace tfm {
namespace {

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Random random(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = random.normal() * 2.f;
  return v;
}

// Both int8 paths of matmul.cu: its own kernel, and cuBLAS's int32 sums (computed exactly here)
// scaled back in place. k 45 (the kernel's rows), 512 and 4 (cuBLAS's), with and without a bias
// and ReLU, an output stride wider than n.
TEST(EmulatedCudaKernels, Int8ProductsAreTheCpusToTheBit) {
  if (!cpu_backend().supports(Precision::kInt8))
    GTEST_SKIP() << testing_support::cannot_compute(cpu_backend(), Precision::kInt8);
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 21, 45}, {6, 21, 512}, {40, 7, 4}})
    for (bool with_bias : {false, true})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                     (with_bias ? " bias" : "") + (relu ? " relu" : ""));
        const auto w = random_values(n * k, 11 + k), x = random_values(m * k, 12 + k);
        const auto bias = random_values(n, 13);
        MatmulEpilogue epilogue;
        epilogue.bias = with_bias ? bias.data() : nullptr;
        epilogue.relu = relu;
        const int64_t ldy = n + 3;
        std::vector<float> want(size_t(m * ldy), 7.f);
        cpu_backend()
            .prepare_matrix({w.data()}, {n}, k, Precision::kInt8)
            ->multiply(x.data(), m, k, want.data(), ldy, epilogue);

        std::vector<int8_t> qx(size_t(m * k)), qw(size_t(n * k));
        std::vector<float> x_scales(static_cast<size_t>(m)), w_scales(static_cast<size_t>(n));
        emulated_cuda::quantize_activation_rows(nullptr, x.data(), m, k, k, qx.data(),
                                                x_scales.data());
        emulated_cuda::quantize_weight_rows(nullptr, w.data(), n, k, qw.data(), w_scales.data());
        std::vector<float> own(size_t(m * ldy), 7.f);
        emulated_cuda::int8_product(nullptr, qx.data(), x_scales.data(), qw.data(), w_scales.data(),
                                    m, n, k, own.data(), ldy, epilogue.bias, relu);
        std::vector<float> scaled(size_t(m * ldy), 7.f);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            int32_t sum = 0;
            for (int64_t i = 0; i < k; ++i)
              sum += int32_t(qx[size_t(r * k + i)]) * int32_t(qw[size_t(c * k + i)]);
            std::memcpy(&scaled[size_t(r * ldy + c)], &sum, 4);
          }
        emulated_cuda::dequantize_int8_sums(nullptr, scaled.data(), m, n, ldy, x_scales.data(),
                                            w_scales.data(), epilogue.bias, relu);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            const size_t i = size_t(r * ldy + c);
            ASSERT_EQ(own[i], want[i]) << "own kernel, row " << r << ", column " << c;
            ASSERT_EQ(scaled[i], want[i]) << "cuBLAS's sums scaled, row " << r << ", column " << c;
          }
        for (int64_t r = 0; r < m; ++r)  // the stride's gap left alone
          for (int64_t c = n; c < ldy; ++c) ASSERT_EQ(own[size_t(r * ldy + c)], 7.f);
      }
}

// The bfloat16 output's pass: (result + bias), ReLU, rounded to nearest even, results below the
// smallest normal float flushed to zero (the sign kept), rows at their strides.
TEST(EmulatedCudaKernels, RoundingFlushesSubnormalResultsAfterBiasAndRelu) {
  const int64_t rows = 5, cols = 37, ldr = 40, ldo = 41;
  auto result = random_values(rows * ldr, 21);
  result[3] = 1e-39f;   // subnormal
  result[4] = -2e-39f;  // subnormal, negative
  result[5] = 3.4e38f;  // large
  result[6] = NAN;
  const auto bias = random_values(cols, 22);
  for (bool with_bias : {false, true})
    for (bool relu : {false, true}) {
      std::vector<uint16_t> out(size_t(rows * ldo), 0xABCD);
      emulated_cuda::round_to_bfloat16_flushing(nullptr, result.data(), ldr,
                                                with_bias ? bias.data() : nullptr, relu, rows, cols,
                                                out.data(), ldo);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ldo; ++c) {
          const uint16_t got = out[size_t(r * ldo + c)];
          if (c >= cols) {
            ASSERT_EQ(got, 0xABCD);
            continue;
          }
          float v = result[size_t(r * ldr + c)] + (with_bias ? bias[size_t(c)] : 0.f);
          if (relu) v = v > 0.f ? v : 0.f;
          if (std::isfinite(v) && std::fabs(v) < 1.17549435e-38f) v = std::copysign(0.f, v);
          const uint16_t want = float_to_bfloat16(v);
          if (std::isnan(v))
            ASSERT_TRUE(std::isnan(bfloat16_to_float(got))) << r << "," << c;
          else
            ASSERT_EQ(got, want) << r << "," << c << " (" << v << ")";
        }
    }
}

}  // namespace
}  // namespace tfm
