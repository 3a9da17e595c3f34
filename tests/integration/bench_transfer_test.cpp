// `tandem-bench transfer` on the tiny model over shared memory: it starts
// its own prefill and decode agents, moves exactly the blocks asked for
// (split into hand-offs that fit the context), and reports every figure in
// its JSON. Nothing here depends on speed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"

namespace {

using nlohmann::json;
using ::tandem::testing::BenchRun;

// The tiny model's KV block: 2 layers x K,V x 16 tokens x 2 KV heads x 16 x 2 bytes (bf16).
constexpr int64_t kBlockBytes = 4096;

class BenchTransferTest : public ::tandem::testing::TinyModelBenchTest<BenchTransferTest> {
 public:
  static constexpr const char* kSubcommand = "transfer";
  static constexpr uint64_t kSeed = 5;

 protected:
  static bool perftestInstalled() {
    return std::system("command -v ucx_perftest > /dev/null 2>&1") == 0;
  }
};

TEST_F(BenchTransferTest, MovesExactlyTheBlocksAskedAndReportsEveryFigure) {
  // 40 blocks do not fit the tiny model's 512-token context in one prompt:
  // two hand-offs of 20.
  BenchRun run = bench("--blocks 4,40 --transports sm --ttft-prompts 64 --repeats 2");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  EXPECT_EQ(r["block_size"], 16);
  EXPECT_EQ(r["kv_dtype"], "bf16");
  EXPECT_EQ(r["block_bytes"], kBlockBytes);
  EXPECT_EQ(r["max_model_len"], 512);
  EXPECT_EQ(r["max_blocks_per_handoff"], 31)
      << "(512 - 2) / 16: a k-block prompt has k*16+1 tokens";
  EXPECT_EQ(r["repeats"], 2);
  EXPECT_EQ(r["problems"], json::array());

  ASSERT_EQ(r["transfers"].size(), 2u);
  const bool perftest = perftestInstalled();
  for (const json& t : r["transfers"]) {
    const int64_t blocks = t["blocks"];
    SCOPED_TRACE("blocks " + std::to_string(blocks));
    for (const char* key :
         {"transport", "blocks", "handoffs", "message_bytes", "bytes", "read_seconds",
          "remote_runs", "agent_gbps", "ucx_perftest_gbps", "ucx_perftest_error", "memcpy_gbps",
          "agent_over_memcpy", "agent_over_ucx_perftest", "runs"}) {
      EXPECT_TRUE(t.contains(key)) << key;
    }
    EXPECT_EQ(t["transport"], "sm");
    EXPECT_EQ(t["handoffs"], blocks == 40 ? 2 : 1);
    EXPECT_EQ(t["message_bytes"], blocks * kBlockBytes) << "the references move the same bytes";
    EXPECT_EQ(t["bytes"], blocks * kBlockBytes);
    EXPECT_GE(t["remote_runs"].get<int64_t>(), t["handoffs"].get<int64_t>());
    ASSERT_EQ(t["runs"].size(), 2u);
    for (const json& one : t["runs"]) {
      EXPECT_EQ(one["bytes"], blocks * kBlockBytes);
      EXPECT_EQ(one["blocks_loaded"], blocks);
      EXPECT_GT(one["seconds"].get<double>(), 0.0);
      EXPECT_GT(one["gbps"].get<double>(), 0.0);
    }
    EXPECT_GT(t["read_seconds"].get<double>(), 0.0);
    EXPECT_GT(t["agent_gbps"].get<double>(), 0.0);
    EXPECT_GT(t["memcpy_gbps"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(t["agent_over_memcpy"].get<double>(),
                     t["agent_gbps"].get<double>() / t["memcpy_gbps"].get<double>());
    if (perftest) {
      ASSERT_TRUE(t["ucx_perftest_gbps"].is_number()) << t["ucx_perftest_error"];
      EXPECT_GT(t["ucx_perftest_gbps"].get<double>(), 0.0);
      EXPECT_TRUE(t["ucx_perftest_error"].is_null());
      EXPECT_GT(t["agent_over_ucx_perftest"].get<double>(), 0.0);
    } else {
      EXPECT_TRUE(t["ucx_perftest_gbps"].is_null());
      EXPECT_NE(t["ucx_perftest_error"].get<std::string>().find("not found"), std::string::npos);
    }
  }

  ASSERT_EQ(r["ttft"].size(), 1u);
  const json& ttft = r["ttft"][0];
  EXPECT_EQ(ttft["transport"], "sm");
  EXPECT_EQ(ttft["requested_prompt_tokens"], 64);
  EXPECT_EQ(ttft["prompt_tokens"], 64);
  EXPECT_EQ(ttft["blocks_read"], 3) << "the block holding the last prompt token is computed";
  for (const char* key : {"prefill_ttft_ms", "decode_ttft_ms", "read_ms"}) {
    EXPECT_GT(ttft[key].get<double>(), 0.0) << key;
  }
  // The read happens inside the decode request, so its share is below one.
  EXPECT_GT(ttft["read_share"].get<double>(), 0.0);
  EXPECT_LT(ttft["read_share"].get<double>(), 1.0);

  for (const char* column : {"agent GB/s", "ucx_perftest GB/s", "memcpy GB/s", "agent/memcpy",
                             "prefill TTFT ms", "decode TTFT ms", "read share"}) {
    EXPECT_NE(run.out.find(column), std::string::npos) << column << " missing from:\n" << run.out;
  }
}

TEST_F(BenchTransferTest, MissingPerftestIsNotAvailableNotAFailure) {
  BenchRun run = bench(
      "--blocks 2 --transports sm --ttft-prompts 40,600 --repeats 1 "
      "--ucx-perftest /nonexistent/ucx_perftest");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& t = run.report["transfers"][0];
  EXPECT_EQ(t["bytes"], 2 * kBlockBytes);
  EXPECT_TRUE(t["ucx_perftest_gbps"].is_null());
  EXPECT_TRUE(t["agent_over_ucx_perftest"].is_null());
  EXPECT_NE(t["ucx_perftest_error"].get<std::string>().find("/nonexistent/ucx_perftest not found"),
            std::string::npos)
      << t["ucx_perftest_error"];
  EXPECT_NE(run.out.find("n/a"), std::string::npos) << run.out;
  // A prompt longer than the context is shortened to fit, and says so.
  ASSERT_EQ(run.report["ttft"].size(), 2u);
  EXPECT_EQ(run.report["ttft"][1]["requested_prompt_tokens"], 600);
  EXPECT_EQ(run.report["ttft"][1]["prompt_tokens"], 511);
  EXPECT_EQ(run.report["ttft"][1]["blocks_read"], 31);
  EXPECT_NE(run.out.find("a 600-token prompt does not fit the context of 512; using 511"),
            std::string::npos)
      << run.out;
}

TEST_F(BenchTransferTest, BadOptionsAreRefusedNamingWhatIsAccepted) {
  BenchRun zero = bench("--blocks 0");
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_NE(zero.err.find("--blocks takes block counts between 1 and 1048576, got 0"),
            std::string::npos)
      << zero.err;
  BenchRun dtype = bench("--kv-dtype f16");
  EXPECT_EQ(dtype.exit_code, 1);
  EXPECT_NE(dtype.err.find("--kv-dtype must be bf16, f32 or fp8 (e4m3), got \"f16\""),
            std::string::npos)
      << dtype.err;
}

}  // namespace
