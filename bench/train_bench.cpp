// train_bench: times one full training step of the paper's base model — zero the gradients,
// tfm::loss_and_gradients (forward, label-smoothed cross-entropy, backward) and one Adam update —
// on a fixed batch, so that bench/run_train_bench.sh can compare it with the same step written in
// PyTorch (bench/train_peer.py) in the same run (docs/performance.md, "How we measure"). The
// training loop of `transformer train` does exactly these three things per step; this program
// isolates them from data loading, logging and checkpoints.
//
// With --batch-tokens it times a pass over several batches of varied lengths instead, grouped
// as `transformer train` groups a corpus (text/batching.h), and can write them for the peer to
// run the same batches (--write-batches).
//
// It prints one JSON line: median seconds per step (a pass, with --batch-tokens), target
// tokens/s, peak RSS, the model FLOPs of a step, the fp32 GEMM peak measured in this process and
// the resulting MFU, the step split into gradient zeroing / forward+backward / Adam, and with
// --profile the forward on its own (hence the backward) and the encoder / decoder / projection
// parts of the forward.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "bench_util.h"
#include "model/config.h"
#include "model/init.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "tensor/random.h"
#include "text/batching.h"
#include "train/loss.h"
#include "train/optimizer.h"

namespace {

using bench::median;
using bench::now_seconds;
using bench::Sentences;
using bench::time_median;

struct Options {
  int batch = 64;
  int src_len = 31;  // raw source tokens; the encoder sees src_len + 1 with eos
  int tgt_len = 31;  // raw target tokens; the decoder sees tgt_len + 1 with bos
  int vocab = 8000;
  int warmup = 2;
  int steps = 5;
  int phase_repeats = 3;  // repetitions of each --profile measurement
  int gemm_size = 2048;   // side of the square sgemm that defines the peak
  float dropout = 0.1f;
  float label_smoothing = 0.1f;
  uint64_t seed = 1234;
  std::string config_path;     // JSON config keys over the base model's; empty: the base model
  std::string device = "cpu";  // the backend (find_backend): cpu, cuda, cuda:N, auto
  bool profile = false;
  // Batches of varied lengths (batch_tokens > 0): about `batches` of them, grouped from random
  // pairs whose target lengths are uniform in [min_len, max_len] (source lengths 0.8 to 1.25
  // times theirs), written as JSON lines to write_batches where given.
  int64_t batch_tokens = 0;
  int min_len = 10, max_len = 100;
  int batches = 8;
  bool lengths_given = false, batches_given = false;  // either needs --batch-tokens
  std::string write_batches;
  tfm::Precision precision = tfm::Precision::kFloat32;  // of every linear product
};

const char* kUsage =
    "usage: train_bench [options]\n"
    "Times training steps (zero grads + tfm::loss_and_gradients + Adam) of the base model with a\n"
    "shared vocabulary on one fixed random batch (or a pass over batches of varied lengths:\n"
    "--batch-tokens); prints one JSON line.\n"
    "  --steps N            timed steps after warm-up (default 5)\n"
    "  --warmup N           untimed steps first (default 2)\n"
    "  --batch N --src-len N --tgt-len N   pairs and raw lengths, before eos/bos (default 64, 31, "
    "31)\n"
    "  --vocab N            shared vocabulary size (default 8000)\n"
    "  --config FILE        model config keys (docs/model-file.md) replacing the base model's\n"
    "  --gemm-size N        side of the square sgemm timed for the peak (default 2048)\n"
    "  --profile            also time the forward alone (loss only) to split forward from\n"
    "                       backward, and the encoder and decoder stacks on their own\n"
    "  --phase-repeats N    repetitions of each --profile measurement (default 3)\n"
    "  --seed N             model, batch and dropout seed (default 1234)\n"
    "  --device NAME        where the step runs: cpu (default), cuda, cuda:N, auto; on a GPU the\n"
    "                       step is timed to its completion and no CPU GEMM peak is measured\n"
    "  --compute-type T     float32 (default) or bfloat16: every linear product, forward and\n"
    "                       backward, as train --compute-type does\n"
    "  --batch-tokens N     batches of varied lengths instead of one fixed batch: random pairs\n"
    "                       grouped by length as train --batch-tokens N groups a corpus (padded\n"
    "                       source + target tokens a batch); a step is then a pass over them\n"
    "  --lengths MIN:MAX    their target lengths, uniform (sources 0.8 to 1.25 times as long;\n"
    "                       default 10:100)\n"
    "  --batches K          about how many batches (default 8)\n"
    "  --write-batches FILE the batches as JSON lines {\"src\": [[ids]], \"tgt\": [[ids]]}, raw\n"
    "                       ids without eos / bos, in the order timed (train_peer.py\n"
    "                       --batches-file runs the same)\n"
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
    } else if (a == "--steps") {
      o.steps = int(int_value(i));
    } else if (a == "--warmup") {
      o.warmup = int(int_value(i));
    } else if (a == "--batch") {
      o.batch = int(int_value(i));
    } else if (a == "--src-len") {
      o.src_len = int(int_value(i));
    } else if (a == "--tgt-len") {
      o.tgt_len = int(int_value(i));
    } else if (a == "--vocab") {
      o.vocab = int(int_value(i));
    } else if (a == "--gemm-size") {
      o.gemm_size = int(int_value(i));
    } else if (a == "--phase-repeats") {
      o.phase_repeats = int(int_value(i));
    } else if (a == "--seed") {
      o.seed = uint64_t(int_value(i));
    } else if (a == "--compute-type") {
      o.precision = bench::precision_arg(argc, argv, i, kUsage);
      if (o.precision == tfm::Precision::kInt8) usage_error("training runs in float32 or bfloat16");
    } else if (a == "--device") {
      if (i + 1 >= argc) usage_error("--device needs a name");
      o.device = argv[++i];
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--batch-tokens") {
      o.batch_tokens = int_value(i);
    } else if (a == "--lengths") {
      if (i + 1 >= argc) usage_error("--lengths needs MIN:MAX");
      const std::string value = argv[++i];
      const size_t colon = value.find(':');
      try {
        size_t used_min = 0, used_max = 0;
        if (colon == std::string::npos) throw std::invalid_argument(value);
        o.min_len = std::stoi(value.substr(0, colon), &used_min);
        o.max_len = std::stoi(value.substr(colon + 1), &used_max);
        if (used_min != colon || used_max != value.size() - colon - 1)
          throw std::invalid_argument(value);
        o.lengths_given = true;
      } catch (const std::exception&) {
        usage_error("--lengths needs MIN:MAX, two whole numbers, not \"" + value + "\"");
      }
    } else if (a == "--batches") {
      o.batches = int(std::min<long long>(int_value(i), 1'000'000));
      o.batches_given = true;
    } else if (a == "--write-batches") {
      if (i + 1 >= argc) usage_error("--write-batches needs a file");
      o.write_batches = argv[++i];
    } else if (a == "--config") {
      if (i + 1 >= argc) usage_error("--config needs a file");
      o.config_path = argv[++i];
    } else {
      usage_error("unknown argument \"" + a + "\"");
    }
  }
  if (o.steps < 1) usage_error("--steps must be at least 1");
  if (o.batch < 1 || o.src_len < 1 || o.tgt_len < 1) usage_error("batch shape must be positive");
  if (o.vocab < 4) usage_error("--vocab must be at least 4");
  if (o.gemm_size < 1) usage_error("--gemm-size must be positive");
  if (o.profile && o.phase_repeats < 1) usage_error("--phase-repeats must be at least 1");
  const bool varied = o.batch_tokens > 0;
  if (!varied && (o.lengths_given || o.batches_given || !o.write_batches.empty()))
    usage_error("--lengths, --batches and --write-batches go with --batch-tokens");
  if (varied) {
    if (o.min_len < 1 || o.max_len < o.min_len) usage_error("--lengths needs 1 <= MIN <= MAX");
    if (o.batches < 1 || o.batches > 1000) usage_error("--batches must be in [1, 1000]");
    if (o.batch_tokens > 10'000'000) usage_error("--batch-tokens must be at most 10,000,000");
    if (o.profile) usage_error("--profile times one fixed batch; leave out --batch-tokens");
  }
  return o;
}

// Multiply-add FLOPs (2 per MAC) of the matrix products of one forward pass on a batch without
// padding (S, T: encoder / decoder input lengths with eos / bos): every projection, both
// attention products (QKᵀ and PV, full: causal masking not subtracted), the feed-forward layers
// and the vocabulary projection. Element-wise work (softmax, layer norm, dropout, Adam) is not
// counted. The same count as score_bench's score_flops.
double forward_flops(const tfm::ModelConfig& c, double batch, double src_len, double tgt_len) {
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
         2 * tgt_rows * d * v;  // vocabulary projection (tied to the embedding)
}

// A training step's model FLOPs: 3× the forward products. Every product Y = X·W of the forward
// has two of the same size in the backward, dX = dY·Wᵀ and dW = Xᵀ·dY (the embedding is a
// parameter, so even the first layer needs dX); QKᵀ and PV likewise need both operands'
// gradients. The optimizer and element-wise work are not counted (the usual MFU convention).
double step_flops(const tfm::ModelConfig& c, double batch, double src_len, double tgt_len) {
  return 3.0 * forward_flops(c, batch, src_len, tgt_len);
}

// About o.batches batches of varied lengths, as `transformer train --batch-tokens` groups a
// corpus: random pairs (target lengths uniform in [min_len, max_len], each source 0.8 to 1.25
// times its target), enough to fill that many batches, grouped by text/batching.h in its
// shuffled order. Ids are uniform over the vocabulary's non-special ids.
tfm::ParallelCorpus varied_corpus(tfm::Random& random, const Options& o) {
  auto uniform = [&](int64_t low, int64_t high) {  // in [low, high]
    return low + int64_t(random.next_u64() % uint64_t(high - low + 1));
  };
  // A pair's padded tokens, about: its source, target and their end marks.
  const double pair_tokens = 2.25 * 0.5 * double(o.min_len + o.max_len) + 2;
  const int64_t pairs =
      std::max<int64_t>(1, int64_t(double(o.batches * o.batch_tokens) / pair_tokens));
  tfm::ParallelCorpus corpus;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t target_len = uniform(o.min_len, o.max_len);
    const int64_t source_len =
        std::max<int64_t>(1, (target_len * uniform(80, 125) + 50) / 100);  // 0.8 to 1.25 times
    std::vector<int32_t> source(static_cast<size_t>(source_len));
    std::vector<int32_t> target(static_cast<size_t>(target_len));
    for (auto& id : source) id = int32_t(uniform(3, o.vocab - 1));
    for (auto& id : target) id = int32_t(uniform(3, o.vocab - 1));
    corpus.sources.push_back(std::move(source));
    corpus.targets.push_back(std::move(target));
  }
  corpus.lines = pairs;
  return corpus;
}

// The batches as JSON lines, one a batch: {"src": [[ids]], "tgt": [[ids]]}, raw ids.
void write_batches(const std::string& path, const tfm::ParallelCorpus& corpus,
                   const tfm::BatchPlan& plan) {
  std::ofstream file(path);
  for (const auto& members : plan) {
    nlohmann::json line = {{"src", nlohmann::json::array()}, {"tgt", nlohmann::json::array()}};
    for (int64_t m : members) {
      line["src"].push_back(corpus.sources[size_t(m)]);
      line["tgt"].push_back(corpus.targets[size_t(m)]);
    }
    file << line.dump() << "\n";
  }
  if (!file.flush()) throw tfm::Error(path + ": write failed");
}

int run(const Options& o) {
  const double setup_start = now_seconds();
  tfm::ModelConfig config = tfm::preset_config("base");
  config.src_vocab_size = config.tgt_vocab_size = o.vocab;
  if (!o.config_path.empty()) {  // the file's keys over the base model with this vocabulary
    std::ifstream file(o.config_path);
    const nlohmann::json keys = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
    if (!file || !keys.is_object()) throw tfm::Error(o.config_path + ": not a JSON object");
    nlohmann::json merged = tfm::config_to_json(config);
    merged.update(keys);
    config = tfm::config_from_json(merged, o.config_path);
  }
  const tfm::Backend& backend = tfm::find_backend(o.device);
  tfm::Model model = tfm::init_model(config, o.seed, backend);
  // A device computes asynchronously: a step is timed to its end, read back as one float.
  auto wait_for_device = [&] {
    if (backend.memory_is_host()) return;
    float last = 0;
    backend.copy_to_host(model.parameters().begin()->second.ptr(), sizeof(float), &last);
  };
  tfm::Random random(o.seed + 1);
  // What a timed step runs: one fixed batch, or a pass over batches of varied lengths.
  std::vector<tfm::TokenBatch> batches;
  if (o.batch_tokens > 0) {
    if (!o.write_batches.empty() &&
        (!config.src_append_eos || config.pad_id != 0 || config.bos_id != 1 || config.eos_id != 2))
      throw tfm::Error(
          "--write-batches: train_peer.py builds its batches as the base model does (an eos after "
          "each source; pad 0, bos 1, eos 2), and this config differs");
    const tfm::ParallelCorpus corpus = varied_corpus(random, o);
    const tfm::BatchPlan plan =
        tfm::plan_batches(corpus, o.batch_tokens, config.src_append_eos ? 1 : 0, o.seed, 0, true);
    for (const auto& members : plan)
      batches.push_back(tfm::make_batch(config, corpus.sources, corpus.targets, members));
    if (!o.write_batches.empty()) write_batches(o.write_batches, corpus, plan);
  } else {
    const Sentences sources = bench::random_sentences(random, o.batch, o.src_len, o.vocab);
    const Sentences targets = bench::random_sentences(random, o.batch, o.tgt_len, o.vocab);
    batches.push_back(tfm::make_batch(config, sources, targets));
  }
  const tfm::TokenBatch& batch = batches.front();  // --profile's (one fixed batch)

  int64_t target_tokens = 0;  // target + eos: what the loss is averaged over, every batch
  int64_t source_tokens = 0;  // source + eos
  for (const tfm::TokenBatch& b : batches) {
    target_tokens += tfm::shape_of(b).target_tokens;
    for (int32_t n : b.src_lengths) source_tokens += n;
  }

  // Same names and shapes as the parameters, one block (as the trainer holds them).
  tfm::DeviceTensors gradients = tfm::DeviceTensors::zeros_like(model.parameters());
  const tfm::TransformerGradients grad_views = tfm::bind_gradients(config, gradients);
  tfm::OptimizerOptions optimizer_options;  // Adam 0.9 / 0.98 / 1e-9, the paper's schedule
  tfm::Optimizer optimizer(optimizer_options, model.parameters());
  tfm::TrainingWorkspace ws;
  tfm::DropoutOptions dropout;
  dropout.dropout = o.dropout;
  // The activations planned for every batch's shape and allocated as one block, as the trainer
  // does before its first step.
  for (const tfm::TokenBatch& b : batches)
    tfm::plan_loss_and_gradients(model, tfm::shape_of(b), dropout, true, ws, o.precision);
  ws.memory.allocate(model.backend(), ws.plan);
  const double setup_seconds = now_seconds() - setup_start;

  // Each timed step (a pass over the batches) is also split into its three calls, summed over
  // its batches (steady_clock around each; free).
  int64_t step = 0;
  std::vector<double> losses;  // per-token smoothed loss of every batch's step, warm-up included
  std::vector<double> zero_times, loss_grad_times, adam_times;  // one entry per timed step
  auto train_step = [&] {
    double zero_s = 0, loss_grad_s = 0, adam_s = 0;
    for (const tfm::TokenBatch& b : batches) {
      ++step;
      const double t0 = now_seconds();
      gradients.set_zero();
      const double t1 = now_seconds();
      dropout.seed = o.seed * 0x9E3779B97F4A7C15ull + uint64_t(step);  // new masks every step
      const float grad_scale = 1.f / float(tfm::shape_of(b).target_tokens);
      const tfm::LossTotals totals = tfm::loss_and_gradients(
          model, grad_views, b, dropout, o.label_smoothing, grad_scale, ws, o.precision);
      const double t2 = now_seconds();
      optimizer.apply(model.mutable_parameters(), gradients, config.d_model);
      wait_for_device();
      const double t3 = now_seconds();
      zero_s += t1 - t0;
      loss_grad_s += t2 - t1;
      adam_s += t3 - t2;
      losses.push_back(totals.loss / double(totals.tokens));
    }
    zero_times.push_back(zero_s);
    loss_grad_times.push_back(loss_grad_s);
    adam_times.push_back(adam_s);
  };
  std::vector<double> step_seconds;
  // TFM_CUDA_PROFILE's table covers the timed steps only: the warm-up's first uploads,
  // allocations and kernel loads are not what a step costs.
  const double median_seconds = time_median(o.warmup, o.steps, train_step, &step_seconds,
                                            [&] { model.backend().restart_profile(); });
  const double rss_mib = bench::peak_rss_mib();  // the training steps' peak, before --profile's
                                                 // extra workspace and the GEMM probe's buffers
  auto timed_median = [&](const std::vector<double>& v) {  // over the timed steps only
    return median(std::vector<double>(v.end() - o.steps, v.end()));
  };
  nlohmann::json phases = {{"zero_grad_s", timed_median(zero_times)},
                           {"forward_backward_s", timed_median(loss_grad_times)},
                           {"optimizer_s", timed_median(adam_times)}};

  // --profile: the forward alone = loss_and_gradients with grad_scale 0 (loss only, no
  // backward; its cache keeps 2 layers instead of all 12, otherwise the same work as the
  // training forward), so backward = forward_backward − forward (the projection's, the loss's
  // and both stacks' gradients); encoder / decoder = the stacks alone with a training cache;
  // projection + loss = forward − both.
  if (o.profile) {
    const int r = o.phase_repeats;
    tfm::TrainingWorkspace forward_ws;
    const double forward = time_median(
        1, r,
        [&] {
          tfm::loss_and_gradients(model, grad_views, batch, dropout, o.label_smoothing, 0.f,
                                  forward_ws, o.precision);
        },
        nullptr);
    ws.cache.training = true;  // ws's cache is already sized for all layers
    // The weights the step's products use (under --compute-type bfloat16: bfloat16 products of
    // the weights rounded once, as the step's pass rounds them before its stacks run).
    const tfm::TransformerWeights w = tfm::with_rounded_weights(
        model.backend(), tfm::with_product_precision(model.weights(), o.precision),
        ws.rounded_weights, ws.stacked_biases);
    const double encoder = time_median(
        1, r, [&] { tfm::encoder_forward(model, w, batch, dropout, ws.cache); }, nullptr);
    const double decoder = time_median(
        1, r, [&] { tfm::decoder_forward(model, w, batch, dropout, ws.cache); }, nullptr);
    phases["forward_s"] = forward;
    phases["encoder_forward_s"] = encoder;
    phases["decoder_forward_s"] = decoder;
    phases["projection_loss_forward_s"] = std::max(0.0, forward - encoder - decoder);
    phases["backward_s"] = std::max(0.0, phases["forward_backward_s"].get<double>() - forward);
  }

  double flops = 0;  // a timed step's: every batch's, padded positions included
  for (const tfm::TokenBatch& b : batches)
    flops += step_flops(config, double(b.batch), double(b.src_len), double(b.tgt_len));
  // The CPU's GEMM peak (no peak is measured for a GPU run: NaN, written as null).
  const double gemm_peak =
      backend.memory_is_host() ? bench::measure_square_gemm_peak(o.gemm_size, 5) : std::nan("");

  nlohmann::json line =
      bench::common_fields(median_seconds, step_seconds, target_tokens, rss_mib, flops, gemm_peak);
  line.update({
      {"config", tfm::config_to_json(config)},
      {"parameters", tfm::parameter_count(config)},
      {"batch", batch.batch},
      {"src_len", batch.src_len},
      {"tgt_len", batch.tgt_len},
      {"source_tokens", source_tokens},
      {"target_tokens", target_tokens},
      {"warmup", o.warmup},
      {"steps", o.steps},
      {"step_s", step_seconds},
      {"setup_s", setup_seconds},
      {"gemm_size", o.gemm_size},
      {"phases", phases},
      {"compute_type", tfm::precision_name(o.precision)},
      {"device", backend.name()},
      {"cpu_s", bench::cpu_seconds()},
      {"loss_first", losses.front()},
      {"loss_last", losses.back()},
  });
  if (o.batch_tokens > 0) {  // a step is a pass over these (B, S, T)
    nlohmann::json shapes = nlohmann::json::array();
    for (const tfm::TokenBatch& b : batches) shapes.push_back({b.batch, b.src_len, b.tgt_len});
    line.update({{"batch_tokens", o.batch_tokens},
                 {"lengths", {o.min_len, o.max_len}},
                 {"batches", int64_t(batches.size())},
                 {"batch_shapes", shapes}});
  }
  // A device's memory (its pool's peaks: what PyTorch's max_memory_allocated and
  // max_memory_reserved say of its own), for a GPU run.
  const tfm::DeviceMemory device_memory = backend.device_memory();
  if (device_memory.peak_in_use >= 0) {
    line["device_memory_peak_mib"] = double(device_memory.peak_in_use) / (1 << 20);
    line["device_memory_reserved_peak_mib"] = double(device_memory.peak_reserved) / (1 << 20);
  }
  if (o.precision == tfm::Precision::kBFloat16 && backend.memory_is_host()) {
    // What bfloat16 products can reach here at best, and so the shortest step those FLOPs allow.
    const double bf16_peak = bench::measure_square_gemm_peak_bfloat16(o.gemm_size, 5);
    line["bfloat16_gemm_peak_gflops"] = bf16_peak;
    line["step_s_at_bfloat16_peak"] = flops / 1e9 / bf16_peak;
  }
  std::cout << line.dump() << std::endl;
  return std::isfinite(losses.back()) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main(argc, argv, parse_options, run);
}
