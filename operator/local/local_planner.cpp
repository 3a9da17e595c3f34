#include "operator/local/local_planner.h"

#include <httplib.h>

#include "common/logging.h"
#include "operator/planner/planner_metrics.h"

namespace tandem::local {

using spec::AgentAddress;
using spec::PoolKind;
using spec::poolKindName;
using spec::PoolSpec;

namespace {

planner::PoolKind plannerKind(PoolKind kind) {
  return kind == PoolKind::kPrefill ? planner::PoolKind::kPrefill : planner::PoolKind::kDecode;
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
  std::vector<planner::PlannerMetricsSample> samples;
  for (const PoolPlannerStatus& status : statuses) {
    samples.push_back({"", status.pool, plannerKind(status.kind), status.decision.metrics});
  }
  return planner::plannerMetricsText(samples);
}

}  // namespace tandem::local
