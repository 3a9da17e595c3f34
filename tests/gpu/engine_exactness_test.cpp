// The engine's exactness on the CUDA backend: chunked vs one-shot prefill,
// alone vs batched, prefix hit vs miss give bit-identical logits, greedy
// tokens and KV bytes (read with Backend::readBlocks); CUDA's greedy tokens
// on the tiny model compared with the CPU's; and a prefill→decode hand-off
// between two agent processes on one GPU. Every test skips without a device.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "agent/engine/engine.h"
#include "kernels/backend.h"
#include "tests/support/exactness_checks.h"
#include "tests/support/ucx_agents.h"

namespace tandem::engine {
namespace {

using ::tandem::testing::ExactnessChecks;

struct ModelVariant {
  std::string architecture;
  DType weight_dtype;
  DType kv_dtype;
};

void PrintTo(const ModelVariant& v, std::ostream* os) {
  *os << v.architecture << " w" << dtypeShortName(v.weight_dtype) << " kv"
      << dtypeShortName(v.kv_dtype);
}

#define TANDEM_REQUIRE_CUDA_DEVICE()                                                  \
  do {                                                                                \
    if (kernels::cudaDeviceCount() <= 0) GTEST_SKIP() << "no CUDA device is visible"; \
  } while (0)

class CudaExactnessTest : public ::testing::TestWithParam<ModelVariant> {
 protected:
  void SetUp() override { TANDEM_REQUIRE_CUDA_DEVICE(); }
  ExactnessChecks checks() {
    return ExactnessChecks(
        ::tandem::testing::exactnessModel(GetParam().architecture, GetParam().weight_dtype),
        ::tandem::testing::sharedBackend(kernels::DeviceKind::kCuda), GetParam().kv_dtype);
  }
};

TEST_P(CudaExactnessTest, ChunkedPrefillIsBitIdenticalToOneShot) {
  EXPECT_TRUE(checks().chunkedMatchesOneShot());
}

TEST_P(CudaExactnessTest, SequenceIsBitIdenticalAloneAndBatched) {
  EXPECT_TRUE(checks().aloneMatchesBatched());
}

TEST_P(CudaExactnessTest, PrefixHitIsBitIdenticalToMiss) {
  EXPECT_TRUE(checks().prefixHitMatchesMiss());
}

// The prompt's logprobs: each prompt row's logits, computed after the pass,
// equal that position's logits as a sequence's last token.
TEST_P(CudaExactnessTest, PromptRowLogitsAreTheLastRowLogitsOfEachPosition) {
  EXPECT_TRUE(checks().rowLogitsMatchLastRows());
}

// Q/K/V and gate/up as one matmul each, outputs copied apart
// (cudaMemcpy2DAsync): the bits of separate matmuls, eager and recorded.
TEST_P(CudaExactnessTest, FusedProjectionsGiveTheBitsOfSeparateMatmuls) {
  EXPECT_TRUE(checks().fusedProjectionsMatchSeparate());
}

// Decode steps replayed from CUDA graphs (batches padded to buckets, attention
// over a power-of-two number of splits) vs launched kernel by kernel.
TEST_P(CudaExactnessTest, RecordedDecodeStepsAreBitIdenticalToEager) {
  EXPECT_TRUE(checks().recordedMatchesEager());
}

// A prompt across two attention splits: one shot, chunked across the split
// boundary and batched with a short sequence (exactness_checks.h).
TEST(CudaLongPrompt, PrefillAcrossAttentionSplitsIsBitIdentical) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  ExactnessChecks checks(::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16),
                         ::tandem::testing::sharedBackend(kernels::DeviceKind::kCuda),
                         DType::kBF16);
  EXPECT_TRUE(checks.longPromptMatchesAcrossSplits());
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaExactnessTest,
    ::testing::Values(ModelVariant{"LlamaForCausalLM", DType::kBF16, DType::kF32},
                      ModelVariant{"LlamaForCausalLM", DType::kBF16, DType::kBF16},
                      ModelVariant{"Qwen2ForCausalLM", DType::kF16, DType::kF32},
                      ModelVariant{"Qwen3ForCausalLM", DType::kBF16, DType::kBF16}),
    [](const auto& info) {
      const ModelVariant& v = info.param;
      return v.architecture.substr(0, v.architecture.find("For")) + "_w" +
             dtypeShortName(v.weight_dtype) + "_kv" + dtypeShortName(v.kv_dtype);
    });

// Two backends agree to rounding, not to the bit (kernels/backend.h). Greedy
// tokens must agree while every step so far had a clear winner on the CPU
// (best logit ahead of the second by kClearMargin, far above fp32 rounding
// of these logits); after the first close call they are recorded only.
TEST(CudaVsCpu, GreedyTokensAgreeWhileTheWinnerIsClear) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  constexpr float kClearMargin = 1e-3f;
  constexpr int64_t kSteps = 24;
  const Model& model = ::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16);
  int64_t asserted_steps = 0, agreeing_steps = 0, total_steps = 0;
  for (uint32_t seed : {41u, 42u, 43u}) {
    const std::vector<TokenId> prompt = ::tandem::testing::randomTokenIds(37, seed, 3, 480);
    const auto cpu =
        ::tandem::testing::greedyOn(::tandem::testing::sharedBackend(kernels::DeviceKind::kCpu),
                                    model, DType::kF32, prompt, kSteps);
    const auto cuda =
        ::tandem::testing::greedyOn(::tandem::testing::sharedBackend(kernels::DeviceKind::kCuda),
                                    model, DType::kF32, prompt, kSteps);
    bool clear_so_far = true;
    std::ostringstream record;
    for (int64_t step = 0; step < kSteps; ++step) {
      clear_so_far = clear_so_far && cpu.margins[step] >= kClearMargin;
      const bool agree = cpu.tokens[step] == cuda.tokens[step];
      ++total_steps;
      if (agree) ++agreeing_steps;
      if (clear_so_far) {
        ++asserted_steps;
        EXPECT_TRUE(agree) << "seed " << seed << " step " << step << ": cpu " << cpu.tokens[step]
                           << " (margin " << cpu.margins[step] << ") vs cuda " << cuda.tokens[step];
      }
      record << (step ? "," : "") << cpu.tokens[step] << (agree ? "" : "!=")
             << (agree ? "" : std::to_string(cuda.tokens[step]));
    }
    RecordProperty("tokens_seed_" + std::to_string(seed), record.str());
  }
  RecordProperty("asserted_steps", std::to_string(asserted_steps));
  RecordProperty("agreeing_steps", std::to_string(agreeing_steps));
  RecordProperty("total_steps", std::to_string(total_steps));
  EXPECT_GT(asserted_steps, 0) << "no step had a clear winner: the comparison asserted nothing";
}

// The flash attention kernel gives later layers' K/V their own bits: its
// engine's model identity (block hashes, connector handshakes) says so,
// and the fast set's does not.
TEST(CudaFlashAttention, IsPartOfTheModelIdentity) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  EngineConfig config;
  config.model_dir = ::tandem::testing::tinyModelDir().string();
  config.num_blocks = 64;
  config.device = kernels::DeviceKind::kCuda;
  config.cuda_kernels = kernels::CudaKernels::kFast;
  Engine fast(config);
  config.cuda_kernels = kernels::CudaKernels::kFlash;
  Engine flash(config);
  EXPECT_EQ(fast.modelIdentity().find("/attention-flash"), std::string::npos)
      << fast.modelIdentity();
  EXPECT_EQ(flash.modelIdentity(), fast.modelIdentity() + "/attention-flash");
  EXPECT_NE(flash.backend().description().find("flash attention"), std::string::npos)
      << flash.backend().description();
}

// Speculative decoding on CUDA (docs/speculative-decoding.md): the draft
// rows go through the chunked-prefill kernels and the row-logits pass, and
// the answers — greedy and seeded, with logprobs and without — are the bits
// decoding without drafts gives; drafts were accepted.
TEST(CudaSpeculative, DraftsChangeNoTokenNorLogprob) {
  TANDEM_REQUIRE_CUDA_DEVICE();
  EngineConfig config;
  config.model_dir = ::tandem::testing::tinyModelDir().string();
  config.num_blocks = 128;
  config.device = kernels::DeviceKind::kCuda;
  std::vector<Request> requests;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const std::vector<int> part = ::tandem::testing::randomPrompt(12, seed);
    Request request;
    request.id = "r" + std::to_string(seed);
    for (int i = 0; i < 4; ++i)
      request.prompt.insert(request.prompt.end(), part.begin(), part.end());
    request.sampling.max_tokens = 40;
    request.sampling.ignore_eos = true;
    // Greedy requests without logprobs take the argmax on the device in
    // the steps where no sequence drafts.
    if (seed <= 2) request.sampling.logprobs = 2;
    request.sampling.temperature = seed == 2 || seed == 3 ? 0.0f : 0.9f;
    request.sampling.seed = seed;
    requests.push_back(request);
  }
  auto run = [&](Engine& engine) {
    std::vector<std::vector<std::pair<TokenId, float>>> answers(requests.size());
    std::mutex mutex;
    std::condition_variable done;
    size_t finished = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(engine
                      .addRequest(requests[i],
                                  [&, i](const RequestOutput& out) {
                                    std::lock_guard<std::mutex> lock(mutex);
                                    for (const GeneratedToken& token : out.tokens) {
                                      answers[i].emplace_back(token.token, token.logprob);
                                    }
                                    if (out.finished()) {
                                      ++finished;
                                      done.notify_all();
                                    }
                                  })
                      .isOk());
    }
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(120),
                              [&] { return finished == requests.size(); }));
    return answers;
  };
  Engine plain(config);
  config.speculative.num_speculative_tokens = 4;
  config.speculative.prompt_lookup_min = 1;
  config.speculative.prompt_lookup_max = 4;
  Engine speculating(config);
  const auto expected = run(plain);
  const auto answers = run(speculating);
  ASSERT_EQ(answers.size(), expected.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    ASSERT_EQ(answers[i].size(), 40u) << requests[i].id;
    for (size_t t = 0; t < answers[i].size(); ++t) {
      EXPECT_EQ(answers[i][t].first, expected[i][t].first) << requests[i].id << " token " << t;
      EXPECT_EQ(std::memcmp(&answers[i][t].second, &expected[i][t].second, sizeof(float)), 0)
          << requests[i].id << " token " << t;
    }
  }
  EXPECT_GT(speculating.stats().spec_decode_num_accepted_tokens, 0);
}

// Prefill on one agent process, decode on another, both --device cuda on
// the same GPU, KV moved by the ucx connector through the KV buffer named by
// the parameter ("auto": the slab itself when this UCX handles device
// memory, else host staging; "staging": always host staging with
// Backend::readBlocks/writeBlocks). The tokens must equal a colocated
// --device cuda agent's.
class CudaAgentsHandOff : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TANDEM_REQUIRE_CUDA_DEVICE();
    ::setenv("UCX_TLS", "sm", 1);
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
};

TEST_P(CudaAgentsHandOff, PrefillToDecodeMatchesAColocatedAgent) {
  using ::tandem::testing::Agent;
  const std::vector<int> prompt = ::tandem::testing::randomPrompt(75, 31);
  std::vector<int> expected;
  {
    Agent colocated({"--device", "cuda"});
    expected = ::tandem::testing::tokenIds(
        colocated.post("/v1/completions", ::tandem::testing::greedy(prompt, 8)));
  }
  const ::tandem::testing::json buffer = {{"kv_buffer", GetParam()}};
  std::unique_ptr<Agent> prefiller, decoder;
  try {
    prefiller = std::make_unique<Agent>(
        std::vector<std::string>{"--device", "cuda", "--kv-transfer-config",
                                 ::tandem::testing::ucxConfig("kv_producer", buffer)});
    decoder = std::make_unique<Agent>(
        std::vector<std::string>{"--device", "cuda", "--kv-transfer-config",
                                 ::tandem::testing::ucxConfig("kv_consumer", buffer)});
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("kv_buffer") != std::string::npos) {
      GTEST_SKIP() << "the ucx connector in this build has no kv_buffer option, so no staging "
                      "path for a device KV slab: "
                   << e.what();
    }
    FAIL() << e.what();
  }
  // A device slab over Debian's UCX (no CUDA memory type) always stages;
  // the staging area is page-locked by the CUDA backend.
  for (Agent* agent : {prefiller.get(), decoder.get()}) {
    const auto answer = agent->client()->Get("/health");
    ASSERT_TRUE(answer) << "no answer from /health";
    const auto health = ::tandem::testing::json::parse(answer->body);
    if (health.value("kv_buffer", "") == "staging") {
      EXPECT_EQ(health.value("staging_pinned", false), true) << health.dump();
    }
  }
  const auto params = ::tandem::testing::prefillOn(*prefiller, prompt);
  ASSERT_TRUE(params.is_object());
  ASSERT_EQ(params.value("remote_block_ids", ::tandem::testing::json::array()).size(), 4u)
      << "the prefill agent did not offer the 4 full blocks: " << params.dump();
  EXPECT_EQ(::tandem::testing::tokenIds(::tandem::testing::decodeOn(*decoder, prompt, params)),
            expected);
  // 75 tokens: 4 full blocks of 16 come from the prefill agent.
  EXPECT_EQ(decoder->metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4)
      << decoder->metricsText();
}

INSTANTIATE_TEST_SUITE_P(KvBuffers, CudaAgentsHandOff, ::testing::Values("auto", "staging"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::engine
