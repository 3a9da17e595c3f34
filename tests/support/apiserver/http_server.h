// The HTTP/1.1 (and HTTPS) listener of the test API server: Boost.Beast on
// 127.0.0.1, port 0, one thread per connection so that long-lived watch
// streams never hold up other requests. Keep-alive; answers are whole bodies
// or chunked streams written piece by piece by the handler.
//
// The handler runs on the connection's thread and may block (a watch does).
// While stalled, requests are read but not handed to the handler until the
// server is resumed or stopped. stop() (and the destructor) shuts every
// connection down and joins the threads; handlers blocked on their own
// conditions must be woken by their owner before stop() returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/apiserver/api_server.h"

namespace tandem::testing {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // as sent: path and query
  std::string path;                            // percent-decoded, without the query
  std::string query;                           // raw, without '?'
  std::map<std::string, std::string> params;   // decoded query parameters
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string client_certificate_cn;  // "" unless a client certificate verified

  std::string header(const std::string& lower_name) const;
  std::string param(const std::string& name) const;
  bool hasParam(const std::string& name) const { return params.count(name) > 0; }
};

// How a handler answers: send() once, or startChunked(), writeChunk()...,
// finishChunked(). Each returns false when the connection broke.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual bool send(int status, const std::string& content_type, const std::string& body,
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) = 0;
  virtual bool startChunked(int status, const std::string& content_type) = 0;
  virtual bool writeChunk(const std::string& data) = 0;
  virtual bool finishChunked() = 0;
  // True once the client has closed its side (checked without blocking).
  virtual bool peerClosed() = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, ResponseWriter&)>;

class HttpServer {
 public:
  // `pki` null: plain HTTP. Otherwise HTTPS with pki's server certificate;
  // client certificates signed by pki's CA are verified when presented.
  // `on_read` (optional) sees each request as soon as it is read, stalled or not.
  // Throws std::runtime_error when it cannot listen.
  // It listens on `address` (an IPv4 address), port 0.
  HttpServer(HttpHandler handler, const TestPki* pki,
             std::function<void(const HttpRequest&)> on_read = nullptr,
             const std::string& address = "127.0.0.1");
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void setStalled(bool stalled);
  void stop();

  // Used by connection threads.
  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// Percent-decoding ('+' kept as is unless `plus_is_space`).
std::string percentDecode(const std::string& text, bool plus_is_space);

}  // namespace tandem::testing
