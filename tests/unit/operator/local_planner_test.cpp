// LocalPlanner without processes: a fake scraper serves synthetic /metrics
// texts and the time is passed in, so each round's decision is exact.
#include "operator/local/local_planner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "common/prometheus_text.h"
#include "tests/support/test_files.h"

namespace tandem::local {
namespace {

using spec::AgentAddress;
using spec::parseClusterSpec;
using spec::PoolKind;

const char* kCluster = R"(apiVersion: tandem.dev/v1alpha1
kind: PrefillPool
metadata: {name: prefill}
spec:
  model: {path: /models/m}
  autoscaling: {maxReplicas: 4, targetTTFTSeconds: 0.5, windowSeconds: 10,
                scaleDownStabilizationSeconds: 0}
---
apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode}
spec:
  model: {path: /models/m}
)";

// An agent's TTFT histogram with `slow` observations between 1 and 2 s.
std::string ttftText(int slow) {
  const std::string name = "tandem_time_to_first_token_seconds";
  const std::string labels = "model=\"m\",role=\"prefill\",";
  const std::string count = std::to_string(slow);
  return "# TYPE " + name + " histogram\n" + name + "_bucket{" + labels + "le=\"0.5\"} 0\n" + name +
         "_bucket{" + labels + "le=\"1\"} 0\n" + name + "_bucket{" + labels + "le=\"2\"} " + count +
         "\n" + name + "_bucket{" + labels + "le=\"+Inf\"} " + count + "\n" + name + "_count{" +
         labels.substr(0, labels.size() - 1) + "} " + count + "\n";
}

class LocalPlannerTest : public ::testing::Test {
 protected:
  LocalPlanner planner_{[this](const AgentAddress& agent) -> std::optional<std::string> {
    auto it = texts_.find(agent.name);
    if (it == texts_.end()) return std::nullopt;
    return it->second;
  }};
  std::map<std::string, std::string> texts_;

  static PlannedPool prefill(int replicas, std::vector<std::string> agents) {
    PlannedPool pool;
    pool.name = "prefill";
    pool.kind = PoolKind::kPrefill;
    pool.replicas = replicas;
    int port = 9000;
    for (const std::string& name : agents) pool.ready_agents.push_back({name, "127.0.0.1", port++});
    return pool;
  }
  static PlannedPool decode() {
    PlannedPool pool;
    pool.name = "decode";
    pool.kind = PoolKind::kDecode;
    pool.replicas = 1;
    pool.ready_agents.push_back({"decode-0", "127.0.0.1", 9100});
    return pool;
  }
};

TEST_F(LocalPlannerTest, PlansAutoscaledPoolsFromTheirAgentsMetrics) {
  planner_.configure(parseClusterSpec(kCluster, "c.yaml").pools);
  ASSERT_TRUE(planner_.active());

  // First round: one scrape per agent, no increase yet; the decode pool has
  // no spec.autoscaling and is not planned.
  texts_["prefill-0"] = ttftText(0);
  std::vector<PoolPlannerStatus> round = planner_.plan(100, {prefill(1, {"prefill-0"}), decode()});
  ASSERT_EQ(round.size(), 1u);
  EXPECT_EQ(round[0].pool, "prefill");
  EXPECT_EQ(round[0].time_seconds, 100);
  EXPECT_EQ(round[0].scraped_agents, 1);
  EXPECT_FALSE(round[0].decision.write);
  EXPECT_EQ(round[0].decision.desired_replicas, 1);

  // Ten slow first tokens: p90 = 1 + 1 * (9 / 10) = 1.9 s against 0.5 s, so
  // ceil(1 * 1.9 / 0.5) = 4 replicas, written. An agent that does not answer
  // is left out of the round.
  texts_["prefill-0"] = ttftText(10);
  round = planner_.plan(101, {prefill(1, {"prefill-0", "prefill-9"})});
  ASSERT_EQ(round.size(), 1u);
  EXPECT_EQ(round[0].scraped_agents, 1);
  const planner::Decision& decision = round[0].decision;
  EXPECT_TRUE(decision.write);
  EXPECT_EQ(decision.desired_replicas, 4);
  EXPECT_EQ(decision.reason, "ScaledUp");
  ASSERT_TRUE(decision.event);
  EXPECT_EQ(decision.event->reason, "ScaledUp");
  ASSERT_TRUE(decision.metrics.observed_seconds);
  EXPECT_NEAR(*decision.metrics.observed_seconds, 1.9, 1e-9);

  const std::string text = plannerMetricsText(round);
  EXPECT_EQ(prometheusSample(text, "tandem_planner_desired_replicas",
                             "pool=\"prefill\",kind=\"PrefillPool\""),
            4.0);
  EXPECT_EQ(prometheusSample(text, "tandem_planner_target_seconds", "pool=\"prefill\""), 0.5);
  EXPECT_NEAR(prometheusSample(text, "tandem_planner_observed_seconds", "target_quantile=\"0.9\"")
                  .value_or(0),
              1.9, 1e-9);
  // The exposition is valid: promtool refuses a gauge with a quantile label.
  if (const std::string promtool = ::tandem::testing::findSystemTool("promtool");
      !promtool.empty()) {
    ::tandem::testing::TempDir dir("planner-metrics");
    ::tandem::testing::writeFile(dir.path() / "metrics.txt", text);
    const std::string command = promtool + " check metrics < " +
                                (dir.path() / "metrics.txt").string() + " > " +
                                (dir.path() / "out").string() + " 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << ::tandem::testing::readFile(dir.path() / "out");
  }

  // A pool that loses spec.autoscaling is no longer planned.
  planner_.configure(parseClusterSpec(R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode}
spec:
  model: {path: /models/m}
)",
                                      "c.yaml")
                         .pools);
  EXPECT_FALSE(planner_.active());
  EXPECT_TRUE(planner_.plan(102, {prefill(4, {"prefill-0"})}).empty());
}

TEST_F(LocalPlannerTest, ObservedSeriesIsAbsentWithoutRequests) {
  planner_.configure(parseClusterSpec(kCluster, "c.yaml").pools);
  texts_["prefill-0"] = ttftText(3);
  planner_.plan(10, {prefill(1, {"prefill-0"})});
  const std::vector<PoolPlannerStatus> round = planner_.plan(11, {prefill(1, {"prefill-0"})});
  ASSERT_EQ(round.size(), 1u);
  EXPECT_FALSE(round[0].decision.metrics.observed_seconds);
  const std::string text = plannerMetricsText(round);
  EXPECT_FALSE(prometheusSample(text, "tandem_planner_observed_seconds"));
  EXPECT_EQ(prometheusSample(text, "tandem_planner_desired_replicas"), 1.0);
}

}  // namespace
}  // namespace tandem::local
