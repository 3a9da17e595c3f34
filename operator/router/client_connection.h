// One client connection of the router and the watch that tells, while a
// request is answered, whether the client left. Used by router.cpp only.
//
// Threads: every member is used on the connection's strand only (the
// socket's executor): the session, its upstream calls and the watch run
// there.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <functional>
#include <memory>

namespace tandem::router {

// Bytes a client may send ahead (pipelined requests) while its request is
// answered; beyond them the router stops watching for it leaving.
constexpr size_t kMaxPipelinedBytes = 1 << 20;

// One client connection. Every member is used on the connection's strand
// only: the session, its upstream calls and the watcher run there.
//
// While a completion request is answered, a read on the socket tells
// whether the client left (EOF or error): `gone` is set and `on_gone`, the
// current stage's cancel (wake the queued request, end the upstream call),
// runs. Bytes that arrive meanwhile are the next pipelined request: kept in
// `buffer` for the next read.
struct ClientConnection : std::enable_shared_from_this<ClientConnection> {
  explicit ClientConnection(boost::asio::ip::tcp::socket socket)
      : stream(std::move(socket)), signal(stream.get_executor()) {}

  void startWatch() {
    if (watching || gone || stop_watch || buffer.size() >= kMaxPipelinedBytes) return;
    watching = true;
    stream.socket().async_read_some(
        buffer.prepare(4096),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          self->watching = false;
          if (!ec) {
            self->buffer.commit(n);
            self->startWatch();
          } else if (ec != boost::asio::error::operation_aborted) {
            self->gone = true;
            if (self->on_gone) self->on_gone();
          }
          self->signal.cancel();
        });
  }

  // Ends the watch; the next request may then be read.
  boost::asio::awaitable<void> stopWatch() {
    stop_watch = true;
    boost::system::error_code ec;
    if (watching) stream.socket().cancel(ec);
    while (watching) {
      signal.expires_at(std::chrono::steady_clock::time_point::max());
      co_await signal.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    }
    stop_watch = false;
    on_gone = nullptr;
  }

  boost::beast::tcp_stream stream;
  boost::beast::flat_buffer buffer;
  boost::asio::steady_timer signal;  // wakes stopWatch() when the watch read ends
  bool watching = false;
  bool stop_watch = false;
  bool gone = false;
  std::function<void()> on_gone;
};
using ClientPtr = std::shared_ptr<ClientConnection>;

// Sets what a client leaving cancels, for one stage; unset when it ends.
class OnClientGone {
 public:
  OnClientGone(ClientConnection* client, std::function<void()> cancel) : client_(client) {
    if (client_ != nullptr) client_->on_gone = std::move(cancel);
  }
  ~OnClientGone() {
    if (client_ != nullptr) client_->on_gone = nullptr;
  }
  OnClientGone(const OnClientGone&) = delete;
  OnClientGone& operator=(const OnClientGone&) = delete;

 private:
  ClientConnection* client_;
};

}  // namespace tandem::router
