// The HTTP front on its own (no engine, no router): the one guard that turns
// an exception escaping a route into a clean 500 carrying the request id,
// plain routes on the worker pool, the bound on large requests handled at
// once, and offloaded work cancelled when its client leaves or the service
// stops.
#include "common/http/http_connection.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"

namespace tandem::server {
namespace {

using nlohmann::json;

// Waits for `condition` until a deadline; its last value.
template <typename Fn>
bool eventually(Fn&& condition, std::chrono::seconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

// A gate a test opens; routes block on it (on the worker pool).
class Gate {
 public:
  void waitOpen() {
    std::unique_lock<std::mutex> lock(mutex_);
    entered_ += 1;
    opened_.wait(lock, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entered_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
  int entered_ = 0;
};

// What a cancellable piece of offloaded work saw.
struct SlowWork {
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};
  std::atomic<bool> client_gone_seen{false};
};

class Service {
 public:
  explicit Service(HttpLimits limits = HttpLimits{}, std::string api_key = {})
      : service_(limits, 2, 2) {
    if (!api_key.empty()) service_.requireApiKey(std::move(api_key), {});
    service_.get("/boom", [](const HttpRequest&, HttpResponse&) {
      throw std::runtime_error("secret detail \xff of the failure");
    });
    service_.post(
        "/blocking-boom",
        [](const HttpRequest&, HttpResponse&) { throw std::logic_error("worker failure"); },
        RouteWork::kCompute);
    service_.post(
        "/echo",
        [](const HttpRequest& request, HttpResponse& response) {
          response.set_content(request.body, "text/plain");
        },
        RouteWork::kCompute);
    service_.post(
        "/hold",
        [this](const HttpRequest& request, HttpResponse& response) {
          gate_.waitOpen();
          response.set_content(std::to_string(request.body.size()), "text/plain");
        },
        RouteWork::kCompute);
    // A streamed answer in two pieces.
    service_.route("GET", "/chunks", [](HttpExchange& exchange) -> boost::asio::awaitable<void> {
      const bool headers_sent = co_await exchange.startChunked(200, "text/plain", {});
      if (!headers_sent) co_return;
      for (const char* piece : {"one", "two"}) {
        const bool written = co_await exchange.writeChunk(piece);
        if (!written) co_return;
      }
      co_await exchange.finishChunked();
    });
    // Runs until cancelled (or 30 s pass): what a hostile template does.
    service_.route("POST", "/slow", [this](HttpExchange& exchange) -> boost::asio::awaitable<void> {
      std::atomic<bool> cancel{false};
      SlowWork* slow = &slow_;
      const bool cancelled = co_await exchange.offload<bool>(
          [slow, &cancel] {
            slow->started += 1;
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
            while (!cancel && std::chrono::steady_clock::now() < deadline) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            if (cancel) slow->cancelled += 1;
            return cancel.load();
          },
          cancel);
      if (!cancelled && exchange.clientGone()) ADD_FAILURE() << "gone but never cancelled";
      if (exchange.clientGone()) {
        slow->client_gone_seen = true;
        co_return;
      }
      HttpResponse response;
      response.set_content("done", "text/plain");
      co_await exchange.respond(std::move(response));
    });
    port_ = service_.bind("127.0.0.1", 0, 128);
    thread_ = std::thread([this] { service_.serve(); });
  }
  ~Service() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    gate_.open();
    service_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int64_t acceptErrors() const { return service_.acceptErrors(); }
  HttpFrontStats frontStats() { return service_.frontStats(); }
  Gate& gate() { return gate_; }
  SlowWork& slow() { return slow_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }

 private:
  Gate gate_;
  SlowWork slow_;
  HttpService service_;
  int port_ = 0;
  std::thread thread_;
};

// A POST /hold on a thread of its own, held at the service's gate until the
// test opens it (finish(), or whatever ends the test first).
class HeldRequest {
 public:
  HeldRequest(Service& service, std::string body) : service_(service) {
    thread_ = std::thread([this, body = std::move(body)] {
      auto res = service_.client().Post("/hold", body, "text/plain");
      status = res ? res->status : -1;
      if (res) this->body = res->body;
    });
  }
  ~HeldRequest() { finish(); }
  // Opens the gate and waits for the answer.
  void finish() {
    service_.gate().open();
    if (thread_.joinable()) thread_.join();
  }

  int status = 0;
  std::string body;

 private:
  Service& service_;
  std::thread thread_;
};

void expectCleanInternalError(const httplib::Result& res) {
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  const std::string id = res->get_header_value("X-Request-Id");
  EXPECT_EQ(id.size(), 32u);
  for (const auto& [name, value] : res->headers) {
    EXPECT_TRUE(name == "Content-Type" || name == "Content-Length" || name == "X-Request-Id" ||
                name == "Connection")
        << name << ": " << value;
  }
  json body = json::parse(res->body);
  EXPECT_EQ(body["error"]["type"], "server_error");
  const std::string message = body["error"]["message"];
  EXPECT_NE(message.find(id), std::string::npos) << message;
  EXPECT_EQ(message.find("secret"), std::string::npos) << "exception text leaked: " << message;
  EXPECT_EQ(message.find("worker failure"), std::string::npos) << message;
}

TEST(HttpService, ExceptionInARouteIsACleanInternalErrorWithTheRequestId) {
  Service service;
  auto client = service.client();
  expectCleanInternalError(client.Get("/boom"));
  expectCleanInternalError(client.Post("/blocking-boom", "x", "text/plain"));
  // The server keeps serving, on the same keep-alive connection too.
  client.set_keep_alive(true);
  expectCleanInternalError(client.Get("/boom"));
  auto echo = client.Post("/echo", "hello", "text/plain");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->status, 200);
  EXPECT_EQ(echo->body, "hello");
}

TEST(HttpService, UnknownPathIsA404InTheErrorShape) {
  Service service;
  auto res = service.client().Get("/nowhere");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "not_found_error");
}

// The caller's X-Request-Id leads this server's id ("<caller's>-<own>"), so
// an id is traced across a router and its agents; one with other characters
// or too long is not taken.
TEST(HttpService, TheCallersRequestIdLeadsTheServersOwn) {
  Service service;
  auto idFor = [&](const std::string& given) {
    auto res = service.client().Get("/nowhere", httplib::Headers{{"X-Request-Id", given}});
    return res ? res->get_header_value("X-Request-Id") : std::string("no answer");
  };
  const std::string traced = idFor("trace-42.a:b");
  EXPECT_TRUE(traced.starts_with("trace-42.a:b-")) << traced;
  EXPECT_EQ(traced.size(), std::string("trace-42.a:b-").size() + 32) << traced;
  EXPECT_EQ(idFor("two words").size(), 32u);
  EXPECT_EQ(idFor("x\"y").size(), 32u);
  EXPECT_EQ(idFor(std::string(257, 'a')).size(), 32u);
  EXPECT_EQ(idFor(std::string(256, 'a')).size(), 256u + 1 + 32);
}

// A raw client: sends bytes, then closes without reading.
void sendAndClose(int port, const std::string& bytes) {
  const int fd = connectLoopback(port);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(sendAll(fd, bytes));
  ::close(fd);
}

// Out of file descriptors, a connection waits in the backlog and every
// accept fails at once: the service retries every 100 ms instead of spinning
// an io thread (millions of failures a second), and serves again once
// descriptors are free.
TEST(HttpService, RunningOutOfDescriptorsPausesAcceptingAndRecovers) {
  Service service;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const auto open_now = static_cast<rlim_t>(std::distance(
      std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{}));
  rlimit low = saved;
  low.rlim_cur = open_now + 16;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> clients;
  for (int fd; (fd = connectLoopback(service.port())) >= 0;) clients.push_back(fd);
  ASSERT_FALSE(clients.empty());
  // Descriptors back one at a time until one more client gets one (a retry
  // of the service may take one first): its connection cannot be accepted.
  int waiting = -1;
  while (waiting < 0 && !clients.empty()) {
    ::close(clients.back());
    clients.pop_back();
    waiting = connectLoopback(service.port());
  }
  ASSERT_GE(waiting, 0);
  clients.push_back(waiting);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t errors = service.acceptErrors();
  for (int fd : clients) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_GT(errors, 0);
  EXPECT_LT(errors, 100) << "the accept loop spun";
  auto res = service.client().Get("/nowhere");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

// Sends `bytes` and reads until the server closes the connection.
std::string exchangeRaw(int port, const std::string& bytes) {
  const int fd = connectLoopback(port);
  EXPECT_GE(fd, 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  EXPECT_TRUE(sendAll(fd, bytes));
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, n);
  ::close(fd);
  return answer;
}

// The head's bound (request line and headers, 16 KiB by default) holds
// however the head is laid out: exactly at the bound a request is served,
// one byte over it, or far over it with any padding before, it is a 431
// (Beast's parser alone let some layouts of 160 KB through).
TEST(HttpService, AHeadOverItsBoundIsA431WhateverItsLayout) {
  HttpLimits limits;
  Service service(limits);
  const std::string body = "hi";
  auto request = [&](const std::string& host, const std::string& fields) {
    return "POST /echo HTTP/1.1\r\nHost: " + host + "\r\n" + fields +
           "Content-Length: 2\r\nConnection: close\r\n\r\n" + body;
  };
  // A head of exactly `bytes` bytes: one X-Pad header filling the rest.
  auto headOf = [&](size_t bytes) {
    const size_t bare = request("t", "X-Pad: \r\n").size() - body.size();
    return request("t", "X-Pad: " + std::string(bytes - bare, 'p') + "\r\n");
  };
  const std::string at = exchangeRaw(service.port(), headOf(limits.max_header_bytes));
  EXPECT_TRUE(at.starts_with("HTTP/1.1 200")) << at.substr(0, 200);
  const std::string over = exchangeRaw(service.port(), headOf(limits.max_header_bytes + 1));
  EXPECT_TRUE(over.starts_with("HTTP/1.1 431")) << over.substr(0, 200);

  std::string many;
  for (int i = 0; i < 20000; ++i) many += "X-A: a\r\n";
  for (int pad = 0; pad <= 8; ++pad) {
    const std::string answer =
        exchangeRaw(service.port(), request("x" + std::string(pad, 'x'), many));
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 431"))
        << "padding " << pad << ": " << answer.substr(0, 200);
    EXPECT_NE(answer.find("larger than the limit of 16384 bytes"), std::string::npos) << answer;
  }
  // The service goes on serving.
  const std::string after = exchangeRaw(service.port(), request("t", ""));
  EXPECT_TRUE(after.ends_with("\r\n\r\nhi")) << after;
}

// A head that arrives in pieces, each ending just inside the next header
// line, is refused once it passes the bound, not kept until its end:
// Beast's bound alone counts only what one read left unparsed, and took a
// 9.7 MB head this way.
// The head never ends: a server that kept it until its end would say
// nothing until its request timeout (30 s), past the client's 10 s wait. A
// head too long behind a good pipelined
// request is refused after that request is answered.
TEST(HttpService, AHeadSentInPiecesIsRefusedAtItsBoundNotAtItsEnd) {
  HttpLimits limits;
  Service service(limits);
  const int fd = connectLoopback(service.port());
  ASSERT_GE(fd, 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const int no_delay = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &no_delay, sizeof no_delay);
  // Each piece a line of 487 bytes, the next line's first 2 bytes with it.
  std::vector<std::string> pieces = {"POST /echo HTTP/1.1\r\nHost: t\r\nX-"};
  for (int i = 0; i < 400; ++i) pieces.push_back("A: " + std::string(480, 'a') + "\r\nX-");
  for (const std::string& piece : pieces) {
    if (::send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) <= 0) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, n);
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 431")) << answer.substr(0, 200);

  const std::string good = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi";
  std::string big = "POST /echo HTTP/1.1\r\nHost: t\r\n";
  while (big.size() < 40000) big += "X-Line: " + std::string(40, 'l') + "\r\n";
  big += "Content-Length: 2\r\n\r\nhi";
  const std::string both = exchangeRaw(service.port(), good + big);
  EXPECT_TRUE(both.starts_with("HTTP/1.1 200")) << both.substr(0, 200);
  EXPECT_NE(both.find("\r\n\r\nhiHTTP/1.1 431"), std::string::npos) << both.substr(0, 400);
}

// A chunked body's size line (its extensions) and its trailer are kept by
// the parser until they end; the connection's buffer is bounded, so one
// that never ends is a 400 once it fills the buffer, not kept until the
// request timeout (30 s, past the client's 10 s wait).
TEST(HttpService, AChunkSizeLineOrTrailerThatNeverEndsIsRefused) {
  Service service;
  const std::string head = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const std::string& endless :
       {"1;" + std::string(3 << 20, 'e'), "2\r\nhi\r\n0\r\nX-T: " + std::string(3 << 20, 't')}) {
    const std::string answer = exchangeRaw(service.port(), head + endless);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 400")) << answer.substr(0, 200);
    EXPECT_NE(answer.find("a chunk's size line or the trailer is longer than this server reads"),
              std::string::npos)
        << answer.substr(0, 400);
  }
  const std::string closing =
      "POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string after = exchangeRaw(service.port(), closing + "2\r\nhi\r\n0\r\nX-T: t\r\n\r\n");
  EXPECT_TRUE(after.starts_with("HTTP/1.1 200") && after.ends_with("\r\n\r\nhi")) << after;
}

// RFC 9112 section 3.2: an HTTP/1.1 request without a Host header, or any
// with two, is a 400 naming it; an HTTP/1.0 request may leave it out. An
// absolute-form target (section 3.2.2: "http://host/path", which a server
// must accept) is routed by its path and query.
TEST(HttpService, HostIsRequiredOnceAndAbsoluteFormTargetsAreRouted) {
  Service service;
  const std::string none =
      exchangeRaw(service.port(), "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_TRUE(none.starts_with("HTTP/1.1 400")) << none;
  EXPECT_NE(none.find("an HTTP/1.1 request must have a Host header"), std::string::npos) << none;
  const std::string two = exchangeRaw(
      service.port(), "POST /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_TRUE(two.starts_with("HTTP/1.1 400")) << two;
  EXPECT_NE(two.find("more than one Host header"), std::string::npos) << two;
  // Refused from its head: a body announced and never sent is not waited for.
  const auto start = std::chrono::steady_clock::now();
  const std::string unsent =
      exchangeRaw(service.port(), "POST /echo HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n");
  EXPECT_TRUE(unsent.starts_with("HTTP/1.1 400")) << unsent;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(9));
  const std::string old =
      exchangeRaw(service.port(), "POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_TRUE(old.starts_with("HTTP/1.1 200") && old.ends_with("\r\n\r\nhi")) << old;

  const std::string absolute = exchangeRaw(
      service.port(),
      "POST hTTp://t:8000/echo HTTP/1.1\r\nHost: t:8000\r\nContent-Length: 2\r\nConnection: "
      "close\r\n\r\nhi");
  EXPECT_TRUE(absolute.starts_with("HTTP/1.1 200") && absolute.ends_with("\r\n\r\nhi")) << absolute;
  const std::string bare = exchangeRaw(
      service.port(), "GET https://t?x=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(bare.starts_with("HTTP/1.1 404")) << bare;
  EXPECT_NE(bare.find("no route for GET /\""), std::string::npos) << bare;
}

// A streamed answer to an HTTP/1.0 client is not chunked (RFC 9112 allows no
// Transfer-Encoding for it): its body ends with the connection. A HEAD of a
// streamed GET gets the head and no body.
TEST(HttpService, StreamsToHttp10ClientsAreNotChunkedAndHeadGetsNoBody) {
  Service service;
  const std::string old = exchangeRaw(service.port(), "GET /chunks HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(old.starts_with("HTTP/1.1 200")) << old;
  EXPECT_EQ(old.find("Transfer-Encoding"), std::string::npos) << old;
  EXPECT_TRUE(old.ends_with("\r\n\r\nonetwo")) << old;

  const std::string head = exchangeRaw(service.port(), "HEAD /chunks HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(head.starts_with("HTTP/1.1 200")) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  EXPECT_EQ(head.find("one"), std::string::npos) << head;

  // HTTP/1.1 is chunked as before.
  auto res = service.client().Get("/chunks");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "onetwo");
  EXPECT_EQ(res->get_header_value("Transfer-Encoding"), "chunked");
}

TEST(HttpService, LargeRequestsBeyondTheLimitAreA503WithRetryAfterUntilOneEnds) {
  HttpLimits limits;
  limits.large_body_bytes = 1024;
  limits.max_large_requests = 1;
  Service service(limits);
  const std::string large(2000, 'x');
  HeldRequest held(service, large);
  ASSERT_TRUE(eventually([&] { return service.gate().entered() == 1; }));

  // A second large body is refused before it is read; small ones pass.
  auto refused = service.client().Post("/echo", large, "text/plain");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  EXPECT_EQ(refused->get_header_value("X-Request-Id").size(), 32u);
  json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["type"], "service_unavailable");
  EXPECT_NE(error["message"].get<std::string>().find("over 1024 bytes"), std::string::npos)
      << refused->body;
  auto small = service.client().Post("/echo", "small", "text/plain");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200);
  EXPECT_EQ(small->body, "small");

  held.finish();
  EXPECT_EQ(held.status, 200);
  EXPECT_EQ(held.body, "2000");
  // The slot comes back once the answer is written (the server lets it go
  // after the last byte, which the client may read first): a large body is
  // then served again.
  std::string again_body;
  EXPECT_TRUE(eventually([&] {
    auto again = service.client().Post("/echo", large, "text/plain");
    if (!again || again->status != 200) return false;
    again_body = again->body;
    return true;
  }));
  EXPECT_EQ(again_body, large);
}

// One response from a keep-alive connection (Content-Length framed); "" when
// the connection closes first or nothing comes within 10 s.
std::string readResponse(int fd) {
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string text;
  char buffer[4096];
  for (;;) {
    const size_t head_end = text.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      const size_t field = text.find("Content-Length: ");
      const size_t length = field < head_end ? std::stoul(text.substr(field + 16)) : 0;
      if (text.size() >= head_end + 4 + length) return text;
    }
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return "";
    text.append(buffer, static_cast<size_t>(n));
  }
}

// The server closed `fd` (end of stream within 10 s, nothing else sent).
bool closedByServer(int fd) {
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char byte;
  return ::recv(fd, &byte, 1, 0) == 0;
}

// A large body takes one of few slots while it arrives. A client without
// the API key is answered 401 on its head, before it takes one: two slow
// uploads without a key made every large or chunked body 503 for as long
// as they went on.
TEST(HttpService, ALargeBodyWithoutTheApiKeyIsRefusedBeforeItTakesASlot) {
  HttpLimits limits;
  limits.large_body_bytes = 1024;
  limits.max_large_requests = 1;
  Service service(limits, "secret-key");
  std::vector<int> stalled;
  for (const char* framing : {"Content-Length: 2000", "Transfer-Encoding: chunked"}) {
    SCOPED_TRACE(framing);
    const int fd = connectLoopback(service.port());
    ASSERT_GE(fd, 0);
    stalled.push_back(fd);
    // The head, then nothing of the body.
    ASSERT_TRUE(
        sendAll(fd, std::string("POST /echo HTTP/1.1\r\nHost: t\r\n") + framing + "\r\n\r\n"));
    const std::string answer = readResponse(fd);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
    EXPECT_NE(answer.find("invalid_api_key"), std::string::npos) << answer;
  }
  // The one slot is free: an authorized large body is served.
  httplib::Client client = service.client();
  client.set_bearer_token_auth("secret-key");
  auto served = client.Post("/echo", std::string(2000, 'x'), "text/plain");
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200);
  EXPECT_EQ(served->body.size(), 2000u);
  for (int fd : stalled) ::close(fd);
}

// Connection field lines form one list (RFC 9110 section 7.6.1): "close" in
// the second line closes the connection after the answer, as in the first.
TEST(HttpService, CloseInAnyConnectionLineClosesTheConnection) {
  Service service;
  const int fd = connectLoopback(service.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(sendAll(fd,
                      "GET /nowhere HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n"
                      "Connection: close\r\n\r\n"));
  const std::string answer = readResponse(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 404")) << answer;
  EXPECT_TRUE(closedByServer(fd));
  ::close(fd);
}

// RFC 9112 section 2.2: empty lines before a request line are ignored,
// whether first on the connection or after a body; they count against the
// head's bound, so a connection sending nothing else is refused at it.
TEST(HttpService, EmptyLinesBeforeARequestLineAreIgnored) {
  Service service;
  const std::string echo = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi";
  const std::string last =
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
  const std::string answer = exchangeRaw(service.port(), "\r\n\n" + echo + "\r\n" + last);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer.substr(0, 200);
  EXPECT_NE(answer.find("\r\n\r\nhiHTTP/1.1 200"), std::string::npos) << answer;
  EXPECT_TRUE(answer.ends_with("\r\n\r\nok")) << answer;

  // A CR alone is not an empty line.
  const std::string bare_cr = exchangeRaw(service.port(), "\r" + last);
  EXPECT_TRUE(bare_cr.starts_with("HTTP/1.1 400")) << bare_cr.substr(0, 200);

  std::string endless;
  while (endless.size() < 40000) endless += "\r\n";
  const std::string refused = exchangeRaw(service.port(), endless + last);
  EXPECT_TRUE(refused.starts_with("HTTP/1.1 431")) << refused.substr(0, 200);
}

constexpr const char* kNotFound = "GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n";
constexpr const char* kNotFoundThenClose =
    "GET /nowhere HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

// At max_connections, a new connection closes the one that has waited
// longest for a request (a second at least), and the others stay; the
// newcomer is served.
TEST(HttpService, OverTheConnectionBoundTheConnectionIdleLongestMakesRoom) {
  HttpLimits limits;
  limits.max_connections = 3;
  Service service(limits);
  ASSERT_EQ(service.frontStats().max_connections, 3);
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(connectLoopback(service.port()));
    ASSERT_TRUE(sendAll(clients.back(), kNotFound));
    EXPECT_TRUE(readResponse(clients.back()).starts_with("HTTP/1.1 404")) << i;
    // Idle in this order: the first longest.
    ASSERT_TRUE(eventually([&] { return service.frontStats().idle_connections == i + 1; }));
  }
  // Idle for less than a second, none is closed: the newcomer is over the
  // bound (a 503), and the three stay.
  const std::string early = exchangeRaw(service.port(), kNotFoundThenClose);
  EXPECT_TRUE(early.starts_with("HTTP/1.1 503")) << early;
  EXPECT_EQ(service.frontStats().idle_connections_closed, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string answer = exchangeRaw(service.port(), kNotFoundThenClose);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 404")) << answer;
  EXPECT_TRUE(closedByServer(clients[0]));
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(sendAll(clients[i], kNotFound)) << i;
    EXPECT_TRUE(readResponse(clients[i]).starts_with("HTTP/1.1 404")) << i;
  }
  const HttpFrontStats stats = service.frontStats();
  EXPECT_EQ(stats.idle_connections_closed, 1);
  EXPECT_EQ(stats.connections_refused, 1);
  for (int fd : clients) ::close(fd);
}

// At max_connections with every connection receiving or answering a
// request, a new one is answered 503 + Retry-After before its request's
// body is read, and closed, unless it asks for a path a probe, a scrape or
// a KV transfer call uses; the busy ones are served.
TEST(HttpService, OverTheConnectionBoundWithNoneIdleANewConnectionIsA503) {
  HttpLimits limits;
  limits.max_connections = 2;
  Service service(limits);
  std::vector<int> busy;
  for (int i = 0; i < 2; ++i) {
    busy.push_back(connectLoopback(service.port()));
    ASSERT_TRUE(sendAll(busy.back(), "GET /nowhere HTTP/1.1\r\nHost"));  // a head not ended yet
  }
  ASSERT_TRUE(eventually([&] {
    const HttpFrontStats stats = service.frontStats();
    return stats.open_connections == 2 && stats.idle_connections == 0;
  }));
  const std::string refused = exchangeRaw(service.port(), kNotFoundThenClose);
  ASSERT_TRUE(refused.starts_with("HTTP/1.1 503")) << refused;
  EXPECT_NE(refused.find("Retry-After: 1\r\n"), std::string::npos) << refused;
  EXPECT_NE(refused.find("Connection: close\r\n"), std::string::npos) << refused;
  const json error = json::parse(refused.substr(refused.find("\r\n\r\n") + 4))["error"];
  EXPECT_EQ(error["type"], "service_unavailable");
  EXPECT_NE(error["message"].get<std::string>().find(
                "already has 2 connections open, its limit (max_connections)"),
            std::string::npos)
      << error;
  // A probe's path is served (this service has no /health route: a 404).
  const std::string probe = exchangeRaw(service.port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_TRUE(probe.starts_with("HTTP/1.1 404")) << probe;
  EXPECT_NE(probe.find("Connection: close\r\n"), std::string::npos) << probe;
  const std::string transfer =
      exchangeRaw(service.port(),
                  "POST /v1/kv_transfer/x?a=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(transfer.starts_with("HTTP/1.1 404")) << transfer;
  // The two served over the bound counted as open while they were; the
  // server forgets them, and counts the refused one, just after their close
  // (the client may read the close first).
  EXPECT_TRUE(eventually([&] {
    const HttpFrontStats now = service.frontStats();
    return now.open_connections == 2 && now.connections_refused == 1;
  })) << service.frontStats().open_connections;
  HttpFrontStats stats = service.frontStats();
  EXPECT_EQ(stats.connections_refused, 1);
  EXPECT_EQ(stats.idle_connections_closed, 0);
  for (int fd : busy) {
    ASSERT_TRUE(sendAll(fd, ": t\r\n\r\n"));
    EXPECT_TRUE(readResponse(fd).starts_with("HTTP/1.1 404"));
    ::close(fd);
  }
  // Below the bound again once the server has seen them close.
  EXPECT_TRUE(eventually([&] { return service.frontStats().open_connections == 0; }));
  EXPECT_TRUE(exchangeRaw(service.port(), kNotFoundThenClose).starts_with("HTTP/1.1 404"));
}

// A connection whose request is being answered is never closed for room,
// however long it has waited; only an idle one is.
TEST(HttpService, AtTheConnectionBoundAConnectionBeingAnsweredIsNeverClosed) {
  HttpLimits limits;
  limits.max_connections = 2;
  Service service(limits);
  HeldRequest held(service, "x");
  ASSERT_TRUE(eventually([&] { return service.gate().entered() == 1; }));
  const int idle = connectLoopback(service.port());
  ASSERT_TRUE(sendAll(idle, kNotFound));
  EXPECT_TRUE(readResponse(idle).starts_with("HTTP/1.1 404"));
  ASSERT_TRUE(eventually([&] { return service.frontStats().idle_connections == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(exchangeRaw(service.port(), kNotFoundThenClose).starts_with("HTTP/1.1 404"));
  EXPECT_TRUE(closedByServer(idle));
  ::close(idle);
  // Both waited over a second; the one being answered stayed.
  held.finish();
  EXPECT_EQ(held.status, 200);
  EXPECT_EQ(service.frontStats().idle_connections_closed, 1);
}

// A flood over the bound: at most 64 connections wait for their head (2 s),
// the rest are closed at once; all are counted, none is left open, and
// afterwards a connection over the bound is answered again.
TEST(HttpService, AFloodOverTheConnectionBoundIsCountedClosedAndForgotten) {
  HttpLimits limits;
  limits.max_connections = 1;
  Service service(limits);
  const int busy = connectLoopback(service.port());
  ASSERT_TRUE(sendAll(busy, "GET /nowhere HTTP/1.1\r\nHost"));
  ASSERT_TRUE(eventually([&] {
    const HttpFrontStats stats = service.frontStats();
    return stats.open_connections == 1 && stats.idle_connections == 0;
  }));
  std::vector<int> flood;
  for (int i = 0; i < 80; ++i) flood.push_back(connectLoopback(service.port()));
  EXPECT_TRUE(eventually([&] { return service.frontStats().connections_refused == 80; }))
      << service.frontStats().connections_refused;
  EXPECT_EQ(service.frontStats().open_connections, 1);
  int closed = 0;
  for (int fd : flood) {
    closed += closedByServer(fd) ? 1 : 0;
    ::close(fd);
  }
  EXPECT_EQ(closed, 80);
  EXPECT_TRUE(exchangeRaw(service.port(), kNotFoundThenClose).starts_with("HTTP/1.1 503"));
  ASSERT_TRUE(sendAll(busy, ": t\r\n\r\n"));
  EXPECT_TRUE(readResponse(busy).starts_with("HTTP/1.1 404"));
  ::close(busy);
}

// By default the bound is half the descriptor limit (which bind() raised to
// the hard limit), at most 65,536.
TEST(HttpService, TheDefaultConnectionBoundIsHalfTheDescriptorLimit) {
  Service service;
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const int64_t expected =
      limit.rlim_cur == RLIM_INFINITY
          ? kAutoMaxConnections
          : std::min<int64_t>(kAutoMaxConnections, static_cast<int64_t>(limit.rlim_cur / 2));
  EXPECT_EQ(service.frontStats().max_connections, expected);
}

TEST(HttpService, OffloadedWorkIsCancelledWhenItsClientLeaves) {
  Service service;
  sendAndClose(service.port(), "POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_TRUE(eventually([&] { return service.slow().cancelled == 1; }))
      << "started " << service.slow().started;
  EXPECT_TRUE(eventually([&] { return service.slow().client_gone_seen.load(); }));
  // Both workers are free: a blocking route is answered.
  auto echo = service.client().Post("/echo", "still", "text/plain");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->body, "still");
}

TEST(HttpService, StoppingCancelsOffloadedWorkWhoseClientStays) {
  Service service;
  std::thread client([&] { service.client().Post("/slow", "hi", "text/plain"); });
  ASSERT_TRUE(eventually([&] { return service.slow().started == 1; }));
  service.stop();
  client.join();
  EXPECT_TRUE(eventually([&] { return service.slow().cancelled == 1; }))
      << "the work runs on to its own deadline";
}

}  // namespace
}  // namespace tandem::server
