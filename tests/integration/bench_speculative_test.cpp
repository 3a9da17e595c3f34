// `tandem-bench speculative` on the tiny model: both engines gave the same
// tokens in every pair, the report carries every figure the docs quote, and
// a bad --speculative-config is refused by name. Nothing here depends on
// speed.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"

namespace {

using ::tandem::testing::BenchRun;

class BenchSpeculativeTest : public ::tandem::testing::TinyModelBenchTest<BenchSpeculativeTest> {
 public:
  static constexpr const char* kSubcommand = "speculative";
  static constexpr uint64_t kSeed = 17;

 protected:
  static BenchRun bench(const std::string& args) {
    return TinyModelBenchTest::bench("--threads 2 --prompt-tokens 64 --max-tokens 24 --pairs 2 " +
                                     args);
  }
};

TEST_F(BenchSpeculativeTest, ReportsTheSameTokensAndTheFiguresTheDocsQuote) {
  const BenchRun run = bench("--batch 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto& r = run.report;
  ASSERT_TRUE(r.is_object()) << run.out;
  EXPECT_EQ(r.at("tokens_identical"), true);
  EXPECT_EQ(r.at("batch"), 2);
  EXPECT_EQ(r.at("prompts"), "repeat");
  EXPECT_EQ(r.at("speculative_config").at("method"), "ngram");
  ASSERT_EQ(r.at("pairs").size(), 2u);
  for (const auto& pair : r.at("pairs")) {
    EXPECT_EQ(pair.at("tokens_identical"), true);
    EXPECT_GT(pair.at("ratio").get<double>(), 0.0);
    EXPECT_GT(pair.at("steps_without").get<int64_t>(), 0);
  }
  // Two pairs of two requests of 24 tokens each.
  EXPECT_EQ(r.at("tokens_generated"), 2 * 2 * 24);
  EXPECT_GE(r.at("accepted_tokens").get<int64_t>(), 0);
  EXPECT_LE(r.at("accepted_tokens").get<int64_t>(), r.at("draft_tokens").get<int64_t>());
  EXPECT_GT(r.at("decode_ratio_median").get<double>(), 0.0);
  EXPECT_NE(run.out.find("tokens identical in every pair                              yes"),
            std::string::npos)
      << run.out;
}

TEST_F(BenchSpeculativeTest, ABadSpeculativeConfigIsRefusedByName) {
  const BenchRun run =
      bench(R"(--speculative-config '{"method":"eagle","num_speculative_tokens":2}')");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--speculative-config: method \"eagle\" is not supported"),
            std::string::npos)
      << run.err;
}

}  // namespace
