#include "operator/k8s/http_transport.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdio>
#include <limits>
#include <utility>

namespace tandem::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr char kUserAgent[] = "tandem-operator";
// An error body quoted in a message is cut here.
constexpr size_t kMessageBodyLimit = 512;

std::string seconds(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", value);
  return text;
}

Clock::duration toDuration(double seconds_value) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds_value));
}

bool isIpAddress(const std::string& host) {
  beast::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

ApiError transportError(const std::string& reason, const std::string& message) {
  return ApiError{0, reason, message};
}

// A description of an error; for OpenSSL's, its reason ("certificate verify failed").
std::string sslErrorText(const beast::error_code& ec) {
  if (ec.category() == asio::error::get_ssl_category()) {
    const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
    if (reason != nullptr) return reason;
  }
  return ec.message();
}

}  // namespace

// One connection: its own io_context, a TCP or TLS stream, and the deadline of
// the operation in progress. Every operation starts asynchronously and runs
// the io_context until it completes; cancel() posts a close to that context.
class HttpConnection {
 public:
  HttpConnection(const ServerAddress& address, ssl::context* tls_context, bool verify_peer,
                 std::string tls_server_name, std::string description)
      : address_(address), description_(std::move(description)) {
    if (address_.tls) {
      tls_.emplace(ioc_, *tls_context);
      tls_name_ = tls_server_name.empty() ? address_.host : std::move(tls_server_name);
      verify_peer_ = verify_peer;
    } else {
      plain_.emplace(ioc_);
    }
  }

  std::optional<ApiError> connect(double timeout_s) {
    const auto deadline = Clock::now() + toDuration(timeout_s);
    tcp::resolver::results_type endpoints;
    if (isIpAddress(address_.host)) {
      endpoints = tcp::resolver::results_type::create(
          tcp::endpoint(asio::ip::make_address(address_.host),
                        static_cast<unsigned short>(std::stoi(address_.port))),
          address_.host, address_.port);
    } else {
      tcp::resolver resolver(ioc_);
      asio::steady_timer timer(ioc_);
      timer.expires_at(deadline);
      bool timed_out = false;
      timer.async_wait([&](beast::error_code ec) {
        if (!ec) {
          timed_out = true;
          resolver.cancel();
        }
      });
      beast::error_code resolve_ec;
      resolver.async_resolve(address_.host, address_.port,
                             [&](beast::error_code ec, tcp::resolver::results_type results) {
                               resolve_ec = ec;
                               endpoints = std::move(results);
                               timer.cancel();
                             });
      runLoop();
      if (timed_out) {
        return transportError("Timeout", description_ + ": host " + address_.host +
                                             " not resolved within " + seconds(timeout_s));
      }
      if (resolve_ec) {
        return transportError("ConnectionFailed", description_ + ": cannot resolve host " +
                                                      address_.host + ": " + resolve_ec.message());
      }
    }

    lowest().expires_at(deadline);
    beast::error_code ec = run([&](auto handler) { lowest().async_connect(endpoints, handler); });
    if (ec == beast::error::timeout) {
      return transportError("Timeout",
                            description_ + ": no connection within " + seconds(timeout_s));
    }
    if (ec) {
      return transportError("ConnectionFailed", description_ + ": cannot connect to " +
                                                    address_.origin + ": " + ec.message());
    }
    if (!tls_) return std::nullopt;

    if (!isIpAddress(tls_name_) &&
        !SSL_set_tlsext_host_name(tls_->native_handle(), tls_name_.c_str())) {
      return transportError("TLSError",
                            description_ + ": cannot set the TLS server name " + tls_name_);
    }
    if (verify_peer_) {
      tls_->set_verify_mode(ssl::verify_peer);
      tls_->set_verify_callback([this, check = ssl::host_name_verification(tls_name_)](
                                    bool preverified, ssl::verify_context& context) {
        const bool ok = check(preverified, context);
        if (!ok && verify_error_.empty()) {
          const int error = X509_STORE_CTX_get_error(context.native_handle());
          verify_error_ = preverified || error == X509_V_OK
                              ? "the server's certificate is not valid for " + tls_name_
                              : std::string(X509_verify_cert_error_string(error));
        }
        return ok;
      });
    } else {
      tls_->set_verify_mode(ssl::verify_none);
    }
    lowest().expires_at(deadline);
    ec = run([&](auto handler) { tls_->async_handshake(ssl::stream_base::client, handler); });
    if (ec == beast::error::timeout) {
      return transportError("Timeout",
                            description_ + ": TLS handshake not done within " + seconds(timeout_s));
    }
    if (ec) {
      std::string detail = sslErrorText(ec);
      if (!verify_error_.empty()) detail += " (" + verify_error_ + ")";
      return transportError("TLSError", description_ + ": TLS handshake with " + address_.origin +
                                            " failed: " + detail);
    }
    return std::nullopt;
  }

  // Writes the request; `timeout_s` from now bounds the rest of the exchange.
  std::optional<ApiError> send(http::request<http::string_body>& request, double timeout_s) {
    read_timeout_s_ = timeout_s;
    lowest().expires_after(toDuration(timeout_s));
    beast::error_code ec = run([&](auto handler) {
      withStream([&](auto& stream) { http::async_write(stream, request, handler); });
    });
    if (ec) return readError(ec, "sending the request");
    return std::nullopt;
  }

  Result<HttpResponse> readWhole() {
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::error_code ec = run([&](auto handler) {
      withStream([&](auto& stream) { http::async_read(stream, buffer_, parser, handler); });
    });
    if (ec) return *readError(ec, "reading the answer");
    auto& message = parser.get();
    HttpResponse response;
    response.status = static_cast<int>(message.result_int());
    response.reason = std::string(message.reason());
    if (response.reason.empty())
      response.reason = std::string(http::obsolete_reason(message.result()));
    response.body = std::move(message.body());
    if (auto it = message.find(http::field::retry_after); it != message.end()) {
      response.retry_after = std::string(it->value());
    }
    close();
    return response;
  }

  std::optional<ApiError> readHeader() {
    stream_parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::error_code ec = run([&](auto handler) {
      withStream(
          [&](auto& stream) { http::async_read_header(stream, buffer_, stream_parser_, handler); });
    });
    if (ec) return readError(ec, "reading the answer");
    status_ = static_cast<int>(stream_parser_.get().result_int());
    reason_ = std::string(stream_parser_.get().reason());
    if (reason_.empty())
      reason_ = std::string(http::obsolete_reason(stream_parser_.get().result()));
    return std::nullopt;
  }

  Result<bool> readSome(std::string& out) {
    if (cancelled_.load() || stream_parser_.is_done()) return false;
    char chunk[16384];
    stream_parser_.get().body().data = chunk;
    stream_parser_.get().body().size = sizeof chunk;
    stream_parser_.get().body().more = true;
    beast::error_code ec = run([&](auto handler) {
      withStream(
          [&](auto& stream) { http::async_read_some(stream, buffer_, stream_parser_, handler); });
    });
    out.append(chunk, sizeof chunk - stream_parser_.get().body().size);
    if (ec == http::error::need_buffer) ec = {};
    if (cancelled_.load()) return false;
    // The server ending the stream by closing the connection ends the body too.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == asio::error::eof || ec == ssl::error::stream_truncated) {
      return false;
    }
    if (ec) return *readError(ec, "reading the stream");
    return true;
  }

  int status() const { return status_; }
  const std::string& reason() const { return reason_; }
  bool cancelled() const { return cancelled_.load(); }

  void cancel() {
    cancelled_.store(true);
    asio::post(ioc_, [this] { close(); });
  }

 private:
  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *plain_; }

  template <typename F>
  void withStream(F&& use) {
    if (tls_) {
      use(*tls_);
    } else {
      use(*plain_);
    }
  }

  void runLoop() {
    ioc_.restart();
    ioc_.run();
  }

  // Starts one operation (`start(handler)`) and runs until it completes.
  template <typename Start>
  beast::error_code run(Start&& start) {
    beast::error_code result = asio::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    runLoop();
    return result;
  }

  std::optional<ApiError> readError(const beast::error_code& ec, const std::string& what) {
    if (ec == beast::error::timeout) {
      return transportError("Timeout",
                            description_ + ": no answer within " + seconds(read_timeout_s_));
    }
    if (ec.category() == http::make_error_code(http::error::bad_version).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return transportError("BadResponse", description_ + ": not an HTTP answer: " + ec.message());
    }
    if (ec.category() == asio::error::get_ssl_category() || ec == ssl::error::stream_truncated) {
      return transportError("TLSError", description_ + ": " + what + ": " + sslErrorText(ec));
    }
    return transportError("ConnectionFailed",
                          description_ + ": connection lost " + what + ": " + ec.message());
  }

  void close() {
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close();
  }

  // Declared first so that it outlives the streams that use it.
  asio::io_context ioc_;
  ServerAddress address_;
  std::string description_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  std::string tls_name_;
  bool verify_peer_ = false;
  std::string verify_error_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> stream_parser_;
  double read_timeout_s_ = 0;
  int status_ = 0;
  std::string reason_;
  std::atomic<bool> cancelled_{false};
};

HttpStream::HttpStream(std::unique_ptr<HttpConnection> connection)
    : connection_(std::move(connection)) {}
HttpStream::~HttpStream() = default;
int HttpStream::status() const { return connection_->status(); }
const std::string& HttpStream::reason() const { return connection_->reason(); }
Result<bool> HttpStream::readSome(std::string& out) { return connection_->readSome(out); }
void HttpStream::cancel() { connection_->cancel(); }
bool HttpStream::cancelled() const { return connection_->cancelled(); }

std::optional<ServerAddress> parseServerUrl(const std::string& url, std::string& error) {
  ServerAddress address;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    address.tls = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    address.tls = false;
    rest = url.substr(7);
  } else {
    error = "server \"" + url + "\" must start with https:// or http://";
    return std::nullopt;
  }
  const auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) {
    address.base_path = rest.substr(slash);
    while (!address.base_path.empty() && address.base_path.back() == '/') {
      address.base_path.pop_back();
    }
  }
  std::string port;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string::npos) {
      error = "server \"" + url + "\": unterminated [IPv6 address]";
      return std::nullopt;
    }
    address.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        error = "server \"" + url + "\": expected :PORT after the IPv6 address";
        return std::nullopt;
      }
      port = authority.substr(close + 2);
    }
  } else {
    const auto colon = authority.rfind(':');
    address.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (address.host.empty()) {
    error = "server \"" + url + "\" names no host";
    return std::nullopt;
  }
  if (port.empty()) port = address.tls ? "443" : "80";
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) == 0 || std::stoi(port) > 65535) {
    error = "server \"" + url + "\": port must be a number from 1 to 65535, got \"" + port + "\"";
    return std::nullopt;
  }
  address.port = port;
  const bool ipv6 = address.host.find(':') != std::string::npos;
  address.origin = std::string(address.tls ? "https://" : "http://") +
                   (ipv6 ? "[" + address.host + "]" : address.host) + ":" + port;
  return address;
}

std::string urlEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

class HttpTransport::Impl {
 public:
  explicit Impl(const ClusterConfig& config) : config_(config) {
    std::string error;
    auto address = parseServerUrl(config.server, error);
    if (!address) {
      config_error_ = config.source + ": " + error;
      return;
    }
    address_ = *address;
    if (address_.tls) setUpTls();
  }

  double requestTimeout() const { return config_.request_timeout_s; }

  std::string describe(const HttpRequest& request) const {
    return request.method + " " + address_.origin + address_.base_path + request.target;
  }

  Result<std::unique_ptr<HttpConnection>> connectAndSend(const HttpRequest& request,
                                                         double read_timeout_s) const {
    if (!config_error_.empty()) return ApiError{0, "ConfigError", config_error_};
    auto connection = std::make_unique<HttpConnection>(address_, tls_context_.get(),
                                                       !config_.insecure_skip_tls_verify,
                                                       config_.tls_server_name, describe(request));
    if (auto error = connection->connect(config_.connect_timeout_s)) return *error;

    http::request<http::string_body> message;
    message.version(11);
    message.method(http::string_to_verb(request.method));
    message.target(address_.base_path + request.target);
    const bool ipv6 = address_.host.find(':') != std::string::npos;
    message.set(http::field::host,
                (ipv6 ? "[" + address_.host + "]" : address_.host) + ":" + address_.port);
    message.set(http::field::user_agent, kUserAgent);
    message.set(http::field::accept, "application/json");
    if (!request.bearer_token.empty()) {
      message.set(http::field::authorization, "Bearer " + request.bearer_token);
    }
    if (!request.content_type.empty()) {
      message.set(http::field::content_type, request.content_type);
      message.body() = request.body;
    }
    message.prepare_payload();
    if (auto error = connection->send(message, read_timeout_s)) return *error;
    return connection;
  }

 private:
  void setUpTls() {
    tls_context_ = std::make_unique<ssl::context>(ssl::context::tls_client);
    tls_context_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                              ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                              ssl::context::no_tlsv1_1);
    beast::error_code ec;
    if (config_.insecure_skip_tls_verify) {
      tls_context_->set_verify_mode(ssl::verify_none);
    } else if (!config_.certificate_authority_pem.empty()) {
      tls_context_->add_certificate_authority(asio::buffer(config_.certificate_authority_pem), ec);
      if (ec) {
        config_error_ =
            config_.source + ": the certificate authority is not valid PEM: " + sslErrorText(ec);
        return;
      }
    } else {
      tls_context_->set_default_verify_paths(ec);
      if (ec) {
        config_error_ =
            config_.source + ": cannot load the system's certificate authorities: " + ec.message();
        return;
      }
    }
    if (!config_.client_certificate_pem.empty()) {
      tls_context_->use_certificate_chain(asio::buffer(config_.client_certificate_pem), ec);
      if (ec) {
        config_error_ =
            config_.source + ": the client certificate is not valid PEM: " + sslErrorText(ec);
        return;
      }
      tls_context_->use_private_key(asio::buffer(config_.client_key_pem), ssl::context::pem, ec);
      if (ec) {
        config_error_ = config_.source +
                        ": the client key is not valid PEM or does not match the certificate: " +
                        sslErrorText(ec);
        return;
      }
    }
  }

  ClusterConfig config_;
  ServerAddress address_;
  std::string config_error_;
  // Configured once here; OpenSSL allows one SSL_CTX to back many connections at once.
  std::unique_ptr<ssl::context> tls_context_;
};

HttpTransport::HttpTransport(const ClusterConfig& config) : impl_(std::make_unique<Impl>(config)) {}
HttpTransport::~HttpTransport() = default;

std::string HttpTransport::describe(const HttpRequest& request) const {
  return impl_->describe(request);
}

Result<HttpResponse> HttpTransport::roundTrip(const HttpRequest& request) const {
  auto connection = impl_->connectAndSend(request, impl_->requestTimeout());
  if (!connection.isOk()) return connection.error();
  return connection.value()->readWhole();
}

Result<std::unique_ptr<HttpStream>> HttpTransport::openStream(const HttpRequest& request,
                                                              double read_timeout_s) const {
  auto connection = impl_->connectAndSend(request, read_timeout_s);
  if (!connection.isOk()) return connection.error();
  if (auto error = connection.value()->readHeader()) return *error;
  return std::make_unique<HttpStream>(std::move(connection).value());
}

}  // namespace tandem::k8s
