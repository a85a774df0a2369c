// The queue and decoding thread of `serve` (see dynamic_batcher.h).
#include "serve/dynamic_batcher.h"

#include <algorithm>

namespace tfm {

DynamicBatcher::DynamicBatcher(const Translator& translator, BatcherSettings settings,
                               ServeMetrics& metrics)
    : translator_(translator), settings_(settings), metrics_(metrics), thread_([this] { run(); }) {}

DynamicBatcher::~DynamicBatcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

bool DynamicBatcher::submit(const std::shared_ptr<BatchTicket>& ticket) {
  const size_t n = ticket->sources.size();
  ticket->results.assign(n, {});
  ticket->errors.assign(n, "");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (int64_t(queue_.size() + n) > settings_.max_queued_sentences) return false;
    ticket->pending = int64_t(n);
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) queue_.push_back({ticket, i, now});
  }
  work_.notify_one();
  return true;
}

bool DynamicBatcher::wait(const std::shared_ptr<BatchTicket>& ticket,
                          std::chrono::steady_clock::time_point deadline,
                          const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (ticket->pending > 0) {
    if (std::chrono::steady_clock::now() >= deadline || give_up()) {
      ticket->cancelled = true;
      drop_cancelled(ticket.get());
      return false;
    }
    done_.wait_for(lock, std::chrono::milliseconds(20));
  }
  return true;
}

int64_t DynamicBatcher::queued_sentences() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(queue_.size());
}

bool DynamicBatcher::all_cancelled(const std::vector<Entry>& batch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& e : batch)
    if (!e.ticket->cancelled) return false;
  return true;
}

void DynamicBatcher::drop_cancelled(const BatchTicket* ticket) {
  const size_t before = queue_.size();
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Entry& e) { return e.ticket.get() == ticket; }),
               queue_.end());
  metrics_.count_dropped(int64_t(before - queue_.size()));
}

bool DynamicBatcher::budget_filled() const {
  if (queue_.empty()) return false;
  const TranslationOptions& key = queue_.front().ticket->search;
  int64_t count = 0, longest = 0;
  for (const Entry& e : queue_) {
    if (!(e.ticket->search == key)) continue;
    ++count;
    longest = std::max<int64_t>(longest, int64_t(e.ticket->sources[e.sentence].size()));
    if (count >=
        sentences_within_budget(settings_.batch_tokens, longest, hypotheses_per_source(key)))
      return true;
  }
  return false;
}

std::vector<DynamicBatcher::Entry> DynamicBatcher::take_batch() {
  std::vector<Entry> batch;
  const TranslationOptions key = queue_.front().ticket->search;
  int64_t longest = 0;
  std::deque<Entry> rest;
  for (Entry& e : queue_) {
    // The oldest sentence always goes; others join while the batch stays within budget.
    const int64_t length = int64_t(e.ticket->sources[e.sentence].size());
    const bool joins = batch.empty() || (settings_.batching && e.ticket->search == key &&
                                         int64_t(batch.size()) + 1 <=
                                             sentences_within_budget(settings_.batch_tokens,
                                                                     std::max(longest, length),
                                                                     hypotheses_per_source(key)));
    if (joins) {
      longest = std::max(longest, length);
      batch.push_back(std::move(e));
    } else {
      rest.push_back(std::move(e));
    }
  }
  queue_ = std::move(rest);
  return batch;
}

void DynamicBatcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and nothing left to decode
    if (settings_.batching && settings_.max_wait_ms > 0) {
      // Wait for company while sentences keep arriving: until the batch is full, the oldest
      // sentence has waited max_wait_ms, or none arrived for a quiet gap (so a lone request
      // waits only the gap).
      const auto until =
          queue_.front().queued_at + std::chrono::milliseconds(settings_.max_wait_ms);
      const auto gap = std::chrono::microseconds(
          int64_t(1000 * std::min<double>(settings_.quiet_gap_ms, double(settings_.max_wait_ms))));
      while (!stopping_ && !queue_.empty() && !budget_filled()) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until || now - queue_.back().queued_at >= gap) break;
        work_.wait_until(lock, std::min(until, queue_.back().queued_at + gap));
      }
      if (queue_.empty()) continue;  // every waiting request gave up meanwhile
    }
    std::vector<Entry> batch = take_batch();
    lock.unlock();
    if (decode(batch)) metrics_.count_batch(int64_t(batch.size()));
    lock.lock();
    for (const Entry& e : batch) --e.ticket->pending;
    done_.notify_all();
  }
}

bool DynamicBatcher::decode(const std::vector<Entry>& batch) {
  // One translate_ids call: it orders the batch longest first, and under the batcher's budget
  // (the rule take_batch applied) decodes it in one search.
  TranslationOptions options = batch.front().ticket->search;
  options.max_batch_tokens = settings_.batch_tokens;
  auto translate = [&](const std::vector<size_t>& members) {
    std::vector<std::vector<int32_t>> sources, prefixes;
    bool any_prefix = false;
    for (size_t m : members) {
      const Entry& e = batch[m];
      sources.push_back(e.ticket->sources[e.sentence]);
      prefixes.push_back(e.ticket->prefixes.empty() ? std::vector<int32_t>{}
                                                    : e.ticket->prefixes[e.sentence]);
      any_prefix = any_prefix || !prefixes.back().empty();
    }
    if (!any_prefix) prefixes.clear();
    auto results = translator_.translate_ids(sources, options, prefixes, {}, nullptr,
                                             [&] { return all_cancelled(batch); });
    // Results are written without the mutex: each (ticket, sentence) slot belongs to this
    // batch alone, and its waiter reads it only after `pending` drops under the mutex.
    for (size_t i = 0; i < members.size(); ++i) {
      const Entry& e = batch[members[i]];
      e.ticket->results[e.sentence] = std::move(results[i].hypotheses);
    }
  };
  std::vector<size_t> all(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) all[i] = i;
  try {
    translate(all);
  } catch (const SearchCancelled&) {
    // Every request of the batch timed out or went away: nobody reads its results.
    metrics_.count_dropped(int64_t(batch.size()));
    return false;
  } catch (const std::exception& whole) {
    if (all.size() == 1) {
      batch.front().ticket->errors[batch.front().sentence] = whole.what();
      return true;
    }
    for (size_t m : all) {  // find the sentence that fails; the others still get answers
      try {
        translate({m});
      } catch (const SearchCancelled&) {
        metrics_.count_dropped(int64_t(batch.size() - m));
        return false;
      } catch (const std::exception& alone) {
        batch[m].ticket->errors[batch[m].sentence] = alone.what();
      }
    }
  }
  return true;
}

}  // namespace tfm
