// `tandem-bench router` against a real agent on the tiny model: it runs every
// request pair, and its JSON report has the direct, routed and added
// latencies and the router's decision count. Nothing here depends on speed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/support/agent_server.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

TEST(BenchRouter, ReportsRoutedAgainstDirectLatencyAndDecisions) {
  Agent agent;
  TempDir dir("tandem-bench-router");
  const fs::path report = dir.path() / "router.json";
  const std::string command =
      std::string(TANDEM_BIN_DIR) +
      "/tandem-bench router --agent-url http://127.0.0.1:" + std::to_string(agent.port()) +
      " --requests 6 --prompt-tokens 40 --json '" + report.string() + "' > '" +
      (dir.path() / "out").string() + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << readFile(dir.path() / "out");
  const json figures = json::parse(readFile(report));
  EXPECT_EQ(figures["requests"], 6);
  for (const char* key : {"direct_ms", "routed_ms", "added_ms"}) {
    ASSERT_TRUE(figures[key].is_object()) << key;
    EXPECT_EQ(figures[key]["count"], 6) << key;
  }
  EXPECT_GT(figures["direct_ms"]["median"].get<double>(), 0);
  EXPECT_GT(figures["routed_ms"]["median"].get<double>(), 0);
  EXPECT_EQ(figures["decisions"], 7) << "one decision per routed request, warm-up included";
  EXPECT_GT(figures["decision_mean_us"].get<double>(), 0);
  EXPECT_NE(readFile(dir.path() / "out").find("decisions/s per thread"), std::string::npos);
}

}  // namespace
