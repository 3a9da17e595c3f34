#include "agent/engine/block_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace tandem::engine {
namespace {

BlockHasher makeHasher(const BlockManagerConfig& config) {
  if (config.num_blocks <= 0 || config.num_blocks > std::numeric_limits<BlockId>::max()) {
    throw Error("num_blocks must be between 1 and " +
                std::to_string(std::numeric_limits<BlockId>::max()) + ", got " +
                std::to_string(config.num_blocks));
  }
  return BlockHasher(config.hash_algorithm, config.model_identity, config.block_size);
}

}  // namespace

BlockManager::BlockManager(const BlockManagerConfig& config, KvEventLog* event_log)
    : config_(config),
      hasher_(makeHasher(config)),
      event_log_(event_log),
      blocks_(static_cast<size_t>(config.num_blocks)) {
  for (BlockId block = 0; block < static_cast<BlockId>(config_.num_blocks); ++block) {
    pushFreeBack(block);
  }
}

int64_t BlockManager::blocksForTokens(int64_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  return (num_tokens + config_.block_size - 1) / config_.block_size;
}

PrefixMatch BlockManager::findCachedPrefix(std::span<const TokenId> tokens,
                                           std::string_view cache_salt,
                                           std::string_view model_identity) const {
  PrefixMatch match;
  if (!config_.enable_prefix_caching || tokens.empty()) return match;
  match.num_query_tokens = static_cast<int64_t>(tokens.size());
  // At least one token must be computed to produce the next token's logits.
  const size_t block_size = static_cast<size_t>(config_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / block_size;
  for (size_t i = 0; i < max_blocks; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &match.block_hashes.back();
    const BlockHash hash = hasher_.hashBlock(parent, tokens.subspan(i * block_size, block_size),
                                             cache_salt, model_identity);
    auto it = cached_.find(hash);
    if (it == cached_.end()) break;
    match.blocks.push_back(it->second);
    match.block_hashes.push_back(hash);
  }
  return match;
}

size_t BlockManager::validMatchLength(const PrefixMatch& match) const {
  TANDEM_CHECK(match.blocks.size() == match.block_hashes.size(), "malformed PrefixMatch");
  size_t length = 0;
  for (; length < match.blocks.size(); ++length) {
    auto it = cached_.find(match.block_hashes[length]);
    if (it == cached_.end() || it->second != match.blocks[length]) break;
  }
  return length;
}

BlockManager::AllocationPlan BlockManager::plan(const SequenceBlocks& seq, const PrefixMatch* match,
                                                int64_t num_tokens_total) const {
  AllocationPlan plan;
  plan.num_matched =
      match != nullptr && config_.enable_prefix_caching ? validMatchLength(*match) : 0;
  for (size_t i = 0; i < plan.num_matched; ++i) {
    if (blocks_[match->blocks[i]].ref_count == 0) ++plan.matched_free;
  }
  const int64_t have = static_cast<int64_t>(seq.blocks.size() + plan.num_matched);
  plan.num_new = std::max<int64_t>(0, blocksForTokens(num_tokens_total) - have);
  return plan;
}

int64_t BlockManager::blocksShort(const SequenceBlocks& seq, const PrefixMatch* match,
                                  int64_t num_tokens_total) const {
  const AllocationPlan planned = plan(seq, match, num_tokens_total);
  return std::max<int64_t>(0, planned.num_new - (num_free_ - planned.matched_free));
}

bool BlockManager::allocate(SequenceBlocks& seq, const PrefixMatch* match,
                            int64_t num_tokens_total) {
  TANDEM_CHECK(match == nullptr || seq.blocks.empty(),
               "a prefix match can only be applied to a sequence without blocks");
  const AllocationPlan planned = plan(seq, match, num_tokens_total);
  const size_t num_matched = planned.num_matched;
  const int64_t num_new = planned.num_new;
  if (num_new > num_free_ - planned.matched_free) return false;

  // Apply.
  for (size_t i = 0; i < num_matched; ++i) {
    const BlockId block = match->blocks[i];
    BlockState& state = blocks_[block];
    if (state.ref_count == 0) unlinkFree(block);
    ++state.ref_count;
    seq.blocks.push_back(block);
    seq.block_hashes.push_back(match->block_hashes[i]);
  }
  if (match != nullptr) {
    seq.num_cached_tokens = static_cast<int64_t>(num_matched) * config_.block_size;
  }
  std::vector<BlockHash> evicted;
  for (int64_t i = 0; i < num_new; ++i) {
    const BlockId block = popFreeFront();
    BlockState& state = blocks_[block];
    if (state.has_hash) {
      evicted.push_back(state.hash);
      unregister(block);
    }
    state.ref_count = 1;
    seq.blocks.push_back(block);
  }
  if (!evicted.empty()) emit(BlockRemoved{std::move(evicted)});
  return true;
}

void BlockManager::cacheFullBlocks(SequenceBlocks& seq, std::span<const TokenId> tokens,
                                   int64_t num_computed_tokens, std::string_view cache_salt,
                                   std::string_view model_identity) {
  if (!config_.enable_prefix_caching) return;
  TANDEM_CHECK(num_computed_tokens >= 0 && num_computed_tokens <= std::ssize(tokens),
               "num_computed_tokens beyond the sequence's tokens");
  const size_t block_size = static_cast<size_t>(config_.block_size);
  const size_t num_full = static_cast<size_t>(num_computed_tokens) / block_size;
  TANDEM_CHECK(num_full <= seq.blocks.size(), "computed tokens beyond the sequence's blocks");
  if (num_full <= seq.block_hashes.size()) return;

  // One BlockStored per run of consecutive newly registered blocks, so each
  // event is a chain from its parent.
  BlockStored run;
  auto flush = [&] {
    if (run.block_hashes.empty()) return;
    run.num_tokens = std::ssize(run.block_hashes) * config_.block_size;
    run.block_size = config_.block_size;
    emit(std::exchange(run, BlockStored{}));
  };
  for (size_t i = seq.block_hashes.size(); i < num_full; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &seq.block_hashes[i - 1];
    const BlockHash hash = hasher_.hashBlock(parent, tokens.subspan(i * block_size, block_size),
                                             cache_salt, model_identity);
    if (run.block_hashes.empty() && parent != nullptr) run.parent_block_hash = *parent;
    seq.block_hashes.push_back(hash);
    const BlockId block = seq.blocks[i];
    BlockState& state = blocks_[block];
    TANDEM_CHECK(state.ref_count > 0, "caching a block the sequence does not hold");
    // Blocks past the matched prefix were fresh when allocated; nothing else
    // registers them.
    TANDEM_CHECK(!state.has_hash, "block registered twice");
    if (state.invalid || cached_.contains(hash)) {
      flush();
      continue;
    }
    cached_.emplace(hash, block);
    state.has_hash = true;
    state.hash = hash;
    run.block_hashes.push_back(hash);
  }
  flush();
}

void BlockManager::invalidateBlocks(SequenceBlocks& seq, std::span<const int64_t> block_indices) {
  std::vector<BlockHash> removed;
  for (int64_t index : block_indices) {
    TANDEM_CHECK(index >= 0 && index < std::ssize(seq.blocks), "block index out of range");
    const BlockId block = seq.blocks[static_cast<size_t>(index)];
    BlockState& state = blocks_[block];
    state.invalid = true;
    if (state.has_hash) {
      removed.push_back(state.hash);
      unregister(block);
    }
  }
  if (!removed.empty()) emit(BlockRemoved{std::move(removed)});
}

int64_t BlockManager::freeBlocksWithoutEviction(int64_t limit) const {
  int64_t count = 0;
  for (BlockId block = free_head_; block != kNone && count < limit && !blocks_[block].has_hash;
       block = blocks_[block].next) {
    ++count;
  }
  return count;
}

void BlockManager::truncate(SequenceBlocks& seq, int64_t num_blocks) {
  TANDEM_CHECK(num_blocks >= std::ssize(seq.block_hashes),
               "truncating a sequence's blocks below its registered prefix");
  while (std::ssize(seq.blocks) > num_blocks) {
    const BlockId block = seq.blocks.back();
    BlockState& state = blocks_[block];
    TANDEM_CHECK(state.ref_count == 1 && !state.has_hash,
                 "truncating a block that is shared or registered");
    state.ref_count = 0;
    state.invalid = false;
    pushFreeFront(block);
    seq.blocks.pop_back();
  }
}

void BlockManager::free(SequenceBlocks& seq) {
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) {
    BlockState& state = blocks_[*it];
    TANDEM_CHECK(state.ref_count > 0, "freeing a block with no references");
    if (--state.ref_count > 0) continue;
    state.invalid = false;
    if (state.has_hash) {
      pushFreeBack(*it);
    } else {
      pushFreeFront(*it);
    }
  }
  seq = SequenceBlocks{};
}

int64_t BlockManager::resetPrefixCache() {
  const bool none_referenced = num_free_ == config_.num_blocks;
  std::vector<BlockHash> removed;
  for (BlockId block = 0; block < static_cast<BlockId>(blocks_.size()); ++block) {
    BlockState& state = blocks_[block];
    if (state.ref_count > 0 || !state.has_hash) continue;
    removed.push_back(state.hash);
    unregister(block);
  }
  const int64_t dropped = std::ssize(removed);
  if (none_referenced) {
    TANDEM_CHECK(cached_.empty(), "hashes left after clearing an idle cache");
    emit(AllCleared{});
  } else if (!removed.empty()) {
    emit(BlockRemoved{std::move(removed)});
  }
  return dropped;
}

double BlockManager::usage() const {
  return static_cast<double>(config_.num_blocks - num_free_) /
         static_cast<double>(config_.num_blocks);
}

std::vector<BlockHash> BlockManager::cachedHashes() const {
  std::vector<BlockHash> hashes;
  hashes.reserve(cached_.size());
  for (const BlockState& state : blocks_) {
    if (state.has_hash) hashes.push_back(state.hash);
  }
  return hashes;
}

int32_t BlockManager::refCount(BlockId block) const {
  TANDEM_CHECK(block >= 0 && block < static_cast<BlockId>(blocks_.size()), "block id out of range");
  return blocks_[block].ref_count;
}

std::optional<BlockHash> BlockManager::cachedHash(BlockId block) const {
  TANDEM_CHECK(block >= 0 && block < static_cast<BlockId>(blocks_.size()), "block id out of range");
  const BlockState& state = blocks_[block];
  if (!state.has_hash) return std::nullopt;
  return state.hash;
}

void BlockManager::pushFreeFront(BlockId block) {
  BlockState& state = blocks_[block];
  state.prev = kNone;
  state.next = free_head_;
  if (free_head_ != kNone) blocks_[free_head_].prev = block;
  free_head_ = block;
  if (free_tail_ == kNone) free_tail_ = block;
  ++num_free_;
}

void BlockManager::pushFreeBack(BlockId block) {
  BlockState& state = blocks_[block];
  state.next = kNone;
  state.prev = free_tail_;
  if (free_tail_ != kNone) blocks_[free_tail_].next = block;
  free_tail_ = block;
  if (free_head_ == kNone) free_head_ = block;
  ++num_free_;
}

void BlockManager::unlinkFree(BlockId block) {
  BlockState& state = blocks_[block];
  if (state.prev != kNone) {
    blocks_[state.prev].next = state.next;
  } else {
    free_head_ = state.next;
  }
  if (state.next != kNone) {
    blocks_[state.next].prev = state.prev;
  } else {
    free_tail_ = state.prev;
  }
  state.prev = kNone;
  state.next = kNone;
  --num_free_;
}

BlockId BlockManager::popFreeFront() {
  const BlockId block = free_head_;
  TANDEM_CHECK(block != kNone, "free list empty");
  unlinkFree(block);
  return block;
}

void BlockManager::unregister(BlockId block) {
  BlockState& state = blocks_[block];
  TANDEM_CHECK(state.has_hash, "unregistering a block without a hash");
  auto it = cached_.find(state.hash);
  TANDEM_CHECK(it != cached_.end() && it->second == block, "cache map out of sync");
  cached_.erase(it);
  state.has_hash = false;
}

void BlockManager::emit(KvEventData data) {
  if (event_log_ != nullptr) event_log_->append(std::move(data));
}

}  // namespace tandem::engine
