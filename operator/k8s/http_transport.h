// The HTTP(S) layer of the Kubernetes client: Boost.Beast over Asio, with
// Asio SSL (OpenSSL) for https. One connection per call; each connection runs
// its own io_context, so calls look synchronous to the caller and many may run
// on different threads at once. Connecting (resolve, TCP, TLS handshake) is
// bounded by ClusterConfig::connect_timeout_s, the rest of the exchange by
// request_timeout_s (or the stream's own read deadline).
//
// Failures that got no answer come back as ApiError with code 0 and reason
// Timeout, ConnectionFailed, TLSError, BadResponse or ConfigError; the message
// names the method and URL ("GET https://10.0.0.1:443/api/v1/pods: no answer
// within 30.0 s"). Used by api_client.cpp and watch_stream.cpp only.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "operator/k8s/api_error.h"
#include "operator/k8s/kube_config.h"

namespace tandem::k8s {

// A parsed ClusterConfig::server.
struct ServerAddress {
  bool tls = true;
  std::string host;       // without brackets for IPv6
  std::string port;       // "443" when the URL names none (https), "80" (http)
  std::string base_path;  // "" or "/prefix" (servers behind a path-routing proxy)
  std::string origin;     // "https://host:port", for messages and nothing else
};

// Parses "https://host[:port][/prefix]"; nullopt with `error` saying what is wrong.
std::optional<ServerAddress> parseServerUrl(const std::string& url, std::string& error);

// Percent-encodes a query value: every byte but RFC 3986's unreserved characters.
std::string urlEncode(std::string_view text);

struct HttpRequest {
  std::string method;        // "GET", "POST", "PUT", "PATCH", "DELETE"
  std::string target;        // path and query, without the server's base path
  std::string content_type;  // empty: the request has no body
  std::string body;
  std::string bearer_token;  // empty: no Authorization header
};

struct HttpResponse {
  int status = 0;
  std::string reason;  // the status line's text
  std::string body;
  std::string retry_after;  // the Retry-After header, "" when absent
};

class HttpConnection;

// A response whose body is read as it arrives (a watch). Not thread-safe,
// except cancel(), which may be called from any thread.
class HttpStream {
 public:
  explicit HttpStream(std::unique_ptr<HttpConnection> connection);
  ~HttpStream();
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  int status() const;
  const std::string& reason() const;
  // Appends the body bytes that arrived next to `out` (possibly none); false at
  // the end of the body, when the server closed the connection, or after cancel().
  Result<bool> readSome(std::string& out);
  // Closes the connection: a blocked readSome() returns false promptly.
  void cancel();
  bool cancelled() const;

 private:
  std::unique_ptr<HttpConnection> connection_;
};

// The server address and TLS context that all calls of one client share.
// Thread-safe after construction.
class HttpTransport {
 public:
  // Never throws: a configuration that cannot work (a bad URL or PEM) is kept
  // and returned as a ConfigError by every call.
  explicit HttpTransport(const ClusterConfig& config);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // "GET https://host:port/path?query", for messages.
  std::string describe(const HttpRequest& request) const;
  // One request and its whole answer.
  Result<HttpResponse> roundTrip(const HttpRequest& request) const;
  // Sends the request and reads the answer's header; the body is then read
  // with HttpStream::readSome. `read_timeout_s` bounds everything after connecting.
  Result<std::unique_ptr<HttpStream>> openStream(const HttpRequest& request,
                                                 double read_timeout_s) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::k8s
