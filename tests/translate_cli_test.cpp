// `transformer translate` as a user runs it on the imported CTranslate2 model: text in, text
// out in input order, empty lines kept, n-best and attention formats, and bad input (unknown
// model directory, vocabulary mismatch, invalid UTF-8, an over-long line, beam 0).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "cli_runner.h"
#include "tensor/file_util.h"

namespace {

namespace fs = std::filesystem;

using tfm::testing_support::CliResult;

const tfm::testing_support::CliWorkDir work("tfm_translate_test");

const std::string& model_dir() {
  static const std::string dir = tfm::testing_support::import_transliteration_model(work);
  return dir;
}

TEST(TranslateCli, TextInTextOutInInputOrderWithEmptyLines) {
  work.write_file("in.txt", "آ ت ز م و ن\n\nآ ز ا\nآ ت ش ي س و ن\n");
  CliResult r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "a t z m o n\n\na z z a\na c h i s o n\n");
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("in.txt") +
                   " --beam 1 -o " + work.path("greedy.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tfm::read_file_bytes(work.path("greedy.txt")),
            "a t z m o n\n\na z z a\na c h i s o n\n");
}

TEST(TranslateCli, NbestPrefixAndAttentionFormats) {
  work.write_file("one.txt", "آ ت ز م و ن\n");
  CliResult r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                             " --beam 4 --nbest 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_EQ(first.rfind("0 ||| a t z m o n ||| -1.06", 0), 0u) << first;
  EXPECT_EQ(second.rfind("0 ||| ", 0), 0u) << second;
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                   " --beam 2 --prefix 'a t s'");
  EXPECT_EQ(r.out, "a t s u m o n\n");
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                   " --attention");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string attention = r.out.substr(r.out.find(" ||| ") + 5);
  EXPECT_EQ(std::count(attention.begin(), attention.end(), ' '), 6);      // 7 rows: 6 tokens + eos
  EXPECT_EQ(std::count(attention.begin(), attention.end(), ','), 7 * 5);  // 6 source positions
}

TEST(TranslateCli, ReplaceUnknownsAndAttentionFile) {
  work.write_file("one.txt", "آ ت ز م و ن\n");
  // A forced <unk> first token is replaced by the source token it attends to most.
  CliResult r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                             " --beam 2 --prefix '<unk>' --replace-unknowns");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string first = r.out.substr(0, r.out.find(' '));
  EXPECT_NE(first, "<unk>");
  EXPECT_NE(std::string("آ ت ز م و ن").find(first), std::string::npos) << r.out;
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                   " --attention-layer 3 --attention-file " + work.path("att.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string json = tfm::read_file_bytes(work.path("att.jsonl"));
  EXPECT_NE(json.find("\"layer\":3"), std::string::npos);
  EXPECT_NE(json.find("\"target\":[\"a\",\"t\",\"z\",\"m\",\"o\",\"n\",\"</s>\"]"),
            std::string::npos)
      << json.substr(0, 300);
  // A layer the model does not have is a usage error, named before anything is translated.
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                   " --attention-layer 6");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("attention_layer 6 is beyond the model's 6 decoder layers"),
            std::string::npos)
      << r.err;
}

TEST(TranslateCli, BadInputIsAClearError) {
  auto expect_error = [](const CliResult& r, int code, const std::string& fragment) {
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  };
  work.write_file("ok.txt", "آ ز ا\n");
  expect_error(
      work.run_cli("translate --model " + work.path("no_such_dir") + " -i " + work.path("ok.txt")),
      1, "no_such_dir");
  work.write_file("bad_utf8.txt", "آ ز ا\n\xff\xfe broken\n");
  expect_error(
      work.run_cli("translate --model " + model_dir() + " -i " + work.path("bad_utf8.txt")), 1,
      "bad_utf8.txt:2: not valid UTF-8");
  expect_error(
      work.run_cli("translate --model " + model_dir() + " -i " + work.path("ok.txt") + " --beam 0"),
      2, "--beam");
  // A vocabulary whose size does not match the model.
  fs::create_directories(work.path("mismatch"));
  fs::copy_file(model_dir() + "/model.safetensors", work.path("mismatch/model.safetensors"));
  work.write_file("mismatch/source_vocabulary.txt", "<blank>\n<s>\n</s>\n");
  work.write_file("mismatch/target_vocabulary.txt", "<blank>\n<s>\n</s>\n");
  expect_error(
      work.run_cli("translate --model " + work.path("mismatch") + " -i " + work.path("ok.txt")), 1,
      "source_vocabulary.txt");
  // A 100,000-token line is skipped with a warning, never a crash.
  std::string long_line;
  for (int i = 0; i < 100000; ++i) long_line += "ن ";
  work.write_file("long.txt", "آ ز ا\n" + long_line + "\nآ ز ا\n");
  const CliResult r =
      work.run_cli("translate --model " + model_dir() + " -i " + work.path("long.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "a z z a\n\na z z a\n");
  EXPECT_NE(r.err.find("warning: " + work.path("long.txt") + ":2"), std::string::npos) << r.err;
}

}  // namespace
