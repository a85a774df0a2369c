// Data-parallel `transformer train` under OpenMPI's mpirun: two ranks sharing a global batch end
// where one process with the same batch ends (the gradient sum is the same sum, in another
// order), a run resumes with a different number of ranks, and killing one rank ends the whole
// job quickly with the last checkpoint intact. The replica checks, with ranks given different
// data or options (mpirun's MPMD form): ranks that start from different states fail before the
// first step and write no model (nor change a resumed one), ranks whose updates differ end the
// job at the next --replica-check-every step with the last checkpoint intact, and a stopped rank
// (SIGSTOP: alive but silent) ends the job after --replica-timeout. Skipped when the build or
// the machine lacks MPI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/device_buffer.h"
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
const std::string kMpirun =
    "mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 ";
const std::string kLauncher = kMpirun + "-np 2 ";

bool mpi_available() {
#ifdef TRANSFORMER_WITH_MPI
  return std::system("command -v mpirun >/dev/null 2>&1") == 0;
#else
  return false;
#endif
}

// `data` names the training files (work/<data>.src, .tgt).
std::string train_flags(const std::string& dir, int steps, const std::string& data = "data",
                        int save_every = 10, int check_every = 5) {
  return "train --preset tiny --vocab 32 --ids --train-src " + work.path(data + ".src") +
         " --train-tgt " + work.path(data + ".tgt") + " --valid-src " + work.path("dev.src") +
         " --valid-tgt " + work.path("dev.tgt") + " --model-dir " + work.path(dir) +
         " --max-steps " + std::to_string(steps) +
         " --dropout 0 --batch-tokens 600 --warmup 10 --seed 5 --valid-every 10 --save-every " +
         std::to_string(save_every) + " --log-every 5 --replica-check-every " +
         std::to_string(check_every);
}

// A job of two ranks that run `transformer` with different arguments (mpirun's MPMD form: the
// first program is rank 0), as when the ranks see different files or were given different
// options.
CliResult run_two_ranks(const std::string& rank0_args, const std::string& rank1_args) {
  return work.run_cli(rank0_args + " : -np 1 " + TFM_CLI_PATH + " " + rank1_args, "/dev/null",
                      kMpirun + "-np 1 ");
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

// The paths under work/<dir> (relative to it, sorted), or none when it does not exist.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::exists(work.path(dir))) return files;
  for (const auto& entry : fs::recursive_directory_iterator(work.path(dir)))
    files.push_back(fs::relative(entry.path(), work.path(dir)).string());
  std::sort(files.begin(), files.end());
  return files;
}

// The pids of the rank processes of the job training in `dir`: those whose command line starts
// with the binary's path and names the directory.
std::vector<pid_t> rank_processes(const std::string& dir) {
  const std::string pgrep = "pgrep -f '^" + std::string(TFM_CLI_PATH) + " train .*" + dir + " '";
  std::vector<pid_t> pids;
  if (FILE* out = ::popen(pgrep.c_str(), "r")) {
    for (int pid; std::fscanf(out, "%d", &pid) == 1;) pids.push_back(pid);
    ::pclose(out);
  }
  return pids;
}

// Whether `pid` is still a process training in `dir` (not gone, not a zombie, not a reused pid).
bool still_training_in(pid_t pid, const std::string& dir) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  const std::string command_line((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
  return command_line.find(dir) != std::string::npos;
}

// SIGKILLs the ranks of a job when it goes out of scope. mpirun starts each rank in a process
// group of its own, out of reach of KillGroupOnExit's kill of the job's group, and a rank
// stopped by SIGSTOP would otherwise outlive a test that failed before the job ended (SIGKILL
// ends a stopped process too, without a SIGCONT first).
struct KillRanksOnExit {
  std::vector<pid_t> ranks;
  std::string dir;
  ~KillRanksOnExit() {
    for (pid_t pid : ranks)
      if (still_training_in(pid, dir)) kill(pid, SIGKILL);
  }
};

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
  // The CPU's memory is the host's: MPI sums it where it is, once every rank has said so.
  EXPECT_NE(r.err.find("data parallel: gradients summed with MPI in host memory (device cpu has "
                       "no collectives of its own)"),
            std::string::npos)
      << r.err;
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

// A GPU's gradients and parameters are not in host memory, where MPI reduces: Replicas sums and
// broadcasts them through host copies (tests/replicas_staging_probe.cpp, on a stand-in backend
// whose memory the host reaches only through copies, each block ending at a guard page).
TEST_F(MpiTrain, ReplicasOnAnotherBackendsMemoryGoThroughHostCopies) {
#ifdef TFM_REPLICAS_STAGING_PROBE
  const CliResult r = work.run_program(TFM_REPLICAS_STAGING_PROBE, "", "/dev/null", kLauncher);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0: ok"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 1: ok"), std::string::npos) << r.out << r.err;
#else
  GTEST_SKIP() << "built without MPI";
#endif
}

// Data parallel on GPUs: `--device cuda` gives each rank of a machine a GPU of its own (here
// both share the one there may be), whose gradients are summed through host memory; the job
// ends where one process on the GPU ends. Float32, so that only the summation order differs.
TEST_F(MpiTrain, TwoRanksOnGpusMatchOneGpuProcess) {
  std::string why;
  const std::string gpu = tfm::testing_support::first_gpu_backend(why);
  if (gpu.empty()) GTEST_SKIP() << why;
  CliResult r = work.run_cli(train_flags("gpu_one", 20) + " --device " + gpu);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli(train_flags("gpu_two", 20) + " --device " + gpu, "/dev/null", kLauncher);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("data parallel: 2 ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0 on " + gpu), std::string::npos) << r.err;
  // How the gradients were summed: NCCL refuses two ranks on one GPU, so through host memory
  // here, with NCCL's reason or the reason it was not there.
  const size_t how = r.err.find("data parallel: gradients summed");
  ASSERT_NE(how, std::string::npos) << r.err;
  std::printf("%s\n", r.err.substr(how, r.err.find('\n', how) - how).c_str());
  const tfm::Model one =
      tfm::load_model(work.path("gpu_one/model.safetensors"), tfm::cpu_backend());
  const tfm::Model two =
      tfm::load_model(work.path("gpu_two/model.safetensors"), tfm::cpu_backend());
  std::string where;
  EXPECT_LT(max_relative_difference(two, one, where), 1e-4) << where;
  const tfm::Model start = tfm::load_model(
      work.path("gpu_one/checkpoints/step-000000010.safetensors"), tfm::cpu_backend());
  EXPECT_GT(max_relative_difference(start, one, where), 1e-3);
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

TEST_F(MpiTrain, RanksThatStartFromDifferentStatesFailBeforeTheFirstStepAndWriteNothing) {
  // Rank 1 reads a partial copy of the training data (the first 1400 of its 1500 pairs, as from
  // a copy to a node's own disk that stopped early): its corpus and batch plan differ.
  tfm::testing_support::write_reversal_data(work, "partial", 1400, 3, 12, 11);
  CliResult r = run_two_ranks(train_flags("mixed", 10), train_flags("mixed", 10, "partial"));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the ranks start from different states"), std::string::npos) << r.err;
  // No model, checkpoint, log or temp file. Each rank removes the directory it created, lock
  // and all, as it unwinds; at most the lock stays, where another rank's MPI_Abort ended rank 0
  // first.
  for (const std::string& file : files_under("mixed")) EXPECT_EQ(file, ".lock");
  // The directory is not left in the way of a correct run.
  r = work.run_cli(train_flags("mixed", 1));
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // What sizes cannot tell: the same number of pairs of the same lengths with one token changed
  // (compared by the ids' checksum), and an option that changes every update (--lr-factor).
  const std::string source = tfm::read_file_bytes(work.path("data.src"));
  const size_t first_end = source.find(' ');  // the first line's first id, in [4, 31]
  const int first_id = std::stoi(source.substr(0, first_end));
  work.write_file("edited.src",
                  std::to_string(first_id == 31 ? 30 : first_id + 1) + source.substr(first_end));
  fs::copy_file(work.path("data.tgt"), work.path("edited.tgt"),
                fs::copy_options::overwrite_existing);
  for (const auto& [name, rank1_flags] :
       {std::pair{"edited", train_flags("edited", 10, "edited")},
        std::pair{"lr", train_flags("lr", 10) + " --lr-factor 2"}}) {
    r = run_two_ranks(train_flags(name, 10), rank1_flags);
    EXPECT_NE(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_NE(r.err.find("the ranks start from different states"), std::string::npos)
        << name << ": " << r.err;
    EXPECT_FALSE(fs::exists(work.path(std::string(name) + "/model.safetensors"))) << name;
  }

  // Resumed: rank 1's --max-length drops the pairs longer than 10 tokens from its corpus. The
  // run's files stay byte for byte as they were (without the check, the job would go on to
  // step 20 and overwrite them with a model trained on two different corpora).
  r = work.run_cli(train_flags("resumed", 10));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> files = files_under("resumed");
  const std::string checkpoint = tfm::read_file_bytes(work.path("resumed/checkpoint.safetensors"));
  const std::string model = tfm::read_file_bytes(work.path("resumed/model.safetensors"));
  const std::string resume = train_flags("resumed", 20) + " --resume";
  r = run_two_ranks(resume, resume + " --max-length 10");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the ranks start from different states"), std::string::npos) << r.err;
  EXPECT_EQ(files_under("resumed"), files);
  // (Not EXPECT_EQ: a failure would print megabytes of tensor bytes.)
  EXPECT_TRUE(tfm::read_file_bytes(work.path("resumed/checkpoint.safetensors")) == checkpoint);
  EXPECT_TRUE(tfm::read_file_bytes(work.path("resumed/model.safetensors")) == model);
  EXPECT_EQ(training_state("resumed", "step"), 10);
}

TEST_F(MpiTrain, ReplicasThatDivergeEndTheJobAtTheNextCheckWithTheLastCheckpointIntact) {
#ifndef TFM_MPI_PERTURBING_SHIM
  GTEST_SKIP() << "built without MPI";
#else
  // The same options, data and start on both ranks, but rank 1 receives every gradient sum with
  // its first value off by 1e-3 (tests/mpi_perturbing_shim.c, preloaded), as from a corrupted
  // transfer or a node whose arithmetic differs: the ranks apply different updates. Nothing in
  // the start state can see that; only the parameter check can. Saved every 5 steps and compared
  // every 10: rank 0's step-5 checkpoint is written before the check finds the difference, and
  // at step 10 the check comes before the save. (ASan, in the sanitizer pass, wants its runtime
  // first among the libraries; the shim is loaded before it, and is not instrumented.)
  const char* asan_options = std::getenv("ASAN_OPTIONS");
  const std::string rank1_environment =
      std::string("env LD_PRELOAD=") + TFM_MPI_PERTURBING_SHIM +
      " ASAN_OPTIONS=" + (asan_options ? std::string(asan_options) + ":" : std::string()) +
      "verify_asan_link_order=0 ";
  const std::string flags = train_flags("diverged", 20, "data", 5, 10);
  const CliResult r =
      work.run_cli(flags + " : -np 1 " + rank1_environment + TFM_CLI_PATH + " " + flags,
                   "/dev/null", kMpirun + "-np 1 ");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the ranks' parameters differ after step 10 (replicas diverged)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("start from different states"), std::string::npos) << r.err;
  EXPECT_EQ(training_state("diverged", "step"), 5);
  EXPECT_NO_THROW(tfm::load_model(work.path("diverged/model.safetensors"), tfm::cpu_backend()));
  EXPECT_FALSE(fs::exists(work.path("diverged/checkpoints/step-000000010.safetensors")));
  for (const std::string& file : files_under("diverged"))
    EXPECT_EQ(file.find(".tmp."), std::string::npos) << file;
#endif
}

TEST_F(MpiTrain, AStoppedRankEndsTheJobAfterTheReplicaTimeout) {
  // SIGSTOP: the rank is alive (mpirun sees nothing wrong) but silent, as a hung one is; only
  // the other rank's deadline on its collective can end the job. 5 s: far above any wait
  // between two running ranks on a busy 2-core machine (a step of this model takes
  // milliseconds, rank 0's save tens), and short enough to keep the test quick.
  const std::string dir = work.path("stalled");
  const std::string err = work.path("stalled.err");
  const pid_t job = tfm::testing_support::spawn_in_background(
      {"/bin/sh", "-c",
       kLauncher + TFM_CLI_PATH + " " + train_flags("stalled", 1000000) + " --replica-timeout 5"},
      err);
  ASSERT_GT(job, 0);
  // Whatever happens below, the job's process group does not outlive the test.
  const tfm::testing_support::KillGroupOnExit cleanup{job};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir + "/model.safetensors") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors")) << tfm::read_file_bytes(err);
  const std::vector<pid_t> ranks = rank_processes(dir);
  ASSERT_EQ(ranks.size(), 2u) << tfm::read_file_bytes(err);
  // Nor do its ranks, the stopped one included (they are not in the job's process group).
  const KillRanksOnExit kill_ranks{ranks, dir};
  // The newest rank (usually rank 1); either will do: the survivor reports the timeout.
  ASSERT_EQ(kill(ranks.back(), SIGSTOP), 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  int status = 0;
  for (deadline = stopped_at + std::chrono::seconds(60); waitpid(job, &status, WNOHANG) == 0;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the job did not end within 60 s of a rank's stop (--replica-timeout 5); its stderr:\n"
        << tfm::read_file_bytes(err);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  EXPECT_LT(seconds, 30.0);
  EXPECT_TRUE(!WIFEXITED(status) || WEXITSTATUS(status) != 0) << "the job reported success";
  const std::string log = tfm::read_file_bytes(err);
  EXPECT_NE(log.find("no answer from the other ranks for 5 s"), std::string::npos) << log;
  EXPECT_NE(log.find("(--replica-timeout sets the limit)"), std::string::npos) << log;
  // mpirun ended the stopped rank with the job: left behind, it would keep its memory and, as
  // rank 0, the directory's lock.
  for (deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       still_training_in(ranks.back(), dir) && std::chrono::steady_clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(still_training_in(ranks.back(), dir)) << "the stopped rank outlived the job";
  EXPECT_NO_THROW(tfm::load_model(dir + "/model.safetensors", tfm::cpu_backend()));
  EXPECT_GE(training_state("stalled", "step"), 10);
  const CliResult r = work.run_cli(train_flags("stalled", 1) + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::printf("job ended %.1f s after the stop; its stderr:\n%s\n", seconds, log.c_str());
}

}  // namespace

// The other side of join_collectives' bootstrap for a rank alone: every agreement is what this
// rank says and the shared bytes stay its own; both counted.
struct LoneRank {
  int agreements = 0, shares = 0;
  tfm::CollectiveBootstrap bootstrap() {
    return {[this](std::vector<char>&) { ++shares; },
            [this](bool ok) {
              ++agreements;
              return ok;
            }};
  }
};

// Backend::join_collectives on each GPU as a job of one rank, through the calls a job's ranks
// make (NCCL loaded at run time, a communicator joined, a sum and a broadcast in place on the
// backend's stream, waited for against a deadline; over one rank NCCL moves nothing, so the
// values stay as they were: this checks the calls, not NCCL's sums). NCCL refuses two ranks on
// one GPU, so a machine of one GPU can check no more (MpiTrain.TwoRanksOnGpusMatchOneGpuProcess
// falls back to host memory there and prints why).
TEST(DeviceCollectives, OneRankOnEachGpuSumsAndBroadcastsInPlace) {
  std::string why;
  if (tfm::testing_support::first_gpu_backend(why).empty()) GTEST_SKIP() << why;
  for (const tfm::Backend* backend : tfm::available_backends()) {
    if (backend->memory_is_host()) continue;
    SCOPED_TRACE(backend->name());
    LoneRank alone;
    std::string why_not;
    const tfm::CollectiveWait wait{60, nullptr};
    auto collectives = backend->join_collectives(0, 1, alone.bootstrap(), wait, &why_not);
    if (!collectives && why_not.rfind("NCCL could not be loaded", 0) == 0) {
      EXPECT_EQ(alone.agreements, 1) << "a rank without NCCL answers the first agreement only";
      GTEST_SKIP() << why_not;  // NCCL not installed: a job sums through host memory
    }
    ASSERT_TRUE(collectives) << why_not;
    EXPECT_EQ(alone.agreements, 2);  // that NCCL is there, that every rank joined
    EXPECT_EQ(alone.shares, 1);      // rank 0's unique id
    std::printf("%s: %s\n", backend->name().c_str(), collectives->description().c_str());
    std::vector<float> values(100003);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(float(i)) * 1e3f;
    tfm::DeviceBuffer<float> device;
    float* data = tfm::ensure_size(*backend, device, int64_t(values.size()));
    const int64_t bytes = int64_t(values.size() * sizeof(float));
    backend->copy_from_host(values.data(), bytes, data);
    collectives->sum(data, int64_t(values.size()), wait);
    collectives->broadcast(data, int64_t(values.size()), wait);
    std::vector<float> back(values.size());
    backend->copy_to_host(data, bytes, back.data());
    EXPECT_EQ(back, values);
  }
}

// As rank 0 of two whose rank 1 never comes: joining ends at the wait's deadline with the
// reason, the communicator aborted mid-way, and answers the second agreement (every rank then
// sums through host memory). Its own step of scripts/gpu_check.sh, with a time limit of its own:
// an abort that waited on NCCL's bootstrap would hang here.
TEST(DeviceCollectives, JoiningWithoutTheOtherRankEndsAtTheDeadline) {
  std::string why;
  if (tfm::testing_support::first_gpu_backend(why).empty()) GTEST_SKIP() << why;
  for (const tfm::Backend* backend : tfm::available_backends()) {
    if (backend->memory_is_host()) continue;
    SCOPED_TRACE(backend->name());
    LoneRank alone;
    std::string why_not;
    const auto start = std::chrono::steady_clock::now();
    auto lonely = backend->join_collectives(0, 2, alone.bootstrap(), {2, nullptr}, &why_not);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!lonely && why_not.rfind("NCCL could not be loaded", 0) == 0) GTEST_SKIP() << why_not;
    EXPECT_FALSE(lonely);
    EXPECT_NE(why_not.find("no answer from the other GPUs for 2 s"), std::string::npos) << why_not;
    EXPECT_EQ(alone.agreements, 2);
    EXPECT_LT(seconds, 30.0) << "joining did not end at its deadline";
  }
}
