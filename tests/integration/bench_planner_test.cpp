// `tandem-bench planner`, short: two 15 s phases through the router of a
// generated local cluster of simulated agents (the H100 profile, the tiny
// model) whose prefill TTFT target (0.1 ms) cannot be met, so the planner
// must grow the prefill pool. Asserts what the JSON reports: prefill grew
// past one replica, decode stayed within its bounds, every request succeeded,
// the planner's ScaledUp Event was seen, the per-phase figures are there, and
// the PNG starts with the PNG signature (when gnuplot is installed). Nothing
// about speed. Also: a malformed --phases is refused naming the option.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

constexpr int kMaxReplicas = 3;

bool gnuplotInstalled() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

int runBench(const std::string& args, const fs::path& out) {
  const std::string command = std::string(TANDEM_BIN_DIR) + "/tandem-bench planner " + args +
                              " > '" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(BenchPlannerTest, UnmeetableTtftTargetGrowsThePrefillPool) {
  TempDir temp("tandem-bench-planner-test");
  tandem::tools::TestModelOptions model;
  model.seed = 5;
  tandem::tools::writeTestModel(model, temp.path() / "tiny");
  const bool plot = gnuplotInstalled();
  const fs::path out = temp.path() / "planner.stdout", report_path = temp.path() / "planner.json",
                 png = temp.path() / "planner.png";
  const std::string args =
      "--phases 15s:4:prefill,15s:4:decode --planner-interval 0.5 --model-dir '" +
      (temp.path() / "tiny").string() + "' --profile '" + TANDEM_SOURCE_DIR +
      "/profiles/llama3.1-8b-h100.yaml' --max-replicas " + std::to_string(kMaxReplicas) +
      " --target-ttft 0.0001 --target-itl 100 --window 3 --scale-down-stabilization 60"
      " --prefill-prompt-tokens 256 --prefill-output-tokens 4 --decode-prompt-tokens 32"
      " --decode-output-tokens 32 --vocab-range 3:500 --seed 7 --work-dir '" +
      (temp.path() / "work").string() + "' --json '" + report_path.string() + "'" +
      (plot ? " --plot '" + png.string() + "'" : std::string());
  const int exit_code = runBench(args, out);
  const std::string output = readFile(out);
  ASSERT_TRUE(fs::exists(report_path)) << output;
  EXPECT_EQ(exit_code, 0) << output;
  const json report = json::parse(readFile(report_path));

  const json& overall = report["overall"];
  EXPECT_TRUE(report["all_succeeded"].get<bool>()) << output;
  EXPECT_GT(overall["requests"].get<int>(), 0) << output;
  EXPECT_EQ(overall["failed"], 0) << output;
  EXPECT_GT(overall["prefill_replicas"]["max"].get<int>(), 1) << output;
  EXPECT_LE(overall["prefill_replicas"]["max"].get<int>(), kMaxReplicas) << output;
  EXPECT_GE(overall["decode_replicas"]["min"].get<int>(), 1) << output;
  EXPECT_LE(overall["decode_replicas"]["max"].get<int>(), kMaxReplicas) << output;
  // The unmeetable target is missed, and goodput counts no request as good.
  EXPECT_GT(overall["prefill_missed_s"].get<int>(), 0) << output;
  EXPECT_EQ(overall["good"], 0) << output;
  EXPECT_EQ(report["targets"]["ttft_s"], 0.0001);
  EXPECT_EQ(report["targets"]["itl_s"], 100);

  ASSERT_EQ(report["phases"].size(), 2u);
  EXPECT_EQ(report["phases"][0]["name"], "15s:4:prefill");
  EXPECT_EQ(report["phases"][1]["name"], "15s:4:decode");
  int phase_requests = 0;
  for (const json& phase : report["phases"]) phase_requests += phase["requests"].get<int>();
  EXPECT_EQ(phase_requests, overall["requests"].get<int>());

  bool prefill_scaled_up = false;
  for (const json& event : report["events"]) {
    const std::string text = event["text"].get<std::string>();
    prefill_scaled_up |= text.starts_with("ScaledUp: prefill pool prefill:");
  }
  EXPECT_TRUE(prefill_scaled_up) << report["events"].dump(2);
  EXPECT_GE(report["seconds"].size(), 30u);

  if (!plot) GTEST_SKIP() << "gnuplot is not installed (package gnuplot-nox): PNG not checked";
  const std::string image = readFile(png);
  ASSERT_GE(image.size(), 8u) << output;
  EXPECT_EQ(image.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(BenchPlannerTest, MalformedPhasesAreRefusedNamingTheOption) {
  TempDir temp("tandem-bench-planner-phases");
  const fs::path out = temp.path() / "out";
  EXPECT_EQ(runBench("--phases 10s:fast:prefill --work-dir '" + temp.path().string() + "'", out),
            1);
  const std::string output = readFile(out);
  EXPECT_NE(output.find("--phases: the rate of phase '10s:fast:prefill' must be a number above 0"),
            std::string::npos)
      << output;
  EXPECT_EQ(runBench("--phases 10s:2:mixed --work-dir '" + temp.path().string() + "'", out), 1);
  EXPECT_NE(readFile(out).find("must be prefill or decode, got 'mixed'"), std::string::npos)
      << readFile(out);
}

}  // namespace
