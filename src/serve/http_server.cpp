// The HTTP server of `transformer serve` (see http_server.h).
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <string_view>
#include <thread>

#include "model/config.h"
#include "serve/metrics.h"
#include "serve/translation_service.h"
#include "serve/web_page.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"
#include "tensor/strict_json.h"
#include "text/vocabulary.h"

namespace tfm {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Set on the accepting thread while it answers a connection that found the pool full.
thread_local bool g_overflow_connection = false;
// The socket of the connection this thread answers (for a handler that must notice a client
// that went away), and whether the response being written ends that connection.
thread_local int g_client_socket = -1;
thread_local bool g_close_after_response = false;
// Set by a handler whose client went away (499): the response is not sent (the status is only
// counted, as nginx logs its 499), and the connection is closed.
thread_local bool g_discard_response = false;
// When the request on this thread arrived (set by the pre-routing handler).
thread_local Clock::time_point g_request_start;

// httplib's pool of connection threads, bounded: `threads` answer, as many more connections
// wait; a connection beyond that is answered at once with 503 on the accepting thread.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t threads, size_t max_waiting) : max_waiting_(max_waiting) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (jobs_.size() < max_waiting_) {
        jobs_.push_back(std::move(fn));
        ready_.notify_one();
        return;
      }
    }
    g_overflow_connection = true;
    fn();
    g_overflow_connection = false;
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every waiting connection answered
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  const size_t max_waiting_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// "ip" and port of a socket's peer (remote) or own (local) address, as text.
void socket_address(int fd, bool remote, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  if ((remote ? getpeername(fd, raw, &length) : getsockname(fd, raw, &length)) != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    port = ntohs(in6->sin6_port);
  }
  ip = text;
}

// True when `fd` has something to read (or was closed) within `timeout`.
bool wait_readable(int fd, std::chrono::microseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  const int ms = int(std::max<int64_t>(1, timeout.count() / 1000));
  int ready;
  while ((ready = poll(&p, 1, ms)) < 0 && errno == EINTR) {
  }
  return ready > 0;
}

// The Content-Type a form body is handed to httplib under. Debian's compiled httplib refuses an
// urlencoded body over 8 KiB with 413 (its CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH),
// which also turned away JSON that curl -d sends as a form; bodies are bounded by
// --max-body-bytes instead, and LibreTranslate's form fields are parsed here
// (libretranslate_fields).
// A request body above this size has its transient memory returned to the system afterwards.
constexpr size_t kLargeBodyBytes = 64 << 10;

constexpr const char* kFormContentType = "application/x-www-form-urlencoded";
constexpr const char* kRenamedFormContentType = "application/x-transformer-form-urlencoded";

// A header value of decimal digits only (Content-Length).
bool is_decimal(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

// Whether decimal digits name a number past any body size (more than 18 digits without the
// leading zeros; httplib would read it past 2^64 as 2^64 - 1).
bool exceeds_any_body(std::string_view digits) {
  const size_t first = digits.find_first_not_of('0');
  return first != std::string_view::npos && digits.size() - first > 18;
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() &&
         strncasecmp(text.data(), prefix.data(), prefix.size()) == 0;
}

// One connection's socket as httplib's Stream: reads buffered (httplib reads a request's head
// a byte at a time), each read and write bounded by --io-timeout as httplib's own stream does.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, std::chrono::microseconds read_timeout,
                   std::chrono::microseconds write_timeout)
      : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  bool has_buffered() const { return begin_ < buffer_.size(); }
  bool is_readable() const override { return has_buffered() || wait_readable(fd_, read_timeout_); }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return poll(&p, 1, int(std::max<int64_t>(1, write_timeout_.count() / 1000))) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      buffer_.clear();
      begin_ = 0;
      const ssize_t n = receive();
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, buffer_.size() - begin_);
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (g_discard_response) return ssize_t(size);
    if (!is_writable()) return -1;
    return send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    socket_address(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    socket_address(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

  // What read_head found.
  enum class Head { kComplete, kTooLarge, kTimedOut, kEnded };
  // The bytes a request's head (request line and headers) may take.
  static constexpr size_t kMaxHeadBytes = 64 << 10;

  // Reads the next request's head into the buffer and hands a form body to httplib under
  // kRenamedFormContentType. kTooLarge: no end of head within kMaxHeadBytes (httplib itself
  // would read a request line until its newline, however long: a client sending 1 GB without
  // one made the server hold 1 GB); kTimedOut: the head began but did not end within the read
  // timeout (a client sending a byte now and then held a connection for as long as it liked);
  // kEnded: the client closed first, or sent nothing (httplib then finds that itself).
  Head read_head() {
    const auto deadline = Clock::now() + read_timeout_;
    size_t scanned = begin_, head_end;
    while ((head_end = find_head_end(scanned)) == std::string::npos) {
      if (buffer_.size() - begin_ >= kMaxHeadBytes) return Head::kTooLarge;
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
      if (left.count() <= 0 || !wait_readable(fd_, left))
        return has_buffered() ? Head::kTimedOut : Head::kEnded;
      if (receive() <= 0) return Head::kEnded;
    }
    rename_form_content_type(head_end);
    return Head::kComplete;
  }

 private:
  // Where the head's closing CRLF CRLF begins, or npos while it has not arrived; `scanned`: how
  // far the buffer has been looked at. A bare LF on the way becomes CRLF: RFC 9112 (2.2) lets a
  // server take a lone LF for a line's end, as nginx does, and httplib reads CRLF only (it
  // answered such a request line 400 and skipped such headers, waiting for a CRLF CRLF that
  // never came).
  size_t find_head_end(size_t& scanned) {
    for (; scanned < buffer_.size(); ++scanned) {
      if (buffer_[scanned] != '\n') continue;
      if (scanned == begin_ || buffer_[scanned - 1] != '\r') buffer_.insert(scanned++, 1, '\r');
      if (scanned >= begin_ + 3 && buffer_.compare(scanned - 3, 4, "\r\n\r\n") == 0)
        return scanned - 3;
    }
    return std::string::npos;
  }

  void rename_form_content_type(size_t head_end) {
    for (size_t line = buffer_.find("\r\n", begin_); line < head_end;
         line = buffer_.find("\r\n", line + 2)) {
      const std::string_view header(buffer_.data() + line + 2, head_end - line - 2);
      if (!starts_with_ignoring_case(header, "content-type:")) continue;
      size_t value = line + 2 + std::strlen("content-type:");
      while (value < head_end && (buffer_[value] == ' ' || buffer_[value] == '\t')) ++value;
      if (starts_with_ignoring_case(std::string_view(buffer_).substr(value), kFormContentType))
        buffer_.replace(value, std::strlen(kFormContentType), kRenamedFormContentType);
      return;
    }
  }

  // Appends what one recv() gives to the buffer.
  ssize_t receive() {
    char chunk[4096];
    const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n > 0) buffer_.append(chunk, size_t(n));
    return n;
  }

  int fd_;
  std::chrono::microseconds read_timeout_, write_timeout_;
  std::string buffer_;  // bytes received and not yet read, from begin_
  size_t begin_ = 0;
};

// Ends a connection whose answer may have left its request unread (a body without length, a
// connection refused before its request): the answer's end is sent (FIN) before the unread
// bytes are drained and the socket closed, so the client reads the answer instead of a reset.
void close_after_answer(int fd, std::chrono::milliseconds linger) {
  shutdown(fd, SHUT_WR);
  char sink[4096];
  const auto until = Clock::now() + linger;
  do {
    const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    if (n < 0 && !wait_readable(fd, std::chrono::duration_cast<std::chrono::microseconds>(
                                        until - Clock::now())))
      break;
  } while (Clock::now() < until);
  close(fd);
}

// An answer written straight to the socket, outside httplib (the connection is closed after
// it): `status_line` ("503 Service Unavailable"), a JSON body, `extra_headers` (each ending in
// \r\n), and with allow_origin (--allow-origin; empty: none) the CORS headers every answer
// carries, so that a browser's page can read it.
void answer_and_close(int fd, const std::string& status_line, const std::string& body,
                      const std::string& extra_headers, const std::string& allow_origin,
                      std::chrono::milliseconds linger) {
  const std::string response =
      "HTTP/1.1 " + status_line + "\r\nContent-Type: application/json\r\n" + extra_headers +
      "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
      (allow_origin.empty() ? std::string()
                            : "Access-Control-Allow-Origin: " + allow_origin +
                                  "\r\nAccess-Control-Expose-Headers: Retry-After\r\n") +
      "\r\n" + body;
  send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close_after_answer(fd, linger);
}

// The answer to a connection that found --max-connections answered and as many waiting: 503,
// written at once on the accepting thread without waiting for the request (an idle or slow
// client would hold the accepting thread, and one that never sends was closed unanswered).
void refuse_connection(int fd, const std::string& allow_origin) {
  answer_and_close(
      fd, "503 Service Unavailable",
      R"({"error":"the server is answering --max-connections connections and as many wait; )"
      R"(retry later"})",
      "Retry-After: 1\r\n", allow_origin, std::chrono::milliseconds(0));
}

// httplib::Server with its connection loop here instead of in the library (Debian's
// libcpp-httplib 0.11 is compiled, so the loop cannot be patched), to: answer a connection
// past the pool at once (refuse_connection); end a connection after an answer that leaves its
// request unread (g_close_after_response: 411) or whose client left (g_discard_response: 499);
// answer a head that is too large (431) or too slow (408); give handlers their socket
// (g_client_socket).
// Otherwise as httplib's: keep-alive up to its count and timeout, a stream per connection.
// Also a deeper listen backlog: Debian's libcpp-httplib is compiled with a backlog of 5, which
// drops the connections of more than a handful of clients arriving at once.
class Server : public httplib::Server {
 public:
  // Calling listen() again on the bound socket only changes its backlog.
  bool deepen_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
  std::function<void()> on_refused_connection;  // counts a refuse_connection
  std::function<void(int)> on_unread_request;   // counts a 431 or 408 answered before routing
  std::string allow_origin;                     // --allow-origin, for refuse_connection

 private:
  bool process_and_close_socket(socket_t sock) override {
    if (g_overflow_connection) {
      refuse_connection(sock, allow_origin);
      if (on_refused_connection) on_refused_connection();
      return true;
    }
    ConnectionStream stream(sock, seconds(read_timeout_sec_, read_timeout_usec_),
                            seconds(write_timeout_sec_, write_timeout_usec_));
    g_client_socket = sock;
    bool answered = false, close_after = false;
    try {
      for (size_t count = keep_alive_max_count_; count > 0 && next_request_arrives(stream);
           --count) {
        bool connection_closed = false;
        g_close_after_response = g_discard_response = false;
        const ConnectionStream::Head head = stream.read_head();
        if (head == ConnectionStream::Head::kTooLarge ||
            head == ConnectionStream::Head::kTimedOut) {
          const bool large = head == ConnectionStream::Head::kTooLarge;
          answer_and_close(
              sock, large ? "431 Request Header Fields Too Large" : "408 Request Timeout",
              large ? R"({"error":"the request line and headers take more than )" +
                          std::to_string(ConnectionStream::kMaxHeadBytes) + R"( bytes"})"
                    : std::string(R"({"error":"the request line and headers did not arrive )"
                                  R"(within --io-timeout"})"),
              "", allow_origin, std::chrono::milliseconds(500));
          if (on_unread_request) on_unread_request(large ? 431 : 408);
          g_client_socket = -1;
          return true;
        }
        answered = process_request(stream, count == 1, connection_closed, nullptr);
        close_after = g_close_after_response || g_discard_response;
        g_discard_response = false;
        if (!answered || connection_closed || close_after) break;
      }
    } catch (const std::exception&) {
      // Outside any handler (httplib reading a request line or headers, when memory runs out):
      // the connection is closed unanswered, and the server goes on. Escaping this thread, the
      // exception would end the process.
      answered = close_after = false;
    }
    g_client_socket = -1;
    if (close_after) {
      close_after_answer(sock, std::chrono::milliseconds(500));
    } else {
      shutdown(sock, SHUT_RDWR);
      close(sock);
    }
    return answered;
  }

  // Waits up to the keep-alive timeout for the connection's next request, as httplib does, but
  // gives up as soon as the server stops.
  bool next_request_arrives(const ConnectionStream& stream) const {
    if (stream.has_buffered()) return true;
    const auto until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET && Clock::now() < until)
      if (wait_readable(stream.socket(), std::chrono::milliseconds(10))) return true;
    return false;
  }

  static std::chrono::microseconds seconds(time_t sec, time_t usec) {
    return std::chrono::seconds(sec) + std::chrono::microseconds(usec);
  }
};

// True once the peer closed its side (or the socket failed).
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  char byte;
  return (p.revents & POLLIN) && recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  if (status == 503) res.set_header("Retry-After", "1");
  reply_json(res, status, {{"error", message}});
}

// The JSON of one answered sentence for /v1/translate.
json sentence_json(const TranslationService& service, const TranslateRequest& request,
                   const SentenceResult& r) {
  json j;
  const bool any = r.translated && !r.hypotheses.empty();
  j["text"] = any ? r.hypotheses.front().text : "";
  j["score"] = any ? json(r.hypotheses.front().log_prob) : json(nullptr);
  j["source_tokens"] = r.source_tokens;
  j["target_tokens"] = any ? r.hypotheses.front().ids.size() : 0;
  if (request.nbest_requested) {
    json list = json::array();
    for (const TranslationHypothesis& h : r.hypotheses)
      list.push_back({{"text", h.text}, {"score", h.log_prob}, {"target_tokens", h.ids.size()}});
    j["nbest"] = list;
  }
  if (request.attention && any)
    j["attention"] = service.attention_json(r, request.search.attention_layer);
  return j;
}

}  // namespace

void run_server(const ServeSettings& settings) {
  // Two heaps for the decoding thread and every request thread together (see limit_heaps).
  limit_heaps(2);
  // SIGINT and SIGTERM are taken by one watcher thread (sigtimedwait), so they are blocked
  // before any other thread exists: no thread of the pool, of the decoder or of OpenMP can be
  // interrupted by them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::atomic<bool> finished{false}, stop_requested{false};
  std::atomic<int> stop_signal{0};
  Server server;
  std::thread watcher([&] {
    const timespec tick{0, 100 * 1000 * 1000};
    while (!finished) {
      const int s = sigtimedwait(&stop_signals, nullptr, &tick);
      if (s != SIGINT && s != SIGTERM) continue;
      stop_signal = s;
      stop_requested = true;
      // The server may not be listening yet: stop it as soon as it is.
      while (!finished && !server.is_running())
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      server.stop();
      return;
    }
  });
  struct JoinWatcher {
    std::atomic<bool>& finished;
    std::thread& watcher;
    ~JoinWatcher() {
      finished = true;
      watcher.join();
    }
  } join_watcher{finished, watcher};

  const Translator translator(
      settings.model,
      {.device = settings.device, .compute_type = settings.compute_type, .need_vocabulary = true});
  const ModelConfig& config = translator.config();
  ServeLimits limits = settings.limits;
  const int64_t model_tokens = max_source_tokens(config);
  if (limits.max_sentence_tokens <= 0 || limits.max_sentence_tokens > model_tokens)
    limits.max_sentence_tokens = model_tokens;
  limits.max_length = max_target_tokens(config);
  limits.decoder_layers = config.decoder_layers;
  TranslationOptions defaults = settings.search;
  defaults.num_hypotheses = 1;
  ServeMetrics metrics;
  TranslationService service(translator, settings.batcher, limits, metrics);
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> answered{0};

  server.on_refused_connection = [&] { metrics.count_request("", 503, 0.0); };
  server.on_unread_request = [&](int status) { metrics.count_request("", status, 0.0); };
  server.new_task_queue = [&] {
    return new ConnectionPool(size_t(settings.max_connections), size_t(settings.max_connections));
  };
  const auto io_seconds = std::chrono::duration<double>(settings.io_timeout_seconds);
  server.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(io_seconds));
  server.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(io_seconds));
  server.set_keep_alive_timeout(2);
  server.set_payload_max_length(size_t(limits.max_body_bytes));
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // server bind the same port silently instead of failing.
  // TCP_NODELAY (inherited by accepted sockets): httplib writes a response's headers and body
  // in two sends, and Nagle's algorithm would hold the body until the client's delayed ACK —
  // measured: +20 ms per request at beam 4, +35 ms greedy, on loopback.
  server.set_tcp_nodelay(true);
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });

  // The methods each path answers, for 405's Allow (every route is registered through these).
  std::map<std::string, std::string> methods_of_path;
  auto allow = [&](const char* methods, const std::string& path) {
    std::string& list = methods_of_path[path];
    list += (list.empty() ? "" : ", ") + std::string(methods);
    if (!settings.allow_origin.empty() && list.find("OPTIONS") == std::string::npos)
      list += ", OPTIONS";
  };
  auto get = [&](const std::string& path, httplib::Server::Handler handler) {
    allow("GET, HEAD", path);
    server.Get(path, std::move(handler));
  };
  auto post = [&](const std::string& path, httplib::Server::Handler handler) {
    allow("POST", path);
    server.Post(path, std::move(handler));
  };

  const std::string body_too_large = "the request body is larger than " +
                                     std::to_string(limits.max_body_bytes) +
                                     " bytes (--max-body-bytes)";
  server.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    g_request_start = Clock::now();
    ++in_flight;
    // A request that may carry a body but gives neither its length nor chunks: httplib would
    // read it until the client closes (--io-timeout later, 400). Answered at once; the bytes
    // that may follow are not read, so the connection ends with this answer.
    const bool body_method = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                             req.method == "DELETE" || req.method == "PRI";
    // A Content-Length that is not a number (httplib reads "abc" as 0 and the body that follows
    // as the next request): 400, and the connection ends with the answer.
    const std::string length = req.get_header_value("Content-Length");
    if (req.has_header("Content-Length") && (!is_decimal(length) || exceeds_any_body(length))) {
      g_close_after_response = true;
      res.set_header("Connection", "close");
      if (is_decimal(length))
        reply_error(res, 413, body_too_large);
      else
        reply_error(res, 400, "Content-Length must be a decimal number of bytes");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!body_method || req.has_header("Content-Length") ||
        strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0)
      return httplib::Server::HandlerResponse::Unhandled;
    g_close_after_response = true;
    res.set_header("Connection", "close");
    if (req.method == "DELETE" || req.method == "PRI")  // no body needed, and no such route
      res.status = 404;  // the error handler makes it 405 where the path has other methods
    else
      reply_error(res, 411, req.method + " needs a Content-Length (or chunked transfer encoding)");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      reply_error(res, 413, body_too_large);
    else if (res.status == 404 && methods_of_path.count(req.path)) {
      res.set_header("Allow", methods_of_path.at(req.path));
      reply_error(res, 405,
                  req.path + " answers " + methods_of_path.at(req.path) + ", not " + req.method);
    } else if (res.status == 404)
      reply_error(res, 404, "no such endpoint: " + req.method + " " + req.path);
    else if (res.status == 400) {
      // Where a request's line or headers could not be parsed, where the next one starts is
      // not known either: the connection ends with this answer.
      g_close_after_response = true;
      res.set_header("Connection", "close");
      reply_error(res, 400, "malformed HTTP request");
    } else
      reply_error(res, res.status, "HTTP status " + std::to_string(res.status));
  });
  server.set_logger([&](const httplib::Request& req, const httplib::Response& res) {
    const bool routed = g_request_start != Clock::time_point{};
    const double seconds =
        routed ? std::chrono::duration<double>(Clock::now() - g_request_start).count() : 0.0;
    metrics.count_request(req.path, res.status, seconds);
    if (routed) --in_flight;
    g_request_start = {};
    ++answered;
  });
  if (!settings.allow_origin.empty()) {
    server.allow_origin = settings.allow_origin;
    server.set_post_routing_handler([&](const httplib::Request&, httplib::Response& res) {
      res.set_header("Access-Control-Allow-Origin", settings.allow_origin);
      // Retry-After (503, 429) is not among the headers a page may read unless named.
      res.set_header("Access-Control-Expose-Headers", "Retry-After");
    });
    server.Options(".*", [&](const httplib::Request&, httplib::Response& res) {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Content-Type");
      res.status = 204;
    });
  }

  // An exception before a handler runs (reading a body runs out of memory) gets the JSON answer
  // a handler gives, where httplib alone answers a bare 500 with an EXCEPTION_WHAT header. The
  // connection is closed after it: the rest of the body, unread, would be read as the next
  // request's line, whose growing buffer httplib cannot let an exception out of (std::terminate).
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        g_close_after_response = true;
        try {
          std::rethrow_exception(error);
        } catch (const std::bad_alloc&) {
          reply_error(res, 500, "out of memory");
        } catch (const std::exception& e) {
          reply_error(res, 500, e.what());
        } catch (...) {
          reply_error(res, 500, "internal error");
        }
      });

  // Every handler answers a RequestError or any other failure with a JSON error, never by
  // letting it escape into httplib.
  auto guarded = [](auto handler) {
    return [handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const RequestError& e) {
        reply_error(res, e.status(), e.what());
        // The client closed its side: nothing is sent (half-closed or not), and the connection
        // is closed; the status is counted.
        if (e.status() == 499) g_discard_response = true;
      } catch (const std::bad_alloc&) {
        reply_error(res, 500, "out of memory");
      } catch (const std::exception& e) {
        reply_error(res, 500, e.what());
      }
      // The process keeps freed memory for reuse (retain_freed_memory), in one heap per
      // thread: a large body's transient memory (tokenizing 1 MB of text takes ~40 MB) would
      // stay with each worker thread that ever took one. Given back after such a request.
      if (req.body.size() > kLargeBodyBytes) release_freed_memory();
    };
  };
  // Gives up on a request whose client closed its connection.
  auto make_give_up = [](const httplib::Request&) {
    return [fd = g_client_socket] { return fd >= 0 && peer_closed(fd); };
  };
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(settings.request_timeout_seconds));

  get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(web_page_html(), "text/html; charset=utf-8");
  });
  get("/health", [](const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200, {{"status", "ok"}});
  });
  get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(service.queued_sentences(), in_flight.load()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  get("/v1/model", [&](const httplib::Request&, httplib::Response& res) {
    const Vocabulary& sv = *translator.source_vocabulary();
    const Vocabulary& tv = *translator.target_vocabulary();
    const SearchOptions& loaded = translator.search_defaults();  // the compute type resolved
    reply_json(res, 200,
               {{"model", settings.model},
                {"config", config_to_json(config)},
                {"parameters", parameter_count(config)},
                {"source_vocabulary", {{"size", sv.size()}, {"file", sv.where()}}},
                {"target_vocabulary", {{"size", tv.size()}, {"file", tv.where()}}},
                {"shared_vocabulary", sv.where() == tv.where()},
                {"languages",
                 {{"source", settings.source_language}, {"target", settings.target_language}}},
                {"defaults",
                 {{"beam", defaults.beam_size},
                  {"alpha", defaults.length_penalty},
                  {"max_length", defaults.max_decoding_length},
                  {"sampling_topk", defaults.sampling_topk},
                  {"sampling_topp", defaults.sampling_topp},
                  {"sampling_temperature", defaults.sampling_temperature},
                  {"compute_type", compute_type_name(loaded.precision, loaded.cache)}}},
                {"limits",
                 {{"max_body_bytes", limits.max_body_bytes},
                  {"max_sentences", limits.max_sentences},
                  {"max_sentence_tokens", limits.max_sentence_tokens},
                  {"max_beam", limits.max_beam},
                  {"max_length", limits.max_length},
                  {"max_attention_cells", limits.max_attention_cells}}}});
  });
  post("/v1/translate", guarded([&](const httplib::Request& req, httplib::Response& res) {
         const TranslateRequest request = parse_translate_request(req.body, defaults, limits);
         const auto results =
             service.translate(request, g_request_start + timeout, make_give_up(req));
         json list = json::array();
         for (const SentenceResult& r : results) list.push_back(sentence_json(service, request, r));
         reply_json(res, 200, {{"translations", list}});
       }));
  // LibreTranslate's fields come as JSON, or as form fields (urlencoded or multipart), or in
  // the query string.
  auto libretranslate_fields = [&limits](const httplib::Request& req) {
    json fields = json::object();
    if (req.get_header_value("Content-Type").rfind("application/json", 0) == 0) {
      try {
        fields = parse_request_json(req.body, limits);
      } catch (const JsonError& e) {  // syntax, a number out of range, a key given twice
        const std::string what = e.what();
        throw RequestError(400, what.rfind("duplicate key", 0) == 0
                                    ? "Invalid request: " + what
                                    : std::string("Invalid JSON format"));
      }
    } else {
      std::map<std::string, std::string> form;  // an urlencoded body (kRenamedFormContentType)
      if (starts_with_ignoring_case(req.get_header_value("Content-Type"), kRenamedFormContentType))
        form = parse_form_fields(req.body, limits);
      for (const auto& [key, value] : req.params)
        if (!fields.contains(key)) fields[key] = value;
      for (const auto& [key, value] : form)
        if (!fields.contains(key)) fields[key] = value;
      for (const auto& [key, part] : req.files)
        if (!fields.contains(key)) fields[key] = part.content;
      if (fields.contains("q") && fields["q"].is_string()) {
        std::string q = fields["q"];  // form text: \r\n → \n, as LibreTranslate
        for (size_t at; (at = q.find("\r\n")) != std::string::npos;) q.erase(at, 1);
        fields["q"] = q;
      }
    }
    return fields;
  };
  post("/translate", guarded([&](const httplib::Request& req, httplib::Response& res) {
         const json fields = libretranslate_fields(req);
         const LibreTranslateRequest lr = parse_libretranslate_request(
             fields, defaults, limits, settings.source_language, settings.target_language);
         const auto results =
             service.translate(lr.translate, g_request_start + timeout, make_give_up(req));
         json texts = json::array(), alternatives = json::array();
         for (const SentenceResult& r : results) {
           texts.push_back(r.hypotheses.empty() ? "" : r.hypotheses.front().text);
           json others = json::array();
           for (size_t k = 1; k < r.hypotheses.size(); ++k) others.push_back(r.hypotheses[k].text);
           alternatives.push_back(others);
         }
         const bool list = lr.translate.text_was_list;
         json out = {{"translatedText", list ? texts : texts.front()}};
         if (lr.alternatives > 0) out["alternatives"] = list ? alternatives : alternatives.front();
         if (lr.detect_source) {
           const json detected = {
               {"confidence", settings.source_language.empty() ? 0.0 : 100.0},
               {"language", settings.source_language.empty() ? "auto" : settings.source_language}};
           out["detectedLanguage"] =
               list ? json(std::vector<json>(results.size(), detected)) : detected;
         }
         reply_json(res, 200, out);
       }));
  post("/detect", guarded([&](const httplib::Request& req, httplib::Response& res) {
         reply_json(
             res, 200,
             libretranslate_detect(libretranslate_fields(req), limits, settings.source_language));
       }));
  get("/languages", [&](const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200,
               libretranslate_languages(settings.source_language, settings.target_language));
  });
  get("/frontend/settings", [&](const httplib::Request&, httplib::Response& res) {
    auto language = [](const std::string& code) {
      if (code.empty()) return json{{"code", "auto"}, {"name", "Auto Detect"}};
      return json{{"code", code}, {"name", language_name(code)}};
    };
    reply_json(res, 200,
               {{"charLimit", -1},
                {"frontendTimeout", 500},
                {"apiKeys", false},
                {"keyRequired", false},
                {"suggestions", false},
                {"filesTranslation", false},
                {"supportedFilesFormat", json::array()},
                {"language",
                 {{"source", language(settings.source_language)},
                  {"target", language(settings.target_language)}}}});
  });

  // A host that names no address (999.1.1.1, a misspelt name) is told apart from a bind that
  // fails: httplib reports both as a failed bind, with an errno that is not the reason.
  {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(settings.host.c_str(), nullptr, &hints, &found); rc != 0)
      throw Error("cannot listen on " + settings.host + ": " + gai_strerror(rc));
    freeaddrinfo(found);
  }
  int port = settings.port;
  if (port == 0) {
    port = server.bind_to_any_port(settings.host);
    if (port < 0) throw Error("cannot listen on " + settings.host + ": " + std::strerror(errno));
  } else if (!server.bind_to_port(settings.host, port)) {
    throw Error("cannot listen on " + settings.host + ":" + std::to_string(port) + ": " +
                std::strerror(errno));
  }
  if (!server.deepen_backlog(SOMAXCONN))
    throw Error("cannot listen on " + settings.host + ": " + std::strerror(errno));
  std::fprintf(stderr, "serve: listening on http://%s:%d/ (model %s; stop with Ctrl-C)\n",
               settings.host.find(':') != std::string::npos ? ("[" + settings.host + "]").c_str()
                                                            : settings.host.c_str(),
               port, settings.model.c_str());
  std::fflush(stderr);
  if (!stop_requested && !server.listen_after_bind() && !stop_requested)
    throw Error("the server stopped listening: " + std::string(std::strerror(errno)));
  std::fprintf(stderr, "serve: stopped by %s after answering %llu requests\n",
               stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)answered.load());
}

}  // namespace tfm
