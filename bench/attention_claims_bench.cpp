// attention_claims_bench: the measurements behind bench/run_attention_claims.sh, which checks the
// paper's claims about attention (§3.2.1, §3.2.2). Three modes, one JSON line per case:
//   --mode speed --kind K --n N --d-k D   one attention function (one sequence, one head of size
//       d_k: Attention(Q, K, V) itself) with scaled dot-product or additive scores: forward time
//       (inference path) and forward+backward time (training path, weights kept), and the peak
//       live heap above the Q, K, V inputs in each. One case per process, so the peak includes
//       every buffer the case allocated (the kernels' per-thread scratch too).
//   --mode variance   random q, k with unit-variance components at d_k = 16 … 512: the variance
//       of q·k, and for scaled dot, unscaled dot and additive scores the softmax's entropy, its
//       largest weight, the share of the gradient it passes on (‖∂L/∂logits‖ / ‖∂L/∂weights‖)
//       and the gradient norm that reaches the queries.
//   --mode heads   one multi-head attention layer (projections included) at d_model 256 with
//       h = 1 … 16 heads: forward and forward+backward time and the FLOPs of each part.
#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "bench_util.h"
#include "model/linear.h"
#include "model/multi_head_attention.h"

// Live heap bytes (and their peak) of every operator new in this process: what `speed` reports.
namespace {
std::atomic<int64_t> live_bytes{0}, peak_bytes{0};

void* counted_alloc(size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  const int64_t now = live_bytes += int64_t(malloc_usable_size(p));
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void counted_free(void* p) {
  if (!p) return;
  live_bytes -= int64_t(malloc_usable_size(p));
  std::free(p);
}
}  // namespace

void* operator new(size_t n) {
  return counted_alloc(n);
}
void* operator new[](size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  counted_free(p);
}
void operator delete[](void* p) noexcept {
  counted_free(p);
}
void operator delete(void* p, size_t) noexcept {
  counted_free(p);
}
void operator delete[](void* p, size_t) noexcept {
  counted_free(p);
}

namespace {

constexpr const char* kUsage =
    "usage: attention_claims_bench --mode speed --kind scaled_dot|additive --n N --d-k D\n"
    "       attention_claims_bench --mode variance\n"
    "       attention_claims_bench --mode heads\n"
    "  --min-centis C   time each case for at least C/100 s, 3 repetitions or more (default 20)\n";

struct Options {
  std::string mode, kind = "scaled_dot";
  int64_t n = 0, d_k = 0, min_centis = 20;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto text = [&]() -> std::string {
      if (i + 1 >= argc) bench::usage_error(kUsage, a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--mode") {
      o.mode = text();
    } else if (a == "--kind") {
      o.kind = text();
    } else if (a == "--n") {
      o.n = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--d-k") {
      o.d_k = bench::int_arg(argc, argv, i, kUsage);
    } else if (a == "--min-centis") {
      o.min_centis = bench::int_arg(argc, argv, i, kUsage);
    } else {
      bench::usage_error(kUsage, "unknown option " + a);
    }
  }
  if (o.mode != "speed" && o.mode != "variance" && o.mode != "heads")
    bench::usage_error(kUsage, "--mode must be speed, variance or heads");
  if (o.mode == "speed" &&
      (o.n < 1 || o.d_k < 1 || (o.kind != "scaled_dot" && o.kind != "additive")))
    bench::usage_error(kUsage, "speed needs --kind scaled_dot|additive, --n >= 1 and --d-k >= 1");
  return o;
}

// Each head's additive vector, Xavier-uniform as init_model draws it: U(±sqrt(6/(d_k+1))).
std::vector<float> additive_vectors(tfm::Random& random, int64_t heads, int64_t d_k) {
  std::vector<float> v(size_t(heads * d_k));
  const float bound = std::sqrt(6.f / float(d_k + 1));
  for (float& x : v) x = random.uniform(-bound, bound);
  return v;
}

tfm::AttentionShape one_head(int64_t n, int64_t d_k, tfm::AttentionScore score) {
  tfm::AttentionShape s;
  s.batch = s.heads = 1;
  s.query_len = s.key_len = n;
  s.head_dim = s.q_row_stride = s.k_row_stride = s.v_row_stride = s.out_row_stride = d_k;
  s.score = score;
  return s;
}

int run_speed(const Options& o) {
  const int64_t n = o.n, d = o.d_k;
  tfm::Random random(11);
  const bool additive = o.kind == "additive";
  const int64_t before_inputs = live_bytes;
  const auto q = bench::random_values(random, n * d, 1.f);      // [n, d_k]
  const auto k = bench::random_values(random, n * d, 1.f);      // [n, d_k]
  const auto v = bench::random_values(random, n * d, 1.f);      // [n, d_k]
  const auto additive_v = additive_vectors(random, 1, d);       // [1, d_k]
  const auto d_out = bench::random_values(random, n * d, 1.f);  // [n, d_k]
  const int64_t inputs = live_bytes;
  const tfm::AttentionShape s =
      one_head(n, d,
               {additive ? tfm::AttentionScoring::kAdditive : tfm::AttentionScoring::kScaledDot,
                additive_v.data()});
  const tfm::AttentionMask mask;
  const double min_seconds = double(o.min_centis) / 100.0;

  // Forward, inference path: no weights kept, keys streamed.
  peak_bytes = live_bytes.load();
  std::vector<float> out(size_t(n * d));  // [n, d_k]
  auto forward = [&] {
    tfm::attention_forward(s, mask, q.data(), k.data(), v.data(), nullptr, out.data());
  };
  forward();
  const int64_t forward_peak = peak_bytes - inputs;
  const double forward_s = bench::time_for_at_least(forward, min_seconds);

  // Forward + backward, training path: the weights [n, n] kept for the backward pass.
  peak_bytes = live_bytes.load();
  std::vector<float> probs(size_t(n * n));                                     // [n, n]
  std::vector<float> dq(size_t(n * d)), dk(size_t(n * d)), dv(size_t(n * d));  // [n, d_k] each
  std::vector<float> d_additive_v(static_cast<size_t>(d));                     // [1, d_k]
  auto training = [&] {
    tfm::attention_forward(s, mask, q.data(), k.data(), v.data(), probs.data(), out.data());
    tfm::attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), {}, d_out.data(),
                            dq.data(), dk.data(), dv.data(), d_additive_v.data());
  };
  training();
  const int64_t training_peak = peak_bytes - inputs;
  const double training_s = bench::time_for_at_least(training, min_seconds);
  std::cout << nlohmann::json{{"mode", "speed"},
                              {"kind", o.kind},
                              {"n", n},
                              {"d_k", d},
                              {"forward_s", forward_s},
                              {"forward_backward_s", training_s},
                              {"forward_peak_bytes", forward_peak},
                              {"forward_backward_peak_bytes", training_peak},
                              {"input_bytes", inputs - before_inputs},
                              // what an implementation that builds tanh(q_i + k_j) for every pair
                              // at once (and keeps it for backward, as autograd does) would hold
                              {"materialised_bytes", additive ? n * n * d * 4 : n * n * 4}}
                   .dump()
            << std::endl;
  return 0;
}

// Mean over rows of the softmax entropy (nats) and of the largest weight; probs [rows, cols].
void row_statistics(const std::vector<float>& probs, int64_t rows, int64_t cols, double* entropy,
                    double* top) {
  double e = 0, m = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double row_entropy = 0, row_top = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double p = probs[size_t(r * cols + c)];
      if (p > 0) row_entropy -= p * std::log(p);
      row_top = std::max(row_top, p);
    }
    e += row_entropy;
    m += row_top;
  }
  *entropy = e / double(rows);
  *top = m / double(rows);
}

int run_variance(const Options&) {
  const int64_t queries = 512, keys = 64;
  for (int64_t d = 16; d <= 512; d *= 2) {
    tfm::Random random(uint64_t(100 + d));
    const auto q = bench::random_values(random, queries * d, 1.f);      // [queries, d_k]
    const auto k = bench::random_values(random, keys * d, 1.f);         // [keys, d_k]
    const auto v = bench::random_values(random, keys * d, 1.f);         // [keys, d_k]
    const auto d_out = bench::random_values(random, queries * d, 1.f);  // [queries, d_k]
    const auto additive_v = additive_vectors(random, 1, d);             // [1, d_k]
    // The raw dot products' sample variance (expected: d_k).
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < queries; ++i)
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(q[size_t(i * d + c)]) * k[size_t(j * d + c)];
        sum += dot;
        sum_sq += dot * dot;
      }
    const double count = double(queries * keys), mean = sum / count;
    const double variance = sum_sq / count - mean * mean;
    for (auto [kind, name] : {std::pair{tfm::AttentionScoring::kScaledDot, "scaled_dot"},
                              {tfm::AttentionScoring::kDot, "dot"},
                              {tfm::AttentionScoring::kAdditive, "additive"}}) {
      tfm::AttentionShape s = one_head(queries, d, {kind, additive_v.data()});
      s.key_len = keys;
      std::vector<float> probs(size_t(queries * keys)), out(size_t(queries * d));
      tfm::attention_forward(s, {}, q.data(), k.data(), v.data(), probs.data(), out.data());
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()),
          d_additive(static_cast<size_t>(d));
      tfm::attention_backward(s, {}, q.data(), k.data(), v.data(), probs.data(), {}, d_out.data(),
                              dq.data(), dk.data(), dv.data(), d_additive.data());
      double entropy, top, gradient = 0, logit_gradient = 0;
      row_statistics(probs, queries, keys, &entropy, &top);
      // The gradient at the softmax's input: dS = P ⊙ (dP − Σ_j P·dP), dP = dO·Vᵀ. Saturated
      // rows (one weight near 1) give dS near 0 whatever dO is: §3.2.1's "extremely small
      // gradients".
      for (int64_t i = 0; i < queries; ++i) {
        std::vector<double> dp(static_cast<size_t>(keys));
        double weighted = 0, norm_sq = 0, upstream_sq = 0;
        for (int64_t j = 0; j < keys; ++j) {
          for (int64_t c = 0; c < d; ++c)
            dp[size_t(j)] += double(d_out[size_t(i * d + c)]) * v[size_t(j * d + c)];
          weighted += probs[size_t(i * keys + j)] * dp[size_t(j)];
          upstream_sq += dp[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < keys; ++j) {
          const double ds = probs[size_t(i * keys + j)] * (dp[size_t(j)] - weighted);
          norm_sq += ds * ds;
        }
        // The fraction of the gradient at the weights (‖dP‖) that the softmax passes on.
        logit_gradient += std::sqrt(norm_sq / upstream_sq);
      }
      for (int64_t i = 0; i < queries; ++i) {
        double norm_sq = 0;
        for (int64_t c = 0; c < d; ++c)
          norm_sq += double(dq[size_t(i * d + c)]) * dq[size_t(i * d + c)];
        gradient += std::sqrt(norm_sq);
      }
      std::cout << nlohmann::json{{"mode", "variance"},
                                  {"d_k", d},
                                  {"kind", name},
                                  {"dot_variance", variance},
                                  {"keys", keys},
                                  {"entropy", entropy},
                                  {"max_entropy", std::log(double(keys))},
                                  {"top_weight", top},
                                  {"softmax_gradient_ratio", logit_gradient / double(queries)},
                                  {"query_gradient_norm", gradient / double(queries)}}
                       .dump()
                << std::endl;
    }
  }
  return 0;
}

int run_heads(const Options& o) {
  const int64_t d = 256;  // the small preset's d_model
  const double min_seconds = double(o.min_centis) / 100.0;
  tfm::Random random(21);
  std::vector<std::vector<float>> weights;  // q, k, v, o: [d, d] each
  for (int i = 0; i < 4; ++i) weights.push_back(bench::random_values(random, d * d, 0.0625f));
  const std::vector<float> bias(size_t(d), 0.f);                                    // [d]
  std::vector<std::vector<float>> gradients(4, std::vector<float>(size_t(d * d)));  // [d, d]
  std::vector<float> bias_gradient(size_t(4 * d));                                  // [4, d]
  auto linear = [&](int i) {
    tfm::LinearWeights w;
    w.weight = weights[size_t(i)].data();
    w.bias = bias.data();
    w.in = w.out = d;
    return w;
  };
  auto linear_gradient = [&](int i) {
    tfm::Linear<float> g;
    g.weight = gradients[size_t(i)].data();
    g.bias = bias_gradient.data() + i * d;
    g.in = g.out = d;
    return g;
  };
  tfm::AttentionWeights w;
  w.q = linear(0), w.k = linear(1), w.v = linear(2), w.o = linear(3);
  tfm::Attention<float> g;
  g.q = linear_gradient(0), g.k = linear_gradient(1), g.v = linear_gradient(2),
  g.o = linear_gradient(3);
  struct Shape {
    int64_t batch, n;
  };
  for (const Shape shape : {Shape{64, 32}, Shape{8, 256}}) {  // 2048 positions each
    const int64_t rows = shape.batch * shape.n;
    const auto x = bench::random_values(random, rows * d, 1.f);       // [B, n, d]
    const auto d_out = bench::random_values(random, rows * d, 1.f);   // [B, n, d]
    std::vector<float> out(size_t(rows * d)), d_x(size_t(rows * d));  // [B, n, d] each
    for (int64_t heads : {1, 2, 4, 8, 16}) {
      tfm::AttentionInputs in;
      in.query_input = in.memory_input = x.data();
      in.batch = shape.batch;
      in.query_len = in.key_len = shape.n;
      tfm::AttentionCache cache;
      tfm::BackwardScratch scratch;
      auto forward = [&] {
        tfm::multi_head_attention_forward(tfm::cpu_backend(), w, heads, in, cache, out.data());
      };
      auto training = [&] {
        forward();
        tfm::multi_head_attention_backward(tfm::cpu_backend(), w, g, heads, in, cache, d_out.data(),
                                           nullptr, scratch, d_x.data(), false, d_x.data());
      };
      const double forward_s = bench::time_for_at_least(forward, min_seconds);
      const double training_s = bench::time_for_at_least(training, min_seconds);
      // Forward FLOPs: 4 projections (2·rows·d² each); Q·Kᵀ and P·V (2·B·n²·d each, whatever
      // the heads); the softmax (about 5 operations per weight: B·h·n² weights).
      const double projections = 4.0 * 2 * double(rows) * d * d;
      const double products = 2.0 * 2 * double(shape.batch) * shape.n * shape.n * d;
      const double softmax = 5.0 * double(shape.batch) * heads * shape.n * shape.n;
      std::cout << nlohmann::json{{"mode", "heads"},
                                  {"batch", shape.batch},
                                  {"n", shape.n},
                                  {"d_model", d},
                                  {"heads", heads},
                                  {"d_k", d / heads},
                                  {"forward_s", forward_s},
                                  {"forward_backward_s", training_s},
                                  {"projection_flops", projections},
                                  {"attention_product_flops", products},
                                  {"softmax_flops", softmax},
                                  {"weights_bytes", shape.batch * heads * shape.n * shape.n * 4}}
                       .dump()
                << std::endl;
    }
  }
  return 0;
}

int run(const Options& o) {
  if (o.mode == "speed") return run_speed(o);
  if (o.mode == "variance") return run_variance(o);
  return run_heads(o);
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main(argc, argv, parse_options, run);
}
