// How many launches a decode layer takes on the CUDA backend, counted on the
// CUDA emulator (docs/cuda.md#fused-projections), and that taking fewer
// changes no bit; and that a step's logits come back to page-locked host
// memory. With the fast kernels, fused projections and fused
// launches (the agent's --fuse-projections), a Llama decode layer is 8
// kernels and no copies, under f32 and under bf16 compute; the model's
// logits, greedy tokens and KV bytes equal those of the same kernels
// without fused launches. A layer's count is the difference between the
// same model with 3 layers and with 2, for a recorded decode step replayed.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/emulator.h"
#include "tests/support/exactness_checks.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

using ::tandem::testing::TempDir;

struct Configuration {
  std::string architecture = "LlamaForCausalLM";
  DType compute = DType::kF32;
  bool fuse_projections = true;
  bool fused_launches = true;
};

struct DecodeRun {
  int64_t kernels = 0;  // of the last decode step (replayed)
  int64_t copies = 0;   // its other operations: copies, memsets
  std::vector<std::vector<float>> logits;
  std::vector<TokenId> tokens;
  std::vector<uint8_t> kv;
};

const Model& modelWith(const std::string& architecture, int64_t layers) {
  static std::vector<std::unique_ptr<TempDir>> dirs;
  static std::map<std::string, std::unique_ptr<Model>> models;
  const std::string key = architecture + std::to_string(layers);
  if (auto it = models.find(key); it != models.end()) return *it->second;
  dirs.push_back(std::make_unique<TempDir>("tandem-launches-model"));
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.seed = 23;
  options.layers = layers;
  tools::writeTestModel(options, dirs.back()->path());
  return *models.emplace(key, Model::load(dirs.back()->path())).first->second;
}

// A 20-token prompt, then three greedy decode steps, recorded: the first
// runs as issued, the second is recorded and launched, the third replayed.
DecodeRun decode(const Configuration& c, int64_t layers) {
  const Model& model = modelWith(c.architecture, layers);
  auto backend = kernels::makeBackend(
      kernels::DeviceKind::kCuda,
      {.cuda_kernels = kernels::CudaKernels::kFast, .fused_launches = c.fused_launches});
  backend->setComputeDType(c.compute);
  DecodeRun run;
  {
    auto cache = ::tandem::testing::makeCacheOn(*backend, model, DType::kBF16, 4);
    ModelRunnerOptions options;
    options.fuse_projections = c.fuse_projections;
    ModelRunner runner(model, *cache, *backend, options);
    runner.setRecordDecode(true);
    const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
    const std::vector<TokenId> prompt = ::tandem::testing::randomTokenIds(20, 5, 3, vocab - 1);
    const std::vector<BlockId> blocks = {2, 0};
    std::vector<float> logits;
    SequenceInput input{prompt, 0, blocks};
    runner.forward({&input, 1}, logits);
    auto position = static_cast<int64_t>(prompt.size());
    for (int step = 0; step < 4; ++step) {
      run.logits.push_back(logits);
      run.tokens.push_back(static_cast<TokenId>(kernels::argmax(logits.data(), vocab)));
      if (step == 3) break;
      const cuda_emu::DeviceCounts before = cuda_emu::deviceCounts();
      SequenceInput next{{&run.tokens.back(), 1}, position++, blocks};
      runner.forward({&next, 1}, logits);
      const cuda_emu::DeviceCounts after = cuda_emu::deviceCounts();
      run.kernels = after.kernels - before.kernels;
      run.copies = after.operations - before.operations - run.kernels;
    }
    run.kv = ::tandem::testing::readKvBytes(*backend, *cache, blocks);
  }
  return run;
}

struct PerLayer {
  int64_t kernels = 0;
  int64_t copies = 0;
};

PerLayer perLayer(const Configuration& c) {
  const DecodeRun two = decode(c, 2);
  const DecodeRun three = decode(c, 3);
  return {three.kernels - two.kernels, three.copies - two.copies};
}

std::string describe(const Configuration& c) {
  return c.architecture + ", " + dtypeShortName(c.compute) + " compute" +
         (c.fuse_projections ? ", fused projections" : "") +
         (c.fused_launches ? ", fused launches" : "");
}

TEST(DecodeLaunchesTest, ALlamaDecodeLayerIsEightKernelsWithFusedLaunches) {
  for (const DType compute : {DType::kF32, DType::kBF16}) {
    Configuration fused;
    fused.compute = compute;
    Configuration projections = fused;
    projections.fused_launches = false;
    Configuration separate = projections;
    separate.fuse_projections = false;
    const PerLayer counts[] = {perLayer(separate), perLayer(projections), perLayer(fused)};
    int i = 0;
    for (const Configuration* c : {&separate, &projections, &fused}) {
      std::cout << describe(*c) << ": " << counts[i].kernels << " kernels, " << counts[i].copies
                << " copies per decode layer\n";
      ++i;
    }
    SCOPED_TRACE(describe(fused));
    EXPECT_EQ(counts[2].kernels, 8);
    EXPECT_EQ(counts[2].copies, 0);
    EXPECT_LT(counts[2].kernels, counts[1].kernels);
    EXPECT_LT(counts[1].kernels + counts[1].copies, counts[0].kernels + counts[0].copies);
  }
}

// The model with and without fused launches: the same logits at every
// step, the same greedy tokens and KV bytes; for Llama (the Q/K/V epilogue
// with RoPE) and Qwen3 (q/k norm: Q/K/V taken apart), f32 and bf16 compute.
TEST(DecodeLaunchesTest, FusedLaunchesChangeNoBit) {
  for (const std::string architecture : {"LlamaForCausalLM", "Qwen3ForCausalLM"}) {
    for (const DType compute : {DType::kF32, DType::kBF16}) {
      Configuration fused;
      fused.architecture = architecture;
      fused.compute = compute;
      Configuration plain = fused;
      plain.fused_launches = false;
      SCOPED_TRACE(describe(fused));
      const DecodeRun a = decode(fused, 3);
      const DecodeRun b = decode(plain, 3);
      EXPECT_LT(a.kernels, b.kernels);
      ASSERT_EQ(a.logits.size(), b.logits.size());
      for (size_t step = 0; step < a.logits.size(); ++step) {
        ASSERT_EQ(a.logits[step].size(), b.logits[step].size());
        EXPECT_EQ(0, std::memcmp(a.logits[step].data(), b.logits[step].data(),
                                 a.logits[step].size() * sizeof(float)))
            << "logits of step " << step;
      }
      EXPECT_EQ(a.tokens, b.tokens);
      EXPECT_EQ(a.kv, b.kv);
    }
  }
}

// A forward pass on the CUDA backend leaves its logits in page-locked host
// memory (ModelRunner::forward returning them, as the engine's steps run
// it): no byte of a step crosses to or from pageable host memory, where a
// GPU's driver would stage it, also after the logits' storage has grown
// and been registered again; and the logits are the vector overload's, bit
// for bit. A copy into a plain vector is counted as pageable (the counter
// sees what it should).
TEST(PageLockedCopiesTest, AStepsLogitsComeBackToPageLockedMemory) {
  const Model& model = modelWith("LlamaForCausalLM", 2);
  auto backend = kernels::makeBackend(kernels::DeviceKind::kCuda,
                                      {.cuda_kernels = kernels::CudaKernels::kFast});
  auto cache = ::tandem::testing::makeCacheOn(*backend, model, DType::kBF16, 8);
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  const auto last = static_cast<int32_t>(vocab - 1);
  const std::vector<TokenId> first = ::tandem::testing::randomTokenIds(20, 5, 3, last);
  const std::vector<TokenId> second = ::tandem::testing::randomTokenIds(9, 6, 3, last);
  const std::vector<BlockId> first_blocks = {2, 0}, second_blocks = {5};
  const SequenceInput alone{first, 0, first_blocks};
  const SequenceInput both[] = {alone, {second, 0, second_blocks}};
  ModelRunner runner(model, *cache, *backend);
  std::vector<std::vector<float>> kept;
  for (const std::span<const SequenceInput> batch :
       {std::span<const SequenceInput>(&alone, 1), std::span<const SequenceInput>(both)}) {
    const cuda_emu::DeviceCounts before = cuda_emu::deviceCounts();
    const std::span<const float> logits = runner.forward(batch);
    const cuda_emu::DeviceCounts after = cuda_emu::deviceCounts();
    EXPECT_GT(after.operations, before.operations);
    EXPECT_EQ(after.pageable_copy_bytes, before.pageable_copy_bytes)
        << batch.size() << " sequence(s)";
    ASSERT_EQ(logits.size(), batch.size() * vocab);
    kept.emplace_back(logits.begin(), logits.end());
  }
  ModelRunner other(model, *cache, *backend);
  std::vector<float> copied;
  other.forward(both, copied);
  ASSERT_EQ(copied.size(), kept[1].size());
  EXPECT_EQ(0, std::memcmp(copied.data(), kept[1].data(), copied.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(copied.data(), kept[0].data(), vocab * sizeof(float)));

  const cuda_emu::DeviceCounts before = cuda_emu::deviceCounts();
  void* device = backend->allocate(64);
  std::vector<char> pageable(64);
  backend->copyToHost(pageable.data(), device, pageable.size());
  backend->release(device, 64);
  EXPECT_EQ(cuda_emu::deviceCounts().pageable_copy_bytes - before.pageable_copy_bytes, 64);
}

}  // namespace
}  // namespace tandem::engine
