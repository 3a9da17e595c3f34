// The agent's KV load-duration histogram: the engine counts each finished
// load in its bucket (cumulative, nothing pending between scrapes), and
// each render advances the Prometheus histogram by what was counted since
// the last one, so a load is counted once however often, or seldom, the
// agent is scraped.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>

#include "agent/engine/engine.h"
#include "agent/server/metrics.h"
#include "common/prometheus_text.h"

namespace tandem::server {
namespace {

std::optional<double> bucket(const std::string& text, const std::string& le) {
  return prometheusSample(text, "tandem_kv_transfer_duration_seconds_bucket",
                          "source=\"ucx\",le=\"" + le + "\"");
}

TEST(AgentMetrics, KvLoadDurationsAreCountedOnceInTheirBuckets) {
  AgentMetrics metrics("m", "decode");
  engine::EngineStats stats;
  stats.kv_connector = "ucx";
  engine::KvSourceTotals& ucx = stats.kv_sources["ucx"];
  ucx.addLoad(0.003);  // in (0.0025, 0.005]
  ucx.addLoad(0.005);  // a bound is its own bucket's
  ucx.addLoad(20.0);   // past the last bound
  std::string text = metrics.render(stats);
  EXPECT_EQ(bucket(text, "0.0025"), 0) << text;
  EXPECT_EQ(bucket(text, "0.005"), 2);
  EXPECT_EQ(bucket(text, "10"), 2);
  EXPECT_EQ(bucket(text, "+Inf"), 3);
  EXPECT_EQ(prometheusSample(text, "tandem_kv_transfer_duration_seconds_count", "source=\"ucx\""),
            3);
  EXPECT_NEAR(*prometheusSample(text, "tandem_kv_transfer_duration_seconds_sum", "source=\"ucx\""),
              20.008, 1e-9);

  // The same totals again: nothing new.
  text = metrics.render(stats);
  EXPECT_EQ(prometheusSample(text, "tandem_kv_transfer_duration_seconds_count", "source=\"ucx\""),
            3);
  ucx.addLoad(0.0001);
  text = metrics.render(stats);
  EXPECT_EQ(bucket(text, "0.0001"), 1);
  EXPECT_EQ(bucket(text, "+Inf"), 4);
}

// Every failure reason docs/metrics.md names for
// tandem_kv_transfer_failures_total is a series from the start (of an agent
// with a KV connector), at 0, so that increase() sees a reason's first
// failure.
TEST(AgentMetrics, EveryDocumentedTransferFailureReasonStartsAtZero) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/docs/metrics.md");
  std::stringstream docs;
  docs << in.rdbuf();
  std::string row;
  for (std::string line; std::getline(docs, line);) {
    if (line.starts_with("| `tandem_kv_transfer_failures_total{reason}`")) row = line;
  }
  ASSERT_FALSE(row.empty()) << "no row for tandem_kv_transfer_failures_total in docs/metrics.md";
  row = row.substr(0, row.find("(["));  // the reasons, before the link
  AgentMetrics metrics("m", "decode");
  engine::EngineStats stats;
  stats.kv_connector = "ucx";
  const std::string text = metrics.render(stats);
  const std::regex quoted("`([a-z_]+)`");
  int reasons = 0;
  for (auto it = std::sregex_iterator(row.begin(), row.end(), quoted); it != std::sregex_iterator();
       ++it) {
    const std::string reason = (*it)[1];
    if (reason == "reason") continue;
    ++reasons;
    EXPECT_EQ(
        prometheusSample(text, "tandem_kv_transfer_failures_total", "reason=\"" + reason + "\""), 0)
        << reason;
  }
  EXPECT_GE(reasons, 20);
}

}  // namespace
}  // namespace tandem::server
