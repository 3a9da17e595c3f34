// The backend registry (--device parsing, what this build can create) and the
// CPU backend against the free kernels of kernels.h: every kernel on random
// inputs must give the same bits, since the engine's exactness rests on it.
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels.h"
#include "tests/support/same_bits.h"

namespace tandem::kernels {
namespace {

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

using ::tandem::testing::sameBits;

std::string errorOf(const std::string& flag) {
  try {
    resolveDevice(flag);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, NamesDeviceKinds) {
  EXPECT_STREQ(deviceKindName(DeviceKind::kCpu), "cpu");
  EXPECT_STREQ(deviceKindName(DeviceKind::kCuda), "cuda");
}

TEST(Registry, ResolvesCpuAndAuto) {
  EXPECT_EQ(resolveDevice("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(resolveDevice("auto"), cudaDeviceCount() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu);
}

TEST(Registry, RefusesUnknownDevice) {
  EXPECT_EQ(errorOf("gpu"), "--device: expected cpu, cuda or auto, got 'gpu'");
  EXPECT_EQ(errorOf(""), "--device: expected cpu, cuda or auto, got ''");
  EXPECT_EQ(errorOf("CPU"), "--device: expected cpu, cuda or auto, got 'CPU'");
}

TEST(Registry, CudaNeedsTheBackendAndADevice) {
  if (!cudaBuilt()) {
    EXPECT_EQ(cudaDeviceCount(), 0);
    EXPECT_EQ(errorOf("cuda"),
              "--device cuda: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
    EXPECT_THROW(makeBackend(DeviceKind::kCuda), Error);
  } else if (cudaDeviceCount() == 0) {
    EXPECT_EQ(errorOf("cuda"), "--device cuda: no CUDA device is visible");
  } else {
    EXPECT_EQ(resolveDevice("cuda"), DeviceKind::kCuda);
  }
}

TEST(Registry, MakesTheCpuBackend) {
  std::unique_ptr<Backend> backend = makeBackend(DeviceKind::kCpu);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->kind(), DeviceKind::kCpu);
  EXPECT_TRUE(backend->hostAccessible());
  const std::string threads = numThreads() == 1 ? " thread" : " threads";
  EXPECT_EQ(backend->description(),
            "cpu " + isaName() + ", " + std::to_string(numThreads()) + threads);
}

// --cuda-kernels: auto (the default: flash on CUDA, none on the CPU),
// reference, fast or flash; fast and flash are refused by name for the CPU
// backend, which runs no CUDA kernels.
TEST(Registry, CudaKernelsFlagAndFastRefusedOnTheCpu) {
  EXPECT_EQ(resolveCudaKernels("auto", "--cuda-kernels", DeviceKind::kCuda), CudaKernels::kFlash);
  EXPECT_EQ(resolveCudaKernels("auto", "--cuda-kernels", DeviceKind::kCpu),
            CudaKernels::kReference);
  EXPECT_EQ(resolveCudaKernels("reference", "--cuda-kernels", DeviceKind::kCuda),
            CudaKernels::kReference);
  EXPECT_EQ(resolveCudaKernels("fast", "--cuda-kernels", DeviceKind::kCpu), CudaKernels::kFast);
  EXPECT_EQ(resolveCudaKernels("flash", "--cuda-kernels", DeviceKind::kCuda), CudaKernels::kFlash);
  for (const char* text : {"faster", "Auto"}) {
    try {
      resolveCudaKernels(text, "--cuda-kernels", DeviceKind::kCuda);
      FAIL() << "expected an error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--cuda-kernels: expected auto, reference, "
                                                   "fast or flash, got '") +
                                           text + "'");
    }
  }
  for (const auto& [set, name] :
       {std::pair{CudaKernels::kFast, "fast"}, std::pair{CudaKernels::kFlash, "flash"}}) {
    try {
      makeBackend(DeviceKind::kCpu, {.cuda_kernels = set});
      FAIL() << "expected an error for " << name;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--cuda-kernels ") + name +
                    ": the cpu backend runs no CUDA kernels (use it with --device cuda, or leave "
                    "--cuda-kernels at auto)");
    }
  }
  EXPECT_EQ(makeBackend(DeviceKind::kCpu, {.cuda_kernels = CudaKernels::kReference})->kind(),
            DeviceKind::kCpu);
  // The unordered decode matmuls replace a fast CUDA kernel: refused
  // anywhere else, before any device is asked for.
  for (auto [kind, set] : {std::pair{DeviceKind::kCpu, CudaKernels::kReference},
                           std::pair{DeviceKind::kCuda, CudaKernels::kReference}}) {
    try {
      makeBackend(kind, {.cuda_kernels = set, .unordered_decode = true});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "--unordered-decode: only with --device cuda and the fast kernels (it replaces "
                "the fast decode matmul)");
    }
  }
}

// The agent's --compute-dtype: auto is bf16 where the CUDA backend runs its
// tensor-core kernels, f32 on the CPU and with the reference kernels (which
// multiply in f32); f32 and bf16 as written; anything else refused by name.
TEST(Registry, ComputeDTypeAutoIsBf16OnCudaOnly) {
  EXPECT_EQ(resolveComputeDType("auto", "--compute-dtype", DeviceKind::kCuda, CudaKernels::kFlash),
            DType::kBF16);
  EXPECT_EQ(resolveComputeDType("auto", "--compute-dtype", DeviceKind::kCuda, CudaKernels::kFast),
            DType::kBF16);
  EXPECT_EQ(
      resolveComputeDType("auto", "--compute-dtype", DeviceKind::kCuda, CudaKernels::kReference),
      DType::kF32);
  EXPECT_EQ(
      resolveComputeDType("auto", "--compute-dtype", DeviceKind::kCpu, CudaKernels::kReference),
      DType::kF32);
  EXPECT_EQ(resolveComputeDType("f32", "--compute-dtype", DeviceKind::kCuda, CudaKernels::kFlash),
            DType::kF32);
  EXPECT_EQ(
      resolveComputeDType("bf16", "--compute-dtype", DeviceKind::kCpu, CudaKernels::kReference),
      DType::kBF16);
  try {
    resolveComputeDType("f16", "--compute-dtype", DeviceKind::kCuda, CudaKernels::kFlash);
    FAIL() << "expected an error for f16";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--compute-dtype: expected auto, f32 or bf16, got 'f16'");
  }
}

TEST(Registry, FuseProjectionsAutoIsOnOnCudaOnly) {
  EXPECT_TRUE(resolveFuseProjections("auto", "--fuse-projections", DeviceKind::kCuda));
  EXPECT_FALSE(resolveFuseProjections("auto", "--fuse-projections", DeviceKind::kCpu));
  EXPECT_TRUE(resolveFuseProjections("true", "--fuse-projections", DeviceKind::kCpu));
  EXPECT_FALSE(resolveFuseProjections("false", "--fuse-projections", DeviceKind::kCuda));
  try {
    resolveFuseProjections("yes", "--fuse-projections", DeviceKind::kCuda);
    FAIL() << "expected an error for yes";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--fuse-projections: expected auto, true or false, got 'yes'");
  }
}

// bf16 compute is the weights' layout: once asked for, the CPU backend hands
// matmul a packed copy of each bf16 weight (one per host matrix, kept), and
// the view itself for other dtypes or with the default f32 compute. Other
// compute dtypes are refused by name.
TEST(CpuBackend, Bf16ComputePacksBf16WeightsOnce) {
  std::vector<uint16_t> bf16(32 * 8);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32ToBf16(static_cast<float>(i % 7) - 3.0f);
  std::vector<float> f32(32 * 8, 0.5f);
  const WeightView bf16_view{bf16.data(), DType::kBF16, 32, 8};
  const WeightView f32_view{f32.data(), DType::kF32, 32, 8};

  cpu::CpuBackend exact;
  EXPECT_EQ(exact.matmulWeight(bf16_view).data, bf16.data());
  EXPECT_EQ(exact.matmulWeight(bf16_view).layout, WeightLayout::kRows);

  cpu::CpuBackend backend;
  backend.setComputeDType(DType::kBF16);
  EXPECT_NE(backend.description().find(", bf16 compute"), std::string::npos);
  const WeightView packed = backend.matmulWeight(bf16_view);
  EXPECT_EQ(packed.layout, WeightLayout::kBf16Pairs);
  EXPECT_NE(packed.data, bf16.data());
  EXPECT_EQ(backend.matmulWeight(bf16_view).data, packed.data) << "one copy per host matrix";
  EXPECT_EQ(backend.matmulWeight(f32_view).data, f32.data());
  EXPECT_EQ(backend.matmulWeight(f32_view).layout, WeightLayout::kRows);
  // The packed weights give the reference of bf16-rounded activations.
  std::vector<float> x(3 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.3f * static_cast<float>(i) - 2.0f;
  std::vector<float> y(3 * 32);
  backend.matmul(x.data(), 3, 8, packed, y.data());
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 32; ++j) {
      double expected = 0.0;
      for (int64_t c = 0; c < 8; ++c) {
        expected += double{bf16ToF32(f32ToBf16(x[i * 8 + c]))} * bf16ToF32(bf16[j * 8 + c]);
      }
      EXPECT_NEAR(y[i * 32 + j], expected, 1e-5) << i << "," << j;
    }
  }

  try {
    backend.setComputeDType(DType::kF16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "compute dtype f16 is not supported by cpu (accepted: f32, bf16)");
  }
}

TEST(CpuBackend, AllocatesZeroFilledAlignedMemory) {
  cpu::CpuBackend backend;
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    auto* data = static_cast<uint8_t*>(backend.allocate(bytes));
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 256, 0u);
    std::vector<uint8_t> zeros(bytes, 0);
    EXPECT_TRUE(sameBits(data, zeros.data(), bytes));
    backend.release(data, bytes);
  }
}

TEST(CpuBackend, CopiesAndResidentDataAreTheHostData) {
  cpu::CpuBackend backend;
  const std::vector<float> host = randomFloats(100, 1);
  auto* device = static_cast<float*>(backend.allocate(host.size() * sizeof(float)));
  auto* other = static_cast<float*>(backend.allocate(host.size() * sizeof(float)));
  backend.copyFromHost(device, host.data(), host.size() * sizeof(float));
  backend.copy(other, device, host.size() * sizeof(float));
  std::vector<float> back(host.size());
  backend.copyToHost(back.data(), other, back.size() * sizeof(float));
  backend.synchronize();
  EXPECT_TRUE(sameBits(back.data(), host.data(), host.size() * sizeof(float)));
  backend.release(device, host.size() * sizeof(float));
  backend.release(other, host.size() * sizeof(float));

  WeightView view{host.data(), DType::kF32, 10, 10};
  WeightView resident = backend.residentWeight(view);
  EXPECT_EQ(resident.data, view.data);
  EXPECT_EQ(resident.rows, 10);
  EXPECT_EQ(backend.residentFloats(host.data(), host.size()), host.data());
}

// A batch of three sequences over a small paged cache, with its host arrays.
struct TestBatch {
  static constexpr int64_t kHeads = 4;
  static constexpr int64_t kKvHeads = 2;
  static constexpr int64_t kHeadDim = 16;

  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> sequences;

  TestBatch() {
    // (first position, new rows, blocks): a prefill chunk, a decode, a
    // continued chunk; blocks of 4 tokens, none shared.
    const int64_t shape[3][2] = {{0, 5}, {7, 1}, {3, 4}};
    int32_t next_block = 0;
    for (const auto& [first, rows] : shape) {
      AttentionSequence s;
      s.first_row = static_cast<int64_t>(token_ids.size());
      s.num_rows = rows;
      s.first_position = first;
      const int64_t blocks = (first + rows + 3) / 4;
      std::vector<int32_t> table;
      for (int64_t b = 0; b < blocks; ++b) table.push_back(next_block++);
      tables.push_back(table);
      s.num_blocks = static_cast<int32_t>(blocks);
      sequences.push_back(s);
      for (int64_t r = 0; r < rows; ++r) {
        token_ids.push_back(static_cast<int32_t>((s.first_row + r) * 7 % 50));
        positions.push_back(static_cast<int32_t>(first + r));
      }
    }
    for (size_t s = 0; s < sequences.size(); ++s) sequences[s].block_table = tables[s].data();
  }
  int64_t rows() const { return static_cast<int64_t>(token_ids.size()); }
  BatchLayout layout() const {
    return {token_ids.data(), positions.data(), rows(), sequences.data(),
            static_cast<int64_t>(sequences.size())};
  }
};

class CpuBackendKernels : public ::testing::TestWithParam<DType> {
 protected:
  // Weights of the parameter's dtype holding `values` (rounded for bf16).
  WeightView weights(std::vector<uint8_t>& storage, int64_t rows, int64_t cols, uint32_t seed) {
    const std::vector<float> values = randomFloats(static_cast<size_t>(rows * cols), seed);
    storage.resize(values.size() * dtypeSize(GetParam()));
    convertFromF32(GetParam(), values.data(), storage.data(), values.size());
    return {storage.data(), GetParam(), rows, cols};
  }

  cpu::CpuBackend backend_;
  TestBatch batch_;
};

// argmaxRows: the smallest index of each row's maximum; NaN never wins; a
// row with nothing above -inf gives 0.
TEST(CpuBackend, ArgmaxRowsKeepsTheScalarArgmaxRules) {
  kernels::cpu::CpuBackend backend;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> rows = {
      1.0f, 3.0f,  3.0f, -2.0f,  // tie: index 1
      nan,  -5.0f, nan,  -4.0f,  // NaN never wins: index 3
      -inf, -inf,  -inf, -inf,   // nothing beats -inf: 0
      -inf, nan,   -inf, inf,    // +inf wins: index 3
  };
  std::vector<int32_t> ids(4, -7);
  backend.argmaxRows(rows.data(), 4, 4, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 0, 3}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ids[r], kernels::argmax(rows.data() + r * 4, 4)) << r;
}

TEST_P(CpuBackendKernels, EmbeddingAndMatmulMatchFreeKernels) {
  backend_.beginBatch(batch_.layout());
  const int64_t rows = batch_.rows(), hidden = 48, out_dim = 40;
  std::vector<uint8_t> table_bytes, weight_bytes;
  const WeightView table = weights(table_bytes, 50, hidden, 2);
  const WeightView w = weights(weight_bytes, out_dim, hidden, 3);

  std::vector<float> expected(rows * hidden), actual(rows * hidden, 7.0f);
  embedding(table, batch_.token_ids.data(), rows, expected.data());
  backend_.embedding(table, actual.data());
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), actual.size() * sizeof(float)));

  const std::vector<float> x = randomFloats(rows * hidden, 4);
  std::vector<float> y_expected(rows * out_dim), y_actual(rows * out_dim);
  matmul(x.data(), rows, hidden, w, y_expected.data());
  backend_.matmul(x.data(), rows, hidden, w, y_actual.data());
  EXPECT_TRUE(sameBits(y_actual.data(), y_expected.data(), y_actual.size() * sizeof(float)));
}

TEST_P(CpuBackendKernels, ElementwiseKernelsMatchFreeKernels) {
  backend_.beginBatch(batch_.layout());
  const int64_t rows = batch_.rows(), width = TestBatch::kHeads * TestBatch::kHeadDim;
  const std::vector<float> x = randomFloats(rows * width, 5);
  const std::vector<float> other = randomFloats(rows * width, 6);
  const std::vector<float> norm_weight = randomFloats(width, 7);
  const std::vector<float> bias = randomFloats(width, 8);
  const std::vector<float> inv_freq = randomFloats(TestBatch::kHeadDim / 2, 9);
  const size_t bytes = x.size() * sizeof(float);

  std::vector<float> expected(x.size()), actual(x.size());
  rmsNorm(x.data(), norm_weight.data(), rows, width, 1e-6f, expected.data());
  backend_.rmsNorm(x.data(), norm_weight.data(), rows, width, 1e-6f, actual.data());
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), bytes)) << "rmsNorm";

  expected = x;
  actual = x;
  for (int64_t r = 0; r < rows; ++r) addInPlace(expected.data() + r * width, bias.data(), width);
  backend_.addBias(actual.data(), bias.data(), rows, width);
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), bytes)) << "addBias";

  expected = x;
  actual = x;
  applyRope(expected.data(), rows, TestBatch::kHeads, TestBatch::kHeadDim, batch_.positions.data(),
            inv_freq.data());
  backend_.applyRope(actual.data(), TestBatch::kHeads, TestBatch::kHeadDim, inv_freq.data());
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), bytes)) << "applyRope";

  siluMul(x.data(), other.data(), expected.data(), rows * width);
  backend_.siluMul(x.data(), other.data(), actual.data(), rows * width);
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), bytes)) << "siluMul";

  expected = x;
  actual = x;
  addInPlace(expected.data(), other.data(), rows * width);
  backend_.addInPlace(actual.data(), other.data(), rows * width);
  EXPECT_TRUE(sameBits(actual.data(), expected.data(), bytes)) << "addInPlace";

  std::vector<float> last_expected(batch_.sequences.size() * width);
  for (size_t s = 0; s < batch_.sequences.size(); ++s) {
    const AttentionSequence& seq = batch_.sequences[s];
    std::memcpy(last_expected.data() + s * width,
                x.data() + (seq.first_row + seq.num_rows - 1) * width, width * sizeof(float));
  }
  std::vector<float> last_actual(last_expected.size());
  backend_.gatherLastRows(x.data(), width, last_actual.data());
  EXPECT_TRUE(
      sameBits(last_actual.data(), last_expected.data(), last_actual.size() * sizeof(float)))
      << "gatherLastRows";
}

TEST_P(CpuBackendKernels, KvWriteAttentionAndBlockCopiesMatchFreeKernels) {
  const int64_t rows = batch_.rows();
  const int64_t q_width = TestBatch::kHeads * TestBatch::kHeadDim;
  const int64_t kv_width = TestBatch::kKvHeads * TestBatch::kHeadDim;
  KvCacheLayout layout;
  layout.dtype = GetParam() == DType::kF16 ? DType::kBF16 : GetParam();
  layout.num_blocks = 8;
  layout.block_size = 4;
  layout.num_layers = 2;
  layout.num_kv_heads = TestBatch::kKvHeads;
  layout.head_dim = TestBatch::kHeadDim;
  const auto slab_bytes = static_cast<size_t>(layout.blockBytes() * layout.num_blocks);
  KvCacheLayout expected_cache = layout, actual_cache = layout;
  expected_cache.base = backend_.allocate(slab_bytes);
  actual_cache.base = backend_.allocate(slab_bytes);

  const std::vector<float> q = randomFloats(rows * q_width, 10);
  const auto num_sequences = static_cast<int64_t>(batch_.sequences.size());
  std::vector<float> expected(rows * q_width), actual(rows * q_width);
  // The caller's arrays are gone after beginBatch: the backend keeps copies.
  {
    TestBatch scratch;
    backend_.beginBatch(scratch.layout());
    scratch.token_ids.assign(scratch.token_ids.size(), -1);
    for (auto& table : scratch.tables) table.assign(table.size(), -1);
  }
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    const std::vector<float> k = randomFloats(rows * kv_width, 11 + layer);
    const std::vector<float> v = randomFloats(rows * kv_width, 21 + layer);
    writeKv(expected_cache, layer, k.data(), v.data(), batch_.sequences.data(), num_sequences);
    backend_.writeKv(actual_cache, layer, k.data(), v.data());
    pagedAttention(expected_cache, layer, q.data(), TestBatch::kHeads, 0.25f,
                   batch_.sequences.data(), num_sequences, expected.data());
    backend_.pagedAttention(actual_cache, layer, q.data(), TestBatch::kHeads, 0.25f, actual.data());
    EXPECT_TRUE(sameBits(actual.data(), expected.data(), actual.size() * sizeof(float)))
        << "pagedAttention, layer " << layer;
  }
  EXPECT_TRUE(sameBits(actual_cache.base, expected_cache.base, slab_bytes)) << "writeKv";

  // Blocks out to the host and back in another order.
  const std::vector<int32_t> blocks = {5, 0, 3};
  const auto block_bytes = static_cast<size_t>(layout.blockBytes());
  std::vector<uint8_t> staged(blocks.size() * block_bytes);
  backend_.readBlocks(actual_cache, blocks.data(), 3, staged.data());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(sameBits(staged.data() + i * block_bytes,
                         static_cast<uint8_t*>(expected_cache.base) + blocks[i] * block_bytes,
                         block_bytes));
  }
  const std::vector<int32_t> targets = {7, 6, 1};
  backend_.writeBlocks(actual_cache, targets.data(), 3, staged.data());
  for (size_t i = 0; i < targets.size(); ++i) {
    EXPECT_TRUE(sameBits(static_cast<uint8_t*>(actual_cache.base) + targets[i] * block_bytes,
                         staged.data() + i * block_bytes, block_bytes));
  }
  backend_.release(expected_cache.base, slab_bytes);
  backend_.release(actual_cache.base, slab_bytes);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuBackendKernels,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtypeShortName(info.param)); });

// A packed copy (bf16 compute) lives while a use of it is held: a second
// use shares it, releasing one keeps it, releasing the last frees it, and
// then the same host address holding other weights (a later model mapped
// there) is packed afresh instead of meeting the stale copy.
TEST(CpuBackendWeights, PackedCopyLivesUntilItsLastUseIsReleased) {
  cpu::CpuBackend backend;
  backend.setComputeDType(DType::kBF16);
  constexpr int64_t kRows = 16, kCols = 32;
  std::vector<uint16_t> host(kRows * kCols);
  auto fill = [&](float value) {
    for (uint16_t& w : host) w = f32ToBf16(value);
  };
  const WeightView view{host.data(), DType::kBF16, kRows, kCols, WeightLayout::kRows};
  const std::vector<float> x(kCols, 1.0f);
  auto product = [&](const WeightView& w) {
    std::vector<float> y(kRows);
    backend.matmul(x.data(), 1, kCols, w, y.data());
    return y[0];
  };

  fill(1.0f);
  const WeightView first = backend.matmulWeight(view);
  ASSERT_NE(first.data, view.data) << "bf16 compute packs a copy";
  const WeightView second = backend.matmulWeight(view);
  EXPECT_EQ(second.data, first.data) << "one copy per host matrix";
  EXPECT_EQ(product(second), 32.0f);
  backend.releaseWeight(view);
  EXPECT_EQ(backend.matmulWeight(view).data, first.data) << "one use still held";
  backend.releaseWeight(view);
  backend.releaseWeight(view);

  // Other weights at the same address: packed again, not the stale copy.
  fill(2.0f);
  EXPECT_EQ(product(backend.matmulWeight(view)), 64.0f);
  backend.releaseWeight(view);
  backend.releaseWeight(view);  // more releases than uses: nothing held, nothing happens
}

}  // namespace
}  // namespace tandem::kernels
