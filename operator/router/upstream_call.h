// The router's plain HTTP calls to agents: one request, the whole answer
// read back (health, metrics, models, prefill, hold and release). Used by the
// router's own files only; the decode pass-through streams on its own
// connection (completion_flow.cpp).
//
// Contract: callAgent never throws; a transport failure is status 0 with
// `error` set. It runs on the caller's executor (a client's strand or the
// io_context) and owns copies of its arguments.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <boost/asio.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "common/http/http_connection.h"
#include "operator/router/router.h"

namespace tandem::router {

// Boost 1.74's parsers treat body_limit(boost::none) as "0 bytes" for bodies
// of known length; a huge limit means none.
constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();

// An upstream call's outcome: status 0 when no HTTP answer came.
struct UpstreamResult {
  int status = 0;
  std::string body;
  std::string error;  // transport failure, when status is 0
};

// Whether an agent's status is the agent failing, so that the request is
// tried on another agent: 5xx, and 429 (busy). Any other is its answer to
// the request, which every agent would give alike and the client gets:
// 2xx, 4xx, and 501 (what the request asks for is not implemented there,
// as a simulated agent answers prompt logprobs).
inline bool agentFailed(int status) { return (status >= 500 && status != 501) || status == 429; }

// The Host header for an agent: an IPv6 literal goes in brackets.
std::string hostHeader(const AgentEndpoint& endpoint);

// Host, Connection: close and, when the agent requires a key,
// Authorization: every request to an agent carries them. Connection: close
// makes the agent close first once its answer is sent (closeAfterAgent).
template <class Request>
void setAgentHeaders(Request& request, const AgentEndpoint& endpoint) {
  request.set(boost::beast::http::field::host, hostHeader(endpoint));
  request.keep_alive(false);
  if (!endpoint.api_key.empty()) {
    request.set(boost::beast::http::field::authorization, "Bearer " + endpoint.api_key);
  }
}

// How a call made for a client treats that client leaving.
enum class OnClientLeaving {
  // End the request's direction (FIN): the agent sees its client gone and
  // stops the work, and an answer already on its way is read to its end (a
  // prefill's names the blocks it holds, which the caller releases; closed
  // instead, an answer the agent wrote just then would leave them held
  // until its hold timeout).
  kFinish,
  // Close the connection at once (the agent stops the work): for calls
  // whose answer nobody else needs.
  kCut,
};

// Once an agent's answer is complete (or refused): takes the connection
// over, reads what is left of it and waits (at most a second) for the
// agent to close its end, then closes ours, on the stream's executor, on
// its own: the caller goes on at once. The side that closes first keeps the
// connection in TIME_WAIT for a minute: an agent keeps it against its
// listening port, where it costs nothing, while a router's would hold one
// of its ephemeral ports to that agent (some 28,000: past about 470 calls a
// second to one agent, connecting would fail).
void closeAfterAgent(boost::beast::tcp_stream&& stream);

// Waits `seconds` on the calling coroutine's executor (a cancelled timer
// ends the wait early, silently).
boost::asio::awaitable<void> sleepFor(double seconds);

// An HTTP call to an agent; not sent when `client` has already left. Runs
// on `client`'s strand when one is given. While it is in flight, `cutter`
// (when given) holds what ends it as kFinish does (the call then ends as
// failed, status 0, unless the answer was on its way); it is emptied when
// the call returns. Call it on the same strand.
boost::asio::awaitable<UpstreamResult> callAgent(AgentEndpoint endpoint,
                                                 boost::beast::http::verb verb, std::string target,
                                                 std::string body, double timeout_s,
                                                 server::HttpExchange* client = nullptr,
                                                 OnClientLeaving leaving = OnClientLeaving::kFinish,
                                                 std::function<void()>* cutter = nullptr);

}  // namespace tandem::router
