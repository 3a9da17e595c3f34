#include "operator/router/upstream_call.h"

#include <boost/beast/core.hpp>
#include <chrono>
#include <memory>
#include <optional>

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

std::string hostHeader(const AgentEndpoint& endpoint) {
  const bool ipv6 = endpoint.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

namespace {

awaitable<void> awaitAgentClose(std::shared_ptr<beast::tcp_stream> stream) {
  stream->expires_after(std::chrono::seconds(1));
  boost::system::error_code ec;
  char rest[512];
  while (!ec) {
    co_await stream->async_read_some(asio::buffer(rest), asio::redirect_error(use_awaitable, ec));
  }
  stream->socket().close(ec);
}

}  // namespace

void closeAfterAgent(beast::tcp_stream&& stream) {
  auto owned = std::make_shared<beast::tcp_stream>(std::move(stream));
  asio::co_spawn(owned->get_executor(), awaitAgentClose(owned), asio::detached);
}

awaitable<UpstreamResult> callAgent(AgentEndpoint endpoint, http::verb verb, std::string target,
                                    std::string body, double timeout_s,
                                    server::HttpExchange* client, OnClientLeaving leaving,
                                    std::function<void()>* cutter) {
  UpstreamResult result;
  if (client != nullptr && client->clientGone()) {
    result.error = "the client left";
    co_return result;
  }
  try {
    beast::tcp_stream stream(co_await asio::this_coro::executor);
    // Ends the request's direction only (FIN): the agent sees its client
    // gone and stops the work, and an answer already on its way is still
    // read to its end.
    const auto end_request = [&stream] {
      boost::system::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    };
    std::optional<server::OnClientGone> cut;
    if (client != nullptr && leaving == OnClientLeaving::kCut) {
      cut.emplace(*client, [&stream] { stream.close(); });
    } else if (client != nullptr) {
      cut.emplace(*client, end_request);
    }
    struct Cutter {
      std::function<void()>* hook;
      ~Cutter() {
        if (hook != nullptr) *hook = nullptr;
      }
    } cutter_set{cutter};
    if (cutter != nullptr) *cutter = end_request;
    tcp::resolver resolver(co_await asio::this_coro::executor);
    stream.expires_after(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
    auto results = co_await resolver.async_resolve(endpoint.host, std::to_string(endpoint.port),
                                                   use_awaitable);
    co_await stream.async_connect(results, use_awaitable);
    http::request<http::string_body> request{verb, target, 11};
    setAgentHeaders(request, endpoint);
    if (client != nullptr) request.set(server::kRequestIdHeader, client->request().id);
    if (!body.empty()) {
      request.set(http::field::content_type, "application/json");
      request.body() = body;
      request.prepare_payload();
    }
    co_await http::async_write(stream, request, use_awaitable);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kNoBodyLimit);
    co_await http::async_read(stream, buffer, parser, use_awaitable);
    result.status = static_cast<int>(parser.get().result_int());
    result.body = std::move(parser.get().body());
    cut.reset();
    closeAfterAgent(std::move(stream));
  } catch (const std::exception& e) {
    result.status = 0;
    result.error = e.what();
  }
  co_return result;
}

awaitable<void> sleepFor(double seconds) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
}

}  // namespace tandem::router
