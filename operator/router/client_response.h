// Whole responses the router writes to its clients: a body with its content
// type, or an error in OpenAI's shape. Used by the router's own files only.
//
// Contract: the writers never throw; they return whether the response was
// written (false: the client is gone). They run on the client's strand.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <string>
#include <vector>

namespace tandem::router {

using Headers = std::vector<std::pair<std::string, std::string>>;

// An OpenAI-style error body.
std::string errorJson(int status, const std::string& message, const std::string& type,
                      const std::string& param = "");

boost::asio::awaitable<bool> respond(boost::beast::tcp_stream& stream, int status, std::string body,
                                     std::string content_type, Headers extra);
boost::asio::awaitable<bool> respondJson(boost::beast::tcp_stream& stream, int status,
                                         std::string body);
// An error in OpenAI's shape; 503s say when to retry.
boost::asio::awaitable<bool> respondError(boost::beast::tcp_stream& stream, int status,
                                          std::string message, std::string type);

}  // namespace tandem::router
