#include "operator/router/holder_table.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace tandem::router {
namespace {

// What the table should say, kept the slow way.
using Reference = std::unordered_map<BlockHash, std::vector<bool>>;

void expectSame(const HolderTable& table, const Reference& reference,
                const std::vector<BlockHash>& keys, size_t slots) {
  size_t entries = 0;
  for (const BlockHash& key : keys) {
    const uint64_t* bits = table.find(key);
    auto it = reference.find(key);
    bool any = false;
    for (size_t slot = 0; slot < slots; ++slot) {
      const bool want = it != reference.end() && it->second[slot];
      any = any || want;
      const size_t word = slot / HolderTable::kSlotsPerWord;
      const bool got = bits != nullptr && word < table.words() &&
                       ((bits[word] >> (slot % HolderTable::kSlotsPerWord)) & 1U) != 0;
      ASSERT_EQ(got, want) << key.toHex() << " slot " << slot;
    }
    ASSERT_EQ(bits != nullptr, any)
        << key.toHex() << ": an entry exists exactly while a bit is set";
    if (any) ++entries;
  }
  EXPECT_EQ(table.size(), entries);
}

void run(const std::vector<BlockHash>& keys, size_t slots, int operations, uint32_t seed) {
  HolderTable table;
  Reference reference;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick_key(0, keys.size() - 1);
  std::uniform_int_distribution<size_t> pick_slot(0, slots - 1);
  for (int op = 0; op < operations; ++op) {
    const BlockHash& key = keys[pick_key(rng)];
    const size_t slot = pick_slot(rng);
    // Slightly more sets than resets, so the table fills and empties.
    const bool set = rng() % 100 < (op < operations / 2 ? 60 : 35);
    auto& bits = reference[key];
    bits.resize(slots, false);
    if (set) {
      table.set(key, slot);
      bits[slot] = true;
    } else {
      table.reset(key, slot);
      bits[slot] = false;
    }
    if (op % 997 == 0) expectSame(table, reference, keys, slots);
  }
  expectSame(table, reference, keys, slots);
}

TEST(HolderTableTest, AgreesWithAMapUnderRandomSetsAndResets) {
  std::mt19937_64 rng(7);
  std::vector<BlockHash> keys(3000);
  for (BlockHash& key : keys) key = BlockHash{rng(), rng()};
  run(keys, 8, 60000, 1);
}

TEST(HolderTableTest, KeysThatShareAHomeSurviveDeletionsInTheMiddleOfTheirRun) {
  // high = 0 and equal low bits: every key starts probing at the same few
  // entries, so removals must shift the runs back (and across the wrap).
  std::vector<BlockHash> keys;
  for (uint64_t i = 0; i < 400; ++i) keys.push_back(BlockHash{0, (i << 20) | (i % 3)});
  for (uint64_t i = 0; i < 40; ++i) keys.push_back(BlockHash{0, (i << 20) | 63});
  run(keys, 3, 40000, 2);
}

TEST(HolderTableTest, SlotsBeyondTheFirstWordGrowEveryEntry) {
  std::mt19937_64 rng(9);
  std::vector<BlockHash> keys(500);
  for (BlockHash& key : keys) key = BlockHash{rng(), rng()};
  run(keys, 150, 30000, 3);
  HolderTable table;
  table.set(keys[0], 3);
  table.set(keys[1], 130);
  EXPECT_EQ(table.words(), 3U);
  ASSERT_NE(table.find(keys[0]), nullptr);
  EXPECT_EQ(table.find(keys[0])[0], uint64_t{1} << 3) << "bits kept across the regrowth";
  table.reset(keys[1], 130);
  EXPECT_EQ(table.find(keys[1]), nullptr);
  EXPECT_EQ(table.size(), 1U);
}

TEST(HolderTableTest, AnEmptyTableFindsNothingAndIgnoresResets) {
  HolderTable table;
  EXPECT_EQ(table.find(BlockHash{1, 2}), nullptr);
  table.reset(BlockHash{1, 2}, 5);
  table.prefetch(BlockHash{1, 2});
  EXPECT_EQ(table.size(), 0U);
}

}  // namespace
}  // namespace tandem::router
