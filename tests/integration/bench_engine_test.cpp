// `tandem-bench engine` on the tiny model, as the llama.cpp comparison runs
// it: the JSON report carries every figure the comparison reads, the compute
// dtype reaches the backend (its description and the GEMM path), the compute
// ceilings are measured, and a bad --compute-dtype is refused by name.
// Nothing here depends on speed.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace {

using ::tandem::testing::BenchRun;

class BenchEngineTest : public ::tandem::testing::TinyModelBenchTest<BenchEngineTest> {
 public:
  static constexpr const char* kSubcommand = "engine";
  static constexpr uint64_t kSeed = 13;

 protected:
  static BenchRun bench(const std::string& args, int threads = 2) {
    return TinyModelBenchTest::bench("--device cpu --threads " + std::to_string(threads) +
                                     " --prompt-tokens 40 --decode-tokens 8 --repeats 1 "
                                     "--copy-mib 8 " +
                                     args);
  }
};

TEST_F(BenchEngineTest, ReportsTheFiguresTheComparisonReads) {
  for (const std::string compute : {"f32", "bf16"}) {
    SCOPED_TRACE("--compute-dtype " + compute);
    const BenchRun run = bench("--compute-dtype " + compute);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto& r = run.report;
    ASSERT_TRUE(r.is_object()) << run.out;
    EXPECT_EQ(r.at("compute_dtype"), compute);
    EXPECT_EQ(r.at("weight_dtype"), "bf16");
    const std::string description = r.at("device_description");
    EXPECT_EQ(description.find("bf16 compute") != std::string::npos, compute == "bf16")
        << description;
    for (const char* key :
         {"prefill_tokens_per_s", "decode_tokens_per_s", "read_gbps", "decode_stream_over_read",
          "decode_weight_bytes_per_step", "prefill_matmul_flops_per_token", "prefill_matmul_gflops",
          "fma_peak_gflops", "compute_peak_gflops", "decode_step_host_logits_s", "sampling_step_s",
          "sampling_step_one_thread_s"}) {
      EXPECT_GT(r.at(key).get<double>(), 0.0) << key;
    }
    // The steps with the logits brought to the host pick the greedy tokens.
    EXPECT_TRUE(r.at("decode_host_tokens_identical").get<bool>());
    // The last step's rows sampled on the kernels' threads and on one pick
    // the same tokens.
    EXPECT_TRUE(r.at("sampling_tokens_identical").get<bool>());
    // The logits' copy back is timed where they live apart from the host.
    EXPECT_FALSE(r.contains("logits_copy_page_locked_ms"));
    // Matmul flops per prompt token from the model's config: every
    // projection for each token, the LM head for the last of the 40.
    const nlohmann::json config =
        nlohmann::json::parse(::tandem::testing::readFile(modelDir() / "config.json"));
    const double hidden = config.at("hidden_size"), inter = config.at("intermediate_size");
    const double heads = config.at("num_attention_heads"),
                 kv_heads = config.at("num_key_value_heads");
    const double head_dim = config.value("head_dim", hidden / heads);
    const double per_layer =
        hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + hidden * inter * 3;
    const double expected_flops = 2.0 * per_layer * config.at("num_hidden_layers").get<double>() +
                                  2.0 * hidden * config.at("vocab_size").get<double>() / 40.0;
    EXPECT_DOUBLE_EQ(r.at("prefill_matmul_flops_per_token").get<double>(), expected_flops);
    // KV bytes a decode step reads on average: K and V rows of every layer
    // (bf16 by default) up to positions 40 .. 47, so 44.5 rows on average.
    const double kv_row_bytes =
        2.0 * config.at("num_hidden_layers").get<double>() * kv_heads * head_dim * 2.0;
    EXPECT_DOUBLE_EQ(r.at("decode_kv_bytes_per_step").get<double>(), 44.5 * kv_row_bytes);
    EXPECT_DOUBLE_EQ(r.at("decode_total_stream_over_read").get<double>(),
                     r.at("decode_stream_over_read").get<double>() *
                         (1.0 + r.at("decode_kv_bytes_per_step").get<double>() /
                                    r.at("decode_weight_bytes_per_step").get<double>()));
    // The device figure: the same stream over the backend's copy traffic.
    EXPECT_DOUBLE_EQ(r.at("decode_total_stream_over_backend_copy_traffic").get<double>(),
                     r.at("decode_stream_over_backend_copy_traffic").get<double>() *
                         (1.0 + r.at("decode_kv_bytes_per_step").get<double>() /
                                    r.at("decode_weight_bytes_per_step").get<double>()));
    // The ceiling is the bf16 dot-product one exactly when bf16 compute can
    // use dot products (AVX-512 BF16 hosts); else the fp32 FMA one.
    const double bf16_peak = r.at("bf16_dot_peak_gflops");
    const double expected_peak =
        compute == "bf16" && bf16_peak > 0.0 ? bf16_peak : r.at("fma_peak_gflops").get<double>();
    EXPECT_EQ(r.at("compute_peak_gflops").get<double>(), expected_peak);
    EXPECT_NE(run.out.find("prefill GFLOP/s (matmul flops / prefill time)"), std::string::npos)
        << run.out;
  }
}

// The logits digests name a run's bits: the same whatever the kernel
// threads, the prompt's the same whatever the batch that decodes after it
// (its prefill runs alone), the last step's another with another row in
// it, and both others under bf16 compute.
TEST_F(BenchEngineTest, LogitsDigestsNameTheBitsOfARun) {
  const auto digests = [](const BenchRun& run) {
    EXPECT_EQ(run.exit_code, 0) << run.err;
    const std::string prompt = run.report.at("prompt_logits_xxh3");
    const std::string decode = run.report.at("decode_logits_xxh3");
    for (const std::string& digest : {prompt, decode}) {
      EXPECT_EQ(digest.size(), 16u) << digest;
      EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos) << digest;
      EXPECT_NE(run.out.find(digest), std::string::npos) << run.out;
    }
    return std::pair{prompt, decode};
  };
  const auto plain = digests(bench(""));
  EXPECT_EQ(digests(bench("", 1)), plain);
  const auto batched = digests(bench("--batch 2"));
  EXPECT_EQ(batched.first, plain.first);
  EXPECT_NE(batched.second, plain.second);
  const auto bf16 = digests(bench("--compute-dtype bf16"));
  EXPECT_NE(bf16.first, plain.first);
  EXPECT_NE(bf16.second, plain.second);
}

// A mixture of experts (the tiny Mixtral: 4 experts choosing 2): a token's
// flops are its chosen experts', and a decode step of b sequences reads the
// router and E (1 - (1 - k/E)^b) experts' weights, k's at batch 1.
TEST_F(BenchEngineTest, AMixtureCountsTheExpertsATokenReads) {
  const std::filesystem::path model = dir() / "mixtral";
  tandem::tools::TestModelOptions options;
  options.architecture = "MixtralForCausalLM";
  options.seed = 3;
  tandem::tools::writeTestModel(options, model);
  const nlohmann::json config =
      nlohmann::json::parse(::tandem::testing::readFile(model / "config.json"));
  const double hidden = config.at("hidden_size"), inter = config.at("intermediate_size");
  const double layers = config.at("num_hidden_layers"), vocab = config.at("vocab_size");
  const double q =
      config.at("num_attention_heads").get<double>() * config.at("head_dim").get<double>();
  const double kv =
      config.at("num_key_value_heads").get<double>() * config.at("head_dim").get<double>();
  const double experts = config.at("num_local_experts"), k = config.at("num_experts_per_tok");
  ASSERT_EQ(experts, 4);
  ASSERT_EQ(k, 2);
  const double attention = hidden * q * 2 + hidden * kv * 2;  // q, o; k, v
  const double expert = hidden * inter * 3;
  const double router = hidden * experts;
  for (int batch : {1, 3}) {
    SCOPED_TRACE(batch);
    const BenchRun run = ::tandem::testing::runBench(
        dir(), "engine",
        "--model '" + model.string() +
            "' --device cpu --threads 2 --prompt-tokens 40 --decode-tokens 4 --repeats 1 "
            "--copy-mib 8 --batch " +
            std::to_string(batch));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto& r = run.report;
    ASSERT_TRUE(r.is_object()) << run.out;
    EXPECT_DOUBLE_EQ(
        r.at("prefill_matmul_flops_per_token").get<double>(),
        2.0 * layers * (attention + router + k * expert) + 2.0 * hidden * vocab / 40.0);
    // bf16 weights: two bytes each.
    const double chosen = experts * (1.0 - std::pow(1.0 - k / experts, batch));
    EXPECT_DOUBLE_EQ(r.at("decode_weight_bytes_per_step").get<double>(),
                     2.0 * (layers * (attention + router + chosen * expert) + hidden * vocab));
    EXPECT_GT(r.at("decode_tokens_per_s").get<double>(), 0.0);
    // Layer 0's MLP GEMMs are its first expert's.
    EXPECT_GT(r.at("gemm_up_gflops").get<double>(), 0.0);
    EXPECT_GT(r.at("gemm_down_gflops").get<double>(), 0.0);
  }
}

// --profile-ops: one prefill and one decode timed call by call. The decode
// table is per step: each layer's seven projections once per step, plus the
// LM head; each call's bytes and flops follow from its shape.
TEST_F(BenchEngineTest, ProfileOpsReportsEveryCallOfAStepPerStep) {
  const BenchRun run = bench("--profile-ops");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("decode calls (batch 1)"), std::string::npos) << run.out;
  const nlohmann::json config =
      nlohmann::json::parse(::tandem::testing::readFile(modelDir() / "config.json"));
  const double layers = config.at("num_hidden_layers");
  for (const char* phase : {"prefill", "decode"}) {
    SCOPED_TRACE(phase);
    const nlohmann::json& ops = run.report.at("ops").at(phase);
    double matmuls = 0.0, attention = 0.0, argmax = 0.0, sum = 0.0;
    for (const nlohmann::json& call : ops.at("calls")) {
      const std::string name = call.at("call");
      const double per_step = call.at("calls_per_step");
      sum += call.at("seconds_per_step").get<double>();
      if (name.starts_with("argmaxRows")) argmax += per_step;
      if (name.starts_with("matmul")) {
        matmuls += per_step;
        EXPECT_GT(call.at("flops_per_step").get<double>(), 0.0) << name;
        EXPECT_GT(call.at("bytes_per_step").get<double>(), 0.0) << name;
      }
      if (name.starts_with("pagedAttention")) attention += per_step;
    }
    EXPECT_DOUBLE_EQ(matmuls, 7.0 * layers + 1.0);
    EXPECT_DOUBLE_EQ(attention, layers);
    // Decode steps pick their tokens as the engine serves greedy requests:
    // by the backend's argmax, once a step (the prefill's logits are kept).
    EXPECT_DOUBLE_EQ(argmax, std::string(phase) == "decode" ? 1.0 : 0.0);
    EXPECT_NEAR(ops.at("seconds_per_step").get<double>(), sum, 1e-9 * sum);
  }
  // Without the flag there is no such table.
  const BenchRun plain = bench("");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(plain.report.contains("ops"));
}

TEST_F(BenchEngineTest, RefusesAnUnknownComputeDtypeByName) {
  const BenchRun run = bench("--compute-dtype f16");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("--compute-dtype: expected f32 or bf16, got 'f16'"), std::string::npos)
      << run.err;
  EXPECT_TRUE(run.report.is_null());
}

// The CUDA backend's own variants measure nothing on the CPU: each is
// refused by name, before the model is loaded. The unordered decode variant
// replaces a fast CUDA kernel; the bf16 GEMM configurations (timed side by
// side, or one for the whole run) and the deep decode loads are the bf16
// kernels'; the compact attention grid and the deep attention loads are
// launches of the flash kernel.
TEST_F(BenchEngineTest, RefusesTheCudaVariantsOnTheCpuByName) {
  for (const auto& [flags, message] :
       {std::pair<std::string, std::string>{
            "--unordered-decode --compute-dtype bf16",
            "--unordered-decode: only with --device cuda and the fast kernels"},
        std::pair<std::string, std::string>{
            "--bf16-gemm-configs --compute-dtype bf16",
            "--bf16-gemm-configs: only with --device cuda and --compute-dtype bf16"},
        std::pair<std::string, std::string>{
            "--bf16-gemm-config 4 --compute-dtype bf16",
            "--bf16-gemm-config: only with --device cuda and --compute-dtype bf16"},
        std::pair<std::string, std::string>{
            "--deep-skinny --compute-dtype bf16",
            "--deep-skinny: only with --device cuda and --compute-dtype bf16"},
        std::pair<std::string, std::string>{
            "--compact-attention",
            "--compact-attention: only with --device cuda and --cuda-kernels flash"},
        std::pair<std::string, std::string>{
            "--deep-attention",
            "--deep-attention: only with --device cuda and --cuda-kernels flash"}}) {
    const BenchRun run = bench(flags);
    EXPECT_NE(run.exit_code, 0) << flags;
    EXPECT_NE(run.err.find(message), std::string::npos) << flags << ": " << run.err;
    EXPECT_TRUE(run.report.is_null()) << flags;
  }
}

}  // namespace
