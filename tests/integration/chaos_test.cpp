// `tandem-bench chaos`, small: a 1 prefill + 2 decode local cluster on the
// tiny model (started through tandem-operator) whose router admits 4
// requests and queues 4, multi-turn load through it, one agent killed and
// one stopped then continued, 60 clients that leave at random moments, and
// an overload of 3× what the router admits.
// Asserts the properties the program reports, never its speed: nothing hung,
// no stream cut without an error event, every error clean, every answer
// equal to a colocated agent's, every KV block back, the router idle with
// its descriptors back, and a request served again after each kill.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

// No request may hang, be cut off without an error event, or fail without a
// JSON error.
void expectNoBrokenOutcome(const json& outcomes, const std::string& where) {
  EXPECT_EQ(outcomes["hang"], 0) << where;
  EXPECT_EQ(outcomes["truncated"], 0) << where;
  EXPECT_EQ(outcomes["unclean_error"], 0) << where;
}

// Runs `tandem-bench chaos ARGS` with its work directory and JSON report
// under `temp`: its exit status and output; the report in `report`.
int runChaos(const TempDir& temp, const std::string& args, std::string& output, json& report) {
  const fs::path out = temp.path() / "chaos.stdout", report_path = temp.path() / "chaos.json";
  const std::string command = std::string(TANDEM_BIN_DIR) + "/tandem-bench chaos " + args +
                              " --work-dir '" + (temp.path() / "work").string() + "' --json '" +
                              report_path.string() + "' > '" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  output = readFile(out);
  report = fs::exists(report_path) ? json::parse(readFile(report_path)) : json();
  return status;
}

TEST(ChaosTest, KillsStopsAbortsAndOverloadLeaveNothingBroken) {
  TempDir temp("tandem-chaos-test");
  std::string output;
  json report;
  const int status = runChaos(
      temp,
      "--prefill 1 --decode 2 --max-inflight 4 --max-queued 4 --kills 1 --stops 1 --drains 1 "
      "--event-gap 2 --stop-max 3 --aborts 60 --abort-clients 8 --overload-factor 3 "
      "--load-clients 2 --hang-timeout 20 --settle-timeout 45 --exactness-checks 300 --seed 7",
      output, report);
  ASSERT_TRUE(report.is_object()) << output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_EQ(report["failed"], json::array()) << output;

  // Load: requests in every scenario, none broken.
  const json& load = report["load"];
  EXPECT_GT(load["all"]["ok"].get<int64_t>(), 0) << output;
  expectNoBrokenOutcome(load["all"], "load");
  for (const char* phase : {"kill", "abort", "overload"}) {
    EXPECT_GT(load["phases"][phase]["requests"].get<int64_t>(), 0) << phase;
  }

  // One kill, one stop and one drain of a decode agent; a request
  // succeeded after each, a killed or drained agent came back.
  ASSERT_EQ(report["events"].size(), 3u) << output;
  int drains = 0;
  for (const json& event : report["events"]) {
    EXPECT_TRUE(event["recovery_s"].is_number()) << event.dump();
    if (event["action"] != "stop") {
      EXPECT_TRUE(event["restart_s"].is_number()) << event.dump();
    }
    if (event["action"] == "drain") {
      ++drains;
      EXPECT_EQ(event["role"], "decode");
    }
    expectNoBrokenOutcome(event["probes"], "probes after " + event["action"].get<std::string>());
  }
  EXPECT_EQ(drains, 1);

  // Every abort was made; every client that waited for bytes got some; the
  // requests after them succeeded.
  EXPECT_EQ(report["aborts"]["total"], 60);
  EXPECT_EQ(report["aborts"]["no_answer"], 0);
  EXPECT_EQ(report["aborts"]["after"]["ok"], report["aborts"]["after"]["requests"]);
  EXPECT_GT(report["aborts"]["after"]["requests"].get<int64_t>(), 0);

  // Overload: an answer or a clean 503 with Retry-After, nothing else.
  const json& overload = report["overload"];
  EXPECT_EQ(overload["clients"], 3 * (4 + 4));
  expectNoBrokenOutcome(overload["outcomes"], "overload");
  EXPECT_EQ(overload["outcomes"]["refused_or_reset"], 0);
  EXPECT_EQ(overload["rejected_503"], overload["rejected_with_retry_after"]);
  EXPECT_EQ(overload["outcomes"]["ok"].get<int64_t>() + overload["rejected_503"].get<int64_t>(),
            overload["clients"].get<int64_t>());

  // Every ok answer equals the colocated reference agent's.
  EXPECT_GT(report["exactness"]["checked"].get<int64_t>(), 0);
  EXPECT_EQ(report["exactness"]["mismatched"], 0) << report["exactness"].dump();
  EXPECT_EQ(report["exactness"]["reference_failures"], 0);

  // Every block back on every agent; the router idle, its descriptors back.
  const json& end = report["end_state"];
  EXPECT_TRUE(end["settled"].get<bool>()) << end.dump(2);
  EXPECT_EQ(end["leaked_blocks"], 0);
  ASSERT_EQ(end["agents"].size(), 3u);
  for (const json& agent : end["agents"]) {
    EXPECT_TRUE(agent["answered"].get<bool>()) << agent.dump();
    EXPECT_EQ(agent["free_blocks"], agent["total_blocks"]) << agent.dump();
    EXPECT_EQ(agent["held_blocks"], 0) << agent.dump();
  }
  for (const char* gauge : {"inflight_requests", "queued_requests"}) {
    const json& value = end["router"][gauge];
    EXPECT_TRUE(value.is_null() || value == 0) << gauge << " " << value;
  }
  EXPECT_LE(end["router"]["open_fds"].get<int>(), end["router"]["baseline_fds"].get<int>());
  // Streams the killed agent was serving moved (when it was a decode agent)
  // rather than ending: the count is reported, and none had nowhere to go
  // (two decode agents, one killed at a time).
  EXPECT_TRUE(end["router"]["migrations_resumed"].is_number()) << end["router"].dump();
  EXPECT_EQ(end["router"]["migrations_exhausted"], 0) << end["router"].dump();
  EXPECT_NE(output.find("streams moved off a failed decode agent"), std::string::npos);

  // The human table names every outcome kind.
  for (const char* kind : {"clean_error", "hang", "truncated", "refused_or_reset", "recovery"}) {
    EXPECT_NE(output.find(kind), std::string::npos) << kind;
  }
}

// The move scenario, small: two rounds (a drain, then a kill) of two streams
// of the tiny model; every stream completes, equal to the reference agent's
// answer, the agent that went comes back, no block is left held.
TEST(ChaosTest, StreamsWhoseDecodeAgentIsDrainedOrKilledComplete) {
  TempDir temp("tandem-chaos-move-test");
  std::string output;
  json report;
  const int status = runChaos(temp,
                              "--scenarios move --prefill 1 --decode 2 --moves 2 --move-streams 2 "
                              "--move-prompt-tokens 100 --move-output-tokens 380 --load-clients 1 "
                              "--hang-timeout 20 --settle-timeout 45 --seed 3",
                              output, report);
  ASSERT_TRUE(report.is_object()) << output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_EQ(report["failed"], json::array()) << output;
  ASSERT_EQ(report["moves"].size(), 2u) << output;
  EXPECT_EQ(report["moves"][0]["action"], "drain");
  EXPECT_EQ(report["moves"][1]["action"], "kill");
  for (const json& round : report["moves"]) {
    EXPECT_NE(round["agent"], "") << round.dump();
    EXPECT_EQ(round["complete"], 2) << round.dump();
    EXPECT_TRUE(round["restarted"].get<bool>()) << round.dump();
  }
  EXPECT_EQ(report["exactness"]["mismatched"], 0) << report["exactness"].dump();
  EXPECT_EQ(report["end_state"]["leaked_blocks"], 0);
  EXPECT_NE(output.find("router pause ms"), std::string::npos) << output;
}

}  // namespace
