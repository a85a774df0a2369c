// bench_util.h: the pieces score_bench, train_bench and decode_bench all need — option parsing
// helpers, wall-clock timing (median of repetitions), peak RSS and CPU time, the measured fp32
// GEMM peak the MFU is relative to, random id batches and their text files, the JSON fields every
// bench line carries, and main()'s thread default + error handling. They used to be copied into
// each program; one copy here keeps the three benchmarks measuring and reporting the same way.
// Header-only: each benchmark is a single translation unit.
#pragma once

#include <dnnl.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/compute_type.h"
#include "backend/cpu/gemm.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"
#include "tensor/random.h"

namespace bench {

using Sentences = std::vector<std::vector<int32_t>>;

// Prints "error: MESSAGE" and the usage text to stderr, exits with status 2.
[[noreturn]] inline void usage_error(const char* usage, const std::string& message) {
  std::cerr << "error: " << message << "\n" << usage;
  std::exit(2);
}

// --compute-type's value at argv[i + 1]; advances i past it. The CPU backend must support it.
inline tfm::Precision precision_arg(int argc, char** argv, int& i, const char* usage) {
  if (i + 1 >= argc) usage_error(usage, "--compute-type needs a value");
  const std::string type = argv[++i];
  tfm::Precision precision = tfm::Precision::kFloat32;
  if (!tfm::parse_precision(type, precision))
    usage_error(usage, "--compute-type is float32, bfloat16 or int8, not " + type);
  if (!tfm::cpu_backend().supports(precision))
    throw std::runtime_error("--compute-type " + type + ": this CPU cannot multiply in it");
  return precision;
}

// --compute-type of decoding (translate's names, int8_bfloat16 and the float16 ones included):
// the products' precision and the key/value cache's format. The device checks that it runs
// them (check_compute_type), once it is known.
inline void compute_type_arg(int argc, char** argv, int& i, const char* usage,
                             tfm::Precision& precision, tfm::CacheFormat& cache) {
  if (i + 1 >= argc) usage_error(usage, "--compute-type needs a value");
  const std::string type = argv[++i];
  if (!tfm::parse_compute_type(type, precision, cache))
    usage_error(usage,
                "--compute-type is float32, bfloat16, float16, int8, int8_bfloat16 or "
                "int8_float16, not " +
                    type);
}
// Throws where `backend` cannot run products in `precision` or keep a cache in `cache`
// (api/compute_type.h's rule, as translate applies it).
inline void check_compute_type(const tfm::Backend& backend, tfm::Precision precision,
                               tfm::CacheFormat cache) {
  const std::string why = tfm::unsupported_reason(tfm::ComputeType{precision, cache}, backend);
  if (!why.empty())
    throw std::runtime_error("--compute-type " + tfm::compute_type_name(precision, cache) + " " +
                             why);
}

// The non-negative integer value of option argv[i]; advances i past it.
inline long long int_arg(int argc, char** argv, int& i, const char* usage) {
  if (i + 1 >= argc) usage_error(usage, std::string(argv[i]) + " needs a value");
  const std::string text = argv[++i];
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v < 0) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    usage_error(usage,
                std::string(argv[i - 1]) + " expects a non-negative integer, got \"" + text + "\"");
  }
}

// Deterministic ids in [3, vocab): 0..2 are pad, bos, eos.
inline Sentences random_sentences(tfm::Random& random, int count, int length, int vocab) {
  Sentences out(size_t(count), std::vector<int32_t>(size_t(length), 0));
  for (auto& sentence : out)
    for (auto& id : sentence) id = int32_t(3 + random.next_u64() % uint64_t(vocab - 3));
  return out;
}

// One sentence per line, ids separated by spaces (what the Python peers read).
inline void write_ids(const std::string& path, const Sentences& sentences) {
  std::ofstream f(path);
  for (const auto& s : sentences) {
    for (size_t i = 0; i < s.size(); ++i) f << (i ? " " : "") << s[i];
    f << "\n";
  }
  if (!f) throw tfm::Error(path + ": write failed");
}

// missing_hint: what the error says to do when the file is absent, e.g. "run without --reuse
// first".
inline Sentences read_ids(const std::string& path, const std::string& missing_hint) {
  std::ifstream f(path);
  if (!f) throw tfm::Error(path + ": cannot open (" + missing_hint + ")");
  Sentences out;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    long long id;
    while (words >> id) ids.push_back(int32_t(id));
    out.push_back(std::move(ids));
  }
  return out;
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of `repeats` calls of fn after `warmup` untimed calls; every time in *all.
// after_warmup (if set) runs between the two: a profile restarted there covers the timed calls.
inline double time_median(int warmup, int repeats, const std::function<void()>& fn,
                          std::vector<double>* all,
                          const std::function<void()>& after_warmup = {}) {
  for (int i = 0; i < warmup; ++i) fn();
  if (after_warmup) after_warmup();
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const double start = now_seconds();
    fn();
    seconds.push_back(now_seconds() - start);
  }
  if (all) *all = seconds;
  return median(seconds);
}

// Median seconds of fn over at least 3 calls and min_seconds of calls, after one warm-up.
inline double time_for_at_least(const std::function<void()>& fn, double min_seconds) {
  fn();
  std::vector<double> seconds;
  double total = 0;
  while (seconds.size() < 3 || total < min_seconds) {
    const double start = now_seconds();
    fn();
    seconds.push_back(now_seconds() - start);
    total += seconds.back();
  }
  return median(seconds);
}

// n normally distributed values times scale.
inline std::vector<float> random_values(tfm::Random& random, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = random.normal() * scale;
  return v;
}

// GFLOP/s of the fastest of `repeats` calls of product (after one warm-up), an m×n×k product.
inline double fastest_gflops(int64_t m, int64_t n, int64_t k, int repeats,
                             const std::function<void()>& product) {
  std::vector<double> seconds;
  time_median(1, repeats, product, &seconds);
  const double fastest = *std::min_element(seconds.begin(), seconds.end());
  return 2.0 * double(m) * double(n) * double(k) / fastest / 1e9;
}

// GFLOP/s of the fastest of `repeats` tfm::gemm calls (after one warm-up) on an m×n×k product:
// a [m, k] times b, where b is [n, k] used transposed (trans_b, as y = x·Wᵀ) or [k, n].
inline double gemm_gflops(int64_t m, int64_t n, int64_t k, bool trans_b, int repeats,
                          tfm::Precision precision = tfm::Precision::kFloat32) {
  std::vector<float> a(size_t(m * k), 0.01f);
  std::vector<float> b(size_t(n * k), 0.02f);
  std::vector<float> out(size_t(m * n));
  const int64_t ldb = trans_b ? k : n;
  return fastest_gflops(m, n, k, repeats, [&] {
    tfm::gemm(false, trans_b, m, n, k, 1.f, a.data(), k, b.data(), ldb, 0.f, out.data(), n,
              precision);
  });
}

// Best GFLOP/s on an n×n×n product, measured in this process: the fp32 peak the MFU is relative
// to. tfm::gemm runs this shape on a oneDNN matmul primitive; dnnl_sgemm, oneDNN's other fp32
// kernel, is timed too and the faster one counts, so that the peak is oneDNN's best.
inline double measure_square_gemm_peak(int64_t n, int repeats) {
  std::vector<float> a(size_t(n * n), 0.01f), b(size_t(n * n), 0.02f), out(size_t(n * n));
  const double sgemm = fastest_gflops(n, n, n, repeats, [&] {
    dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, out.data(), n);
  });
  return std::max(sgemm, gemm_gflops(n, n, n, false, repeats));
}

// Best GFLOP/s of bfloat16 products (float32 accumulation) on an n×n×n product: a weight
// prepared once in bfloat16 (PackedMatrix, as training's and decoding's weights are) times float32
// rows, and tfm::gemm in bfloat16 (both operands rounded on each call); the faster counts.
inline double measure_square_gemm_peak_bfloat16(int64_t n, int repeats) {
  std::vector<float> a(size_t(n * n), 0.01f), w(size_t(n * n), 0.02f), out(size_t(n * n));
  const tfm::PackedMatrix packed({w.data()}, {n}, n, tfm::Precision::kBFloat16);
  const double prepared =
      fastest_gflops(n, n, n, repeats, [&] { packed.multiply(a.data(), n, n, out.data(), n); });
  return std::max(prepared, gemm_gflops(n, n, n, true, repeats, tfm::Precision::kBFloat16));
}

// User + system CPU seconds of this process so far (the run scripts compare them with the whole
// machine's busy time to see how much other processes took during the run).
inline double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

inline double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// The fields every bench JSON line has: implementation, threads, timing, throughput, memory,
// FLOPs and MFU. Callers add their own fields (nlohmann::json keeps keys sorted, so the dumped
// line does not depend on the order they are added in).
inline nlohmann::json common_fields(double median_seconds, const std::vector<double>& all_seconds,
                                    int64_t tokens, double rss_mib, double flops,
                                    double gemm_peak) {
  const double achieved = flops / median_seconds / 1e9;
  return {
      {"impl", "transformer-cpp"},
      {"threads", omp_get_max_threads()},
      {"median_s", median_seconds},
      {"min_s", *std::min_element(all_seconds.begin(), all_seconds.end())},
      {"tokens_per_s", double(tokens) / median_seconds},
      {"peak_rss_mib", rss_mib},
      {"gflop", flops / 1e9},
      {"gflops", achieved},
      {"gemm_peak_gflops", gemm_peak},
      {"mfu", achieved / gemm_peak},
  };
}

// main() of every bench: parse, default to 2 OpenMP threads, run, report exceptions (status 1).
template <typename Parse, typename Run>
int bench_main(int argc, char** argv, Parse parse, Run run) {
  const auto options = parse(argc, argv);
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(2);
  tfm::retain_freed_memory();  // as the transformer binary does
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace bench
