// The CUDA backend against the CPU kernels of kernels.h on the same random
// inputs (to rounding), and its batch invariance (to the bit): a row's matmul,
// rmsNorm and attention result is the same for m = 1, 7 and 64, and chunked
// prefill gives the same attention output as one-shot prefill. The fast
// kernels (--cuda-kernels fast): the decode GEMV and the grouped attention
// kernel give the reference kernels' bits, and the bf16 tensor-core GEMM
// gives a row the same bits whatever the batch, close to the fp32 result.
// The flash attention kernel (--cuda-kernels flash): close to the
// reference, the same bits chunked or not. Every test skips when no CUDA device is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"
#if defined(TANDEM_CUDA_EMULATOR)
#include "tests/cuda_emu/emulator.h"
#endif

namespace tandem::kernels {
namespace {

// Built for the CUDA emulator (tests/cuda_emu/, docs/cuda.md#the-emulator),
// where every CUDA thread is a fiber on one CPU core, the two attention
// tests that take longest leave out the shapes whose GQA group and head
// dimension their other shapes already cover.
#if defined(TANDEM_CUDA_EMULATOR)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// The GEMM row tests' shapes: the emulator's also on a GPU where
// TANDEM_GPU_TEST_SMALL_SHAPES=1, as gpu-check.sh sets it under
// compute-sanitizer's racecheck and synccheck (SANITIZE=1), which run
// kernels far slower: their shapes still end in partial tiles and K steps
// and reuse every stage of the pipelines.
bool smallShapes() {
  static const bool small = [] {
    const char* value = std::getenv("TANDEM_GPU_TEST_SMALL_SHAPES");
    return kEmulated || (value != nullptr && std::string_view(value) == "1");
  }();
  return small;
}

// What the emulated device ran during `work` (emulator.h DeviceCounts):
// kernel grids and their dynamic shared memory, summed; -1 each on a GPU,
// which does not count them.
struct RunCounts {
  int64_t kernels = -1;
  int64_t dynamic_shared_bytes = -1;
  int64_t matrix_loads = -1;           // 8 x 8 matrices read by ldmatrix
  int64_t matrix_load_conflicts = -1;  // their bank conflicts' extra wavefronts
};
template <typename Work>
RunCounts countsOf(Work&& work) {
#if defined(TANDEM_CUDA_EMULATOR)
  const cuda_emu::DeviceCounts before = cuda_emu::deviceCounts();
  work();
  const cuda_emu::DeviceCounts after = cuda_emu::deviceCounts();
  return {after.kernels - before.kernels, after.dynamic_shared_bytes - before.dynamic_shared_bytes,
          after.matrix_loads - before.matrix_loads,
          after.matrix_load_conflicts - before.matrix_load_conflicts};
#else
  work();
  return {};
#endif
}

// The kernels `work` runs, where the emulator counts them; -1 on a GPU.
template <typename Work>
int64_t kernelsRunBy(Work&& work) {
  return countsOf(std::forward<Work>(work)).kernels;
}

// The dynamic shared memory of the grids `work` runs, summed, where the
// emulator counts it; -1 on a GPU.
template <typename Work>
int64_t dynamicSharedBytesOf(Work&& work) {
  return countsOf(std::forward<Work>(work)).dynamic_shared_bytes;
}

std::vector<float> randomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> toHalfBits(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = dtype == DType::kBF16 ? f32ToBf16(v[i]) : f32ToF16(v[i]);
  return out;
}

void expectNear(const std::vector<float>& expected, const std::vector<float>& actual,
                float tolerance) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(expected[i], actual[i], tolerance * (1.0f + std::fabs(expected[i]))) << "at " << i;
  }
}

// backend.beginBatch of `positions.size()` rows (token ids in `ids`, which
// must outlive the batch's use) of `sequences`.
void beginRowsOn(Backend& backend, std::vector<int32_t>& ids, const std::vector<int32_t>& positions,
                 const std::vector<AttentionSequence>& sequences) {
  ids.assign(positions.size(), 0);
  BatchLayout batch;
  batch.token_ids = ids.data();
  batch.positions = positions.data();
  batch.rows = static_cast<int64_t>(positions.size());
  batch.sequences = sequences.data();
  batch.num_sequences = static_cast<int64_t>(sequences.size());
  backend.beginBatch(batch);
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::deviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible (no driver or no GPU): CUDA kernels not run";
    }
    backend_ = cuda::makeCudaBackend(0);
  }

  void TearDown() override {
    if (backend_ == nullptr) return;
    for (auto& [data, bytes] : allocations_) backend_->release(data, bytes);
  }

  template <typename T>
  T* upload(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    void* data = backend_->allocate(bytes);
    EXPECT_NE(data, nullptr);
    allocations_.push_back({data, bytes});
    backend_->copyFromHost(data, host.data(), bytes);
    return static_cast<T*>(data);
  }

  float* zeros(size_t n) { return upload(std::vector<float>(n, 0.0f)); }

  std::vector<float> download(const float* data, size_t n) {
    std::vector<float> host(n);
    backend_->copyToHost(host.data(), data, n * sizeof(float));
    return host;
  }

  // y = x · w^T on the device for the first m rows of x.
  std::vector<float> deviceMatmul(const std::vector<float>& x, int64_t m, int64_t k,
                                  const WeightView& w) {
    std::vector<float> rows(x.begin(), x.begin() + m * k);
    float* y = zeros(static_cast<size_t>(m * w.rows));
    backend_->matmul(upload(rows), m, k, backend_->residentWeight(w), y);
    return download(y, static_cast<size_t>(m * w.rows));
  }

  void beginRows(const std::vector<int32_t>& positions,
                 const std::vector<AttentionSequence>& sequences) {
    beginRowsOn(*backend_, ids_, positions, sequences);
  }

  std::unique_ptr<Backend> backend_;
  std::vector<std::pair<void*, size_t>> allocations_;
  std::vector<int32_t> ids_;
};

// m <= 64 runs the warp-per-column kernel (in groups of 8 rows), larger m
// the tiled one; k = 100 and 333 take the scalar loads, 1024 the 16-byte
// ones.
TEST_F(CudaKernelsTest, MatmulMatchesCpuForEveryWeightType) {
  const int64_t n = 70;
  // Every weight stays alive to the end: resident copies are cached by host
  // address, and a freed buffer's address may come back.
  std::list<std::vector<float>> keep_f32;
  std::list<std::vector<uint16_t>> keep_half;
  for (const auto& [m, k] :
       {std::pair<int64_t, int64_t>{7, 100}, {100, 333}, {1, 1024}, {20, 1024}}) {
    const auto x = randomFloats(m * k, 1);
    const auto& w32 = keep_f32.emplace_back(randomFloats(n * k, 2));
    const auto& bf16 = keep_half.emplace_back(toHalfBits(w32, DType::kBF16));
    const auto& f16 = keep_half.emplace_back(toHalfBits(w32, DType::kF16));
    const WeightView weights[] = {{w32.data(), DType::kF32, n, k},
                                  {bf16.data(), DType::kBF16, n, k},
                                  {f16.data(), DType::kF16, n, k}};
    for (const WeightView& w : weights) {
      SCOPED_TRACE("m " + std::to_string(m) + " k " + std::to_string(k) + " " +
                   dtypeShortName(w.dtype));
      std::vector<float> expected(m * n);
      matmul(x.data(), m, k, w, expected.data());
      expectNear(expected, deviceMatmul(x, m, k, w), 1e-4f * static_cast<float>(k) / 100.0f);
    }
  }
}

// One order per k: the tiled kernel (m = 100) and the warp-per-column one
// (m = 64, 7, 1) give every row the same bits, with scalar (k = 333) and 16-byte
// (k = 1024, several 128-wide chunks) weight loads, for every weight type.
TEST_F(CudaKernelsTest, MatmulRowIsBitwiseEqualForAnyRowCount) {
  const int64_t n = 130;
  for (int64_t k : {int64_t{333}, int64_t{1024}}) {
    const auto x = randomFloats(100 * k, 3);
    const auto w32 = randomFloats(n * k, 4);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const auto f16 = toHalfBits(w32, DType::kF16);
    const WeightView weights[] = {{w32.data(), DType::kF32, n, k},
                                  {bf16.data(), DType::kBF16, n, k},
                                  {f16.data(), DType::kF16, n, k}};
    for (const WeightView& w : weights) {
      SCOPED_TRACE("k " + std::to_string(k) + " " + dtypeShortName(w.dtype));
      const auto all = deviceMatmul(x, 100, k, w);
      const auto sixty_four = deviceMatmul(x, 64, k, w);
      EXPECT_EQ(0, std::memcmp(all.data(), sixty_four.data(), sixty_four.size() * sizeof(float)));
      const auto seven = deviceMatmul(x, 7, k, w);
      const auto one = deviceMatmul(x, 1, k, w);
      EXPECT_EQ(0, std::memcmp(all.data(), seven.data(), seven.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(all.data(), one.data(), one.size() * sizeof(float)));
      // Row 40 alone, at the top of its tile, equals row 40 in the middle of one.
      const std::vector<float> row40(x.begin() + 40 * k, x.begin() + 41 * k);
      const auto alone = deviceMatmul(row40, 1, k, w);
      EXPECT_EQ(0, std::memcmp(all.data() + 40 * n, alone.data(), n * sizeof(float)));
    }
  }
}

// The device argmax equals the CPU's on random rows (vocabulary-sized and
// small) and on ties, NaN, all -inf and +inf.
TEST_F(CudaKernelsTest, ArgmaxRowsEqualsTheCpuArgmax) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t width : {int64_t{5}, int64_t{1000}, int64_t{128256}}) {
    const int64_t rows = 6;
    std::vector<float> x = randomFloats(rows * width, 11);
    x[1 * width + width - 1] = x[1 * width + 0] = 50.0f;  // tie: first wins
    for (int64_t i = 0; i < width; ++i) x[2 * width + i] = -inf;
    x[3 * width + width / 2] = nan;
    x[4 * width + width - 1] = inf;
    for (int64_t i = 0; i < width; i += 2) x[5 * width + i] = nan;
    std::vector<int32_t> expected(rows), actual(rows, -1);
    for (int64_t r = 0; r < rows; ++r) {
      expected[r] = static_cast<int32_t>(argmax(x.data() + r * width, width));
    }
    backend_->argmaxRows(upload(x), rows, width, actual.data());
    EXPECT_EQ(actual, expected) << "width " << width;
  }
}

TEST_F(CudaKernelsTest, RmsNormMatchesCpuAndIsRowInvariant) {
  const int64_t dim = 1000;
  const auto x = randomFloats(64 * dim, 5);
  const auto weight = randomFloats(dim, 6);
  std::vector<float> expected(x.size());
  rmsNorm(x.data(), weight.data(), 64, dim, 1e-5f, expected.data());
  const float* w = upload(weight);
  std::vector<std::vector<float>> results;
  for (int64_t rows : {64, 7, 1}) {
    float* y = zeros(rows * dim);
    backend_->rmsNorm(upload(x), w, rows, dim, 1e-5f, y);
    results.push_back(download(y, rows * dim));
  }
  expectNear(expected, results[0], 1e-5f);
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), 7 * dim * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[2].data(), dim * sizeof(float)));
}

TEST_F(CudaKernelsTest, ElementwiseKernelsMatchCpu) {
  const int64_t rows = 5, width = 300, n = rows * width;
  const auto a = randomFloats(n, 7, 4.0f);
  const auto b = randomFloats(n, 8);
  const auto bias = randomFloats(width, 9);

  std::vector<float> silu(n);
  siluMul(a.data(), b.data(), silu.data(), n);
  float* out = zeros(n);
  backend_->siluMul(upload(a), upload(b), out, n);
  expectNear(silu, download(out, n), 1e-6f);

  std::vector<float> sum = a;
  addInPlace(sum.data(), b.data(), n);
  float* y = upload(a);
  backend_->addInPlace(y, upload(b), n);
  EXPECT_EQ(sum, download(y, n));

  std::vector<float> biased = a;
  for (int64_t i = 0; i < n; ++i) biased[i] += bias[i % width];
  float* z = upload(a);
  backend_->addBias(z, upload(bias), rows, width);
  EXPECT_EQ(biased, download(z, n));
}

TEST_F(CudaKernelsTest, EmbeddingRopeAndGatherMatchCpu) {
  const int64_t vocab = 50, num_heads = 4, head_dim = 64, width = num_heads * head_dim;
  const auto table32 = randomFloats(vocab * width, 10);
  const auto table16 = toHalfBits(table32, DType::kBF16);
  const WeightView table{table16.data(), DType::kBF16, vocab, width};
  std::vector<int32_t> ids = {3, 49, 0, 7, 7};
  std::vector<int32_t> positions = {0, 1, 2, 1000, 123456};
  std::vector<float> inv_freq(head_dim / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = 1.0f / std::pow(500000.0f, 2.0f * i / head_dim);
  }
  std::vector<int32_t> blocks = {0};
  std::vector<AttentionSequence> sequences = {{blocks.data(), 1, 0, 2, 0},
                                              {blocks.data(), 1, 2, 3, 0}};
  const auto rows = static_cast<int64_t>(ids.size());
  BatchLayout batch{ids.data(), positions.data(), rows, sequences.data(), 2};
  backend_->beginBatch(batch);

  std::vector<float> expected(rows * width);
  embedding(table, ids.data(), rows, expected.data());
  float* x = zeros(rows * width);
  backend_->embedding(backend_->residentWeight(table), x);
  EXPECT_EQ(expected, download(x, rows * width));

  applyRope(expected.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data());
  backend_->applyRope(x, num_heads, head_dim,
                      backend_->residentFloats(inv_freq.data(), inv_freq.size()));
  expectNear(expected, download(x, rows * width), 1e-6f);

  float* last = zeros(2 * width);
  backend_->gatherLastRows(x, width, last);
  const auto gathered = download(last, 2 * width);
  const auto all = download(x, rows * width);
  EXPECT_EQ(0, std::memcmp(gathered.data(), all.data() + 1 * width, width * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(gathered.data() + width, all.data() + 4 * width, width * sizeof(float)));
}

// applyRopeWith (CudaBackendOptions::rope_variants, on unless turned off):
// the first rotary_dim values of each head rotate as the CPU's kernel
// rotates them (as halves, or as GLM's neighbour pairs), cos and sin times
// the attention factor; the rest keep their bits.
TEST_F(CudaKernelsTest, RopeVariantsMatchTheCpuAndAreOnUnlessTurnedOff) {
  {
    cuda::CudaBackendOptions off;
    off.rope_variants = false;
    const std::unique_ptr<Backend> plain = cuda::makeCudaBackend(0, off);
    EXPECT_FALSE(plain->appliesRopeVariants());
    EXPECT_THROW(plain->applyRopeWith(nullptr, 1, 16, nullptr, {12, 1.0f}), Error);
  }
  ASSERT_TRUE(backend_->appliesRopeVariants());

  const int64_t num_heads = 3, head_dim = 64, width = num_heads * head_dim;
  std::vector<int32_t> ids;
  const std::vector<int32_t> positions = {0, 1, 2, 1000, 123456};
  const auto rows = static_cast<int64_t>(positions.size());
  beginRowsOn(*backend_, ids, positions, {});
  // Phi-4-mini's three quarters with LongRoPE's factor, YaRN's factor over
  // whole heads, a quarter unscaled, GLM's half as neighbour pairs (and
  // whole heads so, with a factor).
  for (const RopeVariant variant :
       {RopeVariant{48, 1.1902381f}, RopeVariant{0, 1.1386294f}, RopeVariant{16, 1.0f},
        RopeVariant{32, 1.0f, true}, RopeVariant{0, 1.1386294f, true}}) {
    SCOPED_TRACE(std::to_string(variant.rotary_dim) + (variant.interleaved ? " interleaved" : ""));
    const int64_t rotary = variant.rotary_dim > 0 ? variant.rotary_dim : head_dim;
    std::vector<float> inv_freq(static_cast<size_t>(rotary / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * static_cast<float>(i) / rotary);
    }
    const auto input = randomFloats(rows * width, 14);
    std::vector<float> expected = input;
    applyRope(expected.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data(),
              variant);
    float* x = upload(input);
    backend_->applyRopeWith(x, num_heads, head_dim,
                            backend_->residentFloats(inv_freq.data(), inv_freq.size()), variant);
    const auto got = download(x, rows * width);
    expectNear(expected, got, 1e-6f * variant.attention_factor);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const size_t at = static_cast<size_t>(r * width + h * head_dim + rotary);
        EXPECT_EQ(0, std::memcmp(got.data() + at, input.data() + at,
                                 static_cast<size_t>(head_dim - rotary) * sizeof(float)));
      }
    }
  }
}

// One sequence of 300 tokens (two attention splits), GQA 8 heads over 2 kv heads.
class CudaAttentionTest : public CudaKernelsTest {
 protected:
  static constexpr int64_t kTokens = 300, kHeads = 8, kKvHeads = 2, kHeadDim = 64;
  static constexpr int64_t kWidth = kHeads * kHeadDim, kKvWidth = kKvHeads * kHeadDim;

  void SetUp() override {
    CudaKernelsTest::SetUp();
    if (IsSkipped()) return;
    layout_.dtype = DType::kBF16;
    layout_.num_blocks = 40;
    layout_.block_size = 16;
    layout_.num_layers = 2;
    layout_.num_kv_heads = kKvHeads;
    layout_.head_dim = kHeadDim;
    for (int32_t b = 0; b < 19; ++b) table_.push_back(38 - 2 * b);  // scattered blocks
    q_ = randomFloats(kTokens * kWidth, 11);
    k_ = randomFloats(kTokens * kKvWidth, 12);
    v_ = randomFloats(kTokens * kKvWidth, 13);
  }

  // Runs rows [first, first + count) as one chunk on the device cache.
  std::vector<float> deviceChunk(void* cache, int64_t first, int64_t count) {
    KvCacheLayout layout = layout_;
    layout.base = cache;
    std::vector<int32_t> positions(count);
    for (int64_t r = 0; r < count; ++r) positions[r] = static_cast<int32_t>(first + r);
    std::vector<AttentionSequence> seqs = {{table_.data(), 19, 0, count, first}};
    beginRows(positions, seqs);
    auto slice = [&](const std::vector<float>& all, int64_t w) {
      return std::vector<float>(all.begin() + first * w, all.begin() + (first + count) * w);
    };
    backend_->writeKv(layout, 1, upload(slice(k_, kKvWidth)), upload(slice(v_, kKvWidth)));
    float* out = zeros(count * kWidth);
    backend_->pagedAttention(layout, 1, upload(slice(q_, kWidth)), kHeads, 0.125f, out);
    return download(out, count * kWidth);
  }

  KvCacheLayout layout_;
  std::vector<int32_t> table_;
  std::vector<float> q_, k_, v_;
};

TEST_F(CudaAttentionTest, MatchesCpuAndKvBytesAreEqual) {
  std::vector<char> host_cache(layout_.num_blocks * layout_.blockBytes(), 0);
  KvCacheLayout cpu_layout = layout_;
  cpu_layout.base = host_cache.data();
  AttentionSequence seq{table_.data(), 19, 0, kTokens, 0};
  writeKv(cpu_layout, 1, k_.data(), v_.data(), &seq, 1);
  std::vector<float> expected(kTokens * kWidth);
  pagedAttention(cpu_layout, 1, q_.data(), kHeads, 0.125f, &seq, 1, expected.data());

  void* cache = backend_->allocate(host_cache.size());
  allocations_.push_back({cache, host_cache.size()});
  const auto actual = deviceChunk(cache, 0, kTokens);
  expectNear(expected, actual, 1e-4f);

  std::vector<char> device_cache(host_cache.size());
  backend_->copyToHost(device_cache.data(), cache, device_cache.size());
  EXPECT_EQ(host_cache, device_cache);

  // readBlocks returns the blocks' bytes in table order.
  KvCacheLayout layout = layout_;
  layout.base = cache;
  std::vector<char> staged(2 * layout_.blockBytes());
  backend_->readBlocks(layout, table_.data(), 2, staged.data());
  EXPECT_EQ(0, std::memcmp(staged.data(), host_cache.data() + table_[0] * layout_.blockBytes(),
                           layout_.blockBytes()));
}

TEST_F(CudaAttentionTest, ChunkedPrefillAndDecodeEqualOneShotBitwise) {
  const size_t bytes = layout_.num_blocks * layout_.blockBytes();
  void* one_shot_cache = backend_->allocate(bytes);
  void* chunked_cache = backend_->allocate(bytes);
  allocations_.push_back({one_shot_cache, bytes});
  allocations_.push_back({chunked_cache, bytes});
  const auto one_shot = deviceChunk(one_shot_cache, 0, kTokens);
  std::vector<float> chunked;
  for (auto [first, count] :
       {std::pair<int64_t, int64_t>{0, 100}, {100, 157}, {257, 42}, {299, 1}}) {
    const auto part = deviceChunk(chunked_cache, first, count);
    chunked.insert(chunked.end(), part.begin(), part.end());
  }
  ASSERT_EQ(one_shot.size(), chunked.size());
  EXPECT_EQ(0, std::memcmp(one_shot.data(), chunked.data(), one_shot.size() * sizeof(float)));
}

// --- The fast kernels (CudaBackendOptions::fast_kernels) ---

// A backend with the fast kernels beside the fixture's reference one. Each
// backend frees what it allocated.
class CudaFastKernelsTest : public CudaKernelsTest {
 protected:
  void SetUp() override {
    CudaKernelsTest::SetUp();
    if (IsSkipped()) return;
    cuda::CudaBackendOptions options;
    options.fast_kernels = true;
    fast_ = cuda::makeCudaBackend(0, options);
    // 64 KiB of partials: large matrices run in several column slices.
    options.gemv_scratch_bytes = 64 << 10;
    sliced_ = cuda::makeCudaBackend(0, options);
    // The same two with fused launches (the GEMV folds in its partial kernel).
    options.fused_launches = true;
    fused_sliced_ = cuda::makeCudaBackend(0, options);
    options.gemv_scratch_bytes = cuda::CudaBackendOptions{}.gemv_scratch_bytes;
    fused_ = cuda::makeCudaBackend(0, options);
  }

  void TearDown() override {
    for (auto& [backend, data, bytes] : owned_) backend->release(data, bytes);
    owned_.clear();
    CudaKernelsTest::TearDown();
  }

  // y = x · w^T on `backend` for the first m rows of x, x placed `offset`
  // floats into its buffer (1: not 16-byte aligned), the weight through
  // matmulWeight() as the model runner gives it.
  std::vector<float> run(Backend& backend, const std::vector<float>& x, int64_t m, int64_t k,
                         const WeightView& w, int64_t offset = 0) {
    std::vector<float> rows(static_cast<size_t>(offset), 0.0f);
    rows.insert(rows.end(), x.begin(), x.begin() + m * k);
    const size_t x_bytes = rows.size() * sizeof(float);
    const size_t y_bytes = static_cast<size_t>(m * w.rows) * sizeof(float);
    void* x_data = backend.allocate(x_bytes);
    void* y_data = backend.allocate(y_bytes);
    EXPECT_NE(x_data, nullptr);
    EXPECT_NE(y_data, nullptr);
    owned_.push_back({&backend, x_data, x_bytes});
    owned_.push_back({&backend, y_data, y_bytes});
    backend.copyFromHost(x_data, rows.data(), x_bytes);
    // Poison: every output must be written.
    const std::vector<float> poison(static_cast<size_t>(m * w.rows),
                                    std::numeric_limits<float>::quiet_NaN());
    backend.copyFromHost(y_data, poison.data(), y_bytes);
    backend.matmul(static_cast<const float*>(x_data) + offset, m, k, backend.matmulWeight(w),
                   static_cast<float*>(y_data));
    std::vector<float> y(static_cast<size_t>(m * w.rows));
    backend.copyToHost(y.data(), y_data, y_bytes);
    return y;
  }

  // `host` in a new buffer of `backend`, released in TearDown().
  float* put(Backend& backend, const std::vector<float>& host) {
    const size_t bytes = host.size() * sizeof(float);
    void* data = backend.allocate(bytes);
    EXPECT_NE(data, nullptr);
    owned_.push_back({&backend, data, bytes});
    backend.copyFromHost(data, host.data(), bytes);
    return static_cast<float*>(data);
  }
  static std::vector<float> get(Backend& backend, const float* data, int64_t count) {
    std::vector<float> host(static_cast<size_t>(count));
    backend.copyToHost(host.data(), data, host.size() * sizeof(float));
    return host;
  }
  static bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  // A bf16-compute backend with `options` but bf16 GEMM configuration
  // `config`, kept in configs_; its description names the configuration.
  Backend& bf16ConfigBackend(cuda::CudaBackendOptions options, int config) {
    options.bf16_gemm_config = config;
    configs_.push_back(cuda::makeCudaBackend(0, options));
    Backend& backend = *configs_.back();
    backend.setComputeDType(DType::kBF16);
    EXPECT_NE(backend.description().find("bf16 GEMM configuration " + std::to_string(config)),
              std::string::npos);
    return backend;
  }

  std::unique_ptr<Backend> fast_;
  std::unique_ptr<Backend> sliced_;
  std::unique_ptr<Backend> fused_;
  std::unique_ptr<Backend> fused_sliced_;
  std::unique_ptr<Backend> bf16_;                  // made by the test that needs it
  std::unique_ptr<Backend> unordered_;             // likewise
  std::unique_ptr<Backend> fused_bf16_;            // likewise
  std::vector<std::unique_ptr<Backend>> configs_;  // likewise
  // Released in TearDown(), before the backends go.
  std::vector<std::tuple<Backend*, void*, size_t>> owned_;
};

// Random activations with a row of tiny negatives (their products with the
// tiny weight column below underflow to -0: a chain that took a padded
// position would end +0) and a row holding an inf.
std::vector<float> gemvActivations(int64_t m, int64_t k, uint32_t seed) {
  auto x = randomFloats(static_cast<size_t>(m * k), seed, 2.0f);
  for (int64_t kk = 0; kk < k; ++kk) x[1 * k + kk] = -1e-30f;
  x[2 * k + k / 2] = std::numeric_limits<float>::infinity();
  return x;
}

// The fast GEMV and the reference kernels give every row the same bits, for
// m = 1, 7, 32 and 64, every weight type, shapes that fill no tile (n not a
// multiple of 32, k not of 128, k odd), x not 16-byte aligned, and columns
// run in slices (small scratch).
TEST_F(CudaFastKernelsTest, FastGemvEqualsTheReferenceBitwise) {
  EXPECT_NE(fast_->description().find(", fast kernels"), std::string::npos);
  std::list<std::vector<float>> keep_f32;
  std::list<std::vector<uint16_t>> keep_half;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{7, 129},
                             {130, 333},
                             {70, 1024},
                             {4100, 300},
                             {1000, 4096},
                             {33, 128}}) {
    const auto x = gemvActivations(64, k, static_cast<uint32_t>(n + k));
    const auto x_other = gemvActivations(64, k, static_cast<uint32_t>(n + k + 1));
    auto& w32 = keep_f32.emplace_back(randomFloats(static_cast<size_t>(n * k), 21));
    for (int64_t kk = 0; kk < k; ++kk) w32[3 * k + kk] = 1e-20f;
    const auto& bf16 = keep_half.emplace_back(toHalfBits(w32, DType::kBF16));
    const auto& f16 = keep_half.emplace_back(toHalfBits(w32, DType::kF16));
    const WeightView weights[] = {{w32.data(), DType::kF32, n, k},
                                  {bf16.data(), DType::kBF16, n, k},
                                  {f16.data(), DType::kF16, n, k}};
    for (const WeightView& w : weights) {
      for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{32}, int64_t{64}}) {
        SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + " " +
                     dtypeShortName(w.dtype) + " m " + std::to_string(m));
        const auto expected = run(*backend_, x, m, k, w);
        const size_t bytes = expected.size() * sizeof(float);
        EXPECT_EQ(0, std::memcmp(expected.data(), run(*fast_, x, m, k, w).data(), bytes));
        EXPECT_EQ(0, std::memcmp(expected.data(), run(*sliced_, x, m, k, w).data(), bytes));
        EXPECT_EQ(0, std::memcmp(expected.data(), run(*fast_, x, m, k, w, 1).data(), bytes));
        // Folded in the partial kernel: x, other x, x again, as the arrival
        // counters must be zero again after a call, and a fold that read
        // partials before they were written would find the last call's.
        const auto other = run(*backend_, x_other, m, k, w);
        for (Backend* fused : {fused_.get(), fused_sliced_.get()}) {
          for (int again = 0; again < 3; ++again) {
            const bool odd = again % 2 == 1;
            EXPECT_EQ(0, std::memcmp((odd ? other : expected).data(),
                                     run(*fused, odd ? x_other : x, m, k, w).data(), bytes))
                << fused->description() << ", call " << again;
          }
        }
        if (m > 1 && w.dtype != DType::kF16) {
          EXPECT_TRUE(std::signbit(expected[1 * n + 3]) && expected[1 * n + 3] == 0.0f)
              << "the tiny row and column give -0";
        }
      }
    }
  }
}

// The re-laid copy sits beside the resident one: matmulWeight() still gives
// the row-major view (embedding lookups of a tied LM head read it), and m >
// 64 runs the reference tiled kernel on it.
TEST_F(CudaFastKernelsTest, MatmulWeightKeepsTheRowMajorView) {
  const int64_t n = 96, k = 256;
  const auto w32 = randomFloats(static_cast<size_t>(n * k), 22);
  const WeightView w{w32.data(), DType::kF32, n, k};
  EXPECT_EQ(fast_->matmulWeight(w).data, fast_->residentWeight(w).data);
  EXPECT_EQ(fast_->matmulWeight(w).layout, WeightLayout::kRows);
  const auto x = randomFloats(static_cast<size_t>(100 * k), 23);
  const auto expected = run(*backend_, x, 100, k, w);
  EXPECT_EQ(0, std::memcmp(expected.data(), run(*fast_, x, 100, k, w).data(),
                           expected.size() * sizeof(float)));
}

// bf16 compute is refused by the reference kernels, with the reason.
TEST_F(CudaFastKernelsTest, Bf16ComputeNeedsTheFastKernels) {
  try {
    backend_->setComputeDType(DType::kBF16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs its fast kernels (--cuda-kernels auto or fast)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(fast_->setComputeDType(DType::kF32));
}

// The bf16 tensor-core GEMM: a row's bits are the same alone, in a batch of
// 7, 64 or 2048 rows and at any place in it; the result is close to the
// fp32 product (bf16 activations) and to the CPU's bf16 compute (the same
// rounded activations, another summation order).
TEST_F(CudaFastKernelsTest, Bf16MmaRowsAreBitwiseEqualForAnyRowCount) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  Backend* bf16_backend = bf16_.get();
  bf16_backend->setComputeDType(DType::kBF16);
  EXPECT_NE(bf16_backend->description().find(", bf16 compute"), std::string::npos);
  const int64_t n = 300;
  for (const int64_t k : {int64_t{1000}, int64_t{333}}) {  // 16-byte loads; element loads
    SCOPED_TRACE("k " + std::to_string(k));
    const auto x = randomFloats(static_cast<size_t>(2048 * k), 24);
    const auto w32 = randomFloats(static_cast<size_t>(n * k), 25);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const WeightView w{bf16.data(), DType::kBF16, n, k};
    const auto all = run(*bf16_backend, x, 2048, k, w);
    // m = 2048 and 257 run the pipelined kernel where k is a multiple of 8
    // (1000: its last 16-wide slice half padding), the others the skinny
    // one, with each of its row-group counts (1, 2, 4, 8: m up to 8, 16, 32,
    // 64).
    for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{17}, int64_t{32},
                            int64_t{33}, int64_t{64}, int64_t{257}}) {
      const auto part = run(*bf16_backend, x, m, k, w);
      EXPECT_EQ(0, std::memcmp(all.data(), part.data(), part.size() * sizeof(float))) << "m " << m;
    }
    // The pipelined kernel's other configurations (K step 32 or 64, three or
    // four stages: CudaBackendOptions::bf16_gemm_config; the default is the
    // serving one, which the description leaves unnamed): the same rows,
    // bit for bit. (The wgmma twins, 4 to 7, and the wide kernel's
    // candidates, 8 and 9, have tests of their own below.)
    EXPECT_EQ(bf16_backend->description().find("bf16 GEMM configuration"), std::string::npos);
    for (int config = 0; config < kBf16GemmWgmma; ++config) {
      if (config == kBf16GemmServing) continue;
      Backend& other = bf16ConfigBackend(options, config);
      const int64_t m = kEmulated ? 257 : 2048;
      const auto rows = run(other, x, m, k, w);
      EXPECT_EQ(0, std::memcmp(all.data(), rows.data(), rows.size() * sizeof(float)))
          << "configuration " << config << ", m " << m;
    }
    options.bf16_gemm_config = kBf16GemmConfigs;
    EXPECT_THROW(cuda::makeCudaBackend(0, options), Error)
        << "no configuration " << kBf16GemmConfigs;
    options.bf16_gemm_config = kBf16GemmServing;
    for (const int64_t row : {int64_t{40}, int64_t{2047}}) {
      const std::vector<float> one(x.begin() + row * k, x.begin() + (row + 1) * k);
      const auto alone = run(*bf16_backend, one, 1, k, w);
      EXPECT_EQ(0, std::memcmp(all.data() + row * n, alone.data(), n * sizeof(float)))
          << "row " << row;
    }

    const int64_t checked = 64;
    std::vector<float> exact(static_cast<size_t>(checked * n));
    matmul(x.data(), checked, k, w, exact.data());
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_FALSE(std::isnan(all[i])) << "at " << i;
      diff += (double{all[i]} - exact[i]) * (double{all[i]} - exact[i]);
      norm += double{exact[i]} * exact[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-2) << "against fp32 activations";
    std::vector<uint16_t> packed_storage;
    const WeightView packed = packBf16Pairs(w, packed_storage);
    std::vector<float> rounded(static_cast<size_t>(checked * n));
    matmul(x.data(), checked, k, packed, rounded.data());
    const std::vector<float> head(all.begin(), all.begin() + checked * n);
    expectNear(rounded, head, 1e-4f * static_cast<float>(k) / 100.0f);
  }
}

// The wide mma.sync kernel's configurations (8: 128 x 128 tiles of four
// 64 x 64 warps; 9: 128 x 256 of eight; fragments a slice ahead, row-grouped
// tile order), candidates for the serving one: its rows, bit for bit. At
// k = 1,000 the last K step is partial (three slices, the third half
// padding), at 72 it is one slice; 2,100 rows are a whole group of 16 row
// tiles and a second, short one (on the emulator with few columns, for
// time). A test of its own, named a candidate, so that gpu-check.sh runs it
// in the candidates' step and a fault never counts against the serving
// kernels.
TEST_F(CudaFastKernelsTest, CandidateWideGemmRowsEqualTheServingRows) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  bf16_->setComputeDType(DType::kBF16);
  struct Shape {
    int64_t m, n, k;
  };
  std::vector<Shape> shapes = {{257, 300, 1000}, {2100, 40, 72}};
  if (!smallShapes()) shapes.insert(shapes.end(), {{2048, 300, 1024}, {2100, 300, 1000}});
  for (const Shape& shape : shapes) {
    const auto [m, n, k] = shape;
    SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                 std::to_string(k));
    const auto x = randomFloats(static_cast<size_t>(m * k), 28);
    const auto w32 = randomFloats(static_cast<size_t>(n * k), 29);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const WeightView w{bf16.data(), DType::kBF16, n, k};
    const auto serving = run(*bf16_, x, m, k, w);
    for (int config = kBf16GemmWide; config < kBf16GemmConfigs; ++config) {
      const auto rows = run(bf16ConfigBackend(options, config), x, m, k, w);
      EXPECT_EQ(0, std::memcmp(serving.data(), rows.data(), rows.size() * sizeof(float)))
          << "configuration " << config;
    }
  }
}

// The wgmma twins of the pipelined kernel (bf16 GEMM configurations 4 to
// 7; compute capability 9.0 only, the emulator's device is one): the same
// mma chain on another instruction, so equal rows mean that HGMMA rounds a
// k16 step as HMMA does (docs/cuda.md "The wgmma configurations"). A test
// of its own, so that a difference here is told apart from a fault of the
// kernels that serve; and within it, a wrong product (beyond rounding) from
// a product rounded otherwise. On the emulator both instructions round
// alike by construction, so there the bits must agree. k = 1000 ends in a partial K step (three
// slices, the last half padding), k = 40 has nothing but one (its third
// slice half padding); n = 300 in partial column tiles of 128 and 256, m =
// 257 and 4,100 in a partial row tile. 4,100 x 2,100 is 297 output tiles,
// more than twice a Hopper GPU's SMs (114 to 132): configuration 7's
// blocks take two or three tiles each, so its barrier phases run on from
// tile to tile, as on the emulator's 4 SMs at 257 x 300 (six tiles).
TEST_F(CudaFastKernelsTest, Bf16WgmmaRowsEqualTheMmaSyncRows) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  configs_.push_back(cuda::makeCudaBackend(0, options));
  Backend& mma = *configs_.back();
  mma.setComputeDType(DType::kBF16);
  struct Shape {
    int64_t m, n, k;
  };
  std::vector<Shape> shapes = {{257, 300, 1000}, {257, 300, 1024}, {257, 300, 40}};
  if (!smallShapes()) {
    shapes = {{2048, 300, 1000}, {2048, 300, 1024}, {2048, 300, 40}, {4100, 2100, 1000}};
  }
  for (const Shape& shape : shapes) {
    const auto [m, n, k] = shape;
    SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                 std::to_string(k));
    const auto x = randomFloats(static_cast<size_t>(m * k), 26);
    const auto w32 = randomFloats(static_cast<size_t>(n * k), 27);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const WeightView w{bf16.data(), DType::kBF16, n, k};
    const auto expected = run(mma, x, m, k, w);
    // |row| of x and |column| of w, for the bound on a rounding difference.
    std::vector<double> x_norms(static_cast<size_t>(m)), w_norms(static_cast<size_t>(n));
    for (int64_t i = 0; i < m * k; ++i) x_norms[i / k] += double{x[i]} * x[i];
    for (int64_t i = 0; i < n * k; ++i) w_norms[i / k] += double{w32[i]} * w32[i];
    for (double& v : x_norms) v = std::sqrt(v);
    for (double& v : w_norms) v = std::sqrt(v);
    for (int config = kBf16GemmWgmma; bf16GemmIsWgmma(config); ++config) {
      options.bf16_gemm_config = config;
      std::unique_ptr<Backend> made;
      try {
        made = cuda::makeCudaBackend(0, options);
      } catch (const Error& e) {
        if (kEmulated) FAIL() << "configuration " << config << ": " << e.what();
        GTEST_SKIP() << e.what();
      }
      configs_.push_back(std::move(made));
      Backend& wgmma = *configs_.back();
      wgmma.setComputeDType(DType::kBF16);
      EXPECT_NE(wgmma.description().find("bf16 GEMM configuration " + std::to_string(config) +
                                         " (wgmma)"),
                std::string::npos);
      const auto rows = run(wgmma, x, m, k, w);
      // Two questions, answered apart. Wrong: an output farther from
      // configuration 0's than another rounding of the same sums can take
      // it (1e-3 of |x row| · |w column|; a misplaced operand or a stale
      // stage moves an output by about 1 / sqrt(k) of that). Rounded
      // otherwise: any bit differs.
      int64_t wrong = 0, differ = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>(i * n + j);
          if (std::memcmp(&rows[at], &expected[at], sizeof(float)) == 0) continue;
          ++differ;
          const double bound =
              1e-3 * x_norms[static_cast<size_t>(i)] * w_norms[static_cast<size_t>(j)];
          if (!(std::fabs(double{rows[at]} - expected[at]) <= bound)) ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0) << "configuration " << config << ": " << wrong << " of " << rows.size()
                          << " outputs are not configuration 0's product";
      EXPECT_EQ(differ, 0) << "configuration " << config << ": " << differ << " of " << rows.size()
                           << " outputs round otherwise than configuration 0's (HGMMA vs HMMA)";
    }
  }
}

// The unordered decode variant (CudaBackendOptions::unordered_decode, only
// for measuring what the skinny kernel's fixed order costs) computes the
// same product: near the ordered kernel's rows (another summation order,
// so not their bits), plain and adding, at a decode shape that splits k
// (n = 1024: 32 blocks unsplit) and one whose last pair is half padding.
TEST_F(CudaFastKernelsTest, UnorderedDecodeVariantComputesTheSameProduct) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  options.unordered_decode = true;
  unordered_ = cuda::makeCudaBackend(0, options);
  EXPECT_NE(unordered_->description().find("unordered decode matmuls"), std::string::npos);
  for (Backend* backend : {bf16_.get(), unordered_.get()}) backend->setComputeDType(DType::kBF16);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1024, 4096}, {96, 1000}}) {
    const auto x = randomFloats(static_cast<size_t>(64 * k), 41);
    const auto bf16 = toHalfBits(randomFloats(static_cast<size_t>(n * k), 42), DType::kBF16);
    const WeightView w{bf16.data(), DType::kBF16, n, k};
    for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{64}}) {
      SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + " m " +
                   std::to_string(m));
      const auto ordered = run(*bf16_, x, m, k, w);
      const auto split = run(*unordered_, x, m, k, w);
      for (float v : split) ASSERT_FALSE(std::isnan(v));
      expectNear(ordered, split, 1e-4f * static_cast<float>(k) / 100.0f);

      // y += x · w^T adds into y (the atomics' kAdd).
      const auto y0 = randomFloats(static_cast<size_t>(m * n), 43);
      const size_t bytes = y0.size() * sizeof(float);
      void* y = unordered_->allocate(bytes);
      void* scratch = unordered_->allocate(bytes);
      void* xs = unordered_->allocate(static_cast<size_t>(m * k) * sizeof(float));
      ASSERT_TRUE(y != nullptr && scratch != nullptr && xs != nullptr);
      owned_.push_back({unordered_.get(), y, bytes});
      owned_.push_back({unordered_.get(), scratch, bytes});
      owned_.push_back({unordered_.get(), xs, static_cast<size_t>(m * k) * sizeof(float)});
      unordered_->copyFromHost(y, y0.data(), bytes);
      unordered_->copyFromHost(xs, x.data(), static_cast<size_t>(m * k) * sizeof(float));
      unordered_->matmulAdd(static_cast<const float*>(xs), m, k, unordered_->matmulWeight(w),
                            static_cast<float*>(y), static_cast<float*>(scratch));
      std::vector<float> added(y0.size());
      unordered_->copyToHost(added.data(), y, bytes);
      std::vector<float> expected(y0.size());
      for (size_t i = 0; i < y0.size(); ++i) expected[i] = y0[i] + ordered[i];
      expectNear(expected, added, 1e-4f * static_cast<float>(k) / 100.0f);
    }
  }
}

// The fused matmuls of the fast kernels (epilogue.h) give the bits of the
// plain matmul followed by its step: the residual add, the outputs taken
// apart, SiLU·up over (gate, up) column pairs. For f32 compute (fast GEMV,
// one slice and several; m = 300 runs the reference kernel and the
// epilogue kernel) and bf16 compute (skinny, small and pipelined
// tensor-core kernels), k with and without 16-byte rows.
TEST_F(CudaFastKernelsTest, FusedEpiloguesGiveTheBitsOfTheUnfusedSteps) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  bf16_->setComputeDType(DType::kBF16);
  EXPECT_EQ(fast_->stackedLayout(), Backend::StackedLayout::kPairs);
  EXPECT_EQ(backend_->stackedLayout(), Backend::StackedLayout::kPlain);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  const int64_t n = 96, inter = n / 2;
  const int64_t widths[] = {64, 16, 16};
  for (const int64_t k : {int64_t{256}, int64_t{333}}) {
    const auto w32 = randomFloats(static_cast<size_t>(n * k), 31);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const auto x = randomFloats(static_cast<size_t>(300 * k), 32, 2.0f);
    const auto residual = randomFloats(static_cast<size_t>(300 * n), 33);
    const std::pair<Backend*, WeightView> cases[] = {
        {fast_.get(), {w32.data(), DType::kF32, n, k}},
        {fast_.get(), {bf16.data(), DType::kBF16, n, k}},
        {sliced_.get(), {bf16.data(), DType::kBF16, n, k}},
        {fused_.get(), {w32.data(), DType::kF32, n, k}},
        {fused_sliced_.get(), {bf16.data(), DType::kBF16, n, k}},
        {bf16_.get(), {bf16.data(), DType::kBF16, n, k}}};
    for (const auto& [backend_ptr, w] : cases) {
      Backend& backend = *backend_ptr;
      const WeightView mw = backend.matmulWeight(w);
      for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{64}, int64_t{300}}) {
        SCOPED_TRACE("k " + std::to_string(k) + " " + dtypeShortName(w.dtype) + " m " +
                     std::to_string(m) + " " + backend.description());
        const float* xs = put(backend, std::vector<float>(x.begin(), x.begin() + m * k));
        float* scratch = put(backend, std::vector<float>(static_cast<size_t>(m * n), nan));
        float* plain = put(backend, std::vector<float>(static_cast<size_t>(m * n), nan));
        backend.matmul(xs, m, k, mw, plain);
        const std::vector<float> t = get(backend, plain, m * n);

        // y += x · w^T: the same add as addInPlace (one IEEE add on the host).
        const std::vector<float> y0(residual.begin(), residual.begin() + m * n);
        std::vector<float> added = y0;
        for (size_t i = 0; i < added.size(); ++i) added[i] = y0[i] + t[i];
        float* y = put(backend, y0);
        backend.matmulAdd(xs, m, k, mw, y, scratch);
        EXPECT_TRUE(same(added, get(backend, y, m * n))) << "matmulAdd";

        Backend::SplitOutputs split;
        split.count = 3;
        int64_t first = 0;
        for (int p = 0; p < 3; ++p) {
          split.widths[p] = widths[p];
          split.parts[p] =
              put(backend, std::vector<float>(static_cast<size_t>(m * widths[p]), nan));
        }
        backend.matmulSplit(xs, m, k, mw, split, scratch);
        for (int p = 0; p < 3; ++p) {
          std::vector<float> expected(static_cast<size_t>(m * widths[p]));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < widths[p]; ++c) {
              expected[r * widths[p] + c] = t[r * n + first + c];
            }
          }
          EXPECT_TRUE(same(expected, get(backend, split.parts[p], m * widths[p])))
              << "matmulSplit part " << p;
          first += widths[p];
        }

        // Pairs: column 2j is gate j, 2j + 1 up j; the expected values from
        // the device's own siluMul.
        std::vector<float> gate(static_cast<size_t>(m * inter)), up(gate.size());
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < inter; ++j) {
            gate[r * inter + j] = t[r * n + 2 * j];
            up[r * inter + j] = t[r * n + 2 * j + 1];
          }
        }
        float* gate_d = put(backend, gate);
        backend.siluMul(gate_d, put(backend, up), gate_d, m * inter);
        float* out = put(backend, std::vector<float>(gate.size(), nan));
        float* up_scratch = put(backend, std::vector<float>(gate.size(), nan));
        backend.matmulSiluMul(xs, m, k, mw, out, scratch, up_scratch);
        EXPECT_TRUE(same(get(backend, gate_d, m * inter), get(backend, out, m * inter)))
            << "matmulSiluMul";
      }
    }
  }
}

// Under bf16 compute with fused launches, rmsNorm and the SiLU·up epilogue
// write their outputs as the next decode matmul's x fragments, and that
// matmul takes them instead of rounding x itself: every output keeps the
// bits of the backend without fused launches (k a multiple of 32 and not,
// row counts from 1 to 64, fragments of more rows left in the buffer by an
// earlier call), a second matmul of the same x takes them again, and a
// call that changes x in between makes the matmul round x again. On the
// emulator the kernels are counted too: one per fused matmul.
TEST_F(CudaFastKernelsTest, FusedLaunchesGiveTheBitsOfSeparateLaunches) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  options.fused_launches = true;
  fused_bf16_ = cuda::makeCudaBackend(0, options);
  Backend& fused = *fused_bf16_;
  EXPECT_NE(fused.description().find(", fused launches"), std::string::npos);
  EXPECT_EQ(bf16_->description().find(", fused launches"), std::string::npos);
  for (Backend* backend : {bf16_.get(), &fused}) backend->setComputeDType(DType::kBF16);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // One kernel on the emulator (where it counts), for a matmul whose x
  // fragments were written by its producer; two where x is rounded first.
  auto expectKernels = [](int64_t counted, int64_t expected, const char* what) {
    if (kEmulated) {
      EXPECT_EQ(counted, expected) << what;
    }
  };

  const int64_t n = 96;
  for (const auto& [dim, inter] : {std::pair<int64_t, int64_t>{64, 64}, {100, 48}, {128, 200}}) {
    std::list<std::vector<uint16_t>> keep;
    const auto& w =
        keep.emplace_back(toHalfBits(randomFloats(static_cast<size_t>(n * dim), 41), DType::kBF16));
    const auto& gate_up = keep.emplace_back(
        toHalfBits(randomFloats(static_cast<size_t>(2 * inter * dim), 42), DType::kBF16));
    const auto& down = keep.emplace_back(
        toHalfBits(randomFloats(static_cast<size_t>(dim * inter), 43), DType::kBF16));
    const auto norm_weight = randomFloats(static_cast<size_t>(dim), 44);
    const auto x = randomFloats(static_cast<size_t>(64 * dim), 45, 3.0f);
    const auto other = randomFloats(static_cast<size_t>(64 * dim), 46);
    // Per backend, the outputs of each step in order.
    std::vector<std::vector<float>> results[2];
    for (int which = 0; which < 2; ++which) {
      Backend& backend = which == 0 ? *bf16_ : fused;
      const bool fusing = which == 1;
      const WeightView mw = backend.matmulWeight({w.data(), DType::kBF16, n, dim});
      const WeightView mgu = backend.matmulWeight({gate_up.data(), DType::kBF16, 2 * inter, dim});
      const WeightView md = backend.matmulWeight({down.data(), DType::kBF16, dim, inter});
      const float* weight = put(backend, norm_weight);
      // 33 first: its rows stay in the fragment buffers for the smaller m.
      for (const int64_t m : {int64_t{33}, int64_t{1}, int64_t{7}, int64_t{64}}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " inter " + std::to_string(inter) + " m " +
                     std::to_string(m) + " " + backend.description());
        const float* xs = put(backend, std::vector<float>(x.begin(), x.begin() + m * dim));
        float* normed = put(backend, std::vector<float>(static_cast<size_t>(m * dim), nan));
        float* y = put(backend, std::vector<float>(static_cast<size_t>(m * n), nan));
        float* y2 = put(backend, std::vector<float>(static_cast<size_t>(m * n), nan));
        auto& out = results[which];

        backend.rmsNorm(xs, weight, m, dim, 1e-5f, normed);
        expectKernels(kernelsRunBy([&] { backend.matmul(normed, m, dim, mw, y); }), fusing ? 1 : 2,
                      "matmul after rmsNorm");
        expectKernels(kernelsRunBy([&] { backend.matmul(normed, m, dim, mw, y2); }), fusing ? 1 : 2,
                      "a second matmul of the same x");
        out.push_back(get(backend, normed, m * dim));
        out.push_back(get(backend, y, m * n));
        out.push_back(get(backend, y2, m * n));

        // x changed after its producer: its fragments are stale.
        backend.rmsNorm(xs, weight, m, dim, 1e-5f, normed);
        backend.addInPlace(normed,
                           put(backend, std::vector<float>(other.begin(), other.begin() + m * dim)),
                           m * dim);
        expectKernels(kernelsRunBy([&] { backend.matmul(normed, m, dim, mw, y); }), 2,
                      "matmul after rmsNorm and addInPlace");
        out.push_back(get(backend, y, m * n));

        // rmsNorm -> SiLU·up -> down.
        float* act = put(backend, std::vector<float>(static_cast<size_t>(m * inter), nan));
        float* scratch = put(backend, std::vector<float>(static_cast<size_t>(m * 2 * inter), nan));
        float* up = put(backend, std::vector<float>(static_cast<size_t>(m * inter), nan));
        float* z = put(backend, std::vector<float>(static_cast<size_t>(m * dim), nan));
        backend.rmsNorm(xs, weight, m, dim, 1e-5f, normed);
        expectKernels(
            kernelsRunBy([&] { backend.matmulSiluMul(normed, m, dim, mgu, act, scratch, up); }),
            fusing ? 1 : 2, "matmulSiluMul after rmsNorm");
        expectKernels(kernelsRunBy([&] { backend.matmul(act, m, inter, md, z); }), fusing ? 1 : 2,
                      "down after matmulSiluMul");
        out.push_back(get(backend, act, m * inter));
        out.push_back(get(backend, z, m * dim));
      }
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(same(results[0][i], results[1][i]))
          << "dim " << dim << " inter " << inter << ": step " << i << " differs";
      for (float v : results[0][i]) ASSERT_TRUE(std::isfinite(v)) << "step " << i;
    }
  }
}

// Attention over two sequences in a cache of 48 blocks of 16 positions: the
// long one (600 positions) in blocks 47, 46, ... (39 of them), the short one
// (37) in blocks 0..2. Row r of the inputs is the long sequence's position
// r for r < 600, the short one's position r - 600 below 637, then one decode
// row of each (positions 600 and 37).
struct AttentionShape {
  int64_t heads, kv_heads, head_dim;
  DType dtype;
  std::string name() const {
    return std::to_string(heads) + " heads over " + std::to_string(kv_heads) + ", head_dim " +
           std::to_string(head_dim) + ", " + dtypeShortName(dtype);
  }
};
constexpr int64_t kLongRows = 600, kShortRows = 37;
constexpr int64_t kAttentionRows = kLongRows + kShortRows + 2;

class AttentionCase {
 public:
  // `block_size`: the cache's positions per block (the tables cover both
  // sequences and a block to spare).
  explicit AttentionCase(const AttentionShape& shape, int32_t block_size = 16)
      : shape_(shape),
        width_(shape.heads * shape.head_dim),
        kv_width_(shape.kv_heads * shape.head_dim),
        q_(randomFloats(static_cast<size_t>(kAttentionRows * width_), 31)),
        k_(randomFloats(static_cast<size_t>(kAttentionRows * kv_width_), 32)),
        v_(randomFloats(static_cast<size_t>(kAttentionRows * kv_width_), 33)) {
    layout_.dtype = shape.dtype;
    layout_.block_size = block_size;
    layout_.num_layers = 2;
    layout_.num_kv_heads = static_cast<int32_t>(shape.kv_heads);
    layout_.head_dim = static_cast<int32_t>(shape.head_dim);
    const auto long_blocks = static_cast<int32_t>((kLongRows + block_size) / block_size + 1);
    const auto short_blocks = static_cast<int32_t>((kShortRows + block_size) / block_size);
    layout_.num_blocks = long_blocks + short_blocks + 6;
    for (int32_t b = 0; b < long_blocks; ++b) long_table_.push_back(layout_.num_blocks - 1 - b);
    for (int32_t b = 0; b < short_blocks; ++b) short_table_.push_back(b);
  }

  // One batch: positions [long_first, long_first + long_count) of the long
  // sequence, then [short_first, short_first + short_count) of the short one
  // (a count of 0: not in the batch).
  struct Step {
    int64_t long_first, long_count, short_first, short_count;
  };
  // The prefill of both sequences in one batch, then both decode rows.
  static std::vector<Step> oneShot() {
    return {{0, kLongRows, 0, kShortRows}, {kLongRows, 1, kShortRows, 1}};
  }

  // The input row of a sequence's position (the class comment).
  static int64_t inputRow(bool long_sequence, int64_t position) {
    if (long_sequence) return position < kLongRows ? position : kLongRows + kShortRows;
    return position < kShortRows ? kLongRows + position : kLongRows + kShortRows + 1;
  }

  // Runs `steps` on `backend` (writeKv of each batch's rows, then
  // pagedAttention of layer 1): every row's output, in input-row order, and
  // the cache bytes at the end.
  std::pair<std::vector<float>, std::vector<char>> run(Backend& backend,
                                                       const std::vector<Step>& steps) const {
    std::vector<std::pair<void*, size_t>> owned;
    auto put = [&](const float* host, size_t n) {
      void* data = backend.allocate(n * sizeof(float));
      owned.push_back({data, n * sizeof(float)});
      backend.copyFromHost(data, host, n * sizeof(float));
      return static_cast<float*>(data);
    };
    const size_t cache_bytes = static_cast<size_t>(layout_.num_blocks * layout_.blockBytes());
    KvCacheLayout device = layout_;
    device.base = backend.allocate(cache_bytes);
    owned.push_back({device.base, cache_bytes});
    std::vector<float> result(static_cast<size_t>(kAttentionRows * width_),
                              std::numeric_limits<float>::quiet_NaN());
    for (const Step& step : steps) {
      // Input rows of the batch, in batch order.
      std::vector<int64_t> inputs;
      std::vector<int32_t> positions;
      std::vector<AttentionSequence> sequences;
      auto add = [&](bool long_sequence, int64_t first, int64_t count) {
        if (count == 0) return;
        const std::vector<int32_t>& table = long_sequence ? long_table_ : short_table_;
        sequences.push_back({table.data(), static_cast<int32_t>(table.size()),
                             static_cast<int64_t>(positions.size()), count, first});
        for (int64_t p = first; p < first + count; ++p) {
          positions.push_back(static_cast<int32_t>(p));
          inputs.push_back(inputRow(long_sequence, p));
        }
      };
      add(true, step.long_first, step.long_count);
      add(false, step.short_first, step.short_count);
      std::vector<float> q, k, v;
      for (int64_t input : inputs) {
        q.insert(q.end(), q_.begin() + input * width_, q_.begin() + (input + 1) * width_);
        k.insert(k.end(), k_.begin() + input * kv_width_, k_.begin() + (input + 1) * kv_width_);
        v.insert(v.end(), v_.begin() + input * kv_width_, v_.begin() + (input + 1) * kv_width_);
      }
      std::vector<int32_t> ids;
      beginRowsOn(backend, ids, positions, sequences);
      backend.writeKv(device, 1, put(k.data(), k.size()), put(v.data(), v.size()));
      float* out = put(std::vector<float>(q.size(), 0.0f).data(), q.size());
      backend.pagedAttention(device, 1, put(q.data(), q.size()), shape_.heads, 0.088f, out);
      std::vector<float> host(q.size());
      backend.copyToHost(host.data(), out, host.size() * sizeof(float));
      for (size_t i = 0; i < inputs.size(); ++i) {
        std::copy(host.begin() + static_cast<int64_t>(i) * width_,
                  host.begin() + static_cast<int64_t>(i + 1) * width_,
                  result.begin() + inputs[i] * width_);
      }
    }
    std::vector<char> cache(cache_bytes);
    backend.copyToHost(cache.data(), device.base, cache_bytes);
    for (auto& [data, bytes] : owned) backend.release(data, bytes);
    return {result, cache};
  }

 private:
  AttentionShape shape_;
  int64_t width_, kv_width_;
  std::vector<float> q_, k_, v_;
  KvCacheLayout layout_;
  std::vector<int32_t> long_table_, short_table_;
};

// Not a degenerate comparison: the outputs are finite and not all zero.
void expectFiniteAndNonZero(const std::vector<float>& values) {
  double norm = 0.0;
  for (float value : values) norm += std::fabs(value);
  EXPECT_TRUE(std::isfinite(norm) && norm > 0.0) << norm;
}

// The fused Q/K/V epilogue (matmulQkvRope over q/k heads in RoPE pairs)
// gives q and the cache the bits of the unfused steps (the base class's
// sequence over the plain stacked matrix on the same backend: split, bias,
// RoPE, writeKv): with and without biases, f32 and bf16 caches, f32 and
// bf16 compute, a prefill chunk at positions 5.. beside a decode row at
// position 40 and a padding row outside every sequence, m = 3, 32, 300.
TEST_F(CudaFastKernelsTest, FusedQkvRopeGivesTheBitsOfTheUnfusedSteps) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  bf16_->setComputeDType(DType::kBF16);
  const int64_t heads = 8, kv_heads = 2, dim = 64, k = 256;
  const int64_t q_width = heads * dim, kv_width = kv_heads * dim, n = q_width + 2 * kv_width;
  // Rows of the plain matrix in the paired order: each q and k head's rows
  // i and i + dim / 2 side by side.
  std::vector<int64_t> paired_rows;
  for (int64_t head = 0; head < heads + kv_heads; ++head) {
    for (int64_t i = 0; i < dim / 2; ++i) {
      paired_rows.push_back(head * dim + i);
      paired_rows.push_back(head * dim + i + dim / 2);
    }
  }
  for (int64_t r = q_width + kv_width; r < n; ++r) paired_rows.push_back(r);
  const auto w32 = randomFloats(static_cast<size_t>(n * k), 41);
  std::vector<float> w32_paired;
  for (int64_t r : paired_rows) {
    w32_paired.insert(w32_paired.end(), w32.begin() + r * k, w32.begin() + (r + 1) * k);
  }
  const auto bf16 = toHalfBits(w32, DType::kBF16);
  const auto bf16_paired = toHalfBits(w32_paired, DType::kBF16);
  const auto x = randomFloats(static_cast<size_t>(300 * k), 42, 2.0f);
  const auto bias = randomFloats(static_cast<size_t>(n), 43);
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / dim));
  }
  const std::vector<int32_t> long_table = {7,  6,  5,  4,  3,  2,  1,  0,  8,  9, 10,
                                           11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const std::vector<int32_t> short_table = {21, 22, 23};

  struct Case {
    Backend* backend;
    const void* plain;
    const void* paired;
    DType dtype;
  };
  const Case cases[] = {{fast_.get(), w32.data(), w32_paired.data(), DType::kF32},
                        {fast_.get(), bf16.data(), bf16_paired.data(), DType::kBF16},
                        {bf16_.get(), bf16.data(), bf16_paired.data(), DType::kBF16}};
  for (const Case& c : cases) {
    Backend& backend = *c.backend;
    const WeightView plain = backend.matmulWeight({c.plain, c.dtype, n, k});
    const WeightView paired = backend.matmulWeight({c.paired, c.dtype, n, k});
    auto put = [&](const std::vector<float>& host) {
      const size_t bytes = host.size() * sizeof(float);
      void* data = backend.allocate(bytes);
      owned_.push_back({&backend, data, bytes});
      backend.copyFromHost(data, host.data(), bytes);
      return static_cast<float*>(data);
    };
    const float* inv_freq_d = put(inv_freq);
    const float* bias_d = put(bias);
    for (const DType kv_dtype : {DType::kF32, DType::kBF16}) {
      KvCacheLayout layout;
      layout.dtype = kv_dtype;
      layout.block_size = 16;
      layout.num_layers = 2;
      layout.num_kv_heads = static_cast<int32_t>(kv_heads);
      layout.head_dim = static_cast<int32_t>(dim);
      layout.num_blocks = 24;
      const size_t cache_bytes = static_cast<size_t>(layout.num_blocks * layout.blockBytes());
      for (const int64_t m : {int64_t{3}, int64_t{32}, int64_t{300}}) {
        for (const bool biased : {false, true}) {
          SCOPED_TRACE("m " + std::to_string(m) + (biased ? ", biases" : "") + ", cache " +
                       dtypeShortName(kv_dtype) + ", weights " + dtypeShortName(c.dtype) + ", " +
                       backend.description());
          // m - 2 prefill rows of the long sequence, the short one's decode
          // row at 40, then a padding row outside both.
          std::vector<int32_t> positions;
          for (int64_t p = 5; p < 5 + m - 2; ++p) positions.push_back(static_cast<int32_t>(p));
          positions.push_back(40);
          positions.push_back(0);
          const std::vector<AttentionSequence> sequences = {
              {long_table.data(), static_cast<int32_t>(long_table.size()), 0, m - 2, 5},
              {short_table.data(), static_cast<int32_t>(short_table.size()), m - 2, 1, 40}};
          std::vector<int32_t> ids;
          beginRowsOn(backend, ids, positions, sequences);
          const float* xs = put(std::vector<float>(x.begin(), x.begin() + m * k));
          float* scratch = put(std::vector<float>(static_cast<size_t>(m * n), 0.0f));
          auto run = [&](bool fused) {
            KvCacheLayout cache = layout;
            cache.base = backend.allocate(cache_bytes);
            owned_.push_back({&backend, cache.base, cache_bytes});
            Backend::QkvRope a;
            a.q = put(std::vector<float>(static_cast<size_t>(m * q_width), 0.0f));
            a.k = put(std::vector<float>(static_cast<size_t>(m * kv_width), 0.0f));
            a.v = put(std::vector<float>(static_cast<size_t>(m * kv_width), 0.0f));
            a.num_heads = heads;
            a.num_kv_heads = kv_heads;
            a.head_dim = dim;
            if (biased) {
              a.q_bias = bias_d;
              a.k_bias = bias_d + q_width;
              a.v_bias = bias_d + q_width + kv_width;
            }
            a.inv_freq = inv_freq_d;
            a.layer = 1;
            if (fused) {
              backend.matmulQkvRope(xs, m, k, paired, a, cache, scratch);
            } else {
              backend.Backend::matmulQkvRope(xs, m, k, plain, a, cache, scratch);
            }
            std::vector<float> q(static_cast<size_t>(m * q_width));
            backend.copyToHost(q.data(), a.q, q.size() * sizeof(float));
            std::vector<char> bytes(cache_bytes);
            backend.copyToHost(bytes.data(), cache.base, cache_bytes);
            return std::make_pair(q, bytes);
          };
          const auto [q_expected, cache_expected] = run(false);
          const auto [q_fused, cache_fused] = run(true);
          expectFiniteAndNonZero(q_expected);
          EXPECT_EQ(
              0, std::memcmp(q_expected.data(), q_fused.data(), q_expected.size() * sizeof(float)))
              << "q";
          EXPECT_TRUE(cache_expected == cache_fused) << "cache bytes";
        }
      }
    }
  }
}

// The grouped kernel gives the reference kernel's bits (and cache bytes),
// for GQA groups of 1, 4 and 8 (and 16, which takes the reference kernel).
TEST_F(CudaFastKernelsTest, GroupedAttentionEqualsTheReferenceBitwise) {
  std::vector<AttentionShape> shapes = {
      AttentionShape{8, 8, 64, DType::kBF16}, AttentionShape{32, 4, 128, DType::kBF16},
      AttentionShape{16, 1, 64, DType::kBF16}, AttentionShape{8, 2, 64, DType::kF32}};
  if (!kEmulated) {
    shapes.push_back(AttentionShape{8, 2, 128, DType::kBF16});
    shapes.push_back(AttentionShape{32, 8, 128, DType::kF32});
  }
  for (const AttentionShape& shape : shapes) {
    SCOPED_TRACE(shape.name());
    const AttentionCase attention(shape);
    const auto [expected, expected_cache] = attention.run(*backend_, AttentionCase::oneShot());
    const auto [actual, actual_cache] = attention.run(*fast_, AttentionCase::oneShot());
    ASSERT_EQ(expected.size(), actual.size());
    EXPECT_EQ(0, std::memcmp(expected.data(), actual.data(), expected.size() * sizeof(float)));
    EXPECT_EQ(expected_cache, actual_cache);
    expectFiniteAndNonZero(actual);
  }
}

// A candidate for the bf16 decode matmul's next default (opt-in until a GPU
// has passed this test; scripts/gpu-check.sh runs the Candidate tests in a
// step of their own): the weights staged through shared memory
// (deep_skinny) give the serving skinny kernel's rows, bit for bit, for
// every row-group count and for 16-byte and element loads of x (k = 1000,
// 333), and past 16 rows with x shared by the block through chunks of
// shared memory too (k = 2000: full chunks and a part one; n = 300 leaves
// two warps of the last block past the last column, which must still copy
// x and meet the barriers); the emulator sums each grid's dynamic shared
// memory, so there it also checks which kernel ran (x's chunks take the
// grid past 64 KiB).
TEST_F(CudaFastKernelsTest, CandidateDeepDecodeLoadsGiveTheSameRows) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  // Fixture-owned: run() leaves its buffers to TearDown().
  configs_.push_back(cuda::makeCudaBackend(0, options));
  Backend* serving = configs_.back().get();
  serving->setComputeDType(DType::kBF16);
  options.deep_skinny = true;
  configs_.push_back(cuda::makeCudaBackend(0, options));
  Backend* deep = configs_.back().get();
  deep->setComputeDType(DType::kBF16);
  EXPECT_EQ(serving->description().find(", deep decode loads"), std::string::npos);
  EXPECT_NE(deep->description().find(", deep decode loads"), std::string::npos);
  const int64_t n = 300;
  for (const int64_t k : {int64_t{1000}, int64_t{333}, int64_t{2000}}) {
    SCOPED_TRACE("k " + std::to_string(k));
    const auto x = randomFloats(static_cast<size_t>(64 * k), 24);
    const auto w32 = randomFloats(static_cast<size_t>(n * k), 25);
    const auto bf16 = toHalfBits(w32, DType::kBF16);
    const WeightView w{bf16.data(), DType::kBF16, n, k};
    for (const int64_t m :
         {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{17}, int64_t{33}, int64_t{64}}) {
      const auto rows = run(*serving, x, m, k, w);
      std::vector<float> part;
      const int64_t shared = dynamicSharedBytesOf([&] { part = run(*deep, x, m, k, w); });
      if (kEmulated) {
        EXPECT_GT(shared, 0) << "m " << m;
        EXPECT_EQ(shared > (int64_t{64} << 10), m > 16) << "m " << m << ": " << shared;
      }
      expectFiniteAndNonZero(part);
      ASSERT_EQ(rows.size(), part.size());
      EXPECT_EQ(0, std::memcmp(rows.data(), part.data(), part.size() * sizeof(float))) << "m " << m;
    }
  }
}

// The flash kernel's test batches: the shapes (bf16 caches; GQA groups of
// 1, 2, 4 and 8) and a prefill in chunks that start anywhere (mid tile, mid
// split, a row alone, beside the other sequence or not), ending on decode
// rows.
std::vector<AttentionShape> flashShapes() {
  std::vector<AttentionShape> shapes = {
      AttentionShape{8, 8, 64, DType::kBF16}, AttentionShape{32, 8, 128, DType::kBF16},
      AttentionShape{4, 2, 16, DType::kBF16}, AttentionShape{16, 2, 32, DType::kBF16}};
  if (!kEmulated) shapes.push_back(AttentionShape{8, 2, 128, DType::kBF16});
  return shapes;
}
std::vector<AttentionCase::Step> chunkedFlashSteps() {
  return {{0, 100, 0, 0},   {100, 157, 0, 20}, {257, 0, 20, 17},
          {257, 342, 0, 0}, {599, 1, 0, 0},    {kLongRows, 1, kShortRows, 1}};
}

// The tensor-core flash kernel (--cuda-kernels flash): near the reference
// (q and the softmax weights are rounded to bf16), and invariant to the bit:
// the chunked prefill gives every row the one-shot batch's output, and the
// cache the same bytes.
TEST_F(CudaFastKernelsTest, FlashAttentionIsNearTheReferenceAndInvariant) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  options.flash_attention = true;
  const std::unique_ptr<Backend> flash = cuda::makeCudaBackend(0, options);
  EXPECT_NE(flash->description().find("flash attention"), std::string::npos);
  EXPECT_EQ(flash->description().find("compact attention grid"), std::string::npos);
  EXPECT_EQ(flash->description().find("deep attention loads"), std::string::npos);
  for (const AttentionShape& shape : flashShapes()) {
    SCOPED_TRACE(shape.name());
    const AttentionCase attention(shape);
    const auto [reference, reference_cache] = attention.run(*backend_, AttentionCase::oneShot());
    const auto [one_shot, one_shot_cache] = attention.run(*flash, AttentionCase::oneShot());
    const auto [pieces, pieces_cache] = attention.run(*flash, chunkedFlashSteps());
    expectNear(reference, one_shot, 2e-2f);
    EXPECT_EQ(reference_cache, one_shot_cache);
    ASSERT_EQ(one_shot.size(), pieces.size());
    EXPECT_EQ(0, std::memcmp(one_shot.data(), pieces.data(), one_shot.size() * sizeof(float)));
    EXPECT_EQ(one_shot_cache, pieces_cache);
    expectFiniteAndNonZero(one_shot);
  }
}

// Candidates for the flash kernel's next defaults (opt-in until a GPU has
// passed this test; scripts/gpu-check.sh runs the Candidate tests in a step
// of their own): launched with a block per query tile and KV head going
// through a run of splits (compact_attention; on the emulator's 4 SMs every
// prefill here runs more than one split per block), a decode step's blocks
// with three tiles or their whole split in flight (deep_attention: whole
// splits where the grid has at most a block per SM, here a decode of the
// short sequence alone over 2 KV heads), and both together (as the
// candidates' bench run has them), the one-shot and chunked runs, and one
// that decodes the sequences apart, give every row the plain one-shot
// run's bits and the cache the same bytes.
TEST_F(CudaFastKernelsTest, CandidateFlashLaunchesGiveTheOneShotBits) {
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  options.flash_attention = true;
  const std::unique_ptr<Backend> flash = cuda::makeCudaBackend(0, options);
  struct Candidate {
    const char* name;
    bool compact;
    bool deep;
    std::unique_ptr<Backend> backend;
  };
  std::vector<Candidate> candidates;
  for (const auto& [name, compact, deep] :
       {std::tuple{"a block per tile", true, false},
        std::tuple{"whole splits in flight", false, true}, std::tuple{"both", true, true}}) {
    options.compact_attention = compact;
    options.deep_attention = deep;
    candidates.push_back({name, compact, deep, cuda::makeCudaBackend(0, options)});
    const std::string description = candidates.back().backend->description();
    EXPECT_EQ(description.find("compact attention grid") != std::string::npos, compact) << name;
    EXPECT_EQ(description.find("deep attention loads") != std::string::npos, deep) << name;
  }
  int64_t whole_split_steps = 0, three_tile_steps = 0;
  // Cache blocks of 16 positions, and of 12 once (the candidates find a
  // row by a shift where the block size is a power of two, else by a
  // division).
  std::vector<std::pair<AttentionShape, int32_t>> cases;
  for (const AttentionShape& shape : flashShapes()) cases.emplace_back(shape, 16);
  cases.emplace_back(AttentionShape{16, 2, 32, DType::kBF16}, 12);
  for (const auto& [shape, block_size] : cases) {
    SCOPED_TRACE(shape.name() + ", blocks of " + std::to_string(block_size));
    const AttentionCase attention(shape, block_size);
    const auto [one_shot, one_shot_cache] = attention.run(*flash, AttentionCase::oneShot());
    expectFiniteAndNonZero(one_shot);
    const std::vector<AttentionCase::Step> decode_apart = {
        {0, kLongRows, 0, kShortRows}, {kLongRows, 0, kShortRows, 1}, {kLongRows, 1, 0, 0}};
    for (const auto& steps : {AttentionCase::oneShot(), chunkedFlashSteps(), decode_apart}) {
      // Each decode step (one row per sequence: the last step of each run,
      // and the chunked run's single rows) asks for three or four tiles of
      // K and V (rows of head_dim + 8 bf16) where deep_attention is on; no
      // other step's launches take dynamic shared memory.
      const int64_t decode_steps = std::count_if(steps.begin(), steps.end(), [](const auto& step) {
        return step.long_count <= 1 && step.short_count <= 1;
      });
      const int64_t tile_bytes = 2 * 64 * (shape.head_dim + 8) * 2;
      for (const Candidate& candidate : candidates) {
        std::pair<std::vector<float>, std::vector<char>> result;
        const int64_t shared =
            dynamicSharedBytesOf([&] { result = attention.run(*candidate.backend, steps); });
        const auto& [outputs, cache] = result;
        if (kEmulated && candidate.deep) {
          // Three tiles a step, and one more for each step with whole splits.
          EXPECT_EQ(shared % tile_bytes, 0) << candidate.name;
          const int64_t whole = shared / tile_bytes - 3 * decode_steps;
          EXPECT_GE(whole, 0) << candidate.name;
          EXPECT_LE(whole, decode_steps) << candidate.name;
          whole_split_steps += whole;
          three_tile_steps += decode_steps - whole;
        } else if (kEmulated) {
          EXPECT_EQ(shared, 0) << candidate.name;
        }
        ASSERT_EQ(one_shot.size(), outputs.size());
        EXPECT_EQ(0, std::memcmp(one_shot.data(), outputs.data(), one_shot.size() * sizeof(float)))
            << candidate.name << ", " << steps.size() << " steps";
        EXPECT_EQ(one_shot_cache, cache) << candidate.name;
      }
    }
  }
  if (kEmulated) {
    EXPECT_GT(whole_split_steps, 0) << "no decode step had its whole split in flight";
    EXPECT_GT(three_tile_steps, 0) << "no decode step had three tiles in flight";
  }
}

// Every ldmatrix of the bf16 GEMM's mma.sync configurations (0 to 3, and
// the wide candidates 8 and 9: tile rows padded by 8 bf16) and of the flash
// attention kernel (K's tiles as stored, V's transposed, rows padded by 8
// bf16, at each head_dim; with the compact grid and the deep loads too)
// reads each 8 x 8 matrix in one shared-memory wavefront: no bank
// conflicts. The emulator counts them (emulator.h DeviceCounts); on a GPU
// the kernel profile does (scripts/gpu-check.sh PROFILE=1), so the test
// skips there.
TEST_F(CudaFastKernelsTest, MatrixLoadsAreFreeOfBankConflicts) {
  if (!kEmulated) GTEST_SKIP() << "bank conflicts are counted by the emulator (on a GPU, by ncu)";
  cuda::CudaBackendOptions options;
  options.fast_kernels = true;
  bf16_ = cuda::makeCudaBackend(0, options);
  bf16_->setComputeDType(DType::kBF16);
  const int64_t m = 257, n = 64, k = 200;
  const auto x = randomFloats(static_cast<size_t>(m * k), 30);
  const auto bf16 = toHalfBits(randomFloats(static_cast<size_t>(n * k), 31), DType::kBF16);
  const WeightView w{bf16.data(), DType::kBF16, n, k};
  for (int config = 0; config < kBf16GemmConfigs; ++config) {
    if (bf16GemmIsWgmma(config)) continue;  // wgmma reads its operands itself
    Backend& backend = config == kBf16GemmServing ? *bf16_ : bf16ConfigBackend(options, config);
    const RunCounts counts = countsOf([&] { run(backend, x, m, k, w); });
    EXPECT_GT(counts.matrix_loads, 0) << "configuration " << config;
    EXPECT_EQ(counts.matrix_load_conflicts, 0) << "configuration " << config;
  }
  options.flash_attention = true;
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> flash;
  for (const auto& [name, compact, deep] :
       {std::tuple{"flash", false, false}, std::tuple{"compact grid, deep loads", true, true}}) {
    options.compact_attention = compact;
    options.deep_attention = deep;
    flash.emplace_back(name, cuda::makeCudaBackend(0, options));
  }
  for (const AttentionShape& shape : flashShapes()) {
    const AttentionCase attention(shape);
    for (const auto& [name, backend] : flash) {
      const RunCounts counts = countsOf([&] { attention.run(*backend, chunkedFlashSteps()); });
      EXPECT_GT(counts.matrix_loads, 0) << name << ", " << shape.name();
      EXPECT_EQ(counts.matrix_load_conflicts, 0) << name << ", " << shape.name();
    }
  }
}

// A device copy (and, with the fast kernels, its re-laid twin) lives while
// a use of it is held; after the last release, other weights at the same
// host address are uploaded afresh, for both kernel sets.
TEST_F(CudaFastKernelsTest, WeightCopiesLiveUntilTheirLastUseIsReleased) {
  constexpr int64_t kRows = 64, kCols = 128;
  std::vector<float> host(kRows * kCols, 1.0f);
  const WeightView view{host.data(), DType::kF32, kRows, kCols, WeightLayout::kRows};
  const std::vector<float> x(kCols, 1.0f);
  for (Backend* backend : {backend_.get(), fast_.get()}) {
    SCOPED_TRACE(backend->description());
    std::fill(host.begin(), host.end(), 1.0f);
    const WeightView first = backend->matmulWeight(view);
    EXPECT_EQ(backend->matmulWeight(view).data, first.data);
    EXPECT_EQ(run(*backend, x, 1, kCols, view)[0], 128.0f);  // a third use, released below
    backend->releaseWeight(view);
    backend->releaseWeight(view);
    backend->releaseWeight(view);
    std::fill(host.begin(), host.end(), 2.0f);
    EXPECT_EQ(run(*backend, x, 1, kCols, view)[0], 256.0f) << "a stale copy was used";
    backend->releaseWeight(view);
  }
}

}  // namespace
}  // namespace tandem::kernels
