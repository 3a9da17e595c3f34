// `tandem-bench serve` against a real `tandem-agent serve` on a tiny model:
// every request accounted for, exact token counts, the JSON report's shape,
// and failures counted with their reasons. Nothing here depends on speed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/agent_process.h"
#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::BenchRun;
using ::tandem::testing::ChildProcess;
using ::tandem::testing::TempDir;

class BenchServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tandem::tools::TestModelOptions options;
    options.seed = 3;
    tandem::tools::writeTestModel(options, dir_ / "tiny");
    std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-agent",
                                     "serve",
                                     "--model",
                                     (dir_ / "tiny").string(),
                                     "--port",
                                     "0",
                                     "--served-model-name",
                                     "tiny"};
    agent_ = std::make_unique<ChildProcess>(argv, dir_ / "agent.stderr");
    const std::string line = agent_->waitForLine("listening on ", std::chrono::seconds(60));
    ASSERT_FALSE(line.empty()) << "agent did not start: " << agent_->stderrText();
    url_ = "http://127.0.0.1:" + line.substr(line.rfind(':') + 1);
  }

  // Runs tandem-bench serve against the agent with `args`; reads its JSON report.
  BenchRun bench(const std::string& args) {
    return ::tandem::testing::runBench(dir_, "serve",
                                       "--url " + url_ + " --vocab-range 100:500 " + args);
  }

  TempDir temp_{"tandem-bench-serve-test"};
  fs::path dir_ = temp_.path();
  std::unique_ptr<ChildProcess> agent_;
  std::string url_;
};

TEST_F(BenchServeTest, EveryRequestCompletesWithTheTokenCountsAsked) {
  BenchRun run = bench("--num-prompts 6 --input-len 16 --output-len 8 --max-concurrency 2");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.err, "") << "no progress bar when stderr is not a terminal";
  const json& r = run.report;
  EXPECT_EQ(r["model"], "tiny") << "the model comes from /v1/models";
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 6 * 16);
  EXPECT_EQ(r["total_output_tokens"], 6 * 8);
  EXPECT_EQ(r["length_mismatches"], 0);
  EXPECT_LE(r["peak_concurrency"].get<int>(), 2);
  EXPECT_TRUE(r["request_rate"].is_null()) << "null stands for all at once";
  EXPECT_TRUE(r["request_goodput"].is_null()) << "no SLO was given";
  EXPECT_EQ(r["errors"], json::array());
  for (const char* key :
       {"duration_s", "request_throughput", "output_throughput", "total_token_throughput"}) {
    EXPECT_TRUE(r[key].is_number()) << key;
  }
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) {
    ASSERT_TRUE(r[key].is_object()) << key;
    for (const char* stat : {"mean", "median", "p90", "p99"}) {
      EXPECT_TRUE(r[key][stat].is_number()) << key << "." << stat;
    }
  }
  EXPECT_EQ(r["ttft_ms"]["count"], 6);
  EXPECT_EQ(r["e2el_ms"]["count"], 6);

  ASSERT_EQ(r["requests"].size(), 6u);
  for (const json& request : r["requests"]) {
    EXPECT_TRUE(request["success"].get<bool>()) << request.dump();
    EXPECT_EQ(request["input_len"], 16);
    EXPECT_EQ(request["prompt_tokens"], 16);
    EXPECT_EQ(request["output_len"], 8);
    EXPECT_EQ(request["completion_tokens"], 8);
    // Each gap joins two token chunks; a chunk may carry more than one token.
    EXPECT_GE(request["itl_ms"].size(), 1u);
    EXPECT_LE(request["itl_ms"].size(), 7u);
    // Order, not speed: the first token comes before the end.
    EXPECT_LE(request["ttft_ms"].get<double>(), request["e2el_ms"].get<double>());
  }
  EXPECT_NE(run.out.find("requests completed / failed"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("TTFT"), std::string::npos) << run.out;
}

TEST_F(BenchServeTest, PoissonArrivalsAndLengthRangesKeepExactCounts) {
  BenchRun run = bench(
      "--num-prompts 8 --input-len 20 --input-len-range 0.5 --output-len 6 --output-len-range 0.5 "
      "--request-rate 50 --seed 9 --goodput ttft:100000 e2el:100000");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  EXPECT_EQ(r["completed"], 8);
  EXPECT_EQ(r["request_rate"], 50.0);
  EXPECT_EQ(r["slo_ms"]["ttft"], 100000.0);
  EXPECT_TRUE(r["slo_ms"]["tpot"].is_null());
  // SLOs of 100 s are met by every request, so goodput equals throughput.
  EXPECT_DOUBLE_EQ(r["request_goodput"].get<double>(), r["request_throughput"].get<double>());
  int64_t input_total = 0, output_total = 0;
  double previous_arrival = 0.0;
  for (const json& request : r["requests"]) {
    const int64_t input_len = request["input_len"], output_len = request["output_len"];
    EXPECT_GE(input_len, 10);
    EXPECT_LE(input_len, 30);
    EXPECT_GE(output_len, 3);
    EXPECT_LE(output_len, 9);
    EXPECT_EQ(request["prompt_tokens"], input_len);
    EXPECT_EQ(request["completion_tokens"], output_len);
    EXPECT_GE(request["arrival_s"].get<double>(), previous_arrival) << "arrivals are in order";
    previous_arrival = request["arrival_s"];
    input_total += input_len;
    output_total += output_len;
  }
  EXPECT_EQ(r["total_input_tokens"], input_total);
  EXPECT_EQ(r["total_output_tokens"], output_total);

  // The same seed gives the same requests.
  BenchRun again = bench(
      "--num-prompts 8 --input-len 20 --input-len-range 0.5 --output-len 6 --output-len-range 0.5 "
      "--request-rate 50 --seed 9");
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(again.report["requests"][i]["input_len"], r["requests"][i]["input_len"]);
    EXPECT_EQ(again.report["requests"][i]["output_len"], r["requests"][i]["output_len"]);
    EXPECT_EQ(again.report["requests"][i]["arrival_s"], r["requests"][i]["arrival_s"]);
  }
}

TEST_F(BenchServeTest, RejectedRequestsAreCountedWithTheirReason) {
  BenchRun run = bench("--model nope --num-prompts 3 --input-len 8 --output-len 4");
  EXPECT_EQ(run.exit_code, 1) << "failed requests make the exit code non-zero";
  const json& r = run.report;
  EXPECT_EQ(r["completed"], 0);
  EXPECT_EQ(r["failed"], 3);
  ASSERT_EQ(r["errors"].size(), 3u);
  EXPECT_NE(r["errors"][0].get<std::string>().find("HTTP 404"), std::string::npos) << r["errors"];
  EXPECT_TRUE(r["ttft_ms"].is_null()) << "nothing was measured";
  EXPECT_FALSE(r["requests"][0]["success"].get<bool>());
  EXPECT_NE(run.out.find("error: request 0: HTTP 404"), std::string::npos) << run.out;
}

// --priority is sent with every request: this agent serves first come,
// first served, so it takes 0 and refuses 4 naming the field.
TEST_F(BenchServeTest, APriorityIsSentWithEveryRequest) {
  BenchRun zero = bench("--priority 0 --num-prompts 2 --input-len 8 --output-len 4");
  ASSERT_EQ(zero.exit_code, 0) << zero.out << zero.err;
  EXPECT_EQ(zero.report["priority"], 0);
  EXPECT_EQ(zero.report["completed"], 2);
  BenchRun four = bench("--priority 4 --num-prompts 2 --input-len 8 --output-len 4");
  EXPECT_EQ(four.exit_code, 1);
  EXPECT_EQ(four.report["priority"], 4);
  EXPECT_EQ(four.report["failed"], 2);
  ASSERT_FALSE(four.report["errors"].empty());
  EXPECT_NE(four.report["errors"][0].get<std::string>().find("priority must be 0"),
            std::string::npos)
      << four.report["errors"];
  BenchRun none = bench("--num-prompts 1 --input-len 8 --output-len 4");
  EXPECT_TRUE(none.report["priority"].is_null());
}

TEST_F(BenchServeTest, BadOptionsAreRefusedNamingWhatIsAccepted) {
  BenchRun too_long = bench("--num-prompts 1 --input-len 500 --output-len 100");
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.err.find("max_model_len"), std::string::npos) << too_long.err;

  BenchRun bad_slo = bench("--num-prompts 1 --goodput ttft:fast");
  EXPECT_EQ(bad_slo.exit_code, 1);
  EXPECT_NE(bad_slo.err.find("--goodput takes ttft:MS, tpot:MS or e2el:MS"), std::string::npos)
      << bad_slo.err;
}

}  // namespace
