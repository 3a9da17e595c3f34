#include "tests/support/apiserver/http_server.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <stdexcept>

namespace tandem::testing {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr size_t kMaxBodyBytes = 64 * 1024 * 1024;

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

HttpRequest toRequest(const http::request<http::string_body>& message) {
  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  size_t question = request.target.find('?');
  request.path = percentDecode(request.target.substr(0, question), false);
  if (question != std::string::npos) {
    request.query = request.target.substr(question + 1);
    size_t start = 0;
    while (start <= request.query.size()) {
      size_t end = request.query.find('&', start);
      if (end == std::string::npos) end = request.query.size();
      std::string pair = request.query.substr(start, end - start);
      if (!pair.empty()) {
        size_t equals = pair.find('=');
        std::string name = percentDecode(pair.substr(0, equals), true);
        std::string value =
            equals == std::string::npos ? "" : percentDecode(pair.substr(equals + 1), true);
        request.params[name] = value;
      }
      start = end + 1;
    }
  }
  for (const auto& field : message) {
    request.headers[lower(std::string(field.name_string()))] = std::string(field.value());
  }
  request.body = message.body();
  return request;
}

}  // namespace

std::string percentDecode(const std::string& text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      int high = hexValue(text[i + 1]);
      int low = hexValue(text[i + 2]);
      if (high >= 0 && low >= 0) {
        out.push_back(static_cast<char>(high * 16 + low));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && text[i] == '+' ? ' ' : text[i]);
  }
  return out;
}

std::string HttpRequest::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

std::string HttpRequest::param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}

class HttpServer::Impl {
 public:
  Impl(HttpHandler handler, const TestPki* pki, std::function<void(const HttpRequest&)> on_read,
       const std::string& address)
      : handler_(std::move(handler)),
        on_read_(std::move(on_read)),
        acceptor_(io_),
        tls_(pki != nullptr),
        ssl_context_(net::ssl::context::tls_server) {
    if (tls_) {
      ssl_context_.set_options(net::ssl::context::default_workarounds |
                               net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3);
      ssl_context_.use_certificate_chain(net::buffer(pki->server_certificate));
      ssl_context_.use_private_key(net::buffer(pki->server_key), net::ssl::context::pem);
      ssl_context_.add_certificate_authority(net::buffer(pki->ca_certificate));
      // Ask for a client certificate, but accept connections without one.
      ssl_context_.set_verify_mode(net::ssl::verify_peer);
      // Name the test CA as the acceptable issuer so clients offer their certificate.
      BIO* bio =
          BIO_new_mem_buf(pki->ca_certificate.data(), static_cast<int>(pki->ca_certificate.size()));
      X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
      BIO_free(bio);
      if (ca != nullptr) {
        SSL_CTX_add_client_CA(ssl_context_.native_handle(), ca);
        X509_free(ca);
      }
    }
    tcp::endpoint endpoint(net::ip::make_address(address), 0);
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept();
    io_thread_ = std::thread([this] { io_.run(); });
  }

  ~Impl() { stop(); }

  int port() const { return port_; }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    stall_cv_.notify_all();
    net::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    if (io_thread_.joinable()) io_thread_.join();
    std::list<ConnectionThread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
    }
    for (ConnectionThread& connection : threads) connection.thread.join();
  }

  void setStalled(bool stalled) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stalled_ = stalled;
    }
    stall_cv_.notify_all();
  }

  // Blocks while stalled; false when the server stops meanwhile.
  bool waitWhileStalled() {
    std::unique_lock<std::mutex> lock(mutex_);
    stall_cv_.wait(lock, [this] { return !stalled_ || stopping_; });
    return !stopping_;
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }

  void forget(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  }

  const HttpHandler& handler() const { return handler_; }
  void seen(const HttpRequest& request) const {
    if (on_read_) on_read_(request);
  }

 private:
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;  // closed by stop()
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      int fd = socket.native_handle();
      open_fds_.push_back(fd);
      reapFinishedThreads();
      auto shared_socket = std::make_shared<tcp::socket>(std::move(socket));
      auto done = std::make_shared<std::atomic<bool>>(false);
      threads_.push_back(ConnectionThread{std::thread([this, shared_socket, done] {
                                            serve(shared_socket);
                                            done->store(true);
                                          }),
                                          done});
      accept();
    });
  }

  struct ConnectionThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  // Joins the threads of closed connections (called with mutex_ held).
  void reapFinishedThreads() {
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(std::shared_ptr<tcp::socket> socket);

  HttpHandler handler_;
  std::function<void(const HttpRequest&)> on_read_;
  net::io_context io_;
  tcp::acceptor acceptor_;
  bool tls_;
  net::ssl::context ssl_context_;
  int port_ = 0;
  std::thread io_thread_;
  std::mutex mutex_;
  std::condition_variable stall_cv_;
  bool stalled_ = false;
  bool stopping_ = false;
  std::vector<int> open_fds_;
  std::list<ConnectionThread> threads_;
};

namespace {

template <typename Stream>
class StreamWriter : public ResponseWriter {
 public:
  StreamWriter(Stream& stream, int fd, unsigned version, bool keep_alive)
      : stream_(stream), fd_(fd), version_(version), keep_alive_(keep_alive) {}

  bool send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers) override {
    http::response<http::string_body> response{static_cast<http::status>(status), version_};
    response.set(http::field::server, "tandem-test-apiserver");
    response.set(http::field::content_type, content_type);
    response.set(http::field::cache_control, "no-cache, private");
    for (const auto& [name, value] : headers) response.insert(name, value);
    response.keep_alive(keep_alive_);
    response.body() = body;
    response.prepare_payload();
    boost::system::error_code ec;
    http::write(stream_, response, ec);
    answered_ = true;
    broken_ = broken_ || static_cast<bool>(ec);
    return !ec;
  }

  bool startChunked(int status, const std::string& content_type) override {
    http::response<http::empty_body> response{static_cast<http::status>(status), version_};
    response.set(http::field::server, "tandem-test-apiserver");
    response.set(http::field::content_type, content_type);
    response.set(http::field::cache_control, "no-cache, private");
    response.keep_alive(keep_alive_);
    response.chunked(true);
    http::response_serializer<http::empty_body> serializer{response};
    boost::system::error_code ec;
    http::write_header(stream_, serializer, ec);
    answered_ = true;
    chunked_open_ = !ec;
    broken_ = broken_ || static_cast<bool>(ec);
    return !ec;
  }

  bool writeChunk(const std::string& data) override {
    if (!chunked_open_ || data.empty()) return chunked_open_;
    boost::system::error_code ec;
    net::write(stream_, http::make_chunk(net::buffer(data)), ec);
    if (ec) {
      broken_ = true;
      chunked_open_ = false;
    }
    return !ec;
  }

  bool finishChunked() override {
    if (!chunked_open_) return false;
    boost::system::error_code ec;
    net::write(stream_, http::make_chunk_last(), ec);
    chunked_open_ = false;
    broken_ = broken_ || static_cast<bool>(ec);
    return !ec;
  }

  bool peerClosed() override {
    pollfd descriptor{fd_, POLLRDHUP, 0};
    if (::poll(&descriptor, 1, 0) <= 0) return false;
    return (descriptor.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

  bool answered() const { return answered_; }
  // The connection can carry another request.
  bool reusable() const { return keep_alive_ && !broken_ && !chunked_open_; }

 private:
  Stream& stream_;
  int fd_;
  unsigned version_;
  bool keep_alive_;
  bool answered_ = false;
  bool broken_ = false;
  bool chunked_open_ = false;
};

template <typename Stream>
void serveRequests(HttpServer::Impl& server, Stream& stream, int fd, const std::string& client_cn) {
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(kMaxBodyBytes);
    parser.header_limit(1024 * 1024);
    boost::system::error_code ec;
    http::read(stream, buffer, parser, ec);
    if (ec) return;
    http::request<http::string_body> message = parser.release();
    HttpRequest request = toRequest(message);
    request.client_certificate_cn = client_cn;
    server.seen(request);
    if (!server.waitWhileStalled()) return;
    StreamWriter<Stream> writer(stream, fd, message.version(), message.keep_alive());
    server.handler()(request, writer);
    if (!writer.answered()) {
      writer.send(500, "text/plain", "no answer", {});
    }
    if (!writer.reusable() || server.stopping()) return;
  }
}

// The CN of the client certificate when one was presented and verified.
std::string verifiedClientCn(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return "";
  std::string cn;
  if (SSL_get_verify_result(ssl) == X509_V_OK) {
    char name[256] = {0};
    int length =
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name, sizeof(name));
    if (length > 0) cn.assign(name, static_cast<size_t>(length));
  }
  X509_free(cert);
  return cn;
}

}  // namespace

void HttpServer::Impl::serve(std::shared_ptr<tcp::socket> socket) {
  int fd = socket->native_handle();
  boost::system::error_code ec;
  socket->set_option(tcp::no_delay(true), ec);
  if (tls_) {
    net::ssl::stream<tcp::socket&> stream(*socket, ssl_context_);
    stream.handshake(net::ssl::stream_base::server, ec);
    if (!ec) {
      serveRequests(*this, stream, fd, verifiedClientCn(stream.native_handle()));
      stream.shutdown(ec);
    }
  } else {
    serveRequests(*this, *socket, fd, "");
  }
  forget(fd);
  socket->shutdown(tcp::socket::shutdown_both, ec);
  socket->close(ec);
}

HttpServer::HttpServer(HttpHandler handler, const TestPki* pki,
                       std::function<void(const HttpRequest&)> on_read, const std::string& address)
    : impl_(std::make_unique<Impl>(std::move(handler), pki, std::move(on_read), address)) {
  port_ = impl_->port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::setStalled(bool stalled) { impl_->setStalled(stalled); }

void HttpServer::stop() { impl_->stop(); }

}  // namespace tandem::testing
