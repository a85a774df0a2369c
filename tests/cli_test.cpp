// The `transformer` binary as a user runs it: outputs of info/init/score/import-ctranslate2,
// and the error contract — bad input gives one "error: ..." line naming the file (and line),
// exit 1 (2 for usage errors), never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "backend/backend.h"
#include "cli_runner.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "skip_report.h"
#include "tensor/file_util.h"

namespace {

namespace fs = std::filesystem;

using tfm::testing_support::CliResult;

const tfm::testing_support::CliWorkDir work("tfm_cli_test");

// One "error: ..." line containing every fragment, and the given exit code.
void expect_error(const CliResult& r, int code, std::initializer_list<std::string> fragments) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const auto& f : fragments)
    EXPECT_NE(r.err.find(f), std::string::npos) << "missing \"" << f << "\" in " << r.err;
}

const std::string& tiny_model() {
  static const std::string model = [] {
    const std::string m = work.path("tiny.safetensors");
    CliResult r = work.run_cli("init --preset tiny --vocab 20 --seed 5 -o " + m);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return m;
  }();
  return model;
}

// Thread counts from --threads and from OMP_NUM_THREADS are bounded (4 × the CPUs) before any
// parallel region runs: 100,000 once crashed in libgomp while loading the model (exit 139).
TEST(Cli, ThreadCountsAreBoundedBeforeAnyWork) {
  work.write_file("threads_src.txt", "5 6\n");
  const std::string translate =
      "translate --model " + tiny_model() + " --ids -i " + work.path("threads_src.txt");
  CliResult r = work.run_cli(translate + " --threads 100000");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  expect_error(work.run_cli(translate, "/dev/null", "OMP_NUM_THREADS=100000 "), 2,
               {"OMP_NUM_THREADS=100000", "--threads"});
  expect_error(work.run_cli("info --model " + tiny_model(), "/dev/null", "OMP_NUM_THREADS=4096 "),
               2, {"OMP_NUM_THREADS=4096"});
  // --threads decides where both are given; a sensible environment is left alone.
  r = work.run_cli(translate + " --threads 2", "/dev/null", "OMP_NUM_THREADS=100000 ");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli(translate, "/dev/null", "OMP_NUM_THREADS=2,1 ");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Help that cannot be written is an error, not a success (issue: `--help > /dev/full` exited 0).
TEST(Cli, HelpToAFullDeviceIsAnError) {
  expect_error(work.run_cli("--help >/dev/full"), 1, {"standard output"});
  expect_error(work.run_cli("translate --help >/dev/full"), 1, {"standard output"});
  EXPECT_EQ(work.run_cli("translate --help >/dev/null").exit_code, 0);
}

TEST(Cli, VersionNamesTheReleaseTheModelFormatAndTheBuild) {
  CliResult r = work.run_cli("--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(std::string("transformer ") + TFM_PROJECT_VERSION + "\n", 0), 0u) << r.out;
  for (const char* line : {"model file format: transformer-cpp/1", "backends: cpu",
                           "MPI: ", "compiled for: x86-64", "this CPU: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  expect_error(work.run_cli("--version >/dev/full"), 1, {"standard output"});
}

TEST(Cli, HelpIsTheSameOnEveryMachine) {
  // docs/cli.md is --help verbatim, so --help must not show this machine's CPU count or devices.
  const CliResult all_cpus = work.run_cli("--help");
  const CliResult one_cpu = work.run_cli("--help", "/dev/null", "taskset -c 0 ");
  ASSERT_EQ(all_cpus.exit_code, 0);
  EXPECT_EQ(all_cpus.out, one_cpu.out);
  EXPECT_NE(all_cpus.out.find("Usage: transformer [OPTIONS]"), std::string::npos) << all_cpus.out;
  EXPECT_NE(work.run_cli("translate --help").out.find("cuda:N"), std::string::npos);
}

TEST(Cli, InfoPrintsThePaperParameterCounts) {
  CliResult r = work.run_cli("info --preset base --vocab 37000");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("63,082,496"), std::string::npos) << r.out;
  r = work.run_cli("info --preset big --vocab 37000");
  EXPECT_NE(r.out.find("214,245,376"), std::string::npos) << r.out;
  r = work.run_cli("info --model " + tiny_model());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("d_model                64"), std::string::npos) << r.out;
}

TEST(Cli, InitIsDeterministic) {
  work.run_cli("init --preset tiny --vocab 20 --seed 5 -o " + work.path("again.safetensors"));
  EXPECT_EQ(tfm::read_file_bytes(tiny_model()),
            tfm::read_file_bytes(work.path("again.safetensors")));
}

TEST(Cli, ScoreIsIndependentOfBatchingAndHandlesEmptyLines) {
  work.write_file("src.txt", "3 4 5 6 7\n\n8 9 10\n11 12 13 14 15 16 17 18 19\n4\n");
  work.write_file("tgt.txt", "5 6 7\n9 9\n\n12 13 14 15 16 17\n18 3\n");
  CliResult big =
      work.run_cli("score --model " + tiny_model() + " --ids --src " + work.path("src.txt") +
                   " --tgt " + work.path("tgt.txt") + " --per-token");
  CliResult small =
      work.run_cli("score --model " + tiny_model() + " --ids --src " + work.path("src.txt") +
                   " --tgt " + work.path("tgt.txt") + " --per-token --batch-tokens 1");
  ASSERT_EQ(big.exit_code, 0) << big.err;
  ASSERT_EQ(small.exit_code, 0) << small.err;
  std::istringstream a(big.out), b(small.out);
  std::string line_a, line_b;
  int lines = 0;
  const int expected_fields[] = {5, 4, 2, 8, 4};  // total + (target tokens + eos)
  while (std::getline(a, line_a) && std::getline(b, line_b)) {
    std::istringstream fa(line_a), fb(line_b);
    double x, y, total = 0, sum = 0;
    int fields = 0;
    while (fa >> x && fb >> y) {
      EXPECT_NEAR(x, y, 1e-5);
      if (fields == 0)
        total = x;
      else
        sum += x;
      ++fields;
    }
    EXPECT_EQ(fields, expected_fields[lines]) << line_a;
    EXPECT_NEAR(total, sum, 1e-4);
    EXPECT_LT(total, 0);
    ++lines;
  }
  EXPECT_EQ(lines, 5);
  // Without --per-token: one field per line; with -o: the same, written to a file.
  CliResult plain =
      work.run_cli("score --model " + tiny_model() + " --ids --src " + work.path("src.txt") +
                   " --tgt " + work.path("tgt.txt") + " -o " + work.path("scores.txt"));
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  std::ifstream scores(work.path("scores.txt"));
  std::string first;
  std::getline(scores, first);
  EXPECT_EQ(first, big.out.substr(0, big.out.find(' ')));
}

TEST(Cli, ScoreRejectsBadInputNamingFileAndLine) {
  work.write_file("good.txt", "3 4\n5 6\n");
  work.write_file("bad_id.txt", "3 4\n5 600\n");
  work.write_file("bad_text.txt", "3 4\n5 six\n");
  work.write_file("short.txt", "3 4\n");
  const std::string base = "score --model " + tiny_model() + " --ids ";
  expect_error(
      work.run_cli(base + "--src " + work.path("good.txt") + " --tgt " + work.path("bad_id.txt")),
      1, {"bad_id.txt:2", "600", "outside the vocabulary"});
  expect_error(
      work.run_cli(base + "--src " + work.path("bad_text.txt") + " --tgt " + work.path("good.txt")),
      1, {"bad_text.txt:2", "\"six\""});
  expect_error(
      work.run_cli(base + "--src " + work.path("good.txt") + " --tgt " + work.path("short.txt")), 1,
      {"good.txt", "short.txt", "2 lines", "1"});
  expect_error(
      work.run_cli(base + "--src " + work.path("missing.txt") + " --tgt " + work.path("good.txt")),
      1, {"missing.txt"});
  expect_error(work.run_cli("score --model " + tiny_model() + " --src " + work.path("good.txt") +
                            " --tgt " + work.path("good.txt")),
               1, {"vocabulary"});
  // Longer than the model's 1,024 positions allow (the library's check, told by file and line):
  // a source needs one more for its eos, a target one more for the bos before it.
  std::string too_long;
  for (int i = 0; i < 1024; ++i) too_long += "3 ";
  work.write_file("long.txt", "3 4\n" + too_long + "\n");
  expect_error(
      work.run_cli(base + "--src " + work.path("good.txt") + " --tgt " + work.path("long.txt")), 1,
      {"long.txt:2: 1024 tokens is longer than the model's max_positions allow"});
  expect_error(
      work.run_cli(base + "--src " + work.path("long.txt") + " --tgt " + work.path("good.txt")), 1,
      {"long.txt:2: 1024 tokens is longer than the model's max_positions allow"});
}

TEST(Cli, CorruptModelFilesAreClearErrors) {
  const std::string model = tfm::read_file_bytes(tiny_model());
  const std::string score =
      " --ids --src " + work.path("src.txt") + " --tgt " + work.path("tgt.txt");
  work.write_file("src.txt", "3\n");
  work.write_file("tgt.txt", "4\n");
  work.write_file("truncated.safetensors", model.substr(0, model.size() / 2));
  expect_error(work.run_cli("score --model " + work.path("truncated.safetensors") + score), 1,
               {"truncated.safetensors"});
  std::string huge_header = model;
  huge_header[5] = char(0x7f);
  work.write_file("header.safetensors", huge_header);
  expect_error(work.run_cli("score --model " + work.path("header.safetensors") + score), 1,
               {"header.safetensors", "header length"});
  work.write_file("json.safetensors", std::string("\x04\0\0\0\0\0\0\0{{{{", 12));
  expect_error(work.run_cli("score --model " + work.path("json.safetensors") + score), 1,
               {"json.safetensors", "JSON"});
  // A valid container whose config has an unknown value.
  std::string bad_config = model;
  const size_t at = bad_config.find("\\\"post\\\"");
  ASSERT_NE(at, std::string::npos);
  bad_config.replace(at, 8, "\\\"pest\\\"");
  work.write_file("config.safetensors", bad_config);
  expect_error(work.run_cli("score --model " + work.path("config.safetensors") + score), 1,
               {"config.safetensors", "\"pest\"", "norm"});
  expect_error(work.run_cli("info --model " + work.path("nothing.safetensors")), 1,
               {"nothing.safetensors"});
}

// Names read from files reach messages quoted: a NUL cut the message short where it was printed,
// a damaged byte ended up raw on the terminal, a long name made a message of any length. Now
// \xNN, and at most 80 bytes of a name.
TEST(Cli, NamesReadFromFilesArePrintedEscapedAndBounded) {
  // A CTranslate2 model.bin (binary version 6) whose first variable has rank 9, named by bytes.
  auto model_bin = [](const std::string& variable) {
    std::string bytes;
    auto u32 = [&](uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
    auto text = [&](const std::string& s) {
      const uint16_t length = uint16_t(s.size() + 1);
      bytes.append(reinterpret_cast<const char*>(&length), 2);
      bytes += s;
      bytes += '\0';
    };
    u32(6);
    text("TransformerSpec");
    u32(7);
    u32(1);
    text(variable);
    bytes += char(9);
    return bytes;
  };
  fs::create_directories(work.path("named_ct2"));
  work.write_file("named_ct2/model.bin", model_bin(std::string("enc\0der/\xff\x01x", 11)));
  CliResult r = work.run_cli("import-ctranslate2 " + work.path("named_ct2") + " -o " +
                             work.path("named_out"));
  expect_error(r, 1, {"variable \"enc\\x00der/\\xff\\x01x\" has rank 9 (at byte"});
  EXPECT_EQ(r.err.find('\xff'), std::string::npos) << r.err;
  work.write_file("named_ct2/model.bin", model_bin(std::string(1000, 'a')));
  r = work.run_cli("import-ctranslate2 " + work.path("named_ct2") + " -o " +
                   work.path("named_out"));
  expect_error(r, 1, {"variable \"" + std::string(80, 'a') + "\"... (1000 bytes) has rank 9"});
  // A safetensors header's tensor name with an escaped NUL, and well-formed UTF-8 kept as it is.
  const std::string header =
      R"({"a\u0000b\u00e9": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}})";
  std::string file(8, '\0');
  file[0] = char(header.size());
  work.write_file("named.safetensors", file + header + "x");
  expect_error(work.run_cli("info --model " + work.path("named.safetensors")), 1,
               {"tensor \"a\\x00b\xc3\xa9\": unsupported dtype \"Q8\""});
}

// A config file's numbers past a double's range, and its keys given twice, are named: 1e999 was
// "not a JSON object", and of {"d_model": 64, "d_model": 512} the last was taken silently.
TEST(Cli, ConfigJsonErrorsNameTheKey) {
  const std::string big = work.write_file("big.json", R"({"d_model": 1e999})");
  expect_error(work.run_cli("info --vocab 100 --config " + big), 1,
               {big + ": the number 1e999 (\"d_model\") is out of range"});
  const std::string twice = work.write_file("twice.json", R"({"d_model": 64, "d_model": 512})");
  expect_error(work.run_cli("info --vocab 100 --config " + twice), 1,
               {twice + ": duplicate key \"d_model\""});
  const std::string broken = work.write_file("broken.json", R"({"d_model": )");
  expect_error(work.run_cli("info --vocab 100 --config " + broken), 1,
               {broken + ": not valid JSON: parse error at line 1, column 13"});
  // 100,000 nested objects overflowed the stack as the parsed config was copied (a crash in
  // info, init and train); and a position_offset that leaves no positions was accepted.
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += "{\"a\": ";
  nested += "1" + std::string(100000, '}');
  const std::string deep = work.write_file("deep.json", nested);
  expect_error(work.run_cli("info --vocab 100 --config " + deep), 1,
               {deep + ": nested deeper than 256 levels"});
  const std::string offset =
      work.write_file("offset.json", R"({"max_positions": 8, "position_offset": 5000})");
  expect_error(work.run_cli("info --vocab 100 --config " + offset), 1,
               {"leaves fewer than the 2 positions a sequence needs"});
}

// Every command that takes a model path resolves it in one place (model_file_path) and says the
// OS's reason the same way: a symbolic link loop was "no such file or directory" in translate and
// "Too many levels of symbolic links" in info.
TEST(Cli, AnUnopenableModelPathIsTheSameErrorInEveryCommand) {
  const std::string loop = work.path("loop");
  fs::remove(loop);
  fs::create_symlink(loop, loop);
  work.write_file("loop_src.txt", "3\n");
  const std::string text = work.path("loop_src.txt");
  const std::string loop_dir = work.path("loop_dir");
  fs::create_directories(loop_dir);
  fs::remove(loop_dir + "/model.safetensors");
  fs::create_symlink(loop_dir + "/model.safetensors", loop_dir + "/model.safetensors");
  for (const std::string& model : {loop, loop_dir}) {
    for (const std::string& command :
         {"translate --ids -i " + text + " --model " + model,
          "score --ids --src " + text + " --tgt " + text + " --model " + model,
          "info --model " + model, "serve --port 0 --model " + model,
          "quantize -o " + work.path("loop_q") + " --model " + model,
          "export-ctranslate2 -o " + work.path("loop_ct2") + " --model " + model}) {
      SCOPED_TRACE(command);
      expect_error(work.run_cli(command), 1, {": cannot open (Too many levels of symbolic links)"});
    }
  }
  const std::string missing = work.path("missing_model");
  for (const std::string& command :
       {"translate --ids -i " + text + " --model " + missing, "info --model " + missing}) {
    SCOPED_TRACE(command);
    expect_error(work.run_cli(command), 1, {missing + ": cannot open (No such file or directory)"});
  }
}

// --device: cpu (the default) gives the same scores as no flag; an unknown device is one clear
// error before anything is read or written, in every command that runs the model.
TEST(Cli, DeviceSelectsABackendAndUnknownDevicesAreErrors) {
  work.write_file("dev_src.txt", "3 4 5\n6 7\n");
  work.write_file("dev_tgt.txt", "5 6\n9\n");
  const std::string score = "score --model " + tiny_model() + " --ids --src " +
                            work.path("dev_src.txt") + " --tgt " + work.path("dev_tgt.txt");
  CliResult plain = work.run_cli(score);
  CliResult cpu = work.run_cli(score + " --device cpu");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(plain.out, cpu.out);
  expect_error(work.run_cli(score + " --device tpu"), 1, {"unknown device \"tpu\"", "cpu"});
  expect_error(work.run_cli("translate --model " + tiny_model() + " --ids --device cuda:7 -i " +
                            work.path("dev_src.txt")),
               1, {"unknown device \"cuda:7\""});
  const std::string run_dir = work.path("dev_run");
  expect_error(work.run_cli("train --preset tiny --vocab 20 --ids --device tpu --model-dir " +
                            run_dir + " --train-src " + work.path("dev_src.txt") + " --train-tgt " +
                            work.path("dev_tgt.txt") + " --max-steps 1"),
               1, {"unknown device \"tpu\""});
  EXPECT_FALSE(fs::exists(run_dir)) << "nothing written for a refused device";
  CliResult help = work.run_cli("translate --help");
  EXPECT_NE(help.out.find("--device"), std::string::npos);
}

TEST(Cli, UsageErrorsExitWithTwo) {
  expect_error(work.run_cli("score --model x"), 2, {"--src"});
  expect_error(work.run_cli("info --preset huge --vocab 3"), 2, {"huge"});
  expect_error(work.run_cli("frobnicate"), 2, {"frobnicate"});
  CliResult help = work.run_cli("score --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--per-token"), std::string::npos);
  // Options that cannot run together are usage errors too, however late they are found (these
  // exited 1, as failures of the work, until the class was fixed).
  expect_error(work.run_cli("info --preset base"), 2, {"vocabulary size"});
  expect_error(work.run_cli("--max-memory abc info --preset tiny --vocab 20"), 2, {"--max-memory"});
  work.write_file("usage_src.txt", "5 6\n");
  const std::string translate =
      "translate --model " + tiny_model() + " --ids -i " + work.path("usage_src.txt");
  expect_error(work.run_cli(translate + " --nbest 5 --beam 2"), 2, {"--nbest"});
  expect_error(work.run_cli(translate + " --replace-unknowns"), 2, {"--replace-unknowns"});
  expect_error(work.run_cli(translate + " --prefix 5 --prefix-file " + work.path("usage_src.txt")),
               2, {"--prefix"});
  expect_error(work.run_cli("score --model " + tiny_model() + " --ids --src - --tgt -"), 2,
               {"stdin"});
  expect_error(work.run_cli("average -o " + work.path("avg.safetensors")), 2,
               {"nothing to average"});
  expect_error(work.run_cli("init --vocab 20 -o " + work.path("none.safetensors")), 2,
               {"--preset or --config"});
}

// Integer options are read in decimal whatever CLI11 would make of them: "010" is ten (CLI11
// read it as octal 8), a prefixed base or a fraction is refused, and an unsigned option refuses a
// sign (--seed -1 was 2^64 - 1). Lengths that cannot both hold are refused before any work.
TEST(Cli, IntegerOptionsAreDecimal) {
  work.write_file("decimal_src.txt", "5 6\n");
  const std::string translate =
      "translate --model " + tiny_model() + " --ids -i " + work.path("decimal_src.txt");
  CliResult ten = work.run_cli(translate + " --beam 010 --nbest 10");
  EXPECT_EQ(ten.exit_code, 0) << ten.err;
  CliResult plain = work.run_cli(translate + " --beam 10 --nbest 10");
  EXPECT_EQ(ten.out, plain.out);
  EXPECT_EQ(std::count(ten.out.begin(), ten.out.end(), '\n'), 10);
  for (const std::string bad : {"0x10", "0b11", "1e1", "2.5"})
    expect_error(work.run_cli(translate + " --beam " + bad), 2,
                 {"--beam: must be a whole number in decimal digits, not " + bad});
  expect_error(
      work.run_cli("init --preset tiny --vocab 20 --seed -1 -o " + work.path("s.safetensors")), 2,
      {"--seed: must be a whole number at least 0, not -1"});
  // Past 64 bits is out of range (CLI11 read it as the largest value).
  expect_error(work.run_cli("init --preset tiny --vocab 20 --seed 18446744073709551616 -o " +
                            work.path("s.safetensors")),
               2, {"--seed: is out of range (64 bits): 18446744073709551616"});
  expect_error(work.run_cli(translate + " --beam -000009223372036854775809"), 2,
               {"--beam: is out of range (64 bits): -9223372036854775809"});
  EXPECT_EQ(work.run_cli("init --preset tiny --vocab 20 --seed 18446744073709551615 -o " +
                         work.path("largest_seed.safetensors"))
                .exit_code,
            0);
  EXPECT_FALSE(std::filesystem::exists(work.path("s.safetensors")));
  const std::string seven = work.path("seven.safetensors"), again = work.path("007.safetensors");
  ASSERT_EQ(work.run_cli("init --preset tiny --vocab 20 --seed 7 -o " + seven).exit_code, 0);
  ASSERT_EQ(
      work.run_cli("--threads 01 init --preset tiny --vocab 20 --seed 007 -o " + again).exit_code,
      0);
  EXPECT_EQ(tfm::read_file_bytes(seven), tfm::read_file_bytes(again));
  expect_error(work.run_cli(translate + " --min-length 6 --max-length 5"), 2,
               {"--min-length 6 is greater than --max-length 5"});
}

// Every command that writes a model or a vocabulary keeps an existing output unless --force
// (init, average, vocab and import-ctranslate2 replaced it silently, quantize refused it): the
// refusal is one error line before any work, the file stays byte for byte, and --force replaces
// it. An empty directory is not an existing output.
TEST(Cli, ModelsAndVocabulariesAreOverwrittenOnlyWithForce) {
  const std::string ct2 = std::string(TFM_FIXTURE_DIR) +
                          "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  const std::string text = work.write_file("force_text.txt", "a b c d e f g h i j k l m n o\n");
  const std::string model = work.path("force_model.safetensors");
  ASSERT_EQ(work.run_cli("init --preset tiny --vocab 20 --seed 5 -o " + model).exit_code, 0);
  struct Case {
    std::string command, output;
  };
  const std::vector<Case> cases = {
      {"init --preset tiny --vocab 20 --seed 6", work.path("force_init.safetensors")},
      {"average " + model + " " + model, work.path("force_average.safetensors")},
      {"vocab --input " + text + " --size 20", work.path("force.spm")},
      {"import-ctranslate2 " + ct2, work.path("force_import")},
      {"quantize --model " + model, work.path("force_quantized.safetensors")},
  };
  for (const Case& c : cases) {
    fs::remove_all(c.output);
    fs::create_directories(c.output);  // empty: written into
    CliResult r = work.run_cli(c.command + " -o " + c.output);
    if (fs::is_directory(c.output) && fs::is_empty(c.output)) {
      // A file output cannot take an empty directory's place: refused before any work, with
      // or without --force (it failed at the end, after the work, on the rename).
      expect_error(r, 1, {c.output + ": is a directory; -o names the file to write"});
      expect_error(work.run_cli(c.command + " --force -o " + c.output), 1,
                   {c.output + ": is a directory; -o names the file to write"});
      fs::remove_all(c.output);
      r = work.run_cli(c.command + " -o " + c.output);
    }
    ASSERT_EQ(r.exit_code, 0) << c.command << r.err;
    const bool directory = fs::is_directory(c.output);
    const std::string file = directory ? c.output + "/model.safetensors" : c.output;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << "precious";
    expect_error(work.run_cli(c.command + " -o " + c.output), 1,
                 {c.output + ": already exists (use --force to overwrite it)"});
    EXPECT_TRUE(tfm::read_file_bytes(file) == "precious") << c.command;
    r = work.run_cli(c.command + " --force -o " + c.output);
    ASSERT_EQ(r.exit_code, 0) << c.command << r.err;
    EXPECT_TRUE(tfm::read_file_bytes(file).size() > 100) << c.command;
  }
}

// average refuses what it cannot average, with one error line and no output file: models of
// different configs, model files beside --model-dir, a run directory without snapshots, a file
// that is not a model. The average of two models is their mean, element for element.
TEST(Cli, AverageRefusesWhatItCannotAverageAndAveragesTheRest) {
  const std::string other = work.path("other_vocab.safetensors");
  ASSERT_EQ(work.run_cli("init --preset tiny --vocab 24 --seed 5 -o " + other).exit_code, 0);
  const std::string out = work.path("average_out.safetensors");
  expect_error(work.run_cli("average " + tiny_model() + " " + other + " -o " + out), 1,
               {other, "config differs"});
  expect_error(
      work.run_cli("average " + tiny_model() + " --model-dir " + work.dir() + " -o " + out), 2,
      {"not both"});
  fs::create_directories(work.path("run_without_snapshots"));
  expect_error(
      work.run_cli("average --model-dir " + work.path("run_without_snapshots") + " -o " + out), 1,
      {"run_without_snapshots", "no snapshots"});
  const std::string not_a_model = work.write_file("not_a_model.safetensors", "plain text\n");
  expect_error(work.run_cli("average " + tiny_model() + " " + not_a_model + " -o " + out), 1,
               {not_a_model});
  EXPECT_FALSE(fs::exists(out));

  const std::string second = work.path("tiny_seed6.safetensors");
  ASSERT_EQ(work.run_cli("init --preset tiny --vocab 20 --seed 6 -o " + second).exit_code, 0);
  const CliResult r = work.run_cli("average " + tiny_model() + " " + second + " -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const tfm::Model a = tfm::load_model(tiny_model(), tfm::cpu_backend());
  const tfm::Model b = tfm::load_model(second, tfm::cpu_backend());
  const tfm::Model mean = tfm::load_model(out, tfm::cpu_backend());
  const tfm::TensorMap ta = a.parameters().to_host(), tb = b.parameters().to_host(),
                       tm = mean.parameters().to_host();
  ASSERT_EQ(tm.size(), ta.size());
  for (const auto& [name, t] : tm)
    for (size_t i = 0; i < t.data.size(); ++i)
      ASSERT_EQ(t.data[i], (ta.at(name).data[i] + tb.at(name).data[i]) * 0.5f) << name << " " << i;

  // Weights near the largest float: their sum overflows, their mean does not (an average that
  // wrote infinities it then refused to load).
  tfm::TensorMap large = a.parameters().to_host();
  tfm::Tensor& first = large.begin()->second;
  first.data[0] = first.data[1] = 3e38f;
  const std::string large_path = work.path("large.safetensors");
  tfm::save_model(tfm::Model(a.config(), std::move(large), "large", tfm::cpu_backend()),
                  large_path);
  const CliResult big =
      work.run_cli("average --force " + large_path + " " + large_path + " -o " + out);
  ASSERT_EQ(big.exit_code, 0) << big.err;
  const tfm::TensorMap averaged = tfm::load_model(out, tfm::cpu_backend()).parameters().to_host();
  EXPECT_EQ(averaged.begin()->second.data[0], 3e38f);
}

// The sinusoid table a model builds as it loads counts against the memory limit: a 3 MB config
// with max_positions 1,048,576 took 2 GB past --max-memory 1G.
TEST(Cli, ThePositionTableCountsAgainstTheMemoryLimit) {
  const std::string config = work.write_file(
      "long_positions.json",
      R"({"d_model": 256, "heads": 4, "d_ff": 1, "encoder_layers": 1, "decoder_layers": 1,
          "max_positions": 1048576})");
  expect_error(work.run_cli("--max-memory 256M init --vocab 8 --config " + config + " -o " +
                            work.path("long_positions.safetensors")),
               1, {"a model of this config", "--max-memory"});
  EXPECT_FALSE(fs::exists(work.path("long_positions.safetensors")));
}

TEST(Cli, ImportCTranslate2AndScoreText) {
  const std::string data = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  CliResult r = work.run_cli("import-ctranslate2 " + data + " -o " + work.path("aren"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(work.path("aren/model.safetensors")));
  EXPECT_TRUE(fs::exists(work.path("aren/source_vocabulary.txt")));
  work.write_file("ar.txt", "آ ت ز م و ن\n");
  work.write_file("en.txt", "a t z m o n\n");
  r = work.run_cli("score --model " + work.path("aren") + " --src " + work.path("ar.txt") +
                   " --tgt " + work.path("en.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(std::stod(r.out), -1.061750, 1e-5);
  expect_error(work.run_cli("import-ctranslate2 " + work.path("nowhere") + " -o " + work.path("x")),
               1, {"nowhere"});

  // --compute-type int8 on every product: the same translation, the score within int8's rounding
  // (tests/decode_test.cpp bounds it); a CPU without VNNI refuses with one error line.
  const std::string score_texts = " --model " + work.path("aren") + " --src " +
                                  work.path("ar.txt") + " --tgt " + work.path("en.txt");
  const std::string int8_score = "score --compute-type int8" + score_texts;
  const std::string int8_translate =
      "translate --compute-type int8 --model " + work.path("aren") + " -i " + work.path("ar.txt");
  if (tfm::cpu_backend().supports(tfm::Precision::kInt8)) {
    r = work.run_cli(int8_score);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Measured 0.011 from float32's (2026-11-28, AMD EPYC).
    EXPECT_NEAR(std::stod(r.out), -1.061750, 0.03);
    EXPECT_NE(std::stod(r.out), -1.061750);
    r = work.run_cli(int8_translate);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "a t z m o n\n");
    // int8_bfloat16: scoring has no decoder cache to keep in bfloat16, so it scores as int8.
    const std::string int8_score_out = work.run_cli(int8_score).out;
    r = work.run_cli("score --compute-type int8_bfloat16 --model " + work.path("aren") + " --src " +
                     work.path("ar.txt") + " --tgt " + work.path("en.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, int8_score_out);
  } else {
    tfm::testing_support::skip_precision(tfm::cpu_backend(), tfm::Precision::kInt8,
                                         "score and translate");
    expect_error(work.run_cli(int8_score), 1, {"VNNI"});
  }
  expect_error(work.run_cli(int8_translate + " --compute-type int4"), 2, {"int4"});

  // CTranslate2's other names: "float" is float32 and "int8_float32" int8, score for score;
  // "auto" is int8 where VNNI runs it, else float32 (CTranslate2's auto prefers int8 on CPUs). Its
  // names for what does not run here (float16 types, int16) are refused, each saying why.
  const std::string float32_score = work.run_cli("score --compute-type float32" + score_texts).out;
  EXPECT_NEAR(std::stod(float32_score), -1.061750, 1e-5);
  r = work.run_cli("score --compute-type float" + score_texts);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, float32_score);
  if (tfm::cpu_backend().supports(tfm::Precision::kInt8)) {
    const std::string int8_score_out = work.run_cli(int8_score).out;
    for (const char* alias : {"int8_float32", "auto"}) {
      r = work.run_cli(std::string("score --compute-type ") + alias + score_texts);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, int8_score_out) << alias;
    }
  } else {
    tfm::testing_support::skip_precision(tfm::cpu_backend(), tfm::Precision::kInt8,
                                         "int8_float32 and auto");
    r = work.run_cli("score --compute-type auto" + score_texts);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, float32_score);
    expect_error(work.run_cli("score --compute-type int8_float32" + score_texts), 1, {"VNNI"});
  }
  const std::string translate =
      "translate --model " + work.path("aren") + " -i " + work.path("ar.txt");
  for (const char* type : {"float16", "int8_float16"})  // names only a GPU runs
    expect_error(work.run_cli(translate + " --compute-type " + type), 1,
                 {type, "GPUs only", "bfloat16"});
  expect_error(work.run_cli(int8_translate + " --compute-type int16"), 2, {"int16", "MKL"});
  expect_error(work.run_cli(int8_translate + " --compute-type fp32"), 2,
               {"\"fp32\"", "int8_float32", "auto"});

  // CTranslate2's int8 test model: imported with its int8 weights and row scales as stored
  // (the file says I8), then run in int8 (the same symmetric per-row scheme as CTranslate2's,
  // the default for an int8 model) and in float32 (multiplied out): its expected output.
  r = work.run_cli("import-ctranslate2 " + data + "-i8 -o " + work.path("aren_i8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("weights int8"), std::string::npos) << r.out;
  EXPECT_EQ(tfm::stored_precision(work.path("aren_i8")), tfm::Precision::kInt8);
  {  // its int8 embeddings stay int8 too (CTranslate2 quantises them with the linear weights)
    const tfm::SafetensorsHeader header =
        tfm::read_safetensors_header(work.path("aren_i8/model.safetensors"));
    EXPECT_EQ(header.dtypes.at("src_embed.weight"), "I8");
    EXPECT_EQ(header.dtypes.at("tgt_embed.weight"), "I8");
  }
  const bool vnni = tfm::cpu_backend().supports(tfm::Precision::kInt8);
  if (!vnni)
    tfm::testing_support::skip_precision(tfm::cpu_backend(), tfm::Precision::kInt8,
                                         "translating the int8 import");
  for (const char* type : {"float32", "int8", "int8_bfloat16", "default"}) {
    if (std::string(type) != "float32" && !vnni) continue;
    r = work.run_cli(std::string("translate --compute-type ") + type + " --model " +
                     work.path("aren_i8") + " -i " + work.path("ar.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "a t z m o n\n") << type;
  }
  if (!vnni)
    expect_error(
        work.run_cli("translate --model " + work.path("aren_i8") + " -i " + work.path("ar.txt")), 1,
        {"stores int8 weights", "--compute-type float32"});
}

// On a GPU (skipped where there is none): CTranslate2's transliteration model translated with
// --device cuda gives CTranslate2's expected outputs and the CPU's, greedy and beam, in every
// compute type, and scores within each format's rounding of the CPU's score.
TEST(Cli, TheGpuTranslatesAndScoresAsTheCpuDoes) {
  std::string why;
  const std::string gpu = tfm::testing_support::first_gpu_backend(why);
  if (gpu.empty()) GTEST_SKIP() << why;
  const std::string data = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  const std::string model = work.path("aren_gpu");
  ASSERT_EQ(work.run_cli("import-ctranslate2 " + data + " -o " + model).exit_code, 0);
  work.write_file("gpu_ar.txt", "آ ت ز م و ن\nآ ز ا\nآ ت ش ي س و ن\n");
  work.write_file("gpu_en.txt", "a t z m o n\na z z a\na c h i s o n\n");
  // The float16 types, which only a GPU runs, against their 16-bit neighbours on the GPU: float16
  // (an 11-bit mantissa) as float32, int8_float16 as int8 (the same products, the cache in
  // float16 instead of float32).
  std::map<std::string, std::string> gpu_outputs;  // type + beam → output
  for (const char* type :
       {"float32", "bfloat16", "int8", "int8_bfloat16", "float16", "int8_float16"})
    for (const char* beam : {"1", "2", "4"}) {
      SCOPED_TRACE(std::string(type) + " beam " + beam);
      const std::string translate = "translate --model " + model + " -i " +
                                    work.path("gpu_ar.txt") + " --compute-type " + type +
                                    " --beam " + beam + " --device ";
      const CliResult on_gpu = work.run_cli(translate + gpu);
      ASSERT_EQ(on_gpu.exit_code, 0) << on_gpu.err;
      gpu_outputs[std::string(type) + beam] = on_gpu.out;
      if (std::string(beam) == "4" && std::string(type) == "float32") {
        EXPECT_EQ(on_gpu.out, "a t z m o n\na z z a\na c h i s o n\n");
      }
      if (std::string(type) == "float16") {
        EXPECT_EQ(on_gpu.out, gpu_outputs.at(std::string("float32") + beam));
      } else if (std::string(type) == "int8_float16") {
        EXPECT_EQ(on_gpu.out, gpu_outputs.at(std::string("int8") + beam));
      }
      const CliResult on_cpu = work.run_cli(translate + "cpu");
      if (on_cpu.exit_code == 0) {
        EXPECT_EQ(on_gpu.out, on_cpu.out);
      }
    }
  const std::string score = "score --model " + model + " --src " + work.path("gpu_ar.txt") +
                            " --tgt " + work.path("gpu_en.txt") + " --device ";
  const CliResult float_score = work.run_cli(score + gpu);
  ASSERT_EQ(float_score.exit_code, 0) << float_score.err;
  EXPECT_NEAR(std::stod(float_score.out), -1.061750, 1e-5);  // CTranslate2's own score
  for (const char* type : {"bfloat16", "float16", "int8"}) {
    const CliResult on_gpu = work.run_cli(score + gpu + " --compute-type " + type);
    ASSERT_EQ(on_gpu.exit_code, 0) << on_gpu.err;
    EXPECT_NEAR(std::stod(on_gpu.out), -1.061750, 0.02) << type;
  }
}

// quantize: a model rewritten with int8 linear weights (a third of the file here) scores
// exactly what the float32 model scores with --compute-type int8 (the same quantisation, now
// read from the file), by default; --type float32 writes it back out in float32.
TEST(Cli, QuantizeWritesAnInt8ModelThatRunsInInt8) {
  const std::string data = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  CliResult r = work.run_cli("import-ctranslate2 " + data + " -o " + work.path("q_float"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = work.run_cli("quantize --model " + work.path("q_float") + " -o " + work.path("q_int8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(work.path("q_int8/source_vocabulary.txt")));
  EXPECT_LT(fs::file_size(work.path("q_int8/model.safetensors")),
            fs::file_size(work.path("q_float/model.safetensors")) / 2);
  EXPECT_EQ(tfm::stored_precision(work.path("q_int8")), tfm::Precision::kInt8);
  EXPECT_EQ(tfm::stored_precision(work.path("q_float")), tfm::Precision::kFloat32);
  expect_error(
      work.run_cli("quantize --model " + work.path("q_float") + " -o " + work.path("q_int8")), 1,
      {"already exists", "--force"});
  expect_error(
      work.run_cli("quantize --model " + work.path("nowhere") + " -o " + work.path("q_none")), 1,
      {"nowhere"});
  expect_error(work.run_cli("quantize --model " + work.path("q_float") + " -o " + work.path("q_x") +
                            " --type int4"),
               2, {"int4"});
  EXPECT_FALSE(fs::exists(work.path("q_x")));
  work.write_file("q_ar.txt", "آ ت ز م و ن\nآ ت ش ي س و ن\n");
  work.write_file("q_en.txt", "a t z m o n\na c h i s o n\n");
  const std::string texts = " --src " + work.path("q_ar.txt") + " --tgt " + work.path("q_en.txt");
  if (tfm::cpu_backend().supports(tfm::Precision::kInt8)) {
    const CliResult from_float =
        work.run_cli("score --compute-type int8 --model " + work.path("q_float") + texts);
    const CliResult from_file = work.run_cli("score --model " + work.path("q_int8") + texts);
    ASSERT_EQ(from_float.exit_code, 0) << from_float.err;
    ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
    EXPECT_EQ(from_file.out, from_float.out);
    r = work.run_cli("translate --model " + work.path("q_int8") + " -i " + work.path("q_ar.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "a t z m o n\na c h i s o n\n");
  } else {
    tfm::testing_support::skip_precision(tfm::cpu_backend(), tfm::Precision::kInt8,
                                         "scoring the quantised model");
  }
  // Back to float32: a float32 model again, whose weights are the int8 ones multiplied out
  // (its score moves from the original float32 one by about int8's rounding).
  r = work.run_cli("quantize --type float32 --model " + work.path("q_int8") + " -o " +
                   work.path("q_back"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tfm::stored_precision(work.path("q_back")), tfm::Precision::kFloat32);
  const CliResult original = work.run_cli("score --model " + work.path("q_float") + texts);
  const CliResult back = work.run_cli("score --model " + work.path("q_back") + texts);
  const CliResult multiplied_out =
      work.run_cli("score --compute-type float32 --model " + work.path("q_int8") + texts);
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, multiplied_out.out);
  EXPECT_NE(back.out, original.out);
  // Measured 0.009 and 0.002 from the float32 scores (2026-11-28, AMD EPYC).
  std::istringstream back_lines(back.out), original_lines(original.out);
  int scored = 0;
  for (double b = 0, o = 0; back_lines >> b && original_lines >> o; ++scored)
    EXPECT_NEAR(b, o, 0.025) << "sentence " << scored + 1;
  EXPECT_EQ(scored, 2);
}

}  // namespace
