// Nothing lost, nothing silent, through the real binary: full disks and failing standard output
// are errors that name the file and leave the old file as it was; one training run per model
// directory; decoding, line reading and the primitive cache stay within bounds; checkpoints are
// checked field by field and never replaced by a non-finite one; every text command refuses
// the same bad text; temp files go away on signals and after a crash; FIFOs and mismatched
// shapes are refused before anything blocks or is read; numeric options are range-checked;
// bleu strips a BOM and scores empty references as sacreBLEU does; an early SIGTERM ends
// training cleanly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "backend/cpu/gemm.h"
#include "cli_runner.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "tensor/file_util.h"

namespace {

namespace fs = std::filesystem;
using tfm::testing_support::CliResult;
using Clock = std::chrono::steady_clock;

const tfm::testing_support::CliWorkDir work("tfm_robustness_test");

// One "error: ..." line, the last on stderr (train reports its progress before it), holding
// every fragment.
void expect_error(const CliResult& r, int code, const std::vector<std::string>& fragments) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  const size_t at = r.err.rfind("error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_TRUE(at == 0 || r.err[at - 1] == '\n') << r.err;
  EXPECT_EQ(r.err.find("error: "), at) << r.err;
  const std::string line = r.err.substr(at);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << r.err;
  for (const auto& f : fragments)
    EXPECT_NE(line.find(f), std::string::npos) << "missing \"" << f << "\" in " << r.err;
}

// Waits for a background process; its exit code, or 128 + signal.
int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `ready` every 2 ms until it returns true (once) or `seconds` pass.
bool wait_until(const std::function<bool()>& ready, int seconds = 60) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos)
      found.push_back(entry.path().string());
  return found;
}

// The pid of a process that has ended (a stale temp file's owner).
std::string dead_pid() {
  const pid_t pid = tfm::testing_support::spawn_in_background({"/bin/true"}, "/dev/null");
  wait_for(pid);
  return std::to_string(pid);
}

// A model directory with a SentencePiece vocabulary (text commands), built once.
const std::string& text_model() {
  static const std::string dir = [] {
    std::ofstream en(work.path("text.en")), es(work.path("text.es"));
    const char* words[] = {"the", "house", "is", "red", "green", "a", "small", "big", "dog", "cat"};
    std::mt19937 random(3);
    for (int i = 0; i < 300; ++i) {
      const int len = 3 + int(random() % 5);
      for (int j = 0; j < len; ++j) {
        en << words[random() % 10] << (j + 1 < len ? " " : "\n");
        es << words[random() % 10] << (j + 1 < len ? " " : "\n");
      }
    }
    en.close();
    es.close();
    const std::string d = work.path("text_model");
    fs::create_directories(d);
    CliResult r = work.run_cli("vocab --input " + work.path("text.en") + " " +
                               work.path("text.es") + " --size 60 -o " + d + "/vocab.spm");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = work.run_cli("init --preset tiny --vocab 60 -o " + d + "/model.safetensors");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }();
  return dir;
}

// A tiny --ids model and reversal data for training and decoding.
const std::string& ids_model() {
  static const std::string path = [] {
    tfm::testing_support::write_reversal_data(work, "rev", 300, 3, 8, 1);
    const std::string p = work.path("ids.safetensors");
    const CliResult r = work.run_cli("init --preset tiny --vocab 32 -o " + p);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

std::string train_flags(const std::string& dir) {
  ids_model();
  return "train --preset tiny --vocab 32 --ids --train-src " + work.path("rev.src") +
         " --train-tgt " + work.path("rev.tgt") + " --warmup 50 --log-every 0 --valid-every 0 " +
         "--model-dir " + dir;
}

// A small tmpfs at `dir` (needs root); false when this machine does not allow it.
bool mount_small_tmpfs(const std::string& dir, const std::string& size) {
  fs::create_directories(dir);
  return ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
}

// Unmounts a tmpfs when the test ends however it ends: a failed ASSERT returns early, and the
// mount would otherwise outlive the test (and its temporary directory's removal).
struct UnmountAtExit {
  std::string dir;
  ~UnmountAtExit() { ::umount(dir.c_str()); }
};

TEST(FullDisk, VocabFailsNamingTheFileAndKeepsTheOldOne) {
  text_model();
  const std::string disk = work.path("disk");
  if (!mount_small_tmpfs(disk, "1m"))
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "; mounting needs root with CAP_SYS_ADMIN)";
  const UnmountAtExit unmount{disk};
  const std::string target = disk + "/v.spm";
  CliResult r = work.run_cli("vocab --input " + work.path("text.en") + " --size 40 -o " + target);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string old = tfm::read_file_bytes(target);
  // Fill the disk but for a few KB: the new vocabulary cannot be written next to the old one.
  {
    std::ofstream filler(disk + "/filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), long(block.size())) && filler.flush()) {
    }
  }
  r = work.run_cli("vocab --force --input " + work.path("text.en") + " --size 50 -o " + target);
  expect_error(r, 1, {target, "No space left on device"});
  EXPECT_EQ(tfm::read_file_bytes(target), old);
  EXPECT_TRUE(temp_files_in(disk).empty());
  // The same for translate -o and score -o.
  const std::string lines = work.write_file("few.txt", "4 5 6\n7 8\n");
  r = work.run_cli("translate --ids --model " + ids_model() + " -i " + lines + " -o " + target);
  expect_error(r, 1, {target, "No space left on device"});
  EXPECT_EQ(tfm::read_file_bytes(target), old);
}

TEST(FullDisk, WritingToDevFullIsAnError) {
  const std::string lines = work.write_file("dev_full.txt", "4 5 6\n7 8\n");
  expect_error(
      work.run_cli("translate --ids --model " + ids_model() + " -i " + lines + " -o /dev/full"), 1,
      {"/dev/full", "No space left on device"});
  expect_error(work.run_cli("score --ids --model " + ids_model() + " --src " + lines + " --tgt " +
                            lines + " -o /dev/full"),
               1, {"/dev/full", "No space left on device"});
}

// The files of a directory (not recursive), by name.
std::map<std::string, std::string> directory_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    files[entry.path().filename().string()] = tfm::read_file_bytes(entry.path().string());
  return files;
}

// Runs `command` with files limited to about 50 KB (SIGXFSZ ignored, so a write past the limit
// fails with EFBIG as on a full disk, and only the files larger than that: a vocabulary gets
// written, a model does not). No tmpfs or permission trick needed, root or not.
CliResult run_with_small_files(const std::string& command) {
  return work.run_cli(command, "/dev/null", "trap '' XFSZ; ulimit -f 100; ");
}

// Every command that writes a directory of several files replaces an existing one as a whole:
// the new one beside it, then swapped in. A failure after the first new file (the vocabulary
// fits under the limit, the model does not) leaves the old directory byte for byte as it was,
// where export once removed the old vocabulary first and every writer wrote the new
// vocabulary beside the old model.
TEST(FullDisk, AReplacedDirectoryStaysWholeWhenTheNewOneCannotBeWritten) {
  const std::string model = tfm::testing_support::import_transliteration_model(work);
  struct Case {
    std::string command, output;
    std::vector<std::string> old_files;
  };
  const std::string export_dir = work.path("old_export"), import_dir = work.path("old_import"),
                    quantize_dir = work.path("old_quantize");
  const std::string aren = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  const Case cases[] = {
      {"export-ctranslate2 --force --model " + model + " -o " + export_dir,
       export_dir,
       {"model.bin", "config.json", "shared_vocabulary.json"}},
      {"import-ctranslate2 --force " + aren + " -o " + import_dir,
       import_dir,
       {"model.safetensors", "source_vocabulary.txt", "target_vocabulary.txt"}},
      {"quantize --force --type float32 --model " + model + " -o " + quantize_dir,
       quantize_dir,
       {"model.safetensors", "source_vocabulary.txt", "target_vocabulary.txt"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.command);
    fs::create_directories(c.output);
    for (const std::string& name : c.old_files)
      work.write_file(fs::path(c.output).filename().string() + "/" + name, "old " + name + "\n");
    const auto old = directory_files(c.output);
    expect_error(run_with_small_files(c.command), 1, {"File too large"});
    EXPECT_TRUE(directory_files(c.output) == old) << "the old directory changed";
    for (const auto& entry : fs::directory_iterator(work.dir()))
      EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
    // Without the limit the new directory replaces the old one whole: none of its files stay.
    const CliResult r = work.run_cli(c.command);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& [name, bytes] : directory_files(c.output))
      EXPECT_TRUE(bytes != (old.count(name) ? old.at(name) : "")) << name << " is the old one";
  }
  // The export of source and target vocabularies over one with a shared vocabulary: the old
  // shared_vocabulary.json (which CTranslate2 would read first) is gone.
  EXPECT_FALSE(fs::exists(export_dir + "/shared_vocabulary.json"));
  EXPECT_TRUE(fs::exists(export_dir + "/source_vocabulary.json"));
}

// --force replaces what the command writes, never a directory holding anything else; the temp
// directory of a process killed while writing one is removed by the next writer, and a directory
// it had moved aside goes back in place.
TEST(FullDisk, ADirectoryIsReplacedOnlyWhenItHoldsWhatTheCommandWrites) {
  const std::string model = tfm::testing_support::import_transliteration_model(work);
  const std::string out = work.path("mixed");
  fs::create_directories(out);
  work.write_file("mixed/model.bin", "old model");
  work.write_file("mixed/notes.txt", "mine");
  expect_error(work.run_cli("export-ctranslate2 --force --model " + model + " -o " + out), 1,
               {out, "\"notes.txt\"", "choose a new or empty directory"});
  EXPECT_EQ(tfm::read_file_bytes(out + "/notes.txt"), "mine");
  EXPECT_EQ(tfm::read_file_bytes(out + "/model.bin"), "old model");

  const std::string pid = dead_pid();
  const std::string stale = work.path("fresh.tmp." + pid);
  fs::create_directories(stale);
  work.write_file("fresh.tmp." + pid + "/model.bin", "half");
  const std::string moved_aside = work.path("aside.old.tmp." + pid);
  fs::create_directories(moved_aside);
  work.write_file("aside.old.tmp." + pid + "/model.bin", "the only copy");
  work.write_file("aside.tmp." + pid + "/model.bin", "new, complete");
  CliResult r = work.run_cli("export-ctranslate2 --model " + model + " -o " + work.path("fresh"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  r = work.run_cli("export-ctranslate2 --force --model " + model + " -o " + work.path("aside"));
  EXPECT_FALSE(fs::exists(moved_aside));
  EXPECT_FALSE(fs::exists(work.path("aside.tmp." + pid)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST(StandardOutput, WriteErrorsAreReportedWithExitCode1) {
  const std::string lines = work.write_file("stdout.txt", "4 5 6\n7 8\n");
  const std::string ref = work.write_file("ref.txt", "a b c\n");
  for (const std::string& command :
       {"translate --ids --model " + ids_model() + " -i " + lines,
        "score --ids --model " + ids_model() + " --src " + lines + " --tgt " + lines,
        "bleu --ref " + ref + " --input " + ref, std::string("info --preset tiny --vocab 32")}) {
    SCOPED_TRACE(command);
    expect_error(work.run_cli(command + " >/dev/full"), 1,
                 {"standard output: write failed (No space left on device)"});
  }
}

// Training met a new GEMM row count with nearly every batch, and kept a ~120 KB oneDNN primitive
// for each: 2 GB more after one epoch of the quickstart. The cache is bounded now, and rows run
// as a multiple of 32 plus a rest below 32, so 2,700 row counts need ~115 primitives.
TEST(Memory, GemmShapesDoNotGrowMemoryWithoutBound) {
  auto rss_kb = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0l;
  };
  const int64_t n = 256, k = 256, max_rows = 3000;
  std::vector<float> a(size_t(max_rows * k), 0.5f), b(size_t(n * k), 0.25f),
      c(size_t(max_rows * n));
  for (int64_t m = 1; m <= 300; ++m)  // warm up allocator and thread pools
    tfm::gemm(false, true, m, n, k, 1.f, a.data(), k, b.data(), k, 0.f, c.data(), n);
  const long before = rss_kb();
  for (int64_t m = 301; m <= max_rows; ++m)
    tfm::gemm(false, true, m, n, k, 1.f, a.data(), k, b.data(), k, 0.f, c.data(), n);
  const long grown_mb = (rss_kb() - before) / 1024;
  std::printf("RSS grew by %ld MB over %lld new GEMM shapes\n", grown_mb,
              (long long)(max_rows - 300));
  // Measured: 4 MB; with a primitive per row count (all 2,700 in the 4,096-shape cache), 145 MB.
  EXPECT_LT(grown_mb, 40);
  EXPECT_FLOAT_EQ(c[size_t((max_rows - 1) * n)], 0.5f * 0.25f * float(k));
}

TEST(ModelDirLock, ASecondRunOnTheSameDirectoryIsRefusedNamingThePid) {
  const std::string dir = work.path("locked");
  std::vector<std::string> argv = {TFM_CLI_PATH};
  std::istringstream words(train_flags(dir) + " --max-steps 100000 --save-every 5");
  for (std::string w; words >> w;) argv.push_back(w);
  const pid_t pid = tfm::testing_support::spawn_in_background(argv, dir + ".stderr");
  ASSERT_GT(pid, 0);
  const tfm::testing_support::KillGroupOnExit cleanup{pid};
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir + "/model.safetensors"); }));
  const std::string saved_log = tfm::read_file_bytes(dir + "/train.log.jsonl");
  expect_error(work.run_cli(train_flags(dir) + " --max-steps 10 --resume"), 1,
               {dir + " is in use by another training run", "pid " + std::to_string(pid)});
  expect_error(work.run_cli(train_flags(dir) + " --max-steps 10"), 1, {"in use", "pid"});
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_for(pid), 0) << tfm::read_file_bytes(dir + ".stderr");
  // With the first run gone, the directory is free again (flock dies with its process).
  const CliResult r = work.run_cli(train_flags(dir) + " --max-steps 1 --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(DecodeMemory, AHugeBeamIsRefusedBeforeAllocating) {
  const std::string lines = work.write_file("beam.txt", "4 5 6\n7 8 9 10\n11\n");
  const auto start = Clock::now();
  CliResult r =
      work.run_cli("translate --ids --model " + ids_model() + " -i " + lines + " --beam 1000000");
  expect_error(r, 1, {"decoding 1 sentence", "beam 1000000", "needs", "of memory this machine"});
  r = work.run_cli("translate --ids --max-memory 64M --model " + ids_model() + " -i " + lines +
                   " --beam 20000");
  expect_error(r, 1, {"beam 20000", "allowed by --max-memory"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 20.0);
  // A beam that fits still decodes.
  r = work.run_cli("translate --ids --max-memory 64M --model " + ids_model() + " -i " + lines +
                   " --beam 8");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Rewrites one checkpoint tensor element or training-state field of `dir`'s checkpoint.
void corrupt_checkpoint(const std::string& dir, const std::string& tensor, float value,
                        const std::string& state_key = "", const nlohmann::json& state_value = {}) {
  const std::string path = dir + "/checkpoint.safetensors";
  tfm::allow_nonfinite_weights(true);
  tfm::SafetensorsFile file = tfm::read_safetensors(path);
  if (!tensor.empty()) file.tensors.at(tensor).data[3] = value;
  if (!state_key.empty()) {
    nlohmann::json state = nlohmann::json::parse(file.metadata.at("training_state"));
    state[state_key] = state_value;
    file.metadata["training_state"] = state.dump();
  }
  tfm::write_safetensors(path, file.tensors, file.metadata);
  tfm::allow_nonfinite_weights(false);
}

TEST(Checkpoint, NonFiniteOptimizerStateAndBadStateFieldsAreRefusedAtResume) {
  const std::string dir = work.path("ckpt");
  CliResult r = work.run_cli(train_flags(dir) + " --max-steps 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string good = tfm::read_file_bytes(dir + "/checkpoint.safetensors");
  const std::string name = "adam_v.decoder.layers.0.ffn.fc1.weight";

  corrupt_checkpoint(dir, name, std::nanf(""));
  r = work.run_cli(train_flags(dir) + " --max-steps 10 --resume");
  expect_error(r, 1, {"checkpoint.safetensors", name, "NaN"});
  tfm::write_bytes_atomically(dir + "/checkpoint.safetensors", good);

  // A finite run whose weights overflow (a learning rate of 3e38, near the largest float: one
  // update takes the weights there) never saves them over the last finite checkpoint.
  r = work.run_cli(train_flags(dir) +
                   " --max-steps 10 --save-every 1 --resume --lr-schedule constant --lr 3e38");
  expect_error(r, 1, {"step 6", "NaN or Inf", "not saved", "last checkpoint"});
  EXPECT_TRUE(tfm::read_file_bytes(dir + "/checkpoint.safetensors") == good);

  corrupt_checkpoint(dir, name, -1.f);
  expect_error(work.run_cli(train_flags(dir) + " --max-steps 10 --resume"), 1, {"negative"});
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"step", -3},
                                                           {"epoch", 1.5},
                                                           {"batch_index", "7"},
                                                           {"train_seconds", -1.0},
                                                           {"compute_type", "int8"},
                                                           {"compute_type", 16},
                                                           {"sentencepiece_alphas", {0.1, 1.5}},
                                                           {"sentencepiece_alphas", 0.1},
                                                           {"batch_index", 1000000}}) {
    SCOPED_TRACE(key);
    tfm::write_bytes_atomically(dir + "/checkpoint.safetensors", good);
    corrupt_checkpoint(dir, "", 0.f, key, value);
    expect_error(work.run_cli(train_flags(dir) + " --max-steps 10 --resume"), 1,
                 {"checkpoint.safetensors", key});
  }
  tfm::write_bytes_atomically(dir + "/checkpoint.safetensors", good);
  r = work.run_cli(train_flags(dir) + " --max-steps 6 --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // `info` reads a checkpoint: config and training state.
  r = work.run_cli("info --model " + dir + "/checkpoint.safetensors");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("training checkpoint:\n  step 6,"), std::string::npos) << r.out;
  // and the run's directory: the model, then where its training stands.
  r = work.run_cli("info --model " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("training checkpoint (" + dir + "/checkpoint.safetensors):\n  step 6,"),
            std::string::npos)
      << r.out;
}

TEST(Resume, AnEmptyDirectorySaysItStartsFresh) {
  const std::string dir = work.path("fresh");
  CliResult r = work.run_cli(train_flags(dir) + " --max-steps 1 --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("holds no checkpoint yet; starting a new run"), std::string::npos) << r.err;
  r = work.run_cli("train --ids --train-src " + work.path("rev.src") + " --train-tgt " +
                   work.path("rev.tgt") + " --model-dir " + work.path("nothing") + " --resume");
  expect_error(r, 1, {"holds no checkpoint to continue"});
  // The same command line continues the run it started; one describing another model does not.
  r = work.run_cli(train_flags(dir) + " --max-steps 2 --resume");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string other = train_flags(dir);
  other.replace(other.find("--vocab 32"), 10, "--vocab 40");
  expect_error(work.run_cli(other + " --max-steps 3 --resume"), 1,
               {"--resume: the run in " + dir +
                " has src_vocab_size 32, not the 40 of --preset/--config; leave them out to "
                "continue it, or choose another --model-dir"});
  // So is an --init model of another shape; one of the same shape trains.
  const std::string init = " --init " + ids_model() + " --max-steps 1";
  EXPECT_EQ(work.run_cli(train_flags(work.path("init_run")) + init).exit_code, 0);
  std::string init_other = train_flags(work.path("init_run_2")) + init;
  init_other.replace(init_other.find("--vocab 32"), 10, "--vocab 40");
  expect_error(work.run_cli(init_other), 1,
               {"--init " + ids_model() +
                " has src_vocab_size 32, not the 40 of --preset/--config; leave them out to "
                "train it as it is"});
  // Its checkpoint is not a model: translate says which file is.
  expect_error(work.run_cli("translate --ids --model " + dir + "/checkpoint.safetensors",
                            work.path("rev.src")),
               1,
               {dir + "/checkpoint.safetensors: a training checkpoint (the model with its "
                      "optimizer state) is for train --resume; the model is the model.safetensors "
                      "beside it"});
}

// A bare model file has no vocabulary: translate and score point to --ids, which they have;
// serve and export-ctranslate2, which do not have it, do not.
TEST(MissingVocabulary, OnlyCommandsWithIdsSuggestIt) {
  const std::string bare = ids_model();
  const std::string message =
      bare + ": a bare model file has no vocabulary; pass its model directory";
  CliResult r = work.run_cli("translate --model " + bare, work.path("rev.src"));
  expect_error(r, 1, {message + ", or use --ids for token ids"});
  r = work.run_cli("score --model " + bare + " --src " + work.path("rev.src") + " --tgt " +
                   work.path("rev.tgt"));
  expect_error(r, 1, {message + ", or use --ids for token ids"});
  for (const std::string& command :
       {"serve --port 0 --model " + bare,
        "export-ctranslate2 --model " + bare + " -o " + work.path("no_vocabulary_ct2")}) {
    r = work.run_cli(command);
    expect_error(r, 1, {message});
    EXPECT_EQ(r.err.find("--ids"), std::string::npos) << r.err;
  }
}

// An output that is a symbolic link is written through it: the link stays and its target is
// replaced (a rename onto the link replaced the link, and -o /dev/stdout with standard output in
// a file replaced the system's /dev/stdout); a link to an open descriptor is written into. An
// output that is one of the command's inputs, however named, is refused before any work.
TEST(Outputs, ALinkIsWrittenThroughAndAnInputIsNeverTheOutput) {
  const std::string ref = work.write_file("links_ref.txt", "a b c d\n");
  const std::string target = work.write_file("links_target.txt", "old\n");
  const std::string bleu = "bleu -r " + ref + " -i " + ref + " -o ";
  const std::vector<std::pair<std::string, std::string>> links = {
      {work.path("link_to_file"), target},                         // an existing file
      {work.path("link_to_nothing"), work.path("links_new.txt")},  // a file to create
  };
  for (const auto& [link, file] : links) {
    fs::remove(link);
    fs::create_symlink(file, link);
    CliResult r = work.run_cli(bleu + link);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(tfm::read_file_bytes(file).rfind("BLEU = 100.00", 0), 0u) << file;
  }
  const std::string descriptor = work.path("link_to_stdout"), out = work.path("links_out.txt");
  fs::remove(descriptor);
  fs::create_symlink("/proc/self/fd/1", descriptor);
  ASSERT_EQ(work.run_cli(bleu + descriptor + " >" + out).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(descriptor));
  EXPECT_EQ(tfm::read_file_bytes(out).rfind("BLEU = 100.00", 0), 0u);

  const std::string input = work.write_file("links_input.txt", "4 5 6\n");
  const std::string input_link = work.path("link_to_input");
  fs::remove(input_link);
  fs::create_symlink(input, input_link);
  const std::string translate = "translate --ids --model " + ids_model() + " -i " + input;
  for (const std::string& output : {input, input_link})
    expect_error(work.run_cli(translate + " -o " + output), 2,
                 {"-o " + output + " is also an input (" + input + "); it would be replaced"});
  expect_error(work.run_cli(translate + " --attention-file " + input), 2,
               {"--attention-file " + input + " is also an input"});
  expect_error(work.run_cli("score --ids --model " + ids_model() + " --src " + input + " --tgt " +
                            input + " -o " + input_link),
               2, {"-o " + input_link + " is also an input"});
  expect_error(work.run_cli(bleu + ref), 2, {"-o " + ref + " is also an input"});
  expect_error(work.run_cli("vocab --force --size 8 --input " + ref + " -o " + ref), 2,
               {"-o " + ref + " is also an input"});
  EXPECT_EQ(tfm::read_file_bytes(input), "4 5 6\n");
  EXPECT_EQ(tfm::read_file_bytes(ref), "a b c d\n");
}

// The sizes SentencePiece cannot train are said with this command's options and SentencePiece's
// own numbers (its message named --vocab_size, --character_coverage and its source lines).
TEST(Vocab, SizesTheTextCannotTakeAreSaidInTheCommandsTerms) {
  const std::string one = work.write_file("vocab_one.txt", "a\n");
  const std::string two = work.write_file("vocab_two.txt", "a b\nb a\n");
  std::string chars;
  for (char32_t c = 0x4e00; c < 0x4e00 + 200; ++c) {
    chars += char(0xe0 | (c >> 12));
    chars += char(0x80 | ((c >> 6) & 0x3f));
    chars += char(0x80 | (c & 0x3f));
    chars += ' ';
  }
  const std::string cjk = work.write_file("vocab_cjk.txt", chars + "\n");
  const std::string out = " -o " + work.path("vocab_sizes.spm");
  expect_error(work.run_cli("vocab --size 8 --input " + one + out), 1,
               {"--size 8: the text yields only 7 pieces (its characters, their merges and the 4 "
                "special tokens); give more text"});
  expect_error(work.run_cli("vocab --size 50 --input " + two + out), 1,
               {"--size 50: the text yields only 9 pieces (its characters, their merges and the "
                "4 special tokens); give more text or a --size of at most 9"});
  expect_error(work.run_cli("vocab --size 20 --input " + cjk + out), 1,
               {"--size 20 is smaller than the 205 pieces the text's characters and the 4 "
                "special tokens need; raise --size or lower --character-coverage"});
  EXPECT_FALSE(fs::exists(work.path("vocab_sizes.spm")));
}

// Validation options that cannot work are refused before any data is read: half a validation
// set (it was found after the training data had been read and encoded), and --early-stopping
// without one (it was ignored).
TEST(EarlyChecks, AValidationSetIsWholeAndEarlyStoppingNeedsOne) {
  const std::string dir = work.path("validation_checks_run");
  expect_error(work.run_cli(train_flags(dir) + " --valid-src " + work.path("rev.src")), 1,
               {"give both --valid-src and --valid-tgt"});
  expect_error(work.run_cli(train_flags(dir) + " --early-stopping 2"), 1,
               {"--early-stopping needs a validation set: --valid-src and --valid-tgt"});
  EXPECT_FALSE(fs::exists(dir));
}

TEST(LineReading, LongLinesAndEndlessInputAreCapped) {
  const std::string ref = work.write_file("short_ref.txt", "a b\n");
  const auto start = Clock::now();
  expect_error(work.run_cli("bleu --ref /dev/zero --input " + ref), 1,
               {"/dev/zero:1", "line longer than 1048576 bytes", "--max-line-bytes"});
  expect_error(work.run_cli("bleu --ref " + ref, "/dev/zero"), 1, {"stdin:1", "longer"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 20.0);
  const std::string lines = work.write_file("lines.txt", "short\n0123456789abcdefghij\n");
  expect_error(work.run_cli("--max-line-bytes 10 bleu --ref " + lines + " --input " + lines), 1,
               {"lines.txt:2", "longer than 10 bytes"});
  EXPECT_EQ(work.run_cli("--max-line-bytes 20 bleu --ref " + lines + " --input " + lines).exit_code,
            0);
}

TEST(TextInput, EveryTextCommandRefusesTheSameBadText) {
  const std::string model = text_model();
  const std::string good = work.write_file("good.txt", "the house\nthe dog\n");
  const std::string bad_utf8 = work.write_file("bad_utf8.txt", "the house\nthe \xc3\x28 dog\n");
  const std::string nul = work.write_file("nul.txt", std::string("the house\n\0\0\0\n", 14));
  for (const std::string& bad : {bad_utf8, nul}) {
    const std::string why = bad == nul ? "NUL byte" : "not valid UTF-8";
    const std::string at = fs::path(bad).filename().string() + ":2";
    expect_error(work.run_cli("score --model " + model + " --src " + bad + " --tgt " + good), 1,
                 {at, why});
    expect_error(work.run_cli("score --model " + model + " --src " + good + " --tgt " + bad), 1,
                 {at, why});
    expect_error(work.run_cli("translate --model " + model + " -i " + bad), 1, {at, why});
    expect_error(work.run_cli("translate --model " + model, bad), 1, {"stdin:2", why});
    expect_error(work.run_cli("bleu --ref " + good + " --input " + bad), 1, {at, why});
    expect_error(
        work.run_cli("train --preset tiny --vocabs " + model + "/vocab.spm --train-src " + bad +
                     " --train-tgt " + good + " --model-dir " + work.path("bad_text_run")),
        1, {at, why});
  }
}

TEST(TempFiles, StaleOnesAreRemovedAndOwnOnesGoOnSigterm) {
  // Left by a killed process: removed the next time that file is written.
  const std::string dir = work.path("temps");
  fs::create_directories(dir + "/run/checkpoints");
  const std::string stale = work.write_file("temps/out.txt.tmp." + dead_pid(), "junk");
  const std::string lines = work.write_file("temps_in.txt", "4 5\n");
  CliResult r = work.run_cli("translate --ids --model " + ids_model() + " -i " + lines + " -o " +
                             dir + "/out.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  // A training run removes its directory's stale temps when it starts; live owners' stay.
  const std::string pid = dead_pid();
  work.write_file("temps/run/checkpoint.safetensors.tmp." + pid, "junk");
  work.write_file("temps/run/checkpoints/step-000000001.safetensors.tmp." + pid, "junk");
  work.write_file("temps/run/model.safetensors.tmp.1", "init's");  // pid 1 is alive
  r = work.run_cli(train_flags(dir + "/run") + " --max-steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(temp_files_in(dir + "/run"),
            std::vector<std::string>{dir + "/run/model.safetensors.tmp.1"});

  // SIGTERM while a large model file is being written: its temp file is removed. The signal
  // must arrive while the file is written; an attempt that comes too late (the file complete)
  // is removed and tried again.
  const std::string big = dir + "/big.safetensors";
  bool caught_writing = false;
  for (int attempt = 0; attempt < 8 && !caught_writing; ++attempt) {
    fs::remove(big);
    const pid_t writer = tfm::testing_support::spawn_in_background(
        {TFM_CLI_PATH, "init", "--preset", "base", "--vocab", "32000", "-o", big}, dir + ".stderr");
    ASSERT_GT(writer, 0);
    const tfm::testing_support::KillGroupOnExit cleanup{writer};
    const std::string temp = big + ".tmp." + std::to_string(writer);
    ASSERT_TRUE(wait_until([&] { return fs::exists(temp) || fs::exists(big); }));
    caught_writing = !fs::exists(big);
    kill(writer, SIGTERM);
    const int code = wait_for(writer);
    if (caught_writing) {
      EXPECT_EQ(code, 128 + SIGTERM);
    }
  }
  ASSERT_TRUE(caught_writing) << "8 attempts, and each model was written before the signal";
  EXPECT_FALSE(fs::exists(big));
  EXPECT_EQ(temp_files_in(dir), std::vector<std::string>{dir + "/run/model.safetensors.tmp.1"});
}

TEST(EarlyChecks, FifosAndMismatchedShapesAreRefusedAtOnce) {
  const std::string fifo = work.path("a.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::string lines = work.write_file("fifo_in.txt", "4 5\n");
  const auto start = Clock::now();
  for (const std::string& command :
       {"translate --ids --model " + fifo + " -i " + lines,
        train_flags(work.path("fifo_run")) + " --init " + fifo,
        "average " + fifo + " " + ids_model() + " -o " + work.path("avg.safetensors"),
        "info --model " + fifo}) {
    SCOPED_TRACE(command);
    expect_error(work.run_cli(command, "/dev/null", "timeout 20 "), 1,
                 {fifo, "not a regular file"});
  }
  const std::string dir = work.path("fifo_vocab");
  fs::create_directories(dir);
  fs::copy_file(ids_model(), dir + "/model.safetensors");
  ASSERT_EQ(mkfifo((dir + "/vocab.spm").c_str(), 0644), 0);
  expect_error(work.run_cli("translate --model " + dir + " -i " + lines), 1,
               {"vocab.spm", "not a regular file"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);

  // A declared shape that does not fit the config is refused before the data is read: with a
  // memory limit below the data, the shape is what is reported, not the memory.
  tfm::SafetensorsFile file = tfm::read_safetensors(ids_model());
  file.tensors.at("decoder.layers.0.ffn.fc1.weight") = tfm::Tensor({128, 64 + 1});
  file.tensors["decoder.layers.0.ffn.fc2.weight"] = tfm::Tensor({64, 8192});
  const std::string wrong = work.path("wrong_shape.safetensors");
  tfm::write_safetensors(wrong, file.tensors, file.metadata);
  expect_error(work.run_cli("--max-memory 1M translate --ids --model " + wrong + " -i " + lines), 1,
               {"has shape", "expected"});
}

TEST(Options, OutOfRangeNumbersAreUsageErrorsNamingTheOption) {
  const std::string translate = "translate --ids --model " + ids_model() + " ";
  const std::string train = train_flags(work.path("options_run")) + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {translate + "--max-length-a inf", "--max-length-a"},
      {translate + "--max-length-a nan", "--max-length-a"},
      {translate + "--max-length-a 1e30", "--max-length-a"},
      {translate + "--max-length-b -1", "--max-length-b"},
      {translate + "--max-length -1", "--max-length"},
      {translate + "--max-length 0", "--max-length"},
      {translate + "--alpha nan", "--alpha"},
      {translate + "--alpha -1", "--alpha"},
      {translate + "--nbest 0", "--nbest"},
      {translate + "--beam 0", "--beam"},
      {translate + "--min-length -2", "--min-length"},
      {train + "--lr -1", "--lr"},
      {train + "--lr-factor -1", "--lr-factor"},
      {train + "--lr-factor inf", "--lr-factor"},
      {train + "--clip-norm -1", "--clip-norm"},
      {train + "--lr-cooldown 1.5", "--lr-cooldown"},
      {train + "--lr-cooldown -0.1", "--lr-cooldown"},
      {train + "--keep -1", "--keep"},
      {train + "--adam-beta2 2", "--adam-beta2"},
      {train + "--adam-beta1 1", "--adam-beta1"},
      {train + "--adam-eps 0", "--adam-eps"},
      {train + "--label-smoothing 1", "--label-smoothing"},
      {train + "--dropout -0.1", "--dropout"},
      {train + "--max-minutes -5", "--max-minutes"},
      {train + "--valid-every -1", "--valid-every"},
      {train + "--max-length 0", "--max-length"},
      {train + "--accumulate 1025", "--accumulate"},
      {train + "--lr 1e39", "--lr"},                  // inf as a float
      {train + "--adam-eps 1e-50", "--adam-eps"},     // 0 as a float
      {train + "--dropout 0.99999999", "--dropout"},  // 1 as a float
      {"vocab --input " + work.path("rev.src") + " -o x --character-coverage 0",
       "--character-coverage"},
      {"vocab --input " + work.path("rev.src") + " -o x --size 7", "--size"},
      {"--threads -1 info --preset tiny --vocab 8", "--threads"},
      {"--max-line-bytes 0 info --preset tiny --vocab 8", "--max-line-bytes"},
  };
  for (const auto& [command, option] : cases) {
    SCOPED_TRACE(command);
    const CliResult r = work.run_cli(command);
    expect_error(r, 2, {"error: " + option + ": must be "});
    EXPECT_EQ(r.err.find("1797693"), std::string::npos) << r.err;
  }
  expect_error(work.run_cli(train + "--dropout 0.99999999"), 2,
               {"--dropout: must be in [0, 1), not 0.99999999 (1 as a 32-bit float)"});
  expect_error(work.run_cli("--max-memory 99999999999999999999G info --preset tiny --vocab 8"), 2,
               {"--max-memory: \"99999999999999999999G\" is more than 8 EiB"});
  EXPECT_FALSE(fs::exists(work.path("options_run")));
}

TEST(Bleu, AByteOrderMarkIsDroppedAndEmptyReferencesScoreAsInSacrebleu) {
  const std::string hyp = work.write_file("bom_hyp.txt", "\xEF\xBB\xBFhello world\n");
  const std::string ref = work.write_file("bom_ref.txt", "hello world\n");
  CliResult r = work.run_cli("bleu --ref " + ref + " --input " + hyp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // str() of sacreBLEU 2.5.1's BLEU / chrF results for the line without the byte order mark
  // (tests/fixtures/sacrebleu_values.py): two words, so no 3- or 4-grams. sacreBLEU's own command
  // line would keep U+FEFF as part of the first word.
  EXPECT_EQ(r.out,
            "BLEU = 0.00 100.0/100.0/0.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 2 ref_len = 2)\n"
            "chrF2 = 100.00\n");
  // sacreBLEU ≥ 2.2 scores an empty reference line as a reference of length 0 (the lines are
  // str() of sacreBLEU 2.5.1's BLEU / chrF results, tests/fixtures/sacrebleu_values.py).
  const std::string hyps = work.write_file(
      "er_hyp.txt", "The dog bit the man.\nIt wasn't surprising.\nThe man had just bitten him.\n");
  const std::string refs =
      work.write_file("er_ref.txt", "The dog bit the man.\n\nThe man bit him first.\n");
  r = work.run_cli("bleu --ref " + refs + " --input " + hyps);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "BLEU = 43.06 58.8/42.9/36.4/37.5 (BP = 1.000 ratio = 1.417 hyp_len = 17 ref_len = 12)\n"
      "chrF2 = 63.98\n");
}

// SIGTERM while train is still loading (here: blocked opening a FIFO as its data) ends it
// cleanly once it can act, with a message, instead of killing it by the signal.
TEST(EarlySigterm, TrainStoppedBeforeItsFirstStepExitsCleanly) {
  ids_model();
  const std::string fifo = work.path("train_src.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::string dir = work.path("early");
  const pid_t pid = tfm::testing_support::spawn_in_background(
      {TFM_CLI_PATH, "train", "--preset", "tiny", "--vocab", "32", "--ids", "--train-src", fifo,
       "--train-tgt", work.path("rev.tgt"), "--model-dir", dir, "--max-steps", "5"},
      dir + ".stderr");
  ASSERT_GT(pid, 0);
  const tfm::testing_support::KillGroupOnExit cleanup{pid};
  // The signal comes while train is blocked opening the FIFO (for reading, with no writer yet):
  // its wait channel is then the FIFO's (/proc/PID/wchan). Where the kernel hides wait channels
  // ("0" or nothing), the main thread's system call is openat (/proc/PID/syscall's first field,
  // 257 on x86-64; open is 2) in three readings 20 ms apart: any other file's openat (the
  // vocabulary's, the target side's) is over long before.
  const std::string proc = "/proc/" + std::to_string(pid);
  auto in_open = [&] {
    std::string number;
    std::ifstream(proc + "/syscall") >> number;
    return number == "257" || number == "2";
  };
  auto blocked_opening = [&] {
    std::string channel;
    std::ifstream(proc + "/wchan") >> channel;
    if (!channel.empty() && channel != "0")
      return channel == "wait_for_partner" || channel == "fifo_open";
    for (int reading = 0; reading < 3; ++reading) {
      if (!in_open()) return false;
      if (reading < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  };
  ASSERT_TRUE(wait_until(blocked_opening, 30)) << tfm::read_file_bytes(dir + ".stderr");
  kill(pid, SIGTERM);
  // Feed the FIFO once train has it open (never block here if it ended without opening it).
  int feed = -1;
  ASSERT_TRUE(
      wait_until([&] { return (feed = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK)) >= 0; }, 30))
      << tfm::read_file_bytes(dir + ".stderr");
  ::fcntl(feed, F_SETFL, 0);
  const std::string data = tfm::read_file_bytes(work.path("rev.src"));
  EXPECT_EQ(::write(feed, data.data(), data.size()), ssize_t(data.size()));
  ::close(feed);
  EXPECT_EQ(wait_for(pid), 0);
  EXPECT_NE(tfm::read_file_bytes(dir + ".stderr")
                .find("train: stopped by SIGTERM before the first step; nothing was written"),
            std::string::npos)
      << tfm::read_file_bytes(dir + ".stderr");
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.safetensors"));
  EXPECT_FALSE(fs::exists(dir)) << "train created it and wrote nothing into it";
}

// A first run that fails before writing anything (here: its data file is missing) removes the
// directories it created, lock included; it left one holding only .lock. A directory that was
// there before stays, with whatever it holds.
TEST(ModelDirLock, AFailedFirstRunLeavesNoDirectoryItCreated) {
  ids_model();
  const std::string parent = work.path("failed_first");
  fs::create_directories(parent);
  work.write_file("failed_first/mine.txt", "kept");
  const std::string flags = " --train-src " + work.path("no_such.src") + " --train-tgt " +
                            work.path("rev.tgt") + " --preset tiny --vocab 32 --ids --max-steps 1";
  expect_error(work.run_cli("train --model-dir " + parent + "/a/b/run" + flags), 1,
               {"no_such.src"});
  EXPECT_FALSE(fs::exists(parent + "/a"));
  EXPECT_EQ(tfm::read_file_bytes(parent + "/mine.txt"), "kept");
  expect_error(work.run_cli("train --model-dir " + parent + flags), 1, {"no_such.src"});
  EXPECT_EQ(tfm::read_file_bytes(parent + "/mine.txt"), "kept");
}

TEST(Nbest, ALineThatIsNotTranslatedHasNoEntries) {
  const std::string lines = work.write_file("nbest.txt", "4 5 6\n\n7 8\n");
  const CliResult r =
      work.run_cli("translate --ids --model " + ids_model() + " -i " + lines + " --nbest 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream out(r.out);
  int first = 0, second = 0, third = 0;
  for (std::string line; std::getline(out, line);) {
    first += line.rfind("0 ||| ", 0) == 0;
    second += line.rfind("1 ||| ", 0) == 0;
    third += line.rfind("2 ||| ", 0) == 0;
  }
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 0) << r.out;
  EXPECT_EQ(third, 2);
}

}  // namespace
