#include "agent/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/host_memory.h"
#include "common/status.h"

namespace tandem::engine {
namespace {

KvCacheConfig smallConfig() {
  KvCacheConfig config;
  config.num_blocks = 5;
  config.block_size = 16;
  config.dtype = DType::kBF16;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 8;
  return config;
}

// Counts calls so the test can prove the cache used the allocator it was given.
class CountingAllocator : public KvSlabAllocator {
 public:
  explicit CountingAllocator(int* live) : live_(live) {}
  void* allocate(size_t bytes) override {
    ++*live_;
    last_bytes = bytes;
    return std::calloc(1, bytes);
  }
  void release(void* data, size_t bytes) override {
    --*live_;
    EXPECT_EQ(bytes, last_bytes);
    std::free(data);
  }
  std::string name() const override { return "counting"; }
  size_t last_bytes = 0;

 private:
  int* live_;
};

class FailingAllocator : public KvSlabAllocator {
 public:
  void* allocate(size_t) override { return nullptr; }
  void release(void*, size_t) override {}
  std::string name() const override { return "failing"; }
};

TEST(KvCache, BlockMajorGeometry) {
  KvCache cache(smallConfig(), std::make_unique<HostSlabAllocator>());
  // 2 (K,V) x 2 layers x 16 tokens x 2 heads x 8 dims x 2 bytes.
  EXPECT_EQ(cache.blockBytes(), size_t{2 * 2 * 16 * 2 * 8 * 2});
  EXPECT_EQ(cache.slabBytes(), cache.blockBytes() * 5);
  EXPECT_EQ(cache.blockData(3) - cache.blockData(0),
            static_cast<ptrdiff_t>(3 * cache.blockBytes()));
  kernels::KvCacheLayout layout = cache.layout();
  EXPECT_EQ(layout.base, cache.slab());
  EXPECT_EQ(layout.blockBytes(), static_cast<int64_t>(cache.blockBytes()));
  EXPECT_EQ(layout.num_blocks, 5);
  // Fresh slabs are zero-filled, so untouched slots compare equal across caches.
  for (size_t i = 0; i < cache.slabBytes(); ++i) ASSERT_EQ(cache.slab()[i], 0) << i;
}

TEST(KvCache, UsesTheGivenAllocatorAndReleasesOnce) {
  int live = 0;
  {
    auto allocator = std::make_unique<CountingAllocator>(&live);
    KvCache cache(smallConfig(), std::move(allocator));
    EXPECT_EQ(live, 1);
    EXPECT_EQ(cache.allocator().name(), "counting");
  }
  EXPECT_EQ(live, 0);
}

TEST(KvCache, BlocksForBytes) {
  KvCacheConfig config = smallConfig();
  const int64_t block = config.blockBytes();
  EXPECT_EQ(config.blocksForBytes(block * 7 + block / 2), 7);
  EXPECT_EQ(config.blocksForBytes(block - 1), 0);
  EXPECT_EQ(config.blocksForBytes(-5), 0);
}

TEST(KvCache, RefusesBadConfigurations) {
  KvCacheConfig config = smallConfig();
  config.dtype = DType::kF16;
  try {
    KvCache cache(config, std::make_unique<HostSlabAllocator>());
    FAIL() << "f16 KV cache accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be f32, bf16 or fp8, got f16"), std::string::npos);
  }
  config = smallConfig();
  config.num_blocks = 0;
  EXPECT_THROW(KvCache(config, std::make_unique<HostSlabAllocator>()), Error);
  try {
    KvCache cache(smallConfig(), std::make_unique<FailingAllocator>());
    FAIL() << "failed allocation not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failing allocator"), std::string::npos) << e.what();
  }
}

// Host memory committed at once (UCX's shared-memory slab) or as it is
// touched: a slab larger than the host's memory is refused before the
// allocator is asked, naming the KV cache and the figure it exceeds. Before,
// a UCX slab larger than RAM filled /dev/shm until the OOM killer came,
// killing other processes and leaving the file behind.
class HostCommitAllocator : public CountingAllocator {
 public:
  HostCommitAllocator(int* live, bool committed) : CountingAllocator(live), committed_(committed) {}
  std::optional<bool> commitsHostMemory() const override { return committed_; }

 private:
  bool committed_;
};

TEST(KvCache, ASlabLargerThanTheHostsMemoryIsRefusedBeforeItIsAllocated) {
  const std::optional<uint64_t> total = memInfoBytes("MemTotal");
  const std::optional<uint64_t> available = memInfoBytes("MemAvailable");
  ASSERT_TRUE(total && available);
  ASSERT_GT(*total, 0u);
  for (bool committed : {false, true}) {
    SCOPED_TRACE(committed ? "committed" : "lazy");
    KvCacheConfig config = smallConfig();
    // More blocks than the host's memory holds.
    config.num_blocks = static_cast<int64_t>(*total / config.blockBytes() + 1);
    int live = 0;
    try {
      KvCache cache(config, std::make_unique<HostCommitAllocator>(&live, committed));
      FAIL() << "a slab larger than the host's memory was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the KV cache of " + std::to_string(config.num_blocks) + " blocks"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("it cannot fit"), std::string::npos) << what;
    }
    EXPECT_EQ(live, 0) << "the allocator was asked";
  }
  // Committed at once, more than is available now (yet within MemTotal when
  // the host's memory is in use) is refused too; lazily, it is allowed.
  if (*available + (64u << 20) < *total) {
    KvCacheConfig config = smallConfig();
    config.num_blocks = static_cast<int64_t>((*available + (32u << 20)) / config.blockBytes());
    int live = 0;
    EXPECT_THROW(KvCache(config, std::make_unique<HostCommitAllocator>(&live, true)), Error);
    EXPECT_EQ(live, 0);
  }
  // A small slab is allocated.
  int live = 0;
  {
    KvCache cache(smallConfig(), std::make_unique<HostCommitAllocator>(&live, true));
    EXPECT_EQ(live, 1);
  }
  EXPECT_EQ(live, 0);
}

// An fp8 cache holds one byte per element and hands the kernels its
// per-layer K/V scales; other dtypes ignore scales.
TEST(KvCache, Fp8CachesHalveBf16BlocksAndCarryTheirScales) {
  KvCacheConfig config = smallConfig();
  const int64_t bf16_block = config.blockBytes();
  config.dtype = DType::kF8E4M3;
  EXPECT_EQ(config.blockBytes() * 2, bf16_block);
  {
    KvCache cache(config, std::make_unique<HostSlabAllocator>());
    EXPECT_EQ(cache.layout().scales, nullptr);
    EXPECT_EQ(cache.layout().scale(1, 1), 1.0f);
  }
  config.scales = {0.5f, 0.25f, 3.0f, 0.125f};
  KvCache cache(config, std::make_unique<HostSlabAllocator>());
  const kernels::KvCacheLayout layout = cache.layout();
  EXPECT_EQ(layout.scale(0, 0), 0.5f);
  EXPECT_EQ(layout.scale(0, 1), 0.25f);
  EXPECT_EQ(layout.scale(1, 0), 3.0f);
  EXPECT_EQ(layout.scale(1, 1), 0.125f);
  config.dtype = DType::kBF16;
  EXPECT_EQ(KvCache(config, std::make_unique<HostSlabAllocator>()).layout().scale(1, 0), 1.0f);
}

TEST(KvCache, RefusesFp8ScalesItCannotUse) {
  struct Case {
    std::vector<float> scales;
    const char* message;
  };
  const Case cases[] = {
      {{0.5f, 0.5f}, "an fp8 KV cache of 2 layers needs 4 K/V scales, got 2"},
      {{0.5f, 0.5f, 0.0f, 0.5f}, "fp8 KV cache K scale of layer 1 is 0.000000"},
      {{0.5f, -1.0f, 0.5f, 0.5f}, "fp8 KV cache V scale of layer 0 is -1.000000"},
      {{0.5f, 0.5f, 0.5f, std::nanf("")}, "V scale of layer 1 is nan"},
      {{0.5f, 0.5f, 2e36f, 0.5f}, "(accepted: from 1e-30 to 1e36)"},
      {{0.5f, 1e-31f, 0.5f, 0.5f}, "V scale of layer 0 is 0.000000 (accepted: from 1e-30 to 1e36)"},
  };
  for (const Case& c : cases) {
    KvCacheConfig config = smallConfig();
    config.dtype = DType::kF8E4M3;
    config.scales = c.scales;
    try {
      KvCache cache(config, std::make_unique<HostSlabAllocator>());
      ADD_FAILURE() << "accepted scales for: " << c.message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

TEST(KvCache, KvDtypeNamesAreTheOptionValues) {
  EXPECT_EQ(kvDtypeFromName("bf16"), DType::kBF16);
  EXPECT_EQ(kvDtypeFromName("f32"), DType::kF32);
  EXPECT_EQ(kvDtypeFromName("fp8"), DType::kF8E4M3);
  for (const char* bad : {"f16", "f8e4m3", "fp8_e5m2", "FP8", ""}) {
    try {
      kvDtypeFromName(bad, "--kv-dtype");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--kv-dtype must be bf16, f32 or fp8 (e4m3), got \"") + bad + "\"");
    }
  }
}

}  // namespace
}  // namespace tandem::engine
