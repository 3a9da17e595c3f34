#include "operator/router/client_response.h"

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/protocol/openai_protocol.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;

std::string errorJson(int status, const std::string& message, const std::string& type,
                      const std::string& param) {
  server::ApiError error{status, message, type, param, ""};
  return server::errorBody(error).dump();
}

awaitable<bool> respond(beast::tcp_stream& stream, int status, std::string body,
                        std::string content_type, Headers extra) {
  http::response<http::string_body> response{static_cast<http::status>(status), 11};
  response.set(http::field::content_type, content_type);
  for (const auto& [name, value] : extra) response.set(name, value);
  response.keep_alive(true);
  response.body() = std::move(body);
  response.prepare_payload();
  boost::system::error_code ec;
  co_await http::async_write(stream, response, asio::redirect_error(use_awaitable, ec));
  co_return !ec;
}

awaitable<bool> respondJson(beast::tcp_stream& stream, int status, std::string body) {
  co_return co_await respond(stream, status, std::move(body), std::string("application/json"),
                             Headers{});
}

awaitable<bool> respondError(beast::tcp_stream& stream, int status, std::string message,
                             std::string type) {
  Headers headers;
  if (status == 503) headers.emplace_back("Retry-After", "1");
  co_return co_await respond(stream, status, errorJson(status, message, type),
                             std::string("application/json"), std::move(headers));
}

}  // namespace tandem::router
