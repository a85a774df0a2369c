// decode_bench: times tfm::search (greedy or beam, exactly what `transformer translate` runs) of
// the paper's base model on one fixed batch of random sources, with every output forced to the
// same length, so that bench/run_decode_bench.sh can compare it with PyTorch decoding loops
// (bench/decode_peer.py) on the same model file and the same sources in the same run
// (docs/performance.md, "How we measure").
//
// Output length: a random model stops at random places, so both sides generate exactly
// --out-len tokens: min_length = max_length = out_len (eos is forbidden before out_len tokens
// and the search stops there). Every hypothesis then has the same length, so the length penalty
// does not change the ranking.
//
// It writes the model and the source ids into a work directory for the peer (--prepare-only),
// then prints one JSON line: target tokens/s (generated tokens, out_len per sentence), median
// seconds, peak RSS, the fp32 GEMM peak measured in this process and MFU, the generated tokens
// and log-probabilities of every sentence (the cross-check against the peer), and with
// --profile where the time goes: encoder, decoder setup (cross-attention keys/values, cache
// allocation), decoder steps (and the
// vocabulary projection inside them), cache reorders, and the search's own bookkeeping.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "bench_util.h"
#include "decode/beam_search.h"
#include "decode/incremental_decoder.h"
#include "io/model_file.h"
#include "model/config.h"
#include "model/init.h"
#include "model/prepared_weights.h"
#include "model/stacks.h"
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
  int beam = 1;
  int batch = 32;
  int src_len = 32;  // raw source tokens; the encoder sees src_len + 1 with eos
  int out_len = 32;  // generated tokens per sentence (eos never generated)
  int vocab = 8000;
  int warmup = 1;
  int repeats = 5;
  int phase_repeats = 3;  // repetitions of each --profile measurement
  int gemm_size = 2048;   // side of the square sgemm that defines the peak
  uint64_t seed = 1234;
  std::string device = "cpu";  // the backend that decodes (find_backend)
  bool profile = false;
  bool prepare_only = false;                            // write model + ids, time nothing
  tfm::Precision precision = tfm::Precision::kFloat32;  // of the weight products
  tfm::CacheFormat cache = tfm::CacheFormat::kFloat32;  // of the key/value cache
};

const char* kUsage =
    "usage: decode_bench --work-dir DIR [options]\n"
    "Times tfm::search (greedy or beam) of the base model (shared 8000-token vocabulary) on one\n"
    "fixed batch of random sources, every output forced to --out-len tokens; prints one JSON "
    "line.\n"
    "  --work-dir DIR       model.safetensors + source.ids: written by --prepare-only, read "
    "otherwise\n"
    "  --prepare-only       write a fresh model and sources into DIR, then exit\n"
    "  --beam N             1: greedy (default 1)\n"
    "  --compute-type T     float32 (default), bfloat16, float16, int8, int8_bfloat16 or\n"
    "                       int8_float16 (translate --compute-type; float16 on GPUs only)\n"
    "  --cache F            key/value cache float32, bfloat16 or float16 (default: the\n"
    "                       compute type's)\n"
    "  --repeats N          timed searches after warm-up (default 5)\n"
    "  --warmup N           untimed searches first (default 1)\n"
    "  --profile            also replay the search's decoder calls on the same shapes to split\n"
    "                       the time into encoder / decoder steps / cache reorder / bookkeeping\n"
    "  --phase-repeats N    repetitions of each --profile measurement (default 3)\n"
    "  --gemm-size N        side of the square sgemm timed for the peak (default 2048)\n"
    "  --batch N --src-len N --out-len N --vocab N   shapes (default 32, 32, 32, 8000;\n"
    "                       with --prepare-only; later runs take them from DIR)\n"
    "  --seed N             model and source seed (default 1234)\n"
    "  --device NAME        where the search runs: cpu (default), cuda, cuda:N, auto (no\n"
    "                       --profile and no CPU GEMM peak on a GPU)\n"
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
    } else if (a == "--beam") {
      o.beam = int(int_value(i));
    } else if (a == "--compute-type") {
      bench::compute_type_arg(argc, argv, i, kUsage, o.precision, o.cache);
    } else if (a == "--cache") {
      if (i + 1 >= argc) usage_error("--cache needs a value");
      const std::string format = argv[++i];
      if (format != "float32" && format != "bfloat16" && format != "float16")
        usage_error("--cache is float32, bfloat16 or float16, not " + format);
      o.cache = format == "bfloat16"  ? tfm::CacheFormat::kBFloat16
                : format == "float16" ? tfm::CacheFormat::kFloat16
                                      : tfm::CacheFormat::kFloat32;
    } else if (a == "--repeats") {
      o.repeats = int(int_value(i));
    } else if (a == "--warmup") {
      o.warmup = int(int_value(i));
    } else if (a == "--phase-repeats") {
      o.phase_repeats = int(int_value(i));
    } else if (a == "--gemm-size") {
      o.gemm_size = int(int_value(i));
    } else if (a == "--batch") {
      o.batch = int(int_value(i));
    } else if (a == "--src-len") {
      o.src_len = int(int_value(i));
    } else if (a == "--out-len") {
      o.out_len = int(int_value(i));
    } else if (a == "--vocab") {
      o.vocab = int(int_value(i));
    } else if (a == "--seed") {
      o.seed = uint64_t(int_value(i));
    } else if (a == "--device") {
      if (i + 1 >= argc) usage_error("--device needs a name");
      o.device = argv[++i];
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--prepare-only") {
      o.prepare_only = true;
    } else {
      usage_error("unknown argument \"" + a + "\"");
    }
  }
  if (o.work_dir.empty()) usage_error("--work-dir is required");
  if (o.beam < 1) usage_error("--beam must be at least 1");
  if (o.repeats < 1) usage_error("--repeats must be at least 1");
  if (o.batch < 1 || o.src_len < 1 || o.out_len < 1) usage_error("shapes must be positive");
  if (o.vocab < 4) usage_error("--vocab must be at least 4");
  if (o.gemm_size < 1) usage_error("--gemm-size must be positive");
  if (o.profile && o.phase_repeats < 1) usage_error("--phase-repeats must be at least 1");
  return o;
}

// Hypotheses the decoder runs at step t: one per sentence at the first step (every beam starts
// from bos), then `beam` per sentence (no sentence finishes early: eos is forbidden).
int64_t rows_at_step(int64_t batch, int64_t beam, int64_t t) {
  return t == 0 ? batch : batch * beam;
}

// Multiply-add FLOPs (2 per MAC) of the matrix products of one KV-cached search: the encoder on
// the batch (S positions with eos), the cross-attention keys/values of its output, then per step
// t (key length t + 1) and row: self q/k/v/o, cross q/o, attention products against t + 1 cached
// and S source positions, feed-forward, and the tied vocabulary projection. Element-wise work
// and the search are not counted. The useful work of decoding, the same count for every side
// (the peer that re-runs the whole prefix each step does more work than this).
double search_flops(const tfm::ModelConfig& c, double batch, double src_len, double out_len,
                    double beam) {
  const double d = double(c.d_model), f = double(c.d_ff), v = double(c.tgt_vocab_size);
  const double src_rows = batch * src_len;
  const double encoder =
      double(c.encoder_layers) *
      (2 * src_rows * 4 * d * d + 4 * batch * src_len * src_len * d + 2 * src_rows * 2 * d * f);
  const double cross_kv = double(c.decoder_layers) * 2 * src_rows * 2 * d * d;
  double steps = 0;
  for (int64_t t = 0; t < int64_t(out_len); ++t) {
    const double n = double(rows_at_step(int64_t(batch), int64_t(beam), t));
    const double layer = 2 * n * 4 * d * d            // self q, k, v, o
                         + 4 * n * double(t + 1) * d  // self QKᵀ and PV
                         + 2 * n * 2 * d * d          // cross q, o
                         + 4 * n * src_len * d        // cross QKᵀ and PV
                         + 2 * n * 2 * d * f;         // fc1, fc2
    steps += double(c.decoder_layers) * layer + 2 * n * d * v;
  }
  return encoder + cross_kv + steps;
}

// --profile: tfm::search has no hooks, so its decoder work is replayed here with the public
// pieces it is made of, on the same shapes: make_batch + encoder_forward, the decoder setup (the
// IncrementalDecoder's constructor, which computes every layer's cross-attention keys/values
// and reserves the self-attention caches, and start()), out_len steps with the same number of
// hypotheses as the search (batch at the first step, batch·beam after), and the reorder the
// search calls after every step but the last (greedy too: identity parents). Step times do not
// depend on the token values; reorder copies the same amount whatever the parents (here: each
// sentence's hypotheses rotated). The vocabulary
// projection inside a step is timed on its own with the same kernels and shapes.
// Bookkeeping = the search's median − all of the above: the ranking of each hypothesis' logits
// with their log-softmax (best_tokens), hypothesis copies, and everything else search() does.
nlohmann::json profile_search(const tfm::Model& model, const Sentences& sources, int64_t beam,
                              int64_t out_len, int repeats, double search_median,
                              tfm::Precision precision, tfm::CacheFormat cache_format) {
  const tfm::ModelConfig& c = model.config();
  const int64_t batch = int64_t(sources.size()), d = c.d_model, vocab = c.tgt_vocab_size;
  std::vector<double> encoder_t, setup_t, step_t, reorder_t, projection_t;
  for (int r = 0; r < repeats + 1; ++r) {  // the first repetition is a warm-up
    double t0 = now_seconds();
    const tfm::TokenBatch tb = tfm::make_batch(c, sources, Sentences(sources.size()));
    tfm::StackCache cache;
    std::shared_ptr<const tfm::PreparedWeights> hold;
    tfm::encoder_forward(model, model.sequence_weights(precision, hold), tb, {}, cache);
    double t1 = now_seconds();
    tfm::IncrementalDecoder decoder(model, cache.memory.data(), batch, tb.src_len,
                                    tb.src_lengths.data(), out_len + 1, batch * beam, precision,
                                    cache_format);
    std::vector<int32_t> hypothesis_sentence(static_cast<size_t>(batch));
    std::iota(hypothesis_sentence.begin(), hypothesis_sentence.end(), 0);
    decoder.start(hypothesis_sentence);
    const double t2 = now_seconds();
    double steps = 0, reorders = 0;
    std::vector<float> logits;
    std::vector<int32_t> tokens, parents;
    for (int64_t t = 0; t < out_len; ++t) {
      const int64_t n = decoder.hypotheses();
      tokens.assign(size_t(n), int32_t(t == 0 ? c.bos_id : 3 + (t * 37) % (vocab - 3)));
      logits.resize(size_t(n * vocab));
      const double s0 = now_seconds();
      decoder.step(tokens.data(), logits.data(), nullptr);
      const double s1 = now_seconds();
      steps += s1 - s0;
      if (t + 1 == out_len) break;  // the search finishes every hypothesis at the last step
      const int64_t next = rows_at_step(batch, beam, t + 1);
      parents.resize(size_t(next));
      for (int64_t i = 0; i < next; ++i) {
        const int64_t sentence = i / beam, k = i % beam;
        parents[size_t(i)] = int32_t(t == 0 ? sentence : sentence * beam + (k + 1) % beam);
      }
      const double r0 = now_seconds();
      decoder.reorder(parents);
      reorders += now_seconds() - r0;
    }
    // The vocabulary projection of every step, alone.
    std::vector<float> x(size_t(batch * beam * d), 0.01f);
    double projection = 0;
    for (int64_t t = 0; t < out_len; ++t) {
      const int64_t n = rows_at_step(batch, beam, t);
      const double p0 = now_seconds();
      tfm::linear_forward(tfm::cpu_backend(), model.prepared(precision)->steps.output, x.data(), n,
                          logits.data());
      projection += now_seconds() - p0;
    }
    if (r == 0) continue;
    encoder_t.push_back(t1 - t0);
    setup_t.push_back(t2 - t1);
    step_t.push_back(steps);
    reorder_t.push_back(reorders);
    projection_t.push_back(projection);
  }
  const double encoder = median(encoder_t), setup = median(setup_t), steps = median(step_t),
               reorders = median(reorder_t);
  return {{"encoder_s", encoder},
          {"decoder_setup_s", setup},
          {"decoder_steps_s", steps},
          {"projection_in_steps_s", median(projection_t)},
          {"reorder_s", reorders},
          {"bookkeeping_s", std::max(0.0, search_median - encoder - setup - steps - reorders)},
          {"replay_total_s", encoder + setup + steps + reorders}};
}

int run(const Options& o) {
  const std::filesystem::path dir(o.work_dir);
  const std::string model_path = (dir / "model.safetensors").string();
  const std::string source_path = (dir / "source.ids").string();

  if (o.prepare_only) {
    std::filesystem::create_directories(dir);
    tfm::ModelConfig config = tfm::preset_config("base");
    config.src_vocab_size = config.tgt_vocab_size = o.vocab;
    const tfm::Model model = tfm::init_model(config, o.seed, tfm::cpu_backend());
    tfm::save_model(model, model_path);
    tfm::Random random(o.seed + 1);
    bench::write_ids(source_path, bench::random_sentences(random, o.batch, o.src_len, o.vocab));
    std::cerr << "wrote " << model_path << " (" << tfm::parameter_count(config) << " parameters), "
              << source_path << "\n";
    return 0;
  }

  const double load_start = now_seconds();
  // Loaded as translate loads it: for inference in this compute type only (int8 weights held
  // in int8; every weight freed once prepared), so the peak RSS is what a user sees.
  const tfm::Backend& backend = tfm::find_backend(o.device);
  bench::check_compute_type(backend, o.precision, o.cache);
  if (o.profile && !backend.memory_is_host())
    throw tfm::Error("--profile replays the search on the CPU only (device " + backend.name() +
                     ")");
  tfm::Model model = tfm::load_model(model_path, backend, tfm::model_weights_for(o.precision));
  model.set_inference_only(o.precision);
  const Sentences sources = bench::read_ids(source_path, "run with --prepare-only first");
  const double load_seconds = now_seconds() - load_start;
  const tfm::ModelConfig& config = model.config();
  if (sources.empty()) throw tfm::Error(source_path + ": no sentences");

  tfm::SearchOptions search_options;
  search_options.beam = o.beam;
  search_options.alpha = 0.6;  // irrelevant here: every hypothesis has out_len tokens
  search_options.min_length = o.out_len;
  search_options.max_length = o.out_len;
  search_options.max_length_a = 0;
  search_options.max_length_b = o.out_len;
  search_options.nbest = 1;
  search_options.precision = o.precision;
  search_options.cache = o.cache;

  std::vector<std::vector<tfm::Hypothesis>> results;
  auto decode = [&] { results = tfm::search(model, sources, {}, search_options); };
  std::vector<double> all_seconds;
  // TFM_CUDA_PROFILE's table covers the timed searches only, not the warm-up's first loads.
  const double median_seconds =
      time_median(o.warmup, o.repeats, decode, &all_seconds, [&] { backend.restart_profile(); });
  const double rss_mib = bench::peak_rss_mib();  // before --profile and the GEMM probe's buffers

  int64_t generated = 0;
  nlohmann::json outputs = nlohmann::json::array(), logprobs = nlohmann::json::array();
  for (const auto& hypotheses : results) {
    const tfm::Hypothesis& best = hypotheses.front();
    if (int64_t(best.tokens.size()) != o.out_len)
      throw tfm::Error("a hypothesis has " + std::to_string(best.tokens.size()) +
                       " tokens instead of " + std::to_string(o.out_len));
    generated += int64_t(best.tokens.size());
    outputs.push_back(best.tokens);
    logprobs.push_back(best.logprob);
  }

  nlohmann::json phases = nullptr;
  if (o.profile)
    phases = profile_search(model, sources, o.beam, o.out_len, o.phase_repeats, median_seconds,
                            search_options.precision, search_options.cache);

  const int64_t batch = int64_t(sources.size()),
                src_len = int64_t(sources[0].size()) + (config.src_append_eos ? 1 : 0);
  const double flops =
      search_flops(config, double(batch), double(src_len), double(o.out_len), double(o.beam));
  // The CPU's GEMM peak (none for a GPU run: NaN, written as null).
  const double gemm_peak =
      backend.memory_is_host() ? bench::measure_square_gemm_peak(o.gemm_size, 5) : std::nan("");

  nlohmann::json line =
      bench::common_fields(median_seconds, all_seconds, generated, rss_mib, flops, gemm_peak);
  const std::string compute_type = tfm::compute_type_name(o.precision, o.cache);
  line.update({
      {"side", std::string(o.beam == 1 ? "ours-greedy" : "ours-beam") +
                   (compute_type == "float32" ? "" : "-" + compute_type)},
      {"compute_type", compute_type},
      {"device", backend.name()},
      {"cache", tfm::precision_name(tfm::cache_precision(o.cache))},
      {"beam", o.beam},
      {"batch", batch},
      {"src_len", src_len},
      {"out_len", o.out_len},
      {"target_tokens", generated},
      {"warmup", o.warmup},
      {"repeats", o.repeats},
      {"run_s", all_seconds},
      {"load_s", load_seconds},
      {"gemm_size", o.gemm_size},
      {"phases", phases},
      {"cpu_s", bench::cpu_seconds()},
      {"outputs", outputs},
      {"logprobs", logprobs},
  });
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main(argc, argv, parse_options, run);
}
