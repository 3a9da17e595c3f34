#include "operator/router/router_metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "common/prometheus_text.h"
#include "operator/router/router.h"

namespace tandem::router {
namespace {

std::optional<double> sample(const std::string& text, const std::string& name,
                             const std::string& labels) {
  return prometheusSample(text, name, labels);
}

TEST(RouterMetricsTest, AgentCountsAndRemovedAgentsSeries) {
  RouterMetrics metrics;
  std::string text = metrics.render();
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"prefill\""), 0);
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"decode\""), 0);

  metrics.setAgentCount("decode", 2);
  metrics.setAgentHealthy("decode-a", true);
  metrics.setIndexBlocks("decode-a", 7);
  metrics.setAgentHealthy("decode-b", false);
  text = metrics.render();
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"decode\""), 2);
  EXPECT_EQ(sample(text, "tandem_router_agent_healthy", "agent=\"decode-a\""), 1);
  EXPECT_EQ(sample(text, "tandem_router_index_blocks", "agent=\"decode-a\""), 7);

  metrics.removeAgent("decode-a");
  metrics.removeAgent("never-listed");  // nothing to remove: no effect
  text = metrics.render();
  EXPECT_EQ(sample(text, "tandem_router_agent_healthy", "agent=\"decode-a\""), std::nullopt);
  EXPECT_EQ(sample(text, "tandem_router_index_blocks", "agent=\"decode-a\""), std::nullopt);
  EXPECT_EQ(sample(text, "tandem_router_agent_healthy", "agent=\"decode-b\""), 0);
}

// A removed agent's upstream errors stay for the time given (scrapes must
// see the errors of an agent that died), then go; an agent listed again by
// then keeps its series. Before, every agent that ever failed a call kept
// one for good (a pod's name changes at every restart).
TEST(RouterMetricsTest, ARemovedAgentsUpstreamErrorsStayForAWhileThenGo) {
  const auto upstream_errors = [](RouterMetrics& metrics, const char* agent) {
    return sample(metrics.render(), "tandem_router_upstream_errors_total",
                  std::string("agent=\"") + agent + "\"");
  };
  RouterMetrics kept(std::chrono::hours(1));
  kept.countUpstreamError("decode-a");
  kept.countUpstreamError("decode-a");
  kept.removeAgent("decode-a");
  EXPECT_EQ(upstream_errors(kept, "decode-a"), 2);

  RouterMetrics brief(std::chrono::milliseconds(20));
  for (const char* agent : {"decode-a", "decode-b"}) {
    brief.setAgentHealthy(agent, true);
    brief.countUpstreamError(agent);
    brief.removeAgent(agent);
  }
  brief.setAgentHealthy("decode-b", true);  // listed again
  EXPECT_EQ(upstream_errors(brief, "decode-a"), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));  // past the 20 ms kept
  EXPECT_EQ(upstream_errors(brief, "decode-a"), std::nullopt);
  EXPECT_EQ(upstream_errors(brief, "decode-b"), 1);
}

// Decisions over large prompts are told apart: 15, 25 and 40 ms land in
// different buckets, and a 1.5 ms one is below the 2 ms bound.
TEST(RouterMetricsTest, DecisionBucketsSplitTensOfMilliseconds) {
  RouterMetrics metrics;
  for (double seconds : {0.0015, 0.015, 0.025, 0.04}) metrics.observeDecision(seconds, 0.5);
  const std::string text = metrics.render();
  const std::string name = "tandem_router_decision_seconds_bucket";
  EXPECT_EQ(sample(text, name, "le=\"0.001\""), 0);
  EXPECT_EQ(sample(text, name, "le=\"0.002\""), 1);
  EXPECT_EQ(sample(text, name, "le=\"0.01\""), 1);
  EXPECT_EQ(sample(text, name, "le=\"0.02\""), 2);
  EXPECT_EQ(sample(text, name, "le=\"0.03\""), 3);
  EXPECT_EQ(sample(text, name, "le=\"0.05\""), 4);
  EXPECT_EQ(sample(text, "tandem_router_decision_seconds_count", ""), 4);
}

// The router's /metrics follows setAgents: counts per role, and a series for
// each listed agent only. Agents are on a port nothing listens on, so none
// becomes healthy.
TEST(RouterMetricsTest, RouterMetricsFollowTheAgentSet) {
  RouterConfig config;
  config.port = 0;
  config.poll_interval_s = 0.05;
  config.prefill = {{"prefill-a", "127.0.0.1", 9}};
  config.decode = {{"decode-a", "127.0.0.1", 9}, {"decode-b", "127.0.0.1", 9}};
  Router router(config);
  router.start();
  httplib::Client client("127.0.0.1", router.port());
  auto metricsText = [&] {
    auto res = client.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  };

  std::string text = metricsText();
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"prefill\""), 1);
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"decode\""), 2);
  for (const char* agent : {"prefill-a", "decode-a", "decode-b"}) {
    EXPECT_EQ(sample(text, "tandem_router_agent_healthy", std::string("agent=\"") + agent + "\""),
              0)
        << agent;
  }

  // decode-b restarted elsewhere (same name, new address); decode-a left.
  router.setAgents({{"prefill-a", "127.0.0.1", 9}}, {{"decode-b", "127.0.0.2", 9}});
  text = metricsText();
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"prefill\""), 1);
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"decode\""), 1);
  EXPECT_EQ(sample(text, "tandem_router_agent_healthy", "agent=\"decode-a\""), std::nullopt);
  EXPECT_EQ(sample(text, "tandem_router_index_blocks", "agent=\"decode-a\""), std::nullopt);
  EXPECT_EQ(sample(text, "tandem_router_agent_healthy", "agent=\"decode-b\""), 0);

  router.setAgents({}, {});
  text = metricsText();
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"prefill\""), 0);
  EXPECT_EQ(sample(text, "tandem_router_agents", "role=\"decode\""), 0);
  EXPECT_EQ(text.find("agent=\""), std::string::npos) << text;
  router.stop(0);
}

}  // namespace
}  // namespace tandem::router
