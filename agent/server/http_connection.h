// The agent's HTTP/1.1 transport, on Boost.Asio and Beast (the stack the
// router serves clients with): accepts connections, parses requests strictly,
// enforces limits and per-state timeouts, answers pipelined requests in
// order, and hands each request to a route.
//
// Threads: a few io threads own every socket. Each connection is one
// coroutine on its own strand, so an idle or slow client costs a coroutine
// and a buffer, never a thread. Routes run on the connection's strand and
// must not block: work that waits (on the engine) or computes in proportion
// to the request (tokenizing a prompt) goes through HttpExchange::offload()
// to the worker pool; waiting for the engine's outputs is asynchronous (the
// engine thread calls HttpWaker::wake(), the route awaits HttpExchange::wait()).
//
// Errors: a request the parser refuses is answered 400 (413 body too large,
// 431 headers too large) and the connection closed. An exception escaping a
// route is caught here, logged with the request id and answered with a 500
// JSON error carrying that id (or, once a response has started, ends the
// connection). Nothing internal ever goes into a response header.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tandem::server {

// Bounds on what one connection may cost. Defaults are what ServerConfig
// documents (docs/configuration.md).
struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;            // request line + headers
  uint64_t max_body_bytes = 64ull * 1024 * 1024;  // one request body
  std::chrono::seconds request_timeout{30};  // a request's headers and body, from its first byte
  std::chrono::seconds idle_timeout{60};     // keep-alive: between two requests
  std::chrono::seconds write_timeout{30};    // one write (a response, a stream chunk)
  size_t max_pipelined_bytes = 1024 * 1024;  // read ahead while a request is answered
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One parsed request.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query
  std::string query;   // after '?', still percent-encoded
  std::string body;
  std::string id;  // this server's id of the request (X-Request-Id of the response)
  HttpHeaders headers;

  // Header value (case-insensitive name), "" when absent.
  std::string header(std::string_view name) const;
  // Query parameter, percent-decoded (bytes kept as sent, NUL included);
  // nullopt when absent.
  std::optional<std::string> param(std::string_view name) const;
};

// A whole (not streamed) response.
struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain";
  HttpHeaders headers;

  void set_content(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
};

// Wakes a connection waiting in HttpExchange::wait(). Safe from any thread,
// also after the connection or the server is gone (then it does nothing).
class HttpWaker {
 public:
  virtual ~HttpWaker() = default;
  virtual void wake() = 0;
};

class HttpConnection;
class HttpService;

// A route's view of its request and connection. Every method is called on
// the connection's strand (inside the route's coroutine).
class HttpExchange {
 public:
  HttpExchange(HttpConnection& connection, HttpService& service, HttpRequest request)
      : connection_(connection), service_(service), request_(std::move(request)) {}

  const HttpRequest& request() const { return request_; }

  // Writes a whole response; false when the client is gone.
  boost::asio::awaitable<bool> respond(HttpResponse response);
  // A chunked response (Server-Sent Events): the head, then chunks, then
  // the end. Each returns false when the client is gone or stopped reading
  // for longer than the write timeout.
  boost::asio::awaitable<bool> startChunked(int status, std::string content_type,
                                            HttpHeaders headers);
  boost::asio::awaitable<bool> writeChunk(std::string data);
  boost::asio::awaitable<bool> finishChunked();
  bool started() const { return started_; }
  // The client went away (seen by wait() or a failed write).
  bool clientGone() const;

  // Waits until waker() is woken, `timeout` passes, or the client goes away
  // (the connection is watched for EOF or an error meanwhile). False when
  // the client has gone; true may be spurious, so re-check the condition.
  boost::asio::awaitable<bool> wait(
      std::optional<std::chrono::steady_clock::duration> timeout = std::nullopt);
  std::shared_ptr<HttpWaker> waker();

  // Runs `work` on the worker pool and resumes here with its result;
  // exceptions propagate.
  template <typename T>
  boost::asio::awaitable<T> offload(std::function<T()> work);

 private:
  friend class HttpConnection;
  HttpConnection& connection_;
  HttpService& service_;
  HttpRequest request_;
  bool started_ = false;
  bool broken_ = false;  // a write failed: the connection cannot be reused
};

// A route: handles one request, answering through the exchange.
using HttpRoute = std::function<boost::asio::awaitable<void>(HttpExchange&)>;
// A route that only computes a whole response. Runs on the worker pool when
// `blocking`, else on the io thread (for quick, non-waiting work).
using HttpPlainRoute = std::function<void(const HttpRequest&, HttpResponse&)>;

class HttpService {
 public:
  HttpService(HttpLimits limits, int io_threads, int worker_threads);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Routes, registered before serve(). Unknown targets get 404.
  void route(std::string method, std::string path, HttpRoute handler);
  void route(std::string method, std::string path, HttpPlainRoute handler, bool blocking);
  void get(std::string path, HttpPlainRoute handler, bool blocking = false) {
    route("GET", std::move(path), std::move(handler), blocking);
  }
  void post(std::string path, HttpPlainRoute handler, bool blocking = false) {
    route("POST", std::move(path), std::move(handler), blocking);
  }

  // Binds and listens (backlog `backlog`); the bound port. Throws tandem::Error.
  int bind(const std::string& host, int port, int backlog);
  // Serves until stop(); blocks.
  void serve();
  // Stops accepting, closes every connection and returns serve(). Safe from
  // any thread (not from a signal handler); idempotent.
  void stop();
  // Connections open now (accepted, not yet closed).
  int64_t openConnections() const { return open_connections_.load(); }

  const HttpLimits& limits() const { return limits_; }
  boost::asio::thread_pool& workers() { return workers_; }

 private:
  friend class HttpConnection;
  boost::asio::awaitable<void> acceptLoop();
  boost::asio::awaitable<void> dispatch(HttpExchange& exchange);
  boost::asio::awaitable<void> runConnection(std::shared_ptr<HttpConnection> connection);
  std::string nextRequestId();
  void forget(HttpConnection* connection);

  HttpLimits limits_;
  int io_threads_;
  boost::asio::io_context ioc_;
  boost::asio::thread_pool workers_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::map<std::string, HttpRoute> routes_;  // "METHOD path"
  std::mutex connections_mutex_;
  std::map<HttpConnection*, std::weak_ptr<HttpConnection>> connections_;
  std::atomic<int64_t> open_connections_{0};
  std::atomic<uint64_t> next_request_{1};
  std::atomic<bool> stopping_{false};
  bool serving_ = false;
};

namespace detail {
template <typename T>
boost::asio::awaitable<std::optional<T>> runWork(std::function<T()> work) {
  co_return std::optional<T>(work());
}
}  // namespace detail

template <typename T>
boost::asio::awaitable<T> HttpExchange::offload(std::function<T()> work) {
  // co_spawn needs a default-constructible result: carry it in an optional.
  // (No lambda coroutine with captures here: GCC 12 destroys such captures
  // twice.)
  std::optional<T> result = co_await boost::asio::co_spawn(service_.workers().get_executor(),
                                                           detail::runWork<T>(std::move(work)),
                                                           boost::asio::use_awaitable);
  co_return std::move(*result);
}

}  // namespace tandem::server
