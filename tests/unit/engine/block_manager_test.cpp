#include "agent/engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "agent/engine/kv_events.h"

namespace tandem::engine {
namespace {

BlockManagerConfig makeConfig(int64_t num_blocks, int32_t block_size) {
  BlockManagerConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.model_identity = "test-model";
  return config;
}

// Tokens start..start+count-1.
std::vector<TokenId> iota(int count, TokenId start) {
  std::vector<TokenId> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), start);
  return tokens;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Everything observable about the manager, to prove an operation changed
// nothing.
struct Snapshot {
  int64_t num_free;
  std::vector<int32_t> ref_counts;
  std::vector<std::optional<BlockHash>> hashes;
  uint64_t last_event;
  int64_t query_tokens;
  int64_t hit_tokens;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const BlockManager& manager, const KvEventLog& log) {
  Snapshot s{
      manager.numFreeBlocks(),       {}, {}, log.lastSequence(), manager.prefixCacheQueryTokens(),
      manager.prefixCacheHitTokens()};
  for (BlockId b = 0; b < manager.numBlocks(); ++b) {
    s.ref_counts.push_back(manager.refCount(b));
    s.hashes.push_back(manager.cachedHash(b));
  }
  return s;
}

std::vector<KvEvent> allEvents(const KvEventLog& log) {
  KvEventPage page = log.eventsSince(0, 1u << 30);
  EXPECT_FALSE(page.needs_snapshot);
  return page.events;
}

// Replays events into the set of hashes a router would believe cached.
std::unordered_set<BlockHash> replay(const std::vector<KvEvent>& events) {
  std::unordered_set<BlockHash> cached;
  for (const KvEvent& event : events) {
    if (const auto* stored = std::get_if<BlockStored>(&event.data)) {
      for (const BlockHash& h : stored->block_hashes) EXPECT_TRUE(cached.insert(h).second);
    } else if (const auto* removed = std::get_if<BlockRemoved>(&event.data)) {
      for (const BlockHash& h : removed->block_hashes) EXPECT_EQ(cached.erase(h), 1u);
    } else {
      cached.clear();
    }
  }
  return cached;
}

std::unordered_set<BlockHash> asSet(const std::vector<BlockHash>& hashes) {
  return {hashes.begin(), hashes.end()};
}

// Allocates a prompt with whatever the cache holds and marks it computed.
SequenceBlocks runPrompt(BlockManager& manager, const std::vector<TokenId>& prompt,
                         std::string_view salt = "") {
  SequenceBlocks seq;
  PrefixMatch match = manager.findCachedPrefix(prompt, salt);
  EXPECT_TRUE(manager.allocate(seq, &match, std::ssize(prompt)));
  manager.countPrefixQuery(match, seq.num_cached_tokens);  // as the scheduler's first admission
  manager.cacheFullBlocks(seq, prompt, std::ssize(prompt), salt);
  return seq;
}

TEST(BlockManager, StartsAllFree) {
  BlockManager manager(makeConfig(8, 4));
  EXPECT_EQ(manager.numFreeBlocks(), 8);
  EXPECT_DOUBLE_EQ(manager.usage(), 0.0);
  EXPECT_TRUE(manager.cachedHashes().empty());
  EXPECT_THROW(BlockManager(makeConfig(0, 4)), Error);
  EXPECT_THROW(BlockManager(makeConfig(4, 0)), Error);
}

TEST(BlockManager, AllocatesAndFreesWholeBlocks) {
  BlockManager manager(makeConfig(8, 4));
  SequenceBlocks seq;
  ASSERT_TRUE(manager.allocate(seq, nullptr, 5));
  EXPECT_EQ(seq.blocks.size(), 2u);
  EXPECT_EQ(manager.numFreeBlocks(), 6);
  ASSERT_TRUE(manager.allocate(seq, nullptr, 8));  // still fits in two blocks
  EXPECT_EQ(seq.blocks.size(), 2u);
  ASSERT_TRUE(manager.allocate(seq, nullptr, 9));
  EXPECT_EQ(seq.blocks.size(), 3u);
  EXPECT_DOUBLE_EQ(manager.usage(), 3.0 / 8.0);
  std::set<BlockId> distinct(seq.blocks.begin(), seq.blocks.end());
  EXPECT_EQ(distinct.size(), 3u);
  for (BlockId b : seq.blocks) EXPECT_EQ(manager.refCount(b), 1);
  manager.free(seq);
  EXPECT_TRUE(seq.blocks.empty());
  EXPECT_EQ(manager.numFreeBlocks(), 8);
  EXPECT_DOUBLE_EQ(manager.usage(), 0.0);
}

// Speculative decoding's blocks: drafts take only free blocks that hold no
// cached prefix (the free list's leading run without a hash), and the
// blocks of drafts not accepted go back to the front of the free list.
TEST(BlockManager, DraftBlocksEvictNothingAndGoBack) {
  KvEventLog log;
  BlockManager manager(makeConfig(6, 4), &log);
  EXPECT_EQ(manager.freeBlocksWithoutEviction(10), 6);
  EXPECT_EQ(manager.freeBlocksWithoutEviction(2), 2);
  // Four blocks cached and freed: two free blocks are left without a hash.
  SequenceBlocks cached;
  ASSERT_TRUE(manager.allocate(cached, nullptr, 16));
  manager.cacheFullBlocks(cached, iota(17, 1), 16, "");
  manager.free(cached);
  EXPECT_EQ(manager.numFreeBlocks(), 6);
  EXPECT_EQ(manager.freeBlocksWithoutEviction(10), 2);

  SequenceBlocks seq;
  ASSERT_TRUE(manager.allocate(seq, nullptr, 3));
  EXPECT_EQ(manager.freeBlocksWithoutEviction(10), 1);
  const Snapshot before = snapshot(manager, log);
  ASSERT_TRUE(manager.allocate(seq, nullptr, 7));  // a draft's block
  EXPECT_EQ(manager.freeBlocksWithoutEviction(10), 0);
  EXPECT_EQ(manager.cachedHashes().size(), 4u);  // nothing evicted
  manager.truncate(seq, 1);
  EXPECT_EQ(seq.blocks.size(), 1u);
  EXPECT_EQ(snapshot(manager, log), before);
  EXPECT_EQ(manager.freeBlocksWithoutEviction(10), 1);
  // A registered block is never truncated away.
  manager.cacheFullBlocks(seq, iota(4, 50), 4, "");
  EXPECT_DEATH(manager.truncate(seq, 0), "below its registered prefix");
  manager.free(seq);
}

TEST(BlockManager, SecondSequenceSharesTenBlockPrefix) {
  KvEventLog log;
  BlockManager manager(makeConfig(64, 16), &log);
  const std::vector<TokenId> prefix = iota(10 * 16, 1000);
  const std::vector<TokenId> prompt_a = concat(prefix, iota(21, 5000));
  const std::vector<TokenId> prompt_b = concat(prefix, iota(37, 9000));

  SequenceBlocks a = runPrompt(manager, prompt_a);
  ASSERT_EQ(a.blocks.size(), 12u);  // 181 tokens
  EXPECT_EQ(a.num_cached_tokens, 0);
  EXPECT_EQ(a.block_hashes.size(), 11u);  // the 12th block is partial
  const int64_t free_before = manager.numFreeBlocks();

  PrefixMatch match = manager.findCachedPrefix(prompt_b, "");
  ASSERT_EQ(match.blocks.size(), 10u);  // block 10 differs in its tokens
  SequenceBlocks b;
  ASSERT_TRUE(manager.allocate(b, &match, std::ssize(prompt_b)));
  manager.countPrefixQuery(match, b.num_cached_tokens);
  ASSERT_EQ(b.blocks.size(), 13u);  // 197 tokens
  EXPECT_EQ(b.num_cached_tokens, 160);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(b.blocks[i], a.blocks[i]) << i;
    EXPECT_EQ(manager.refCount(b.blocks[i]), 2) << i;
  }
  for (size_t i = 10; i < 13; ++i) {
    EXPECT_EQ(std::count(a.blocks.begin(), a.blocks.end(), b.blocks[i]), 0) << i;
    EXPECT_EQ(manager.refCount(b.blocks[i]), 1) << i;
  }
  EXPECT_EQ(manager.numFreeBlocks(), free_before - 3);
  EXPECT_EQ(manager.prefixCacheQueryTokens(), std::ssize(prompt_a) + std::ssize(prompt_b));
  EXPECT_EQ(manager.prefixCacheHitTokens(), 160);

  manager.free(a);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(manager.refCount(b.blocks[i]), 1);
  manager.free(b);
  EXPECT_EQ(manager.numFreeBlocks(), 64);
}

TEST(BlockManager, MatchLeavesAtLeastOneTokenToCompute) {
  BlockManager manager(makeConfig(16, 4));
  const std::vector<TokenId> prompt = iota(12, 1);
  SequenceBlocks seq = runPrompt(manager, prompt);
  ASSERT_EQ(manager.cachedHashes().size(), 3u);

  // The same 12 tokens are all cached, yet only (12-1)/4 = 2 blocks match.
  EXPECT_EQ(manager.findCachedPrefix(prompt, "").blocks.size(), 2u);
  EXPECT_EQ(manager.findCachedPrefix(std::span(prompt).first(9), "").blocks.size(), 2u);
  EXPECT_EQ(manager.findCachedPrefix(std::span(prompt).first(8), "").blocks.size(), 1u);
  EXPECT_EQ(manager.findCachedPrefix(std::span(prompt).first(4), "").blocks.size(), 0u);
  EXPECT_EQ(manager.findCachedPrefix(concat(prompt, {99}), "").blocks.size(), 3u);
  EXPECT_TRUE(manager.findCachedPrefix({}, "").blocks.empty());
  manager.free(seq);
}

TEST(BlockManager, CacheSaltSeparates) {
  BlockManager manager(makeConfig(16, 4));
  const std::vector<TokenId> prompt = iota(13, 1);
  SequenceBlocks salted = runPrompt(manager, prompt, "tenant-a");
  EXPECT_EQ(manager.findCachedPrefix(prompt, "tenant-a").blocks.size(), 3u);
  EXPECT_TRUE(manager.findCachedPrefix(prompt, "tenant-b").blocks.empty());
  EXPECT_TRUE(manager.findCachedPrefix(prompt, "").blocks.empty());
  // Unsalted, the same tokens are cached separately: no duplicate suppression.
  SequenceBlocks plain = runPrompt(manager, prompt, "");
  EXPECT_EQ(manager.cachedHashes().size(), 6u);
  manager.free(salted);
  manager.free(plain);
}

TEST(BlockManager, FailedAllocateChangesNothing) {
  KvEventLog log;
  BlockManager manager(makeConfig(8, 4), &log);
  // 3 cached blocks freed, 2 held by a running sequence, 3 never used.
  const std::vector<TokenId> prompt = iota(13, 1);
  SequenceBlocks old = runPrompt(manager, prompt);  // 4 blocks, 3 hashed
  manager.free(old);
  SequenceBlocks running;
  ASSERT_TRUE(manager.allocate(running, nullptr, 8));
  const Snapshot before = snapshot(manager, log);

  // With the 3 cached blocks matched: needs 3 + 4 new, only 6 - 3 = 3 remain
  // besides the matched ones.
  PrefixMatch match = manager.findCachedPrefix(concat(prompt, iota(14, 100)), "");
  ASSERT_EQ(match.blocks.size(), 3u);
  SequenceBlocks seq;
  EXPECT_FALSE(manager.allocate(seq, &match, 27));
  EXPECT_TRUE(seq.blocks.empty());
  EXPECT_TRUE(seq.block_hashes.empty());
  EXPECT_EQ(seq.num_cached_tokens, 0);
  EXPECT_EQ(snapshot(manager, log), before);

  // Growing a running sequence past the pool changes nothing either.
  const std::vector<BlockId> running_blocks = running.blocks;
  EXPECT_FALSE(manager.allocate(running, nullptr, 8 + 7 * 4));
  EXPECT_EQ(running.blocks, running_blocks);
  EXPECT_EQ(snapshot(manager, log), before);

  // Exactly enough succeeds: 3 matched + 3 new = 24 tokens.
  EXPECT_TRUE(manager.allocate(seq, &match, 24));
  EXPECT_EQ(manager.numFreeBlocks(), 0);
  manager.free(seq);
  manager.free(running);
  EXPECT_EQ(manager.numFreeBlocks(), 8);
}

TEST(BlockManager, FreedBlocksStayMatchableUntilEvictedLeastRecentlyFreedFirst) {
  KvEventLog log;
  BlockManager manager(makeConfig(6, 4), &log);
  const std::vector<TokenId> prompt_a = iota(12, 1);
  const std::vector<TokenId> prompt_b = iota(12, 500);
  SequenceBlocks a = runPrompt(manager, prompt_a);
  SequenceBlocks b = runPrompt(manager, prompt_b);
  const std::vector<BlockHash> hashes_a = a.block_hashes;
  const std::vector<BlockHash> hashes_b = b.block_hashes;
  manager.free(a);  // freed first: evicted first, its tail before its head
  manager.free(b);
  EXPECT_EQ(manager.numFreeBlocks(), 6);
  EXPECT_EQ(manager.cachedHashes().size(), 6u);
  EXPECT_EQ(manager.findCachedPrefix(concat(prompt_a, {0}), "").blocks.size(), 3u);

  auto lastRemoved = [&]() -> std::vector<BlockHash> {
    std::vector<KvEvent> events = allEvents(log);
    const auto* removed = std::get_if<BlockRemoved>(&events.back().data);
    return removed != nullptr ? removed->block_hashes : std::vector<BlockHash>{};
  };

  SequenceBlocks filler;
  ASSERT_TRUE(manager.allocate(filler, nullptr, 4));
  EXPECT_EQ(lastRemoved(), std::vector<BlockHash>{hashes_a[2]});
  EXPECT_EQ(manager.findCachedPrefix(concat(prompt_a, {0}), "").blocks.size(), 2u);

  ASSERT_TRUE(manager.allocate(filler, nullptr, 12));
  EXPECT_EQ(lastRemoved(), (std::vector<BlockHash>{hashes_a[1], hashes_a[0]}));
  EXPECT_TRUE(manager.findCachedPrefix(concat(prompt_a, {0}), "").blocks.empty());
  // B was freed later and is untouched.
  EXPECT_EQ(manager.findCachedPrefix(concat(prompt_b, {0}), "").blocks.size(), 3u);

  ASSERT_TRUE(manager.allocate(filler, nullptr, 16));
  EXPECT_EQ(lastRemoved(), std::vector<BlockHash>{hashes_b[2]});
  EXPECT_EQ(asSet(manager.cachedHashes()), (asSet({hashes_b[0], hashes_b[1]})));
  EXPECT_EQ(replay(allEvents(log)), asSet(manager.cachedHashes()));
  manager.free(filler);
}

TEST(BlockManager, UnhashedFreeBlocksAreTakenBeforeCachedOnes) {
  KvEventLog log;
  BlockManager manager(makeConfig(5, 4), &log);
  SequenceBlocks older = runPrompt(manager, iota(4, 500));  // 1 hashed block
  SequenceBlocks seq = runPrompt(manager, iota(14, 1));     // 3 hashed + 1 partial
  ASSERT_EQ(manager.numFreeBlocks(), 0);
  const BlockId partial = seq.blocks[3];
  manager.free(older);  // least recently freed: the first cached victim
  manager.free(seq);
  const uint64_t last = log.lastSequence();
  SequenceBlocks next;
  ASSERT_TRUE(manager.allocate(next, nullptr, 4));
  EXPECT_EQ(next.blocks, std::vector<BlockId>{partial});
  EXPECT_EQ(log.lastSequence(), last);  // nothing evicted
  EXPECT_EQ(manager.cachedHashes().size(), 4u);
  manager.free(next);
}

TEST(BlockManager, FreeCachedBlocksAreRevivedByAMatch) {
  BlockManager manager(makeConfig(8, 4));
  const std::vector<TokenId> prompt = iota(13, 1);
  SequenceBlocks first = runPrompt(manager, prompt);
  const std::vector<BlockId> first_blocks = first.blocks;
  manager.free(first);
  SequenceBlocks second = runPrompt(manager, prompt);
  EXPECT_EQ(second.num_cached_tokens, 12);
  EXPECT_EQ(std::vector<BlockId>(second.blocks.begin(), second.blocks.begin() + 3),
            std::vector<BlockId>(first_blocks.begin(), first_blocks.begin() + 3));
  EXPECT_EQ(manager.numFreeBlocks(), 4);
  manager.free(second);
  EXPECT_EQ(manager.numFreeBlocks(), 8);
}

TEST(BlockManager, StaleMatchUsesOnlyWhatIsStillCached) {
  BlockManager manager(makeConfig(4, 4));
  const std::vector<TokenId> prompt = iota(13, 1);
  SequenceBlocks first = runPrompt(manager, prompt);
  manager.free(first);
  PrefixMatch match = manager.findCachedPrefix(prompt, "");
  ASSERT_EQ(match.blocks.size(), 3u);
  // Another sequence takes the partial block and evicts the last hashed one.
  SequenceBlocks other;
  ASSERT_TRUE(manager.allocate(other, nullptr, 8));
  SequenceBlocks seq;
  ASSERT_TRUE(manager.allocate(seq, &match, 8));
  EXPECT_EQ(seq.num_cached_tokens, 8);
  EXPECT_EQ(seq.block_hashes.size(), 2u);
  EXPECT_EQ(std::vector<BlockId>(seq.blocks.begin(), seq.blocks.end()),
            std::vector<BlockId>(match.blocks.begin(), match.blocks.begin() + 2));
  manager.free(seq);
  manager.free(other);
  EXPECT_EQ(manager.numFreeBlocks(), 4);
}

TEST(BlockManager, DuplicateContentIsRegisteredOnce) {
  KvEventLog log;
  BlockManager manager(makeConfig(8, 4), &log);
  const std::vector<TokenId> prompt = iota(9, 1);
  // Both allocate before either has computed anything: no sharing possible.
  SequenceBlocks a, b;
  PrefixMatch match_a = manager.findCachedPrefix(prompt, "");
  PrefixMatch match_b = manager.findCachedPrefix(prompt, "");
  ASSERT_TRUE(manager.allocate(a, &match_a, 9));
  ASSERT_TRUE(manager.allocate(b, &match_b, 9));
  manager.cacheFullBlocks(a, prompt, 9, "");
  manager.cacheFullBlocks(b, prompt, 9, "");
  EXPECT_EQ(a.block_hashes, b.block_hashes);
  EXPECT_EQ(manager.cachedHashes().size(), 2u);
  EXPECT_FALSE(manager.cachedHash(b.blocks[0]).has_value());
  EXPECT_EQ(manager.cachedHash(a.blocks[0]), a.block_hashes[0]);
  EXPECT_EQ(allEvents(log).size(), 1u);  // one BlockStored, from a
  const std::vector<BlockId> b_blocks = b.blocks;
  manager.free(b);
  // The unregistered duplicates go where they are taken first.
  SequenceBlocks c;
  ASSERT_TRUE(manager.allocate(c, nullptr, 12));
  EXPECT_EQ(std::set<BlockId>(c.blocks.begin(), c.blocks.end()),
            std::set<BlockId>(b_blocks.begin(), b_blocks.end()));
  EXPECT_EQ(manager.cachedHashes().size(), 2u);
  manager.free(a);
  manager.free(c);
  EXPECT_EQ(manager.numFreeBlocks(), 8);
  EXPECT_EQ(replay(allEvents(log)), asSet(manager.cachedHashes()));
}

TEST(BlockManager, CacheFullBlocksIsIncrementalAndEmitsChains) {
  KvEventLog log;
  BlockManager manager(makeConfig(8, 4), &log);
  const std::vector<TokenId> tokens = iota(14, 1);
  SequenceBlocks seq;
  PrefixMatch match = manager.findCachedPrefix(tokens, "");
  ASSERT_TRUE(manager.allocate(seq, &match, 14));
  manager.cacheFullBlocks(seq, tokens, 3, "");  // nothing full yet
  EXPECT_EQ(log.lastSequence(), 0u);
  manager.cacheFullBlocks(seq, tokens, 9, "");   // blocks 0, 1
  manager.cacheFullBlocks(seq, tokens, 9, "");   // again: nothing new
  manager.cacheFullBlocks(seq, tokens, 14, "");  // block 2
  const std::vector<BlockHash> expected = manager.hasher().hashFullBlocks(tokens, "");
  EXPECT_EQ(seq.block_hashes, expected);

  std::vector<KvEvent> events = allEvents(log);
  ASSERT_EQ(events.size(), 2u);
  const auto& first = std::get<BlockStored>(events[0].data);
  EXPECT_EQ(first.block_hashes, (std::vector<BlockHash>{expected[0], expected[1]}));
  EXPECT_FALSE(first.parent_block_hash.has_value());
  EXPECT_EQ(first.num_tokens, 8);
  EXPECT_EQ(first.block_size, 4);
  const auto& second = std::get<BlockStored>(events[1].data);
  EXPECT_EQ(second.block_hashes, std::vector<BlockHash>{expected[2]});
  EXPECT_EQ(second.parent_block_hash, expected[1]);
  EXPECT_EQ(second.num_tokens, 4);
  manager.free(seq);
}

TEST(BlockManager, InvalidatedBlocksNeverBecomeMatchable) {
  KvEventLog log;
  BlockManager manager(makeConfig(12, 4), &log);
  const std::vector<TokenId> prompt = iota(13, 1);
  const std::vector<BlockHash> hashes = manager.hasher().hashFullBlocks(prompt, "");

  // Block 1 "failed to load" before it was registered.
  SequenceBlocks seq;
  ASSERT_TRUE(manager.allocate(seq, nullptr, 13));
  const std::vector<int64_t> bad = {1};
  manager.invalidateBlocks(seq, bad);
  manager.cacheFullBlocks(seq, prompt, 13, "");
  EXPECT_EQ(seq.block_hashes, hashes);  // still chained through block 1
  EXPECT_FALSE(manager.cachedHash(seq.blocks[1]).has_value());
  EXPECT_EQ(asSet(manager.cachedHashes()), (asSet({hashes[0], hashes[2]})));
  EXPECT_EQ(manager.findCachedPrefix(prompt, "").blocks.size(), 1u);
  // Two chains: [h0] from no parent, [h2] from h1.
  std::vector<KvEvent> events = allEvents(log);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(std::get<BlockStored>(events[1].data).parent_block_hash, hashes[1]);

  // Invalidating a registered block unregisters it.
  const std::vector<int64_t> also_bad = {0};
  manager.invalidateBlocks(seq, also_bad);
  EXPECT_EQ(std::get<BlockRemoved>(allEvents(log).back().data).block_hashes,
            std::vector<BlockHash>{hashes[0]});
  EXPECT_TRUE(manager.findCachedPrefix(prompt, "").blocks.empty());
  // Computing more does not register them either.
  manager.cacheFullBlocks(seq, prompt, 13, "");
  EXPECT_EQ(asSet(manager.cachedHashes()), asSet({hashes[2]}));

  // Once freed they are ordinary unhashed blocks; a fresh computation of the
  // prompt registers new blocks for h0, h1 and finds h2 already cached.
  const BlockId bad_block = seq.blocks[1];
  manager.free(seq);
  EXPECT_FALSE(manager.cachedHash(bad_block).has_value());
  SequenceBlocks again = runPrompt(manager, prompt);
  EXPECT_EQ(again.num_cached_tokens, 0);
  EXPECT_EQ(asSet(manager.cachedHashes()), asSet(hashes));
  EXPECT_EQ(manager.findCachedPrefix(concat(prompt, {7}), "").blocks.size(), 3u);
  EXPECT_EQ(replay(allEvents(log)), asSet(manager.cachedHashes()));
  manager.free(again);
}

TEST(BlockManager, ResetPrefixCache) {
  KvEventLog log;
  BlockManager manager(makeConfig(8, 4), &log);
  SequenceBlocks held = runPrompt(manager, iota(9, 1));
  SequenceBlocks gone = runPrompt(manager, iota(9, 100));
  manager.free(gone);
  EXPECT_EQ(manager.cachedHashes().size(), 4u);
  EXPECT_EQ(manager.resetPrefixCache(), 2);
  EXPECT_TRUE(std::holds_alternative<BlockRemoved>(allEvents(log).back().data));
  EXPECT_EQ(asSet(manager.cachedHashes()), asSet(held.block_hashes));
  manager.free(held);
  EXPECT_EQ(manager.resetPrefixCache(), 2);
  EXPECT_TRUE(std::holds_alternative<AllCleared>(allEvents(log).back().data));
  EXPECT_TRUE(manager.cachedHashes().empty());
  EXPECT_TRUE(replay(allEvents(log)).empty());
  EXPECT_EQ(manager.numFreeBlocks(), 8);
}

TEST(BlockManager, PrefixCachingOff) {
  KvEventLog log;
  BlockManagerConfig config = makeConfig(8, 4);
  config.enable_prefix_caching = false;
  BlockManager manager(config, &log);
  const std::vector<TokenId> prompt = iota(13, 1);
  SequenceBlocks a = runPrompt(manager, prompt);
  SequenceBlocks b = runPrompt(manager, prompt);
  EXPECT_EQ(b.num_cached_tokens, 0);
  EXPECT_TRUE(manager.cachedHashes().empty());
  EXPECT_EQ(log.lastSequence(), 0u);
  EXPECT_EQ(manager.prefixCacheQueryTokens(), 0);
  manager.free(a);
  manager.free(b);
}

// Random workloads: many sequences sharing prefixes, growing, failing to
// allocate, invalidated and freed in random order. After every step the
// books must balance; at the end every block is free again.
TEST(BlockManager, RandomWorkloadKeepsInvariants) {
  for (uint32_t seed : {1u, 2u, 3u, 42u}) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    KvEventLog log(1u << 20);
    const int32_t block_size = 4;
    const int64_t num_blocks = 48;
    BlockManager manager(makeConfig(num_blocks, block_size), &log);

    std::vector<std::vector<TokenId>> prefixes;
    for (int i = 0; i < 4; ++i) prefixes.push_back(iota(4 + 5 * i, 1000 * (i + 1)));
    const std::vector<std::string> salts = {"", "s"};

    struct Live {
      SequenceBlocks blocks;
      std::vector<TokenId> tokens;
      std::string salt;
      int64_t computed = 0;
      std::set<size_t> invalidated;  // indices into blocks
    };
    std::vector<Live> live;
    int64_t failures = 0, hits = 0;
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };

    for (int step = 0; step < 4000; ++step) {
      const int action = static_cast<int>(pick(100));
      if (action < 35) {  // a new request
        Live seq;
        seq.tokens = prefixes[pick(prefixes.size())];
        const size_t tail = pick(12);
        for (size_t i = 0; i < tail; ++i) seq.tokens.push_back(static_cast<TokenId>(pick(6)));
        seq.salt = salts[pick(salts.size())];
        PrefixMatch match = manager.findCachedPrefix(seq.tokens, seq.salt);
        const Snapshot before = snapshot(manager, log);
        if (!manager.allocate(seq.blocks, &match, std::ssize(seq.tokens))) {
          ++failures;
          ASSERT_EQ(snapshot(manager, log), before);
          ASSERT_TRUE(seq.blocks.blocks.empty());
          continue;
        }
        ASSERT_LT(seq.blocks.num_cached_tokens, std::ssize(seq.tokens));
        if (seq.blocks.num_cached_tokens > 0) ++hits;
        seq.computed = std::ssize(seq.tokens);
        manager.cacheFullBlocks(seq.blocks, seq.tokens, seq.computed, seq.salt);
        live.push_back(std::move(seq));
      } else if (action < 65 && !live.empty()) {  // decode a few tokens
        Live& seq = live[pick(live.size())];
        const size_t grow = 1 + pick(6);
        const Snapshot before = snapshot(manager, log);
        const std::vector<BlockId> blocks_before = seq.blocks.blocks;
        if (!manager.allocate(seq.blocks, nullptr,
                              std::ssize(seq.tokens) + static_cast<int64_t>(grow))) {
          ++failures;
          ASSERT_EQ(snapshot(manager, log), before);
          ASSERT_EQ(seq.blocks.blocks, blocks_before);
          continue;
        }
        for (size_t i = 0; i < grow; ++i) seq.tokens.push_back(static_cast<TokenId>(pick(50)));
        seq.computed = std::ssize(seq.tokens) - 1;  // the newest token is not computed yet
        manager.cacheFullBlocks(seq.blocks, seq.tokens, seq.computed, seq.salt);
      } else if (action < 68 && !live.empty()) {  // a failed load
        Live& seq = live[pick(live.size())];
        const std::vector<int64_t> index = {static_cast<int64_t>(pick(seq.blocks.blocks.size()))};
        manager.invalidateBlocks(seq.blocks, index);
        seq.invalidated.insert(static_cast<size_t>(index[0]));
      } else if (action < 99 && !live.empty()) {  // finish or preempt
        const size_t i = pick(live.size());
        manager.free(live[i].blocks);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      } else if (action == 99) {
        manager.resetPrefixCache();
      }

      // Reference counts are exactly the references the sequences hold.
      std::vector<int32_t> refs(static_cast<size_t>(num_blocks), 0);
      for (const Live& seq : live) {
        std::set<BlockId> distinct(seq.blocks.blocks.begin(), seq.blocks.blocks.end());
        ASSERT_EQ(distinct.size(), seq.blocks.blocks.size());
        ASSERT_EQ(seq.blocks.numTokenSlots(block_size),
                  manager.blocksForTokens(std::ssize(seq.tokens)) * block_size);
        for (BlockId b : seq.blocks.blocks) ++refs[static_cast<size_t>(b)];
      }
      int64_t unreferenced = 0;
      for (BlockId b = 0; b < num_blocks; ++b) {
        ASSERT_EQ(manager.refCount(b), refs[static_cast<size_t>(b)]) << b;
        if (refs[static_cast<size_t>(b)] == 0) ++unreferenced;
      }
      ASSERT_EQ(manager.numFreeBlocks(), unreferenced);
      // Every registered block of a sequence holds the hash of its tokens.
      for (const Live& seq : live) {
        const auto expected = manager.hasher().hashFullBlocks(
            std::span(seq.tokens).first(static_cast<size_t>(seq.computed)), seq.salt);
        ASSERT_EQ(seq.blocks.block_hashes, expected);
        for (size_t i : seq.invalidated) {
          ASSERT_FALSE(manager.cachedHash(seq.blocks.blocks[i]).has_value()) << i;
        }
        for (size_t i = 0; i < expected.size(); ++i) {
          const auto cached = manager.cachedHash(seq.blocks.blocks[i]);
          if (cached) {
            ASSERT_EQ(*cached, expected[i]);
          }
        }
      }
      // The event stream describes the cache exactly.
      if (step % 50 == 0) {
        ASSERT_EQ(replay(allEvents(log)), asSet(manager.cachedHashes()));
      }
    }
    EXPECT_GT(failures, 0);  // the pool was under pressure
    EXPECT_GT(hits, 0);      // and prefixes were shared
    for (Live& seq : live) manager.free(seq.blocks);
    EXPECT_EQ(manager.numFreeBlocks(), num_blocks);
    EXPECT_DOUBLE_EQ(manager.usage(), 0.0);
    EXPECT_EQ(replay(allEvents(log)), asSet(manager.cachedHashes()));

    std::vector<KvEvent> events = allEvents(log);
    for (size_t i = 0; i < events.size(); ++i) ASSERT_EQ(events[i].sequence, i + 1);
  }
}

// ---- KvEventLog ----

TEST(KvEventLog, SequencesIncreaseFromOne) {
  KvEventLog log;
  EXPECT_EQ(log.append(AllCleared{}), 1u);
  EXPECT_EQ(log.append(BlockRemoved{}), 2u);
  EXPECT_EQ(log.lastSequence(), 2u);
  EXPECT_THROW(KvEventLog(0), Error);
}

TEST(KvEventLog, PaginatesAndSignalsWhatIsNoLongerRetained) {
  KvEventLog log(4);
  KvEventPage empty = log.eventsSince(0, 10);
  EXPECT_TRUE(empty.events.empty());
  EXPECT_FALSE(empty.needs_snapshot);
  EXPECT_TRUE(log.eventsSince(3, 10).needs_snapshot);  // ahead of the log

  for (int i = 0; i < 10; ++i) log.append(AllCleared{});  // retains 7..10
  auto sequences = [](const KvEventPage& page) {
    std::vector<uint64_t> out;
    for (const KvEvent& e : page.events) out.push_back(e.sequence);
    return out;
  };
  KvEventPage too_old = log.eventsSince(0, 10);
  EXPECT_TRUE(too_old.needs_snapshot);
  EXPECT_TRUE(too_old.events.empty());
  EXPECT_EQ(too_old.last_sequence, 10u);
  EXPECT_TRUE(log.eventsSince(5, 10).needs_snapshot);  // 6 was dropped

  KvEventPage first = log.eventsSince(6, 2);
  EXPECT_FALSE(first.needs_snapshot);
  EXPECT_EQ(sequences(first), (std::vector<uint64_t>{7, 8}));
  KvEventPage second = log.eventsSince(first.events.back().sequence, 2);
  EXPECT_EQ(sequences(second), (std::vector<uint64_t>{9, 10}));
  KvEventPage caught_up = log.eventsSince(10, 2);
  EXPECT_TRUE(caught_up.events.empty());
  EXPECT_FALSE(caught_up.needs_snapshot);
  EXPECT_EQ(caught_up.last_sequence, 10u);
  EXPECT_TRUE(log.eventsSince(11, 2).needs_snapshot);
  EXPECT_TRUE(log.eventsSince(8, 0).events.empty());
}

TEST(KvEventLog, JsonEncoding) {
  const BlockHash h1{1, 2}, h2{0xffffffffffffffffULL, 0};
  KvEvent stored{5, BlockStored{{h1, h2}, h2, 32, 16}};
  nlohmann::json json = toJson(stored);
  EXPECT_EQ(json["sequence"], 5);
  EXPECT_EQ(json["type"], "BlockStored");
  EXPECT_EQ(json["block_hashes"], nlohmann::json::array({"00000000000000010000000000000002",
                                                         "ffffffffffffffff0000000000000000"}));
  EXPECT_EQ(json["parent_block_hash"], "ffffffffffffffff0000000000000000");
  EXPECT_EQ(json["num_tokens"], 32);
  EXPECT_EQ(json["block_size"], 16);

  nlohmann::json root = toJson(KvEvent{6, BlockStored{{h1}, std::nullopt, 16, 16}});
  EXPECT_TRUE(root["parent_block_hash"].is_null());

  nlohmann::json removed = toJson(KvEvent{7, BlockRemoved{{h1}}});
  EXPECT_EQ(removed, nlohmann::json::parse(R"({"sequence": 7, "type": "BlockRemoved",
      "block_hashes": ["00000000000000010000000000000002"]})"));
  EXPECT_EQ(toJson(KvEvent{8, AllCleared{}}),
            nlohmann::json::parse(R"({"sequence": 8, "type": "AllCleared"})"));
}

TEST(KvEventLog, SubscribersSeeEventsUntilUnsubscribed) {
  KvEventLog log;
  log.append(AllCleared{});
  std::vector<uint64_t> seen;
  KvEventLog::Subscription sub =
      log.subscribe([&](const KvEvent& event) { seen.push_back(event.sequence); });
  EXPECT_TRUE(sub.active());
  EXPECT_EQ(sub.startSequence(), 1u);
  log.append(AllCleared{});
  log.append(BlockRemoved{});
  KvEventLog::Subscription moved = std::move(sub);
  EXPECT_FALSE(sub.active());
  log.append(AllCleared{});
  moved.reset();
  log.append(AllCleared{});
  EXPECT_EQ(seen, (std::vector<uint64_t>{2, 3, 4}));

  // A subscription may outlive its log.
  auto short_lived = std::make_unique<KvEventLog>();
  KvEventLog::Subscription orphan = short_lived->subscribe([](const KvEvent&) {});
  short_lived.reset();
  orphan.reset();
}

TEST(KvEventLog, ConcurrentReadersSeeConsecutiveEvents) {
  KvEventLog log(64);
  constexpr uint64_t kEvents = 20000;
  std::atomic<uint64_t> delivered{0};
  KvEventLog::Subscription sub = log.subscribe([&](const KvEvent& event) {
    // Delivered in order, one at a time.
    EXPECT_EQ(event.sequence, delivered.load() + 1);
    delivered.store(event.sequence);
  });
  std::thread writer([&] {
    for (uint64_t i = 0; i < kEvents; ++i) log.append(BlockRemoved{{BlockHash{i, i}}});
  });
  uint64_t after = 0;
  int64_t snapshots = 0;
  while (after < kEvents) {
    KvEventPage page = log.eventsSince(after, 16);
    if (page.needs_snapshot) {
      // A real reader would take a snapshot; here, resume from the newest.
      ++snapshots;
      after = page.last_sequence;
      continue;
    }
    for (const KvEvent& event : page.events) {
      ASSERT_EQ(event.sequence, after + 1);
      const auto& removed = std::get<BlockRemoved>(event.data);
      ASSERT_EQ(removed.block_hashes[0].low, event.sequence - 1);
      after = event.sequence;
    }
  }
  writer.join();
  EXPECT_EQ(delivered.load(), kEvents);
  EXPECT_EQ(after, kEvents);
  (void)snapshots;
}

}  // namespace
}  // namespace tandem::engine
