// attention_scaling_bench: the complexity column of the paper's Table 1, measured. Forward time
// of one encoder self-attention layer (d_model 512, 8 heads, one sequence of n positions, the
// inference path: no weights kept) for n = 64 … max, with full attention (O(n²·d)) and with
// restricted attention over a window of w neighbours (O(w·n·d)), plus a recurrent layer
// h_t = tanh(W_x x_t + W_h h_{t−1} + b) on the same input (O(n·d²), n sequential steps) as the
// reference row of Table 1. Each is timed for the whole layer (projections included) and for
// its core alone: the attention between projected Q, K, V, or the recurrence after the input
// product. One JSON line per (n, variant); bench/run_attention_scaling.sh fits the log–log
// slopes, runs PyTorch beside it and draws the plot.
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "bench_util.h"
#include "model/linear.h"
#include "model/multi_head_attention.h"

namespace {

constexpr const char* kUsage =
    "usage: attention_scaling_bench [--max-n N] [--window W] [--d-model D] [--heads H]\n"
    "                               [--min-centis C]\n"
    "  --max-n N        largest sequence length (default 4096; lengths 64, 128, … up to N)\n"
    "  --window W       restricted attention: position i sees j with |i − j| <= W (default 32)\n"
    "  --d-model D      model width (default 512)\n"
    "  --heads H        attention heads (default 8)\n"
    "  --min-centis C   time each case for at least C/100 s, 3 repetitions or more (default 30)\n";

struct Options {
  int64_t max_n = 4096, window = 32, d_model = 512, heads = 8, min_centis = 30;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--max-n") {
      o.max_n = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--window") {
      o.window = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--d-model") {
      o.d_model = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--heads") {
      o.heads = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--min-centis") {
      o.min_centis = bench::int_arg(argc, argv, i, kUsage);
    } else {
      bench::usage_error(kUsage, "unknown option " + a);
    }
  }
  if (o.max_n < 64 || o.d_model < 1 || o.heads < 1 || o.d_model % o.heads)
    bench::usage_error(kUsage, "need --max-n >= 64 and --heads dividing --d-model");
  return o;
}

int run(const Options& o) {
  const int64_t d = o.d_model;
  tfm::Random random(7);
  const float weight_scale = 1.f / std::sqrt(float(d));
  std::vector<std::vector<float>> weights;  // q, k, v, o of attention; W_x, W_h of the RNN
  for (int i = 0; i < 6; ++i) weights.push_back(bench::random_values(random, d * d, weight_scale));
  const std::vector<float> bias = bench::random_values(random, d, 0.1f);
  auto linear = [&](int i) {
    tfm::LinearWeights w;
    w.weight = weights[size_t(i)].data();
    w.bias = bias.data();
    w.in = w.out = d;
    return w;
  };
  tfm::AttentionWeights attention;
  attention.q = linear(0), attention.k = linear(1), attention.v = linear(2),
  attention.o = linear(3);
  const double min_seconds = double(o.min_centis) / 100.0;
  // W_h, packed once: the recurrence multiplies one row by it per step.
  const tfm::PackedMatrix recurrent_weight({weights[5].data()}, {d}, d);

  for (int64_t n = 64; n <= o.max_n; n *= 2) {
    const std::vector<float> x = bench::random_values(random, n * d, 1.f);  // [n, D] layer input
    std::vector<float> out(size_t(n * d));                                  // [n, D]
    // Projected Q, K, V for the core-only timings.
    std::vector<float> q(size_t(n * d)), k(size_t(n * d)), v(size_t(n * d));  // [n, D] each
    tfm::linear_forward(tfm::cpu_backend(), attention.q, x.data(), n, q.data());
    tfm::linear_forward(tfm::cpu_backend(), attention.k, x.data(), n, k.data());
    tfm::linear_forward(tfm::cpu_backend(), attention.v, x.data(), n, v.data());

    for (int64_t window : {int64_t(-1), o.window}) {
      tfm::AttentionInputs in;
      in.query_input = in.memory_input = x.data();
      in.batch = 1;
      in.query_len = in.key_len = n;
      in.mask.window = window;
      tfm::AttentionCache cache;
      cache.keep_weights = false;  // inference: streamed, nothing n×n kept
      const double layer = bench::time_for_at_least(
          [&] {
            tfm::multi_head_attention_forward(tfm::cpu_backend(), attention, o.heads, in, cache,
                                              out.data());
          },
          min_seconds);
      tfm::AttentionShape shape;
      shape.batch = 1;
      shape.heads = o.heads;
      shape.query_len = shape.key_len = n;
      shape.head_dim = d / o.heads;
      shape.q_row_stride = shape.k_row_stride = shape.v_row_stride = shape.out_row_stride = d;
      const double core = bench::time_for_at_least(
          [&] {
            tfm::attention_forward(shape, in.mask, q.data(), k.data(), v.data(), nullptr,
                                   out.data());
          },
          min_seconds);
      std::cout << nlohmann::json{{"variant", window < 0 ? "full" : "restricted"},
                                  {"n", n},
                                  {"window", window},
                                  {"layer_s", layer},
                                  {"core_s", core}}
                       .dump()
                << std::endl;
    }

    // Recurrent reference: the input product is one GEMM; the recurrence is n dependent steps.
    std::vector<float> pre(size_t(n * d)), hidden(size_t((n + 1) * d), 0.f);  // [n, D], [n+1, D]
    auto recurrence = [&] {
      for (int64_t t = 0; t < n; ++t) {
        float* h = hidden.data() + (t + 1) * d;
        recurrent_weight.multiply(hidden.data() + t * d, 1, d, h, d);  // W_h h_{t-1}
        for (int64_t c = 0; c < d; ++c) h[c] = std::tanh(h[c] + pre[size_t(t * d + c)]);
      }
    };
    const double rnn_layer = bench::time_for_at_least(
        [&] {
          tfm::gemm(false, true, n, d, d, 1.f, x.data(), d, weights[4].data(), d, 0.f, pre.data(),
                    d);
          tfm::add_bias(pre.data(), bias.data(), n, d);
          recurrence();
        },
        min_seconds);
    const double rnn_core = bench::time_for_at_least(recurrence, min_seconds);
    std::cout << nlohmann::json{{"variant", "recurrent"},
                                {"n", n},
                                {"window", nullptr},
                                {"layer_s", rnn_layer},
                                {"core_s", rnn_core}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main(argc, argv, parse_options, run);
}
