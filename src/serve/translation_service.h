// The model side of `serve`: turns a parsed request into tickets for the dynamic batcher —
// encoding each sentence with the Translator's vocabulary and checking it against the server's
// limits — and gathers the Translator's hypotheses (text, scores, attention) per sentence. No
// HTTP here; the server maps these results and RequestErrors onto responses.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/dynamic_batcher.h"
#include "serve/translate_request.h"

namespace tfm {

// One sentence of a request, answered.
struct SentenceResult {
  bool translated = false;                        // false for an empty sentence
  std::vector<TranslationHypothesis> hypotheses;  // best first
  std::vector<std::string> source_pieces;         // with attention
  int64_t source_tokens = 0;
};

class TranslationService {
 public:
  // The translator must outlive the service and have both vocabularies.
  TranslationService(const Translator& translator, const BatcherSettings& batcher,
                     const ServeLimits& limits, ServeMetrics& metrics);

  // Encodes, queues and waits for every sentence of the request. Throws RequestError:
  // 400 for a sentence or prefix over the limits, 413 for more sentences than the queue ever
  // holds, 503 when the queue is full, 504 past the
  // deadline, 499 when give_up() says the client went away, 500 when decoding failed.
  std::vector<SentenceResult> translate(const TranslateRequest& request,
                                        std::chrono::steady_clock::time_point deadline,
                                        const std::function<bool()>& give_up);

  // attention of the best hypothesis: {layer, source: pieces, target: pieces,
  // heads: [head][target step][source position]}.
  nlohmann::json attention_json(const SentenceResult& result, int64_t layer) const;

  const ServeLimits& limits() const { return limits_; }
  int64_t queued_sentences() const { return batcher_.queued_sentences(); }

 private:
  const Translator& translator_;
  const ServeLimits limits_;
  ServeMetrics& metrics_;
  DynamicBatcher batcher_;
};

}  // namespace tfm
