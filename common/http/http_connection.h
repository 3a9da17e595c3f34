// The HTTP/1.1 front shared by the agent and the router, on Boost.Asio and
// Beast: accepts connections, parses requests strictly, enforces limits and
// per-state timeouts, answers pipelined requests in order, and hands each
// request to a route. Both servers answer malformed HTTP, oversized heads and
// bodies, and slow clients the same way because they use this one front.
//
// Threads: a few io threads own every socket. Each connection is one
// coroutine on its own strand, so an idle or slow client costs a coroutine
// and a buffer, never a thread. Routes run on the connection's strand and
// must not block: work that waits (on the engine) or computes in proportion
// to the request (tokenizing a prompt, rendering a chat template) goes
// through HttpExchange::offload() to the worker pool; waiting for the
// engine's outputs is asynchronous (the engine thread calls HttpWaker::wake(),
// the route awaits HttpExchange::wait()). Other asynchronous work a route
// awaits on the connection's strand (the router's calls to agents) learns of
// the client leaving through HttpExchange::watchClient() and OnClientGone.
//
// Errors: a request the parser refuses is answered 400 (413 body too large,
// 431 headers too large) and the connection closed. An exception escaping a
// route is caught here, logged with the request id and answered with a 500
// JSON error carrying that id (or, once a response has started, ends the
// connection). Nothing internal ever goes into a response header. Every
// error body has OpenAI's shape: {"error": {"message", "type", "param",
// "code"}}.
//
// Connections: at most HttpLimits::max_connections are open at once (by
// default half the descriptor limit, at most 65,536). One more closes the
// connection that has waited longest for a request, if for a second at
// least (a keep-alive client reconnects, as after the idle timeout), or,
// with none such, is over the bound: its request head must come within 2 s,
// and only probes, metrics scrapes and the calls between agents and routers
// (KV transfers, KV events, models) are served to it (one request, answered
// with Connection: close); others get 503 with Retry-After, and the
// connection closes. At most 64 are over the bound at once; more are closed
// at once.
//
// Large bodies: at most HttpLimits::max_large_requests requests whose body
// is over large_body_bytes (or of unknown length) are read and handled at
// once; one more is answered 503 with Retry-After before its body is read.
// When such a request ends, freed heap memory is given back to the system
// (glibc malloc_trim), at most once a second.
//
// The namespace is tandem::server, as for the protocol library the two
// servers share (common/protocol).
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
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/http/http_limits.h"

namespace tandem::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

inline constexpr char kRequestIdHeader[] = "X-Request-Id";
inline constexpr std::string_view kRequestIdChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";

// One parsed request.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query
  std::string query;   // after '?', still percent-encoded
  std::string body;
  // This server's id of the request (X-Request-Id of the response): unique
  // here, and led by the caller's X-Request-Id when it sent one of
  // kRequestIdChars (at most 256), so that an id is traced across a router
  // and its agents: "<caller's>-<own>".
  std::string id;
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
class LargeRequest;

// {"error": {"message", "type", "param": null, "code": null}}, OpenAI's
// error shape; bytes that are not UTF-8 are replaced.
std::string httpErrorBody(const std::string& message, const std::string& type);
// A whole JSON error response in that shape; a 503 says Retry-After: 1.
HttpResponse httpErrorResponse(int status, const std::string& message, const std::string& type);
// 401 {"error": {..., "code": "invalid_api_key"}} with WWW-Authenticate: Bearer.
HttpResponse unauthorizedResponse();

// The API key clients must present: `flag` (--api-key) when given, else the
// environment's TANDEM_API_KEY; empty: none.
std::string apiKeyFrom(const std::string& flag);
// "/a,/b/" → {"/a", "/b/"} (an entry ending in '/' is a prefix); an entry
// not starting with '/' throws tandem::Error naming `flag`.
std::vector<std::string> parseApiKeyExemptPaths(const std::string& csv, const std::string& flag);
// A whole response whose body is JSON text already (an upstream's answer).
HttpResponse httpJsonResponse(int status, std::string body);

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
  // An interim "102 Processing" before the response (RFC 2518; an HTTP/1.1
  // client skips 1xx answers): says the request is alive while its answer
  // takes long; `headers` go with it. Only before respond()/startChunked();
  // false when the client is gone.
  boost::asio::awaitable<bool> writeProcessing(HttpHeaders headers = {});
  bool started() const { return started_; }
  // The client went away (seen by the watch of wait(), offload(work,
  // cancel) or watchClient(), or by a failed write).
  bool clientGone() const;

  // Waits until waker() is woken, `timeout` passes, or the client goes away
  // (the connection is watched for EOF or an error meanwhile). False when
  // the client has gone; true may be spurious, so re-check the condition.
  boost::asio::awaitable<bool> wait(
      std::optional<std::chrono::steady_clock::duration> timeout = std::nullopt);
  std::shared_ptr<HttpWaker> waker();

  // Runs `work` (a callable returning T) on the worker pool and resumes here
  // with its result; exceptions propagate.
  //
  // `work` is a named object, or a temporary that needs no destructor (a
  // lambda capturing only pointers, references and scalars): GCC 12
  // destroys a temporary with a destructor that sits in the same statement
  // as a co_await twice (a lambda capturing a std::string by value there
  // frees it twice). A static_assert refuses anything else; name it first
  // (`auto work = [s] {...}; co_await exchange.offload<T>(work);`).
  template <typename T, typename F>
  boost::asio::awaitable<T> offload(F&& work) {
    checkWork<F>();
    return offloadOn<T>(false, std::function<T()>(std::forward<F>(work)));
  }
  // offload() on the waiting pool: for work that waits for another thread.
  template <typename T, typename F>
  boost::asio::awaitable<T> offloadWait(F&& work) {
    checkWork<F>();
    return offloadOn<T>(true, std::function<T()>(std::forward<F>(work)));
  }
  // The same, watching the connection meanwhile: `cancel` is set when the
  // client leaves (or the service stops), for `work` to poll and end early
  // (a template render, a tokenizer). The route then finds clientGone()
  // true and answers nothing.
  template <typename T, typename F>
  boost::asio::awaitable<T> offload(F&& work, std::atomic<bool>& cancel) {
    checkWork<F>();
    return offloadCancellable<T>(std::function<T()>(std::forward<F>(work)), cancel);
  }

  // Watches the connection while the route awaits something other than
  // wait() (a call to another server, a queue): from now until the exchange
  // ends, the client leaving (EOF, reset) makes clientGone() true and runs
  // the callback of the innermost OnClientGone. Idempotent.
  void watchClient();

 private:
  friend class HttpConnection;
  template <typename F>
  static constexpr void checkWork() {
    static_assert(
        std::is_lvalue_reference_v<F> || std::is_trivially_destructible_v<std::remove_cvref_t<F>>,
        "offload work passed as a temporary must need no destructor (GCC 12 destroys "
        "it twice): name it first and pass the name");
  }
  template <typename T>
  boost::asio::awaitable<T> offloadOn(bool waiting_pool, std::function<T()> work);
  template <typename T>
  boost::asio::awaitable<T> offloadCancellable(std::function<T()> work, std::atomic<bool>& cancel);
  friend class OnClientGone;
  // Sets what the client leaving runs; returns the previous callback.
  std::function<void()> swapOnGone(std::function<void()> callback);
  HttpConnection& connection_;
  HttpService& service_;
  HttpRequest request_;
  bool started_ = false;
  bool broken_ = false;  // a write failed: the connection cannot be reused
};

// While it lives, the client leaving runs `cancel` (on the connection's
// strand, at once when the client has already left); the previous callback
// comes back when it ends. Starts the exchange's watch. Create and destroy
// it on the connection's strand (in the route's coroutine).
class OnClientGone {
 public:
  OnClientGone(HttpExchange& exchange, std::function<void()> cancel);
  ~OnClientGone();
  OnClientGone(const OnClientGone&) = delete;
  OnClientGone& operator=(const OnClientGone&) = delete;

 private:
  HttpExchange& exchange_;
  std::function<void()> previous_;
};

// A route: handles one request, answering through the exchange.
using HttpRoute = std::function<boost::asio::awaitable<void>(HttpExchange&)>;
// A route that only computes a whole response.
using HttpPlainRoute = std::function<void(const HttpRequest&, HttpResponse&)>;
// Where a plain route runs: on the io thread (quick work that never waits),
// on the worker pool (CPU work: parsing, tokenizing, rendering), or on the
// waiting pool (calls that wait for another thread, such as the engine's
// next step: they must never hold the workers every other request's
// parsing, and a peer's KV handshake, queue behind).
enum class RouteWork { kInline, kCompute, kWait };
// Threads of the waiting pool: that many such calls wait at once; more
// queue behind them, never behind the workers.
inline constexpr int kWaitingThreads = 8;

class HttpService {
 public:
  HttpService(HttpLimits limits, int io_threads, int worker_threads);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Routes, registered before serve(). Unknown targets get 404.
  void route(std::string method, std::string path, HttpRoute handler);
  void route(std::string method, std::string path, HttpPlainRoute handler, RouteWork work);
  void get(std::string path, HttpPlainRoute handler, RouteWork work = RouteWork::kInline) {
    route("GET", std::move(path), std::move(handler), work);
  }
  void post(std::string path, HttpPlainRoute handler, RouteWork work = RouteWork::kInline) {
    route("POST", std::move(path), std::move(handler), work);
  }

  // Clients must send `Authorization: Bearer <key>` (compared in constant
  // time) for every path but those in `exempt` (an entry ending in '/' is a
  // prefix); others get 401 in OpenAI's shape (code "invalid_api_key",
  // WWW-Authenticate: Bearer), before their route runs. An empty key turns
  // the check off (the default). Call before serve().
  void requireApiKey(std::string key, std::vector<std::string> exempt);

  // Binds and listens (backlog `backlog`) on listenAddress(host); the
  // bound port. Throws tandem::Error.
  int bind(const std::string& host, int port, int backlog);
  // Serves until stop(); blocks (the calling thread is one of the io threads).
  void serve();
  // Serves on io threads of its own and returns; after stop(), join() waits
  // for them. The other way to serve: call one of serve() and start().
  void start();
  void join();
  // Stops accepting connections; those open go on being served. Safe from
  // any thread; idempotent.
  void stopAccepting();
  // Stops accepting, closes every connection, cancels offloaded work that
  // watches its client and ends the io threads. Safe from any thread (not
  // from a signal handler); idempotent.
  void stop();
  // Connections open now (accepted, not yet closed).
  int64_t openConnections() const { return open_connections_.load(); }
  // Accepts that failed (e.g. the process ran out of file descriptors).
  int64_t acceptErrors() const { return accept_errors_.load(); }
  // The bound on open connections (HttpLimits::max_connections, or the
  // automatic one once bind() has raised the descriptor limit).
  int64_t maxConnections() const { return max_connections_.load(); }
  // Connections over that bound: idle ones closed to make room, new ones
  // not served (answered 503, or closed) because none was idle.
  int64_t idleConnectionsClosed() const { return idle_closed_.load(); }
  int64_t connectionsRefused() const { return connections_refused_.load(); }
  // Counts idle connections: O(open connections), for a metrics scrape.
  HttpFrontStats frontStats();

  const HttpLimits& limits() const { return limits_; }
  boost::asio::thread_pool& workers() { return workers_; }
  boost::asio::thread_pool& waiters() { return waiters_; }
  // The io threads' context: other asynchronous work of the server (the
  // router's agent polls) may run on it.
  boost::asio::io_context& ioContext() { return ioc_; }
  // Gives freed heap memory back to the system soon (glibc malloc_trim, at
  // most once a second, on a worker): after work that allocated much and
  // freed it on its own thread's arena (a large body, a large grammar).
  void trimSoon();

 private:
  friend class HttpConnection;
  friend class HttpExchange;
  friend class LargeRequest;
  // A large request's slot (HttpLimits::max_large_requests); false: none free.
  bool enterLarge();
  // Gives the slot back and trims the heap soon.
  void leaveLarge();
  // Offloaded work's cancel flags, set all at once by stop().
  void addCancel(std::atomic<bool>* cancel);
  void removeCancel(std::atomic<bool>* cancel);
  boost::asio::awaitable<void> acceptLoop();
  boost::asio::awaitable<void> dispatch(HttpExchange& exchange);
  boost::asio::awaitable<void> runConnection(std::shared_ptr<HttpConnection> connection);
  // At max_connections: asks the connection idle longest (for at least a
  // second) to close, making room for the new one (true), or finds none
  // (false).
  bool closeIdlest();
  // A connection's entry in idle_ (HttpConnection::setIdle).
  void setIdle(HttpConnection* connection, int64_t since, bool idle);
  void countIdleClosed();
  void countRefused();
  // A connection over the bound asked for a path served there: it moves
  // from refusing_ to open_connections_.
  void countOverBoundServed();
  // Paths served to a connection over the bound (probes, metrics scrapes,
  // the calls between agents and routers); others get 503.
  bool servedOverBound(const std::string& target) const;
  std::string nextRequestId();
  void forget(HttpConnection* connection);

  // What coroutine frames touch when they are destroyed with the
  // io_context (at destruction, after stop()) is declared before it, so
  // that it is still there.
  bool authorized(const HttpRequest& request) const;
  // The same check on a request's head: its target (path and query) and its
  // Authorization header.
  bool authorized(const std::string& target, const std::string& header) const;

  HttpLimits limits_;
  int io_threads_;
  std::string api_key_;  // the key's digest (requireApiKey); empty: no key
  std::vector<std::string> api_key_exempt_;
  std::map<std::string, HttpRoute> routes_;  // "METHOD path"
  std::mutex connections_mutex_;
  std::map<HttpConnection*, std::weak_ptr<HttpConnection>> connections_;
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> accept_errors_{0};
  std::atomic<int64_t> max_connections_;
  std::atomic<int64_t> idle_closed_{0};
  std::atomic<int64_t> connections_refused_{0};
  std::atomic<int> refusing_{0};  // connections over the bound still open
  std::mutex idle_mutex_;
  // Connections waiting for a request, by the steady-clock ticks they began
  // waiting at: the first is the one idle longest.
  std::set<std::pair<int64_t, HttpConnection*>> idle_;
  std::atomic<uint64_t> next_request_{1};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> accepting_stopped_{false};
  std::atomic<bool> serving_{false};  // read by stop() on another thread
  std::atomic<int> large_requests_{0};
  std::atomic<bool> trim_scheduled_{false};
  std::atomic<int64_t> last_trim_{0};  // steady clock ticks
  std::mutex cancels_mutex_;
  std::vector<std::atomic<bool>*> cancels_;
  boost::asio::io_context ioc_;
  boost::asio::thread_pool workers_;
  boost::asio::thread_pool waiters_{kWaitingThreads};
  boost::asio::ip::tcp::acceptor acceptor_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;  // start()'s io threads
};

// The address a server given `host` listens on: an IP address as written,
// or a host name's first address as the system resolves it ("localhost",
// as vLLM's server takes it). Throws tandem::Error naming the host and port
// when it is neither. A program may call it before its slow start-up (a
// model's load) to refuse a bad --host at once.
boost::asio::ip::address listenAddress(const std::string& host, int port);

// An explicit HttpLimits::max_connections (0: the default, half the limit)
// checked against the descriptors the process may open, its soft limit
// raised to the hard one first: above half of them (the other half is the
// server's own connections, files and transfers), clients past the limit
// would stall in the listen backlog, probes among them. Throws
// tandem::Error naming the figures.
void checkConnectionBound(int64_t max_connections);

namespace detail {
template <typename T>
boost::asio::awaitable<std::optional<T>> runWork(std::function<T()> work) {
  co_return std::optional<T>(work());
}

// Runs `work` on `pool` and resumes the caller with its result.
template <typename T>
boost::asio::awaitable<T> runOn(boost::asio::thread_pool& pool, std::function<T()> work) {
  // co_spawn needs a default-constructible result: carry it in an optional.
  // (No lambda coroutine with captures here: GCC 12 destroys such captures
  // twice.)
  std::optional<T> result = co_await boost::asio::co_spawn(
      pool.get_executor(), runWork<T>(std::move(work)), boost::asio::use_awaitable);
  co_return std::move(*result);
}
}  // namespace detail

template <typename T>
boost::asio::awaitable<T> HttpExchange::offloadOn(bool waiting_pool, std::function<T()> work) {
  co_return co_await detail::runOn<T>(waiting_pool ? service_.waiters() : service_.workers(),
                                      std::move(work));
}

template <typename T>
boost::asio::awaitable<T> HttpExchange::offloadCancellable(std::function<T()> work,
                                                           std::atomic<bool>& cancel) {
  // The flag is also set by stop(), so that a shutdown does not wait for
  // work nobody will read.
  struct Registration {
    HttpService& service;
    std::atomic<bool>* flag;
    Registration(HttpService& s, std::atomic<bool>* f) : service(s), flag(f) {
      service.addCancel(flag);
    }
    ~Registration() { service.removeCancel(flag); }
  };
  Registration registration(service_, &cancel);
  OnClientGone watch(*this, [&cancel] { cancel = true; });
  co_return co_await offloadOn<T>(false, std::move(work));
}

}  // namespace tandem::server
