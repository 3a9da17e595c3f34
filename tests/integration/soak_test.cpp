// `tandem-bench soak`, short: 30 s of multi-turn load through the router of
// a 1 prefill + 1 decode local cluster on the tiny model. Asserts that no
// request hung, was cut off or failed uncleanly, answers equal a colocated
// agent's, no KV block is left, and that an RSS slope is reported for the
// operator and every agent; nothing about the slopes' values or speed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

TEST(SoakTest, SteadyLoadReportsSlopesAndLeavesNothingBehind) {
  TempDir temp("tandem-soak-test");
  const fs::path out = temp.path() / "soak.stdout", report_path = temp.path() / "soak.json";
  const std::string command = std::string(TANDEM_BIN_DIR) +
                              "/tandem-bench soak --duration 30 --prefill 1 --decode 1 "
                              "--load-clients 2 --exactness-checks 100 --seed 3 --work-dir '" +
                              (temp.path() / "work").string() + "' --json '" +
                              report_path.string() + "' > '" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  const std::string output = readFile(out);
  ASSERT_TRUE(fs::exists(report_path)) << output;
  const json report = json::parse(readFile(report_path));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;

  const json& outcomes = report["outcomes"];
  EXPECT_GT(outcomes["ok"].get<int64_t>(), 0) << output;
  for (const char* kind : {"hang", "truncated", "unclean_error", "refused_or_reset"}) {
    EXPECT_EQ(outcomes[kind], 0) << kind << "\n" << output;
  }
  EXPECT_GT(report["exactness"]["checked"].get<int64_t>(), 0);
  EXPECT_EQ(report["exactness"]["mismatched"], 0) << report["exactness"].dump();
  EXPECT_EQ(report["end_state"]["leaked_blocks"], 0) << report["end_state"].dump(2);
  EXPECT_TRUE(report["ttft_ms"].is_object());

  // A slope with its fit for every process, sampled all along.
  std::set<std::string> processes;
  for (const json& series : report["rss"]) {
    processes.insert(series["process"].get<std::string>());
    EXPECT_GE(series["samples"].get<int>(), 10) << series["process"];
    EXPECT_TRUE(series["slope_kib_per_min"].is_number()) << series["process"];
    EXPECT_TRUE(series["r2"].is_number()) << series["process"];
  }
  EXPECT_EQ(processes, (std::set<std::string>{"operator", "prefill-0", "decode-0"}));
  EXPECT_NE(output.find("slope (KiB/min)"), std::string::npos) << output;
}

}  // namespace
