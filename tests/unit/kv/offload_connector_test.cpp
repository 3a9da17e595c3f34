// The offload connector over a real KV cache: bytes round-trip through the
// host tier, eviction is least-recently-used within the configured capacity
// (in blocks or bytes), and a block evicted between lookup and load fails
// alone and is counted.
#include "agent/kv/offload/offload_connector.h"

#include <gtest/gtest.h>

#include "tests/unit/kv/kv_test_support.h"

namespace tandem::kv {
namespace {

using namespace ::tandem::kv::testing;  // NOLINT: the test vocabulary

KvTransferConfig offloadConfig(nlohmann::json extra, const std::string& role = "kv_both") {
  return parseConfig(
      {{"kv_connector", "offload"}, {"kv_role", role}, {"kv_connector_extra_config", extra}});
}

std::string constructionError(const nlohmann::json& extra) {
  auto cache = makeCache();
  try {
    OffloadConnector connector(offloadConfig(extra), *cache);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

class OffloadTier : public ::testing::Test {
 protected:
  std::unique_ptr<engine::KvCache> cache_ = makeCache();

  // Saves one single-block request's block 0 from cache block `block`.
  static void saveOne(OffloadConnector& tier, const TestRequest& request, BlockId block) {
    const BlockId ids[] = {block};
    tier.save(request.view(), 0, ids);
  }
};

TEST_F(OffloadTier, SavedBlocksLoadBackByteForByte) {
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 8}}), *cache_);
  TestRequest request("r", 13, 10);  // 3 full blocks, all loadable
  for (BlockId block : {1, 2, 3}) fillBlock(*cache_, block, 100 + block);
  const BlockId saved[] = {1, 2, 3};
  tier.save(request.view(), 0, saved);
  EXPECT_EQ(tier.numStoredBlocks(), 3);

  LookupResult lookup = tier.lookup(request.view(), 0);
  EXPECT_EQ(lookup.state, LookupResult::State::kAvailable);
  EXPECT_EQ(lookup.num_tokens, 12);
  // After locally cached tokens, only the rest is offered.
  EXPECT_EQ(tier.lookup(request.view(), 4).num_tokens, 8);

  const BlockId targets[] = {9, 10, 11};
  LoadResult load = tier.load(request.view(), 0, targets);
  EXPECT_TRUE(load.done);
  EXPECT_TRUE(load.failed_block_indices.empty());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(blockBytes(*cache_, targets[i]), blockBytes(*cache_, saved[i])) << "block " << i;
  }
  EXPECT_TRUE(tier.failureCounts().empty());
}

// A GPU's KV cache: the tier copies its blocks through the backend.
TEST_F(OffloadTier, ADeviceCachesBlocksGoThroughItsBackend) {
  DeviceLikeBackend device;
  cache_->attachBackend(&device);
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 8}}), *cache_);
  TestRequest request("r", 13, 10);
  for (BlockId block : {1, 2, 3}) fillBlock(*cache_, block, 100 + block);
  const BlockId saved[] = {1, 2, 3};
  tier.save(request.view(), 0, saved);
  EXPECT_EQ(device.reads, 3);
  const BlockId targets[] = {9, 10, 11};
  EXPECT_TRUE(tier.load(request.view(), 0, targets).failed_block_indices.empty());
  EXPECT_EQ(device.writes, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(blockBytes(*cache_, targets[i]), blockBytes(*cache_, saved[i])) << "block " << i;
  }
}

// A device copy that fails while the tier saves leaves the tier as it was
// (full here: the save would have evicted a block), and the tier goes on.
TEST_F(OffloadTier, AFailedDeviceCopyLeavesTheTierAsItWas) {
  DeviceLikeBackend device;
  cache_->attachBackend(&device);
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 3}}), *cache_);
  TestRequest request("r", 13, 10);
  for (BlockId block : {1, 2, 3}) fillBlock(*cache_, block, 100 + block);
  const BlockId saved[] = {1, 2, 3};
  tier.save(request.view(), 0, saved);
  TestRequest other("o", 5, 500);
  fillBlock(*cache_, 4, 7);
  device.fail_reads = true;
  EXPECT_THROW(saveOne(tier, other, 4), Error);
  device.fail_reads = false;
  EXPECT_EQ(tier.numStoredBlocks(), 3);
  EXPECT_EQ(tier.lookup(other.view(), 0).state, LookupResult::State::kNone);
  ASSERT_EQ(tier.lookup(request.view(), 0).num_tokens, 12) << "nothing was evicted";
  const BlockId targets[] = {9, 10, 11};
  EXPECT_TRUE(tier.load(request.view(), 0, targets).failed_block_indices.empty());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(blockBytes(*cache_, targets[i]), blockBytes(*cache_, saved[i])) << "block " << i;
  }
  saveOne(tier, other, 4);  // evicts the least recently used, as before
  EXPECT_EQ(tier.numStoredBlocks(), 3);
  EXPECT_EQ(tier.lookup(other.view(), 0).num_tokens, 4);
}

TEST_F(OffloadTier, LookupNeverReachesTheLastTokenAndStopsAtTheFirstMissingBlock) {
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 8}}), *cache_);
  TestRequest exact("exact", 12, 10);  // 3 full blocks; the last token must be computed
  const BlockId blocks[] = {1, 2, 3};
  tier.save(exact.view(), 0, blocks);
  EXPECT_EQ(tier.lookup(exact.view(), 0).num_tokens, 8);

  TestRequest longer("longer", 21, 10);  // same first 3 blocks, then 2 more
  const BlockId tail[] = {4};
  tier.save(longer.view(), 4, tail);  // block 4 present, block 3 missing
  EXPECT_EQ(tier.lookup(longer.view(), 0).num_tokens, 12);
  EXPECT_EQ(tier.lookup(longer.view(), 12).state, LookupResult::State::kNone);

  TestRequest unknown("unknown", 13, 500);
  EXPECT_EQ(tier.lookup(unknown.view(), 0).state, LookupResult::State::kNone);
}

TEST_F(OffloadTier, EvictsTheLeastRecentlyUsedBlock) {
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 3}}), *cache_);
  TestRequest x("x", 5, 100), y("y", 5, 200), z("z", 5, 300), w("w", 5, 400), v("v", 5, 500),
      u("u", 5, 600);
  for (BlockId block = 1; block <= 6; ++block) fillBlock(*cache_, block, block);
  saveOne(tier, x, 1);
  saveOne(tier, y, 2);
  saveOne(tier, z, 3);  // recency: z y x
  saveOne(tier, x, 1);  // present: refreshed only; x z y
  EXPECT_EQ(tier.numStoredBlocks(), 3);
  saveOne(tier, w, 4);  // evicts y; w x z
  EXPECT_FALSE(tier.contains(y.hashes[0]));
  EXPECT_TRUE(tier.contains(x.hashes[0]));
  EXPECT_TRUE(tier.contains(z.hashes[0]));

  const BlockId target[] = {10};
  EXPECT_TRUE(tier.load(z.view(), 0, target).failed_block_indices.empty());  // z w x
  EXPECT_EQ(blockBytes(*cache_, 10), blockBytes(*cache_, 3));
  saveOne(tier, v, 5);  // evicts x; v z w
  EXPECT_FALSE(tier.contains(x.hashes[0]));

  // A lookup does not count as a use.
  EXPECT_EQ(tier.lookup(w.view(), 0).num_tokens, 4);
  saveOne(tier, u, 6);  // evicts w; u v z
  EXPECT_FALSE(tier.contains(w.hashes[0]));
  EXPECT_EQ(tier.numStoredBlocks(), 3);

  // Reused slots hold the new blocks' bytes.
  for (auto [request, source] : {std::pair{&v, 5}, std::pair{&u, 6}, std::pair{&z, 3}}) {
    EXPECT_TRUE(tier.load(request->view(), 0, target).failed_block_indices.empty());
    EXPECT_EQ(blockBytes(*cache_, 10), blockBytes(*cache_, source)) << request->id;
  }
}

TEST_F(OffloadTier, CapacityInBytesIsRoundedDownToWholeBlocks) {
  const int64_t block_bytes = static_cast<int64_t>(cache_->blockBytes());
  OffloadConnector tier(offloadConfig({{"capacity_bytes", 2 * block_bytes + block_bytes / 2}}),
                        *cache_);
  EXPECT_EQ(tier.capacityBlocks(), 2);
  TestRequest a("a", 5, 100), b("b", 5, 200), c("c", 5, 300);
  saveOne(tier, a, 1);
  saveOne(tier, b, 2);
  saveOne(tier, c, 3);
  EXPECT_EQ(tier.numStoredBlocks(), 2);
  EXPECT_FALSE(tier.contains(a.hashes[0]));
}

TEST_F(OffloadTier, BlockEvictedBetweenLookupAndLoadFailsAloneAndIsCounted) {
  OffloadConnector tier(offloadConfig({{"capacity_blocks", 3}}), *cache_);
  TestRequest request("r", 13, 10);
  for (BlockId block : {1, 2, 3, 4}) fillBlock(*cache_, block, 50 + block);
  const BlockId saved[] = {1, 2, 3};
  tier.save(request.view(), 0, saved);  // recency: 2 1 0
  ASSERT_EQ(tier.lookup(request.view(), 0).num_tokens, 12);

  tier.save(request.view(), 0, std::span<const BlockId>(saved, 1));  // 0 2 1
  TestRequest other("other", 5, 900);
  saveOne(tier, other, 4);  // evicts block 1 of the request

  const BlockId targets[] = {9, 10, 11};
  LoadResult load = tier.load(request.view(), 0, targets);
  EXPECT_EQ(load.failed_block_indices, std::vector<int64_t>{1});
  EXPECT_EQ(blockBytes(*cache_, 9), blockBytes(*cache_, 1));
  EXPECT_EQ(blockBytes(*cache_, 11), blockBytes(*cache_, 3));
  EXPECT_EQ(tier.failureCounts(), (std::map<std::string, int64_t>{{"evicted", 1}}));
}

TEST_F(OffloadTier, RolesLimitSavingAndLoading) {
  TestRequest request("r", 9, 10);
  const BlockId blocks[] = {1, 2};
  OffloadConnector consumer(offloadConfig({{"capacity_blocks", 4}}, "kv_consumer"), *cache_);
  consumer.save(request.view(), 0, blocks);
  EXPECT_EQ(consumer.numStoredBlocks(), 0);

  OffloadConnector producer(offloadConfig({{"capacity_blocks", 4}}, "kv_producer"), *cache_);
  producer.save(request.view(), 0, blocks);
  EXPECT_EQ(producer.numStoredBlocks(), 2);
  EXPECT_EQ(producer.lookup(request.view(), 0).state, LookupResult::State::kNone);
}

TEST(OffloadConfig, CapacityErrorsNameTheFieldAndWhatIsAccepted) {
  const std::string accepted = "exactly one of capacity_blocks";
  EXPECT_NE(constructionError(nlohmann::json::object()).find(accepted), std::string::npos);
  EXPECT_NE(constructionError({{"capacity_blocks", 4}, {"capacity_bytes", 4096}}).find("got both"),
            std::string::npos);
  EXPECT_NE(
      constructionError({{"capacity_blocks", 0}})
          .find("kv_connector_extra_config.capacity_blocks must be a positive integer, got 0"),
      std::string::npos);
  EXPECT_NE(constructionError({{"capacity_bytes", "1GiB"}})
                .find("kv_connector_extra_config.capacity_bytes must be a positive integer"),
            std::string::npos);
  EXPECT_NE(constructionError({{"capacity_bytes", 10}}).find("capacity_bytes 10 holds no KV block"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::kv
