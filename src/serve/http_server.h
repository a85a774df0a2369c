// `transformer serve`'s HTTP side (cpp-httplib): the routes, their JSON, the connection pool
// with its bounds, disconnect detection, and the graceful stop on SIGINT/SIGTERM. The API is
// described in README's "serve" section.
#pragma once

#include <cstdint>
#include <string>

#include "serve/dynamic_batcher.h"
#include "serve/translate_request.h"

namespace tfm {

struct ServeSettings {
  std::string model;                     // model directory with its vocabulary
  std::string device = "cpu";            // the backend that runs it (find_backend)
  std::string compute_type = "default";  // its products' number format (resolve_compute_type)
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (printed)
  TranslationOptions search;  // the defaults of every request
  ServeLimits limits;
  BatcherSettings batcher;
  int64_t max_connections = 256;  // connections answered at once; as many more may wait
  double request_timeout_seconds = 60;
  double io_timeout_seconds = 10;                // reading a request, writing an answer
  std::string source_language, target_language;  // for LibreTranslate clients; "" any
  std::string allow_origin;                      // Access-Control-Allow-Origin; "" sends none
};

// Loads the model, listens, and answers until SIGINT or SIGTERM; then stops accepting,
// finishes the requests in flight and returns. Throws Error when the model or the address
// cannot be had.
void run_server(const ServeSettings& settings);

}  // namespace tfm
