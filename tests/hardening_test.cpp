// Failures a stranger's input or a diverging run can cause, through the real binary: a model
// file holding NaN / Inf is refused at load (naming the tensor) unless --allow-nonfinite;
// during training a step with a non-finite loss is skipped with a warning and counted, and
// --max-bad-steps such steps in a row stop the run with an error, leaving the last checkpoint
// byte for byte as it was; configs and files that declare more memory than the machine (or
// --max-memory) allows are refused before anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_runner.h"
#include "io/model_file.h"
#include "model/init.h"
#include "model/transformer.h"
#include "tensor/file_util.h"

namespace {

using tfm::testing_support::CliResult;

const tfm::testing_support::CliWorkDir work("tfm_hardening_test");

// Reversal pairs over ids 4..max_id; every line holds max_id when `always_max` is set.
void write_pairs(const std::string& prefix, int pairs, int max_id, bool always_max, unsigned seed) {
  std::mt19937 random(seed);
  std::ofstream src(work.path(prefix + ".src")), tgt(work.path(prefix + ".tgt"));
  for (int i = 0; i < pairs; ++i) {
    std::vector<int> tokens(3 + random() % 6);
    for (int& t : tokens) t = 4 + int(random() % unsigned(max_id - 3));
    if (always_max) tokens[random() % tokens.size()] = max_id;
    for (size_t j = 0; j < tokens.size(); ++j)
      src << tokens[j] << (j + 1 < tokens.size() ? " " : "\n");
    for (size_t j = tokens.size(); j-- > 0;) tgt << tokens[j] << (j > 0 ? " " : "\n");
  }
}

// A tiny model (separate source / target embeddings) whose source embedding of token 31 is
// `value`: batches with source token 31 get a non-finite loss, the others train normally.
std::string write_poisoned_model(const std::string& name, float value) {
  tfm::ModelConfig config = tfm::preset_config("tiny");
  config.src_vocab_size = config.tgt_vocab_size = 32;
  config.share_embeddings = tfm::EmbeddingSharing::kNone;
  tfm::Model model = tfm::init_model(config, 3, tfm::cpu_backend());
  tfm::Tensor embedding = model.parameters().to_host().at("src_embed.weight");
  embedding.data[size_t(31 * config.d_model + 5)] = value;
  model.mutable_parameters().copy_from_host("src_embed.weight", embedding.ptr());
  const std::string path = work.path(name);
  tfm::save_model(model, path);
  return path;
}

TEST(NonFinite, WeightsWithNanOrInfAreRefusedAtLoadUnlessAllowed) {
  const std::string nan_model = write_poisoned_model("nan.safetensors", std::nanf(""));
  const std::string inf_model =
      write_poisoned_model("inf.safetensors", std::numeric_limits<float>::infinity());
  const std::string input = work.write_file("in.txt", "4 5 6\n");
  CliResult r = work.run_cli("translate --ids --model " + nan_model, input);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: " + nan_model +
                       ": tensor \"src_embed.weight\" holds NaN at index 1989 (--allow-nonfinite "
                       "loads it anyway)\n");
  r = work.run_cli("score --ids --model " + inf_model + " --src " + input + " --tgt " + input);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds an infinity"), std::string::npos) << r.err;
  r = work.run_cli("translate --ids --allow-nonfinite --model " + nan_model, input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli("--allow-nonfinite translate --ids --model " + nan_model, input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A model whose activations overflow (finite weights: 3e38 times sqrt(d_model) is inf) or that
// was let hold NaN gives non-finite log-probabilities; translate and score refuse to print them
// (an empty translation with log p 0, and "nan", with exit 0, before) and still work on
// sentences that do not reach the bad row.
TEST(NonFinite, OutputsThatAreNotFiniteAreAnErrorNotATranslation) {
  const std::string huge_model = write_poisoned_model("huge.safetensors", 3e38f);
  const std::string nan_model = write_poisoned_model("nan_used.safetensors", std::nanf(""));
  const std::string reaches = work.write_file("reaches.txt", "4 5 6\n31 5 6\n");
  const std::string avoids = work.write_file("avoids.txt", "4 5 6\n7 8\n");
  for (const std::string& model : {huge_model + " ", nan_model + " --allow-nonfinite "}) {
    for (const char* search :
         {"--beam 1", "--beam 4", "--prefix 5", "--sampling-topk 0 --beam 1 --seed 3"}) {
      CliResult r = work.run_cli("translate --ids --model " + model + std::string(search), reaches);
      EXPECT_EQ(r.exit_code, 1) << model << search << r.out;
      EXPECT_EQ(r.out, "");
      EXPECT_EQ(r.err,
                "error: the model's output at step 1 is not finite: its activations overflow "
                "float32 or its weights hold NaN, so it cannot translate\n")
          << model << search;
      r = work.run_cli("translate --ids --model " + model + search, avoids);
      EXPECT_EQ(r.exit_code, 0) << model << search << r.err;
    }
    CliResult r =
        work.run_cli("score --ids --model " + model + "--src " + reaches + " --tgt " + avoids);
    EXPECT_EQ(r.exit_code, 1) << model << r.out;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err,
              "error: the model's log-probability of pair 2 is not a number: its activations "
              "overflow float32 or its weights hold NaN, so it cannot score\n")
        << model;
    r = work.run_cli("score --ids --model " + model + "--src " + avoids + " --tgt " + reaches);
    EXPECT_EQ(r.exit_code, 0) << model << r.err;
  }
}

TEST(NonFinite, BadStepsAreSkippedAndTooManyInARowStopWithTheCheckpointIntact) {
  const std::string init = write_poisoned_model("poisoned.safetensors", std::nanf(""));
  write_pairs("mixed", 400, 31, false, 1);  // some batches hold token 31
  write_pairs("clean", 400, 30, false, 2);  // none does
  write_pairs("bad", 400, 31, true, 3);     // every one does
  auto train = [&](const std::string& data, const std::string& dir, const std::string& extra) {
    return work.run_cli("train --allow-nonfinite --ids --init " + init + " --train-src " +
                        work.path(data + ".src") + " --train-tgt " + work.path(data + ".tgt") +
                        " --model-dir " + work.path(dir) +
                        " --batch-tokens 120 --warmup 10 --log-every 5 " + extra);
  };

  CliResult r = train("mixed", "mixed", "--max-steps 30 --max-bad-steps 1000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is not finite; update skipped"), std::string::npos) << r.err;
  int skipped = 0, logged = 0;
  std::istringstream lines(tfm::read_file_bytes(work.path("mixed/train.log.jsonl")));
  for (std::string line; std::getline(lines, line);) {
    const auto event = nlohmann::json::parse(line);
    if (event["event"] == "skipped") ++skipped;
    if (event["event"] == "train") {
      ++logged;
      EXPECT_TRUE(std::isfinite(event["loss"].get<double>())) << line;
    }
  }
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(logged, 6);  // 30 real steps: skipped ones do not count as steps
  // The skipped updates left every weight but the poisoned one finite.
  tfm::allow_nonfinite_weights(true);
  const tfm::Model trained =
      tfm::load_model(work.path("mixed/model.safetensors"), tfm::cpu_backend());
  tfm::allow_nonfinite_weights(false);
  for (const auto& [name, t] : trained.parameters().to_host())
    for (size_t i = 0; i < t.data.size(); ++i) {
      if (name == "src_embed.weight" && i == 1989) continue;
      ASSERT_TRUE(std::isfinite(t.data[i])) << name << "[" << i << "]";
    }

  // 10 good steps saved; then data where every step is bad: 3 in a row end the run.
  r = train("clean", "stop", "--max-steps 10 --save-every 10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string saved = tfm::read_file_bytes(work.path("stop/checkpoint.safetensors"));
  r = train("bad", "stop", "--max-steps 20 --save-every 1 --max-bad-steps 3 --resume");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: training stopped: 3 steps in a row had a non-finite loss or "
                       "gradient (--max-bad-steps); the last checkpoint (step 10) is left as it "
                       "was"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(tfm::read_file_bytes(work.path("stop/checkpoint.safetensors")), saved);
}

TEST(MemoryLimit, OversizedConfigsAndFilesAreRefusedBeforeAllocating) {
  // 65536-wide layers over a 16M-token vocabulary: terabytes, far past any machine's memory.
  const std::string huge = work.write_file(
      "huge.json", R"({"d_model": 65536, "heads": 1, "d_ff": 262144, "src_vocab_size": 16777216,
                      "tgt_vocab_size": 16777216})");
  CliResult r = work.run_cli("init --config " + huge + " -o " + work.path("huge.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: a model of this config needs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("of memory this machine has"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(work.path("huge.safetensors")));

  // --max-memory lowers the limit: for a new model, for training, and for a model file.
  r = work.run_cli("--max-memory 1M init --preset tiny --vocab 8000 -o " + work.path("t.st"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("allowed by --max-memory"), std::string::npos) << r.err;
  const std::string model = write_poisoned_model("fine.safetensors", 0.f);
  r = work.run_cli("translate --max-memory 64K --ids --model " + model,
                   work.write_file("one.txt", "4 5\n"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: " + model + ": its tensors need"), std::string::npos) << r.err;
  write_pairs("few", 20, 31, false, 4);
  r = work.run_cli("train --max-memory 2M --init " + model + " --ids --train-src " +
                   work.path("few.src") + " --train-tgt " + work.path("few.tgt") + " --model-dir " +
                   work.path("limited"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("training this model (weights, gradients, optimizer state) needs"),
            std::string::npos)
      << r.err;
  // Weights, gradients and moments fit in 64 MiB, but the activations of 8000-token batches of
  // 80-120-token sentences (planned from the batches before the first step) do not.
  {
    std::mt19937 random(5);
    std::ofstream src(work.path("long.src")), tgt(work.path("long.tgt"));
    for (int i = 0; i < 40; ++i) {
      const int n = 80 + int(random() % 41);
      for (int j = 0; j < n; ++j) src << 4 + random() % 28 << (j + 1 < n ? " " : "\n");
      for (int j = 0; j < n; ++j) tgt << 4 + random() % 28 << (j + 1 < n ? " " : "\n");
    }
  }
  const std::string long_data = " --ids --train-src " + work.path("long.src") + " --train-tgt " +
                                work.path("long.tgt") + " --batch-tokens 8000 --max-steps 1";
  r = work.run_cli("train --max-memory 64M --init " + model + long_data + " --model-dir " +
                   work.path("activations"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: training this model on these batches (weights, gradients, "
                       "optimizer state and "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("MiB of activations) needs"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(work.path("activations/model.safetensors")));
  r = work.run_cli("train --init " + model + long_data + " --model-dir " +
                   work.path("activations"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("MiB in one block"), std::string::npos) << r.err;
  // Scoring plans its batches' activations the same way: the model fits in 4 MiB, they do not.
  const std::string long_pairs = " --ids --model " + model + " --src " + work.path("long.src") +
                                 " --tgt " + work.path("long.tgt") + " --batch-tokens 8000 -o " +
                                 work.path("long.scores");
  r = work.run_cli("score --max-memory 4M" + long_pairs);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: scoring in batches of up to 8000 tokens (--batch-tokens: the "
                       "activations) needs"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(work.path("long.scores")));
  r = work.run_cli("score" + long_pairs);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli("--max-memory lots info --preset tiny");
  EXPECT_EQ(r.exit_code, 2);  // a usage error, as every other bad option value
  EXPECT_NE(r.err.find("--max-memory: unknown unit"), std::string::npos) << r.err;
}

}  // namespace
