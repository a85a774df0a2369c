// What `serve` counts and how `GET /metrics` shows it, in Prometheus' text format (version
// 0.0.4): requests by path and status, sentences and tokens in and out, queue depth, batch
// sizes and request latency as histograms. Thread-safe; every update takes one short lock.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tfm {

// A Prometheus histogram: cumulative counts per upper bound, plus sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // `name`_bucket{le=...}, `name`_sum and `name`_count lines.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();
  // One answered request; paths outside the server's routes count as "other".
  void count_request(const std::string& path, int status, double seconds);
  void count_sentences(int64_t sentences, int64_t source_tokens, int64_t target_tokens);
  void count_batch(int64_t sentences);
  void count_dropped(int64_t sentences);  // queued or in-flight work of requests that went away
  // The whole exposition; the gauges are read by the caller at scrape time.
  std::string render(int64_t queued_sentences, int64_t requests_in_flight) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (path, status) → count
  uint64_t sentences_ = 0, source_tokens_ = 0, target_tokens_ = 0, batches_ = 0, dropped_ = 0;
  Histogram batch_sentences_, latency_seconds_;
};

}  // namespace tfm
