// The UCX transport: one-sided reads of KV blocks between agent processes and
// small notifications back to the block owner.
//
// One UcxContext per agent owns the UCX context, one worker and the thread
// that progresses it. The owner of KV blocks allocates its slab through a
// UcxSlabAllocator (ucx_allocator.h) and advertises it as a RemoteSlab; a
// reader connects to that RemoteSlab, gets a UcxPeer, and pulls blocks into
// its own slab with UcxPeer::readBlocks(). The owner never takes part in a
// read over shared memory; over TCP UCX emulates the read with messages that
// the owner's progress thread answers. When done the reader tells the owner
// with UcxPeer::notify(), which reaches the owner's message handler.
//
// Transports are UCX's choice: UCX_TLS and the other UCX_* variables in the
// environment apply (e.g. UCX_TLS=sm on one host, UCX_TLS=tcp). Tandem only
// supplies defaults for variables left unset: shared-memory error handling
// on, keepalive every second (UcxContextOptions).
//
// Thread-safety: the worker runs in UCS_THREAD_MODE_MULTI. Every public
// method may be called from any thread, concurrently, except destructors.
// The progress thread alone drives ucp_worker_progress(), so UCX callbacks
// and the message handler run on it; a handler that connects, reads or
// notifies progresses the worker itself while it waits.
//
// Errors: UcxContext::create throws tandem::Error (start-up); every other
// call returns a Status (or nullptr from the allocator) naming what failed.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/transport/remote_slab.h"
#include "common/status.h"

// UCX handle types, so that this header does not pull in <ucp/api/ucp.h>.
struct ucp_context;
struct ucp_worker;
struct ucp_ep;
struct ucp_rkey;
struct ucp_mem;

namespace tandem::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Destination of reads: the reader's own slab cut into blocks. memory_handle
// is the UCX registration of `base` when there is one (UcxSlabAllocator
// supplies it); reads into other memory work but UCX registers it on the fly.
struct LocalSlab {
  uint8_t* base = nullptr;
  uint64_t block_bytes = 0;
  int64_t num_blocks = 0;
  ucp_mem* memory_handle = nullptr;
};

// Read remote block `remote_block` of the peer into local block `local_block`.
struct BlockPair {
  engine::BlockId remote_block = 0;
  engine::BlockId local_block = 0;
};

struct ReadResult {
  // OK when every pair was read. InvalidArgument when a block id or the slab
  // geometry is wrong (nothing is read then); Unavailable when the peer is
  // unreachable or an operation failed; DeadlineExceeded when operations were
  // still running at the deadline.
  Status status;
  // ucp_get_nbx calls issued (0 when nothing was): pairs whose remote and
  // local ids both run consecutively are read with one call.
  int64_t num_operations = 0;
  uint64_t bytes_read = 0;
  // Local blocks whose contents are not the peer's (ascending). Empty when
  // status is OK; every requested local block when nothing was read. The
  // caller recomputes these.
  std::vector<engine::BlockId> failed_local_blocks;
};

struct UcxContextOptions {
  // How long the progress thread keeps polling after the last event before
  // it sleeps on the worker's event file descriptor. It never sleeps while a
  // read, notification or endpoint close of this process is in flight.
  std::chrono::microseconds idle_spin{100};
  // How often UCX checks that connected peers are alive (UCX_KEEPALIVE_
  // INTERVAL, which wins when set). Over shared memory this is how long a
  // dead owner's memory may still be read: it stays mapped here, and its
  // last contents are served until the check fails.
  std::chrono::milliseconds keepalive_interval{1000};
  // When a peer's slab is mapped into this process (shared memory), connect
  // populates the page tables of its first prefault_bytes (stopping at the
  // connect deadline). Reads of pages not yet touched here take a page fault
  // each and run ~10x slower (2.4 against 24 GB/s measured); populating
  // costs ~0.2 s per GiB up front. Worth it when connecting ahead of the
  // first transfer, not when connect sits on a request path. 0 disables.
  uint64_t prefault_bytes = 0;
};

class UcxPeer;
struct UcxBatch;  // operations issued and awaited together (ucx_transport.cpp)

class UcxContext : public std::enable_shared_from_this<UcxContext> {
 public:
  // Initializes UCX (features RMA, active messages, wakeup), creates the
  // worker and starts the progress thread. Throws tandem::Error when UCX
  // cannot be initialized or the worker is not thread-safe. Start-up only:
  // unless already set, it sets UCX_POSIX_ERROR_HANDLING and
  // UCX_SYSV_ERROR_HANDLING to "y" in the environment (UCX reads these only
  // from there; without them shared-memory transports cannot serve endpoints
  // that detect peer failure), so no other thread may be reading the
  // environment meanwhile.
  static std::shared_ptr<UcxContext> create(const UcxContextOptions& options = {});
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  // The serialized worker address peers connect to (binary bytes).
  const std::string& workerAddress() const { return worker_address_; }

  // Called on the progress thread with the payload of every notification
  // this agent receives, in arrival order per sender. Replaces the previous
  // handler; once this returns the old one is not running and will not run.
  // Messages arriving while none is set are dropped. The handler must not
  // block for long (over TCP it also serves this agent's blocks to readers),
  // must not call setMessageHandler, and must not drop the last reference to
  // this context.
  void setMessageHandler(std::function<void(std::string)> handler);

  // Connects to the agent that advertised `remote`: creates the endpoint,
  // unpacks its remote key once and warms it with one small read. Unavailable
  // when the peer cannot be reached or the key is refused, DeadlineExceeded
  // when the warm-up read does not finish in time. The RemoteSlab must come
  // from a trusted (authenticated) handshake: UCX parses its bytes, and
  // checkPeerAddress() below is only a sanity check (InvalidArgument when it
  // fails; nothing reaches UCX then).
  StatusOr<std::shared_ptr<UcxPeer>> connect(const RemoteSlab& remote, Deadline deadline);

  // Whether `address` has the shape of a worker address this UCX can parse:
  // a plausible length and the same address header (format version and
  // flags) as this context's own worker address. UCX aborts the process on
  // some malformed addresses (e.g. an unknown version); this refuses those
  // before UCX sees them. It cannot prove the rest of the bytes well formed:
  // only an authenticated source can. InvalidArgument naming what differs.
  Status checkPeerAddress(std::string_view address) const;
  // The same for a packed remote key: a plausible length.
  static Status checkPackedRkey(std::string_view packed_rkey);

  // Notifications received so far (for metrics and tests).
  uint64_t messagesReceived() const { return messages_received_.load(); }

  // The memory types this UCX can register and move (ucp_context_query's
  // UCP_ATTR_FIELD_MEMORY_TYPES), by UCX's names: "host", "cuda", ... A UCX
  // built without CUDA support answers without "cuda"; such a context cannot
  // read into or serve device memory. Fixed at create(); any thread.
  const std::vector<std::string>& memoryTypes() const { return memory_types_; }
  bool supportsCudaMemory() const { return supports_cuda_; }

  // Whether ucp_mem_map(ALLOCATE) hands out memory fresh from the kernel
  // (zero-filled pages, not yet touched): true when this context chose the
  // allocation methods (kFreshAllocationMethods, UCX_ALLOC_PRIO unset), false
  // when the environment chose them (they may include "heap" or "thp",
  // which recycle malloc'd memory). Fixed at create(); any thread.
  bool allocationsAreFresh() const { return fresh_allocations_; }

 private:
  friend class UcxPeer;
  friend class UcxSlabAllocator;
  friend struct UcxCallbacks;

  explicit UcxContext(const UcxContextOptions& options);
  void shutdown();
  void progressLoop();
  void waitForEvents();
  void receiveMessage(std::string message);
  void deliverMessages();
  // Waits for a batch's operations; on the progress thread (a message
  // handler calling notify) it progresses the worker itself.
  bool waitFor(UcxBatch& batch, Deadline deadline);
  // While a caller holds a BusyScope the progress thread does not sleep.
  struct BusyScope {
    explicit BusyScope(UcxContext& context);
    ~BusyScope();
    UcxContext& context;
  };
  // Keeps objects UCX may still call back into until the worker is gone.
  void retire(std::shared_ptr<void> object);

  UcxContextOptions options_;
  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  int event_fd_ = -1;
  std::string worker_address_;
  std::vector<std::string> memory_types_;
  bool supports_cuda_ = false;
  bool fresh_allocations_ = false;

  std::thread progress_thread_;
  std::atomic<std::thread::id> progress_thread_id_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> busy_{0};

  std::mutex inbox_mutex_;
  std::vector<std::string> inbox_;
  std::atomic<bool> inbox_nonempty_{false};
  std::mutex handler_mutex_;
  std::function<void(std::string)> handler_;
  std::atomic<uint64_t> messages_received_{0};

  std::mutex retired_mutex_;
  std::vector<std::shared_ptr<void>> retired_;
};

// A connection to one peer's slab. Made by UcxContext::connect(); keeps the
// context alive. Once an operation misses its deadline or UCX reports the
// peer failed, the peer stays failed (health() says why) and every later
// call returns Unavailable: connect again for a fresh one.
class UcxPeer {
 public:
  // Closes the endpoint, letting notifications already sent go out (bounded
  // wait; forced when the peer failed), then destroys the unpacked remote
  // key, which is what unmaps the peer's slab from this process (shared
  // memory). No call on this peer may still be running.
  ~UcxPeer();
  UcxPeer(const UcxPeer&) = delete;
  UcxPeer& operator=(const UcxPeer&) = delete;

  const RemoteSlab& remote() const { return remote_; }
  // OK while usable, else the reason it is not.
  Status health() const;
  // Marks the peer failed for `reason` (a peer known dead or replaced): every
  // later call returns Unavailable, and the destructor closes the endpoint
  // with force instead of waiting for the peer to confirm.
  void markFailed(const std::string& reason);

  // Reads every pair's remote block into its local block and returns when
  // all are done or the deadline passes. Ids are validated first: a remote
  // id outside [0, remote().num_blocks), a local id outside the local slab
  // or a local block named twice fails the whole call with InvalidArgument
  // naming the id, before anything is read; so does a deadline already
  // past (DeadlineExceeded). When the deadline passes with reads in flight
  // the endpoint is closed (the peer is failed from then on) so that no late
  // read can land in local memory afterwards; reads that finished count.
  // Over shared memory a read does not involve the owner at all.
  [[nodiscard]] ReadResult readBlocks(const LocalSlab& local, std::span<const BlockPair> pairs,
                                      Deadline deadline);

  // A second region of the same peer, read a word at a time (readWord): its
  // packed remote key is unpacked on this peer's endpoint. `words` names the
  // peer's worker address (it must be this peer's), the region's base, 8 as
  // its block size and its word count. InvalidArgument when it is malformed
  // or names another worker; Unavailable when UCX refuses the key or the
  // peer is failed. Once per peer (FailedPrecondition after), before any
  // readWord, from the thread that then reads.
  Status attachWords(const RemoteSlab& words);
  // Reads word `index` of the attached region: its 8 bytes as they lie in
  // the peer's memory, in one operation issued after every earlier call on
  // this peer has returned (so after the reads of an earlier readBlocks
  // completed). InvalidArgument when nothing is attached or the index is
  // outside the region; Unavailable / DeadlineExceeded as readBlocks.
  StatusOr<std::array<uint8_t, 8>> readWord(int64_t index, Deadline deadline);

  // Sends `message` to the peer's message handler as one active message (at
  // most kMaxMessageBytes). OK means UCX has taken the message; it is
  // delivered unless the peer dies.
  Status notify(std::string_view message, Deadline deadline);
  static constexpr size_t kMaxMessageBytes = 1 << 20;

 private:
  friend class UcxContext;
  friend struct UcxCallbacks;
  struct EndpointState;

  UcxPeer(std::shared_ptr<UcxContext> context, RemoteSlab remote);
  // Issues the batch's operations (under the endpoint lock), waits for them,
  // and closes the endpoint when the deadline passes.
  Status runBatch(const std::shared_ptr<UcxBatch>& batch, Deadline deadline);
  void closeEndpoint(bool force);
  void prefault(uint64_t limit_bytes, Deadline deadline);

  std::shared_ptr<UcxContext> context_;
  RemoteSlab remote_;
  RemoteSlab words_;  // attachWords(); num_blocks 0 when none
  std::shared_ptr<EndpointState> state_;
  mutable std::shared_mutex endpoint_mutex_;  // exclusive to close, shared to post
  ucp_ep* endpoint_ = nullptr;
  ucp_rkey* rkey_ = nullptr;
  ucp_rkey* words_rkey_ = nullptr;
};

}  // namespace tandem::transport
