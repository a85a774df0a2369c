// Counters and histograms of `serve` (see metrics.h).
#include "serve/metrics.h"

#include <cstdio>
#include <set>

namespace tfm {

namespace {

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

ServeMetrics::ServeMetrics()
    : batch_sentences_({1, 2, 4, 8, 16, 32, 64, 128, 256}),
      latency_seconds_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}) {}

void ServeMetrics::count_request(const std::string& path, int status, double seconds) {
  static const std::set<std::string> routes = {"/",          "/health",           "/metrics",
                                               "/v1/model",  "/v1/translate",     "/translate",
                                               "/languages", "/frontend/settings"};
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{routes.count(path) ? path : "other", status}];
  latency_seconds_.observe(seconds);
}

void ServeMetrics::count_sentences(int64_t sentences, int64_t source_tokens,
                                   int64_t target_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  sentences_ += uint64_t(sentences);
  source_tokens_ += uint64_t(source_tokens);
  target_tokens_ += uint64_t(target_tokens);
}

void ServeMetrics::count_batch(int64_t sentences) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++batches_;
  batch_sentences_.observe(double(sentences));
}

void ServeMetrics::count_dropped(int64_t sentences) {
  std::lock_guard<std::mutex> lock(mutex_);
  dropped_ += uint64_t(sentences);
}

std::string ServeMetrics::render(int64_t queued_sentences, int64_t requests_in_flight) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  header(out, "transformer_requests_total", "counter",
         "HTTP requests answered, by path and status code.");
  for (const auto& [key, count] : requests_)
    out += "transformer_requests_total{path=\"" + key.first + "\",code=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
  header(out, "transformer_request_errors_total", "counter",
         "HTTP requests answered with a status of 400 or more, by status code.");
  std::map<int, uint64_t> errors;
  for (const auto& [key, count] : requests_)
    if (key.second >= 400) errors[key.second] += count;
  for (const auto& [code, count] : errors)
    out += "transformer_request_errors_total{code=\"" + std::to_string(code) + "\"} " +
           std::to_string(count) + "\n";
  header(out, "transformer_sentences_total", "counter", "Sentences translated.");
  out += "transformer_sentences_total " + std::to_string(sentences_) + "\n";
  header(out, "transformer_source_tokens_total", "counter",
         "Source tokens (subword pieces) of the sentences translated.");
  out += "transformer_source_tokens_total " + std::to_string(source_tokens_) + "\n";
  header(out, "transformer_target_tokens_total", "counter",
         "Target tokens (subword pieces) of the best translations.");
  out += "transformer_target_tokens_total " + std::to_string(target_tokens_) + "\n";
  header(
      out, "transformer_dropped_sentences_total", "counter",
      "Sentences dropped, queued or being decoded, because their client went away or timed out.");
  out += "transformer_dropped_sentences_total " + std::to_string(dropped_) + "\n";
  header(out, "transformer_queue_sentences", "gauge", "Sentences waiting to be decoded.");
  out += "transformer_queue_sentences " + std::to_string(queued_sentences) + "\n";
  header(out, "transformer_requests_in_flight", "gauge", "Requests being answered now.");
  out += "transformer_requests_in_flight " + std::to_string(requests_in_flight) + "\n";
  header(out, "transformer_batch_sentences", "histogram", "Sentences per decoded batch.");
  out += batch_sentences_.render("transformer_batch_sentences");
  header(out, "transformer_request_duration_seconds", "histogram",
         "Time from a request's arrival to its answer.");
  out += latency_seconds_.render("transformer_request_duration_seconds");
  return out;
}

}  // namespace tfm
