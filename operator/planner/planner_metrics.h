// The SLA planner's metrics (docs/planner.md#metrics) in the Prometheus text
// format, for whichever process runs the planner: the Kubernetes controller
// appends them to its /metrics, local mode serves them on its own. One
// series per pool, labelled namespace (when the process knows one), pool and
// kind (PrefillPool or DecodePool, as tandem_operator_pool_replicas has it):
//
//   tandem_planner_desired_replicas    the last decision's replicas
//   tandem_planner_observed_seconds    the observed TTFT/ITL quantile over the
//                                      window, label target_quantile (not
//                                      quantile: reserved for summaries);
//                                      absent while the pool had no
//                                      requests in it
//   tandem_planner_target_seconds      targetTTFTSeconds / targetITLSeconds
//
// Pure function of its input.
#pragma once

#include <string>
#include <vector>

#include "operator/planner/autoscaling_spec.h"
#include "operator/planner/planner.h"

namespace tandem::planner {

struct PlannerMetricsSample {
  std::string ns;  // "" leaves the namespace label out
  std::string pool;
  PoolKind kind = PoolKind::kDecode;
  DecisionMetrics metrics;
};

std::string plannerMetricsText(const std::vector<PlannerMetricsSample>& samples);

}  // namespace tandem::planner
