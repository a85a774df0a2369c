// Requests → batcher tickets → results (see translation_service.h).
#include "serve/translation_service.h"

#include "decode/hypothesis_text.h"

namespace tfm {

TranslationService::TranslationService(const ModelBundle& bundle, const BatcherSettings& batcher,
                                       const ServeLimits& limits, ServeMetrics& metrics)
    : bundle_(bundle),
      limits_(limits),
      metrics_(metrics),
      batcher_(bundle.model, batcher, metrics) {}

std::vector<SentenceResult> TranslationService::translate(
    const TranslateRequest& request, std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& give_up) {
  const Vocabulary& source_vocabulary = *bundle_.source_vocabulary;
  const Vocabulary& target_vocabulary = *bundle_.target_vocabulary;
  const ModelConfig& config = bundle_.model.config();
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
    for (const Hypothesis& h : r.hypotheses)
      r.texts.push_back(hypothesis_text(h, target_vocabulary, 1));
    if (!r.hypotheses.empty()) target_tokens += int64_t(r.hypotheses.front().tokens.size());
  }
  int64_t source_tokens = 0;
  for (const SentenceResult& r : results) source_tokens += r.translated ? r.source_tokens : 0;
  metrics_.count_sentences(int64_t(members.size()), source_tokens, target_tokens);
  return results;
}

nlohmann::json TranslationService::attention_json(const SentenceResult& result,
                                                  int64_t layer) const {
  const Hypothesis& h = result.hypotheses.front();
  const int64_t heads = bundle_.model.config().heads;
  nlohmann::json source = result.source_pieces;
  const size_t width = h.attention.empty() ? 0 : h.attention.front().size() / size_t(heads);
  if (width == result.source_pieces.size() + 1) source.push_back("</s>");  // the appended eos
  nlohmann::json target = nlohmann::json::array();
  for (int32_t id : h.tokens) target.push_back(bundle_.target_vocabulary->piece(id));
  if (h.finished_with_eos) target.push_back("</s>");
  nlohmann::json all_heads = nlohmann::json::array();
  for (int64_t head = 0; head < heads; ++head) {
    nlohmann::json rows = nlohmann::json::array();  // [target steps][source positions]
    for (const std::vector<float>& step : h.attention)
      rows.push_back(std::vector<float>(step.begin() + long(size_t(head) * width),
                                        step.begin() + long(size_t(head + 1) * width)));
    all_heads.push_back(std::move(rows));
  }
  return {{"layer", layer < 0 ? bundle_.model.config().decoder_layers - 1 : layer},
          {"source", source},
          {"target", target},
          {"heads", all_heads}};
}

}  // namespace tfm
