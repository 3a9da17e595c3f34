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
// Extra config: "shared_storage_path" (required).
// Thread-safety: used from the engine thread only.
#pragma once

#include <filesystem>

#include "agent/kv/connector.h"

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

 private:
  // Reads one block file into `block`; the failure reason ("missing",
  // "truncated", "format", "checksum"), empty when it loaded.
  std::string loadBlock(const std::filesystem::path& path, BlockId block);

  KvTransferConfig config_;
  engine::KvCache& cache_;
  std::filesystem::path root_;
  uint64_t temp_counter_ = 0;
};

}  // namespace tandem::kv
