// The engine's exactness properties on every compute backend this build and
// machine have (always the CPU; CUDA too when a device is visible): chunked
// vs one-shot prefill, alone vs batched, prefix hit vs miss give bit-identical
// logits, greedy tokens and KV bytes (read back with Backend::readBlocks).
// The checks live in tests/support/exactness_checks.h, shared with the gpu
// test.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <string>
#include <tuple>

#include "kernels/cpu/cpu_backend.h"
#include "tests/support/exactness_checks.h"

namespace tandem::engine {
namespace {

using ::tandem::testing::ExactnessChecks;
using ::tandem::testing::SequenceRun;

struct ModelVariant {
  std::string architecture;
  DType weight_dtype;
  DType kv_dtype;
  std::string rotary = "";  // testing::exactnessModel's
};

using Param = std::tuple<kernels::DeviceKind, ModelVariant>;

class BackendExactnessTest : public ::testing::TestWithParam<Param> {
 protected:
  ExactnessChecks checks() {
    const auto& [kind, variant] = GetParam();
    return ExactnessChecks(::tandem::testing::exactnessModel(
                               variant.architecture, variant.weight_dtype, "", variant.rotary),
                           ::tandem::testing::sharedBackend(kind), variant.kv_dtype);
  }
};

TEST_P(BackendExactnessTest, ChunkedPrefillIsBitIdenticalToOneShot) {
  EXPECT_TRUE(checks().chunkedMatchesOneShot());
}

TEST_P(BackendExactnessTest, SequenceIsBitIdenticalAloneAndBatched) {
  EXPECT_TRUE(checks().aloneMatchesBatched());
}

TEST_P(BackendExactnessTest, PrefixHitIsBitIdenticalToMiss) {
  EXPECT_TRUE(checks().prefixHitMatchesMiss());
}

TEST_P(BackendExactnessTest, RecordedDecodeStepsAreBitIdenticalToEager) {
  EXPECT_TRUE(checks().recordedMatchesEager());
}

TEST_P(BackendExactnessTest, ArgmaxWhereTheLogitsAreEqualsArgmaxOfTheLogits) {
  EXPECT_TRUE(checks().argmaxMatchesLogits());
}

TEST_P(BackendExactnessTest, PromptRowLogitsAreTheLastRowLogitsOfEachPosition) {
  EXPECT_TRUE(checks().rowLogitsMatchLastRows());
}

TEST_P(BackendExactnessTest, FusedProjectionsGiveTheBitsOfSeparateMatmuls) {
  EXPECT_TRUE(checks().fusedProjectionsMatchSeparate());
}

// A CPU backend that asks for decode batches padded to buckets as the CUDA
// backend does (1, 2, 4, 8, then multiples of 8), without recording, so the
// runner's padding (inactive rows, empty sequences) is exercised where no GPU
// is: the real rows' logits and the cache bytes must not change.
class PaddingCpuBackend final : public kernels::cpu::CpuBackend {
 public:
  int64_t decodeBucket(int64_t sequences) const override {
    if (sequences <= 8) return std::bit_ceil(static_cast<uint64_t>(sequences));
    return (sequences + 7) / 8 * 8;
  }
  bool replayStep(uint64_t /*owner*/) override {
    ++steps_;
    return false;
  }
  int64_t steps() const { return steps_; }

 private:
  int64_t steps_ = 0;
};

TEST(PaddedDecodeTest, PaddingToBucketsKeepsEveryBitOnTheCpu) {
  PaddingCpuBackend backend;
  // A mixture routes the padded rows too, each on its own.
  for (const char* architecture : {"LlamaForCausalLM", "MixtralForCausalLM"}) {
    for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
      ExactnessChecks checks(::tandem::testing::exactnessModel(architecture, DType::kBF16), backend,
                             kv_dtype);
      EXPECT_TRUE(checks.recordedMatchesEager()) << architecture << " " << dtypeShortName(kv_dtype);
    }
  }
  // Every padded decode step went through replayStep (3 + 2 sequences, 5
  // steps each, twice, for two models).
  EXPECT_EQ(backend.steps(), 2 * 2 * 2 * ExactnessChecks::kDecodeSteps);
}

// A CPU backend that says the host cannot address its memory, so the runner
// takes a device's paths (scratch and logits in backend memory, logits copied
// back, argmax through argmaxRows) on the CPU: results must be the same bits
// as the plain CPU backend's.
class OpaqueCpuBackend final : public kernels::cpu::CpuBackend {
 public:
  bool hostAccessible() const override { return false; }
};

TEST(OpaqueCpuBackendTest, DevicePathsOfTheRunnerGiveTheHostPathsBits) {
  OpaqueCpuBackend opaque;
  const Model& model = ::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16);
  ExactnessChecks checks(model, opaque, DType::kBF16);
  EXPECT_TRUE(checks.argmaxMatchesLogits());
  EXPECT_TRUE(checks.rowLogitsMatchLastRows());
  EXPECT_TRUE(checks.fusedProjectionsMatchSeparate());
  const std::vector<TokenId> prompt = checks.prompt(37, 41);
  ExactnessChecks host(model, ::tandem::testing::sharedBackend(kernels::DeviceKind::kCpu),
                       DType::kBF16);
  EXPECT_TRUE(::tandem::testing::sameRun("device paths on the cpu", host.alone(prompt, 0),
                                         checks.alone(prompt, 16)));
}

// bf16 compute on the CPU (weights packed in pairs, activations rounded):
// the stacked matrices are packed as one, and each output column keeps its
// bits.
TEST(Bf16ComputeCpuBackendTest, FusedProjectionsGiveTheBitsOfSeparateMatmuls) {
  kernels::cpu::CpuBackend backend;
  backend.setComputeDType(DType::kBF16);
  for (const char* architecture :
       {"LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
        "GraniteForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "SmolLM3ForCausalLM",
        "Ministral3ForCausalLM", "Glm4ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM", "GraniteMoeForCausalLM",
        "OlmoeForCausalLM"}) {
    ExactnessChecks checks(::tandem::testing::exactnessModel(architecture, DType::kBF16), backend,
                           DType::kBF16);
    EXPECT_TRUE(checks.fusedProjectionsMatchSeparate()) << architecture;
  }
}

// A CPU backend that asks for stacked matrices in pairs (gate row j, up row
// j; q and k heads in RoPE pairs), as the CUDA backend's fast kernels do,
// and takes each pair apart on the host before the CPU's own steps: the
// runner's paired stacking is checked where no GPU is. Counts its fused
// calls so the test knows the runner used them.
class PairedStackingCpuBackend final : public kernels::cpu::CpuBackend {
 public:
  StackedLayout stackedLayout() const override { return StackedLayout::kPairs; }
  void matmulSiluMul(const float* x, int64_t m, int64_t k, const kernels::WeightView& gate_up,
                     float* out, float* scratch, float* up_scratch) override {
    ++silu_calls_;
    const int64_t inter = gate_up.rows / 2;
    matmul(x, m, k, gate_up, scratch);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < inter; ++j) {
        out[r * inter + j] = scratch[r * 2 * inter + 2 * j];
        up_scratch[r * inter + j] = scratch[r * 2 * inter + 2 * j + 1];
      }
    }
    siluMul(out, up_scratch, out, m * inter);
  }
  void matmulAdd(const float* x, int64_t m, int64_t k, const kernels::WeightView& w, float* y,
                 float* scratch) override {
    ++add_calls_;
    CpuBackend::matmulAdd(x, m, k, w, y, scratch);
  }
  void matmulQkvRope(const float* x, int64_t m, int64_t k, const kernels::WeightView& qkv,
                     const QkvRope& a, const kernels::KvCacheLayout& cache,
                     float* scratch) override {
    ++rope_calls_;
    const int64_t dim = a.head_dim, half = dim / 2;
    const int64_t q_width = a.num_heads * dim, kv_width = a.num_kv_heads * dim;
    const int64_t n = q_width + 2 * kv_width;
    matmul(x, m, k, qkv, scratch);
    for (int64_t r = 0; r < m; ++r) {
      const float* row = scratch + r * n;
      // Column h * dim + 2i is row i of head h, 2i + 1 its row i + half.
      auto unpair = [&](const float* from, int64_t width, float* to) {
        for (int64_t c = 0; c < width; ++c) {
          const int64_t head = c / dim, i = c % dim / 2;
          to[r * width + head * dim + i + (c % 2) * half] = from[c];
        }
      };
      unpair(row, q_width, a.q);
      unpair(row + q_width, kv_width, a.k);
      std::copy(row + q_width + kv_width, row + n, a.v + r * kv_width);
    }
    biasRopeWriteKv(m, a, cache);
  }
  int64_t siluCalls() const { return silu_calls_; }
  int64_t addCalls() const { return add_calls_; }
  int64_t ropeCalls() const { return rope_calls_; }

 private:
  int64_t silu_calls_ = 0;
  int64_t add_calls_ = 0;
  int64_t rope_calls_ = 0;
};

TEST(PairedStackingCpuBackendTest, FusedProjectionsInPairsGiveTheBitsOfSeparateMatmuls) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    PairedStackingCpuBackend backend;
    backend.setComputeDType(compute);
    // Llama: q/k/v in RoPE pairs; SmolLM3: the same on its first layer, its
    // second (no RoPE) taken apart; Qwen2: pairs with biases; Qwen3 (q/k
    // norm before RoPE), Phi-3 (partial rotary dims, LongRoPE's factor) and
    // GLM (neighbour pairs, biases): q/k/v taken apart as they are.
    int64_t rope_calls = 0;
    for (const char* architecture : {"LlamaForCausalLM", "SmolLM3ForCausalLM", "Qwen2ForCausalLM",
                                     "Qwen3ForCausalLM", "Phi3ForCausalLM", "GlmForCausalLM"}) {
      ExactnessChecks checks(::tandem::testing::exactnessModel(architecture, DType::kBF16), backend,
                             DType::kBF16);
      EXPECT_TRUE(checks.fusedProjectionsMatchSeparate())
          << architecture << ", compute " << dtypeShortName(compute);
      if (std::string(architecture) == "Qwen2ForCausalLM") rope_calls = backend.ropeCalls();
    }
    // Every layer of every fused step: one SiLU·up, two residual adds; the
    // Llama and Qwen2 layers' attention inputs in one call, Qwen3's not.
    EXPECT_GT(backend.siluCalls(), 0);
    EXPECT_EQ(backend.addCalls(), 2 * backend.siluCalls());
    EXPECT_GT(rope_calls, 0);
    EXPECT_EQ(backend.ropeCalls(), rope_calls);
  }
}

// The comparison can fail: one changed prompt token changes the logits of
// the following positions, the tokens and the KV bytes, and sameRun says so.
TEST_P(BackendExactnessTest, ComparisonReportsADifferentPrompt) {
  ExactnessChecks c = checks();
  std::vector<TokenId> prompt = c.prompt(30, 12);
  const SequenceRun expected = c.alone(prompt, 0);
  prompt[20] = prompt[20] == 5 ? 6 : 5;
  const ::testing::AssertionResult result =
      ::tandem::testing::sameRun("changed prompt", expected, c.alone(prompt, 0));
  ASSERT_FALSE(result);
  EXPECT_NE(std::string(result.message()).find("logits of step 0"), std::string::npos)
      << result.message();
}

// A mixture of experts, a model with fp8 weights and an fp8 KV cache run
// on the CPU backend; any other refuses them when the runner is made,
// naming what the model or cache is and the backend. Partial rotary dims,
// neighbour pairs and an attention factor on cos/sin (rope_variant) run where the backend
// applies them: on CUDA with CudaBackendOptions::rope_variants, on as the
// agent makes the backend (docs/cuda.md#kernel-sets).
class CpuOnlyModelTest : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(CpuOnlyModelTest, RunsOnTheCpuAndIsRefusedElsewhere) {
  struct Case {
    const Model& model;
    std::string refusal;
    DType kv_dtype = DType::kF32;
    bool rope_variant = false;
  };
  const Case cases[] = {
      {::tandem::testing::exactnessModel("MixtralForCausalLM", DType::kBF16),
       "(MixtralForCausalLM) is a mixture of experts, which runs on the CPU backend only ("},
      {::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16,
                                         "compressed-tensors:channel"),
       "has fp8 weights (compressed-tensors, channel scales), which run on the CPU backend "
       "only ("},
      {::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16),
       "an fp8 KV cache (--kv-dtype fp8) runs on the CPU backend only (", DType::kF8E4M3},
      {::tandem::testing::exactnessModel("Gemma3ForCausalLM", DType::kBF16),
       "(Gemma3ForCausalLM) runs on the CPU backend only ("},
      {::tandem::testing::exactnessModel("Gemma2ForCausalLM", DType::kBF16),
       "(Gemma2ForCausalLM) runs on the CPU backend only ("},
      {::tandem::testing::exactnessModel("Phi3ForCausalLM", DType::kBF16),
       "(Phi3ForCausalLM) rotates part of each head (partial_rotary_factor), which runs on the "
       "CPU backend only (",
       DType::kF32, true},
      {::tandem::testing::exactnessModel("Qwen3ForCausalLM", DType::kBF16, "", "yarn"),
       "(Qwen3ForCausalLM) scales its rotary embedding's cos and sin (YaRN's attention factor), "
       "which runs on the CPU backend only (",
       DType::kF32, true},
      {::tandem::testing::exactnessModel("Olmo3ForCausalLM", DType::kBF16),
       "(Olmo3ForCausalLM) scales its rotary embedding's cos and sin (YaRN's attention factor), "
       "which runs on the CPU backend only (",
       DType::kF32, true},
      {::tandem::testing::exactnessModel("GraniteForCausalLM", DType::kBF16),
       "(GraniteForCausalLM) scales its embedding, residual branches and logits, which runs on "
       "the CPU backend only ("},
      {::tandem::testing::exactnessModel("Glm4ForCausalLM", DType::kBF16),
       "(Glm4ForCausalLM) rotates neighbour pairs (GLM's rotary embedding), which runs on the "
       "CPU backend only (",
       DType::kF32, true},
  };
  kernels::Backend& backend = ::tandem::testing::sharedBackend(GetParam());
  // As the agent makes it.
  const std::unique_ptr<kernels::Backend> agents = kernels::makeBackend(GetParam(), {});
  const auto expectRefused = [](const Case& c, kernels::Backend& on) {
    const std::unique_ptr<KvCache> cache =
        ::tandem::testing::makeCacheOn(on, c.model, c.kv_dtype, 4);
    try {
      ModelRunner runner(c.model, *cache, on);
      ADD_FAILURE() << "accepted by " << on.description();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.refusal + on.description()), std::string::npos)
          << e.what();
    }
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.refusal);
    if (GetParam() == kernels::DeviceKind::kCpu || c.rope_variant) {
      ASSERT_TRUE(backend.appliesRopeVariants());
      const std::unique_ptr<KvCache> cache =
          ::tandem::testing::makeCacheOn(backend, c.model, c.kv_dtype, 4);
      EXPECT_NO_THROW(ModelRunner(c.model, *cache, backend));
      // The agent's backend runs them too.
      const std::unique_ptr<KvCache> agents_cache =
          ::tandem::testing::makeCacheOn(*agents, c.model, c.kv_dtype, 4);
      EXPECT_NO_THROW(ModelRunner(c.model, *agents_cache, *agents));
      continue;
    }
    expectRefused(c, backend);
  }
}

std::string deviceName(const ::testing::TestParamInfo<kernels::DeviceKind>& info) {
  return kernels::deviceKindName(info.param);
}

// The context a runner computes as the model does (contextLimit, the
// engine's default max_model_len and tandem-agent generate's bound): a
// window on every layer caps it on a backend without window kernels, not
// on the CPU's, which applies it.
class ContextLimitTest : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(ContextLimitTest, AWindowCapsItOnlyWithoutWindowKernels) {
  kernels::Backend& backend = ::tandem::testing::sharedBackend(GetParam());
  ModelConfig config = tools::presetConfig("tiny", "MistralForCausalLM");
  ASSERT_EQ(config.max_position_embeddings, 512);
  const ContextLimit whole = contextLimit(config, backend);
  EXPECT_EQ(whole.tokens, 512);
  EXPECT_EQ(whole.origin, "the model's max_position_embeddings");
  config.sliding_window = 32;
  config.sliding_layers.assign(static_cast<size_t>(config.num_hidden_layers), true);
  const ContextLimit windowed = contextLimit(config, backend);
  if (backend.hostAccessible()) {
    EXPECT_EQ(windowed.tokens, 512);
  } else {
    EXPECT_EQ(windowed.tokens, 32);
    EXPECT_EQ(windowed.origin, "the model's sliding_window (attention on " + backend.description() +
                                   " is full, the same as the window's only for sequences no "
                                   "longer than it)");
  }
  // A window no shorter than the context changes nothing.
  config.sliding_window = 512;
  EXPECT_EQ(contextLimit(config, backend).tokens, 512);

  // Ministral 3's query scale, 1 below position 32 of the tiny model's 512:
  // applied on the host, else the context stops where it begins.
  config = tools::presetConfig("tiny", "Ministral3ForCausalLM");
  ASSERT_EQ(config.llama4_scaling_original, 32);
  const ContextLimit scaled = contextLimit(config, backend);
  if (backend.hostAccessible()) {
    EXPECT_EQ(scaled.tokens, 512);
  } else {
    EXPECT_EQ(scaled.tokens, 32);
    EXPECT_EQ(scaled.origin,
              "the positions the model's query scale (llama_4_scaling_beta) leaves "
              "at 1 (" +
                  backend.description() + " does not apply it)");
  }
}

// A prompt across two attention splits (exactness_checks.h): one shot,
// chunked across the split boundary and batched with a short sequence give
// the same bits, on every device (on CUDA: its kernel set, and the
// candidates where TANDEM_CUDA_CANDIDATES asks).
class LongPromptTest : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(LongPromptTest, PrefillAcrossAttentionSplitsIsBitIdentical) {
  ExactnessChecks checks(::tandem::testing::exactnessModel("LlamaForCausalLM", DType::kBF16),
                         ::tandem::testing::sharedBackend(GetParam()), DType::kBF16);
  EXPECT_TRUE(checks.longPromptMatchesAcrossSplits());
}

// The shared backend of these checks runs what the environment asks for:
// on CUDA with TANDEM_CUDA_CANDIDATES=1 (and the flash kernels), the
// candidates for the next defaults, named in its description, so that the
// candidates' run of these checks (tests/cuda_emu, scripts/gpu-check.sh)
// cannot pass without them; else none of them, anywhere.
class TestBackendTest : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(TestBackendTest, RunsTheCandidatesExactlyWhereAsked) {
  const std::string description = ::tandem::testing::sharedBackend(GetParam()).description();
  const bool asked =
      GetParam() == kernels::DeviceKind::kCuda && ::tandem::testing::cudaCandidatesForTests();
  const kernels::CudaKernels set = ::tandem::testing::cudaKernelsForTests();
  // Deep decode loads with any fast set; the wide bf16 GEMM's configuration
  // wherever asked (the description names it whatever the set); the other
  // two with the flash one.
  const bool fast = set == kernels::CudaKernels::kFast || set == kernels::CudaKernels::kFlash;
  const bool flash = set == kernels::CudaKernels::kFlash;
  for (const auto& [candidate, runs] : {std::pair{"deep decode loads", asked && fast},
                                        std::pair{"bf16 GEMM configuration 9", asked},
                                        std::pair{"compact attention grid", asked && flash},
                                        std::pair{"deep attention loads", asked && flash}}) {
    EXPECT_EQ(description.find(candidate) != std::string::npos, runs)
        << candidate << " in " << description;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, TestBackendTest,
                         ::testing::ValuesIn(::tandem::testing::availableDeviceKinds()),
                         deviceName);

INSTANTIATE_TEST_SUITE_P(Devices, LongPromptTest,
                         ::testing::ValuesIn(::tandem::testing::availableDeviceKinds()),
                         deviceName);

INSTANTIATE_TEST_SUITE_P(Devices, ContextLimitTest,
                         ::testing::ValuesIn(::tandem::testing::availableDeviceKinds()),
                         deviceName);

INSTANTIATE_TEST_SUITE_P(Devices, CpuOnlyModelTest,
                         ::testing::ValuesIn(::tandem::testing::availableDeviceKinds()),
                         deviceName);

std::vector<Param> params() {
  const ModelVariant variants[] = {
      {"LlamaForCausalLM", DType::kBF16, DType::kF32},
      {"LlamaForCausalLM", DType::kBF16, DType::kBF16},
      {"Qwen2ForCausalLM", DType::kF16, DType::kF32},
      {"Qwen3ForCausalLM", DType::kBF16, DType::kBF16},
      {"Gemma2ForCausalLM", DType::kBF16, DType::kF32},
      {"Gemma3ForCausalLM", DType::kBF16, DType::kF32},
      {"Phi3ForCausalLM", DType::kBF16, DType::kF32},
      // Phi-4 (14B): fused matrices, whole heads rotating; every backend.
      {"Phi3ForCausalLM", DType::kBF16, DType::kF32, "phi4"},
      // YaRN's attention factor.
      {"Qwen3ForCausalLM", DType::kBF16, DType::kF32, "yarn"},
      {"GraniteForCausalLM", DType::kBF16, DType::kF32},
      // OLMo 2: every backend (its norms are the backends' rmsNorm).
      {"Olmo2ForCausalLM", DType::kBF16, DType::kF32},
      // OLMo 3: a sliding layer rotating unscaled, a full one with YaRN
      // (on CUDA, with the rope-variant kernel the tests turn on, within
      // the window the engine caps its context at there).
      {"Olmo3ForCausalLM", DType::kBF16, DType::kF32},
      // Ministral 3: queries scaled by position (a host step, CPU only:
      // CUDA's context ends where the scale begins, ContextLimitTest).
      {"Ministral3ForCausalLM", DType::kBF16, DType::kF32},
      // SmolLM3: a layer without RoPE (the fused Q/K/V+RoPE step skipped
      // there); every backend.
      {"SmolLM3ForCausalLM", DType::kBF16, DType::kF32},
      // GLM: neighbour-pair rotation of half of each head, q/k/v biases;
      // GLM-4 with its sandwich norms (on CUDA, with the rope-variant
      // kernel the tests turn on).
      {"GlmForCausalLM", DType::kBF16, DType::kF32},
      {"Glm4ForCausalLM", DType::kBF16, DType::kBF16},
      {"MixtralForCausalLM", DType::kBF16, DType::kF32},
      {"Qwen3MoeForCausalLM", DType::kBF16, DType::kBF16},
      // Qwen2-MoE: a gated shared expert. GLM-4.5: sigmoid routing in
      // groups, a shared expert, a dense first layer.
      {"Qwen2MoeForCausalLM", DType::kBF16, DType::kBF16},
      {"Glm4MoeForCausalLM", DType::kBF16, DType::kF32},
      // GPT-OSS: sinks, windows, biases, the clamped activation.
      {"GptOssForCausalLM", DType::kBF16, DType::kBF16},
      // Granite MoE: Granite's scalars around a mixture.
      {"GraniteMoeForCausalLM", DType::kBF16, DType::kF32},
      // OLMoE: q/k norms across the heads, a mixture on every layer.
      {"OlmoeForCausalLM", DType::kBF16, DType::kBF16},
  };
  std::vector<Param> out;
  for (kernels::DeviceKind kind : ::tandem::testing::availableDeviceKinds()) {
    for (const ModelVariant& variant : variants) {
      // Mixtures run on the CPU backend only (docs/engine.md#mixture-of-experts).
      // So do Gemma (docs/engine.md#gemma-3) and Granite. The test models'
      // Phi-3 (partial rotary dims, LongRoPE), YaRN and GLM run on CUDA with the
      // rope-variant kernel the tests turn on (CpuOnlyModelTest).
      const bool cpu_only = variant.architecture == "MixtralForCausalLM" ||
                            variant.architecture == "Qwen3MoeForCausalLM" ||
                            variant.architecture == "Glm4MoeForCausalLM" ||
                            variant.architecture == "GptOssForCausalLM" ||
                            variant.architecture == "GraniteMoeForCausalLM" ||
                            variant.architecture == "OlmoeForCausalLM" ||
                            variant.architecture == "Qwen2MoeForCausalLM" ||
                            variant.architecture == "Gemma2ForCausalLM" ||
                            variant.architecture == "Gemma3ForCausalLM" ||
                            variant.architecture == "GraniteForCausalLM" ||
                            variant.architecture == "Ministral3ForCausalLM";
      if (cpu_only && kind != kernels::DeviceKind::kCpu) continue;
      out.emplace_back(kind, variant);
    }
  }
  return out;
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [kind, variant] = info.param;
  return std::string(kernels::deviceKindName(kind)) + "_" +
         variant.architecture.substr(0, variant.architecture.find("For")) +
         (variant.rotary.empty() ? "" : "_" + variant.rotary) + "_w" +
         dtypeShortName(variant.weight_dtype) + "_kv" + dtypeShortName(variant.kv_dtype);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendExactnessTest, ::testing::ValuesIn(params()), paramName);

}  // namespace
}  // namespace tandem::engine
