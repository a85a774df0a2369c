// `transformer translate` as a user runs it on the imported CTranslate2 model: text in, text
// out in input order, empty lines kept, n-best and attention formats, and bad input (unknown
// model directory, vocabulary mismatch, invalid UTF-8, an over-long line, beam 0), and what
// --alpha and the length options do to the outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <vector>

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

// --sampling-topk draws --nbest outputs of each line; --seed repeats them whatever the batch;
// a wider beam is a usage error naming both flags.
TEST(TranslateCli, SamplingDrawsNbestAndASeedRepeatsThem) {
  work.write_file("two.txt", "آ ت ز م و ن\nآ ت ش ي س و ن\n");
  const std::string sample = "translate --model " + model_dir() + " -i " + work.path("two.txt") +
                             " --sampling-topk 8 --sampling-temperature 2 --nbest 4 ";
  const CliResult first = work.run_cli(sample + "--beam 1 --seed 11");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(std::count(first.out.begin(), first.out.end(), '\n'), 8) << first.out;
  EXPECT_EQ(first.out.rfind("0 ||| ", 0), 0u) << first.out;
  EXPECT_NE(first.out.find("\n1 ||| "), std::string::npos) << first.out;
  const CliResult again = work.run_cli(sample + "--beam 1 --seed 11 --batch-tokens 8");
  EXPECT_EQ(again.out, first.out);
  const CliResult other = work.run_cli(sample + "--beam 1 --seed 12");
  EXPECT_NE(other.out, first.out);
  const CliResult wide = work.run_cli(sample + "--beam 3");
  EXPECT_EQ(wide.exit_code, 2);
  EXPECT_NE(wide.err.find("error: --sampling-topk 8 samples, which takes --beam 1"),
            std::string::npos)
      << wide.err;
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
  // -1, the default, is the last layer (its help said so and its check refused it).
  for (const std::string layer : {"-1", "5"})
    ASSERT_EQ(work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                           " --attention-layer " + layer + " --attention-file " +
                           work.path("att" + layer + ".jsonl"))
                  .exit_code,
              0);
  EXPECT_EQ(tfm::read_file_bytes(work.path("att-1.jsonl")),
            tfm::read_file_bytes(work.path("att5.jsonl")));
  // A layer the model does not have is a usage error, named before anything is translated.
  r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("one.txt") +
                   " --attention-layer 6");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("attention_layer 6 is beyond the model's 6 decoder layers"),
            std::string::npos)
      << r.err;
}

// Output tokens of one printed hypothesis (words separated by single spaces; "" has none).
int64_t token_count(const std::string& text) {
  return text.empty() ? 0 : int64_t(std::count(text.begin(), text.end(), ' ')) + 1;
}

// --alpha ranks each n-best list by log p / ((5 + |Y|) / 6)^α, |Y| counting eos, as its help
// says: checked from the printed log-probabilities for three values, one of which reorders the
// lists. The length options cut every output at min(floor(a · source tokens) + b, --max-length)
// tokens; the inputs' own translations (6, 4, 3 and 6 tokens) are longer than most limits.
TEST(TranslateCli, LengthPenaltyRanksTheNbestAndLengthOptionsCutTheOutputs) {
  const std::vector<std::string> inputs = {"آ ت ز م و ن", "آ ز ا", "ن", "م ح م د"};
  std::string text;
  for (const auto& line : inputs) text += line + "\n";
  work.write_file("lengths.txt", text);
  struct Entry {
    std::string text;
    double logprob;
  };
  // Each input's n-best list, in the printed order.
  auto nbest = [&](const std::string& options) {
    const CliResult r = work.run_cli("translate --model " + model_dir() + " -i " +
                                     work.path("lengths.txt") + " " + options);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::vector<Entry>> lists(inputs.size());
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      const size_t first = line.find(" ||| "), last = line.rfind(" ||| ");
      const size_t index = std::stoul(line.substr(0, first));
      EXPECT_LT(index, lists.size()) << line;
      if (index >= lists.size() || first == last) continue;
      lists[index].push_back(
          {line.substr(first + 5, last - first - 5), std::stod(line.substr(last + 5))});
    }
    return lists;
  };
  std::vector<std::vector<std::vector<Entry>>> by_alpha;
  for (double alpha : {0.0, 0.6, 3.0}) {
    by_alpha.push_back(nbest("--beam 4 --nbest 4 --alpha " + std::to_string(alpha)));
    for (const auto& list : by_alpha.back()) {
      ASSERT_EQ(list.size(), 4u) << "alpha " << alpha;
      for (size_t k = 1; k < list.size(); ++k) {
        auto normalised = [&](const Entry& e) {
          return e.logprob / std::pow((5.0 + double(token_count(e.text) + 1)) / 6.0, alpha);
        };
        // 1e-5: the printed log-probabilities have six decimals.
        EXPECT_GE(normalised(list[k - 1]) + 1e-5, normalised(list[k]))
            << "alpha " << alpha << ": '" << list[k - 1].text << "' ranked before '" << list[k].text
            << "'";
      }
    }
  }
  bool reordered = false;
  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t k = 0; k < 4; ++k) reordered |= by_alpha[0][i][k].text != by_alpha[2][i][k].text;
  EXPECT_TRUE(reordered) << "alpha 3 ranks every list as alpha 0 does";

  const std::vector<int64_t> own_lengths = {6, 4, 3, 6};
  for (size_t i = 0; i < inputs.size(); ++i)
    ASSERT_EQ(token_count(by_alpha[1][i][0].text), own_lengths[i]) << by_alpha[1][i][0].text;
  struct Limit {
    std::string options;
    double a;
    int64_t b, max_length;
  };
  for (const Limit& limit :
       {Limit{"--max-length-a 0.5 --max-length-b 0", 0.5, 0, 0},
        Limit{"--max-length-a 0 --max-length-b 4", 0, 4, 0}, Limit{"--max-length 2", 1, 50, 2},
        Limit{"--max-length-a 1 --max-length-b 1 --max-length 5", 1, 1, 5}}) {
    const auto lists = nbest("--beam 4 --nbest 4 " + limit.options);
    for (size_t i = 0; i < inputs.size(); ++i) {
      int64_t most = int64_t(std::floor(limit.a * double(token_count(inputs[i])))) + limit.b;
      if (limit.max_length > 0) most = std::min(most, limit.max_length);
      most = std::max<int64_t>(most, 1);  // at least one token is generated
      ASSERT_FALSE(lists[i].empty()) << limit.options;
      for (const Entry& e : lists[i])
        EXPECT_LE(token_count(e.text), most) << limit.options << ": '" << e.text << "'";
      // A translation longer than the limit is cut at it.
      if (own_lengths[i] > most) {
        EXPECT_EQ(token_count(lists[i][0].text), most)
            << limit.options << ": '" << lists[i][0].text << "'";
      }
    }
  }
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
  // A prefix longer than the model generates (once the decoder's internal "more steps than
  // max_steps"), and one file named for both outputs (the attention replaced the translations).
  std::string long_prefix;
  for (int i = 0; i < 2000; ++i) long_prefix += "a ";
  expect_error(work.run_cli("translate --model " + model_dir() + " -i " + work.path("ok.txt") +
                            " --prefix '" + long_prefix + "'"),
               1, "target prefix 0 has 2000 tokens; the model generates at most");
  expect_error(
      work.run_cli("translate --model " + model_dir() + " -i " + work.path("ok.txt") + " -o " +
                   work.path("both.txt") + " --attention-file " + work.path("./both.txt")),
      2, "--attention-file and -o name the same file");
  EXPECT_FALSE(fs::exists(work.path("both.txt")));
}

}  // namespace
