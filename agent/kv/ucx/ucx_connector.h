// The ucx connector: the prefill → decode hand-off between agents with
// one-sided UCX reads (DESIGN.md, "The P→D protocol"; docs/kv-transfer.md).
//
// Producer (prefill agent): a request with kv_transfer_params
// {"do_remote_decode": true} finishes normally, its blocks are held, and the
// response carries a transfer descriptor naming only the producer:
//   {"remote_engine_id", "remote_host", "remote_port" (this agent's HTTP
//    address), "remote_num_blocks" (its slab's block count),
//    "remote_block_ids", "remote_num_tokens", "transfer_id", "compatibility",
//    "remote_hold_slot", "remote_hold_ticket" (hold_tickets.h),
//    "signature" (with a shared secret)}.
// No UCX address or memory key is in anything a client sends or sees: a
// reader fetches them from the producer itself with an authenticated
// handshake (POST /v1/kv_transfer/handshake, answered by handshake()).
// The blocks are freed when the reader's release message arrives, when the
// router releases them explicitly (Engine::releaseTransfer), or after
// abort_timeout_s.
//
// Consumer (decode agent): a request with {"do_remote_prefill": true, ...a
// descriptor} first matches its own prefix cache, then reads only the blocks
// it lacks straight into its own blocks, checks that the producer still
// held them while they were read (the hold's ticket, read after them), and
// tells the producer to release them. Pull-back (decode → prefill): a request with
// {"remote_prefix": <descriptor>} — a prefix a decode agent holds — reads
// those blocks when at least remote_pull_threshold (default 4) of them are
// missing here, and recomputes otherwise.
//
// Checks at admission (validate): descriptor shape, every block id inside
// [0, remote_num_blocks) and named once, signature (PermissionDenied),
// compatibility — model identity, KV dtype, block size, layers, KV heads,
// head size, protocol version; FailedPrecondition naming the field that
// differs —, remote_num_tokens = ids × block size ≤ the prompt.
//
// Peers (loader thread): the handshake's answer must name the descriptor's
// engine id, our compatibility, our block bytes and remote_num_blocks, and
// be signed over our nonce when there is a secret; the UCX address is then
// sanity-checked (UcxContext::checkPeerAddress) before UCX sees it. One
// endpoint and unpacked memory key per engine id, dropped (unmapping the
// peer's slab) when the peer fails, when its host:port answers as another
// engine (a restart), or after peer_idle_timeout_s (default 60) unused.
// Anything wrong with the fetched data fails the load, which is recomputed
// (or fails the request, by kv_load_failure_policy), counted by reason.
//
// Shared secret: kv_connector_extra_config.secret, else TANDEM_KV_SECRET.
// With one, descriptors, handshakes, release messages and control requests
// (a pull-back hold, authorizeRequest) carry HMAC-SHA256 signatures and
// unsigned or wrongly signed ones are refused. It
// authenticates the control plane; neither the handshake nor UCX's data
// plane is encrypted (docs/kv-transfer.md).
//
// Advertised address (advertiseAddress): kv_connector_extra_config.
// advertise_host when set; else the HTTP listen host, unless that is a
// wildcard (0.0.0.0, ::), then the POD_IP environment variable; else a
// producer refuses to start.
//
// KV buffer (kv_buffer.h; docs/kv-transfer.md, "KV buffer: slab or
// staging"): on the slab path the KV cache must be allocated by
// transport::UcxSlabAllocator and UCX moves slab bytes directly. On the
// staging path the slab may be any memory (a device slab included) and only
// a host staging area of staging_blocks slots is registered with UCX:
// - producer: requestFinished() copies the held blocks into free slots
//   (Backend::readBlocks, engine thread) and the descriptor names the slots
//   (remote_num_blocks = the staging capacity), so readers cannot tell the
//   paths apart. The slots are freed with the hold, after its ticket
//   (endHold): the reader's release message, an explicit release
//   (releaseTarget), the engine ending it (holdEnded), or abort_timeout_s. With
//   too few free slots the descriptor offers no blocks (the reader
//   recomputes) and staging_full is counted.
// - consumer: the loader thread GETs into free slots of its own area; poll()
//   (engine thread) copies them into the slab (Backend::writeBlocks) before
//   reporting the load, then frees them. Too few free slots fail the load
//   with staging_full (recomputed by policy).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "agent/kv/connector.h"
#include "agent/kv/fault_injection.h"
#include "agent/kv/ucx/hold_tickets.h"
#include "agent/kv/ucx/kv_buffer.h"
#include "agent/transport/locked_memory.h"
#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"
#include "common/kv_auth.h"

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

  Status advertiseAddress(const std::string& listen_host, int port) override;
  StatusOr<nlohmann::json> handshake(const nlohmann::json& request) const override;
  // With a secret: the body must carry a kv_auth signed with it
  // (common/kv_auth.h), fresh and not seen before.
  Status authorizeRequest(std::string_view path, const nlohmann::json& body) const override;

  Status validate(const nlohmann::json& params) const override;
  StatusOr<std::string> releaseTarget(const nlohmann::json& params) const override;
  bool verifiesRequests() const override { return request_verifier_ != nullptr; }
  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override;
  FinishDecision requestFinished(const ConnectorRequest& request, std::span<const BlockId> blocks,
                                 int64_t num_computed_tokens) override;
  void requestAbandoned(std::string_view request_id) override;
  void lookupNotTaken(std::string_view request_id) override;
  void holdEnded(std::string_view request_id) override;
  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override;
  void save(const ConnectorRequest&, int64_t, std::span<const BlockId>) override {}
  std::vector<FinishedLoad> poll() override;
  std::vector<std::string> pollReleased() override;

  // {"kv_buffer": "slab"|"staging", "ucx_memory_types": [...], and on the
  // staging path "staging_blocks", "staging_blocks_used"}. Any thread.
  nlohmann::json info() const override;
  KvBufferPath bufferPath() const { return buffer_path_; }

  // "key=value;..." describing the KV layout; peers must match exactly.
  const std::string& compatibility() const { return compatibility_; }

  // Where a reader finds blocks: a producer's answer, or a prefix a decode
  // agent holds for pull-back.
  struct Descriptor {
    std::string transfer_id;
    std::string engine_id;
    std::string host;  // the producer's HTTP host and port (its handshake)
    int port = 0;
    int64_t num_blocks = 0;  // the producer's slab, in blocks
    std::string compatibility;
    std::string signature;           // empty when unsigned
    std::vector<int64_t> block_ids;  // each in [0, num_blocks)
    int64_t num_tokens = 0;
    // remote_last_block_hashes: the producer's hashes of its last one or
    // two offered blocks (hex, in order), which chain over every token and
    // block before them; empty when absent.
    std::vector<std::string> last_block_hashes;
    // remote_hold_until_ms: when the producer lets the blocks go (Unix
    // milliseconds, its clock: it may reuse them after); 0 when absent.
    int64_t hold_until_ms = 0;
    // remote_hold_slot / remote_hold_ticket: the word of the producer's
    // hold table and the ticket it holds while the blocks are held
    // (hold_tickets.h); -1 / empty when absent (no blocks offered).
    int64_t hold_slot = -1;
    std::string hold_ticket;
  };

 private:
  // Field types and ranges; errors name `field`.<name>.
  StatusOr<Descriptor> parseDescriptor(const nlohmann::json& params,
                                       const std::string& field) const;
  // Whether the request's own hash of the last of the `blocks` it would read
  // is the producer's (true when the producer sent none).
  static bool samePrefix(const Descriptor& d, const ConnectorRequest& request, int64_t blocks);
  // validate() without the failure count.
  Status checkParams(const nlohmann::json& params) const;
  // Signature, compatibility, token count and duplicate ids.
  Status checkDescriptor(const Descriptor& d, const std::string& field) const;
  // The descriptor a request reads from (its own params or remote_prefix);
  // null when it reads nothing.
  const nlohmann::json* sourceOf(const ConnectorRequest& request) const;
  struct LoadJob {
    std::string request_id;
    Descriptor source;  // block_ids unused: pairs say what to read
    int64_t first_block = 0;
    std::vector<transport::BlockPair> pairs;
    bool release_only = false;  // read nothing, only let the lender go
  };
  // A finished load and, on the staging path, what poll() still copies from
  // staging slots into slab blocks (then frees the slots).
  struct LoadOutcome {
    FinishedLoad finished;
    struct Staged {
      BlockId slot;   // where the block arrived in the staging area
      BlockId block;  // the slab block it is copied into
      int64_t index;  // the block's index in the request (a failed one's)
    };
    std::vector<Staged> staged;  // blocks that arrived
    std::vector<BlockId> slots;  // every slot the load took
  };
  // Copies between a slab block and the staging area (engine thread),
  // through the backend; they throw where the fault injection says.
  void copyOutOfSlab(BlockId block, uint8_t* staging);
  void copyIntoSlab(BlockId block, const uint8_t* staging);
  void enqueue(LoadJob job);
  // Queues a job that reads nothing and only lets the owner of `source` go.
  void enqueueRelease(const std::string& request_id, Descriptor source);
  // Releases the transfer offered_ holds for the request, if any: whether
  // there was one.
  bool releaseOffered(const std::string& request_id);
  // The request ended (finished or abandoned): what its lookup offered and
  // it never loaded is released, and its decline forgotten.
  void requestEnded(const std::string& request_id);
  // Loader thread: runs queued reads one after the other, and drops idle or
  // failed peers between them.
  void loaderLoop();
  LoadOutcome runLoad(const LoadJob& job);
  // Staging slots: n free ones taken (empty when fewer are free), or given
  // back. Any thread.
  std::vector<BlockId> takeSlots(int64_t n);
  void freeSlots(const std::vector<BlockId>& slots);
  // Puts slots back on the free list; staging_mutex_ held.
  void returnSlotsLocked(const std::vector<BlockId>& slots) const;
  // Ends a hold: its ticket, then the slots it was copied into (either
  // absent: nothing happens). Any thread.
  void endHold(const std::string& transfer_id) const;
  // Frees the slots a held transfer was copied into (none: nothing happens).
  void freeStagedHold(const std::string& transfer_id) const;
  // Frees the slots of holds past abort_timeout_s.
  void freeExpiredHolds();
  // Producer, staging path: copies `blocks` into free slots and returns them
  // (empty when too few are free). Engine thread.
  std::vector<BlockId> stageBlocks(std::span<const BlockId> blocks);
  // A failure of peerFor(): the reason label and what happened.
  struct PeerFailure {
    std::string reason;
    Status status;
  };
  struct Handshake {
    std::string engine_id;
    std::string compatibility;
    std::string slab_text;
    std::string holds_text;
  };
  // How long before the producer's hold ends (hold_until_ms, less a margin
  // for clocks and transit) a read must be done; nullopt when the
  // descriptor does not say.
  static std::optional<transport::Clock::duration> timeLeftToRead(const Descriptor& d);
  // Loader thread only (peers_ is its own).
  std::shared_ptr<transport::UcxPeer> peerFor(const Descriptor& source,
                                              transport::Deadline deadline, PeerFailure* failure);
  StatusOr<Handshake> fetchHandshake(const std::string& host, int port,
                                     transport::Deadline deadline, std::string* reason) const;
  // Drops peers that failed or sat unused past peer_idle_timeout_s.
  void dropStalePeers();
  // Drops peers last reached at host:port other than `engine_id` (that
  // address now answers as engine_id: they restarted or moved).
  void dropReplacedPeers(const std::string& host, int port, const std::string& engine_id);
  void sendRelease(transport::UcxPeer& peer, const std::string& transfer_id);
  // Progress thread: release messages from readers.
  void onMessage(const std::string& message);

  KvTransferConfig config_;
  engine::KvCache& cache_;
  std::shared_ptr<transport::UcxContext> context_;
  std::string compatibility_;
  std::string secret_;
  std::unique_ptr<kv_auth::RequestVerifier> request_verifier_;  // set when secret_ is
  int64_t pull_threshold_blocks_ = 4;
  FaultInjection faults_;
  std::string engine_id_;
  std::string serialized_slab_;
  int64_t num_slab_blocks_ = 0;
  transport::LocalSlab local_slab_;
  // Set once at start-up (advertiseAddress), read by requestFinished.
  mutable std::mutex advertised_mutex_;
  std::string advertised_host_;
  int advertised_port_ = 0;

  struct PeerEntry {
    std::string host;
    int port = 0;
    std::shared_ptr<transport::UcxPeer> peer;
    transport::Clock::time_point last_used;
  };
  std::unordered_map<std::string, PeerEntry> peers_;  // by engine id; loader thread
  // Peers that did not answer (unreachable, timed out), by host:port, and
  // when: jobs for them within read_timeout_ after fail at once rather than
  // wait a read timeout each while every job behind them waits too.
  std::unordered_map<std::string, transport::Clock::time_point> down_peers_;  // loader thread
  transport::Clock::duration peer_idle_timeout_ = std::chrono::seconds(60);
  std::mutex released_mutex_;  // the message handler runs on UCX's progress thread
  std::vector<std::string> released_;
  transport::Clock::duration read_timeout_ = std::chrono::seconds(10);

  std::mutex jobs_mutex_;
  std::condition_variable jobs_ready_;
  std::deque<LoadJob> jobs_;
  bool stopping_ = false;
  std::mutex finished_mutex_;
  std::vector<LoadOutcome> finished_;

  // KV buffer.
  KvBufferPath buffer_path_ = KvBufferPath::kSlab;
  std::vector<std::string> ucx_memory_types_;
  // What registering the KV buffer for RDMA depends on (read at start).
  transport::LockedMemory locked_memory_;
  std::unique_ptr<transport::UcxSlabAllocator> staging_allocator_;  // staging path only
  uint8_t* staging_base_ = nullptr;
  int64_t staging_capacity_ = 0;  // slots
  bool staging_pinned_ = false;   // the staging area is page-locked by the backend
  struct StagedHold {
    std::vector<BlockId> slots;
    transport::Clock::time_point deadline;
  };
  // Guards free_slots_ and staged_holds_ (engine, loader and progress threads).
  mutable std::mutex staging_mutex_;
  mutable std::vector<BlockId> free_slots_;
  mutable std::unordered_map<std::string, StagedHold> staged_holds_;  // by transfer id
  std::thread loader_;
  // Requests that read nothing of their transfer and released it; engine
  // thread. Forgotten when the request ends (finished or abandoned).
  std::unordered_set<std::string> declined_;
  // Requests whose lookup offered their transfer and that have not loaded
  // it (the descriptor, its block ids dropped); engine thread. Released when
  // another connector serves them or they end without loading.
  std::unordered_map<std::string, Descriptor> offered_;
  // Producer: the hold tickets and their registered words.
  std::unique_ptr<transport::UcxSlabAllocator> holds_allocator_;
  uint8_t* holds_base_ = nullptr;
  std::unique_ptr<HoldTickets> tickets_;
  std::string serialized_holds_;
};

}  // namespace tandem::kv
