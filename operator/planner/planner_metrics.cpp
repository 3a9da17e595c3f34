#include "operator/planner/planner_metrics.h"

#include <sstream>

namespace tandem::planner {
namespace {

// A number in a sample or a label value: "0.9", not "0.90000000000000002".
std::string sampleValue(double value) {
  std::ostringstream out;
  out.precision(10);
  out << value;
  return out.str();
}

std::string labels(const PlannerMetricsSample& sample) {
  std::string text;
  if (!sample.ns.empty()) text = "namespace=\"" + sample.ns + "\",";
  const char* kind = sample.kind == PoolKind::kPrefill ? "PrefillPool" : "DecodePool";
  return text + "pool=\"" + sample.pool + "\",kind=\"" + kind + "\"";
}

}  // namespace

std::string plannerMetricsText(const std::vector<PlannerMetricsSample>& samples) {
  std::ostringstream out;
  out << "# HELP tandem_planner_desired_replicas Replicas the SLA planner's last decision asked "
         "for.\n# TYPE tandem_planner_desired_replicas gauge\n";
  for (const auto& sample : samples) {
    out << "tandem_planner_desired_replicas{" << labels(sample) << "} "
        << sample.metrics.desired_replicas << "\n";
  }
  out << "# HELP tandem_planner_observed_seconds The observed TTFT (prefill) or ITL (decode) "
         "quantile over the planner's window.\n# TYPE tandem_planner_observed_seconds gauge\n";
  for (const auto& sample : samples) {
    if (!sample.metrics.observed_seconds) continue;
    out << "tandem_planner_observed_seconds{" << labels(sample) << ",target_quantile=\""
        << sampleValue(sample.metrics.quantile) << "\"} "
        << sampleValue(*sample.metrics.observed_seconds) << "\n";
  }
  out << "# HELP tandem_planner_target_seconds The pool's targetTTFTSeconds or "
         "targetITLSeconds.\n# TYPE tandem_planner_target_seconds gauge\n";
  for (const auto& sample : samples) {
    out << "tandem_planner_target_seconds{" << labels(sample) << "} "
        << sampleValue(sample.metrics.target_seconds) << "\n";
  }
  return out.str();
}

}  // namespace tandem::planner
