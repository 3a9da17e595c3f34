// The offload connector: a host-memory tier below the KV cache (vLLM's
// OffloadingConnector with its CPU backend). Full blocks are copied into the
// tier as they are computed, keyed by block hash; a later request whose
// blocks have left the KV cache (evicted by other requests, or never there
// after a restart of the cache) copies them back instead of recomputing.
//
// Extra config: exactly one of "capacity_blocks" (a positive integer) or
// "capacity_bytes" (a positive integer, rounded down to whole blocks). The
// tier is one slab of capacity_blocks blocks of the cache's block size,
// mapped at start and paged in as it fills; its index and recency list are
// sized once, so a save in steady state (tier full) allocates nothing.
//
// Eviction is least-recently-used: a save of a hash already present and a
// load both make it most recent; a save into a full tier overwrites the least
// recently used block. lookup() does not touch recency.
//
// Blocks are not pinned between lookup() and load(): the engine loads in the
// same scheduling step as it looks up, with no save in between, so eviction
// in that window only happens to other callers. A block evicted in the window
// fails to load (reason "evicted"), and the engine recomputes it.
//
// Roles: a producer saves, a consumer looks up and loads, kv_both does both.
// Thread-safety: used from the engine thread only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "agent/kv/connector.h"

namespace tandem::kv {

class OffloadConnector : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  // Throws tandem::Error naming the field when the capacity is missing,
  // doubly given, not a positive integer, or smaller than one block, and when
  // the slab cannot be mapped.
  OffloadConnector(const KvTransferConfig& config, engine::KvCache& cache);
  ~OffloadConnector() override;
  OffloadConnector(const OffloadConnector&) = delete;
  OffloadConnector& operator=(const OffloadConnector&) = delete;

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return config_; }

  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override;
  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override;
  void save(const ConnectorRequest& request, int64_t first_block,
            std::span<const BlockId> block_ids) override;

  int64_t capacityBlocks() const { return capacity_blocks_; }
  int64_t numStoredBlocks() const { return static_cast<int64_t>(index_.size()); }
  bool contains(const BlockHash& hash) const { return index_.count(hash) != 0; }

 private:
  static constexpr int32_t kNone = -1;
  // One block of the tier, linked into the recency list.
  struct Slot {
    BlockHash hash;
    int32_t prev = kNone;  // towards the most recently used
    int32_t next = kNone;  // towards the least recently used
  };

  uint8_t* slotData(int32_t slot) { return slab_ + static_cast<size_t>(slot) * block_bytes_; }
  void unlink(int32_t slot);
  void pushFront(int32_t slot);
  // Stores a copy of `block` under `hash`, evicting the least recently used
  // block when the tier is full.
  void store(const BlockHash& hash, BlockId block);

  KvTransferConfig config_;
  engine::KvCache& cache_;
  engine::HostSlabAllocator allocator_;
  size_t block_bytes_ = 0;
  int64_t capacity_blocks_ = 0;
  size_t slab_bytes_ = 0;
  uint8_t* slab_ = nullptr;
  std::vector<Slot> slots_;
  // A block of a cache the host cannot read (a GPU's), on its way in.
  std::vector<uint8_t> host_block_;
  int32_t most_recent_ = kNone;
  int32_t least_recent_ = kNone;
  int32_t num_used_ = 0;  // slots [0, num_used_) hold a block; the rest never have
  std::unordered_map<BlockHash, int32_t> index_;
};

}  // namespace tandem::kv
