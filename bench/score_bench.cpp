// score_bench: times teacher-forced scoring (tfm::score_forward, exactly what `transformer score`
// computes) of the paper's base model on one fixed batch, so that bench/run_score_bench.sh can
// compare it with a PyTorch implementation (bench/score_peer.py) in the same run
// (docs/performance.md, "How we measure").
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

#include "backend/cpu/gemm.h"
#include "bench_util.h"
#include "io/model_file.h"
#include "model/config.h"
#include "model/init.h"
#include "model/prepared_weights.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace {

using bench::median;
using bench::now_seconds;
using bench::Sentences;
using bench::time_median;

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
  tfm::Precision precision = tfm::Precision::kFloat32;  // --compute-type
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
    "  --compute-type T     float32 (default), bfloat16 or int8 (score --compute-type)\n"
    "Threads: OMP_NUM_THREADS (default 2).\n";

[[noreturn]] void usage_error(const std::string& message) {
  bench::usage_error(kUsage, message);
}

Options parse_options(int argc, char** argv) {
  Options o;
  auto int_value = [&](int& i) { return bench::int_arg(argc, argv, i, kUsage); };
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
    } else if (a == "--compute-type") {
      o.precision = bench::precision_arg(argc, argv, i, kUsage);
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
    best = std::max(best, bench::gemm_gflops(s.m, s.n, s.k, /*trans_b=*/true, 5));
  }
  return best;
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
    sources = bench::read_ids(source_path, "run without --reuse first");
    targets = bench::read_ids(target_path, "run without --reuse first");
  } else {
    std::filesystem::create_directories(dir);
    tfm::ModelConfig config = tfm::preset_config("base");
    config.src_vocab_size = config.tgt_vocab_size = o.vocab;
    model.emplace(tfm::init_model(config, o.seed, tfm::cpu_backend()));
    tfm::save_model(*model, model_path);
    tfm::Random random(o.seed + 1);
    sources = bench::random_sentences(random, o.batch, o.src_len, o.vocab);
    targets = bench::random_sentences(random, o.batch, o.tgt_len, o.vocab);
    bench::write_ids(source_path, sources);
    bench::write_ids(target_path, targets);
    if (o.prepare_only) {
      std::cerr << "wrote " << model_path << " (" << tfm::parameter_count(config)
                << " parameters), " << source_path << ", " << target_path << "\n";
      return 0;
    }
  }
  // Scored as `transformer score` scores: the file read for inference in this compute type
  // only (int8 weights held in int8, every weight freed once prepared), so the peak RSS is what
  // a user sees.
  model.reset();
  model.emplace(
      tfm::load_model(model_path, tfm::cpu_backend(), tfm::model_weights_for(o.precision)));
  model->set_inference_only(o.precision);
  const double load_seconds = now_seconds() - load_start;
  const tfm::ModelConfig& config = model->config();
  const tfm::TokenBatch batch = tfm::make_batch(config, sources, targets);

  // The activations planned for the batch's shape and allocated as one block, as the score
  // command does before its first batch.
  const tfm::Precision precision = o.precision;
  tfm::ScoringWorkspace ws;
  tfm::plan_score_forward(*model, tfm::shape_of(batch), ws, precision);
  ws.memory.allocate(model->backend(), ws.plan);
  std::vector<float> token_logprobs;  // [B, T] log p(target + eos)
  auto score = [&] { tfm::score_forward(*model, batch, ws, token_logprobs, precision); };
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
    std::shared_ptr<const tfm::PreparedWeights> hold;
    const tfm::TransformerWeights& prepared = model->sequence_weights(precision, hold);
    const double encoder = time_median(
        0, o.phase_repeats, [&] { tfm::encoder_forward(*model, prepared, batch, {}, ws.cache); },
        nullptr);
    const double decoder = time_median(
        0, o.phase_repeats, [&] { tfm::decoder_forward(*model, prepared, batch, {}, ws.cache); },
        nullptr);
    phases = {{"encoder_s", encoder},
              {"decoder_s", decoder},
              {"projection_s", std::max(0.0, median_seconds - encoder - decoder)}};
  }

  const double rss_mib = bench::peak_rss_mib();  // before the GEMM probe's own buffers
  const double flops =
      score_flops(config, double(batch.batch), double(batch.src_len), double(batch.tgt_len));
  const double gemm_peak = measure_gemm_peak(config, batch.batch * batch.tgt_len);

  nlohmann::json line =
      bench::common_fields(median_seconds, all_seconds, target_tokens, rss_mib, flops, gemm_peak);
  line.update({
      {"batch", batch.batch},
      {"src_len", batch.src_len},
      {"tgt_len", batch.tgt_len},
      {"target_tokens", target_tokens},
      {"warmup", o.warmup},
      {"repeats", o.repeats},
      {"load_s", load_seconds},
      {"compute_type", tfm::precision_name(o.precision)},
      {"phases", phases},
      {"totals", totals},
  });
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main(argc, argv, parse_options, run);
}
