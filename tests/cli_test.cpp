// The `transformer` binary as a user runs it: outputs of info/init/score/import-ctranslate2,
// and the error contract — bad input gives one "error: ..." line naming the file (and line),
// exit 1 (2 for usage errors), never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/file_util.h"

namespace {

namespace fs = std::filesystem;

struct CliResult {
  int exit_code;
  std::string out, err;
};

const std::string& work_dir() {
  static const std::string dir = [] {
    std::string d =
        (fs::temp_directory_path() / ("tfm_cli_test_" + std::to_string(::getpid()))).string();
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string path(const std::string& name) {
  return work_dir() + "/" + name;
}

void write(const std::string& name, const std::string& text) {
  std::ofstream(path(name), std::ios::binary) << text;
}

CliResult run(const std::string& args) {
  const std::string err_file = path("stderr.txt");
  const std::string command =
      std::string(TFM_CLI_PATH) + " " + args + " 2>" + err_file + " </dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  std::ifstream err_in(err_file);
  std::stringstream err;
  err << err_in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out, err.str()};
}

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
    const std::string m = path("tiny.safetensors");
    CliResult r = run("init --preset tiny --vocab 20 --seed 5 -o " + m);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return m;
  }();
  return model;
}

TEST(Cli, InfoPrintsThePaperParameterCounts) {
  CliResult r = run("info --preset base --vocab 37000");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("63,082,496"), std::string::npos) << r.out;
  r = run("info --preset big --vocab 37000");
  EXPECT_NE(r.out.find("214,245,376"), std::string::npos) << r.out;
  r = run("info --model " + tiny_model());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("d_model                64"), std::string::npos) << r.out;
}

TEST(Cli, InitIsDeterministic) {
  run("init --preset tiny --vocab 20 --seed 5 -o " + path("again.safetensors"));
  EXPECT_EQ(tfm::read_file_bytes(tiny_model()), tfm::read_file_bytes(path("again.safetensors")));
}

TEST(Cli, ScoreIsIndependentOfBatchingAndHandlesEmptyLines) {
  write("src.txt", "3 4 5 6 7\n\n8 9 10\n11 12 13 14 15 16 17 18 19\n4\n");
  write("tgt.txt", "5 6 7\n9 9\n\n12 13 14 15 16 17\n18 3\n");
  CliResult big = run("score --model " + tiny_model() + " --ids --src " + path("src.txt") +
                      " --tgt " + path("tgt.txt") + " --per-token");
  CliResult small = run("score --model " + tiny_model() + " --ids --src " + path("src.txt") +
                        " --tgt " + path("tgt.txt") + " --per-token --batch-tokens 1");
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
  CliResult plain = run("score --model " + tiny_model() + " --ids --src " + path("src.txt") +
                        " --tgt " + path("tgt.txt") + " -o " + path("scores.txt"));
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  std::ifstream scores(path("scores.txt"));
  std::string first;
  std::getline(scores, first);
  EXPECT_EQ(first, big.out.substr(0, big.out.find(' ')));
}

TEST(Cli, ScoreRejectsBadInputNamingFileAndLine) {
  write("good.txt", "3 4\n5 6\n");
  write("bad_id.txt", "3 4\n5 600\n");
  write("bad_text.txt", "3 4\n5 six\n");
  write("short.txt", "3 4\n");
  const std::string base = "score --model " + tiny_model() + " --ids ";
  expect_error(run(base + "--src " + path("good.txt") + " --tgt " + path("bad_id.txt")), 1,
               {"bad_id.txt:2", "600", "outside the vocabulary"});
  expect_error(run(base + "--src " + path("bad_text.txt") + " --tgt " + path("good.txt")), 1,
               {"bad_text.txt:2", "\"six\""});
  expect_error(run(base + "--src " + path("good.txt") + " --tgt " + path("short.txt")), 1,
               {"good.txt", "short.txt", "2 lines", "1"});
  expect_error(run(base + "--src " + path("missing.txt") + " --tgt " + path("good.txt")), 1,
               {"missing.txt"});
  expect_error(run("score --model " + tiny_model() + " --src " + path("good.txt") + " --tgt " +
                   path("good.txt")),
               1, {"vocabulary"});
}

TEST(Cli, CorruptModelFilesAreClearErrors) {
  const std::string model = tfm::read_file_bytes(tiny_model());
  const std::string score = " --ids --src " + path("src.txt") + " --tgt " + path("tgt.txt");
  write("src.txt", "3\n");
  write("tgt.txt", "4\n");
  write("truncated.safetensors", model.substr(0, model.size() / 2));
  expect_error(run("score --model " + path("truncated.safetensors") + score), 1,
               {"truncated.safetensors"});
  std::string huge_header = model;
  huge_header[5] = char(0x7f);
  write("header.safetensors", huge_header);
  expect_error(run("score --model " + path("header.safetensors") + score), 1,
               {"header.safetensors", "header length"});
  write("json.safetensors", std::string("\x04\0\0\0\0\0\0\0{{{{", 12));
  expect_error(run("score --model " + path("json.safetensors") + score), 1,
               {"json.safetensors", "JSON"});
  // A valid container whose config has an unknown value.
  std::string bad_config = model;
  const size_t at = bad_config.find("\\\"post\\\"");
  ASSERT_NE(at, std::string::npos);
  bad_config.replace(at, 8, "\\\"pest\\\"");
  write("config.safetensors", bad_config);
  expect_error(run("score --model " + path("config.safetensors") + score), 1,
               {"config.safetensors", "\"pest\"", "norm"});
  expect_error(run("info --model " + path("nothing.safetensors")), 1, {"nothing.safetensors"});
}

TEST(Cli, UsageErrorsExitWithTwo) {
  expect_error(run("score --model x"), 2, {"--src"});
  expect_error(run("info --preset huge --vocab 3"), 2, {"huge"});
  expect_error(run("frobnicate"), 2, {"frobnicate"});
  CliResult help = run("score --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--per-token"), std::string::npos);
  expect_error(run("info --preset base"), 1, {"vocabulary size"});
}

TEST(Cli, ImportCTranslate2AndScoreText) {
  const std::string data = std::string(TFM_FIXTURE_DIR) +
                           "/../data/ctranslate2-aren-transliteration/aren-transliteration";
  CliResult r = run("import-ctranslate2 " + data + " -o " + path("aren"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("aren/model.safetensors")));
  EXPECT_TRUE(fs::exists(path("aren/source_vocabulary.txt")));
  write("ar.txt", "آ ت ز م و ن\n");
  write("en.txt", "a t z m o n\n");
  r = run("score --model " + path("aren") + " --src " + path("ar.txt") + " --tgt " +
          path("en.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(std::stod(r.out), -1.061750, 1e-5);
  expect_error(run("import-ctranslate2 " + path("nowhere") + " -o " + path("x")), 1, {"nowhere"});
}

}  // namespace
