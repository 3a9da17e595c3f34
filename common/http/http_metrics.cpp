#include "common/http/http_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <algorithm>

namespace tandem::server {
namespace {

// The series of `family` with `labels` and key=value besides.
template <typename Metric>
Metric* seriesWith(prometheus::Family<Metric>& family, std::map<std::string, std::string> labels,
                   const char* key, const char* value) {
  labels[key] = value;
  return &family.Add(labels);
}

}  // namespace

HttpFrontMetrics::HttpFrontMetrics(prometheus::Registry& registry,
                                   const std::map<std::string, std::string>& labels) {
  auto& open = prometheus::BuildGauge()
                   .Name("tandem_http_connections")
                   .Help(
                       "Client connections open, by state: active (receiving or answering a "
                       "request) or idle (waiting for one)")
                   .Register(registry);
  active_ = seriesWith(open, labels, "state", "active");
  idle_ = seriesWith(open, labels, "state", "idle");
  max_ = &prometheus::BuildGauge()
              .Name("tandem_http_max_connections")
              .Help("Client connections that may be open at once (max_connections)")
              .Register(registry)
              .Add(labels);
  auto& over = prometheus::BuildCounter()
                   .Name("tandem_http_connections_over_limit_total")
                   .Help(
                       "Connections over max_connections, by what was done: closed_idle (the "
                       "connection idle longest was closed for it) or refused (503, none idle)")
                   .Register(registry);
  closed_idle_ = seriesWith(over, labels, "action", "closed_idle");
  refused_ = seriesWith(over, labels, "action", "refused");
}

void HttpFrontMetrics::update(const HttpFrontStats& stats) {
  idle_->Set(static_cast<double>(stats.idle_connections));
  active_->Set(
      static_cast<double>(std::max<int64_t>(0, stats.open_connections - stats.idle_connections)));
  max_->Set(static_cast<double>(stats.max_connections));
  auto advance = [](prometheus::Counter* counter, int64_t now, int64_t& reported) {
    if (now > reported) counter->Increment(static_cast<double>(now - reported));
    reported = std::max(reported, now);
  };
  advance(closed_idle_, stats.idle_connections_closed, reported_.idle_connections_closed);
  advance(refused_, stats.connections_refused, reported_.connections_refused);
}

}  // namespace tandem::server
