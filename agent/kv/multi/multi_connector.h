// The multi connector: an ordered list of connectors used as one (vLLM's
// MultiConnector), e.g. a host-memory tier in front of shared storage:
//   {"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [
//     {"kv_connector": "offload", "kv_connector_extra_config": {"capacity_blocks": 4096}},
//     {"kv_connector": "storage", "kv_connector_extra_config": {"shared_storage_path": "/kv"}}]}}
//
// - lookup(): every member is asked; the longest available answer wins, ties
//   go to the earlier member. If a member answers pending and no member
//   already offers every loadable block, the answer is pending (asked again
//   on a later step). The winner is remembered per request id.
// - load(): goes to the member that won that request's lookup; the result's
//   source names the member (its connector name) for the metrics. The other
//   members hear lookupNotTaken() (a ucx member that offered a transfer
//   releases it then).
// - save(): reaches every member (each applies its own kv_role).
// - requestFinished(): members are asked in order; the first whose decision
//   holds the blocks or returns kv_transfer_params wins, and later members are
//   not asked (a finished request's blocks can be held for one reader only).
// - validate(): every member must accept; releaseTarget(): the first member
//   that holds blocks for readers answers; holdEnded(): every member hears it
//   (only the one that holds ends anything).
// - poll(), pollReleased(): the members' lists, merged (finished loads name
//   their member as source); failureCounts(): the
//   members' counts summed.
//
// The top-level kv_role, kv_load_failure_policy and abort_timeout_s apply to
// the multi connector as a whole (a consumer-only multi saves nothing, a
// producer-only one looks nothing up); members keep their own kv_role.
// Members are parsed and validated with the top-level config
// (KvTransferConfig::members); a multi inside a multi is refused.
// Thread-safety: as its members (the engine thread, validate() and
// releaseTarget() from any thread).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/kv/connector.h"

namespace tandem::kv {

class MultiConnector : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  // `members` in priority order (built from config.members), over a KV cache
  // of `block_size` tokens per block.
  MultiConnector(const KvTransferConfig& config, int32_t block_size,
                 std::vector<std::unique_ptr<KvConnector>> members);
  // Builds each of config.members with makeConnector(); throws tandem::Error
  // naming the member (kv_connector_extra_config.connectors[i]) whose
  // construction failed.
  static std::unique_ptr<MultiConnector> create(const KvTransferConfig& config,
                                                engine::KvCache& cache,
                                                const std::string& model_identity);

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return config_; }
  std::map<std::string, int64_t> failureCounts() const override;
  // Every member advertises; the first member that serves a handshake
  // answers it.
  Status advertiseAddress(const std::string& listen_host, int port) override;
  StatusOr<nlohmann::json> handshake(const nlohmann::json& request) const override;
  // Every member must accept a control request (each checks its own secret).
  Status authorizeRequest(std::string_view path, const nlohmann::json& body) const override;
  // When any member checks signatures.
  bool verifiesRequests() const override;
  // The first member's that reports anything.
  nlohmann::json info() const override;

  Status validate(const nlohmann::json& kv_transfer_params) const override;
  StatusOr<std::string> releaseTarget(const nlohmann::json& kv_transfer_params) const override;
  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override;
  FinishDecision requestFinished(const ConnectorRequest& request, std::span<const BlockId> blocks,
                                 int64_t num_computed_tokens) override;
  void requestAbandoned(std::string_view request_id) override;
  void lookupNotTaken(std::string_view request_id) override;
  void holdEnded(std::string_view request_id) override;

  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override;
  void save(const ConnectorRequest& request, int64_t first_block,
            std::span<const BlockId> block_ids) override;
  std::vector<FinishedLoad> poll() override;
  std::vector<std::string> pollReleased() override;

  const std::vector<std::unique_ptr<KvConnector>>& members() const { return members_; }

 private:
  KvTransferConfig config_;
  int32_t block_size_;
  std::vector<std::unique_ptr<KvConnector>> members_;
  // Request id → index of the member whose lookup won, until its load or
  // its end.
  std::unordered_map<std::string, size_t> winners_;
};

}  // namespace tandem::kv
