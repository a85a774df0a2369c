// `transformer serve` tested as a client sees it: a real server process on a free loopback port
// (--port 0, the port read from its "listening on" line), driven over HTTP. Every endpoint,
// every error path of issue #17, concurrent requests whose answers must equal `translate`'s
// for the same lines, and a graceful stop with a request in flight. The request parser is also
// tested directly, as the fuzz target calls it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "cli_runner.h"
#include "model/config.h"
#include "serve/translate_request.h"
#include "skip_report.h"

namespace {

using nlohmann::json;
using tfm::testing_support::CliResult;
using tfm::testing_support::CliWorkDir;

CliWorkDir work("serve_test");

const std::string& model_dir() {
  static const std::string dir = tfm::testing_support::import_transliteration_model(work);
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A running `transformer serve`; stopped with SIGTERM (and reaped) by stop() or the destructor.
class Server {
 public:
  explicit Server(const std::string& options, const std::string& name = "server",
                  const std::string& model = model_dir()) {
    err_ = work.path(name + ".err");
    std::vector<std::string> argv = {TFM_CLI_PATH, "serve", "--model",   model,
                                     "--port",     "0",     "--threads", "2"};
    std::istringstream extra(options);
    for (std::string word; extra >> word;) argv.push_back(word);
    pid_ = tfm::testing_support::spawn_in_background(argv, err_);
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)/");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch m;
      const std::string text = slurp(err_);
      if (std::regex_search(text, m, listening))
        port_ = std::stoi(m[1]);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Server() {
    if (pid_ > 0) stop();
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // SIGTERM, then the exit status (128 + signal if killed).
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string stderr_text() const { return slurp(err_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string err_;
};

// A raw TCP connection to the server (for what an HTTP client library will not send), or -1.
int connect_to(const Server& server) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(server.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on `fd` and reads until the server closes the connection (or `seconds`
// pass without a byte); closes `fd`. What the server sent.
std::string exchange_until_closed(int fd, const std::string& request, int seconds = 5) {
  timeval timeout{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (!request.empty()) ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, size_t(n));
  ::close(fd);
  return answer;
}

// Reads one response on `fd` — its head, then the Content-Length bytes of its body — and
// leaves the connection open (the server sends nothing after it unasked). What arrived: short
// if the server closed or sent nothing for `seconds`.
std::string receive_response(int fd, int seconds = 30) {
  timeval timeout{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) {
    answer.append(buffer, size_t(n));
    const size_t head_end = answer.find("\r\n\r\n");
    if (head_end == std::string::npos) continue;
    std::smatch m;
    const std::string head = answer.substr(0, head_end + 2);
    const size_t length =
        std::regex_search(head, m,
                          std::regex("\r\nContent-Length: *([0-9]+)\r\n", std::regex::icase))
            ? std::stoul(m[1])
            : 0;
    if (answer.size() >= head_end + 4 + length) break;
  }
  return answer;
}

// Resident memory of a process, MiB.
int64_t resident_mib(pid_t pid) {
  const std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("VmRSS:");
  return at == std::string::npos ? -1 : std::stoll(status.substr(at + 6)) / 1024;
}

// Polls /metrics until it has `line` (a whole line, e.g. "transformer_queue_sentences 3") or
// `seconds` pass: tests wait on the server's own state instead of sleeping and hoping.
bool wait_for_metric(const Server& server, const std::string& line, int seconds = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    auto r = server.client().Get("/metrics");
    if (r && ("\n" + r->body).find("\n" + line + "\n") != std::string::npos) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

json post_json(const Server& s, const std::string& path, const std::string& body, int* status) {
  auto r = s.client().Post(path.c_str(), body, "application/json");
  if (!r) {
    *status = -1;
    return json();
  }
  *status = r->status;
  return json::parse(r->body);
}

// Random "words" of Arabic letters, space-separated as the transliteration model reads them.
std::vector<std::string> arabic_words(int count, unsigned seed) {
  const std::vector<std::string> letters = {"ا", "ب", "ت", "ث", "ج", "ح", "د", "ر",
                                            "ز", "س", "ش", "ص", "ع", "ف", "ق", "ك",
                                            "ل", "م", "ن", "ه", "و", "ي", "آ"};
  std::mt19937 random(seed);
  std::vector<std::string> words;
  for (int i = 0; i < count; ++i) {
    std::string w;
    const int length = 2 + int(random() % 9);
    for (int j = 0; j < length; ++j) w += (j ? " " : "") + letters[random() % letters.size()];
    words.push_back(w);
  }
  return words;
}

// `translate`'s answers for lines (beam 4): plain text, and the n-best lines.
std::vector<std::string> translate_lines(const std::vector<std::string>& lines,
                                         const std::string& options) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  work.write_file("lines.txt", text);
  CliResult r = work.run_cli("translate --model " + model_dir() + " -i " + work.path("lines.txt") +
                             " --threads 2 " + options);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(Serve, EndpointsAnswer) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto c = server.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body), json({{"status", "ok"}}));

  auto model = c.Get("/v1/model");
  ASSERT_TRUE(model);
  const json m = json::parse(model->body);
  const tfm::ModelConfig config = tfm::config_from_json(m["config"], "/v1/model");
  EXPECT_EQ(m["parameters"].get<int64_t>(), tfm::parameter_count(config));
  EXPECT_EQ(m["source_vocabulary"]["size"].get<int64_t>(), config.src_vocab_size);
  EXPECT_EQ(m["target_vocabulary"]["size"].get<int64_t>(), config.tgt_vocab_size);
  EXPECT_EQ(m["defaults"]["beam"], 4);
  EXPECT_EQ(m["defaults"]["sampling_topk"], 1);  // not sampling

  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_NE(page->body.find("/v1/translate"), std::string::npos);
  EXPECT_EQ(page->body.find("src=\"http"), std::string::npos);  // nothing loaded from outside
  EXPECT_EQ(page->body.find("href=\"http"), std::string::npos);

  auto missing = c.Get("/no/such/thing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"], "no such endpoint: GET /no/such/thing");

  int status = 0;
  post_json(server, "/v1/translate", R"({"text": ["آ ت ز م و ن", "آ ز ا"]})", &status);
  EXPECT_EQ(status, 200);
  post_json(server, "/v1/translate", R"({"text": 3})", &status);
  EXPECT_EQ(status, 400);
  // A request is counted just after its answer is sent, by the thread that sent it: poll
  // briefly until both translate requests are (the first one's thread may count it last).
  std::string text;
  for (int i = 0; i < 100; ++i) {
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    text = metrics->body;
    if (text.find("path=\"/v1/translate\",code=\"200\"} 1") != std::string::npos &&
        text.find("path=\"/v1/translate\",code=\"400\"} 1") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const char* line :
       {"transformer_requests_total{path=\"/v1/translate\",code=\"200\"} 1\n",
        "transformer_requests_total{path=\"/v1/translate\",code=\"400\"} 1\n",
        "transformer_request_errors_total{code=\"404\"} 1\n", "transformer_sentences_total 2\n",
        "transformer_source_tokens_total 9\n", "transformer_batch_sentences_count 1\n",
        "transformer_batch_sentences_bucket{le=\"2\"} 1\n", "transformer_queue_sentences 0\n",
        "# TYPE transformer_request_duration_seconds histogram\n",
        "transformer_request_duration_seconds_bucket{le=\"+Inf\"} "})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nnot in:\n" << text;
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, ConcurrentRequestsEqualTranslate) {
  const std::vector<std::string> words = arabic_words(48, 7);
  const std::vector<std::string> expected = translate_lines(words, "--beam 4");
  const std::vector<std::string> nbest = translate_lines(words, "--beam 4 --nbest 2");
  ASSERT_EQ(expected.size(), words.size());
  // A short wait makes concurrent sentences share batches; the answers must not change.
  Server server("--batch-wait-ms 30 --batch-quiet-ms 30");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  std::vector<std::future<json>> answers;
  for (size_t i = 0; i < words.size(); ++i)
    answers.push_back(std::async(std::launch::async, [&, i] {
      int status = 0;
      json j = post_json(server, "/v1/translate", json({{"text", words[i]}, {"nbest", 2}}).dump(),
                         &status);
      EXPECT_EQ(status, 200) << j;
      return j;
    }));
  for (size_t i = 0; i < words.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_TRUE(j.contains("translations")) << j;
    const json& t = j["translations"][0];
    EXPECT_EQ(t["text"], expected[i]) << words[i];
    // The n-best scores are `translate --nbest`'s numbers (printed there with 6 decimals).
    for (int k = 0; k < 2; ++k) {
      const std::string& line = nbest[2 * i + size_t(k)];
      const size_t score_at = line.rfind(" ||| ");
      EXPECT_EQ(t["nbest"][k]["text"],
                line.substr(line.find(" ||| ") + 5, score_at - line.find(" ||| ") - 5));
      EXPECT_NEAR(t["nbest"][k]["score"].get<double>(), std::stod(line.substr(score_at + 5)), 2e-6);
    }
  }
  // One request with many lines (and an empty one) is answered in its own order.
  std::vector<std::string> some(words.begin(), words.begin() + 10);
  some.insert(some.begin() + 3, "");
  int status = 0;
  const json many = post_json(server, "/v1/translate", json({{"text", some}}).dump(), &status);
  ASSERT_EQ(status, 200) << many;
  for (size_t i = 0, w = 0; i < some.size(); ++i) {
    if (i == 3) {
      EXPECT_EQ(many["translations"][i]["text"], "");
      EXPECT_TRUE(many["translations"][i]["score"].is_null());
      continue;
    }
    EXPECT_EQ(many["translations"][i]["text"], expected[w++]);
  }
  // The sentences really were batched together.
  const std::string metrics = server.client().Get("/metrics")->body;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(metrics, m, std::regex("transformer_batch_sentences_count (\\d+)")));
  EXPECT_LT(std::stoi(m[1]), 48 + 10) << metrics;
  EXPECT_EQ(server.stop(), 0);
}

// On a GPU (skipped where there is none): `serve --device cuda` answers concurrent requests,
// batched together, with the CPU's `translate` output, and stops cleanly.
TEST(Serve, TheGpuServesWhatTheCpuTranslates) {
  std::string why;
  const std::string gpu = tfm::testing_support::first_gpu_backend(why);
  if (gpu.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> words = arabic_words(24, 11);
  const std::vector<std::string> expected = translate_lines(words, "--beam 4");
  Server server("--device " + gpu + " --batch-wait-ms 30 --batch-quiet-ms 30", "gpu_server");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  std::vector<std::future<json>> answers;
  for (size_t i = 0; i < words.size(); ++i)
    answers.push_back(std::async(std::launch::async, [&, i] {
      int status = 0;
      json j = post_json(server, "/v1/translate", json({{"text", words[i]}}).dump(), &status);
      EXPECT_EQ(status, 200) << j;
      return j;
    }));
  for (size_t i = 0; i < words.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_TRUE(j.contains("translations")) << j;
    EXPECT_EQ(j["translations"][0]["text"], expected[i]) << words[i];
  }
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, RequestOptionsPrefixAndAttention) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  int status = 0;
  json j = post_json(server, "/v1/translate",
                     R"({"text": "آ ت ز م و ن", "beam": 2, "prefix": "a t s"})", &status);
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["translations"][0]["text"], "a t s u m o n");  // as `translate --prefix`
  j = post_json(server, "/v1/translate",
                R"({"text": ["آ ت ز م و ن"], "attention": true, "attention_layer": 0})", &status);
  ASSERT_EQ(status, 200) << j;
  const json& a = j["translations"][0]["attention"];
  const tfm::ModelConfig config = tfm::config_from_json(
      json::parse(server.client().Get("/v1/model")->body)["config"], "/v1/model");
  EXPECT_EQ(a["layer"], 0);
  EXPECT_EQ(a["heads"].size(), size_t(config.heads));
  EXPECT_EQ(a["target"].back(), "</s>");
  EXPECT_EQ(a["target"].size(), 7u);  // a t z m o n + eos
  for (const json& head : a["heads"]) {
    ASSERT_EQ(head.size(), a["target"].size());
    for (const json& row : head) {
      ASSERT_EQ(row.size(), a["source"].size());
      double sum = 0;
      for (const json& w : row) {
        sum += w.get<double>();
        const double scaled = w.get<double>() * 1e4;  // written to 4 decimals
        EXPECT_NEAR(scaled, std::round(scaled), 1e-6) << w;
      }
      // A softmax over the source positions, each weight rounded by at most 5e-5.
      EXPECT_NEAR(sum, 1.0, 5e-5 * double(row.size()) + 1e-6);
    }
  }
  j = post_json(server, "/v1/translate", R"({"text": "آ ز ا", "beam": 1, "max_length": 2})",
                &status);
  ASSERT_EQ(status, 200) << j;
  EXPECT_LE(j["translations"][0]["target_tokens"].get<int>(), 2);
  EXPECT_EQ(server.stop(), 0);
}

// An "attention": true answer is bounded before decoding: heads × (length limit + eos) × source
// positions per sentence, against --max-attention-cells.
TEST(Serve, AttentionAnswersAreBoundedByMaxAttentionCells) {
  const std::string text = "آ ت ز م و ن";  // 6 source tokens, then the eos the model appends
  int64_t cells = 0;
  {
    Server probe("");
    ASSERT_GT(probe.port(), 0) << probe.stderr_text();
    const tfm::ModelConfig config = tfm::config_from_json(
        json::parse(probe.client().Get("/v1/model")->body)["config"], "/v1/model");
    const int64_t limit = std::min<int64_t>(6 + 50, tfm::max_target_tokens(config));  // a·6 + b
    cells = config.heads * (limit + 1) * (6 + (config.src_append_eos ? 1 : 0));
    EXPECT_EQ(probe.stop(), 0);
  }
  const json body = {{"text", {text, text}}, {"attention", true}};
  {
    Server server("--max-attention-cells " + std::to_string(2 * cells - 1));
    ASSERT_GT(server.port(), 0) << server.stderr_text();
    int status = 0;
    json j = post_json(server, "/v1/translate", body.dump(), &status);
    EXPECT_EQ(status, 413) << j;
    EXPECT_NE(j.value("error", "").find("--max-attention-cells"), std::string::npos) << j;
    EXPECT_NE(j.value("error", "").find(std::to_string(2 * cells) + " weights by text[1]"),
              std::string::npos)
        << j;
    // The same sentences without attention, or with a shorter length limit, are answered.
    j = post_json(server, "/v1/translate", json({{"text", {text, text}}}).dump(), &status);
    EXPECT_EQ(status, 200) << j;
    j = post_json(server, "/v1/translate",
                  json({{"text", {text, text}}, {"attention", true}, {"max_length", 20}}).dump(),
                  &status);
    EXPECT_EQ(status, 200) << j;
    EXPECT_EQ(server.stop(), 0);
  }
  Server server("--max-attention-cells " + std::to_string(2 * cells));
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  int status = 0;
  const json j = post_json(server, "/v1/translate", body.dump(), &status);
  EXPECT_EQ(status, 200) << j;
  EXPECT_EQ(server.stop(), 0);
}

// `text` written `times` times.
std::string repeated(const std::string& text, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

TEST(Serve, ClientErrorsAreJsonNamingTheProblem) {
  Server server("--max-body-bytes 4000 --max-sentences 4 --max-sentence-tokens 12");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  struct Case {
    std::string body;
    int status;
    std::string message_part;
  };
  const std::string long_sentence = "آ ب ت ث ج ح د ر ز س ش ص ع";  // 13 letters
  const std::vector<Case> cases = {
      {"{\"text\": ", 400, "malformed JSON"},
      {"[1, 2]", 400, "must be a JSON object"},
      {R"({"text": "a", "beam": 5E0755})", 400,
       "malformed JSON: the number 5E0755 (\"beam\") is out of range"},  // past a double
      {R"({"text": "a", "beam": 2, "beam": 16})", 400, "malformed JSON: duplicate key \"beam\""},
      {R"({"text": ["a", {"x": 1, "x": 2}]})", 400, "duplicate key \"x\""},
      {R"({"txt": "x"})", 400, "unknown field \"txt\""},
      {R"({"beam": 2})", 400, "missing field \"text\""},
      {R"({"text": 5})", 400, "text must be a string or a list of strings"},
      {R"({"text": ["a", 7]})", 400, "text[1] must be a string"},
      {R"({"text": []})", 400, "at least one sentence"},
      {"{\"text\": \"\xff\xfe\"}", 400, "malformed JSON"},  // invalid UTF-8 inside a string
      {R"({"text": "a\u0000b"})", 400, "NUL"},
      {R"({"text": "a", "beam": 0})", 400, "beam must be between 1 and 16"},
      {R"({"text": "a", "beam": 2.5})", 400, "beam must be a whole number"},
      {R"({"text": "a", "beam": 17})", 400, "--max-beam"},
      {R"({"text": "a", "beam": 2, "nbest": 3})", 400, "nbest (3) cannot exceed beam (2)"},
      {R"({"text": "a", "alpha": "big"})", 400, "alpha must be a number"},
      {R"({"text": "a", "attention": 1})", 400, "attention must be true or false"},
      {R"({"text": "a", "attention_layer": 99})", 400, "attention_layer must be between"},
      {R"({"text": ["a", "b"], "prefix": ["x"]})", 400, "prefix has 1 entries but text has 2"},
      {R"({"text": "a", "max_length": 0})", 400, "max_length must be between"},
      {R"({"text": ["a", "b", "c", "d", "e"]})", 413, "at most 4 per request (--max-sentences)"},
      {json({{"text", long_sentence}}).dump(), 400,
       "text[0] has 13 tokens; this server takes at most 12 per sentence (--max-sentence-tokens)"},
      {json({{"text", std::string(5000, 'a')}}).dump(), 413,
       "larger than 4000 bytes (--max-body-bytes)"},
      // Values beyond 2 × (2 × --max-sentences + 16) are refused as they are parsed: a body
      // of "{}," builds tens of times its bytes. 49 values here: the object, the list and 47
      // empty objects.
      {"{\"text\": [" + repeated("{}, ", 46) + "{}]}", 413, "more than 48 JSON values"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const json j = post_json(server, "/v1/translate", c.body, &status);
    EXPECT_EQ(status, c.status) << c.body << " → " << j;
    ASSERT_TRUE(j.is_object() && j.contains("error")) << c.body << " → " << j;
    EXPECT_NE(j["error"].get<std::string>().find(c.message_part), std::string::npos)
        << c.body << " → " << j;
  }
  // A request at the limit of everything is not refused for its values.
  int status = 0;
  const json full = post_json(server, "/v1/translate",
                              R"({"text": ["آ", "ز", "ا", "ن"], "prefix": ["a", "z", "a", "n"],
                                  "beam": 2, "alpha": 0.5, "nbest": 2, "max_length": 8,
                                  "attention": true, "attention_layer": 0})",
                              &status);
  EXPECT_EQ(status, 200) << full;
  // LibreTranslate's JSON is held to the same bound.
  const json libre = post_json(
      server, "/translate",
      "{\"source\": \"ar\", \"target\": \"en\", \"q\": [" + repeated("{}, ", 46) + "{}]}", &status);
  EXPECT_EQ(status, 413) << libre;
  EXPECT_NE(libre.value("error", "").find("more than 48 JSON values"), std::string::npos) << libre;
  // After all that the server still translates.
  const json ok = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
  EXPECT_EQ(status, 200) << ok;
  EXPECT_EQ(ok["translations"][0]["text"], "a z z a");
  EXPECT_EQ(server.stop(), 0);
}

// A number from /proc/<pid>/status ("VmData:", "VmRSS:"), kB; -1 when it has none.
int64_t proc_status_kb(pid_t pid, const std::string& field) {
  const std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("\n" + field);
  return at == std::string::npos ? -1 : std::stoll(status.substr(at + 1 + field.size()));
}

// The server's 500s, each reached by a real request: a sentence the decoder refuses (here its
// search needs more than --max-memory: the service's RequestError(500)), an exception from the
// model itself (a token-list vocabulary without <unk> meets a word it lacks: the handler's
// catch of any std::exception), and std::bad_alloc in a request's handler (the server's data
// limit lowered under it while it parses a large form). Each is JSON naming the problem,
// counted under code 500, and the server answers the next request.
TEST(Serve, ServerErrorsAreJsonNamingTheProblemAndTheServerGoesOn) {
  const std::string long_text = [] {  // 600 source tokens: decoding it needs ~17 MiB
    std::string text = "ب";
    for (int i = 1; i < 600; ++i) text += " ب";
    return text;
  }();
  {
    Server server("--max-memory 4M", "max_memory_server");
    ASSERT_GT(server.port(), 0) << server.stderr_text();
    int status = 0;
    json j =
        post_json(server, "/v1/translate", json({{"text", {"آ ز ا", long_text}}}).dump(), &status);
    EXPECT_EQ(status, 500) << j;
    const std::string error = j.value("error", "");
    EXPECT_EQ(error.rfind("text[1] could not be translated: decoding 1 sentence of 600 tokens", 0),
              0u)
        << j;
    EXPECT_NE(error.find("allowed by --max-memory"), std::string::npos) << j;
    j = post_json(server, "/translate",
                  json({{"q", long_text}, {"source", "ar"}, {"target", "en"}}).dump(), &status);
    EXPECT_EQ(status, 500) << j;
    EXPECT_NE(j.value("error", "").find("allowed by --max-memory"), std::string::npos) << j;
    j = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
    EXPECT_EQ(status, 200) << j;
    EXPECT_EQ(j["translations"][0]["text"], "a z z a");
    EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"500\"} 2"));
    EXPECT_EQ(server.stop(), 0);
  }
  {
    // The transliteration model with its source vocabulary's <unk> renamed.
    namespace fs = std::filesystem;
    const fs::path dir = work.path("no_unk_model");
    fs::create_directories(dir);
    for (const char* file : {"model.safetensors", "target_vocabulary.txt"})
      fs::copy_file(fs::path(model_dir()) / file, dir / file, fs::copy_options::overwrite_existing);
    std::string vocabulary = slurp(model_dir() + "/source_vocabulary.txt");
    const size_t unk = vocabulary.find("\n<unk>\n");
    ASSERT_NE(unk, std::string::npos);
    vocabulary.replace(unk, 7, "\n<not unk>\n");
    work.write_file("no_unk_model/source_vocabulary.txt", vocabulary);
    Server server("", "no_unk_server", dir.string());
    ASSERT_GT(server.port(), 0) << server.stderr_text();
    int status = 0;
    json j = post_json(server, "/v1/translate", R"({"text": "آ ز hello"})", &status);
    EXPECT_EQ(status, 500) << j;
    EXPECT_NE(
        j.value("error", "")
            .find("source_vocabulary.txt: token \"hello\" is not in the vocabulary, which has no "
                  "<unk>"),
        std::string::npos)
        << j;
    j = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
    EXPECT_EQ(status, 200) << j;
    EXPECT_EQ(j["translations"][0]["text"], "a z z a");
    EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"500\"} 1"));
    EXPECT_EQ(server.stop(), 0);
  }
#if defined(__SANITIZE_ADDRESS__)
  // ASan's allocator ends the process when memory runs out instead of throwing bad_alloc.
  tfm::testing_support::skip_part("std::bad_alloc",
                                  "AddressSanitizer aborts on an allocation that fails");
#else
  // /translate's handler parses an urlencoded form itself: 780,000 fields of 4 bytes take
  // ~150 MB, the 3.9 MB body that carries them under 8 MB; --max-sentences 400000 lets that
  // many fields through (its bound is 2 × (2 × 400,000 + 16)). With 32 MiB more allowed than
  // the server holds (RLIMIT_DATA, which glibc's heaps are charged against as they grow), the
  // body is read and the parse runs out. (Past ~130 MiB the parse would finish, and the JSON
  // object built from its fields run out instead: nlohmann's destructor allocates, and a
  // bad_alloc there ends the process.)
  Server server("--max-body-bytes 4000000 --max-sentences 400000", "bad_alloc_server");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto c = server.client();
  ASSERT_TRUE(c.Get("/health"));  // the connection threads (started after "listening") exist
  std::string form;
  const std::string digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (size_t i = 0; i < 780000; ++i) {
    if (i) form += '&';
    for (size_t k = i, d = 0; d < 4; ++d, k /= digits.size()) form += digits[k % digits.size()];
  }
  rlimit before{};
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_DATA, nullptr, &before), 0);
  const int64_t data_kb = proc_status_kb(server.pid(), "VmData:");
  ASSERT_GT(data_kb, 0);
  rlimit lowered = before;
  lowered.rlim_cur = rlim_t(data_kb + (32 << 10)) << 10;
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_DATA, &lowered, nullptr), 0);
  auto r = c.Post("/translate", form, "application/x-www-form-urlencoded");
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_DATA, &before, nullptr), 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->body, R"({"error":"out of memory"})");
  int status = 0;
  const json j = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
  EXPECT_EQ(status, 200) << j;
  EXPECT_EQ(j["translations"][0]["text"], "a z z a");
  EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"500\"} 1"));
  EXPECT_EQ(server.stop(), 0);

  // With 1 MiB to spare in a fresh server, memory runs out before any handler: in httplib,
  // reading the 3.9 MB body (answered 500 with the JSON above, the connection then closed,
  // since the rest of the body would be read as the next request's line), or reading a request
  // line (the connection closed unanswered). Either way the server goes on; an exception
  // escaping a connection's thread ended the process.
  Server fresh("--max-body-bytes 4000000", "tight_server");
  ASSERT_GT(fresh.port(), 0) << fresh.stderr_text();
  ASSERT_TRUE(fresh.client().Get("/health"));
  const std::string large_body = json({{"text", form}}).dump();
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t now_kb = proc_status_kb(fresh.pid(), "VmData:");
    ASSERT_GT(now_kb, 0);
    rlimit tight_limit = before;
    tight_limit.rlim_cur = rlim_t(now_kb + 1024) << 10;
    ASSERT_EQ(::prlimit(fresh.pid(), RLIMIT_DATA, &tight_limit, nullptr), 0);
    // Sent as curl sends it: the body in pieces until an answer comes, then the connection
    // closed. A server that answered early and kept the connection would read the rest of the
    // body as its next request line.
    const int fd = connect_to(fresh);
    ASSERT_GE(fd, 0);
    const std::string head =
        "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(large_body.size()) + "\r\n\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
    for (size_t sent = 0; sent < large_body.size();) {
      pollfd answered{fd, POLLIN, 0};
      if (::poll(&answered, 1, 0) > 0) break;
      const ssize_t n = ::send(fd, large_body.data() + sent,
                               std::min<size_t>(64 << 10, large_body.size() - sent), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
    const std::string answer = receive_response(fd, 10);
    ::close(fd);
    ASSERT_EQ(::prlimit(fresh.pid(), RLIMIT_DATA, &before, nullptr), 0);
    if (!answer.empty()) {
      EXPECT_EQ(answer.rfind("HTTP/1.1 500 ", 0), 0u) << attempt << ": " << answer;
      EXPECT_NE(answer.find(R"({"error":"out of memory"})"), std::string::npos) << answer;
    }
    auto health = fresh.client().Get("/health");
    ASSERT_TRUE(health) << "the server ended: " << fresh.stderr_text();
    EXPECT_EQ(health->status, 200);
  }
  EXPECT_EQ(fresh.stop(), 0);
#endif
}

TEST(Serve, FullQueueTimeoutAndDisconnect) {
  // The first sentence waits 5 s for company, so the queue stays occupied meanwhile.
  Server server(
      "--batch-wait-ms 5000 --batch-quiet-ms 5000 --max-queued-sentences 3 --request-timeout 1");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto first = std::async(std::launch::async, [&] {
    int status = 0;
    post_json(server, "/v1/translate", R"({"text": ["آ ز ا", "آ ت ز م و ن", "آ ب"]})", &status);
    return status;
  });
  ASSERT_TRUE(wait_for_metric(server, "transformer_queue_sentences 3"));
  auto full = server.client().Post("/v1/translate", R"({"text": "آ ز ا"})", "application/json");
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 503);
  EXPECT_EQ(full->get_header_value("Retry-After"), "1");
  EXPECT_NE(full->body.find("queue is full"), std::string::npos) << full->body;
  // More sentences than the queue ever holds: 413, not a 503 to retry forever.
  auto never = server.client().Post("/v1/translate", R"({"text": ["آ ز ا", "آ ب", "آ", "ب"]})",
                                    "application/json");
  ASSERT_TRUE(never);
  EXPECT_EQ(never->status, 413) << never->body;
  EXPECT_NE(never->body.find("has 4 sentences to translate; this server's queue holds at most 3"),
            std::string::npos)
      << never->body;
  // The first request runs past --request-timeout while it waits: 504, its sentences dropped.
  EXPECT_EQ(first.get(), 504);

  // A client that sends a request and goes away: its queued sentence is dropped.
  const int fd = connect_to(server);
  ASSERT_GE(fd, 0);
  const std::string body = R"({"text": ["آ ز ا", "آ ب"]})";
  const std::string request =
      "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), ssize_t(request.size()));
  ASSERT_TRUE(wait_for_metric(server, "transformer_queue_sentences 2"));
  ::close(fd);
  EXPECT_TRUE(wait_for_metric(server, "transformer_dropped_sentences_total 5"));
  const std::string metrics = server.client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("transformer_dropped_sentences_total 5\n"), std::string::npos)
      << metrics;  // 3 of the timed-out request + 2 of the one that went away
  EXPECT_NE(metrics.find("transformer_request_errors_total{code=\"503\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("transformer_request_errors_total{code=\"504\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("transformer_sentences_total 0\n"), std::string::npos) << metrics;

  // A client that half-closes after its request (as `nc -N` does) has gone as far as the server
  // can tell: its sentence is dropped, and the connection is closed without an answer (it got
  // "499 Internal Server Error", httplib's phrase for a status it does not know); the 499 is
  // counted.
  const int half = connect_to(server);
  ASSERT_GE(half, 0);
  const std::string one = R"({"text": "آ ز ا"})";
  const std::string one_request =
      "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(one.size()) + "\r\n\r\n" + one;
  ASSERT_EQ(::send(half, one_request.data(), one_request.size(), 0), ssize_t(one_request.size()));
  ASSERT_TRUE(wait_for_metric(server, "transformer_queue_sentences 1"));
  ::shutdown(half, SHUT_WR);
  EXPECT_EQ(exchange_until_closed(half, "", 10), "");
  EXPECT_TRUE(wait_for_metric(server, "transformer_dropped_sentences_total 6"));
  EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"499\"} 2"));
  EXPECT_EQ(server.stop(), 0);
}

// A batch whose every request timed out stops decoding at its next step: the server is free at
// once for the next request, and the batch's sentences count as dropped, not as a decoded batch.
// (It decoded on: a heavy request within every limit held the server for minutes after its 504.)
TEST(Serve, ABatchNobodyWaitsForStopsDecoding) {
  Server server("--request-timeout 1 --max-sentence-tokens 1024");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  // 64 sentences, each forced through a 1000-token prefix at beam 16: tens of seconds of work.
  json heavy = {{"text", json::array()}, {"prefix", json::array()}, {"beam", 16}};
  std::string prefix;
  for (int i = 0; i < 1000; ++i) prefix += "a ";
  for (int i = 0; i < 64; ++i) {
    heavy["text"].push_back("آ ز ا ب ت");
    heavy["prefix"].push_back(prefix);
  }
  int status = 0;
  const json answer = post_json(server, "/v1/translate", heavy.dump(), &status);
  EXPECT_EQ(status, 504) << answer;
  EXPECT_TRUE(wait_for_metric(server, "transformer_dropped_sentences_total 64", 10));
  const json small = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
  EXPECT_EQ(status, 200) << small;
  // The stopped batch is not counted as a decoded one.
  const std::string metrics = server.client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("transformer_batch_sentences_count 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, TooManyConnectionsGet503) {
  // One connection answered, one waiting; a third is answered 503 at once. The order comes from
  // events, not sleeps: the answered connection proves that the one thread has taken it (its
  // first request, /health, is answered) and holds it there (its second request, pipelined
  // behind, sends only part of its body); the waiting one is accepted before the third because
  // the kernel queues connections in the order they were made and one thread accepts them.
  // With --allow-origin the 503 carries the CORS headers every answer does, so that a page can
  // read it and its Retry-After.
  Server server("--max-connections 1 --allow-origin https://example.org");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const std::string body = R"({"text": "آ ز ا"})";
  const std::string translate =
      "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  const int answered = connect_to(server);
  ASSERT_GE(answered, 0);
  // The rest of the body is sent after the third connection's answer: until then the thread
  // waits for it (each read bounded by --io-timeout, 10 s: a generous bound for this test).
  const std::string first =
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + translate + body.substr(0, 5);
  ASSERT_EQ(::send(answered, first.data(), first.size(), 0), ssize_t(first.size()));
  const std::string health = receive_response(answered);
  ASSERT_EQ(health.rfind("HTTP/1.1 200 ", 0), 0u) << health;
  const int waiting = connect_to(server);
  ASSERT_GE(waiting, 0);
  const std::string whole = translate + body;
  ASSERT_EQ(::send(waiting, whole.data(), whole.size(), 0), ssize_t(whole.size()));

  const auto started = std::chrono::steady_clock::now();
  auto c = server.client().Get("/health");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 503);
  EXPECT_EQ(c->get_header_value("Retry-After"), "1");
  EXPECT_NE(c->body.find("--max-connections"), std::string::npos) << c->body;
  EXPECT_EQ(c->get_header_value("Access-Control-Allow-Origin"), "https://example.org");
  EXPECT_EQ(c->get_header_value("Access-Control-Expose-Headers"), "Retry-After");
  // At once: a connection that waited for the thread would be answered only after the held
  // request gave up (--io-timeout, 10 s).
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));

  // The held request is answered once its body is whole, then the waiting one (the thread
  // takes it when the answered connection closes).
  const std::string rest = body.substr(5);
  ASSERT_EQ(::send(answered, rest.data(), rest.size(), 0), ssize_t(rest.size()));
  std::string answer = receive_response(answered);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("\"a z z a\""), std::string::npos) << answer;
  ::close(answered);
  answer = receive_response(waiting);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("\"a z z a\""), std::string::npos) << answer;
  ::close(waiting);
  EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"503\"} 1"));
  EXPECT_EQ(server.stop(), 0);
}

// A connection past the pool that sends nothing (or not yet) gets its 503 too: it was closed
// unanswered after the keep-alive wait, on the accepting thread. Here the one answering
// connection waits for its next request (keep-alive), one more waits for a thread, and a
// third that sends nothing is answered 503 at once and closed.
TEST(Serve, AnIdleConnectionPastThePoolGets503) {
  Server server("--max-connections 1");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const int answered = connect_to(server);
  ASSERT_GE(answered, 0);
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(answered, health.data(), health.size(), 0), ssize_t(health.size()));
  char buffer[512];
  ASSERT_GT(::recv(answered, buffer, sizeof buffer, 0), 0);  // served; now it keeps alive
  // Accepted in the order they connect: this one waits for the thread, the next is past it.
  const int waiting = connect_to(server);
  ASSERT_GE(waiting, 0);
  const auto started = std::chrono::steady_clock::now();
  const std::string refused = exchange_until_closed(connect_to(server), "");
  EXPECT_EQ(refused.rfind("HTTP/1.1 503 ", 0), 0u) << refused;
  EXPECT_NE(refused.find("Retry-After: 1\r\n"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--max-connections"), std::string::npos) << refused;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(1000));
  ::close(answered);
  ::close(waiting);
  EXPECT_EQ(server.stop(), 0);
}

// A request line (or headers) without an end: answered 431 once 64 KiB of it have come, and the
// connection closed. httplib alone reads a request line until its newline, however long: 64 MB
// without one made the server 100 MB larger, and it answered nothing. Sends each start and then
// 64 KiB chunks until the answer comes (at most 16 MiB); returns the answers.
std::vector<std::string> send_heads_without_an_end(const Server& server) {
  std::vector<std::string> answers;
  for (const std::string& start :
       {std::string("GET /"), std::string("POST /v1/translate HTTP/1.1\r\nX: ")}) {
    const int fd = connect_to(server);
    if (fd < 0) return answers;
    if (::send(fd, start.data(), start.size(), MSG_NOSIGNAL) != ssize_t(start.size())) {
      ::close(fd);
      return answers;
    }
    const std::string chunk(64 << 10, 'a');
    for (size_t sent = 0; sent < (16u << 20);) {
      pollfd answered{fd, POLLIN, 0};
      if (::poll(&answered, 1, 0) > 0) break;
      const ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
    answers.push_back(receive_response(fd, 15));
    ::close(fd);
  }
  return answers;
}

TEST(Serve, AHeadWithoutAnEndIs431) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const std::vector<std::string> answers = send_heads_without_an_end(server);
  ASSERT_EQ(answers.size(), 2u);
  for (const std::string& answer : answers) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 431 ", 0), 0u) << answer.substr(0, 300);
    EXPECT_NE(answer.find(R"({"error":"the request line and headers take more than 65536 bytes"})"),
              std::string::npos)
        << answer.substr(0, 300);
  }
  int status = 0;
  const json j = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
  EXPECT_EQ(status, 200) << j;
  EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"431\"} 2"));
  EXPECT_EQ(server.stop(), 0);
}

// A head that trickles in (a byte every 200 ms, never ending) is answered 408 once --io-timeout
// has passed since it began, and its connection closed: each byte used to restart the timeout,
// so a few such clients held every connection of the pool for as long as they liked.
TEST(Serve, AHeadThatTricklesIs408) {
  Server server("--io-timeout 1");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const int fd = connect_to(server);
  ASSERT_GE(fd, 0);
  const auto started = std::chrono::steady_clock::now();
  std::string answer;
  char buffer[4096];
  for (int i = 0; i < 50; ++i) {  // up to 10 s
    ::send(fd, "X", 1, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
        answer.append(buffer, size_t(n));
      break;
    }
  }
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 408 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("did not arrive within --io-timeout"), std::string::npos) << answer;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_TRUE(wait_for_metric(server, "transformer_request_errors_total{code=\"408\"} 1"));
  EXPECT_EQ(server.stop(), 0);
}

// A request whose line or headers cannot be parsed, or whose Content-Length is not a number, is
// answered 400 and its connection closed: where the next request would start is not known (a
// Content-Length of "abc" was read as 0, and the body as the next request).
TEST(Serve, AMalformedRequestIs400AndEndsItsConnection) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  std::string answer = exchange_until_closed(connect_to(server), "GARBAGE\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 400 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos) << answer;
  EXPECT_NE(answer.find("malformed HTTP request"), std::string::npos) << answer;
  const std::string body = R"({"text": "آ ز ا"})";
  answer = exchange_until_closed(
      connect_to(server),
      "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: abc\r\n\r\n" +
          body);
  EXPECT_EQ(answer.rfind("HTTP/1.1 400 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("Content-Length must be a decimal number of bytes"), std::string::npos)
      << answer;
  EXPECT_EQ(answer.find("HTTP/1.1", 10), std::string::npos) << answer;  // one answer only
  // A length past any body is 413, not 400, however many leading zeros a small one has.
  const std::string huge = "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: ";
  answer = exchange_until_closed(connect_to(server), huge + "10000000000000000000\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 413 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("--max-body-bytes"), std::string::npos) << answer;
  answer = exchange_until_closed(
      connect_to(server), huge + "0000000000000000000000" + std::to_string(body.size()) +
                              "\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" +
                              body);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  int status = 0;
  post_json(server, "/v1/translate", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(server.stop(), 0);
}

// Lines that end in a bare LF (a request typed into nc, or written by a sloppy client) are read
// as CRLF ones, as RFC 9112 allows and nginx does: httplib answered such a request line 400,
// and took headers so ended for no end of the head at all (408 after --io-timeout).
TEST(Serve, LinesEndingInABareLineFeedAreRead) {
  Server server("--io-timeout 5");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const auto started = std::chrono::steady_clock::now();
  std::string answer =
      exchange_until_closed(connect_to(server), "GET /health HTTP/1.1\nConnection: close\n\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  const std::string body = R"({"text": "آ ز ا"})";
  answer = exchange_until_closed(
      connect_to(server),
      "POST /v1/translate HTTP/1.1\r\nContent-Type: application/json\nContent-Length: " +
          std::to_string(body.size()) + "\nConnection: close\r\n\n" + body);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  const json translated = json::parse(answer.substr(answer.find("\r\n\r\n") + 4));
  int status = 0;
  EXPECT_EQ(translated, post_json(server, "/v1/translate", body, &status));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
  EXPECT_EQ(server.stop(), 0);
}

// The same heads leave the server's resident memory within 16 MiB of where it was: what it read of
// them is bounded, not buffered to the end. (Left out of the sanitizer pass, as the other memory
// tests are: there RSS measures ASan's quarantine, not the server.)
TEST(Serve, AHeadWithoutAnEndLeavesNoMemoryBehind) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const int64_t before_mib = resident_mib(server.pid());
  ASSERT_EQ(send_heads_without_an_end(server).size(), 2u);
  EXPECT_LT(resident_mib(server.pid()), before_mib + 16);
  EXPECT_EQ(server.stop(), 0);
}

// A POST without Content-Length (and not chunked) is 411 at once and its connection ends: it
// waited for the client to close (--io-timeout) and got 400. A method a path does not answer is
// 405 with Allow, not 404.
TEST(Serve, BodyWithoutLengthIs411AndAWrongMethodIs405) {
  Server server("");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  const auto started = std::chrono::steady_clock::now();
  const std::string answer = exchange_until_closed(
      connect_to(server), "POST /v1/translate HTTP/1.1\r\nHost: x\r\n\r\n{\"text\": \"a\"}");
  EXPECT_EQ(answer.rfind("HTTP/1.1 411 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("needs a Content-Length"), std::string::npos) << answer;
  EXPECT_EQ(answer.find("HTTP/1.1 400"), std::string::npos) << answer;  // the body not read as
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));  // a request
  auto c = server.client();
  auto r = c.Get("/v1/translate");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Post("/health", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
  EXPECT_NE(json::parse(r->body)["error"].get<std::string>().find("not POST"), std::string::npos);
  r = c.Delete("/translate");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Get("/nowhere");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  // Chunked bodies are still read.
  r = c.Post(
      "/v1/translate",
      [](size_t, httplib::DataSink& sink) {
        const std::string body = R"({"text": "آ ز ا"})";
        sink.write(body.data(), body.size());
        sink.done();
        return true;
      },
      "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(server.stop(), 0);
}

// The comma-separated names of a header's value (Allow, Access-Control-Allow-*), trimmed.
std::set<std::string> header_list(const httplib::Response& r, const char* header) {
  std::set<std::string> names;
  std::istringstream in(r.get_header_value(header));
  for (std::string name; std::getline(in, name, ',');) {
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    names.insert(name);
  }
  return names;
}

// --allow-origin, checked as a browser's CORS protocol (the Fetch standard) reads the answers:
// a page on another origin that POSTs JSON first sends a preflight (OPTIONS with
// Access-Control-Request-Method: POST and Access-Control-Request-Headers: content-type), which
// must get an ok status (2xx) with Access-Control-Allow-Origin matching the page's origin (or
// "*"), and Access-Control-Allow-Headers naming content-type (POST itself is a safelisted
// method, listed anyway); the answer to the POST must carry Access-Control-Allow-Origin too, or
// the page cannot read it — an error's JSON included. Without --allow-origin no Access-Control-*
// header is sent and OPTIONS is a method like any other the paths do not answer: 405.
TEST(Serve, AllowOriginAnswersBrowsersPreflightsAndRequests) {
  const httplib::Headers preflight = {{"Origin", "https://example.org"},
                                      {"Access-Control-Request-Method", "POST"},
                                      {"Access-Control-Request-Headers", "content-type"}};
  const httplib::Headers from_page = {{"Origin", "https://example.org"}};
  for (const std::string origin : {"*", "https://example.org"}) {
    SCOPED_TRACE("--allow-origin " + origin);
    Server server("--allow-origin " + origin, "cors_server");
    ASSERT_GT(server.port(), 0) << server.stderr_text();
    auto c = server.client();
    for (const char* path : {"/v1/translate", "/translate"}) {
      auto r = c.Options(path, preflight);
      ASSERT_TRUE(r) << path;
      EXPECT_GE(r->status, 200) << path;
      EXPECT_LT(r->status, 300) << path;
      EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin) << path;
      EXPECT_TRUE(header_list(*r, "Access-Control-Allow-Methods").count("POST")) << path;
      std::set<std::string> headers;  // header names match whatever their case
      for (std::string name : header_list(*r, "Access-Control-Allow-Headers")) {
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char ch) { return char(std::tolower(ch)); });
        headers.insert(name);
      }
      EXPECT_TRUE(headers.count("content-type") || headers.count("*")) << path;
    }
    auto r = c.Post("/v1/translate", from_page, R"({"text": "آ ز ا"})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
    // Retry-After (on 503s) is not a header a page may read unless the answer names it.
    EXPECT_EQ(r->get_header_value("Access-Control-Expose-Headers"), "Retry-After");
    r = c.Post("/translate", from_page, R"({"q": "آ ز ا", "source": "ar", "target": "en"})",
               "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["translatedText"], "a z z a");
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
    r = c.Post("/v1/translate", from_page, R"({"text": 3})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
    // A 405 lists OPTIONS among the methods its path answers.
    r = c.Get("/v1/translate", from_page);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "POST, OPTIONS");
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
    r = c.Post("/health", from_page, "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD, OPTIONS");
    EXPECT_EQ(server.stop(), 0);
  }

  Server server("", "no_cors_server");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto c = server.client();
  auto no_cors_headers = [](const httplib::Response& r) {
    for (const auto& [name, value] : r.headers)
      if (name.size() >= 15 && strncasecmp(name.c_str(), "Access-Control-", 15) == 0) return false;
    return true;
  };
  for (const char* path : {"/v1/translate", "/translate"}) {
    auto r = c.Options(path, preflight);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 405) << path;
    EXPECT_EQ(r->get_header_value("Allow"), "POST") << path;
    EXPECT_TRUE(no_cors_headers(*r)) << path;
  }
  auto r = c.Post("/v1/translate", from_page, R"({"text": "آ ز ا"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(no_cors_headers(*r));
  r = c.Post("/v1/translate", from_page, R"({"text": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(no_cors_headers(*r));
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, GracefulStopFinishesRequestsInFlight) {
  Server server("--batch-wait-ms 1000 --batch-quiet-ms 1000");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto in_flight = std::async(std::launch::async, [&] {
    int status = 0;
    const json j = post_json(server, "/v1/translate", R"({"text": "آ ز ا"})", &status);
    return std::make_pair(status, j);
  });
  ASSERT_TRUE(wait_for_metric(server, "transformer_queue_sentences 1"));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(), 0);  // SIGTERM while the request waits in the queue
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  const auto [status, j] = in_flight.get();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(j["translations"][0]["text"], "a z z a");
  EXPECT_NE(server.stderr_text().find("serve: stopped by SIGTERM"), std::string::npos);
  httplib::Client after("127.0.0.1", server.port());
  EXPECT_FALSE(after.Get("/health"));  // no longer accepting
}

TEST(Serve, LibreTranslateClientsWorkUnchanged) {
  Server server("--source-language ar --target-language en");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto c = server.client();
  // JSON, as LibreTranslate's documentation shows.
  auto r =
      c.Post("/translate", R"({"q": "آ ز ا", "source": "ar", "target": "en", "format": "text"})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body), json({{"translatedText", "a z z a"}}));
  // A batch with alternatives, source auto.
  r = c.Post(
      "/translate",
      R"({"q": ["آ ز ا", "آ ت ز م و ن"], "source": "auto", "target": "en", "alternatives": 1})",
      "application/json");
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["translatedText"], json({"a z z a", "a t z m o n"}));
  EXPECT_EQ(j["alternatives"].size(), 2u);
  EXPECT_EQ(j["alternatives"][0].size(), 1u);
  EXPECT_EQ(j["detectedLanguage"][0], json({{"confidence", 100.0}, {"language", "ar"}}));
  // Form-encoded, as libretranslate-py and browser forms send it.
  httplib::Params form = {{"q", "آ ز ا"}, {"source", "ar"}, {"target", "en"}};
  r = c.Post("/translate", form);
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["translatedText"], "a z z a");
  // Multipart form.
  httplib::MultipartFormDataItems parts = {
      {"q", "آ ز ا", "", ""}, {"source", "ar", "", ""}, {"target", "en", "", ""}};
  r = c.Post("/translate", parts);
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["translatedText"], "a z z a");
  // Its error shapes.
  const std::vector<std::pair<std::string, std::string>> errors = {
      {R"({"source": "ar", "target": "en"})", "Invalid request: missing q parameter"},
      {R"({"q": "x", "target": "en"})", "Invalid request: missing source parameter"},
      {R"({"q": "x", "source": "ar"})", "Invalid request: missing target parameter"},
      {R"({"q": "x", "source": "fr", "target": "en"})", "fr is not supported"},
      {R"({"q": "x", "source": "ar", "target": "de"})", "de is not supported"},
      {R"({"q": "x", "source": "ar", "target": "en", "format": "xml"})",
       "xml format is not supported"},
      {R"({"q": "x", "source": "ar", "target": "en", "alternatives": "z"})",
       "Invalid request: alternatives parameter is not a number"},
      {R"({"q": "x", "source": "ar", "target": "en", "alternatives": -1})",
       "Invalid request: alternatives parameter must be >= 0"},
      {R"({"q": "x", "source": "ar", "target": "en", "alternatives": 16})",
       "Invalid request: alternatives parameter must be <= 15"},
      {R"({"q": "x", "q": "y", "source": "ar", "target": "en"})",
       "Invalid request: duplicate key \"q\""},
      {"{", "Invalid JSON format"}};
  for (const auto& [body, message] : errors) {
    r = c.Post("/translate", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_EQ(json::parse(r->body), json({{"error", message}})) << body;
  }
  // Every language, each with its English name and targets, as LibreTranslate lists them: a
  // client that looks the target up among the languages' own codes finds it.
  r = c.Get("/languages");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body),
            json::parse(R"([{"code": "ar", "name": "Arabic", "targets": ["en"]},
                                                  {"code": "en", "name": "English", "targets": []}])"));
  r = c.Get("/frontend/settings");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["language"]["target"],
            json({{"code", "en"}, {"name", "English"}}));
  // /detect: the source language, for one text or several; LibreTranslate's error without q,
  // and 405 for GET.
  r = c.Post("/detect", R"({"q": ["آ ز ا", "آ ت ز م و ن"]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body), json::parse(R"([{"confidence": 100.0, "language": "ar"}])"));
  r = c.Post("/detect", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body), json({{"error", "Invalid request: missing q parameter"}}));
  r = c.Get("/detect");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);

  // libretranslate-py's requests, byte for byte as its LibreTranslateAPI sends them with
  // urllib: languages() is a GET that carries an empty urlencoded body; detect() and translate()
  // POST urlencoded fields. A client that checks its codes against /languages first.
  const std::string urlencoded = "Content-Type: application/x-www-form-urlencoded\r\n";
  auto send = [&](const std::string& method, const std::string& path, const std::string& body) {
    const std::string answer = exchange_until_closed(
        connect_to(server), method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                                "Accept-Encoding: identity\r\nUser-Agent: Python-urllib/3.11\r\n" +
                                urlencoded + "Content-Length: " + std::to_string(body.size()) +
                                "\r\nConnection: close\r\n\r\n" + body);
    const size_t start = answer.find("\r\n\r\n");
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
    return start == std::string::npos ? json() : json::parse(answer.substr(start + 4));
  };
  const json languages = send("GET", "/languages", "");
  std::set<std::string> codes;
  for (const json& language : languages) codes.insert(language["code"].get<std::string>());
  EXPECT_EQ(codes, (std::set<std::string>{"ar", "en"}));
  EXPECT_EQ(send("POST", "/detect", "q=%D8%A2+%D8%B2+%D8%A7")[0]["language"], "ar");
  EXPECT_EQ(
      send("POST", "/translate", "q=%D8%A2+%D8%B2+%D8%A7&source=ar&target=en")["translatedText"],
      "a z z a");
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, BadStartIsOneErrorLine) {
  CliResult r = work.run_cli("serve --model " + work.path("no_such_model") + " --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  r = work.run_cli("serve --model " + model_dir() + " --beam 20");
  EXPECT_EQ(r.exit_code, 2);  // options that cannot go together: a usage error
  EXPECT_NE(r.err.find("--beam 20 exceeds --max-beam 16"), std::string::npos) << r.err;
  // A port that is taken.
  Server first("");
  ASSERT_GT(first.port(), 0);
  r = work.run_cli("serve --model " + model_dir() + " --port " + std::to_string(first.port()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: cannot listen on 127.0.0.1:" + std::to_string(first.port())),
            std::string::npos)
      << r.err;
  // A host that is no address: the resolver's reason (it was an unrelated errno's text).
  r = work.run_cli("serve --model " + model_dir() + " --host 999.1.1.1 --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: cannot listen on 999.1.1.1: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find("No such file"), std::string::npos) << r.err;
}

TEST(ServeRequest, ParserDefaultsAndOverrides) {
  tfm::TranslationOptions defaults;
  defaults.beam_size = 5;
  tfm::ServeLimits limits;
  limits.decoder_layers = 6;
  tfm::TranslateRequest r = tfm::parse_translate_request(R"({"text": "hello"})", defaults, limits);
  EXPECT_EQ(r.texts, std::vector<std::string>{"hello"});
  EXPECT_FALSE(r.text_was_list);
  EXPECT_EQ(r.search.beam_size, 5);
  EXPECT_EQ(r.search.num_hypotheses, 1);
  EXPECT_FALSE(r.search.return_attention_heads);
  // nbest above the default beam raises the beam when the request left the beam alone.
  r = tfm::parse_translate_request(R"({"text": ["a"], "nbest": 8, "alpha": 0})", defaults, limits);
  EXPECT_TRUE(r.text_was_list);
  EXPECT_EQ(r.search.beam_size, 8);
  EXPECT_EQ(r.search.num_hypotheses, 8);
  EXPECT_EQ(r.search.length_penalty, 0);
  r = tfm::parse_translate_request(R"({"text": "a", "attention_layer": 2, "prefix": "p"})",
                                   defaults, limits);
  EXPECT_TRUE(r.attention && r.search.return_attention_heads);
  EXPECT_EQ(r.search.attention_layer, 2);
  EXPECT_EQ(r.prefixes, std::vector<std::string>{"p"});
  // A max_length below the server's --min-length cannot be met: 400, not the library's 500.
  defaults.min_decoding_length = 4;
  try {
    tfm::parse_translate_request(R"({"text": "a", "max_length": 3})", defaults, limits);
    FAIL();
  } catch (const tfm::RequestError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_STREQ(e.what(), "max_length 3 is less than this server's --min-length 4");
  }
  EXPECT_EQ(tfm::parse_translate_request(R"({"text": "a", "max_length": 4})", defaults, limits)
                .search.max_decoding_length,
            4);
  defaults.min_decoding_length = 0;
  // Integers beyond int64 are refused as out of range, not wrapped.
  try {
    tfm::parse_translate_request(R"({"text": "a", "beam": 18446744073709551615})", defaults,
                                 limits);
    FAIL();
  } catch (const tfm::RequestError& e) {
    EXPECT_EQ(e.status(), 400);
  }
}

// A server that samples (--sampling-topk): nbest and alternatives are draws with beam 1, and a
// wider beam is refused with 400.
TEST(ServeRequest, ASamplingServerDrawsNbestAndRefusesAWiderBeam) {
  tfm::TranslationOptions defaults;
  defaults.beam_size = 1;
  defaults.sampling_topk = 0;
  tfm::ServeLimits limits;
  limits.decoder_layers = 6;
  tfm::TranslateRequest r =
      tfm::parse_translate_request(R"({"text": "a", "nbest": 8})", defaults, limits);
  EXPECT_EQ(r.search.beam_size, 1);
  EXPECT_EQ(r.search.num_hypotheses, 8);
  EXPECT_EQ(tfm::hypotheses_per_source(r.search), 8);
  const tfm::LibreTranslateRequest l = tfm::parse_libretranslate_request(
      json{{"q", "a"}, {"source", "ar"}, {"target", "en"}, {"alternatives", 2}}, defaults, limits,
      "", "");
  EXPECT_EQ(l.translate.search.beam_size, 1);
  EXPECT_EQ(l.translate.search.num_hypotheses, 3);
  try {
    tfm::parse_translate_request(R"({"text": "a", "beam": 2})", defaults, limits);
    FAIL();
  } catch (const tfm::RequestError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("beam must be 1"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(ServeRequest, LanguageNamesComeFromIcu) {
  EXPECT_EQ(tfm::language_name("es"), "Spanish");
  EXPECT_EQ(tfm::language_name("de"), "German");
  EXPECT_EQ(tfm::language_name("zh"), "Chinese");
  EXPECT_EQ(tfm::language_name("xx"), "xx");  // no such language: the code itself
  EXPECT_EQ(tfm::language_name("not a code at all, far too long"),
            "not a code at all, far too long");
  EXPECT_EQ(tfm::libretranslate_languages("", "en"), json::array());
}

TEST(Serve, BodiesOverEightKilobytesAreReadWhateverTheirContentType) {
  // curl -d sends JSON as an urlencoded form, and LibreTranslate clients send forms: neither is
  // refused for being over the 8 KiB that Debian's httplib allows an urlencoded body.
  Server server("--source-language ar --target-language en");
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  auto c = server.client();
  json texts = json::array();
  std::string sentence;
  for (int i = 0; i < 8; ++i) sentence += "آ ت ز م و ن ";
  for (int i = 0; i < 64; ++i) texts.push_back(sentence);
  const std::string body = json({{"text", texts}}).dump();
  ASSERT_GT(body.size(), 8192u);
  auto r = c.Post("/v1/translate", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["translations"].size(), 64u);
  std::string q;
  for (int i = 0; i < 250; ++i) q += "%D8%A2+%D8%B2+";
  const std::string form =
      "q=" + q + "%D8%A7&source=ar&target=en&api_key=" + std::string(6000, 'k');
  ASSERT_GT(form.size(), 8192u);
  r = c.Post("/translate", form, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(json::parse(r->body)["translatedText"].is_string());
  // A repeated field counts once, the first; '+' and %XX are decoded, a stray '%' kept.
  r = c.Post("/translate", "q=%D8%A2+%D8%B2+%D8%A7&q=%D8%A8&source=ar&target=en&x=%zz%4",
             "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["translatedText"], "a z z a") << r->body;
  // A form's fields are bounded as a JSON body's values are, 2 × (2 × --max-sentences + 16):
  // 288 here. 600 KB of "a&" (300,000 fields, tens of MB once stored) is refused with 413
  // before any is stored.
  std::string many_fields;
  for (int i = 0; i < 300000; ++i) many_fields += "a&";
  r = c.Post("/translate", many_fields, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("--max-sentences"), std::string::npos) << r->body;
  // A body over --max-body-bytes is still refused, naming the option.
  r = c.Post("/v1/translate", std::string(2 << 20, 'x'), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("--max-body-bytes"), std::string::npos) << r->body;
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, RefusedLargeTextsLeaveNoMemoryBehind) {
  // A SentencePiece model (tokenizing a large text allocates tens of MB): a vocabulary trained
  // here and a tiny random model beside it.
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "the model translates sentence " + std::to_string(i) +
              " of the corpus into another language and back again\n";
  work.write_file("spm_corpus.txt", corpus);
  std::filesystem::create_directories(work.path("spm_model"));
  ASSERT_EQ(work.run_cli("vocab --input " + work.path("spm_corpus.txt") + " --size 300 -o " +
                         work.path("spm_model/vocab.spm"))
                .exit_code,
            0);
  ASSERT_EQ(
      work.run_cli("init --preset tiny --vocab 300 -o " + work.path("spm_model/model.safetensors"))
          .exit_code,
      0);
  Server server("", "large_texts", work.path("spm_model"));
  ASSERT_GT(server.port(), 0) << server.stderr_text();
  std::string text;
  while (text.size() < 900000) text += corpus;
  text.resize(900000);
  const std::string body = json({{"text", text}}).dump();
  const int64_t before = resident_mib(server.pid());
  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&] {
      auto c = server.client();
      for (int i = 0; i < 4; ++i) {
        auto r = c.Post("/v1/translate", body, "application/json");
        if (r && r->status == 400) ++refused;
      }
    });
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(refused.load(), 16);
  // Before: each request thread kept its tokenizing memory (~40 MB a thread, over 600 MB here).
  const int64_t after = resident_mib(server.pid());
  EXPECT_LT(after - before, 150) << before << " MiB before, " << after << " MiB after";
  EXPECT_EQ(server.stop(), 0);
}
