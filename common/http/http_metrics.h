// The HTTP front's own series, registered by the agent's and the router's
// metrics alike (docs/metrics.md, "HTTP front"): connections open (active
// and idle), their bound, and what happened to connections over it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/http/http_limits.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
}  // namespace prometheus

namespace tandem::server {

class HttpFrontMetrics {
 public:
  // Every series carries `labels` (the agent's model and role; none on the
  // router).
  HttpFrontMetrics(prometheus::Registry& registry,
                   const std::map<std::string, std::string>& labels);

  // Sets the gauges and advances the counters by what was counted since the
  // last call. Not thread-safe: the caller's render lock covers it.
  void update(const HttpFrontStats& stats);

 private:
  prometheus::Gauge* active_;
  prometheus::Gauge* idle_;
  prometheus::Gauge* max_;
  prometheus::Counter* closed_idle_;
  prometheus::Counter* refused_;
  HttpFrontStats reported_;
};

}  // namespace tandem::server
