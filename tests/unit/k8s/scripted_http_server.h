// A scripted HTTP/1.1 server for the API client's tests: it answers each
// request (one per connection) with the bytes a handler returns, so that a
// test can produce answers a real API server gives only under load or
// failure (5xx, 429, bodies that are not JSON, chunk boundaries anywhere, a
// connection that is never answered). Serves 127.0.0.1 on its own thread.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::k8s::scripted {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

struct ScriptedReply {
  std::string bytes;  // written as they are
  bool hold = false;  // keep the connection open, unanswered beyond `bytes`, until the server stops
};

inline std::string answer(int status, const std::string& reason, const std::string& body,
                          const std::string& extra_headers = "",
                          const std::string& content_type = "application/json") {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" +
         extra_headers + "\r\n" + body;
}

inline std::string chunk(const std::string& data) {
  char size[16];
  std::snprintf(size, sizeof size, "%zx", data.size());
  return std::string(size) + "\r\n" + data + "\r\n";
}

inline const std::string kChunkedHeader =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

// Serves one request per connection on 127.0.0.1, on its own thread.
class ScriptedServer {
 public:
  using Handler = std::function<ScriptedReply(const http::request<http::string_body>&)>;

  explicit ScriptedServer(Handler handler)
      : handler_(std::move(handler)),
        acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }

  ~ScriptedServer() {
    stopping_ = true;
    tcp::socket wake(ioc_);
    boost::system::error_code ec;
    wake.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ec);
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::vector<http::request<http::string_body>> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  void serve() {
    while (true) {
      tcp::socket socket(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stopping_ || ec) return;
      beast::flat_buffer buffer;
      http::request<http::string_body> request;
      http::read(socket, buffer, request, ec);
      if (ec) continue;
      {
        std::lock_guard lock(mutex_);
        requests_.push_back(request);
      }
      ScriptedReply reply = handler_(request);
      asio::write(socket, asio::buffer(reply.bytes), ec);
      if (reply.hold) held_.push_back(std::move(socket));
    }
  }

  Handler handler_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::vector<http::request<http::string_body>> requests_;
  std::vector<tcp::socket> held_;
};

}  // namespace tandem::k8s::scripted
