// Data-parallel `transformer train` under OpenMPI's mpirun: two ranks sharing a global batch end
// where one process with the same batch ends (the gradient sum is the same sum, in another
// order), a run resumes with a different number of ranks, and killing one rank ends the whole
// job quickly with the last checkpoint intact. Skipped when the build or the machine lacks MPI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_runner.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "tensor/file_util.h"

namespace {

namespace fs = std::filesystem;
using tfm::testing_support::CliResult;

const tfm::testing_support::CliWorkDir work("tfm_mpi_train_test");

// Two ranks of one thread each on any machine (this one has 2 cores; CI may be root).
const std::string kLauncher =
    "mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np 2 ";

bool mpi_available() {
#ifdef TRANSFORMER_WITH_MPI
  return std::system("command -v mpirun >/dev/null 2>&1") == 0;
#else
  return false;
#endif
}

std::string train_flags(const std::string& dir, int steps) {
  return "train --preset tiny --vocab 32 --ids --train-src " + work.path("data.src") +
         " --train-tgt " + work.path("data.tgt") + " --valid-src " + work.path("dev.src") +
         " --valid-tgt " + work.path("dev.tgt") + " --model-dir " + work.path(dir) +
         " --max-steps " + std::to_string(steps) +
         " --dropout 0 --batch-tokens 600 --warmup 10 --seed 5 --valid-every 10"
         " --save-every 10 --log-every 5 --replica-check-every 5";
}

// The largest ‖a − b‖ / ‖b‖ over the tensors (L2 norms). Element-wise comparison is not the
// right measure: float rounding that differs with the summation order flips a few ReLU units
// near 0 after a few steps, which moves single elements of a bias by more than 1e-5 of the
// tensor's largest value while the tensor as a whole agrees to ~1e-6.
double max_relative_difference(const tfm::Model& a, const tfm::Model& b, std::string& where) {
  double worst = 0;
  const tfm::TensorMap a_host = a.parameters().to_host();
  for (const auto& [name, tb] : b.parameters().to_host()) {
    const auto& ta = a_host.at(name);
    double norm = 0, diff = 0;
    for (size_t i = 0; i < tb.data.size(); ++i) {
      norm += double(tb.data[i]) * tb.data[i];
      diff += (double(ta.data[i]) - tb.data[i]) * (double(ta.data[i]) - tb.data[i]);
    }
    const double relative = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (relative > worst) {
      worst = relative;
      where = name;
    }
  }
  return worst;
}

// A field of the run's training state, from its checkpoint (global over the ranks):
// "target_tokens_seen", "step", ...
int64_t training_state(const std::string& dir, const char* field) {
  const auto file = tfm::read_safetensors(work.path(dir + "/checkpoint.safetensors"));
  return nlohmann::json::parse(file.metadata.at("training_state"))[field];
}

class MpiTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "MPI not available (build without MPI or no mpirun)";
    tfm::testing_support::write_reversal_data(work, "data", 1500, 3, 12, 11);
    tfm::testing_support::write_reversal_data(work, "dev", 60, 3, 12, 12);
  }
};

TEST_F(MpiTrain, TwoRanksMatchOneProcessAndResumeWithAnotherRankCount) {
  CliResult r = work.run_cli(train_flags("one", 20));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli(train_flags("two", 20), "/dev/null", kLauncher);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("data parallel: 2 ranks"), std::string::npos) << r.err;
  // Rank 0 alone reports and writes.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const tfm::Model one = tfm::load_model(work.path("one/model.safetensors"), tfm::cpu_backend());
  const tfm::Model two = tfm::load_model(work.path("two/model.safetensors"), tfm::cpu_backend());
  std::string where;
  EXPECT_LT(max_relative_difference(two, one, where), 1e-5) << where;
  // Each sentence was used once: the ranks' shares add up to the global batches.
  EXPECT_EQ(training_state("two", "target_tokens_seen"),
            training_state("one", "target_tokens_seen"));
  EXPECT_GT(training_state("one", "target_tokens_seen"), 0);
  // Plain SGD is not scale-invariant as Adam is, so it also checks the normalisation by the
  // global token count (a rank dividing by its own count would double the step).
  const std::string sgd = " --optimizer sgd --lr-schedule constant --lr 0.03";
  r = work.run_cli(train_flags("one_sgd", 20) + sgd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli(train_flags("two_sgd", 20) + sgd, "/dev/null", kLauncher);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(max_relative_difference(
                tfm::load_model(work.path("two_sgd/model.safetensors"), tfm::cpu_backend()),
                tfm::load_model(work.path("one_sgd/model.safetensors"), tfm::cpu_backend()), where),
            1e-5)
      << where;
  // A cool-down by the clock (the whole run, by --max-minutes): every rank takes rank 0's
  // minutes, so the replicas stay bit-equal (--replica-check-every 5 compares them every 5 steps;
  // each rank reading its own clock would give each its own learning rate). The run needs 10
  // steps, so that the replicas are compared: a machine too busy to give them in the time
  // limit gets twice the time, and again.
  double minutes = 0.015;
  int64_t clock_steps = 0;
  for (int attempt = 0; attempt < 5 && clock_steps < 10; ++attempt) {
    minutes *= 2;
    const std::string name = "two_clock_" + std::to_string(attempt);
    r = work.run_cli(train_flags(name, 1000000) + " --max-minutes " + std::to_string(minutes) +
                         " --lr-cooldown 1",
                     "/dev/null", kLauncher);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    clock_steps = training_state(name, "step");
  }
  EXPECT_GE(clock_steps, 10) << "fewer than 10 steps in " << minutes << " minutes";
  // The parameters moved: the comparison is not of two untouched initialisations.
  const tfm::Model start =
      tfm::load_model(work.path("one/checkpoints/step-000000010.safetensors"), tfm::cpu_backend());
  EXPECT_GT(max_relative_difference(start, one, where), 1e-3);

  // 10 steps on 2 ranks, then resumed on 1 process to step 20: the same run.
  r = work.run_cli(train_flags("switch", 10), "/dev/null", kLauncher);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli(train_flags("switch", 20) + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const tfm::Model switched =
      tfm::load_model(work.path("switch/model.safetensors"), tfm::cpu_backend());
  EXPECT_LT(max_relative_difference(switched, one, where), 1e-5) << where;
}

TEST_F(MpiTrain, KillingOneRankEndsTheJobAndKeepsTheLastCheckpoint) {
  const std::string dir = work.path("killed");
  const std::string err = work.path("killed.err");
  const pid_t job = tfm::testing_support::spawn_in_background(
      {"/bin/sh", "-c", kLauncher + TFM_CLI_PATH + " " + train_flags("killed", 1000000)}, err);
  ASSERT_GT(job, 0);
  // Whatever happens below, the job's process group does not outlive the test.
  const tfm::testing_support::KillGroupOnExit cleanup{job};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir + "/model.safetensors") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors"));
  // Rank processes are the ones whose command line starts with the binary's path.
  const std::string pattern = std::string("^") + TFM_CLI_PATH + " train .*" + dir + " ";
  const std::string kill_one = "kill -KILL $(pgrep -f '" + pattern + "' | tail -n 1)";
  ASSERT_EQ(std::system(kill_one.c_str()), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  int status = 0;
  for (deadline = killed_at + std::chrono::seconds(60); waitpid(job, &status, WNOHANG) == 0;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the job did not end within 60 s of a rank's death";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds, 30.0);
  EXPECT_TRUE(!WIFEXITED(status) || WEXITSTATUS(status) != 0) << "the job reported success";
  EXPECT_NO_THROW(tfm::load_model(dir + "/model.safetensors", tfm::cpu_backend()));
  const CliResult r = work.run_cli(train_flags("killed", 1) + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::printf("job ended %.1f s after the kill; its stderr:\n%s\n", seconds,
              tfm::read_file_bytes(err).c_str());
}

}  // namespace
