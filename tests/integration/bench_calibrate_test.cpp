// `tandem-bench calibrate` on the tiny model with one run per shape: the
// profile it writes parses, carries the model's shape and a fit error that is
// a number, and every shape's reported prediction is what the written
// profile predicts for it. Nothing here depends on speed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/engine/simulation/step_profile.h"
#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::engine::StepProfile;
using ::tandem::engine::StepShape;
using ::tandem::testing::BenchRun;

class BenchCalibrateTest : public ::tandem::testing::TinyModelBenchTest<BenchCalibrateTest> {
 public:
  static constexpr const char* kSubcommand = "calibrate";
  static constexpr uint64_t kSeed = 9;

 protected:
};

TEST_F(BenchCalibrateTest, WritesAProfileThatParsesWithItsFitError) {
  const fs::path profile_path = dir() / "cpu-tiny.yaml";
  BenchRun run =
      bench("--samples 1 --threads 1 --name cpu-tiny-test --out '" + profile_path.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;

  auto profile = StepProfile::fromFile(profile_path);
  ASSERT_TRUE(profile.isOk()) << profile.status().message();
  EXPECT_EQ(profile->name, "cpu-tiny-test");
  EXPECT_EQ(profile->scale, 1.0);
  // The tiny model: vocab 512, context 512; K and V of 2 layers x 2 KV heads
  // x 16 values in bf16 per token.
  EXPECT_EQ(profile->model.vocab_size, 512);
  EXPECT_EQ(profile->model.max_position_embeddings, 512);
  EXPECT_EQ(profile->model.kv_bytes_per_token, 2 * 2 * 2 * 16 * 2);
  EXPECT_NE(profile->description.find("mean relative error"), std::string::npos)
      << profile->description;
  EXPECT_GT(profile->predict(StepShape{}), 0.0) << "every step costs something";

  const json& report = run.report;
  const json& fit = report.at("fit");
  for (const char* key : {"mean_relative_error", "max_relative_error", "r_squared"}) {
    ASSERT_TRUE(fit.at(key).is_number()) << key << ": " << fit.dump();
    EXPECT_TRUE(std::isfinite(fit.at(key).get<double>())) << key;
  }
  EXPECT_GE(fit.at("mean_relative_error").get<double>(), 0.0);
  EXPECT_GE(fit.at("max_relative_error").get<double>(),
            fit.at("mean_relative_error").get<double>());
  EXPECT_EQ(report.at("samples"), 1);

  // Prefill, decode and mixed shapes, each timed once, each predicted by the
  // written profile as reported.
  const json& shapes = report.at("shapes");
  ASSERT_GE(shapes.size(), 20u);
  int prefill_only = 0, decode_only = 0, mixed = 0;
  for (const json& shape : shapes) {
    StepShape step;
    step.prefill_tokens = shape.at("prefill_tokens");
    step.decode_sequences = shape.at("decode_sequences");
    step.context_tokens = shape.at("context_tokens");
    step.prefill_context_products = shape.at("prefill_context_products");
    step.kv_blocks_read = shape.at("kv_blocks_read");
    prefill_only += step.prefill_tokens > 0 && step.decode_sequences == 0;
    decode_only += step.prefill_tokens == 0 && step.decode_sequences > 0;
    mixed += step.prefill_tokens > 0 && step.decode_sequences > 0;
    EXPECT_EQ(shape.at("runs_s").size(), 1u);
    EXPECT_GT(shape.at("observed_s").get<double>(), 0.0);
    const double predicted = shape.at("predicted_s").get<double>();
    EXPECT_NEAR(profile->predict(step), predicted, 1e-12 + 1e-9 * predicted) << shape.at("label");
  }
  EXPECT_GT(prefill_only, 0);
  EXPECT_GT(decode_only, 0);
  EXPECT_GT(mixed, 0);
  EXPECT_NE(run.out.find("fit: mean relative error"), std::string::npos) << run.out;
}

TEST_F(BenchCalibrateTest, RejectsBadOptionsNamingThem) {
  BenchRun run = bench("--samples 0");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE((run.out + run.err).find("--samples"), std::string::npos) << run.out << run.err;

  run = bench("--kv-dtype f16");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("--kv-dtype must be bf16, f32 or fp8 (e4m3), got \"f16\""),
            std::string::npos)
      << run.err;
}

}  // namespace
