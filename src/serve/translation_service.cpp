// Requests → batcher tickets → results (see translation_service.h).
#include "serve/translation_service.h"

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
    if (request.attention) results[i].source_pieces = source_vocabulary.to_pieces(request.texts[i]);
    ticket->sources.push_back(std::move(ids));
    members.push_back(i);
    results[i].translated = true;
  }
  if (!ticket->sources.empty()) {
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
  const int64_t layers = translator_.config().decoder_layers;
  return {{"layer", layer < 0 ? layers - 1 : layer},
          {"source", source},
          {"target", target},
          {"heads", heads}};
}

}  // namespace tfm
