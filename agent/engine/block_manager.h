// The KV block manager: which KV blocks each sequence holds, and the prefix
// cache that lets sequences share blocks of identical prompt prefixes.
//
// A pool of num_blocks blocks of block_size tokens (the block ids of a
// KvCache). Each block has a reference count; a block that reaches zero is
// free but keeps its content hash, so a later request with the same prefix can
// take it back without recomputing, until the block is evicted because a free
// block was needed (least recently freed first). Full, computed blocks are
// registered under hash(parent, tokens, model identity + cache_salt) (see
// common/block_hash.h); one block per hash.
//
// Per-sequence state (SequenceBlocks) is owned by the caller and passed in;
// the manager owns the pool. Allocation is plan-then-apply: when allocate()
// returns false nothing has changed, not even the prefix cache.
//
// Every change to the set of cached hashes is appended to the KvEventLog given
// at construction (when one is given): BlockStored on registration,
// BlockRemoved on eviction or invalidation, AllCleared on a full reset.
//
// Thread-safety: none. The manager belongs to the engine loop thread (the
// scheduler); other threads learn about it through the event log and through
// figures the engine publishes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/kv_events.h"
#include "common/block_hash.h"
#include "common/tokenizer.h"

namespace tandem::engine {

struct BlockManagerConfig {
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
  HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
  // Mixed into every block hash: agents that may share hashes (through the
  // router) must use the same identity for the same model and KV format.
  std::string model_identity;
};

// The result of findCachedPrefix: the cached blocks that hold the leading
// full blocks of a prompt. Valid until the manager next changes; allocate()
// re-checks it and uses only the part still cached.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> block_hashes;  // block_hashes[i] names blocks[i]
  int64_t num_query_tokens = 0;         // length of the prompt that was looked up
  int64_t numCachedTokens(int32_t block_size) const {
    return static_cast<int64_t>(blocks.size()) * block_size;
  }
};

// The blocks of one sequence, owned by the caller (the scheduler's request
// state) and changed only through the manager.
struct SequenceBlocks {
  // Block table: blocks[i] holds token positions [i*block_size, (i+1)*block_size).
  std::vector<BlockId> blocks;
  // Content hashes of the sequence's leading full, computed blocks, in order:
  // block_hashes[i] names the tokens of blocks[i] (whether or not blocks[i]
  // itself is the block registered under it: a duplicate or an invalidated
  // block is not). Grows through allocate (the matched prefix) and
  // cacheFullBlocks.
  std::vector<BlockHash> block_hashes;
  // Leading tokens whose KV came from the prefix cache at first allocation.
  int64_t num_cached_tokens = 0;

  int64_t numTokenSlots(int32_t block_size) const {
    return static_cast<int64_t>(blocks.size()) * block_size;
  }
};

class BlockManager {
 public:
  // Throws tandem::Error on an invalid configuration. `event_log` (optional)
  // must outlive the manager.
  explicit BlockManager(const BlockManagerConfig& config, KvEventLog* event_log = nullptr);

  const BlockManagerConfig& config() const { return config_; }
  int64_t numBlocks() const { return config_.num_blocks; }
  int32_t blockSize() const { return config_.block_size; }
  const BlockHasher& hasher() const { return hasher_; }
  // Blocks needed to hold `num_tokens` positions.
  int64_t blocksForTokens(int64_t num_tokens) const;

  // The longest run of leading full blocks of `tokens` that is cached (held
  // by a sequence or free but not yet evicted). At most (len-1)/block_size
  // blocks, so at least one prompt token is always left to compute. Empty
  // when prefix caching is off. Changes nothing.
  // `model_identity`: BlockHasher::hashBlock's (empty: the base model's).
  PrefixMatch findCachedPrefix(std::span<const TokenId> tokens, std::string_view cache_salt,
                               std::string_view model_identity = {}) const;

  // Makes `seq` cover num_tokens_total positions. `match` may be given only
  // while seq holds no blocks: its blocks (the part still cached) become the
  // head of seq with a reference each, and seq.num_cached_tokens says how
  // many tokens they cover; the prefix-cache counters count the query then.
  // New blocks come from the free list; taking a free block that still had a
  // hash evicts it (one BlockRemoved event for all evicted hashes).
  // Returns false, changing nothing, when there are not enough free blocks.
  bool allocate(SequenceBlocks& seq, const PrefixMatch* match, int64_t num_tokens_total);
  // Of the next `limit` blocks allocate() would take from the free list,
  // how many hold no cached content (taking them evicts nothing): the length
  // of the free list's leading run of blocks without a hash, up to `limit`.
  int64_t freeBlocksWithoutEviction(int64_t limit) const;
  // Gives back seq's blocks past its first `num_blocks`, which must hold
  // nothing registered or shared (positions past what seq computed).
  void truncate(SequenceBlocks& seq, int64_t num_blocks);
  // How many more free blocks allocate() with these arguments would need
  // (0: it would succeed).
  int64_t blocksShort(const SequenceBlocks& seq, const PrefixMatch* match,
                      int64_t num_tokens_total) const;

  // Registers the blocks of seq that are full within the first
  // num_computed_tokens of `tokens` (the sequence's tokens so far) and not
  // registered yet, and emits BlockStored for them. A block whose hash is
  // already cached under another block, or that was invalidated, stays
  // unregistered. `cache_salt` and `model_identity` must be the ones the
  // prefix was looked up with.
  void cacheFullBlocks(SequenceBlocks& seq, std::span<const TokenId> tokens,
                       int64_t num_computed_tokens, std::string_view cache_salt,
                       std::string_view model_identity = {});

  // Marks blocks of seq (by index into seq.blocks) as holding bad data, e.g.
  // KV that failed to load from another agent: they are unregistered if they
  // were (BlockRemoved) and never registered while seq holds them. Their
  // content hashes stay in seq.block_hashes for chaining later blocks.
  void invalidateBlocks(SequenceBlocks& seq, std::span<const int64_t> block_indices);

  // Drops seq's references and clears seq. Blocks reaching zero become free:
  // unhashed ones are taken first by later allocations; hashed ones stay
  // matchable and are evicted least recently freed first, the sequence's last
  // block before its first (heads are shared more often, so they last longer).
  void free(SequenceBlocks& seq);

  // Drops the hashes of all unreferenced blocks (BlockRemoved), or of all
  // blocks when none is referenced (AllCleared). Returns the number dropped.
  int64_t resetPrefixCache();

  // Free blocks, including cached ones that are not referenced.
  int64_t numFreeBlocks() const { return num_free_; }
  // Fraction of blocks referenced by some sequence, in [0, 1].
  double usage() const;
  // Hashes currently matchable, in block id order: a snapshot to pair with
  // the event log's lastSequence() read on the same (engine) thread.
  std::vector<BlockHash> cachedHashes() const;
  int32_t refCount(BlockId block) const;
  // The hash a block is registered under, if any.
  std::optional<BlockHash> cachedHash(BlockId block) const;

  // Prefix-cache counters in tokens, cumulative (for metrics): prompt tokens
  // looked up, and of those, tokens served from the cache. The scheduler
  // counts a request's first admission only: not a preempted request's
  // return, nor the holds and hand-overs that also allocate with a match.
  void countPrefixQuery(const PrefixMatch& match, int64_t hit_tokens) {
    query_tokens_ += match.num_query_tokens;
    hit_tokens_ += hit_tokens;
  }
  int64_t prefixCacheQueryTokens() const { return query_tokens_; }
  int64_t prefixCacheHitTokens() const { return hit_tokens_; }

 private:
  // What allocate() would do: the matched blocks it takes (and how many of
  // them are free, cached and unreferenced), and the new blocks it needs.
  struct AllocationPlan {
    size_t num_matched = 0;
    int64_t matched_free = 0;
    int64_t num_new = 0;
  };
  AllocationPlan plan(const SequenceBlocks& seq, const PrefixMatch* match,
                      int64_t num_tokens_total) const;
  static constexpr BlockId kNone = -1;

  struct BlockState {
    int32_t ref_count = 0;
    bool has_hash = false;
    bool invalid = false;  // excluded from the prefix cache while held
    BlockHash hash;
    // Free list links (valid while ref_count == 0).
    BlockId prev = kNone;
    BlockId next = kNone;
  };

  // Free list: taken from the front. Unhashed blocks are pushed to the front,
  // hashed ones to the back, so the front is the next victim.
  void pushFreeFront(BlockId block);
  void pushFreeBack(BlockId block);
  void unlinkFree(BlockId block);
  BlockId popFreeFront();
  // Leading part of `match` whose blocks are still registered under the
  // same hashes.
  size_t validMatchLength(const PrefixMatch& match) const;
  void unregister(BlockId block);
  void emit(KvEventData data);

  BlockManagerConfig config_;
  BlockHasher hasher_;
  KvEventLog* event_log_;
  std::vector<BlockState> blocks_;
  BlockId free_head_ = kNone;
  BlockId free_tail_ = kNone;
  int64_t num_free_ = 0;
  std::unordered_map<BlockHash, BlockId> cached_;
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace tandem::engine
