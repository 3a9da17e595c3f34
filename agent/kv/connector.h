// The KV connector contract: how the engine learns that a request's KV can be
// had from outside (another agent, a shared filesystem, a host-memory tier),
// loads it into its own blocks, saves what it computed, and decides what
// happens to a finished request's blocks.
//
// Two sides, as in vLLM's KV connector v1:
// - KvConnectorScheduler: pure decisions over request state, on the engine
//   thread. lookup() may answer "pending" so a slow lookup never blocks the
//   batch: the request then waits (SequenceStatus::kWaitingForRemoteKv) and is
//   asked again on a later step.
// - KvConnectorWorker: moves bytes. load() fills blocks; synchronous
//   connectors finish before returning, asynchronous ones report completion
//   through poll(). Blocks that failed to load are reported by block index;
//   the engine recomputes only their token ranges (segmented prefill) or
//   fails the request, by policy, and never lets them into the prefix cache.
//
// The engine knows connectors only through this header; implementations live
// in agent/kv/<name>/ and are built by makeConnector() (connector_registry.h,
// the one file that names them) from a KvTransferConfig.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "common/block_hash.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace tandem::kv {

using engine::BlockId;

enum class KvRole { kProducer, kConsumer, kBoth };
enum class LoadFailurePolicy { kRecompute, kFail };

// --kv-transfer-config, vLLM's shape:
// {"kv_connector": "storage", "kv_role": "kv_both", "kv_connector_extra_config": {...}}
struct KvTransferConfig {
  std::string connector;  // "storage", "ucx", "offload" or "multi"
  KvRole role = KvRole::kBoth;
  LoadFailurePolicy load_failure_policy = LoadFailurePolicy::kRecompute;
  double abort_timeout_s = 120;  // held blocks are freed after this
  nlohmann::json extra = nlohmann::json::object();
  // multi: kv_connector_extra_config.connectors, parsed, in order. Members
  // carry the multi's kv_load_failure_policy and abort_timeout_s.
  std::vector<KvTransferConfig> members;

  bool produces() const { return role != KvRole::kConsumer; }
  bool consumes() const { return role != KvRole::kProducer; }
  // Parses the JSON text; errors name the field and what is accepted.
  static StatusOr<KvTransferConfig> parse(const std::string& json_text);
};

// The shared KV secret: kv_connector_extra_config.secret, else the
// environment's TANDEM_KV_SECRET; empty when neither is set.
inline std::string kvSecret(const KvTransferConfig& config) {
  auto it = config.extra.find("secret");
  if (it != config.extra.end() && it->is_string()) return it->get<std::string>();
  const char* env = std::getenv("TANDEM_KV_SECRET");
  return env != nullptr ? env : "";
}

// A connector's capacity in whole items of `item_bytes` from its extra
// config: "capacity_blocks" (a positive integer) or "capacity_bytes" (a
// positive integer, rounded down to whole items), at most one of them. 0
// when neither is given and `required` is false. Throws tandem::Error,
// prefixed with `connector` (e.g. "offload connector"), naming the field and
// what is accepted.
int64_t extraCapacityBlocks(const nlohmann::json& extra, const std::string& connector,
                            size_t item_bytes, bool required);

// What a connector sees of a request.
struct ConnectorRequest {
  std::string_view request_id;
  std::span<const TokenId> tokens;
  // Hashes of the request's full blocks, in order (block i covers tokens
  // [i * block_size, (i + 1) * block_size)).
  std::span<const BlockHash> block_hashes;
  const nlohmann::json* kv_transfer_params = nullptr;  // null when absent
  // The request was admitted before and has since lost its blocks
  // (preempted): a remote source its kv_transfer_params name was read or
  // declined then, and its producer has let those blocks go; it is never
  // read again.
  bool remote_source_spent = false;
};

struct LookupResult {
  enum class State { kNone, kAvailable, kPending };
  State state = State::kNone;
  // Tokens available right after the locally cached ones; a whole number of
  // blocks, never reaching the request's last token.
  int64_t num_tokens = 0;
};

// What happens to a finished request's blocks.
struct FinishDecision {
  // true: keep the blocks for a remote reader until the worker reports the
  // transfer released (pollReleased) or the hold times out.
  bool hold = false;
  nlohmann::json kv_transfer_params;  // for the client's final response; null if none
  // The reader reads a copy the connector made (a staging area), never
  // these blocks: the engine may free them while the hold lasts.
  bool copied = false;
};

class KvConnectorScheduler {
 public:
  virtual ~KvConnectorScheduler() = default;
  // Checks a request's kv_transfer_params when it arrives, before it is
  // queued: InvalidArgument naming the field (e.g. a block id outside what
  // the peer advertised), PermissionDenied when they are not signed with
  // this agent's shared secret, FailedPrecondition when the peer's KV layout
  // differs. Called on any thread: reads only immutable state.
  virtual Status validate(const nlohmann::json& kv_transfer_params) const { return Status::ok(); }
  // The request whose held blocks `kv_transfer_params` (as this agent
  // returned them) name, for an explicit release by whoever abandons the
  // transfer. Same errors as validate(); Unimplemented for connectors that
  // never hold blocks. Any thread.
  virtual StatusOr<std::string> releaseTarget(const nlohmann::json& kv_transfer_params) const {
    return Status(StatusCode::kUnimplemented, "this KV connector holds no blocks for readers");
  }
  // How many tokens after the first num_local_tokens (already in this
  // agent's prefix cache) can be loaded.
  virtual LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) = 0;
  // The request finished normally; `blocks` is its block table, whose first
  // num_computed_tokens / block_size blocks are full and computed.
  virtual FinishDecision requestFinished(const ConnectorRequest& request,
                                         std::span<const BlockId> blocks,
                                         int64_t num_computed_tokens) {
    return {};
  }
  // The request ended any other way (aborted, failed, handed over, refused
  // after a lookup): the connector forgets what it kept for it. Engine
  // thread, once per request that requestFinished() is not called for.
  virtual void requestAbandoned(std::string_view request_id) {}
  // This connector's lookup() answered available for the request, but the
  // request loads from elsewhere (a multi connector's other member won): the
  // connector lets go of what its answer kept (a remote hold, say) now
  // rather than when the request ends, and offers nothing more for it.
  // Engine thread.
  virtual void lookupNotTaken(std::string_view request_id) {}
  // A hold that requestFinished() asked for has ended (released, timed out,
  // replaced): called on the engine thread just BEFORE its blocks go back to
  // the pool, so that no reader takes what they hold next for the request's
  // KV. Never for a hold replaced under the same id (requestFinished() for
  // the new one ended the old one).
  virtual void holdEnded(std::string_view request_id) {}
};

struct LoadResult {
  bool done = true;  // false: asynchronous, completion comes through poll()
  // Indices (into the request's block table) of blocks that did not load.
  std::vector<int64_t> failed_block_indices;
  // Where the loaded blocks came from, for metrics ("source" label); empty:
  // the connector's name. A multi connector names the member that served.
  std::string source;
};

// Load failures by reason, for tandem_kv_transfer_failures_total{reason}.
// Connectors count every failed lookup or load (a refused peer, a block that
// did not arrive, a corrupted file); the engine publishes the totals.
// Thread-safe.
class FailureCounts {
 public:
  void add(const std::string& reason, int64_t count = 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_[reason] += count;
  }
  std::map<std::string, int64_t> snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> counts_;
};

class KvConnectorWorker {
 public:
  virtual ~KvConnectorWorker() = default;
  // Fills blocks [first_block, first_block + block_ids.size()) of the request
  // (block_ids are this agent's ids for them).
  virtual LoadResult load(const ConnectorRequest& request, int64_t first_block,
                          std::span<const BlockId> block_ids) = 0;
  // Saves full, computed blocks [first_block, first_block + block_ids.size()).
  virtual void save(const ConnectorRequest& request, int64_t first_block,
                    std::span<const BlockId> block_ids) = 0;

  // An asynchronous load that has finished (its blocks are written or failed).
  struct FinishedLoad {
    std::string request_id;
    std::vector<int64_t> failed_block_indices;
    // For metrics: where from (empty: the connector's name), how many blocks
    // were asked for (0: not reported) and how long the load took.
    std::string source;
    int64_t num_blocks = 0;
    double seconds = 0;
    // The blocks were read from another agent (a P→D hand-off or a
    // pull-back of a lent prefix), not from a local tier or shared storage:
    // a simulated engine times such loads by its profile's KV link.
    bool from_peer = false;
  };
  // Loads that finished since the last call. Until a load is reported here,
  // the engine keeps its blocks allocated, even if the request was aborted.
  virtual std::vector<FinishedLoad> poll() { return {}; }
  // Request ids whose held blocks the remote reader has released.
  virtual std::vector<std::string> pollReleased() { return {}; }
};

// A connector: both sides over one KV cache.
class KvConnector {
 public:
  virtual ~KvConnector() = default;
  virtual KvConnectorScheduler& scheduler() = 0;
  virtual KvConnectorWorker& worker() = 0;
  virtual const KvTransferConfig& config() const = 0;
  // Failures so far by reason (cumulative).
  virtual std::map<std::string, int64_t> failureCounts() const { return failures_.snapshot(); }
  // Where this agent's HTTP server answers, once bound (listen_host may be a
  // wildcard such as 0.0.0.0): a connector whose descriptors name this agent
  // decides here what host and port peers reach it at. FailedPrecondition
  // naming the options when it cannot tell a reachable address. Start-up,
  // before the first request.
  virtual Status advertiseAddress(const std::string& listen_host, int port) { return Status::ok(); }
  // Answers a peer's KV handshake (POST /v1/kv_transfer/handshake): what a
  // reader needs to read this agent's blocks. NotFound for connectors that
  // serve none; InvalidArgument / PermissionDenied for a request they refuse.
  // Any thread: reads only state fixed at start-up.
  virtual StatusOr<nlohmann::json> handshake(const nlohmann::json& request) const {
    return notFound("this agent's KV connector serves no KV handshake");
  }
  // Checks a control request to this agent's /v1/kv_transfer/<path> whose
  // body alone does not authenticate it (a pull-back hold): with a shared KV
  // secret the body must be signed with it (common/kv_auth.h), else
  // PermissionDenied naming the kv_auth field (counted as "auth"). OK for
  // connectors without a secret. Any thread.
  virtual Status authorizeRequest(std::string_view path, const nlohmann::json& body) const {
    return Status::ok();
  }
  // Whether authorizeRequest checks signatures (the connector has a KV
  // secret). Without, the engine checks control requests against
  // TANDEM_KV_SECRET itself.
  virtual bool verifiesRequests() const { return false; }
  // What /health reports about this connector's buffers (e.g. the ucx
  // connector's KV buffer path and staging slots in use); null when nothing.
  // Any thread.
  virtual nlohmann::json info() const { return nullptr; }

 protected:
  mutable FailureCounts failures_;  // counted from const checks too
};

}  // namespace tandem::kv
