// `tandem-bench router` against a real agent on the tiny model: it runs every
// request pair, and its JSON report has the direct, routed and added
// latencies and the router's decision count. Its cluster mode (`--agents`)
// against four simulated agents behind tandem-operator local: both prompt
// kinds are measured, every routed request is one decision, none fails.
// Nothing here depends on speed.
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

TEST(BenchRouter, ClusterModeCountsOneDecisionPerRoutedRequestForIdsAndText) {
  TempDir dir("tandem-bench-router-scale");
  const fs::path report = dir.path() / "router.json";
  const std::string command = std::string(TANDEM_BIN_DIR) +
                              "/tandem-bench router --agents 4 --prompt-tokens 4000 --requests 3 "
                              "--prompt both --simulate '" TANDEM_SOURCE_DIR
                              "/profiles/llama3.1-8b-h100.yaml' --kv-cache-memory 4GiB "
                              "--work-dir '" +
                              (dir.path() / "work").string() + "' --json '" + report.string() +
                              "' > '" + (dir.path() / "out").string() + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << readFile(dir.path() / "out");
  const json figures = json::parse(readFile(report));
  EXPECT_EQ(figures["mode"], "cluster");
  EXPECT_EQ(figures["agents"], 4);
  EXPECT_EQ(figures["prefill_agents"], 2);
  EXPECT_EQ(figures["decode_agents"], 2);
  EXPECT_EQ(figures["failures"], 0);
  // Per prompt kind: one warm-up pair, then the measured pairs.
  EXPECT_EQ(figures["routed_requests"], 2 * (3 + 1));
  EXPECT_EQ(figures["decisions"], figures["routed_requests"]);
  for (const char* kind : {"ids", "text"}) {
    const json& phase = figures["phases"][kind];
    ASSERT_TRUE(phase.is_object()) << kind;
    EXPECT_EQ(phase["failures"], 0) << kind;
    EXPECT_EQ(phase["routed_requests"], 4) << kind;
    EXPECT_EQ(phase["decisions"], 4) << kind;
    EXPECT_NEAR(phase["prompt_tokens"].get<double>(), 4000, 400) << kind;
    for (const char* key : {"direct_ms", "routed_ms", "added_ms"}) {
      ASSERT_TRUE(phase[key].is_object()) << kind << " " << key;
      EXPECT_EQ(phase[key]["count"], 3) << kind << " " << key;
    }
    EXPECT_GT(phase["decision_us"]["mean"].get<double>(), 0) << kind;
    EXPECT_GT(phase["decision_us"]["p50"].get<double>(), 0) << kind;
    EXPECT_LE(phase["decision_us"]["p50"].get<double>(), phase["decision_us"]["p99"].get<double>())
        << kind;
    EXPECT_GT(phase["decisions_per_second_per_thread"].get<double>(), 0) << kind;
  }
  EXPECT_NE(readFile(dir.path() / "out").find("decisions/s per thread"), std::string::npos);
}

}  // namespace
