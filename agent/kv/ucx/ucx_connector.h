// The ucx connector: the prefill → decode hand-off between agents with
// one-sided UCX reads (DESIGN.md, "The P→D protocol").
//
// Producer (prefill agent): a request with kv_transfer_params
// {"do_remote_decode": true} finishes normally, its blocks are held, and the
// response carries where to read them:
//   {"remote_engine_id", "remote_slab" (serialized RemoteSlab: worker address,
//    memory key, geometry), "remote_block_ids", "remote_num_tokens",
//    "transfer_id", "compatibility"}.
// The blocks are freed when the reader's "release <transfer_id>" message
// arrives, or after abort_timeout_s.
//
// Consumer (decode agent): a request with {"do_remote_prefill": true, ...those
// fields} first matches its own prefix cache, then reads only the blocks it
// lacks straight into its own blocks, and tells the producer to release them.
// A peer whose compatibility string (model identity, KV dtype, block size,
// layers, KV heads, head size, protocol version) differs is refused, naming
// the field; blocks that fail to read are recomputed.
//
// The KV cache must be allocated by transport::UcxSlabAllocator.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/kv/connector.h"
#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"

namespace tandem::kv {

class UcxConnector : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  // model_identity: the engine's (what block hashes are made from).
  UcxConnector(const KvTransferConfig& config, engine::KvCache& cache,
               const std::string& model_identity);
  ~UcxConnector() override;

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return config_; }

  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override;
  FinishDecision requestFinished(const ConnectorRequest& request, std::span<const BlockId> blocks,
                                 int64_t num_computed_tokens) override;
  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override;
  void save(const ConnectorRequest&, int64_t, std::span<const BlockId>) override {}
  std::vector<std::string> pollReleased() override;

  // "key=value;..." describing the KV layout; peers must match exactly.
  const std::string& compatibility() const { return compatibility_; }

 private:
  StatusOr<std::shared_ptr<transport::UcxPeer>> peerFor(const std::string& serialized_slab);

  KvTransferConfig config_;
  engine::KvCache& cache_;
  std::shared_ptr<transport::UcxContext> context_;
  std::string compatibility_;
  std::string engine_id_;
  std::string serialized_slab_;
  transport::LocalSlab local_slab_;
  std::unordered_map<std::string, std::shared_ptr<transport::UcxPeer>> peers_;
  std::mutex released_mutex_;  // the message handler runs on UCX's progress thread
  std::vector<std::string> released_;
};

}  // namespace tandem::kv
