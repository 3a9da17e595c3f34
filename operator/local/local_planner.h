// The SLA planner in local mode: for every pool of the cluster file with
// spec.autoscaling, one planner::PoolPlanner and one planner::MetricWindow.
// Each round scrapes the pool's ready agents (GET /metrics; they are local
// processes) into the pool's window and asks the pool's planner for a
// Decision; LocalMode applies a Decision whose `write` is true by changing the
// pool's replicas the way an edit of the file does, and records its Event.
//
// In local mode no replica is ever Pending (a process starts or fails) and no
// HorizontalPodAutoscaler exists, so the planner's capacity and conflict
// rules never fire here; everything else (windows, stabilisation, step,
// manual changes) is the same as in the Kubernetes controller.
//
// Time is passed in (monotonic seconds), as the planner's is. Not
// thread-safe: LocalMode's owner thread drives it and publishes copies of its
// results.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "operator/planner/metric_window.h"
#include "operator/planner/planner.h"
#include "operator/spec/cluster_spec.h"

namespace tandem::local {

// What local mode runs of one pool at the time of a round.
struct PlannedPool {
  std::string name;
  spec::PoolKind kind = spec::PoolKind::kDecode;
  // The replicas local mode runs the pool with now.
  int replicas = 0;
  // The pool's ready agents (scraped; their count is the ready replicas).
  std::vector<spec::AgentAddress> ready_agents;
  // The cluster file changed the pool's replicas since the previous round.
  bool replicas_changed_externally = false;
};

// One pool's decision of one round.
struct PoolPlannerStatus {
  std::string pool;
  spec::PoolKind kind = spec::PoolKind::kDecode;
  double time_seconds = 0;  // the round's time (the caller's clock)
  int scraped_agents = 0;   // agents whose /metrics answered this round
  planner::Decision decision;
};

// Fetches an agent's /metrics text; nullopt when it did not answer.
using MetricsScraper = std::function<std::optional<std::string>(const spec::AgentAddress& agent)>;
// GET http://HOST:PORT/metrics with short timeouts (an agent that does not
// answer within about a second is left out of the round).
MetricsScraper httpMetricsScraper();

class LocalPlanner {
 public:
  explicit LocalPlanner(MetricsScraper scraper = httpMetricsScraper());

  // The pools to plan: a planner for each pool with spec.autoscaling (a new
  // one for a pool seen for the first time, its spec updated for one seen
  // before, forgotten for a pool without it any more).
  void configure(const std::vector<spec::PoolSpec>& pools);
  // Whether any pool is planned.
  bool active() const { return !pools_.empty(); }

  // One round at `now_seconds` (non-decreasing): for each planned pool found
  // in `pools`, scrape its ready agents and decide. A scrape that fails or
  // cannot be parsed leaves that agent out of the round (logged).
  std::vector<PoolPlannerStatus> plan(double now_seconds, const std::vector<PlannedPool>& pools);

 private:
  struct Pool {
    spec::PoolKind kind;
    planner::PoolPlanner planner;
    planner::MetricWindow window;
  };

  MetricsScraper scraper_;
  std::map<std::string, Pool> pools_;
};

// The planner's metrics (docs/planner.md#metrics) in the Prometheus text
// format, one series per pool with labels pool and kind:
// tandem_planner_desired_replicas, tandem_planner_observed_seconds{target_quantile}
// (absent while a pool had no requests in its window) and
// tandem_planner_target_seconds.
std::string plannerMetricsText(const std::vector<PoolPlannerStatus>& statuses);

}  // namespace tandem::local
