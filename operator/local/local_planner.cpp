#include "operator/local/local_planner.h"

#include <httplib.h>

#include <sstream>

#include "common/logging.h"

namespace tandem::local {
namespace {

planner::PoolKind plannerKind(PoolKind kind) {
  return kind == PoolKind::kPrefill ? planner::PoolKind::kPrefill : planner::PoolKind::kDecode;
}

// A number in a sample or a label value: "0.9", not "0.90000000000000002".
std::string sampleValue(double value) {
  std::ostringstream out;
  out.precision(10);
  out << value;
  return out.str();
}

}  // namespace

MetricsScraper httpMetricsScraper() {
  return [](const AgentAddress& agent) -> std::optional<std::string> {
    httplib::Client client(agent.host, agent.port);
    client.set_connection_timeout(0, 300000);
    client.set_read_timeout(1, 0);
    auto response = client.Get("/metrics");
    if (!response || response->status != 200) return std::nullopt;
    return response->body;
  };
}

LocalPlanner::LocalPlanner(MetricsScraper scraper) : scraper_(std::move(scraper)) {}

void LocalPlanner::configure(const std::vector<PoolSpec>& pools) {
  std::map<std::string, Pool> next;
  for (const PoolSpec& pool : pools) {
    if (!pool.autoscaling) continue;
    const planner::AutoscalingSpec& spec = pool.autoscaling->spec;
    auto existing = pools_.find(pool.name);
    if (existing != pools_.end() && existing->second.kind == pool.kind) {
      Pool kept = std::move(existing->second);
      kept.planner.setSpec(spec);
      // The window's length is fixed at construction: a new length starts
      // an empty window (the planner holds until it has two scrapes).
      if (kept.window.windowSeconds() != spec.window_seconds) {
        kept.window = planner::MetricWindow(planner::agentMetricNames(plannerKind(pool.kind)),
                                            spec.window_seconds);
      }
      next.emplace(pool.name, std::move(kept));
      continue;
    }
    TANDEM_LOG(kInfo) << "local: planner on for " << poolKindName(pool.kind) << " " << pool.name
                      << ": replicas " << spec.min_replicas << ".." << spec.max_replicas;
    next.emplace(pool.name,
                 Pool{pool.kind, planner::PoolPlanner(pool.name, plannerKind(pool.kind), spec),
                      planner::MetricWindow(planner::agentMetricNames(plannerKind(pool.kind)),
                                            spec.window_seconds)});
  }
  for (const auto& [name, pool] : pools_) {
    if (!next.contains(name)) {
      TANDEM_LOG(kInfo) << "local: planner off for pool " << name;
    }
  }
  pools_ = std::move(next);
}

std::vector<PoolPlannerStatus> LocalPlanner::plan(double now_seconds,
                                                  const std::vector<PlannedPool>& pools) {
  std::vector<PoolPlannerStatus> statuses;
  for (const PlannedPool& seen : pools) {
    auto it = pools_.find(seen.name);
    if (it == pools_.end() || it->second.kind != seen.kind) continue;
    Pool& pool = it->second;
    PoolPlannerStatus status;
    status.pool = seen.name;
    status.kind = seen.kind;
    status.time_seconds = now_seconds;
    for (const AgentAddress& agent : seen.ready_agents) {
      std::optional<std::string> text = scraper_(agent);
      if (!text) {
        TANDEM_LOG(kWarn) << "local: planner: no /metrics from " << agent.name << " (" << agent.host
                          << ":" << agent.port << "); left out of this round";
        continue;
      }
      Status added = pool.window.addScrape(agent.name, now_seconds, *text);
      if (!added.isOk()) {
        TANDEM_LOG(kWarn) << "local: planner: " << agent.name << ": " << added.message();
        continue;
      }
      ++status.scraped_agents;
    }
    planner::PoolObservation observation;
    observation.now_seconds = now_seconds;
    observation.spec_replicas = seen.replicas;
    observation.ready_replicas = static_cast<int>(seen.ready_agents.size());
    // Local processes are never Pending and no HPA exists here.
    observation.hpa_present = false;
    observation.replicas_changed_externally = seen.replicas_changed_externally;
    const planner::AutoscalingSpec& spec = pool.planner.spec();
    status.decision =
        pool.planner.decide(observation, pool.window.values(now_seconds, spec.quantile));
    statuses.push_back(std::move(status));
  }
  return statuses;
}

std::string plannerMetricsText(const std::vector<PoolPlannerStatus>& statuses) {
  std::ostringstream out;
  auto labels = [](const PoolPlannerStatus& status) {
    return std::string("pool=\"") + status.pool + "\",kind=\"" + poolKindName(status.kind) + "\"";
  };
  out << "# HELP tandem_planner_desired_replicas Replicas the SLA planner's last decision asked "
         "for.\n# TYPE tandem_planner_desired_replicas gauge\n";
  for (const auto& status : statuses) {
    out << "tandem_planner_desired_replicas{" << labels(status) << "} "
        << status.decision.metrics.desired_replicas << "\n";
  }
  out << "# HELP tandem_planner_observed_seconds The observed TTFT (prefill) or ITL (decode) "
         "quantile over the planner's window.\n# TYPE tandem_planner_observed_seconds gauge\n";
  for (const auto& status : statuses) {
    const planner::DecisionMetrics& metrics = status.decision.metrics;
    if (!metrics.observed_seconds) continue;
    out << "tandem_planner_observed_seconds{" << labels(status) << ",quantile=\""
        << sampleValue(metrics.quantile) << "\"} " << sampleValue(*metrics.observed_seconds)
        << "\n";
  }
  out << "# HELP tandem_planner_target_seconds The pool's targetTTFTSeconds or "
         "targetITLSeconds.\n# TYPE tandem_planner_target_seconds gauge\n";
  for (const auto& status : statuses) {
    out << "tandem_planner_target_seconds{" << labels(status) << "} "
        << sampleValue(status.decision.metrics.target_seconds) << "\n";
  }
  return out.str();
}

}  // namespace tandem::local
