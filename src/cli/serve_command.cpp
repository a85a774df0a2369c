// `transformer serve`: a translation server over HTTP with dynamic batching and a web page.
// The options here set the server's defaults and limits; the server lives in src/serve/.
#include <memory>

#include "cli/commands.h"
#include "cli/option_ranges.h"
#include "cli/search_options.h"
#include "serve/http_server.h"
#include "tensor/error.h"

namespace tfm {

CommandRunner add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeSettings>();
  auto decoding = std::make_shared<SearchFlags>();  // the defaults of every request
  auto no_batching = std::make_shared<bool>(false);
  o->batcher.max_wait_ms = 5;
  app.add_option("--model", o->model, "Model directory (model.safetensors + vocabulary)")
      ->required();
  app.add_option("--host", o->host,
                 "Address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for all)");
  app.add_option("--port", o->port, with_default("TCP port", o->port, "0: any free port, printed"))
      ->check(in_range(0, 65535));
  decoding->add_to(app);
  app.add_option("--batch-tokens", o->batcher.batch_tokens,
                 with_default("Budget per decoded batch: sentences × longest source × beam",
                              o->batcher.batch_tokens))
      ->check(at_least(1));
  app.add_option(
         "--batch-wait-ms", o->batcher.max_wait_ms,
         with_default("Longest wait of the oldest queued sentence for others to fill its batch; "
                      "the wait ends early when no sentence arrived for --batch-quiet-ms",
                      o->batcher.max_wait_ms, "0: decode at once"))
      ->check(in_range(0, 10000));
  app.add_option("--batch-quiet-ms", o->batcher.quiet_gap_ms,
                 with_default("End the wait for company when no sentence arrived for this long",
                              o->batcher.quiet_gap_ms))
      ->check(in_range(0.001, 10000));
  app.add_flag("--no-batching", *no_batching,
               "Decode every sentence alone (for comparison; much slower under load)");
  app.add_option("--max-queued-sentences", o->batcher.max_queued_sentences,
                 with_default("Sentences that may wait to be decoded: a request that finds "
                              "them taken gets 503, one with more sentences 413",
                              o->batcher.max_queued_sentences))
      ->check(at_least(1));
  app.add_option(
         "--max-connections", o->max_connections,
         with_default("Connections answered at once; as many more may wait, the rest get 503",
                      o->max_connections))
      ->check(in_range(1, 4096));
  app.add_option("--max-body-bytes", o->limits.max_body_bytes,
                 with_default("Largest request body; larger gets 413", o->limits.max_body_bytes))
      ->check(at_least(1));
  app.add_option("--max-sentences", o->limits.max_sentences,
                 with_default("Sentences per request; more get 413", o->limits.max_sentences))
      ->check(at_least(1));
  app.add_option("--max-sentence-tokens", o->limits.max_sentence_tokens,
                 "Source tokens per sentence; more get 400 (default: the model's limit)")
      ->check(at_least(1));
  o->limits.max_sentence_tokens = 0;
  app.add_option(
         "--max-beam", o->limits.max_beam,
         with_default("Largest beam (and n-best) a request may ask for", o->limits.max_beam))
      ->check(in_range(1, 1024));
  app.add_option("--max-attention-cells", o->limits.max_attention_cells,
                 with_default("Attention weights one answer may hold (heads × target × source "
                              "tokens over its sentences, at their length limits); a request "
                              "with \"attention\": true that could exceed it gets 413",
                              o->limits.max_attention_cells))
      ->check(at_least(1));
  app.add_option("--request-timeout", o->request_timeout_seconds,
                 with_default("Seconds a request may take; then 504 and its work is dropped "
                              "(a batch being decoded stops when none of its requests waits)",
                              o->request_timeout_seconds))
      ->check(in_range(0.001, 86400));
  app.add_option("--io-timeout", o->io_timeout_seconds,
                 with_default("Seconds a request's line and headers may take to arrive (then 408), "
                              "and each read of its body or write of its answer may wait",
                              o->io_timeout_seconds))
      ->check(in_range(0.01, 3600));
  app.add_option("--source-language", o->source_language,
                 "Language code of the model's source, for LibreTranslate clients "
                 "(/languages; /translate then refuses other codes)");
  app.add_option("--target-language", o->target_language,
                 "Language code of the model's target, for LibreTranslate clients");
  app.add_option("--allow-origin", o->allow_origin,
                 "Send Access-Control-Allow-Origin with this value (e.g. '*'), for browser "
                 "clients on other origins (default: none)");
  app.footer(
      "Endpoints: GET / (web page), POST /v1/translate, GET /v1/model, GET /health,\n"
      "GET /metrics (Prometheus), POST /translate and GET /languages (LibreTranslate's API).\n"
      "Example:\n  transformer serve --model run --port 8080 &\n"
      "  curl -s localhost:8080/v1/translate -d '{\"text\": \"the house is small\"}'");
  return [o, decoding, no_batching] {
    o->device = decoding->device.name;
    o->compute_type = decoding->compute_type.name;
    o->search = decoding->search;
    decoding->check();
    if (o->search.beam_size > o->limits.max_beam)
      throw UsageError("--beam " + std::to_string(o->search.beam_size) + " exceeds --max-beam " +
                       std::to_string(o->limits.max_beam));
    o->batcher.batching = !*no_batching;
    run_server(*o);
  };
}

}  // namespace tfm
