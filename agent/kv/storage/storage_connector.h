// The storage connector: KV blocks as files on a path shared by agents (a
// local disk for one machine, a network filesystem for several), keyed by
// block hash — vLLM's shared-storage connector, block by block.
//
// File <path>/<hh>/<hash>.kvblock: magic "TKVB", format version, block byte
// size, xxh3-64 checksum of the payload, then the block's bytes. A file is
// written under a temporary name and renamed, so readers never see a partial
// one. Because the hash covers the model identity, the cache salt and every
// token of the prefix, a file can only match the KV it holds; the size check
// rejects another KV layout. A missing, short or corrupted file is a load
// error for that block only, counted by reason (missing, truncated, format,
// checksum).
//
// Extra config: "shared_storage_path" (required); at most one of
// "capacity_blocks" or "capacity_bytes" (whole block files). Without either
// the files are never removed. With one, an agent that saves keeps the files
// it knows of (those under the path when it started, those it wrote or
// loaded since) within the capacity, removing the least recently used
// (written or loaded; at start, by modification time, which a load
// refreshes). Files other agents write after its start are not counted
// until it loads them: with several writers on one path, the path holds up
// to the sum of their capacities.
// Thread-safety: used from the engine thread only.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "agent/kv/connector.h"
#include "common/lru_map.h"

namespace tandem::kv {

class StorageConnector : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  StorageConnector(const KvTransferConfig& config, engine::KvCache& cache);

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return config_; }

  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override;
  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override;
  void save(const ConnectorRequest& request, int64_t first_block,
            std::span<const BlockId> block_ids) override;

  std::filesystem::path blockPath(const BlockHash& hash) const;
  // The capacity in block files; 0: unbounded (always for a reader).
  int64_t capacityBlocks() const { return capacity_blocks_; }

 private:
  // Reads one block file into `block`; the failure reason ("missing",
  // "truncated", "format", "checksum"), empty when it loaded.
  std::string loadBlock(const std::filesystem::path& path, BlockId block);

  // With a capacity: the file `path` was written or loaded now (most
  // recently used), then files are removed, least recently used first,
  // until the known ones fit.
  void used(const std::filesystem::path& path);
  // fs::exists that takes an error for absent (counted "unreadable").
  bool blockFileExists(const std::filesystem::path& path);
  void evictToCapacity();

  KvTransferConfig config_;
  engine::KvCache& cache_;
  std::filesystem::path root_;
  uint64_t temp_counter_ = 0;
  // A block in host memory, for a cache the host cannot read (a GPU's).
  std::vector<uint8_t> host_block_;
  int64_t capacity_blocks_ = 0;  // 0: unbounded (and nothing below is kept)
  // The known files by name, most recently used first.
  LruMap<std::string, std::filesystem::path> known_;
};

}  // namespace tandem::kv
