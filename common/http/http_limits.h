// The limits of the HTTP front (http_connection.h), apart from it so that
// configuration structs can hold them without including Asio.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tandem::server {

// Bounds on what one connection may cost, for HttpService. The agent's
// ServerConfig and the router's RouterConfig hold one each, so both
// fronts share these defaults (docs/configuration.md#http-limits).
struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;            // request line + headers
  uint64_t max_body_bytes = 64ull * 1024 * 1024;  // one request body
  std::chrono::seconds request_timeout{30};  // a request's headers and body, from its first byte
  std::chrono::seconds idle_timeout{60};     // keep-alive: between two requests
  std::chrono::seconds write_timeout{30};    // one write (a response, a stream chunk)
  size_t max_pipelined_bytes = 1024 * 1024;  // read ahead while a request is answered
  // A body over large_body_bytes, or sent chunked (length unknown), is
  // large: at most max_large_requests large requests are read and handled
  // at once (from their head to their answer's last byte); one more is
  // answered 503 + Retry-After before its body is read.
  uint64_t large_body_bytes = 1024 * 1024;
  int max_large_requests = 2;
  // Client connections open at once (0: half the process's descriptor
  // limit, at most kAutoMaxConnections). One more closes the connection
  // idle longest, or, when every connection is in use, is answered 503 +
  // Retry-After and closed: the rest of the descriptors stay for the
  // server's own connections (agents, peers, model files).
  int64_t max_connections = 0;
};

inline constexpr int64_t kAutoMaxConnections = 65536;

// What the front counted about its connections (HttpService::frontStats),
// for the metrics of the process that serves with it (http_metrics.h).
struct HttpFrontStats {
  int64_t open_connections = 0;
  int64_t idle_connections = 0;  // of those, waiting for a request
  int64_t max_connections = 0;
  int64_t idle_connections_closed = 0;  // to make room for new ones
  int64_t connections_refused = 0;      // over the bound with none idle
};

// The values each limit accepts, inclusive: the agent's and the router's
// flags check these (docs/configuration.md#http-limits).
struct HttpLimitRange {
  int64_t min;
  int64_t max;
};
inline constexpr HttpLimitRange kMaxHeaderBytesRange{1024, int64_t{1} << 20};
inline constexpr HttpLimitRange kMaxBodyBytesRange{1024, int64_t{1} << 32};
inline constexpr HttpLimitRange kRequestTimeoutRange{1, 3600};
inline constexpr HttpLimitRange kIdleTimeoutRange{1, 86400};
inline constexpr HttpLimitRange kWriteTimeoutRange{1, 3600};
inline constexpr HttpLimitRange kLargeBodyBytesRange{1024, int64_t{1} << 32};
inline constexpr HttpLimitRange kMaxLargeRequestsRange{1, 1024};
inline constexpr HttpLimitRange kMaxConnectionsRange{0, int64_t{1} << 20};

// Paths served without the API key by default (HttpService::requireApiKey):
// probes, metrics scrapers, and the KV transfer calls between agents (signed
// with the KV secret instead).
inline constexpr const char* kDefaultApiKeyExemptPaths = "/health,/metrics,/v1/kv_transfer/";

}  // namespace tandem::server
