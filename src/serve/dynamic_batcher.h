// Dynamic batching for `serve`: sentences of concurrent requests wait in one bounded queue, and
// a single decoding thread takes them in arrival order into one Translator::translate_ids call
// per batch under a token budget (the rule of `translate --batch-tokens`). Sentences join a
// batch only with sentences that asked for the same translation options. Results go
// back to each request's ticket in its own order; a failing batch is retried one sentence at a
// time, so one bad sentence fails only its own request. A batch whose every request timed out
// or went away stops decoding at its next step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/translator.h"
#include "serve/metrics.h"

namespace tfm {

struct BatcherSettings {
  int64_t batch_tokens =
      kDefaultMaxBatchTokens;           // sentences × (longest source + 1) × beam per batch
  int64_t max_wait_ms = 0;              // how long the oldest queued sentence waits for company,
  double quiet_gap_ms = 1;              // unless no sentence arrived for this long
  int64_t max_queued_sentences = 1024;  // submit() refuses what would not fit
  bool batching = true;                 // false: every batch is one sentence
};

// One request's sentences on their way through the queue. The batcher's mutex guards
// results, errors, pending and cancelled once the ticket is submitted.
struct BatchTicket {
  TranslationOptions search;                   // max_batch_tokens is the batcher's own
  std::vector<std::vector<int32_t>> sources;   // [sentences][source tokens], none empty
  std::vector<std::vector<int32_t>> prefixes;  // [sentences][prefix tokens], or empty
  std::vector<std::vector<TranslationHypothesis>> results;  // [sentences][up to n], best first
  std::vector<std::string> errors;  // [sentences]: "" or why decoding failed
  int64_t pending = 0;              // sentences not decoded yet
  bool cancelled = false;           // its queued sentences are dropped
};

class DynamicBatcher {
 public:
  // The translator must outlive the batcher; only the batcher's thread calls it.
  DynamicBatcher(const Translator& translator, BatcherSettings settings, ServeMetrics& metrics);
  ~DynamicBatcher();  // decodes everything still queued, then stops the thread
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues every sentence of the ticket; false (nothing queued) when they do not fit.
  bool submit(const std::shared_ptr<BatchTicket>& ticket);
  // Blocks until the ticket is decoded (true), or until the deadline passes or give_up()
  // says so (false; its sentences still queued are dropped). give_up is polled every 20 ms.
  bool wait(const std::shared_ptr<BatchTicket>& ticket,
            std::chrono::steady_clock::time_point deadline, const std::function<bool()>& give_up);
  int64_t queued_sentences() const;
  // The most sentences the queue holds (--max-queued-sentences): a ticket with more never fits.
  int64_t queue_capacity() const { return settings_.max_queued_sentences; }

 private:
  struct Entry {
    std::shared_ptr<BatchTicket> ticket;
    size_t sentence;  // index into the ticket's sources
    std::chrono::steady_clock::time_point queued_at;
  };
  void run();
  bool budget_filled() const;       // the queue already holds a full batch (mutex held)
  std::vector<Entry> take_batch();  // the next batch, removed from the queue (mutex held)
  // Without the mutex; fills results/errors. False when the batch stopped because no request
  // waits for it any more (its sentences are counted as dropped, not as a decoded batch).
  bool decode(const std::vector<Entry>& batch);
  void drop_cancelled(const BatchTicket* ticket);  // (mutex held)
  // Whether every ticket of the batch gave up (its decoding then stops at the next step).
  bool all_cancelled(const std::vector<Entry>& batch) const;  // (mutex not held)

  const Translator& translator_;
  const BatcherSettings settings_;
  ServeMetrics& metrics_;
  mutable std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<Entry> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tfm
