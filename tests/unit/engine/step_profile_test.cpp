// Step-time profiles: prediction on hand-computed shapes, the feature
// definition shared with calibrate, YAML round trips and errors, and the
// non-negative least-squares fit.
#include "agent/engine/simulation/step_profile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/support/test_files.h"

namespace tandem::engine {
namespace {

StepProfile sampleProfile() {
  StepProfile profile;
  profile.name = "test-profile";
  profile.description = "hand-written: \"quoted\", two\nlines";
  profile.base_s = 0.005;
  profile.prefill_token_s = 2e-5;
  profile.decode_sequence_s = 6e-5;
  profile.context_token_s = 4e-8;
  profile.prefill_context_s = 5e-10;
  profile.kv_block_s = 1e-7;
  profile.scale = 1.0;
  profile.kv_link_bytes_per_s = 5e10;
  profile.kv_link_latency_s = 2e-6;
  profile.model.vocab_size = 32000;
  profile.model.max_position_embeddings = 2048;
  profile.model.kv_bytes_per_token = 16384;
  return profile;
}

TEST(StepProfileTest, PredictsHandComputedShapes) {
  StepProfile profile = sampleProfile();
  EXPECT_DOUBLE_EQ(profile.predict(StepShape{}), 0.005);

  // A decode step of 4 sequences over 1000 context tokens in 64 blocks:
  // 0.005 + 4 * 6e-5 + 1000 * 4e-8 + 64 * 1e-7 = 0.0052864.
  StepShape decode;
  decode.decode_sequences = 4;
  decode.context_tokens = 1000;
  decode.kv_blocks_read = 64;
  EXPECT_NEAR(profile.predict(decode), 0.0052864, 1e-12);

  // A prefill chunk of 512 tokens after 512 cached: products 512 * 1024,
  // 0.005 + 512 * 2e-5 + 524288 * 5e-10 + 64 * 1e-7 = 0.015508544.
  StepShape prefill;
  prefill.prefill_tokens = 512;
  prefill.prefill_context_products = 512 * 1024;
  prefill.kv_blocks_read = 64;
  EXPECT_NEAR(profile.predict(prefill), 0.015508544, 1e-12);

  profile.scale = 3.0;
  EXPECT_NEAR(profile.predict(prefill), 3 * 0.015508544, 1e-12);
}

TEST(StepProfileTest, TransferSecondsAreLatencyPlusBytesOverTheLink) {
  StepProfile profile;
  profile.model.kv_bytes_per_token = 131072;
  profile.kv_link_bytes_per_s = 268435456;  // 256 MiB/s
  // 64 blocks of 16 tokens of 128 KiB: 128 MiB, half a second.
  EXPECT_EQ(simulatedTransferSeconds(profile, 64, 16), 0.5);
  profile.kv_link_latency_s = 0.25;
  EXPECT_EQ(simulatedTransferSeconds(profile, 64, 16), 0.75);
  EXPECT_EQ(simulatedTransferSeconds(profile, 1, 16), 0.25 + 2097152.0 / 268435456);
  // The link, not the steps: scale does not apply.
  profile.scale = 4;
  EXPECT_EQ(simulatedTransferSeconds(profile, 64, 16), 0.75);
  // Nothing moved, or an untimed link: no time, latency included.
  EXPECT_EQ(simulatedTransferSeconds(profile, 0, 16), 0.0);
  EXPECT_EQ(simulatedTransferSeconds(profile, 64, 0), 0.0);
  profile.kv_link_bytes_per_s = 0;
  EXPECT_EQ(simulatedTransferSeconds(profile, 64, 16), 0.0);
  // The H100 profile's link: a 2,000-token prompt's 125 blocks in 6.5536 ms.
  profile.kv_link_bytes_per_s = 4e10;
  profile.kv_link_latency_s = 0;
  EXPECT_DOUBLE_EQ(simulatedTransferSeconds(profile, 125, 16), 0.0065536);
}

TEST(StepProfileTest, StepShapeOfCountsEveryFeatureOnce) {
  // A prefill chunk of 100 tokens after 28 cached, a fresh prompt of 5, and
  // two decode sequences at positions 40 and 16, block size 16.
  std::vector<StepChunk> chunks = {{28, 100, true}, {0, 5, true}, {40, 1, false}, {16, 1, false}};
  StepShape shape = stepShapeOf(chunks, 16);
  EXPECT_EQ(shape.prefill_tokens, 105);
  EXPECT_EQ(shape.prefill_context_products, 100 * 128 + 5 * 5);
  EXPECT_EQ(shape.decode_sequences, 2);
  EXPECT_EQ(shape.context_tokens, 41 + 17);
  // ceil(128/16) + ceil(5/16) + ceil(41/16) + ceil(17/16) = 8 + 1 + 3 + 2.
  EXPECT_EQ(shape.kv_blocks_read, 14);
  EXPECT_EQ(stepShapeOf(chunks, 0).kv_blocks_read, 0);
  EXPECT_EQ(stepShapeOf({}, 16), StepShape{});
}

TEST(StepProfileTest, YamlRoundTripGivesAnEqualProfile) {
  const StepProfile profile = sampleProfile();
  auto parsed = StepProfile::fromYamlText(profile.toYaml(), "round-trip");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message() << "\n" << profile.toYaml();
  EXPECT_EQ(*parsed, profile);

  // Values with no short decimal form survive too.
  StepProfile odd = profile;
  odd.base_s = 1.0 / 3.0;
  odd.prefill_context_s = std::nextafter(2e-11, 1.0);
  odd.scale = 0.1 + 0.2;
  auto reparsed = StepProfile::fromYamlText(odd.toYaml(), "round-trip");
  ASSERT_TRUE(reparsed.isOk()) << reparsed.status().message();
  EXPECT_EQ(*reparsed, odd);
}

TEST(StepProfileTest, MissingKeysTakeDefaults) {
  auto parsed = StepProfile::fromYamlText("name: only-a-name\nbase_s: 0.25\n", "t.yaml");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(parsed->name, "only-a-name");
  EXPECT_EQ(parsed->base_s, 0.25);
  EXPECT_EQ(parsed->scale, 1.0);
  EXPECT_EQ(parsed->kv_link_bytes_per_s, 0.0);
  EXPECT_EQ(parsed->kv_link_latency_s, 0.0);
  EXPECT_EQ(parsed->model, SimulatedModelShape{});
}

TEST(StepProfileTest, ReadsAFileAndNamesAMissingOne) {
  testing::TempDir dir("step-profile-test");
  const auto path = dir.write("p.yaml", sampleProfile().toYaml());
  auto parsed = StepProfile::fromFile(path);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(*parsed, sampleProfile());
  auto missing = StepProfile::fromFile(dir.path() / "absent.yaml");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("absent.yaml"), std::string::npos);
}

struct BadProfile {
  std::string yaml;
  std::vector<std::string> message_parts;  // each must appear in the error
};

class StepProfileErrorTest : public ::testing::TestWithParam<BadProfile> {};

TEST_P(StepProfileErrorTest, NamesTheKeyAndWhatIsAccepted) {
  auto parsed = StepProfile::fromYamlText(GetParam().yaml, "bad.yaml");
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = parsed.status().message();
  EXPECT_NE(message.find("bad.yaml"), std::string::npos) << message;
  for (const auto& part : GetParam().message_parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Errors, StepProfileErrorTest,
    ::testing::Values(
        BadProfile{"name: p\nbase_seconds: 1\n", {"unknown key base_seconds", "base_s"}},
        BadProfile{"name: p\nmodel:\n  vocab: 5\n", {"unknown key model.vocab", "vocab_size"}},
        BadProfile{"name: p\nbase_s: -0.001\n", {"base_s", ">= 0", "-0.001"}},
        BadProfile{"name: p\nprefill_token_s: fast\n", {"prefill_token_s", "fast"}},
        BadProfile{"name: p\ndecode_sequence_s: .nan\n", {"decode_sequence_s", "finite"}},
        BadProfile{"name: p\ncontext_token_s: .inf\n", {"context_token_s", "finite"}},
        BadProfile{"name: p\nprefill_context_s: -1e-12\n", {"prefill_context_s", ">= 0"}},
        BadProfile{"name: p\nkv_block_s: [1]\n", {"kv_block_s", "a list"}},
        BadProfile{"name: p\nscale: 0\n", {"scale", "> 0"}},
        BadProfile{"name: p\nkv_link_bytes_per_s: -5\n", {"kv_link_bytes_per_s", ">= 0"}},
        BadProfile{"name: p\nkv_link_latency_s: -0.1\n", {"kv_link_latency_s", ">= 0"}},
        BadProfile{"name: p\nmodel:\n  kv_bytes_per_token: 0\n",
                   {"model.kv_bytes_per_token", ">= 1"}},
        BadProfile{"name: p\nmodel: 7\n", {"model must be a mapping", "vocab_size"}},
        BadProfile{"base_s: 0.1\n", {"name is required"}},
        BadProfile{"name: ''\n", {"name is required"}},
        BadProfile{"name: [a]\n", {"name must be a string"}},
        BadProfile{"- a\n- b\n", {"must be a mapping", "name"}},
        BadProfile{"name: p\nbase_s: [\n", {"not valid YAML"}}));

// Exact data from known coefficients on shapes that vary every feature
// independently.
std::vector<StepSample> syntheticSamples(const StepProfile& truth, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tokens(0, 4096), sequences(0, 64), context(0, 200000);
  std::vector<StepSample> samples;
  for (int i = 0; i < count; ++i) {
    StepSample sample;
    sample.shape.prefill_tokens = tokens(rng);
    sample.shape.decode_sequences = sequences(rng);
    sample.shape.context_tokens = context(rng);
    sample.shape.prefill_context_products = sample.shape.prefill_tokens * tokens(rng);
    sample.shape.kv_blocks_read = context(rng) / 16;
    sample.seconds = truth.predict(sample.shape);
    samples.push_back(sample);
  }
  return samples;
}

TEST(StepProfileFitTest, RecoversKnownCoefficientsExactly) {
  StepProfile truth = sampleProfile();
  const auto samples = syntheticSamples(truth, 40, 11);
  auto fit = fitStepProfile(samples, truth);
  ASSERT_TRUE(fit.isOk()) << fit.status().message();
  const auto want = stepCoefficients(truth);
  const auto got = stepCoefficients(fit->profile);
  for (int i = 0; i < kNumStepFeatures; ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-9 * std::abs(want[i])) << "coefficient " << i;
  }
  EXPECT_LT(fit->max_relative_error, 1e-9);
  EXPECT_NEAR(fit->r_squared, 1.0, 1e-12);
  EXPECT_EQ(fit->profile.name, truth.name);
  EXPECT_EQ(fit->profile.model, truth.model);
  ASSERT_EQ(fit->predicted.size(), samples.size());
}

TEST(StepProfileFitTest, RecoversAZeroCoefficientAsZero) {
  StepProfile truth = sampleProfile();
  truth.kv_block_s = 0.0;
  truth.decode_sequence_s = 0.0;
  auto fit = fitStepProfile(syntheticSamples(truth, 30, 5), truth);
  ASSERT_TRUE(fit.isOk()) << fit.status().message();
  const auto want = stepCoefficients(truth);
  const auto got = stepCoefficients(fit->profile);
  for (int i = 0; i < kNumStepFeatures; ++i) {
    // A zero comes back as zero to rounding: at most 1e-15 s per unit of a
    // feature, a femtosecond per unit.
    EXPECT_NEAR(got[i], want[i], 1e-9 * std::abs(want[i]) + 1e-15) << i;
    EXPECT_GE(got[i], 0.0) << i;
  }
}

TEST(NonNegativeLeastSquaresTest, SolvesAnExactSystem) {
  // b = 2 x + 7e6 y: columns a million apart in scale, contributions alike.
  std::vector<std::vector<double>> rows = {{1, 1e-6}, {2, 3e-6}, {1, 5e-6}, {4, 1e-6}};
  std::vector<double> targets;
  for (const auto& row : rows) targets.push_back(2 * row[0] + 7e6 * row[1]);
  auto x = solveNonNegativeLeastSquares(rows, targets);
  ASSERT_TRUE(x.isOk()) << x.status().message();
  EXPECT_NEAR((*x)[0], 2.0, 1e-9 * 2.0);
  EXPECT_NEAR((*x)[1], 7e6, 1e-9 * 7e6);
}

TEST(NonNegativeLeastSquaresTest, KeepsCoefficientsNonNegativeAtTheConstrainedOptimum) {
  // Unconstrained least squares fits b = 1 - 2 t with a negative slope; the
  // non-negative optimum is the constant mean(b), slope 0.
  std::vector<std::vector<double>> rows;
  std::vector<double> targets;
  for (int t = 0; t < 5; ++t) {
    rows.push_back({1.0, static_cast<double>(t)});
    targets.push_back(1.0 - 2.0 * t);
  }
  auto x = solveNonNegativeLeastSquares(rows, targets);
  ASSERT_TRUE(x.isOk()) << x.status().message();
  EXPECT_NEAR((*x)[0], 0.0, 1e-12);  // mean is -3: the constant is clamped too
  EXPECT_NEAR((*x)[1], 0.0, 1e-12);

  // b = 10 - t: the constant stays, the slope is clamped; best constant is
  // the mean of b = 8.
  for (int t = 0; t < 5; ++t) targets[t] = 10.0 - t;
  x = solveNonNegativeLeastSquares(rows, targets);
  ASSERT_TRUE(x.isOk());
  EXPECT_NEAR((*x)[0], 8.0, 1e-12);
  EXPECT_NEAR((*x)[1], 0.0, 1e-12);
}

TEST(NonNegativeLeastSquaresTest, SatisfiesOptimalityOnNoisyData) {
  // KKT: the gradient A^T (A x - b) is zero where x > 0 and >= 0 where x = 0.
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<std::vector<double>> rows;
  std::vector<double> targets;
  for (int i = 0; i < 50; ++i) {
    std::vector<double> row = {1.0, std::abs(noise(rng)), std::abs(noise(rng)),
                               std::abs(noise(rng))};
    rows.push_back(row);
    targets.push_back(1.0 + 2.0 * row[1] - 1.5 * row[2] + 0.1 * noise(rng));
  }
  auto x = solveNonNegativeLeastSquares(rows, targets);
  ASSERT_TRUE(x.isOk());
  for (int j = 0; j < 4; ++j) {
    EXPECT_GE((*x)[j], 0.0);
    double gradient = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      double r = -targets[i];
      for (int c = 0; c < 4; ++c) r += rows[i][c] * (*x)[c];
      gradient += rows[i][j] * r;
    }
    if ((*x)[j] > 0) {
      EXPECT_NEAR(gradient, 0.0, 1e-9) << j;
    } else {
      EXPECT_GE(gradient, -1e-9) << j;
    }
  }
  EXPECT_EQ((*x)[2], 0.0);  // the negative true coefficient is clamped
}

TEST(NonNegativeLeastSquaresTest, RejectsMalformedInput) {
  auto empty = solveNonNegativeLeastSquares({}, {});
  ASSERT_FALSE(empty.isOk());
  EXPECT_NE(empty.status().message().find("at least one row"), std::string::npos);
  auto ragged = solveNonNegativeLeastSquares({{1, 2}, {1}}, {1, 2});
  ASSERT_FALSE(ragged.isOk());
  EXPECT_NE(ragged.status().message().find("row 1 has 1"), std::string::npos);
  auto mismatched = solveNonNegativeLeastSquares({{1}}, {1, 2});
  ASSERT_FALSE(mismatched.isOk());
  EXPECT_NE(mismatched.status().message().find("one target per row"), std::string::npos);
}

TEST(StepProfileFitTest, RejectsStepsWithoutTime) {
  std::vector<StepSample> samples(2);
  samples[0].seconds = 0.01;
  samples[1].seconds = 0.0;
  auto fit = fitStepProfile(samples, sampleProfile());
  ASSERT_FALSE(fit.isOk());
  EXPECT_NE(fit.status().message().find("timed step 1"), std::string::npos);
}

// The profiles shipped in profiles/ parse, and the H100 one predicts the
// figures docs/profiles.md derives from it.
TEST(ShippedProfilesTest, ParseAndMatchTheirDocumentation) {
  const std::filesystem::path dir = std::filesystem::path(TANDEM_SOURCE_DIR) / "profiles";
  auto cpu = StepProfile::fromFile(dir / "cpu-small.yaml");
  ASSERT_TRUE(cpu.isOk()) << cpu.status().message();
  EXPECT_EQ(cpu->name, "cpu-small");
  EXPECT_EQ(cpu->model.vocab_size, 32000);
  EXPECT_NE(cpu->description.find("mean relative error"), std::string::npos);

  auto h100 = StepProfile::fromFile(dir / "llama3.1-8b-h100.yaml");
  ASSERT_TRUE(h100.isOk()) << h100.status().message();
  EXPECT_EQ(h100->name, "llama3.1-8b-h100");
  EXPECT_EQ(h100->model.vocab_size, 128256);
  EXPECT_EQ(h100->model.kv_bytes_per_token, 2 * 32 * 8 * 128 * 2);
  auto decode = [&](int64_t batch, int64_t context) {
    std::vector<StepChunk> chunks(batch, {context, 1, false});
    return h100->predict(stepShapeOf(chunks, 16));
  };
  auto prefill = [&](int64_t tokens, int64_t cached) {
    std::vector<StepChunk> chunks = {{cached, tokens, true}};
    return h100->predict(stepShapeOf(chunks, 16));
  };
  // docs/profiles.md, "What the profile predicts" (to the digits shown).
  EXPECT_NEAR(decode(1, 1024), 5.65e-3, 0.01e-3);
  EXPECT_NEAR(decode(32, 1024), 7.31e-3, 0.01e-3);
  EXPECT_NEAR(decode(32, 4096), 12.1e-3, 0.1e-3);
  EXPECT_NEAR(decode(128, 1024), 12.5e-3, 0.1e-3);
  EXPECT_NEAR(prefill(2048, 0), 56.8e-3, 0.1e-3);
  EXPECT_NEAR(prefill(8192, 0), 247e-3, 1e-3);
  EXPECT_NEAR(prefill(512, 32768), 30.0e-3, 0.1e-3);
}

}  // namespace
}  // namespace tandem::engine
