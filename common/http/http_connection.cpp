#include "common/http/http_connection.h"

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/resource.h>

#include "common/check.h"
#include "common/hex.h"
#include "common/hmac.h"
#include "common/logging.h"
#include "common/status.h"

namespace tandem::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

namespace {

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string percentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() &&
               std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Heap memory freed by a large request goes back to the system at most this
// often (a trim walks the whole heap).
constexpr Clock::duration kTrimInterval = std::chrono::seconds(1);
// How long a refused request's remaining bytes are read and dropped.
constexpr std::chrono::seconds kLingerTimeout{2};
// Connections over HttpLimits::max_connections answered 503 at once; more
// are closed without an answer.
constexpr int kMaxRefusing = 64;
// At the connection bound, only connections idle this long are closed to
// make room: one accepted or answered just now may have a request on the way.
constexpr std::chrono::seconds kIdleBeforeClosing{1};

// A body over the large-body threshold, or of a length not known yet.
bool isLarge(const http::request_parser<http::string_body>& parser, const HttpLimits& limits) {
  const auto length = parser.content_length();
  return !length || *length > limits.large_body_bytes;
}

// What is wrong with a parsed request's head that the parser lets through
// (RFC 9112 section 3.2: a Host header, once, on every HTTP/1.1 request);
// empty when nothing is.
std::string headProblem(const http::request_header<>& message) {
  const size_t hosts = message.count(http::field::host);
  if (hosts > 1) return "more than one Host header";
  if (hosts == 0 && message.version() >= 11) return "an HTTP/1.1 request must have a Host header";
  return {};
}

// A transfer coding of the request other than chunked, which is all this
// server decodes (RFC 9112 section 6.1: a server that does not understand a
// coding answers 501); empty when there is none. Beast read "gzip,
// chunked" as plain chunked and handed on a body still gzipped.
std::string unknownTransferCoding(const http::request_header<>& message) {
  const auto [first, last] = message.equal_range(http::field::transfer_encoding);
  for (auto field = first; field != last; ++field) {
    // Beast's own reading of the list: codings, their parameters apart.
    for (const auto& coding : http::ext_list{field->value()}) {
      if (!boost::beast::iequals(coding.first, "chunked")) return std::string(coding.first);
    }
  }
  return {};
}

// What is wrong with the request's Transfer-Encoding besides an unknown
// coding (unknownTransferCoding): RFC 9112 section 6.1 lets a sender apply
// chunked once, as the final coding, and every field line is one list
// (RFC 9110 section 5.3). Beast read "chunked, chunked", or an empty value,
// as a request without a body, and the body's bytes as the next request: a
// proxy that reads the RFC sees one request where this server saw two.
// Empty when nothing is wrong (or there is no Transfer-Encoding).
std::string transferEncodingProblem(const http::request_header<>& message) {
  const auto [first, last] = message.equal_range(http::field::transfer_encoding);
  if (first == last) return {};
  size_t codings = 0;
  std::string listed;
  for (auto field = first; field != last; ++field) {
    const http::ext_list list{field->value()};
    codings += static_cast<size_t>(std::distance(list.begin(), list.end()));
    listed += (listed.empty() ? "" : ", ") + std::string(field->value());
  }
  if (codings == 1) return {};
  return "Transfer-Encoding must name chunked once, got \"" + listed + "\"";
}

// Whether any Connection field line lists "close": the lines are one list
// (RFC 9110 sections 5.3 and 7.6.1), and Beast's keep_alive() reads the
// first alone.
bool asksToClose(const http::request_header<>& message) {
  const auto [first, last] = message.equal_range(http::field::connection);
  for (auto field = first; field != last; ++field) {
    for (const auto& token : http::token_list{field->value()}) {
      if (boost::beast::iequals(token, "close")) return true;
    }
  }
  return false;
}

// The path and query of a request target: an absolute-form target
// ("http://host:port/path?query", which RFC 9112 section 3.2.2 says a
// server must accept) loses its scheme and authority; others are as sent.
std::string originForm(std::string_view target) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() < scheme.size() || !equalsIgnoreCase(target.substr(0, scheme.size()), scheme))
      continue;
    const std::string_view rest = target.substr(scheme.size());
    const size_t end = rest.find_first_of("/?");
    if (end == std::string_view::npos) return "/";
    if (rest[end] == '?') return "/" + std::string(rest.substr(end));
    return std::string(rest.substr(end));
  }
  return std::string(target);
}

// What to answer a request the parser refused.
// `buffer_max`: what the connection's buffer holds at most.
HttpResponse parseErrorResponse(const boost::system::error_code& ec, const HttpLimits& limits,
                                size_t buffer_max) {
  if (ec == http::error::body_limit) {
    return httpErrorResponse(413,
                             "the request body is larger than the limit of " +
                                 std::to_string(limits.max_body_bytes) + " bytes",
                             "invalid_request_error");
  }
  if (ec == http::error::header_limit) {
    return httpErrorResponse(431,
                             "the request line and headers are larger than the limit of " +
                                 std::to_string(limits.max_header_bytes) + " bytes",
                             "invalid_request_error");
  }
  std::string what;
  if (ec == http::error::buffer_overflow) {
    what = "a chunk's size line or the trailer is longer than this server reads (" +
           std::to_string(buffer_max) + " bytes)";
  } else if (ec == http::error::bad_content_length) {
    what = "invalid or conflicting Content-Length headers";
  } else if (ec == http::error::bad_field || ec == http::error::bad_value) {
    what = "a header line is not \"name: value\"";
  } else if (ec == http::error::bad_transfer_encoding) {
    what = "invalid Transfer-Encoding";
  } else {
    what = ec.message();
  }
  return httpErrorResponse(400, "malformed HTTP request: " + what, "invalid_request_error");
}

}  // namespace

// Built outside coroutines (GCC 12 cannot keep such JSON in a frame).
std::string httpErrorBody(const std::string& message, const std::string& type) {
  nlohmann::json body = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpResponse unauthorizedResponse() {
  nlohmann::json body = {
      {"error",
       {{"message",
         "a valid API key is required: send the header Authorization: Bearer <key> with the key "
         "this server was given (--api-key or TANDEM_API_KEY)"},
        {"type", "invalid_request_error"},
        {"param", nullptr},
        {"code", "invalid_api_key"}}}};
  HttpResponse response = httpJsonResponse(401, body.dump());
  response.set_header("WWW-Authenticate", "Bearer");
  return response;
}

std::string apiKeyFrom(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TANDEM_API_KEY");
  return env == nullptr ? std::string() : std::string(env);
}

std::vector<std::string> parseApiKeyExemptPaths(const std::string& csv, const std::string& flag) {
  std::vector<std::string> paths;
  size_t start = 0;
  while (start <= csv.size()) {
    const size_t comma = std::min(csv.find(',', start), csv.size());
    const std::string path = csv.substr(start, comma - start);
    if (!path.empty()) {
      if (path[0] != '/') {
        throw Error(flag + ": \"" + path + "\" is not a path; give paths starting with '/' " +
                    "(one ending in '/' is a prefix), separated by commas");
      }
      if (path == "/") {
        throw Error(flag + ": \"/\" is a prefix of every path: the API key would guard " +
                    "nothing; give the paths to serve without it (default " +
                    std::string(kDefaultApiKeyExemptPaths) + "), or no --api-key");
      }
      paths.push_back(path);
    }
    start = comma + 1;
  }
  return paths;
}

HttpResponse httpErrorResponse(int status, const std::string& message, const std::string& type) {
  HttpResponse response = httpJsonResponse(status, httpErrorBody(message, type));
  if (status == 503) response.set_header("Retry-After", "1");
  return response;
}

HttpResponse httpJsonResponse(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.set_content(std::move(body), "application/json");
  return response;
}

// ---------------------------------------------------------------------------
// HttpRequest

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (equalsIgnoreCase(key, name)) return value;
  }
  return "";
}

std::optional<std::string> HttpRequest::param(std::string_view name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (percentDecode(pair.substr(0, eq)) != name) continue;
    return eq == std::string_view::npos ? std::string() : percentDecode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// LargeRequest: one of HttpLimits::max_large_requests slots, held from a
// large request's head to the end of its answer.

class LargeRequest {
 public:
  explicit LargeRequest(HttpService& service) : service_(service) {}
  ~LargeRequest() {
    if (entered_) service_.leaveLarge();
  }
  LargeRequest(const LargeRequest&) = delete;
  LargeRequest& operator=(const LargeRequest&) = delete;

  // False when every slot is taken.
  bool enter() {
    entered_ = service_.enterLarge();
    return entered_;
  }

 private:
  HttpService& service_;
  bool entered_ = false;
};

// ---------------------------------------------------------------------------
// HttpConnection

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `over_bound`: accepted over HttpLimits::max_connections with none idle
  // to close (session() serves only the paths exempt from the bound).
  HttpConnection(HttpService& service, tcp::socket socket, bool over_bound)
      : service_(service),
        strand_(socket.get_executor()),
        socket_(std::move(socket)),
        deadline_(strand_),
        signal_(strand_),
        over_bound_(over_bound) {
    // What the buffer may hold: the read-ahead while a request is answered
    // (startWatch), a head up to its bound (readHead), and room for a
    // body's reads. Beast's body reading keeps a chunk's size line
    // (extensions) and the trailer in it until they end, so without a bound
    // a client could grow it for as long as the request timeout lets it.
    const HttpLimits& limits = service.limits();
    buffer_.max_size(std::max({limits.max_pipelined_bytes + 4096, limits.max_header_bytes + 1,
                               size_t{1} << 20}) +
                     65536);
  }

  ~HttpConnection() {
    if (waker_) waker_->disable();
  }

  using Strand = asio::strand<asio::any_io_executor>;
  const Strand& strand() const { return strand_; }

  bool overBound() const { return over_bound_; }
  // Over the bound, its request was one of the paths served there.
  bool servedOverBound() const { return served_over_bound_; }

  // Steady-clock ticks since this connection began waiting for a request
  // with nothing buffered; 0 while it is receiving or answering one.
  int64_t idleSince() const { return idle_since_.load(std::memory_order_relaxed); }

  // Closes the connection from any thread if, once on its strand, it is
  // still in the wait for a request that began at `since` (not a later one)
  // and nothing of one has arrived (a request that got there first is
  // served); counts it as closed for room.
  void closeIfIdle(int64_t since) {
    asio::post(strand_, [self = shared_from_this(), since] {
      boost::system::error_code ec;
      if (self->idleSince() != since || self->socket_.available(ec) > 0 || ec) return;
      // Counted first: a client that sees the close finds it counted.
      self->service_.countIdleClosed();
      self->socket_.close(ec);
    });
  }

  // Closes the socket from any thread; the session then ends.
  void close() {
    asio::post(strand_, [self = shared_from_this()] {
      boost::system::error_code ec;
      self->socket_.close(ec);
      self->signal_.cancel();
    });
  }

  awaitable<void> session() {
    const HttpLimits& limits = service_.limits();
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
      parser.body_limit(limits.max_body_bytes);
      boost::system::error_code ec;
      // Over the bound, the request's head must come at once.
      const std::chrono::seconds head_timeout =
          over_bound_ ? kLingerTimeout : limits.request_timeout;
      if (buffer_.size() == 0) {
        arm(over_bound_ ? kLingerTimeout : limits.idle_timeout);
        if (!over_bound_) setIdle(true);
        co_await socket_.async_wait(tcp::socket::wait_read,
                                    asio::redirect_error(use_awaitable, ec));
        setIdle(false);
        if (ec) break;
      }
      arm(head_timeout);
      co_await readHead(parser, limits.max_header_bytes, ec);
      if (!ec) {
        if (std::string problem = headProblem(parser.get()); !problem.empty()) {
          co_await refuse(httpErrorResponse(400, "malformed HTTP request: " + problem,
                                            "invalid_request_error"));
          break;
        }
        if (std::string coding = unknownTransferCoding(parser.get()); !coding.empty()) {
          co_await refuse(httpErrorResponse(
              501,
              "the transfer coding \"" + coding +
                  "\" is not implemented; send the body with Content-Length or chunked",
              "not_implemented_error"));
          break;
        }
        if (std::string problem = transferEncodingProblem(parser.get()); !problem.empty()) {
          co_await refuse(httpErrorResponse(400, "malformed HTTP request: " + problem,
                                            "invalid_request_error"));
          break;
        }
      }
      if (!ec && over_bound_) {
        served_over_bound_ =
            service_.servedOverBound(originForm(std::string(parser.get().target())));
        if (!served_over_bound_) {
          std::string message = "the server already has " +
                                std::to_string(service_.maxConnections()) +
                                " connections open, its limit (max_connections), and none is "
                                "idle; retry later";
          co_await refuseBeforeBody(std::move(message));
          break;
        }
        // Served like any request (then closed, as its answer says), it
        // counts among the open connections (over the bound): a long one (a
        // KV event stream) keeps no refusal slot.
        service_.countOverBoundServed();
        arm(limits.request_timeout);
      }
      // A large body takes one of few slots while it arrives: a client
      // without the API key is answered before it can take one (two slow
      // uploads would otherwise refuse everyone's large bodies).
      if (!ec && !parser.is_done() && isLarge(parser, limits) &&
          !service_.authorized(originForm(std::string(parser.get().target())),
                               std::string(parser.get()[http::field::authorization]))) {
        co_await refuse(unauthorizedResponse());
        break;
      }
      LargeRequest large(service_);
      if (!ec && !parser.is_done() && isLarge(parser, limits) && !large.enter()) {
        std::string message =
            "the server is already handling " + std::to_string(limits.max_large_requests) +
            " requests with bodies over " + std::to_string(limits.large_body_bytes) +
            " bytes (or of unknown length), its limit; retry later";
        co_await refuseBeforeBody(std::move(message));
        break;
      }
      if (!ec && !parser.is_done() &&
          equalsIgnoreCase(std::string(parser.get()[http::field::expect]), "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        co_await asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                                   asio::redirect_error(use_awaitable, ec));
      }
      if (!ec && !parser.is_done()) {
        co_await http::async_read(socket_, buffer_, parser,
                                  asio::redirect_error(use_awaitable, ec));
      }
      disarm();
      if (ec) {
        // A refused request is answered; a closed, reset or timed-out
        // connection is just closed.
        if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
            ec != http::error::end_of_stream && ec != http::error::partial_message) {
          co_await refuse(parseErrorResponse(ec, limits, buffer_.max_size()));
        }
        break;
      }
      http::request<http::string_body> message = parser.release();
      HttpRequest request;
      request.method = std::string(message.method_string());
      const std::string target = originForm(std::string(message.target()));
      const size_t question = target.find('?');
      request.path = std::string(target.substr(0, question));
      if (question != std::string_view::npos)
        request.query = std::string(target.substr(question + 1));
      request.body = std::move(message.body());
      for (const auto& field : message) {
        request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
      }
      request.id = service_.nextRequestId();
      if (const std::string given = request.header(kRequestIdHeader);
          !given.empty() && given.size() <= 256 &&
          given.find_first_not_of(kRequestIdChars) == std::string::npos) {
        request.id = given + "-" + request.id;
      }
      keep_alive_ = message.keep_alive() && !asksToClose(message) && !over_bound_;
      head_ = message.method() == http::verb::head;
      http10_ = message.version() < 11;

      HttpExchange exchange(*this, service_, std::move(request));
      std::string failure;
      try {
        co_await service_.dispatch(exchange);
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown exception";
      }
      if (!failure.empty()) {
        // The one place an escaped exception becomes an answer.
        TANDEM_LOG(kError) << "request " << exchange.request().id << " "
                           << exchange.request().method << " " << exchange.request().path
                           << ": internal error: " << failure;
        if (exchange.started_ || exchange.broken_) break;
        HttpResponse response = httpErrorResponse(
            500,
            "internal error while handling the request (request id " + exchange.request().id + ")",
            "server_error");
        const bool written = co_await exchange.respond(std::move(response));
        if (!written) break;
      }
      co_await stopWatch();
      if (exchange.broken_ || client_gone_ || !keep_alive_ || over_bound_ ||
          (exchange.started_ && !chunk_done_)) {
        break;
      }
      chunk_done_ = false;
    }
    disarm();
    setIdle(false);
    co_await stopWatch();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // A 503 (`message`) for a request refused before its body is read (or,
  // with Expect: 100-continue, sent): the body never costs memory. The
  // connection is closed after it.
  awaitable<void> refuseBeforeBody(std::string message) {
    co_await refuse(httpErrorResponse(503, message, "service_unavailable"));
  }

  // Answers a refused request (`response`, given a request id here), then
  // closes the connection once the client has had time to read it.
  awaitable<void> refuse(HttpResponse response) {
    disarm();
    response.headers.emplace_back(kRequestIdHeader, service_.nextRequestId());
    const bool written = co_await write(std::move(response), /*keep_alive=*/false, /*head=*/false);
    if (written) co_await lingeringClose();
  }

  // Reads a request's head into `parser`, never holding more than
  // `max_bytes` of it. Beast's own bound counts only the bytes of one read
  // it has not parsed yet, while the fields it has parsed pile up in the
  // message: a head sent in pieces that each end inside a line grew without
  // bound until its end, and was refused only then. Here the bytes taken
  // and those waiting are counted as they come. `ec` as async_read_header
  // sets it: end_of_stream when the connection closed before a byte,
  // partial_message when it closed mid-head, header_limit past the bound.
  awaitable<void> readHead(http::request_parser<http::string_body>& parser, size_t max_bytes,
                           boost::system::error_code& ec) {
    parser.eager(false);
    size_t taken = 0;
    for (;;) {
      if (!parser.got_some()) taken += skipEmptyLines();
      if (buffer_.size() > 0 && (parser.got_some() || !holdsOnlyACarriageReturn())) {
        const size_t used = parser.put(buffer_.data(), ec);
        buffer_.consume(used);
        taken += used;
        if (!ec && parser.is_header_done()) {
          if (taken > max_bytes) ec = http::error::header_limit;
          co_return;
        }
        if (ec && ec != http::error::need_more) co_return;
        ec = {};
      }
      // An unfinished head is longer than what it has sent so far.
      if (taken + buffer_.size() >= max_bytes) {
        ec = http::error::header_limit;
        co_return;
      }
      const size_t room = std::min<size_t>(max_bytes - taken - buffer_.size(), 65535) + 1;
      const size_t got = co_await socket_.async_read_some(buffer_.prepare(room),
                                                          asio::redirect_error(use_awaitable, ec));
      buffer_.commit(got);
      if (ec == asio::error::eof) {
        if (parser.got_some()) {
          ec = {};
          parser.put_eof(ec);
          if (!ec) ec = http::error::partial_message;
        } else {
          ec = http::error::end_of_stream;
        }
        co_return;
      }
      if (ec) co_return;
    }
  }

  // Drops the empty lines (CRLF or a bare LF) before a request line, as
  // RFC 9112 section 2.2 asks of a server: some clients send one after a
  // body. Returns how many bytes it dropped; they count against the head's
  // bound. A CR that ends the buffer waits for what follows it.
  size_t skipEmptyLines() {
    const auto* bytes = static_cast<const char*>(buffer_.data().data());
    const size_t size = buffer_.size();
    size_t skipped = 0;
    while (skipped < size) {
      if (bytes[skipped] == '\n') {
        skipped += 1;
      } else if (bytes[skipped] == '\r' && skipped + 1 < size && bytes[skipped + 1] == '\n') {
        skipped += 2;
      } else {
        break;
      }
    }
    buffer_.consume(skipped);
    return skipped;
  }
  bool holdsOnlyACarriageReturn() const {
    return buffer_.size() == 1 && *static_cast<const char*>(buffer_.data().data()) == '\r';
  }

  // After answering a request whose rest was not read: the answer is sent,
  // then what the client still sends is read and dropped for a moment, so
  // that closing with unread bytes does not reset the connection before
  // the client has read the answer.
  awaitable<void> lingeringClose() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) co_return;
    arm(kLingerTimeout);
    char sink[16384];
    while (!ec) {
      co_await socket_.async_read_some(asio::buffer(sink), asio::redirect_error(use_awaitable, ec));
    }
    disarm();
  }

  // ---- used by HttpExchange -------------------------------------------------

  void watch() { startWatch(); }
  std::function<void()> swapOnGone(std::function<void()> callback) {
    std::swap(on_gone_, callback);
    return callback;
  }

  awaitable<bool> write(HttpResponse response, bool keep_alive, bool head) {
    http::response<http::string_body> message{static_cast<http::status>(response.status), 11};
    message.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) message.set(name, value);
    message.keep_alive(keep_alive);
    message.body() = std::move(response.body);
    message.prepare_payload();
    if (head) message.body().clear();  // Content-Length stays that of the GET
    arm(service_.limits().write_timeout);
    boost::system::error_code ec;
    co_await http::async_write(socket_, message, asio::redirect_error(use_awaitable, ec));
    disarm();
    co_return !ec;
  }

  awaitable<bool> writeHead(int status, std::string content_type, HttpHeaders headers) {
    http::response<http::empty_body> head{static_cast<http::status>(status), 11};
    head.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) head.set(name, value);
    if (http10_) {
      // No chunked encoding for an HTTP/1.0 client (RFC 9112 6.1): the body
      // ends with the connection.
      keep_alive_ = false;
    } else {
      head.chunked(true);
    }
    head.keep_alive(keep_alive_);
    http::response_serializer<http::empty_body> serializer(head);
    arm(service_.limits().write_timeout);
    boost::system::error_code ec;
    co_await http::async_write_header(socket_, serializer, asio::redirect_error(use_awaitable, ec));
    disarm();
    co_return !ec;
  }

  template <typename Buffers>
  awaitable<bool> writeRaw(const Buffers& buffers) {
    arm(service_.limits().write_timeout);
    boost::system::error_code ec;
    co_await asio::async_write(socket_, buffers, asio::redirect_error(use_awaitable, ec));
    disarm();
    co_return !ec;
  }

  awaitable<bool> wait(std::optional<Clock::duration> timeout) {
    startWatch();
    if (client_gone_) co_return false;
    // A wake that came while the route was busy elsewhere (writing) counts.
    if (woken_) {
      woken_ = false;
      co_return true;
    }
    if (timeout) {
      signal_.expires_after(*timeout);
    } else {
      signal_.expires_at(Clock::time_point::max());
    }
    boost::system::error_code ec;
    co_await signal_.async_wait(asio::redirect_error(use_awaitable, ec));
    woken_ = false;
    co_return !client_gone_;
  }

  std::shared_ptr<HttpWaker> waker() {
    if (!waker_) waker_ = std::make_shared<Waker>(weak_from_this(), strand_);
    return waker_;
  }

  bool keepAlive() const { return keep_alive_; }
  bool head() const { return head_; }
  bool http10() const { return http10_; }
  void markChunkDone() { chunk_done_ = true; }
  bool clientGone() const { return client_gone_; }

 private:
  class Waker : public HttpWaker {
   public:
    Waker(std::weak_ptr<HttpConnection> connection, Strand strand)
        : connection_(std::move(connection)), strand_(std::move(strand)) {}
    void wake() override {
      std::lock_guard<std::mutex> lock(mutex_);
      if (disabled_) return;
      asio::post(strand_, [connection = connection_] {
        if (auto self = connection.lock()) {
          self->woken_ = true;
          self->signal_.cancel();
        }
      });
    }
    void disable() {
      std::lock_guard<std::mutex> lock(mutex_);
      disabled_ = true;
    }

   private:
    std::mutex mutex_;
    bool disabled_ = false;
    std::weak_ptr<HttpConnection> connection_;
    Strand strand_;
  };

  // Marks the connection waiting for a request, or not, here and in the
  // service's list of idle connections (HttpService::closeIdlest).
  void setIdle(bool idle) {
    const int64_t since = idle_since_.load(std::memory_order_relaxed);
    if (idle == (since != 0)) return;
    const int64_t now = idle ? std::max<int64_t>(1, Clock::now().time_since_epoch().count()) : 0;
    idle_since_.store(now, std::memory_order_relaxed);
    service_.setIdle(this, idle ? now : since, idle);
  }

  // Closes the socket when the deadline passes (the pending operation then
  // fails); re-arming or disarming cancels the previous deadline.
  void arm(std::chrono::seconds timeout) {
    deadline_.expires_after(timeout);
    deadline_.async_wait(asio::bind_executor(
        strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
          if (ec || self->deadline_.expiry() > Clock::now()) return;
          boost::system::error_code ignored;
          self->socket_.close(ignored);
        }));
  }
  void disarm() { deadline_.expires_at(Clock::time_point::max()); }

  // While a request is answered, a read on the socket tells whether the
  // client went away (EOF or error); bytes that arrive meanwhile (the next
  // pipelined request) are kept for the next read.
  void startWatch() {
    if (watching_ || client_gone_ || stop_watch_ ||
        buffer_.size() >= service_.limits().max_pipelined_bytes) {
      return;
    }
    watching_ = true;
    socket_.async_read_some(
        buffer_.prepare(4096),
        asio::bind_executor(
            strand_, [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
              self->watching_ = false;
              if (!ec) {
                self->buffer_.commit(n);
                self->startWatch();
              } else if (ec != asio::error::operation_aborted) {
                self->client_gone_ = true;
                if (self->on_gone_) {
                  std::function<void()> callback = self->on_gone_;
                  callback();
                }
              }
              self->signal_.cancel();
            }));
  }

  awaitable<void> stopWatch() {
    stop_watch_ = true;
    if (watching_) {
      boost::system::error_code ec;
      socket_.cancel(ec);
      while (watching_) {
        signal_.expires_at(Clock::time_point::max());
        co_await signal_.async_wait(asio::redirect_error(use_awaitable, ec));
      }
    }
    stop_watch_ = false;
    on_gone_ = nullptr;
  }

  HttpService& service_;
  Strand strand_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  asio::steady_timer deadline_;
  asio::steady_timer signal_;  // wait(): cancelled to wake the coroutine
  std::shared_ptr<Waker> waker_;
  std::function<void()> on_gone_;  // OnClientGone's callback
  bool woken_ = false;             // wake() came; consumed by the next wait()
  bool watching_ = false;
  bool stop_watch_ = false;
  bool client_gone_ = false;
  bool keep_alive_ = true;
  bool head_ = false;
  bool http10_ = false;  // the request's version is HTTP/1.0
  bool chunk_done_ = false;
  std::atomic<int64_t> idle_since_{0};  // read by the accept loop (closeIdlest)
  const bool over_bound_;
  bool served_over_bound_ = false;
};

// ---------------------------------------------------------------------------
// HttpExchange

awaitable<bool> HttpExchange::respond(HttpResponse response) {
  TANDEM_CHECK(!started_, "a response was already started");
  started_ = true;
  connection_.markChunkDone();
  response.headers.emplace_back(kRequestIdHeader, request_.id);
  const bool ok =
      co_await connection_.write(std::move(response), connection_.keepAlive(), connection_.head());
  if (!ok) broken_ = true;
  co_return ok;
}

awaitable<bool> HttpExchange::startChunked(int status, std::string content_type,
                                           HttpHeaders headers) {
  TANDEM_CHECK(!started_, "a response was already started");
  started_ = true;
  headers.emplace_back(kRequestIdHeader, request_.id);
  const bool ok =
      co_await connection_.writeHead(status, std::move(content_type), std::move(headers));
  if (!ok) broken_ = true;
  co_return ok;
}

awaitable<bool> HttpExchange::writeProcessing(HttpHeaders headers) {
  TANDEM_CHECK(!started_, "an interim answer after the response began");
  if (broken_) co_return false;
  std::string interim = "HTTP/1.1 102 Processing\r\n";
  for (const auto& [name, value] : headers) interim += name + ": " + value + "\r\n";
  interim += "\r\n";
  const bool ok = co_await connection_.writeRaw(asio::buffer(interim));
  if (!ok) broken_ = true;
  co_return ok;
}

awaitable<bool> HttpExchange::writeChunk(std::string data) {
  if (broken_) co_return false;
  // A HEAD has no body: the route's stream ends here, as for a client gone.
  if (connection_.head()) co_return false;
  if (data.empty()) co_return true;  // an empty chunk would end the body
  bool ok;
  if (connection_.http10()) {
    ok = co_await connection_.writeRaw(asio::buffer(data));
  } else {
    ok = co_await connection_.writeRaw(http::make_chunk(asio::buffer(data)));
  }
  if (!ok) broken_ = true;
  co_return ok;
}

awaitable<bool> HttpExchange::finishChunked() {
  if (broken_) co_return false;
  if (connection_.head() || connection_.http10()) {
    // Nothing to write: no body, or one that ends with the connection.
    connection_.markChunkDone();
    co_return true;
  }
  const bool ok = co_await connection_.writeRaw(http::make_chunk_last());
  if (!ok) broken_ = true;
  if (ok) connection_.markChunkDone();
  co_return ok;
}

awaitable<bool> HttpExchange::wait(std::optional<Clock::duration> timeout) {
  if (broken_) co_return false;
  co_return co_await connection_.wait(timeout);
}

std::shared_ptr<HttpWaker> HttpExchange::waker() { return connection_.waker(); }

bool HttpExchange::clientGone() const { return broken_ || connection_.clientGone(); }

void HttpExchange::watchClient() {
  if (!broken_) connection_.watch();
}

std::function<void()> HttpExchange::swapOnGone(std::function<void()> callback) {
  return connection_.swapOnGone(std::move(callback));
}

// ---------------------------------------------------------------------------
// OnClientGone

OnClientGone::OnClientGone(HttpExchange& exchange, std::function<void()> cancel)
    : exchange_(exchange) {
  exchange_.watchClient();
  if (exchange_.clientGone()) cancel();
  previous_ = exchange_.swapOnGone(std::move(cancel));
}

OnClientGone::~OnClientGone() { exchange_.swapOnGone(std::move(previous_)); }

// ---------------------------------------------------------------------------
// HttpService

namespace {

// Whether `path` is one of `paths`, an entry ending in '/' being a prefix
// (the API key's exempt paths, those served over the connection bound).
bool matchesPath(const std::vector<std::string>& paths, std::string_view path) {
  return std::any_of(paths.begin(), paths.end(), [&](const std::string& entry) {
    return entry.ends_with('/') ? path.starts_with(entry) : path == entry;
  });
}

// HttpLimits::max_connections, or for 0 half the soft descriptor limit (at
// least 1, at most kAutoMaxConnections).
int64_t connectionBound(const HttpLimits& limits) {
  if (limits.max_connections > 0) return limits.max_connections;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return kAutoMaxConnections;
  }
  return std::clamp<int64_t>(static_cast<int64_t>(limit.rlim_cur / 2), 1, kAutoMaxConnections);
}

}  // namespace

HttpService::HttpService(HttpLimits limits, int io_threads, int worker_threads)
    : limits_(limits),
      io_threads_(std::max(1, io_threads)),
      max_connections_(connectionBound(limits)),
      workers_(static_cast<size_t>(std::max(1, worker_threads))),
      acceptor_(ioc_) {}

HttpService::~HttpService() {
  stop();
  join();
  workers_.join();
  waiters_.join();
}

void HttpService::route(std::string method, std::string path, HttpRoute handler) {
  routes_[method + " " + path] = std::move(handler);
}

void HttpService::route(std::string method, std::string path, HttpPlainRoute handler,
                        RouteWork work) {
  route(std::move(method), std::move(path),
        [handler = std::move(handler), work](HttpExchange& exchange) -> awaitable<void> {
          HttpResponse response;
          if (work == RouteWork::kInline) {
            handler(exchange.request(), response);
          } else {
            const HttpRequest* request = &exchange.request();
            std::function<HttpResponse()> call = [&handler, request] {
              HttpResponse out;
              handler(*request, out);
              return out;
            };
            // (No co_await inside ?: — GCC 12 builds both operands' arguments.)
            if (work == RouteWork::kWait) {
              response = co_await exchange.offloadWait<HttpResponse>(call);
            } else {
              response = co_await exchange.offload<HttpResponse>(call);
            }
          }
          co_await exchange.respond(std::move(response));
        });
}

namespace {

// A server holds a descriptor per connection: the soft limit (often 1024)
// goes up to the hard one, once per process.
void raiseOpenFileLimit() {
  static const bool raised = [] {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return false;
    limit.rlim_cur = limit.rlim_max;
    return ::setrlimit(RLIMIT_NOFILE, &limit) == 0;
  }();
  (void)raised;
}

}  // namespace

void checkConnectionBound(int64_t max_connections) {
  if (max_connections <= 0) return;
  raiseOpenFileLimit();
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const auto most = static_cast<int64_t>(limit.rlim_cur / 2);
  if (max_connections <= most) return;
  throw Error("--max-connections " + std::to_string(max_connections) +
              " is more than half the descriptors this process may open (" +
              std::to_string(limit.rlim_cur) +
              ", RLIMIT_NOFILE: the other half is kept for its own connections, files and KV "
              "transfers); give at most " +
              std::to_string(most) + ", or raise the limit (ulimit -n, a container's nofile)");
}

asio::ip::address listenAddress(const std::string& host, int port) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return address;
  asio::io_context context;
  tcp::resolver resolver(context);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                ": not an IP address, nor a host name this machine resolves" +
                (ec ? " (" + ec.message() + ")" : std::string()));
  }
  return results.begin()->endpoint().address();
}

int HttpService::bind(const std::string& host, int port, int backlog) {
  raiseOpenFileLimit();
  max_connections_ = connectionBound(limits_);
  boost::system::error_code ec;
  tcp::endpoint endpoint(listenAddress(host, port), static_cast<unsigned short>(port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(backlog, ec);
  if (ec)
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  return acceptor_.local_endpoint().port();
}

void HttpService::serve() {
  if (stopping_) return;
  serving_ = true;
  auto work = asio::make_work_guard(ioc_);
  asio::co_spawn(ioc_, acceptLoop(), asio::detached);
  std::vector<std::thread> threads;
  for (int i = 1; i < io_threads_; ++i) threads.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (auto& thread : threads) thread.join();
}

void HttpService::start() {
  if (stopping_ || serving_) return;
  serving_ = true;
  work_.emplace(asio::make_work_guard(ioc_));
  asio::co_spawn(ioc_, acceptLoop(), asio::detached);
  for (int i = 0; i < io_threads_; ++i) threads_.emplace_back([this] { ioc_.run(); });
}

void HttpService::join() {
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

void HttpService::stopAccepting() {
  if (accepting_stopped_.exchange(true)) return;
  asio::post(ioc_, [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
  });
}

void HttpService::stop() {
  if (stopping_.exchange(true)) return;
  stopAccepting();
  {
    // Offloaded work nobody will read ends early.
    std::lock_guard<std::mutex> lock(cancels_mutex_);
    for (std::atomic<bool>* cancel : cancels_) *cancel = true;
  }
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    for (auto& [raw, weak] : connections_) {
      if (auto connection = weak.lock()) connection->close();
    }
  }
  // Let the closes run, then end the io threads.
  asio::post(ioc_, [this] { ioc_.stop(); });
  if (!serving_) ioc_.stop();
}

awaitable<void> HttpService::acceptLoop() {
  while (!stopping_) {
    boost::system::error_code ec;
    tcp::socket socket(asio::make_strand(ioc_));
    co_await acceptor_.async_accept(socket, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (stopping_ || ec == asio::error::operation_aborted) co_return;
      // E.g. out of descriptors: the connection stays in the backlog and the
      // next accept fails at once, so wait a little (connections already
      // open go on being served) rather than spin an io thread.
      if (accept_errors_.fetch_add(1) % 100 == 0) {
        TANDEM_LOG(kWarn) << "http: accepting a connection failed: " << ec.message()
                          << " (retrying every 100 ms; said once per 100 failures)";
      }
      asio::steady_timer pause(co_await asio::this_coro::executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    // At the bound, the connection idle longest makes room; with none idle
    // (or already kMaxRefusing over it) the new one is over the bound: it
    // is served only the paths servedOverBound() names, others get 503.
    // While kMaxRefusing are being answered, more are closed at once, so
    // that a flood of connections costs few descriptors.
    const int64_t open = open_connections_.load();
    const int64_t bound = max_connections_.load();
    const bool over_bound = open >= bound && (open >= bound + kMaxRefusing || !closeIdlest());
    if (over_bound) {
      if (refusing_.load() >= kMaxRefusing) {
        socket.close(ec);
        countRefused();
        continue;
      }
      refusing_ += 1;
    }
    auto connection = std::make_shared<HttpConnection>(*this, std::move(socket), over_bound);
    {
      // Over the bound too, so that stop() closes it.
      std::lock_guard<std::mutex> lock(connections_mutex_);
      connections_[connection.get()] = connection;
      if (!over_bound) open_connections_ += 1;
    }
    asio::co_spawn(connection->strand(), runConnection(connection), asio::detached);
  }
}

HttpFrontStats HttpService::frontStats() {
  int64_t idle = 0;
  {
    std::lock_guard<std::mutex> lock(idle_mutex_);
    idle = static_cast<int64_t>(idle_.size());
  }
  return {.open_connections = open_connections_.load(),
          .idle_connections = idle,
          .max_connections = max_connections_.load(),
          .idle_connections_closed = idle_closed_.load(),
          .connections_refused = connections_refused_.load()};
}

void HttpService::setIdle(HttpConnection* connection, int64_t since, bool idle) {
  std::lock_guard<std::mutex> lock(idle_mutex_);
  if (idle) {
    idle_.emplace(since, connection);
  } else {
    idle_.erase({since, connection});
  }
}

void HttpService::countOverBoundServed() {
  refusing_ -= 1;
  open_connections_ += 1;
}

void HttpService::countRefused() {
  if (connections_refused_.fetch_add(1) % 100 == 0) {
    TANDEM_LOG(kWarn) << "http: " << open_connections_.load()
                      << " connections open, the limit (max_connections " << max_connections_
                      << "), none idle for a second: refusing new ones with 503 (said once per "
                         "100)";
  }
}

void HttpService::countIdleClosed() {
  if (idle_closed_.fetch_add(1) % 100 == 0) {
    TANDEM_LOG(kInfo) << "http: " << open_connections_.load()
                      << " connections open, the limit (max_connections " << max_connections_
                      << "): closed the one idle longest for a new one (said once per 100)";
  }
}

bool HttpService::servedOverBound(const std::string& target) const {
  // Probes and scrapes (a pod at its bound is not restarted nor unseen), and
  // the calls between agents and routers (KV transfers and releases, the
  // router's KV event streams and model reads).
  static const std::vector<std::string> kServed = {"/health", "/metrics", "/v1/models",
                                                   "/v1/kv_events", "/v1/kv_transfer/"};
  return matchesPath(kServed, std::string_view(target).substr(0, target.find('?')));
}

bool HttpService::closeIdlest() {
  // Idle since before this: a connection that has just been accepted or
  // answered may have its next request on the way.
  const int64_t latest = (Clock::now() - kIdleBeforeClosing).time_since_epoch().count();
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::pair<int64_t, HttpConnection*> idlest;
    {
      // Taken off the list: the next accept asks another one.
      std::lock_guard<std::mutex> lock(idle_mutex_);
      if (idle_.empty() || idle_.begin()->first > latest) return false;
      idlest = *idle_.begin();
      idle_.erase(idle_.begin());
    }
    std::shared_ptr<HttpConnection> connection;
    {
      // Found by address only: the entry's connection may be gone by now
      // and its address reused (closeIfIdle then finds another wait).
      std::lock_guard<std::mutex> lock(connections_mutex_);
      const auto it = connections_.find(idlest.second);
      if (it != connections_.end()) connection = it->second.lock();
    }
    if (connection == nullptr) continue;
    connection->closeIfIdle(idlest.first);
    return true;
  }
  return false;
}

awaitable<void> HttpService::runConnection(std::shared_ptr<HttpConnection> connection) {
  // Whatever ends the session (an exception of any kind, the io context
  // destroyed at shutdown), the connection leaves the service's books.
  struct Leave {
    HttpService& service;
    HttpConnection* connection;
    ~Leave() { service.forget(connection); }
  } leave{*this, connection.get()};
  try {
    co_await connection->session();
  } catch (const std::exception& e) {
    TANDEM_LOG(kError) << "http connection: " << e.what();
  }
}

void HttpService::forget(HttpConnection* connection) {
  if (const int64_t since = connection->idleSince(); since != 0) setIdle(connection, since, false);
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections_.erase(connection);
  }
  if (!connection->overBound() || connection->servedOverBound()) {
    open_connections_ -= 1;
    return;
  }
  refusing_ -= 1;
  countRefused();
}

namespace {
// Keys are compared as digests of equal length, so neither how much of a
// guess matched nor how long the key is shows in the time taken.
constexpr std::string_view kApiKeyDigestKey = "tandem api key";
}  // namespace

void HttpService::requireApiKey(std::string key, std::vector<std::string> exempt) {
  api_key_ = key.empty() ? std::string() : hmacSha256Hex(kApiKeyDigestKey, key);
  api_key_exempt_ = std::move(exempt);
}

bool HttpService::authorized(const HttpRequest& request) const {
  return authorized(request.path, request.header("authorization"));
}

bool HttpService::authorized(const std::string& target, const std::string& header) const {
  if (api_key_.empty()) return true;
  const std::string path = target.substr(0, target.find('?'));
  if (matchesPath(api_key_exempt_, path)) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() < kBearer.size() ||
      !std::equal(kBearer.begin(), kBearer.end(), header.begin(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) ==
               std::tolower(static_cast<unsigned char>(b));
      })) {
    return false;
  }
  const std::string_view token = std::string_view(header).substr(kBearer.size());
  return constantTimeEquals(hmacSha256Hex(kApiKeyDigestKey, token), api_key_);
}

awaitable<void> HttpService::dispatch(HttpExchange& exchange) {
  const HttpRequest& request = exchange.request();
  if (!authorized(request)) {
    co_await exchange.respond(unauthorizedResponse());
    co_return;
  }
  const std::string method = request.method == "HEAD" ? "GET" : request.method;
  auto it = routes_.find(method + " " + request.path);
  if (it == routes_.end()) {
    co_await exchange.respond(httpErrorResponse(
        404, "no route for " + request.method + " " + request.path, "not_found_error"));
    co_return;
  }
  co_await it->second(exchange);
  if (!exchange.started() && !exchange.clientGone()) {
    throw std::logic_error("the route for " + request.path + " did not answer");
  }
}

bool HttpService::enterLarge() {
  if (large_requests_.fetch_add(1) < limits_.max_large_requests) return true;
  large_requests_.fetch_sub(1);
  return false;
}

void HttpService::leaveLarge() {
  large_requests_.fetch_sub(1);
  if (!stopping_) trimSoon();
}

// A large body, and what was parsed from it, leave freed pages in the heap
// that glibc keeps (a 60 MB prompt grows a process by gigabytes that stay):
// once such a request is over, the heap is trimmed, on a worker, at most
// once per kTrimInterval; requests ending meanwhile share the next trim.
void HttpService::trimSoon() {
#if defined(__GLIBC__)
  if (trim_scheduled_.exchange(true)) return;
  const Clock::time_point due =
      Clock::time_point(Clock::duration(last_trim_.load())) + kTrimInterval;
  auto timer = std::make_shared<asio::steady_timer>(ioc_, due);
  timer->async_wait([this, timer](const boost::system::error_code& ec) {
    if (ec) {
      trim_scheduled_ = false;
      return;
    }
    asio::post(workers_, [this] {
      last_trim_ = Clock::now().time_since_epoch().count();
      trim_scheduled_ = false;
      ::malloc_trim(0);
    });
  });
#endif
}

void HttpService::addCancel(std::atomic<bool>* cancel) {
  std::lock_guard<std::mutex> lock(cancels_mutex_);
  cancels_.push_back(cancel);
  if (stopping_) *cancel = true;
}

void HttpService::removeCancel(std::atomic<bool>* cancel) {
  std::lock_guard<std::mutex> lock(cancels_mutex_);
  cancels_.erase(std::find(cancels_.begin(), cancels_.end(), cancel));
}

std::string HttpService::nextRequestId() {
  static const uint64_t process_salt = std::random_device{}();
  return hex64(process_salt) + hex64(next_request_.fetch_add(1));
}

}  // namespace tandem::server
