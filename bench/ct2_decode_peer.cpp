// CTranslate2's side of bench/decode_bench on a GPU: the same sources, the same search, every
// output forced to the same length, timed the same way (warm-up runs, then the median of the
// timed runs), one JSON line with decode_bench's fields.
//
// Why C++ and not the PyPI wheel as on CPUs (bench/ct2_translate_peer.py): CTranslate2's wheels
// load CUDA 12's cuBLAS at run time, and a CUDA 13 machine (the GPU machine here) has CUDA 13's
// only; its CUDA 13 support is an open request upstream. So `bench/build_ctranslate2.sh --cuda`
// builds CTranslate2 from its own sources with this machine's nvcc 13 and compiles this file
// against it; nothing of CTranslate2 is part of this repository, and the toolkit never links it.
//
//   ct2_decode_peer --model CT2_DIR --source source.ids --compute-type bfloat16 --beam 4
//                   --out-len 32 [--device cuda] [--warmup 1] [--repeats 3]
// CT2_DIR: `transformer export-ctranslate2` of the decode_bench model; source.ids: its token ids,
// one sentence a line (decode_bench --prepare-only), mapped to tokens by the export's vocabulary.
#include <ctranslate2/translator.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

// The version and how it was built, from `bench/build_ctranslate2.sh --cuda`.
#ifndef CTRANSLATE2_VERSION
#define CTRANSLATE2_VERSION "(version unknown)"
#endif

namespace {

struct Options {
  std::string model, source, device = "cuda", compute_type = "bfloat16";
  size_t beam = 1, out_len = 32;
  int warmup = 1, repeats = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      o.model = value;
    else if (flag == "--source")
      o.source = value;
    else if (flag == "--device")
      o.device = value;
    else if (flag == "--compute-type")
      o.compute_type = value;
    else if (flag == "--beam")
      o.beam = std::stoul(value);
    else if (flag == "--out-len")
      o.out_len = std::stoul(value);
    else if (flag == "--warmup")
      o.warmup = std::stoi(value);
    else if (flag == "--repeats")
      o.repeats = std::stoi(value);
    else
      throw std::runtime_error("unknown option " + flag);
  }
  if (o.model.empty() || o.source.empty())
    throw std::runtime_error("--model and --source are required");
  if (o.beam < 1 || o.out_len < 1 || o.repeats < 1 || o.warmup < 0)
    throw std::runtime_error("--beam, --out-len and --repeats must be positive");
  return o;
}

// The export's target vocabulary (shared_vocabulary.json when both sides share one): token of
// each id, as a JSON list.
std::vector<std::string> read_vocabulary(const std::filesystem::path& model, const char* side) {
  for (const std::string name :
       {std::string("shared_vocabulary.json"), std::string(side) + "_vocabulary.json"}) {
    std::ifstream in(model / name);
    if (in) return nlohmann::json::parse(in).get<std::vector<std::string>>();
  }
  throw std::runtime_error(model.string() + ": no " + side + " vocabulary (JSON) found");
}

std::vector<std::vector<std::string>> read_sources(const std::string& path,
                                                   const std::vector<std::string>& vocabulary) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::vector<std::string>> sources;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    std::vector<std::string>& tokens = sources.emplace_back();
    for (size_t id; ids >> id;) {
      if (id >= vocabulary.size()) throw std::runtime_error(path + ": id out of the vocabulary");
      tokens.push_back(vocabulary[id]);
    }
  }
  if (sources.empty()) throw std::runtime_error(path + ": no sentences");
  return sources;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const Options& o) {
  const auto load_start = std::chrono::steady_clock::now();
  ctranslate2::Translator translator(o.model, ctranslate2::str_to_device(o.device),
                                     ctranslate2::str_to_compute_type(o.compute_type), {0});
  const double load_seconds = seconds_since(load_start);
  const std::vector<std::string> source_vocabulary = read_vocabulary(o.model, "source"),
                                 target_vocabulary = read_vocabulary(o.model, "target");
  const auto sources = read_sources(o.source, source_vocabulary);
  std::unordered_map<std::string, int64_t> target_ids;
  for (size_t id = 0; id < target_vocabulary.size(); ++id)
    target_ids.emplace(target_vocabulary[id], id);

  ctranslate2::TranslationOptions options;
  options.beam_size = o.beam;
  options.length_penalty = 0;  // scores are the sums of log-probabilities, as ours
  options.min_decoding_length = o.out_len;
  options.max_decoding_length = o.out_len;
  options.return_scores = true;

  std::vector<ctranslate2::TranslationResult> results;
  std::vector<double> timed;
  for (int run = 0; run < o.warmup + o.repeats; ++run) {
    const auto start = std::chrono::steady_clock::now();
    results = translator.translate_batch(sources, options);  // returns once on the host
    if (run >= o.warmup) timed.push_back(seconds_since(start));
  }
  std::vector<double> sorted = timed;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];

  nlohmann::json outputs = nlohmann::json::array(), logprobs = nlohmann::json::array();
  size_t generated = 0;
  for (const auto& result : results) {
    const std::vector<std::string>& best = result.hypotheses.at(0);
    if (best.size() != o.out_len)
      throw std::runtime_error("a hypothesis has " + std::to_string(best.size()) +
                               " tokens instead of " + std::to_string(o.out_len));
    std::vector<int64_t> ids;
    for (const std::string& token : best) ids.push_back(target_ids.at(token));
    generated += best.size();
    outputs.push_back(ids);
    logprobs.push_back(result.scores.at(0));
  }
  const nlohmann::json line = {
      {"impl", std::string("ctranslate2 ") + CTRANSLATE2_VERSION},
      {"device", o.device},
      {"compute_type", o.compute_type},
      {"beam", o.beam},
      {"batch", sources.size()},
      {"out_len", o.out_len},
      {"target_tokens", generated},
      {"median_s", median},
      {"min_s", sorted.front()},
      {"tokens_per_s", double(generated) / median},
      {"run_s", timed},
      {"load_s", load_seconds},
      {"outputs", outputs},
      {"logprobs", logprobs},
  };
  std::cout << line.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
