// Requests → batcher tickets → results (see translation_service.h).
#include "serve/translation_service.h"

#include <cmath>

#include "text/vocabulary.h"

namespace tfm {

TranslationService::TranslationService(const Translator& translator, const BatcherSettings& batcher,
                                       const ServeLimits& limits, ServeMetrics& metrics)
    : translator_(translator),
      limits_(limits),
      metrics_(metrics),
      batcher_(translator, batcher, metrics) {}

std::vector<SentenceResult> TranslationService::translate(
    const TranslateRequest& request, std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& give_up) {
  const Vocabulary& source_vocabulary = *translator_.source_vocabulary();
  const Vocabulary& target_vocabulary = *translator_.target_vocabulary();
  const ModelConfig& config = translator_.config();
  std::vector<SentenceResult> results(request.texts.size());
  auto ticket = std::make_shared<BatchTicket>();
  ticket->search = request.search;
  std::vector<size_t> members;  // [ticket sentences] → index in the request
  int64_t attention_cells = 0;  // the most attention weights the answer can hold
  for (size_t i = 0; i < request.texts.size(); ++i) {
    std::vector<int32_t> ids = source_vocabulary.encode(request.texts[i]);
    results[i].source_tokens = int64_t(ids.size());
    if (ids.empty()) continue;  // an empty sentence has an empty translation, as in `translate`
    const std::string name = "text[" + std::to_string(i) + "]";
    if (int64_t(ids.size()) > limits_.max_sentence_tokens)
      throw RequestError(400, name + " has " + std::to_string(ids.size()) +
                                  " tokens; this server takes at most " +
                                  std::to_string(limits_.max_sentence_tokens) +
                                  " per sentence (--max-sentence-tokens)");
    if (!request.prefixes.empty()) {
      std::vector<int32_t> prefix = target_vocabulary.encode(request.prefixes[i]);
      if (int64_t(prefix.size()) > max_target_tokens(config))
        throw RequestError(400, "prefix[" + std::to_string(i) + "] has " +
                                    std::to_string(prefix.size()) +
                                    " tokens; the model generates at most " +
                                    std::to_string(max_target_tokens(config)));
      ticket->prefixes.push_back(std::move(prefix));
    }
    if (request.attention) {
      const int64_t prefix_tokens =
          ticket->prefixes.empty() ? 0 : int64_t(ticket->prefixes.back().size());
      const int64_t positions = int64_t(ids.size()) + (config.src_append_eos ? 1 : 0);
      const int64_t steps =
          translator_.max_output_tokens(request.search, int64_t(ids.size()), prefix_tokens) + 1;
      attention_cells += config.heads * steps * positions;  // every head, eos step included
      if (attention_cells > limits_.max_attention_cells)
        throw RequestError(413, "the attention asked for could hold " +
                                    std::to_string(attention_cells) + " weights by " + name +
                                    "; this server answers at most " +
                                    std::to_string(limits_.max_attention_cells) +
                                    " (--max-attention-cells): ask for the attention of fewer "
                                    "or shorter sentences, or a smaller max_length");
      results[i].source_pieces = source_vocabulary.to_pieces(request.texts[i]);
    }
    ticket->sources.push_back(std::move(ids));
    members.push_back(i);
    results[i].translated = true;
  }
  if (!ticket->sources.empty()) {
    if (int64_t(ticket->sources.size()) > batcher_.queue_capacity())
      throw RequestError(413, "the request has " + std::to_string(ticket->sources.size()) +
                                  " sentences to translate; this server's queue holds at most " +
                                  std::to_string(batcher_.queue_capacity()) +
                                  " (--max-queued-sentences)");
    if (!batcher_.submit(ticket))
      throw RequestError(503,
                         "the translation queue is full (--max-queued-sentences); retry later");
    if (!batcher_.wait(ticket, deadline, give_up)) {
      if (give_up()) throw RequestError(499, "the client closed the connection");
      throw RequestError(504, "the translation took longer than --request-timeout");
    }
  }
  int64_t target_tokens = 0;
  for (size_t k = 0; k < members.size(); ++k) {
    if (!ticket->errors[k].empty())
      throw RequestError(500, "text[" + std::to_string(members[k]) +
                                  "] could not be translated: " + ticket->errors[k]);
    SentenceResult& r = results[members[k]];
    r.hypotheses = std::move(ticket->results[k]);
    if (!r.hypotheses.empty()) target_tokens += int64_t(r.hypotheses.front().ids.size());
  }
  int64_t source_tokens = 0;
  for (const SentenceResult& r : results) source_tokens += r.translated ? r.source_tokens : 0;
  metrics_.count_sentences(int64_t(members.size()), source_tokens, target_tokens);
  return results;
}

nlohmann::json TranslationService::attention_json(const SentenceResult& result,
                                                  int64_t layer) const {
  const TranslationHypothesis& h = result.hypotheses.front();
  nlohmann::json source = result.source_pieces;
  const auto& heads = h.attention_heads;  // [heads][target steps][source positions]
  const size_t width = heads.empty() || heads.front().empty() ? 0 : heads.front().front().size();
  if (width == result.source_pieces.size() + 1) source.push_back("</s>");  // the appended eos
  nlohmann::json target = h.tokens;
  if (h.finished_with_eos) target.push_back("</s>");
  // Weights to 4 decimals (as `translate --attention` writes them): a third of the bytes of
  // float32's shortest round trip, and finer than a heat map shows.
  nlohmann::json rounded = nlohmann::json::array();
  for (const auto& head : heads) {
    nlohmann::json rows = nlohmann::json::array();
    for (const std::vector<float>& step : head) {
      nlohmann::json row = nlohmann::json::array();
      for (float w : step) row.push_back(std::round(double(w) * 1e4) / 1e4);
      rows.push_back(std::move(row));
    }
    rounded.push_back(std::move(rows));
  }
  const int64_t layers = translator_.config().decoder_layers;
  return {{"layer", layer < 0 ? layers - 1 : layer},
          {"source", source},
          {"target", target},
          {"heads", std::move(rounded)}};
}

}  // namespace tfm
