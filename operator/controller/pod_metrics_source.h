// Where the SLA planner in the Kubernetes controller reads a pool's agents'
// metrics: straight from each pod's /metrics, or from a Prometheus server
// that scrapes them.
//
// - Pods: GET http://<status.podIP>:<port>/metrics, the port being the agent
//   container's port named "http" (the one the controller gives it). A pod
//   that does not answer within about a second is left out of the round.
// - Prometheus: one GET <url>/federate?match[]=... per round (Prometheus'
//   federation endpoint: the newest sample of every matching series, in the
//   text format), split into one text per pod by the series' pod label
//   (`pod` by default, what kubernetes_sd relabelling conventionally sets),
//   so the planner's windows see the same per-pod counters either way.
//
// Thread-safe: the controller's planner thread is the only caller, but
// nothing here is shared.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "operator/planner/metric_window.h"

namespace tandem::controller {

class PodMetricsSource {
 public:
  virtual ~PodMetricsSource() = default;
  // Metrics text by pod name for those of `pods` (Pod objects) that
  // answered; `names` are the series the planner reads.
  virtual std::map<std::string, std::string> scrape(const std::vector<nlohmann::json>& pods,
                                                    const planner::MetricNames& names) = 0;
  // "pods" or "prometheus <url>", for logs.
  virtual std::string describe() const = 0;
};

std::unique_ptr<PodMetricsSource> podScrapeSource();
// `url`: scheme://host:port[/prefix] of the Prometheus server.
std::unique_ptr<PodMetricsSource> prometheusFederationSource(std::string url,
                                                             std::string pod_label = "pod");

// host and port of a pod's /metrics: status.podIP and the container port
// named "http" (else the first container port); nullopt without an IP or a
// port.
std::optional<std::pair<std::string, int>> podMetricsAddress(const nlohmann::json& pod);

// The match[] selector that federation is asked for: every series `names`
// reads ({__name__=~"a_bucket|b|c"}).
std::string federationSelector(const planner::MetricNames& names);

// Splits a federation answer into one text per value of `pod_label`, keeping
// only the pods in `pods` (sample lines without the label are dropped).
std::map<std::string, std::string> splitByPod(std::string_view text, std::string_view pod_label,
                                              const std::vector<std::string>& pods);

}  // namespace tandem::controller
