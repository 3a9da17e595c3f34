// The storage connector's capacity: a saving agent keeps the block files it
// knows of within capacity_blocks / capacity_bytes, removing the least
// recently used (written or loaded), also files found at start (oldest
// modification time first); without a capacity nothing is removed; a bad
// capacity is refused naming the field.
#include "agent/kv/storage/storage_connector.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "tests/support/test_files.h"
#include "tests/unit/kv/kv_test_support.h"

namespace tandem::kv {
namespace {

using namespace ::tandem::kv::testing;  // NOLINT: the test vocabulary
namespace fs = std::filesystem;

KvTransferConfig storageConfig(const fs::path& root, nlohmann::json capacity = {},
                               const std::string& role = "kv_both") {
  nlohmann::json extra = capacity.is_object() ? capacity : nlohmann::json::object();
  extra["shared_storage_path"] = root.string();
  return parseConfig(
      {{"kv_connector", "storage"}, {"kv_role", role}, {"kv_connector_extra_config", extra}});
}

class StorageCapacity : public ::testing::Test {
 protected:
  // Saves one single-block request's block 0 from cache block `block`.
  void saveOne(StorageConnector& storage, const TestRequest& request, BlockId block) {
    fillBlock(*cache_, block, static_cast<uint32_t>(block));
    const BlockId ids[] = {block};
    storage.save(request.view(), 0, ids);
  }
  bool stored(const StorageConnector& storage, const TestRequest& request) const {
    return fs::exists(storage.blockPath(request.hashes[0]));
  }
  bool loads(StorageConnector& storage, const TestRequest& request) {
    const BlockId target[] = {15};
    return storage.load(request.view(), 0, target).failed_block_indices.empty();
  }

  ::tandem::testing::TempDir dir_{"tandem-storage"};
  std::unique_ptr<engine::KvCache> cache_ = makeCache();
};

// A GPU's KV cache: block files are written from and read into it through
// the backend, and a file that fails its checksum leaves the block alone.
TEST_F(StorageCapacity, ADeviceCachesBlocksGoThroughItsBackend) {
  DeviceLikeBackend device;
  cache_->attachBackend(&device);
  StorageConnector storage(storageConfig(dir_.path()), *cache_);
  TestRequest request("r", 9, 10);
  for (BlockId block : {1, 2}) fillBlock(*cache_, block, 50 + block);
  const BlockId saved[] = {1, 2};
  storage.save(request.view(), 0, saved);
  EXPECT_EQ(device.reads, 2);
  const BlockId targets[] = {9, 10};
  EXPECT_TRUE(storage.load(request.view(), 0, targets).failed_block_indices.empty());
  EXPECT_EQ(device.writes, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(blockBytes(*cache_, targets[i]), blockBytes(*cache_, saved[i])) << "block " << i;
  }
  {
    std::fstream file(storage.blockPath(request.hashes[1]),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char last = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(~last));  // one bit pattern the checksum does not match
  }
  fillBlock(*cache_, 12, 7);
  const std::vector<uint8_t> before = blockBytes(*cache_, 12);
  const BlockId damaged[] = {12};
  EXPECT_EQ(storage.load(request.view(), 1, damaged).failed_block_indices, std::vector<int64_t>{1});
  EXPECT_EQ(blockBytes(*cache_, 12), before) << "a failed block is not written";
  EXPECT_EQ(device.writes, 2);
}

TEST_F(StorageCapacity, RemovesTheLeastRecentlyUsedBlockFiles) {
  StorageConnector storage(storageConfig(dir_.path(), {{"capacity_blocks", 3}}), *cache_);
  EXPECT_EQ(storage.capacityBlocks(), 3);
  TestRequest x("x", 5, 100), y("y", 5, 200), z("z", 5, 300), w("w", 5, 400), v("v", 5, 500);
  saveOne(storage, x, 1);
  saveOne(storage, y, 2);
  saveOne(storage, z, 3);          // recency: z y x
  ASSERT_TRUE(loads(storage, x));  // x z y
  saveOne(storage, w, 4);          // removes y: w x z
  EXPECT_FALSE(stored(storage, y));
  for (const TestRequest* kept : {&x, &z, &w}) EXPECT_TRUE(stored(storage, *kept)) << kept->id;
  saveOne(storage, z, 3);  // already there: a use; z w x
  saveOne(storage, v, 5);  // removes x: v z w
  EXPECT_FALSE(stored(storage, x));
  EXPECT_FALSE(loads(storage, x));  // a removed block fails alone ("missing")
  for (const TestRequest* kept : {&z, &w, &v}) EXPECT_TRUE(loads(storage, *kept)) << kept->id;
}

TEST_F(StorageCapacity, FilesFoundAtStartCountOldestFirst) {
  TestRequest a("a", 5, 100), b("b", 5, 200), c("c", 5, 300);
  {
    StorageConnector unbounded(storageConfig(dir_.path()), *cache_);
    EXPECT_EQ(unbounded.capacityBlocks(), 0);
    for (auto [request, block] : {std::pair{&a, 1}, std::pair{&b, 2}, std::pair{&c, 3}}) {
      saveOne(unbounded, *request, block);
    }
    // Without a capacity nothing is removed.
    for (const TestRequest* kept : {&a, &b, &c}) EXPECT_TRUE(stored(unbounded, *kept));
    // Modification times: b oldest, then c, then a.
    const auto now = fs::file_time_type::clock::now();
    fs::last_write_time(unbounded.blockPath(b.hashes[0]), now - std::chrono::hours(3));
    fs::last_write_time(unbounded.blockPath(c.hashes[0]), now - std::chrono::hours(2));
    fs::last_write_time(unbounded.blockPath(a.hashes[0]), now - std::chrono::hours(1));
  }
  // A consumer never removes anything, whatever its capacity.
  StorageConnector reader(storageConfig(dir_.path(), {{"capacity_blocks", 1}}, "kv_consumer"),
                          *cache_);
  for (const TestRequest* kept : {&a, &b, &c}) EXPECT_TRUE(stored(reader, *kept));
  EXPECT_EQ(reader.capacityBlocks(), 0);
  for (const TestRequest* request : {&a, &b, &c}) EXPECT_TRUE(loads(reader, *request));
  for (const TestRequest* kept : {&a, &b, &c}) EXPECT_TRUE(stored(reader, *kept));

  const int64_t file_bytes = static_cast<int64_t>(24 + cache_->blockBytes());
  StorageConnector storage(
      storageConfig(dir_.path(), {{"capacity_bytes", 2 * file_bytes + file_bytes / 2}}), *cache_);
  EXPECT_EQ(storage.capacityBlocks(), 2);
  EXPECT_FALSE(stored(storage, b));
  EXPECT_TRUE(stored(storage, c));
  EXPECT_TRUE(stored(storage, a));
  ASSERT_TRUE(loads(storage, c));  // a load is a use: c a
  TestRequest d("d", 5, 400);
  saveOne(storage, d, 4);  // removes a: d c
  EXPECT_FALSE(stored(storage, a));
  EXPECT_TRUE(stored(storage, c));
}

// A block file that cannot be looked at (here a symlink loop where its
// directory should be; a directory this user may not read, or a stale NFS
// handle, fail the same stat) is absent: the lookup stops before it, a
// save skips it, the failure is counted, and nothing throws on the engine
// thread.
TEST_F(StorageCapacity, ABlockFileThatCannotBeLookedAtIsAbsent) {
  StorageConnector storage(storageConfig(dir_.path()), *cache_);
  TestRequest request("r", 3 * kBlockSize + 1, 100);
  fillBlock(*cache_, 1, 1);
  fillBlock(*cache_, 2, 2);
  fillBlock(*cache_, 3, 3);
  const BlockId first[] = {1};
  storage.save(request.view(), 0, first);
  const fs::path second_dir = storage.blockPath(request.hashes[1]).parent_path();
  if (second_dir == storage.blockPath(request.hashes[0]).parent_path()) {
    GTEST_SKIP() << "the first two blocks share a directory";
  }
  fs::create_directory_symlink(second_dir.filename(), second_dir);  // points at itself
  const BlockId rest[] = {2, 3};
  EXPECT_NO_THROW(storage.save(request.view(), 1, rest));
  kv::LookupResult lookup;
  EXPECT_NO_THROW(lookup = storage.lookup(request.view(), 0));
  EXPECT_EQ(lookup.state, kv::LookupResult::State::kAvailable);
  EXPECT_EQ(lookup.num_tokens, kBlockSize) << "only the block before the unreadable one";
  EXPECT_GE(storage.failureCounts()["unreadable"], 2);
}

TEST(StorageConfig, CapacityErrorsNameTheFieldAndWhatIsAccepted) {
  ::tandem::testing::TempDir dir("tandem-storage");
  auto cache = makeCache();
  auto error = [&](const nlohmann::json& capacity) -> std::string {
    try {
      StorageConnector storage(storageConfig(dir.path(), capacity), *cache);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error({{"capacity_blocks", 4}, {"capacity_bytes", 1 << 20}}),
            "storage connector: kv_connector_extra_config needs at most one of capacity_blocks (a "
            "positive number of blocks) or capacity_bytes (a positive number of bytes), got both");
  EXPECT_EQ(error({{"capacity_blocks", 0}}),
            "storage connector: kv_connector_extra_config.capacity_blocks must be a positive "
            "integer, got 0");
  EXPECT_NE(error({{"capacity_bytes", 10}}).find("capacity_bytes 10 holds no KV block"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::kv
