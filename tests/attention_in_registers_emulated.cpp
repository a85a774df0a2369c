// src/backend/cuda/attention_in_registers.cu's kernels run on the CPU through a host emulation of
// the warp instructions they are written for (warp_emulation.h: the PTX ISA's operand layouts of
// ldmatrix and mma.sync), so that their index arithmetic (which lane holds which score, which
// rows an operand is read from, where each result is stored) is checked where no GPU is: the
// output, the stored weights (or each row's shift and inverse sum) and the gradients against a
// float64 attention on the same bfloat16-rounded operands, the rounded copies against the
// floats, and the weights rebuilt in the backward against the weights stored, to the bit. On a GPU,
// backend_ops' AttentionInBFloat16ProductsStaysNearFloat64 checks the same kernels with the
// hardware's own instructions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#define TFM_EMULATED_WARPS
#define TFM_EMULATED_KERNELS_ONLY
#include "warp_emulation.h"
// The kernels themselves (their launches left out: TFM_EMULATED_KERNELS_ONLY).
#include "backend/cuda/attention_in_registers.cu"

namespace tfm {
namespace cuda {
namespace {

float to_bfloat16_and_back(float x) {
  return from_bfloat16(to_bfloat16(x));
}

struct Case {
  int query_len, key_len;
  bool causal;
  int window, query_offset;
  bool bfloat16_inputs, statistics_only;
  bool wide_q_rows = false;  // Q's rows (and dQ's) 3 heads' widths apart, as a stacked Q|K|V's
};

// The keys query `position` sees among `count` (backend/cpu's rule, written out again).
void visible_range(const Case& c, int64_t count, int64_t position, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = count;
  if (c.causal) *hi = std::min(*hi, position + 1);
  if (c.window >= 0) {
    *lo = std::max<int64_t>(0, position - c.window);
    if (!c.causal) *hi = std::min<int64_t>(*hi, position + c.window + 1);
  }
  *lo = std::min(*lo, count);
  *hi = std::max(std::min(*hi, count), *lo);
}

// The largest |got − want| over the largest |want|.
double relative_to_largest(const std::vector<float>& got, const std::vector<double>& want) {
  double largest = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

class AttentionInRegistersEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionInRegistersEmulated, MatchesFloat64AndRebuildsTheStoredWeights) {
  const Case c = GetParam();
  constexpr int kBatch = 3, kHeads = 2, kHeadDim = 64, kWidth = kHeads * kHeadDim;
  AttentionShape s;
  s.batch = kBatch;
  s.heads = kHeads;
  s.head_dim = kHeadDim;
  s.query_len = c.query_len;
  s.key_len = c.key_len;
  const int q_stride = c.wide_q_rows ? 3 * kWidth : kWidth;
  s.q_row_stride = q_stride;
  s.out_row_stride = kWidth;
  s.k_row_stride = s.v_row_stride = 2 * kWidth;  // keys and values interleaved in their rows
  s.products = Precision::kBFloat16;
  // A full sequence, a shorter one, one of no keys.
  std::vector<int32_t> lengths = {c.key_len, std::max(1, c.key_len - 5), 0};
  AttentionMask mask;
  mask.key_lengths = lengths.data();
  mask.causal = c.causal;
  mask.window = c.window;
  mask.query_offset = c.query_offset;
  std::mt19937 random(uint32_t(c.query_len * 131 + c.key_len));
  std::uniform_real_distribution<float> uniform(-2.f, 2.f);
  std::vector<float> q(size_t(kBatch * c.query_len * q_stride)),
      kv(size_t(kBatch * c.key_len * 2 * kWidth)), d_out(size_t(kBatch * c.query_len * kWidth));
  for (std::vector<float>* x : {&q, &kv, &d_out})
    for (float& value : *x) value = uniform(random);
  const auto bits = [](const std::vector<float>& x) {
    std::vector<uint16_t> rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) rounded[i] = to_bfloat16(x[i]);
    return rounded;
  };
  const std::vector<uint16_t> q16 = bits(q), kv16 = bits(kv), d_out16 = bits(d_out);
  const float scale = 1.f / 8.f;

  // One forward and backward through the kernels, as attention_in_registers_forward and
  // _backward launch them, with Q, K, V and dO as Input.
  struct Results {
    std::vector<float> probs, out, dq, dkv;
    std::vector<uint16_t> rounded_out, rounded_dq, rounded_dkv;
  };
  const auto run = [&](auto input, bool statistics_only) {
    using Input = decltype(input);
    const auto* qi =
        reinterpret_cast<const Input*>(c.bfloat16_inputs ? (void*)q16.data() : (void*)q.data());
    const auto* ki =
        reinterpret_cast<const Input*>(c.bfloat16_inputs ? (void*)kv16.data() : (void*)kv.data());
    const auto* di = reinterpret_cast<const Input*>(c.bfloat16_inputs ? (void*)d_out16.data()
                                                                      : (void*)d_out.data());
    Results r{std::vector<float>(size_t(kBatch * kHeads * c.query_len * c.key_len), 7.f),
              std::vector<float>(d_out.size(), 9.f),
              std::vector<float>(q.size(), 9.f),
              std::vector<float>(kv.size(), 9.f),
              std::vector<uint16_t>(d_out.size(), 9),
              std::vector<uint16_t>(q.size(), 9),
              std::vector<uint16_t>(kv.size(), 9)};
    AttentionShape forward = s;
    forward.rounded_out = r.rounded_out.data();
    if (c.bfloat16_inputs) {
      forward.rounded_q = q16.data();
      forward.rounded_k = kv16.data();
      forward.rounded_v = kv16.data() + kWidth;
      forward.rounded_d_out = d_out16.data();
    }
    AttentionShape backward = forward;
    backward.rounded_out = nullptr;
    backward.rounded_dq = r.rounded_dq.data();
    backward.rounded_dk = r.rounded_dkv.data();
    backward.rounded_dv = r.rounded_dkv.data() + kWidth;
    const auto both = [&](auto rows_constant) {
      constexpr int kRows = decltype(rows_constant)::value;
      warp_emulation::launch(kBatch * kHeads, kThreads<kRows>, Layout<kRows>::kForwardBytes, [&] {
        forward_in_registers_kernel<kRows, Input>(forward, mask, qi, ki, ki + kWidth,
                                                  r.probs.data(), r.out.data(), scale,
                                                  statistics_only);
      });
      warp_emulation::launch(kBatch * kHeads, kThreads<kRows>, Layout<kRows>::kBackwardBytes, [&] {
        const auto args = [&](auto kernel) {
          kernel(backward, mask, qi, ki, ki + kWidth, r.probs.data(), di, r.dq.data(), r.dkv.data(),
                 r.dkv.data() + kWidth, scale);
        };
        if (statistics_only)
          args(backward_in_registers_kernel<kRows, true, Input>);
        else
          args(backward_in_registers_kernel<kRows, false, Input>);
      });
    };
    if (!with_block_rows(s, both)) {  // as attention_in_registers_forward and _backward: tiles
      const int query_tiles = (c.query_len + kTile - 1) / kTile;
      warp_emulation::launch(
          kBatch * kHeads * query_tiles, kTileThreads, TileLayout::kForwardBytes, [&] {
            forward_tiled_kernel<Input>(forward, mask, qi, ki, ki + kWidth, r.probs.data(),
                                        r.out.data(), scale, statistics_only, query_tiles);
          });
      warp_emulation::launch(kBatch * kHeads, kTileThreads, tiled_backward_bytes(c.query_len), [&] {
        const auto args = [&](auto kernel) {
          kernel(backward, mask, qi, ki, ki + kWidth, r.probs.data(), di, r.dq.data(), r.dkv.data(),
                 r.dkv.data() + kWidth, scale);
        };
        if (statistics_only)
          args(backward_tiled_kernel<true, Input>);
        else
          args(backward_tiled_kernel<false, Input>);
      });
    }
    return r;
  };
  const auto run_with = [&](bool statistics_only) {
    return c.bfloat16_inputs ? run(uint16_t{}, statistics_only) : run(float{}, statistics_only);
  };
  const Results got = run_with(c.statistics_only);

  // float64 on the rounded operands.
  std::vector<double> out(d_out.size()), dq(d_out.size()), dk(size_t(kBatch * c.key_len * kWidth)),
      dv(dk.size());
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int t = 0; t < c.query_len; ++t) {
        int64_t lo, hi;
        visible_range(c, std::min(c.key_len, lengths[size_t(b)]), t + c.query_offset, &lo, &hi);
        const auto at_q = [&](int d) {  // of q and dq
          return size_t((b * c.query_len + t) * q_stride + h * kHeadDim + d);
        };
        const auto at_out = [&](int d) {  // of out and d_out
          return size_t((b * c.query_len + t) * kWidth + h * kHeadDim + d);
        };
        const auto at_k = [&](int64_t j, int d) {
          return size_t((b * c.key_len + j) * 2 * kWidth + h * kHeadDim + d);
        };
        const auto at_dk = [&](int64_t j, int d) {
          return size_t((b * c.key_len + j) * kWidth + h * kHeadDim + d);
        };
        const auto rounded = [](float x) { return double(to_bfloat16_and_back(x)); };
        std::vector<double> p(size_t(c.key_len), 0.0), dp(size_t(c.key_len), 0.0);
        double largest = -INFINITY, total = 0, dot = 0;
        for (int64_t j = lo; j < hi; ++j) {
          for (int d = 0; d < kHeadDim; ++d)
            p[size_t(j)] += rounded(q[at_q(d)]) * rounded(kv[at_k(j, d)]);
          p[size_t(j)] *= scale;
          largest = std::max(largest, p[size_t(j)]);
        }
        for (int64_t j = lo; j < hi; ++j) total += p[size_t(j)] = std::exp(p[size_t(j)] - largest);
        // What the forward stored: the weights, or the row's shift (largest score · scale) and
        // inverse sum (the float Σ of exp(score · scale − shift)), [B, H, Tq, 2].
        const size_t weights_row = size_t(((b * kHeads + h) * c.query_len + t) * c.key_len);
        const size_t statistics = size_t(((b * kHeads + h) * c.query_len + t) * 2);
        if (c.statistics_only && hi > lo) {
          EXPECT_NEAR(got.probs[statistics], largest, 1e-4 * std::max(1.0, std::fabs(largest)));
          EXPECT_NEAR(got.probs[statistics + 1], 1 / total, 1e-4 / total);
        } else if (c.statistics_only) {  // no key: no weight
          EXPECT_EQ(got.probs[statistics + 1], 0.f);
        }
        for (int64_t j = lo; j < hi; ++j) {
          p[size_t(j)] /= total;
          if (!c.statistics_only) {
            EXPECT_NEAR(got.probs[weights_row + size_t(j)], p[size_t(j)], 1e-5) << t << ", " << j;
          }
          for (int d = 0; d < kHeadDim; ++d) {
            out[at_out(d)] += p[size_t(j)] * rounded(kv[at_k(j, d) + kWidth]);
            dp[size_t(j)] += rounded(d_out[at_out(d)]) * rounded(kv[at_k(j, d) + kWidth]);
          }
          dot += dp[size_t(j)] * p[size_t(j)];
        }
        if (!c.statistics_only)  // zero outside the visible keys
          for (int64_t j = 0; j < c.key_len; ++j)
            if (j < lo || j >= hi) {
              EXPECT_EQ(got.probs[weights_row + size_t(j)], 0.f);
            }
        for (int64_t j = lo; j < hi; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - dot) * scale;
          for (int d = 0; d < kHeadDim; ++d) {
            dq[at_out(d)] += ds * rounded(kv[at_k(j, d)]);
            dk[at_dk(j, d)] += ds * rounded(q[at_q(d)]);
            dv[at_dk(j, d)] += p[size_t(j)] * rounded(d_out[at_out(d)]);
          }
        }
      }
  std::vector<float> got_dk, got_dv;
  for (size_t i = 0; i < got.dkv.size(); ++i)
    (int(i % size_t(2 * kWidth)) < kWidth ? got_dk : got_dv).push_back(got.dkv[i]);
  // The weights and dS round to bfloat16 (2^-9 each) where float64 does not.
  EXPECT_LE(relative_to_largest(got.out, out), 1.0 / 128);
  std::vector<float> got_dq;  // dQ's columns of q's rows (the others are not dQ's)
  for (size_t i = 0; i < got.dq.size(); ++i)
    if (int(i % size_t(q_stride)) < kWidth) got_dq.push_back(got.dq[i]);
  EXPECT_LE(relative_to_largest(got_dq, dq), 1.0 / 128);
  EXPECT_LE(relative_to_largest(got_dk, dk), 1.0 / 128);
  EXPECT_LE(relative_to_largest(got_dv, dv), 1.0 / 128);
  for (size_t i = 0; i < got.out.size(); ++i)
    ASSERT_EQ(got.rounded_out[i], to_bfloat16(got.out[i])) << "rounded out " << i;
  for (size_t i = 0; i < got.dq.size(); ++i)
    if (int(i % size_t(q_stride)) < kWidth) {
      ASSERT_EQ(got.rounded_dq[i], to_bfloat16(got.dq[i])) << "rounded dq " << i;
    }
  for (size_t i = 0; i < got.dkv.size(); ++i)
    ASSERT_EQ(got.rounded_dkv[i], to_bfloat16(got.dkv[i])) << "rounded dk | dv " << i;
  if (c.statistics_only) {  // nothing past the statistics, [B, H, Tq, 2]
    const size_t kept = size_t(kBatch * kHeads * c.query_len * 2);
    EXPECT_TRUE(
        std::all_of(got.probs.begin() + kept, got.probs.end(), [](float x) { return x == 7.f; }));
  }
  if (c.statistics_only) {  // the weights stored and read instead: the same bits
    const Results stored = run_with(false);
    EXPECT_EQ(stored.out, got.out);
    EXPECT_EQ(stored.dq, got.dq);
    EXPECT_EQ(stored.dkv, got.dkv);
  }
}

// Blocks of 32, 48, 64, 96 and 128 rows (rows_of_blocks: 7 × 9, 20 × 30, 32 × 32 and 17 × 25
// take 32; 40 × 45, 48; 37 × 50 and 64 × 64, 64; 80 × 96 and 90 × 70, 96), and tiles of 64 beyond;
// Q, K, V and dO as floats rounded at load and in bfloat16; the weights stored, or the rows'
// statistics the backward rebuilds them from; causal, window and offset masks, queries and keys of
// lengths that fill no tile; Q in the rows of a stacked Q|K|V.
INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionInRegistersEmulated,
    ::testing::Values(
        Case{32, 32, true, -1, 0, true, true, true}, Case{17, 25, false, 4, 0, false, false},
        Case{40, 45, true, -1, 3, true, true, true}, Case{80, 96, false, 20, 0, false, false},
        Case{90, 70, true, -1, 4, true, true}, Case{64, 64, true, -1, 0, true, true, true},
        Case{37, 50, false, -1, 0, false, false}, Case{7, 9, false, 2, 0, false, true},
        Case{20, 30, true, -1, 5, true, false}, Case{100, 77, false, -1, 0, true, true, true},
        Case{50, 120, false, 9, 0, false, true}, Case{150, 200, true, -1, 40, true, true, true},
        Case{129, 70, false, 30, 0, false, false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "Tq" + std::to_string(c.query_len) + "Tk" + std::to_string(c.key_len) +
             (c.causal ? "Causal" : "") +
             (c.window >= 0 ? "Window" + std::to_string(c.window) : std::string()) +
             (c.query_offset ? "Offset" + std::to_string(c.query_offset) : std::string()) +
             (c.bfloat16_inputs ? "BFloat16Inputs" : "FloatInputs") +
             (c.statistics_only ? "Rebuilt" : "Stored") + (c.wide_q_rows ? "WideQRows" : "");
    });

}  // namespace
}  // namespace cuda
}  // namespace tfm
