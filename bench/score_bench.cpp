// score_bench: times teacher-forced scoring (tfm::score_forward, exactly what `transformer score`
// computes) of the paper's base model on one fixed batch, so that bench/run_score_bench.sh can
// compare it with a PyTorch implementation (bench/score_peer.py) in the same run (DESIGN.md §6).
//
// It writes the model and the batch's token ids into a work directory for the peer, then prints
// one JSON line: target tokens/s, median seconds, peak RSS, the measured GEMM peak and MFU,
// a rough per-phase split, and the per-sentence totals of the first sentences (cross-check).
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "model/config.h"
#include "model/init.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace {

using Sentences = std::vector<std::vector<int32_t>>;

struct Options {
  std::string work_dir;
  int batch = 32;
  int src_len = 32;
  int tgt_len = 32;
  int vocab = 8000;
  int warmup = 1;
  int repeats = 10;
  int phase_repeats = 3;  // 0: skip the per-phase split
  int show_totals = 3;
  uint64_t seed = 1234;
  bool reuse = false;         // load model + ids written by an earlier run
  bool prepare_only = false;  // write model + ids, time nothing
};

const char* kUsage =
    "usage: score_bench --work-dir DIR [options]\n"
    "Times tfm::score_forward on the base model (shared 8000-token vocabulary) and one fixed\n"
    "batch; writes DIR/model.safetensors, DIR/source.ids, DIR/target.ids for the PyTorch peer.\n"
    "  --work-dir DIR       where the model and id files go (created if missing)\n"
    "  --repeats N          timed repetitions after warm-up (default 10)\n"
    "  --warmup N           untimed repetitions first (default 1)\n"
    "  --phase-repeats N    repetitions for the encoder/decoder/projection split (default 3, 0 = "
    "off)\n"
    "  --batch N --src-len N --tgt-len N --vocab N   batch shape (default 32, 32, 32, 8000)\n"
    "  --seed N             model and batch seed (default 1234)\n"
    "  --prepare-only       write the model and ids, then exit\n"
    "  --reuse              load the model and ids already in DIR (what `transformer score` does)\n"
    "Threads: OMP_NUM_THREADS (default 2).\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "error: " << message << "\n" << kUsage;
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  auto int_value = [&](int& i) -> long long {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value");
    const std::string text = argv[++i];
    try {
      size_t used = 0;
      const long long v = std::stoll(text, &used);
      if (used != text.size() || v < 0) throw std::invalid_argument(text);
      return v;
    } catch (const std::exception&) {
      usage_error(std::string(argv[i - 1]) + " expects a non-negative integer, got \"" + text +
                  "\"");
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--work-dir") {
      if (i + 1 >= argc) usage_error("--work-dir needs a value");
      o.work_dir = argv[++i];
    } else if (a == "--repeats") {
      o.repeats = int(int_value(i));
    } else if (a == "--warmup") {
      o.warmup = int(int_value(i));
    } else if (a == "--phase-repeats") {
      o.phase_repeats = int(int_value(i));
    } else if (a == "--batch") {
      o.batch = int(int_value(i));
    } else if (a == "--src-len") {
      o.src_len = int(int_value(i));
    } else if (a == "--tgt-len") {
      o.tgt_len = int(int_value(i));
    } else if (a == "--vocab") {
      o.vocab = int(int_value(i));
    } else if (a == "--seed") {
      o.seed = uint64_t(int_value(i));
    } else if (a == "--reuse") {
      o.reuse = true;
    } else if (a == "--prepare-only") {
      o.prepare_only = true;
    } else {
      usage_error("unknown argument \"" + a + "\"");
    }
  }
  if (o.work_dir.empty()) usage_error("--work-dir is required");
  if (o.repeats < 1) usage_error("--repeats must be at least 1");
  if (o.batch < 1 || o.src_len < 1 || o.tgt_len < 1) usage_error("batch shape must be positive");
  if (o.vocab < 4) usage_error("--vocab must be at least 4");
  return o;
}

// Deterministic ids in [3, vocab): 0..2 are pad, bos, eos.
Sentences random_sentences(tfm::Random& random, int count, int length, int vocab) {
  Sentences out(size_t(count), std::vector<int32_t>(size_t(length), 0));
  for (auto& sentence : out)
    for (auto& id : sentence) id = int32_t(3 + random.next_u64() % uint64_t(vocab - 3));
  return out;
}

void write_ids(const std::string& path, const Sentences& sentences) {
  std::ofstream f(path);
  for (const auto& s : sentences) {
    for (size_t i = 0; i < s.size(); ++i) f << (i ? " " : "") << s[i];
    f << "\n";
  }
  if (!f) throw tfm::Error(path + ": write failed");
}

Sentences read_ids(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw tfm::Error(path + ": cannot open (run without --reuse first)");
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

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of `repeats` calls of fn after `warmup` untimed calls.
double time_median(int warmup, int repeats, const std::function<void()>& fn,
                   std::vector<double>* all) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const double start = now_seconds();
    fn();
    seconds.push_back(now_seconds() - start);
  }
  if (all) *all = seconds;
  return median(seconds);
}

// Multiply-add FLOPs (2 per MAC) of the matrix products in one score_forward on a batch with
// no padding: projections, both attention products (full, causal masking not subtracted),
// feed-forward, and the vocabulary projection. Element-wise work is not counted.
double score_flops(const tfm::ModelConfig& c, double batch, double src_len, double tgt_len) {
  const double d = double(c.d_model), f = double(c.d_ff), v = double(c.tgt_vocab_size);
  const double src_rows = batch * src_len, tgt_rows = batch * tgt_len;
  const double encoder_layer = 2 * src_rows * 4 * d * d             // q, k, v, o
                               + 4 * batch * src_len * src_len * d  // QKᵀ and PV
                               + 2 * src_rows * 2 * d * f;          // fc1, fc2
  const double decoder_layer = 2 * tgt_rows * 4 * d * d             // self q, k, v, o
                               + 4 * batch * tgt_len * tgt_len * d  // self QKᵀ and PV
                               + 2 * tgt_rows * 2 * d * d           // cross q, o
                               + 2 * src_rows * 2 * d * d           // cross k, v on the memory
                               + 4 * batch * tgt_len * src_len * d  // cross QKᵀ and PV
                               + 2 * tgt_rows * 2 * d * f;          // fc1, fc2
  return double(c.encoder_layers) * encoder_layer + double(c.decoder_layers) * decoder_layer +
         2 * tgt_rows * d * v;
}

// Best GFLOP/s of tfm::gemm on the model's own GEMM shapes (y = x·Wᵀ), measured in this run.
double measure_gemm_peak(const tfm::ModelConfig& c, int64_t rows) {
  struct GemmShape {
    int64_t m, n, k;
  };
  const GemmShape shapes[] = {{rows, c.d_ff, c.d_model},             // fc1
                              {rows, c.d_model, c.d_ff},             // fc2
                              {rows, c.tgt_vocab_size, c.d_model}};  // vocabulary projection
  double best = 0;
  for (const auto& s : shapes) {
    std::vector<float> a(size_t(s.m * s.k), 0.01f);  // [m, k] activations
    std::vector<float> b(size_t(s.n * s.k), 0.02f);  // [n, k] weight, used transposed
    std::vector<float> out(size_t(s.m * s.n));       // [m, n]
    auto run = [&] {
      tfm::gemm(false, true, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.k, 0.f, out.data(),
                s.n);
    };
    std::vector<double> seconds;
    time_median(1, 5, run, &seconds);
    const double fastest = *std::min_element(seconds.begin(), seconds.end());
    best = std::max(best, 2.0 * double(s.m) * double(s.n) * double(s.k) / fastest / 1e9);
  }
  return best;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

int run(const Options& o) {
  const std::filesystem::path dir(o.work_dir);
  const std::string model_path = (dir / "model.safetensors").string();
  const std::string source_path = (dir / "source.ids").string();
  const std::string target_path = (dir / "target.ids").string();

  const double load_start = now_seconds();
  Sentences sources, targets;
  std::optional<tfm::Model> model;
  if (o.reuse) {
    model.emplace(tfm::load_model(model_path));
    sources = read_ids(source_path);
    targets = read_ids(target_path);
  } else {
    std::filesystem::create_directories(dir);
    tfm::ModelConfig config = tfm::preset_config("base");
    config.src_vocab_size = config.tgt_vocab_size = o.vocab;
    model.emplace(tfm::init_model(config, o.seed));
    tfm::save_model(*model, model_path);
    tfm::Random random(o.seed + 1);
    sources = random_sentences(random, o.batch, o.src_len, o.vocab);
    targets = random_sentences(random, o.batch, o.tgt_len, o.vocab);
    write_ids(source_path, sources);
    write_ids(target_path, targets);
    if (o.prepare_only) {
      std::cerr << "wrote " << model_path << " (" << tfm::parameter_count(config)
                << " parameters), " << source_path << ", " << target_path << "\n";
      return 0;
    }
  }
  const double load_seconds = now_seconds() - load_start;
  const tfm::ModelConfig& config = model->config();
  const tfm::TokenBatch batch = tfm::make_batch(config, sources, targets);

  tfm::StackCache ws;
  std::vector<float> token_logprobs;  // [B, T] log p(target + eos)
  auto score = [&] { tfm::score_forward(*model, batch, ws, token_logprobs); };
  std::vector<double> all_seconds;
  const double median_seconds = time_median(o.warmup, o.repeats, score, &all_seconds);

  int64_t target_tokens = 0;  // target + eos, what `transformer score` sums over
  for (int32_t n : batch.tgt_lengths) target_tokens += n;
  std::vector<double> totals;  // per sentence: sum of natural-log probabilities
  for (int64_t b = 0; b < std::min<int64_t>(o.show_totals, batch.batch); ++b) {
    double total = 0;
    for (int64_t t = 0; t < batch.tgt_len; ++t)
      total += token_logprobs[size_t(b * batch.tgt_len + t)];
    totals.push_back(total);
  }

  // Rough split: encoder and decoder stacks timed on their own; the vocabulary projection +
  // log-softmax is the rest of score_forward's median.
  nlohmann::json phases = nullptr;
  if (o.phase_repeats > 0) {
    const double encoder = time_median(
        0, o.phase_repeats, [&] { tfm::encoder_forward(*model, batch, {}, ws); }, nullptr);
    const double decoder = time_median(
        0, o.phase_repeats, [&] { tfm::decoder_forward(*model, batch, {}, ws); }, nullptr);
    phases = {{"encoder_s", encoder},
              {"decoder_s", decoder},
              {"projection_s", std::max(0.0, median_seconds - encoder - decoder)}};
  }

  const double rss_mib = peak_rss_mib();  // before the GEMM probe's own buffers
  const double flops =
      score_flops(config, double(batch.batch), double(batch.src_len), double(batch.tgt_len));
  const double gemm_peak = measure_gemm_peak(config, batch.batch * batch.tgt_len);
  const double achieved = flops / median_seconds / 1e9;

  nlohmann::json line = {
      {"impl", "transformer-cpp"},
      {"threads", omp_get_max_threads()},
      {"batch", batch.batch},
      {"src_len", batch.src_len},
      {"tgt_len", batch.tgt_len},
      {"target_tokens", target_tokens},
      {"warmup", o.warmup},
      {"repeats", o.repeats},
      {"median_s", median_seconds},
      {"min_s", *std::min_element(all_seconds.begin(), all_seconds.end())},
      {"tokens_per_s", double(target_tokens) / median_seconds},
      {"peak_rss_mib", rss_mib},
      {"load_s", load_seconds},
      {"gflop", flops / 1e9},
      {"gflops", achieved},
      {"gemm_peak_gflops", gemm_peak},
      {"mfu", achieved / gemm_peak},
      {"phases", phases},
      {"totals", totals},
  };
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(2);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
