// The engine's exactness properties, written once for every compute backend:
// on one backend a sequence's logits, greedy tokens and KV bytes are
// bit-identical whether it is prefilled in one shot or in chunks, alone or
// batched with other sequences (scattered blocks, prefill chunks mixed with
// decodes), and whether its prefix KV was computed by itself (prefix miss)
// or by an earlier request sharing the prefix (prefix hit).
//
// KV bytes are read back through Backend::readBlocks, so the checks hold for
// device memory the host cannot address. Each check returns an
// AssertionResult that names the run, the step and what differed. The unit
// test (tests/unit/engine/backend_exactness_test.cpp) runs them over every
// backend the build and machine have; the gpu test
// (tests/gpu/engine_exactness_test.cpp) runs them on CUDA and compares CUDA's
// greedy tokens with the CPU's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::testing {

using engine::BlockId;

// A setting of the CUDA backend of these tests: the environment variable
// `name`, else its `name=value` entry in TANDEM_CUDA_TEST_SETTINGS (entries
// separated by commas), else nullopt. The one variable is for ctest, where
// gtest_discover_tests keeps only the first of several ENVIRONMENT entries
// (tests/cuda_emu/CMakeLists.txt); scripts/gpu-check.sh sets the
// variables themselves.
inline std::optional<std::string> cudaTestSetting(const std::string& name) {
  if (const char* text = std::getenv(name.c_str())) return std::string(text);
  const char* all = std::getenv("TANDEM_CUDA_TEST_SETTINGS");
  if (all == nullptr) return std::nullopt;
  const std::string settings = all;
  const std::string key = name + "=";
  for (size_t start = 0; start <= settings.size();) {
    size_t end = settings.find(',', start);
    if (end == std::string::npos) end = settings.size();
    if (settings.compare(start, key.size(), key) == 0) {
      return settings.substr(start + key.size(), end - start - key.size());
    }
    start = end + 1;
  }
  return std::nullopt;
}

// The CUDA kernel set the CUDA backend of these tests runs:
// TANDEM_CUDA_KERNELS=reference (the default) or fast (scripts/gpu-check.sh
// runs the gpu tests with each).
inline kernels::CudaKernels cudaKernelsForTests() {
  const auto text = cudaTestSetting("TANDEM_CUDA_KERNELS");
  return !text ? kernels::CudaKernels::kReference
               : kernels::resolveCudaKernels(*text, "TANDEM_CUDA_KERNELS",
                                             kernels::DeviceKind::kCuda);
}

// What the CUDA backend of these tests multiplies in:
// TANDEM_CUDA_COMPUTE_DTYPE=f32 (the default) or bf16 (tensor cores; with
// TANDEM_CUDA_KERNELS=fast, scripts/gpu-check.sh runs the gpu exactness
// tests so too). Every check compares the backend with itself, so each holds
// in either.
inline DType cudaComputeDTypeForTests() {
  const auto text = cudaTestSetting("TANDEM_CUDA_COMPUTE_DTYPE");
  return !text ? DType::kF32 : kernels::parseComputeDType(*text, "TANDEM_CUDA_COMPUTE_DTYPE");
}

// Whether the CUDA backend of these tests fuses launches
// (CudaBackendOptions::fused_launches): TANDEM_CUDA_FUSED_LAUNCHES=1; off
// when unset or 0.
inline bool cudaFusedLaunchesForTests() {
  return cudaTestSetting("TANDEM_CUDA_FUSED_LAUNCHES") == "1";
}

// Whether the CUDA backend of these tests runs the candidates for the next
// defaults (deep decode loads, the compact attention grid, deep attention
// loads, the wide bf16 GEMM's configuration 9 for prefills past 256 rows:
// docs/cuda.md's kernel table): TANDEM_CUDA_CANDIDATES=1 (with
// TANDEM_CUDA_KERNELS=flash and bf16 compute, scripts/gpu-check.sh's
// candidates step); off when unset or 0.
inline bool cudaCandidatesForTests() { return cudaTestSetting("TANDEM_CUDA_CANDIDATES") == "1"; }

// One backend of each kind for the whole test process (weights made resident
// once per backend). Throws tandem::Error when the kind cannot be had.
inline kernels::Backend& sharedBackend(kernels::DeviceKind kind) {
  static std::map<kernels::DeviceKind, std::unique_ptr<kernels::Backend>> backends;
  auto it = backends.find(kind);
  if (it == backends.end()) {
    const kernels::CudaKernels set = kind == kernels::DeviceKind::kCuda
                                         ? cudaKernelsForTests()
                                         : kernels::CudaKernels::kReference;
    const bool cuda = kind == kernels::DeviceKind::kCuda;
    const bool candidates = cuda && cudaCandidatesForTests();
    std::unique_ptr<kernels::Backend> backend = kernels::makeBackend(
        kind,
        {.cuda_kernels = set,
         .deep_skinny = candidates,
         .compact_attention = candidates,
         .deep_attention = candidates,
         .fused_launches = cuda && cudaFusedLaunchesForTests(),
         .rope_variants = true,
         .bf16_gemm_config = candidates ? kernels::kBf16GemmWide + 1 : kernels::kBf16GemmServing});
    if (kind == kernels::DeviceKind::kCuda) backend->setComputeDType(cudaComputeDTypeForTests());
    it = backends.emplace(kind, std::move(backend)).first;
  }
  return *it->second;
}

// The backends this build has and this machine can run: always the CPU.
inline std::vector<kernels::DeviceKind> availableDeviceKinds() {
  std::vector<kernels::DeviceKind> kinds = {kernels::DeviceKind::kCpu};
  if (kernels::cudaDeviceCount() > 0) kinds.push_back(kernels::DeviceKind::kCuda);
  return kinds;
}

// A generated tiny model per (architecture, weight dtype), kept for the
// process; its directory is removed when the process exits.
// quantization: a tools::parseQuantizationSpec value for fp8 weights, or "".
// rotary: "phi4" (tools::TestModelOptions::phi4_rotary, Phi3ForCausalLM
// only), "yarn" (::yarn), or "" for the preset's.
inline const engine::Model& exactnessModel(const std::string& architecture, DType weight_dtype,
                                           const std::string& quantization = "",
                                           const std::string& rotary = "") {
  static std::vector<std::unique_ptr<TempDir>> dirs;
  static std::map<std::string, std::unique_ptr<engine::Model>> models;
  const std::string key = architecture + dtypeShortName(weight_dtype) + quantization + rotary;
  auto it = models.find(key);
  if (it != models.end()) return *it->second;
  dirs.push_back(std::make_unique<TempDir>("tandem-exactness-model"));
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.dtype = weight_dtype;
  options.seed = 17;
  options.phi4_rotary = rotary == "phi4";
  options.yarn = rotary == "yarn";
  if (!quantization.empty()) options.quantization = tools::parseQuantizationSpec(quantization);
  tools::writeTestModel(options, dirs.back()->path());
  return *models.emplace(key, engine::Model::load(dirs.back()->path())).first->second;
}

// A zero-filled cache in `backend`'s memory with the model's geometry.
inline std::unique_ptr<engine::KvCache> makeCacheOn(kernels::Backend& backend,
                                                    const engine::Model& model, DType kv_dtype,
                                                    int64_t num_blocks) {
  engine::KvCacheConfig config = engine::KvCacheConfig::forModel(model, kv_dtype, 16);
  config.num_blocks = num_blocks;
  return std::make_unique<engine::KvCache>(config, engine::slabAllocatorFor(backend));
}

// The bytes of `blocks`, in table order, read through the backend.
inline std::vector<uint8_t> readKvBytes(kernels::Backend& backend, engine::KvCache& cache,
                                        std::span<const BlockId> blocks) {
  std::vector<uint8_t> bytes(blocks.size() * cache.blockBytes());
  backend.readBlocks(cache.layout(), blocks.data(), static_cast<int64_t>(blocks.size()),
                     bytes.data());
  return bytes;
}

// What one sequence produced: the logits of its prefill's last token and of
// each decode step, the greedy tokens, and the KV bytes of its blocks.
struct SequenceRun {
  std::vector<std::vector<float>> logits;
  std::vector<TokenId> tokens;
  std::vector<uint8_t> kv;
};

// Bit-for-bit comparison; the message names `what`, the first step that
// differs and, for logits, the first differing index.
inline ::testing::AssertionResult sameRun(const std::string& what, const SequenceRun& expected,
                                          const SequenceRun& actual) {
  if (expected.logits.size() != actual.logits.size()) {
    return ::testing::AssertionFailure() << what << ": " << actual.logits.size()
                                         << " logit rows, expected " << expected.logits.size();
  }
  for (size_t step = 0; step < expected.logits.size(); ++step) {
    const auto& e = expected.logits[step];
    const auto& a = actual.logits[step];
    if (e.size() != a.size() || std::memcmp(e.data(), a.data(), e.size() * sizeof(float)) != 0) {
      size_t index = 0;
      while (index < std::min(e.size(), a.size()) &&
             std::memcmp(&e[index], &a[index], sizeof(float)) == 0) {
        ++index;
      }
      auto failure = ::testing::AssertionFailure()
                     << what << ": logits of step " << step << " differ at index " << index;
      if (index < std::min(e.size(), a.size()))
        failure << " (" << a[index] << " vs " << e[index] << ")";
      return failure;
    }
  }
  if (expected.tokens != actual.tokens) {
    return ::testing::AssertionFailure() << what << ": greedy tokens differ";
  }
  if (expected.kv.size() != actual.kv.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.kv.size() << " KV bytes, expected " << expected.kv.size();
  }
  if (expected.kv != actual.kv) {
    size_t index = 0;
    while (expected.kv[index] == actual.kv[index]) ++index;
    return ::testing::AssertionFailure()
           << what << ": KV bytes differ from byte " << index << " of " << expected.kv.size();
  }
  return ::testing::AssertionSuccess();
}

// The property checks on one backend, one model and one KV dtype.
class ExactnessChecks {
 public:
  static constexpr int64_t kDecodeSteps = 5;

  ExactnessChecks(const engine::Model& model, kernels::Backend& backend, DType kv_dtype,
                  const engine::ModelRunnerOptions& runner_options = {})
      : model_(model), backend_(backend), kv_dtype_(kv_dtype), runner_options_(runner_options) {}

  int64_t vocab() const { return model_.config().vocab_size; }
  // Token ids within the tiny model's text vocabulary.
  std::vector<TokenId> prompt(size_t n, uint32_t seed) const {
    return randomTokenIds(n, seed, 3, static_cast<int32_t>(vocab() - 1));
  }

  // `tokens` alone in a fresh cache on blocks 0.., prefilled in chunks of
  // `chunk` tokens (0: one shot), then decoded greedily.
  SequenceRun alone(const std::vector<TokenId>& tokens, int64_t chunk) {
    const std::vector<BlockId> blocks = iota(blocksFor(tokens.size()), 0);
    auto cache = makeCacheOn(backend_, model_, kv_dtype_, static_cast<int64_t>(blocks.size()));
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    SequenceRun run;
    std::vector<float> logits;
    const auto n = static_cast<int64_t>(tokens.size());
    if (chunk <= 0) chunk = n;
    for (int64_t start = 0; start < n; start += chunk) {
      engine::SequenceInput input{
          std::span<const TokenId>(tokens).subspan(start, std::min(chunk, n - start)), start,
          blocks};
      runner.forward({&input, 1}, logits);
    }
    run.logits.push_back(logits);
    decodeAlone(runner, n, blocks, run);
    run.kv = readKvBytes(backend_, *cache, blocks);
    return run;
  }

  ::testing::AssertionResult chunkedMatchesOneShot() {
    const std::vector<TokenId> tokens = prompt(53, 1);
    const SequenceRun expected = alone(tokens, 0);
    for (int64_t chunk : {1, 7, 16}) {
      auto result =
          sameRun("prefill in chunks of " + std::to_string(chunk), expected, alone(tokens, chunk));
      if (!result) return result;
    }
    return ::testing::AssertionSuccess();
  }

  // A prefilled and decoded between two other sequences in one batch, on
  // scattered blocks; and A's prefill chunks batched with another's decodes.
  ::testing::AssertionResult aloneMatchesBatched() {
    const std::vector<TokenId> a = prompt(40, 2), b = prompt(13, 3), c = prompt(70, 4);
    const SequenceRun expected = alone(a, 0);

    auto cache = makeCacheOn(backend_, model_, kv_dtype_, 16);
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    const std::vector<BlockId> b_blocks = {0, 1}, a_blocks = {9, 3, 12},
                               c_blocks = {4, 5, 6, 7, 8, 10};
    std::vector<engine::SequenceInput> batch = {
        {b, 0, b_blocks}, {a, 0, a_blocks}, {c, 0, c_blocks}};
    std::vector<float> logits;
    runner.forward(batch, logits);
    SequenceRun batched;
    batched.logits.push_back(row(logits, 1));
    std::vector<TokenId> next(3);
    for (int64_t step = 0; step < kDecodeSteps; ++step) {
      for (int s = 0; s < 3; ++s) {
        next[s] = static_cast<TokenId>(kernels::argmax(logits.data() + s * vocab(), vocab()));
      }
      batched.tokens.push_back(next[1]);
      batch = {{{&next[0], 1}, static_cast<int64_t>(b.size()) + step, b_blocks},
               {{&next[1], 1}, static_cast<int64_t>(a.size()) + step, a_blocks},
               {{&next[2], 1}, static_cast<int64_t>(c.size()) + step, c_blocks}};
      runner.forward(batch, logits);
      batched.logits.push_back(row(logits, 1));
    }
    batched.kv = readKvBytes(backend_, *cache, a_blocks);
    if (auto result = sameRun("batched between two sequences", expected, batched); !result) {
      return result;
    }

    // Continuous batching: A's prefill in chunks of 16, each step batched
    // with one decode token of another sequence.
    auto mixed_cache = makeCacheOn(backend_, model_, kv_dtype_, 8);
    engine::ModelRunner mixed(model_, *mixed_cache, backend_, runner_options_);
    const std::vector<BlockId> other_blocks = {0, 1, 7}, a_mixed_blocks = {5, 2, 6};
    const std::vector<TokenId> other = prompt(20, 6);
    engine::SequenceInput other_input{other, 0, other_blocks};
    mixed.forward({&other_input, 1}, logits);
    int64_t other_position = static_cast<int64_t>(other.size());
    const auto a_size = static_cast<int64_t>(a.size());
    for (int64_t start = 0; start < a_size; start += 16) {
      const TokenId other_token = other[static_cast<size_t>(start) % other.size()];
      std::vector<engine::SequenceInput> step = {
          {{&other_token, 1}, other_position++, other_blocks},
          {std::span<const TokenId>(a).subspan(start, std::min<int64_t>(16, a_size - start)), start,
           a_mixed_blocks}};
      mixed.forward(step, logits);
    }
    SequenceRun mixed_run;
    mixed_run.logits.push_back(row(logits, 1));
    decodeAlone(mixed, a_size, a_mixed_blocks, mixed_run);
    mixed_run.kv = readKvBytes(backend_, *mixed_cache, a_mixed_blocks);
    return sameRun("prefill chunks batched with decodes", expected, mixed_run);
  }

  // Fused projections (ModelRunnerOptions::fuse_projections) give a
  // sequence the bits of separate matmuls, one shot and in chunks of 7; and
  // with them on, the properties hold as they do without (batched,
  // recorded decode steps, prompt row logits).
  ::testing::AssertionResult fusedProjectionsMatchSeparate() {
    engine::ModelRunnerOptions options = runner_options_;
    options.fuse_projections = !options.fuse_projections;
    ExactnessChecks other(model_, backend_, kv_dtype_, options);
    const std::vector<TokenId> tokens = prompt(53, 1);
    const SequenceRun expected = alone(tokens, 0);
    for (int64_t chunk : {0, 7}) {
      auto result =
          sameRun("projections fused one way and the other, chunks of " + std::to_string(chunk),
                  expected, other.alone(tokens, chunk));
      if (!result) return result;
    }
    if (auto result = other.aloneMatchesBatched(); !result) return result;
    if (auto result = other.recordedMatchesEager(); !result) return result;
    return other.rowLogitsMatchLastRows();
  }

  // The logits of prompt positions other than the last (ModelRunner's row
  // logits, the prompt's logprobs) are, bit for bit, those each position
  // gets as a sequence's last token: the prompt prefilled one token at a
  // time gives position p's logits as the last row of step p; prefilled in
  // one shot asking for every row, and in chunks of 16 behind another
  // sequence that asks for rows too, each row must equal them.
  ::testing::AssertionResult rowLogitsMatchLastRows() {
    const std::vector<TokenId> tokens = prompt(45, 8);
    const auto n = static_cast<int64_t>(tokens.size());
    const auto width = static_cast<size_t>(vocab());
    const std::vector<BlockId> blocks = iota(blocksFor(tokens.size()), 0);
    std::vector<std::vector<float>> expected;
    {
      auto cache = makeCacheOn(backend_, model_, kv_dtype_, static_cast<int64_t>(blocks.size()));
      engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
      std::vector<float> logits;
      for (int64_t p = 0; p < n; ++p) {
        engine::SequenceInput input{std::span<const TokenId>(tokens).subspan(p, 1), p, blocks};
        runner.forward({&input, 1}, logits);
        expected.push_back(logits);
      }
    }
    auto compare = [&](const std::string& what, const std::vector<std::vector<float>>& rows) {
      for (int64_t p = 0; p < n; ++p) {
        if (rows[p].size() != width) {
          return ::testing::AssertionFailure() << what << ": no logits for position " << p;
        }
        if (std::memcmp(rows[p].data(), expected[p].data(), width * sizeof(float)) != 0) {
          return ::testing::AssertionFailure()
                 << what << ": position " << p << "'s row differs from its last-row logits";
        }
      }
      return ::testing::AssertionSuccess();
    };

    std::vector<std::vector<float>> rows(static_cast<size_t>(n));
    int64_t chunk_start = 0;  // of the sequence whose rows are collected
    size_t wanted = 0;        // its index in the batch
    const engine::RowLogitsSink sink = [&](size_t sequence, int64_t first, int64_t count,
                                           std::span<const float> logits) {
      if (sequence != wanted) return;
      for (int64_t r = 0; r < count; ++r) {
        const auto at = logits.subspan(static_cast<size_t>(r) * width, width);
        rows[static_cast<size_t>(chunk_start + first + r)].assign(at.begin(), at.end());
      }
    };
    {
      auto cache = makeCacheOn(backend_, model_, kv_dtype_, static_cast<int64_t>(blocks.size()));
      engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
      std::vector<float> logits;
      engine::SequenceInput input{tokens, 0, blocks};
      input.num_row_logits = n;
      runner.forward({&input, 1}, logits, sink);
    }
    if (auto result = compare("one shot", rows); !result) return result;

    rows.assign(static_cast<size_t>(n), {});
    wanted = 1;
    auto cache = makeCacheOn(backend_, model_, kv_dtype_, 8);
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    const std::vector<TokenId> other = prompt(30, 9);
    const std::vector<BlockId> other_blocks = {6, 1}, a_blocks = {3, 7, 0};
    std::vector<float> logits;
    for (int64_t start = 0; start < n; start += 16) {
      chunk_start = start;
      const int64_t count = std::min<int64_t>(16, n - start);
      std::vector<engine::SequenceInput> batch = {
          {std::span<const TokenId>(other).subspan(static_cast<size_t>(start) % 16, 2),
           static_cast<int64_t>(start) % 16, other_blocks},
          {std::span<const TokenId>(tokens).subspan(start, count), start, a_blocks}};
      batch[0].num_row_logits = 2;
      batch[1].num_row_logits = count;
      runner.forward(batch, logits, sink);
    }
    return compare("chunks of 16 batched with another sequence", rows);
  }

  // Decode steps recorded and replayed (CUDA graphs; batches padded to the
  // backend's bucket) vs issued one kernel at a time: three sequences decode
  // together for kDecodeSteps steps (first sight, recording, replays), then
  // two of them (a smaller bucket); every logit and every byte of the whole
  // cache must be equal, so padded rows wrote nothing anywhere.
  ::testing::AssertionResult recordedMatchesEager() {
    SequenceRun eager = batchedDecode(false);
    SequenceRun recorded = batchedDecode(true);
    return sameRun("decode steps recorded and replayed", eager, recorded);
  }

  // forwardArgmax (the argmax taken where the logits are) gives every
  // sequence the argmax of the logits forward() returns, for a batched
  // prefill and the decode steps after it.
  ::testing::AssertionResult argmaxMatchesLogits() {
    const std::vector<std::vector<TokenId>> prompts = {prompt(9, 31), prompt(40, 32),
                                                       prompt(3, 33)};
    const std::vector<std::vector<BlockId>> blocks = {{0}, {1, 2, 3}, {4}};
    auto logits_cache = makeCacheOn(backend_, model_, kv_dtype_, 5);
    auto argmax_cache = makeCacheOn(backend_, model_, kv_dtype_, 5);
    engine::ModelRunner with_logits(model_, *logits_cache, backend_, runner_options_);
    engine::ModelRunner with_argmax(model_, *argmax_cache, backend_, runner_options_);
    std::vector<engine::SequenceInput> batch;
    for (size_t s = 0; s < prompts.size(); ++s) batch.push_back({prompts[s], 0, blocks[s]});
    std::vector<float> logits;
    std::vector<TokenId> ids;
    std::vector<TokenId> next(prompts.size());
    for (int64_t step = 0; step <= kDecodeSteps; ++step) {
      with_logits.forward(batch, logits);
      with_argmax.forwardArgmax(batch, ids);
      if (ids.size() != prompts.size()) {
        return ::testing::AssertionFailure() << "forwardArgmax gave " << ids.size() << " ids";
      }
      for (size_t s = 0; s < prompts.size(); ++s) {
        const auto expected = static_cast<TokenId>(
            kernels::argmax(logits.data() + static_cast<int64_t>(s) * vocab(), vocab()));
        if (ids[s] != expected) {
          return ::testing::AssertionFailure()
                 << "step " << step << " sequence " << s << ": forwardArgmax gave " << ids[s]
                 << ", the argmax of forward's logits is " << expected;
        }
        next[s] = expected;
      }
      for (size_t s = 0; s < prompts.size(); ++s) {
        batch[s] = {{&next[s], 1}, static_cast<int64_t>(prompts[s].size()) + step, blocks[s]};
      }
    }
    return ::testing::AssertionSuccess();
  }

  // A prompt longer than one attention split (256 positions, docs/cuda.md):
  // prefilled one shot, in chunks of 100 (the third straddles the split
  // boundary) and of 128, and one shot in a batch after a short sequence
  // (a mixed batch: rows of one and of two splits in one launch), on
  // scattered blocks, then decoded (every step's row in the second split).
  // The same logits, greedy tokens and KV bytes each time.
  ::testing::AssertionResult longPromptMatchesAcrossSplits() {
    constexpr size_t kLong = 300;
    const std::vector<TokenId> tokens = prompt(kLong, 12);
    const SequenceRun expected = alone(tokens, 0);
    for (int64_t chunk : {100, 128}) {
      auto result = sameRun("a 300-token prefill in chunks of " + std::to_string(chunk), expected,
                            alone(tokens, chunk));
      if (!result) return result;
    }
    const std::vector<TokenId> other = prompt(24, 13);
    const int64_t long_blocks = blocksFor(kLong);
    auto cache = makeCacheOn(backend_, model_, kv_dtype_, long_blocks + 2);
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    // The long sequence on the blocks after the short one's, last first.
    std::vector<BlockId> blocks = iota(long_blocks, 2);
    std::reverse(blocks.begin(), blocks.end());
    const std::vector<BlockId> other_blocks = {1, 0};
    std::vector<engine::SequenceInput> batch = {{other, 0, other_blocks}, {tokens, 0, blocks}};
    std::vector<float> logits;
    runner.forward(batch, logits);
    SequenceRun batched;
    batched.logits.push_back(row(logits, 1));
    decodeAlone(runner, static_cast<int64_t>(kLong), blocks, batched);
    batched.kv = readKvBytes(backend_, *cache, blocks);
    return sameRun("a 300-token prefill batched after a short one", expected, batched);
  }

  // Prefix hit: another request computed the 3 shared prefix blocks; A reuses
  // them and computes only its own suffix. Miss: A computes everything.
  ::testing::AssertionResult prefixHitMatchesMiss() {
    const std::vector<TokenId> prefix = prompt(48, 7);
    std::vector<TokenId> a = prefix, other = prefix;
    const std::vector<TokenId> a_suffix = prompt(21, 8), other_suffix = prompt(9, 9);
    a.insert(a.end(), a_suffix.begin(), a_suffix.end());
    other.insert(other.end(), other_suffix.begin(), other_suffix.end());
    const SequenceRun miss = alone(a, 0);

    auto cache = makeCacheOn(backend_, model_, kv_dtype_, 12);
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    const std::vector<BlockId> other_blocks = {5, 6, 7, 8};
    const std::vector<BlockId> a_blocks = {5, 6, 7, 1, 2};  // the prefix blocks are shared
    std::vector<float> logits;
    engine::SequenceInput other_input{other, 0, other_blocks};
    runner.forward({&other_input, 1}, logits);
    const auto cached = static_cast<int64_t>(prefix.size());
    engine::SequenceInput a_input{std::span<const TokenId>(a).subspan(cached), cached, a_blocks};
    runner.forward({&a_input, 1}, logits);
    SequenceRun hit;
    hit.logits.push_back(logits);
    decodeAlone(runner, static_cast<int64_t>(a.size()), a_blocks, hit);
    hit.kv = readKvBytes(backend_, *cache, a_blocks);
    return sameRun("prefix hit", miss, hit);
  }

 private:
  // Three prompts prefilled one by one, decoded together, then the first two
  // alone; every sequence's logits of every step and the whole cache.
  SequenceRun batchedDecode(bool record) {
    const std::vector<std::vector<TokenId>> prompts = {prompt(17, 21), prompt(33, 22),
                                                       prompt(5, 23)};
    const std::vector<std::vector<BlockId>> blocks = {{2, 0}, {6, 1, 4}, {3}};
    auto cache = makeCacheOn(backend_, model_, kv_dtype_, 8);
    engine::ModelRunner runner(model_, *cache, backend_, runner_options_);
    runner.setRecordDecode(record);
    SequenceRun run;
    std::vector<float> logits;
    std::vector<TokenId> next(prompts.size());
    std::vector<int64_t> length(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      engine::SequenceInput input{prompts[s], 0, blocks[s]};
      runner.forward({&input, 1}, logits);
      next[s] = static_cast<TokenId>(kernels::argmax(logits.data(), vocab()));
      length[s] = static_cast<int64_t>(prompts[s].size());
    }
    for (size_t sequences : {size_t{3}, size_t{2}}) {
      for (int64_t step = 0; step < kDecodeSteps; ++step) {
        std::vector<engine::SequenceInput> batch;
        for (size_t s = 0; s < sequences; ++s) {
          batch.push_back({{&next[s], 1}, length[s]++, blocks[s]});
        }
        runner.forward(batch, logits);
        run.logits.push_back(logits);
        for (size_t s = 0; s < sequences; ++s) {
          next[s] = static_cast<TokenId>(kernels::argmax(logits.data() + s * vocab(), vocab()));
          run.tokens.push_back(next[s]);
        }
      }
    }
    run.kv = readKvBytes(backend_, *cache, iota(8, 0));
    return run;
  }

  static std::vector<BlockId> iota(int64_t count, BlockId first) {
    std::vector<BlockId> blocks(static_cast<size_t>(count));
    std::iota(blocks.begin(), blocks.end(), first);
    return blocks;
  }
  // Blocks for a prompt of `tokens` plus the decode steps.
  static int64_t blocksFor(size_t tokens) {
    return (static_cast<int64_t>(tokens) + kDecodeSteps + 15) / 16;
  }
  std::vector<float> row(const std::vector<float>& logits, int64_t sequence) const {
    return {logits.begin() + sequence * vocab(), logits.begin() + (sequence + 1) * vocab()};
  }
  // Greedy decode from run.logits.back(), appending each step's logits and
  // token; the sequence's cached length is `length`.
  void decodeAlone(engine::ModelRunner& runner, int64_t length, std::span<const BlockId> blocks,
                   SequenceRun& run) {
    std::vector<float> logits = run.logits.back();
    for (int64_t step = 0; step < kDecodeSteps; ++step) {
      const auto next = static_cast<TokenId>(kernels::argmax(logits.data(), vocab()));
      run.tokens.push_back(next);
      engine::SequenceInput input{{&next, 1}, length + step, blocks};
      runner.forward({&input, 1}, logits);
      run.logits.push_back(logits);
    }
  }

  const engine::Model& model_;
  kernels::Backend& backend_;
  DType kv_dtype_;
  engine::ModelRunnerOptions runner_options_;
};

// Greedy tokens of `prompt` on `backend` (one-shot prefill, then `steps`
// decodes), with each step's margin between the best and second-best logit.
struct GreedyRun {
  std::vector<TokenId> tokens;
  std::vector<float> margins;
};

inline GreedyRun greedyOn(kernels::Backend& backend, const engine::Model& model, DType kv_dtype,
                          const std::vector<TokenId>& prompt, int64_t steps) {
  const int64_t vocab = model.config().vocab_size;
  const int64_t blocks = (static_cast<int64_t>(prompt.size()) + steps + 15) / 16;
  auto cache = makeCacheOn(backend, model, kv_dtype, blocks);
  engine::ModelRunner runner(model, *cache, backend);
  std::vector<BlockId> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  GreedyRun run;
  std::vector<float> logits;
  engine::SequenceInput input{prompt, 0, table};
  runner.forward({&input, 1}, logits);
  for (int64_t step = 0; step < steps; ++step) {
    const auto next = static_cast<TokenId>(kernels::argmax(logits.data(), vocab));
    float second = -1e30f;
    for (int64_t i = 0; i < vocab; ++i) {
      if (i != next) second = std::max(second, logits[static_cast<size_t>(i)]);
    }
    run.tokens.push_back(next);
    run.margins.push_back(logits[static_cast<size_t>(next)] - second);
    engine::SequenceInput decode{
        {&run.tokens.back(), 1}, static_cast<int64_t>(prompt.size()) + step, table};
    runner.forward({&decode, 1}, logits);
  }
  return run;
}

}  // namespace tandem::testing
