#include "agent/transport/ucx_transport.h"

#include <poll.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/logging.h"

namespace tandem::transport {
namespace {

// Active-message id of notifications.
constexpr unsigned kNotifyMessageId = 17;
// Bytes the warm-up read at connect pulls from the peer's block 0.
constexpr uint64_t kWarmupBytes = 64;
// Longest the progress thread sleeps without looking at the stop flag.
constexpr int kMaxSleepMs = 100;
// How long closing an endpoint (and draining what a forced close cancels)
// may take before its bookkeeping is parked until the worker is destroyed.
constexpr auto kCloseWait = std::chrono::seconds(5);
// UCX's default allocation order (1.13: md:sysv,md:posix,huge,thp,md:*,mmap,
// heap) less the methods that can return recycled memory: "thp" and "heap"
// are posix_memalign, and "md:*" may name a domain whose allocator is not
// the kernel's. What is left is shared memory (System V or POSIX, a new
// segment each time), huge pages (a new System V segment) or an anonymous
// mmap: every page zero-filled by the kernel on first touch.
constexpr const char* kFreshAllocationMethods = "md:sysv,md:posix,huge,mmap";

// Whether UCX_TLS lets UCX pick a shared-memory transport (so that setting
// their options does not draw UCX's "unused variable" warning).
bool mayUseSharedMemory(const char* tls) {
  if (tls == nullptr || tls[0] == '^') return true;  // unset, or an exclusion list
  std::string_view list(tls);
  for (std::string_view name : {"all", "sm", "shm", "posix", "sysv"}) {
    size_t at = list.find(name);
    while (at != std::string_view::npos) {
      size_t end = at + name.size();
      bool starts = at == 0 || list[at - 1] == ',';
      bool ends = end == list.size() || list[end] == ',' || list[end] == ':';
      if (starts && ends) return true;
      at = list.find(name, at + 1);
    }
  }
  return false;
}

// Plausible sizes of what a peer's handshake carries (UCX's own are tens to
// hundreds of bytes).
constexpr size_t kMinWorkerAddressBytes = 9;  // header byte and 64-bit uuid
constexpr size_t kMaxWorkerAddressBytes = 64 << 10;
constexpr size_t kMinRkeyBytes = 2;
constexpr size_t kMaxRkeyBytes = 64 << 10;

std::string ucxError(ucs_status_t status) { return ucs_status_string(status); }

std::string hexByte(uint8_t byte) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[byte >> 4] + kDigits[byte & 0xf];
}

std::string blockRange(engine::BlockId first, int64_t count) {
  if (count == 1) return std::to_string(first);
  return std::to_string(first) + ".." + std::to_string(first + count - 1);
}

std::string durationText(Deadline start, Deadline deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count();
  return std::to_string(std::max<int64_t>(ms, 0)) + " ms";
}

}  // namespace

// Failure reported by UCX's endpoint error callback, which may run after the
// UcxPeer is gone when closing the endpoint could not be confirmed.
struct UcxPeer::EndpointState {
  mutable std::mutex mutex;
  std::atomic<bool> failed{false};
  Status failure;

  void fail(Status status) {
    std::lock_guard lock(mutex);
    if (failed.load()) return;
    failure = std::move(status);
    failed.store(true);
  }
  Status status() const {
    std::lock_guard lock(mutex);
    return failure;
  }
};

// UCX operations issued together and waited for together. Each operation's
// callback gets a pointer to its Op; the batch outlives every callback (it is
// parked in the context when a wait gives up).
struct UcxBatch {
  struct Op {
    UcxBatch* batch = nullptr;
    // Reads: remote and local start, block count.
    engine::BlockId remote_first = 0;
    engine::BlockId local_first = 0;
    int64_t num_blocks = 0;
    uint64_t remote_address = 0;
    uint8_t* local_address = nullptr;
    size_t bytes = 0;
    ucs_status_t status = UCS_INPROGRESS;
  };

  enum class Kind { kRead, kMessage };
  Kind kind = Kind::kRead;
  bool words = false;  // reads from the attached word region (its own key)
  std::vector<Op> ops;
  ucp_mem_h local_memory = nullptr;
  std::string message;

  bool issued = false;  // set once the operations went to UCX

  std::mutex mutex;
  std::condition_variable done;
  size_t pending = 0;

  void finish(Op& op, ucs_status_t status) {
    std::lock_guard lock(mutex);
    op.status = status;
    // Notify under the lock: the waiter may destroy the batch once it sees
    // pending reach zero.
    if (--pending == 0) done.notify_all();
  }
  bool waitUntil(Deadline deadline) {
    std::unique_lock lock(mutex);
    return done.wait_until(lock, deadline, [this] { return pending == 0; });
  }
};

// C callbacks UCX calls on the progress thread.
struct UcxCallbacks {
  static void operationDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<UcxBatch::Op*>(user_data);
    op->batch->finish(*op, status);
    ucp_request_free(request);
  }

  static void endpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    static_cast<UcxPeer::EndpointState*>(arg)->fail(
        unavailable("UCX reported the peer endpoint failed: " + ucxError(status)));
  }

  static ucs_status_t message(void* arg, const void* /*header*/, size_t /*header_length*/,
                              void* data, size_t length, const ucp_am_recv_param_t* param) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      // Senders force eager messages; a rendezvous one is not ours.
      TANDEM_LOG(kWarn) << "dropping a rendezvous UCX active message of " << length << " bytes";
      return UCS_OK;
    }
    static_cast<UcxContext*>(arg)->receiveMessage(
        std::string(static_cast<const char*>(data), length));
    return UCS_OK;
  }
};

// ---------------------------------------------------------------- UcxContext

UcxContext::BusyScope::BusyScope(UcxContext& context) : context(context) { ++context.busy_; }
UcxContext::BusyScope::~BusyScope() { --context.busy_; }

std::shared_ptr<UcxContext> UcxContext::create(const UcxContextOptions& options) {
  std::shared_ptr<UcxContext> context(new UcxContext(options));
  context->progress_thread_ = std::thread([raw = context.get()] { raw->progressLoop(); });
  return context;
}

UcxContext::UcxContext(const UcxContextOptions& options) : options_(options) {
  try {
    // Shared-memory transports join endpoints that handle peer failure only
    // when they expose error handling, a memory-domain setting that only the
    // environment reaches (UCX reads it in ucp_init). A value already set wins.
    if (mayUseSharedMemory(std::getenv("UCX_TLS"))) {
      ::setenv("UCX_POSIX_ERROR_HANDLING", "y", /*overwrite=*/0);
      ::setenv("UCX_SYSV_ERROR_HANDLING", "y", /*overwrite=*/0);
    }
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) throw Error("cannot read the UCX configuration: " + ucxError(status));
    // Keepalive is what notices a dead peer whose memory stays mapped here.
    // True when this context set the value.
    auto setDefault = [config](const char* name, const std::string& value) {
      if (std::getenv(("UCX_" + std::string(name)).c_str()) != nullptr) return false;
      ucs_status_t modified = ucp_config_modify(config, name, value.c_str());
      if (modified != UCS_OK) {
        TANDEM_LOG(kWarn) << "cannot set UCX_" << name << "=" << value << ": "
                          << ucxError(modified);
      }
      return modified == UCS_OK;
    };
    setDefault("KEEPALIVE_INTERVAL", std::to_string(options_.keepalive_interval.count()) + "ms");
    fresh_allocations_ = setDefault("ALLOC_PRIO", kFreshAllocationMethods);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    status = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (status != UCS_OK) {
      context_ = nullptr;
      throw Error("cannot initialize UCX (check UCX_TLS and the other UCX_* variables): " +
                  ucxError(status));
    }

    ucp_context_attr_t context_attr{};
    context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    status = ucp_context_query(context_, &context_attr);
    if (status != UCS_OK) throw Error("cannot query the UCX context: " + ucxError(status));
    for (int type = UCS_MEMORY_TYPE_HOST; type < UCS_MEMORY_TYPE_LAST; ++type) {
      if ((context_attr.memory_types & UCS_BIT(type)) != 0) {
        memory_types_.emplace_back(ucs_memory_type_names[type]);
      }
    }
    supports_cuda_ = (context_attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_MULTI;
    status = ucp_worker_create(context_, &worker_params, &worker_);
    if (status != UCS_OK) {
      worker_ = nullptr;
      throw Error("cannot create a UCX worker: " + ucxError(status));
    }
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    status = ucp_worker_query(worker_, &attr);
    if (status != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI) {
      throw Error("the UCX worker is not thread-safe; Tandem needs a UCX built with --enable-mt");
    }

    ucp_address_t* address = nullptr;
    size_t address_length = 0;
    status = ucp_worker_get_address(worker_, &address, &address_length);
    if (status != UCS_OK) throw Error("cannot get the UCX worker address: " + ucxError(status));
    worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
    ucp_worker_release_address(worker_, address);

    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = kNotifyMessageId;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.cb = &UcxCallbacks::message;
    handler.arg = this;
    status = ucp_worker_set_am_recv_handler(worker_, &handler);
    if (status != UCS_OK) {
      throw Error("cannot register the UCX notification handler: " + ucxError(status));
    }

    // Without an event fd (a transport that cannot wake us) the progress
    // thread naps instead of sleeping on it.
    if (ucp_worker_get_efd(worker_, &event_fd_) != UCS_OK) {
      event_fd_ = -1;
      TANDEM_LOG(kInfo) << "UCX worker has no event fd; its progress thread polls";
    }
  } catch (...) {
    shutdown();
    throw;
  }
}

UcxContext::~UcxContext() {
  stopping_.store(true);
  if (worker_ != nullptr) ucp_worker_signal(worker_);
  if (progress_thread_.joinable()) progress_thread_.join();
  shutdown();
}

void UcxContext::shutdown() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  // Whatever UCX could still have called back into is safe to free now.
  retired_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

void UcxContext::retire(std::shared_ptr<void> object) {
  std::lock_guard lock(retired_mutex_);
  retired_.push_back(std::move(object));
}

void UcxContext::setMessageHandler(std::function<void(std::string)> handler) {
  std::lock_guard lock(handler_mutex_);
  handler_ = std::move(handler);
}

void UcxContext::receiveMessage(std::string message) {
  // Called inside ucp_worker_progress: queue it, deliver outside UCX.
  std::lock_guard lock(inbox_mutex_);
  inbox_.push_back(std::move(message));
  inbox_nonempty_.store(true);
}

void UcxContext::deliverMessages() {
  if (!inbox_nonempty_.load()) return;
  std::vector<std::string> messages;
  {
    std::lock_guard lock(inbox_mutex_);
    messages.swap(inbox_);
    inbox_nonempty_.store(false);
  }
  std::lock_guard lock(handler_mutex_);
  for (std::string& message : messages) {
    messages_received_.fetch_add(1);
    if (handler_) handler_(std::move(message));
  }
}

bool UcxContext::waitFor(UcxBatch& batch, Deadline deadline) {
  if (std::this_thread::get_id() != progress_thread_id_.load()) return batch.waitUntil(deadline);
  // Called from the message handler: nobody else progresses the worker.
  for (;;) {
    {
      std::lock_guard lock(batch.mutex);
      if (batch.pending == 0) return true;
    }
    if (Clock::now() >= deadline) return false;
    ucp_worker_progress(worker_);
  }
}

void UcxContext::progressLoop() {
  progress_thread_id_.store(std::this_thread::get_id());
  auto last_activity = Clock::now();
  while (!stopping_.load()) {
    unsigned progressed = ucp_worker_progress(worker_);
    deliverMessages();
    if (progressed != 0 || busy_.load() > 0) {
      last_activity = Clock::now();
      continue;
    }
    if (Clock::now() - last_activity < options_.idle_spin) continue;
    waitForEvents();
    last_activity = Clock::now();
  }
}

void UcxContext::waitForEvents() {
  if (event_fd_ >= 0) {
    ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) return;  // events are waiting: progress again
    if (status == UCS_OK) {
      pollfd fd{event_fd_, POLLIN, 0};
      ::poll(&fd, 1, kMaxSleepMs);
      return;
    }
  }
  std::this_thread::sleep_for(std::chrono::microseconds(200));
}

Status UcxContext::checkPeerAddress(std::string_view address) const {
  if (address.size() < kMinWorkerAddressBytes || address.size() > kMaxWorkerAddressBytes) {
    return invalidArgument("the peer's UCX worker address has " + std::to_string(address.size()) +
                           " bytes; accepted: " + std::to_string(kMinWorkerAddressBytes) + " to " +
                           std::to_string(kMaxWorkerAddressBytes));
  }
  const auto header = static_cast<uint8_t>(address[0]);
  const auto ours = static_cast<uint8_t>(worker_address_[0]);
  if (header != ours) {
    return invalidArgument("the peer's UCX worker address header is " + hexByte(header) +
                           " (format version " + std::to_string(header & 0xf) + "), ours is " +
                           hexByte(ours) + " (format version " + std::to_string(ours & 0xf) +
                           "): not an address this UCX can read");
  }
  return Status::ok();
}

Status UcxContext::checkPackedRkey(std::string_view packed_rkey) {
  if (packed_rkey.size() < kMinRkeyBytes || packed_rkey.size() > kMaxRkeyBytes) {
    return invalidArgument("the peer's packed UCX memory key has " +
                           std::to_string(packed_rkey.size()) + " bytes; accepted: " +
                           std::to_string(kMinRkeyBytes) + " to " + std::to_string(kMaxRkeyBytes));
  }
  return Status::ok();
}

StatusOr<std::shared_ptr<UcxPeer>> UcxContext::connect(const RemoteSlab& remote,
                                                       Deadline deadline) {
  if (remote.worker_address.empty() || remote.packed_rkey.empty() || remote.base_address == 0 ||
      remote.block_bytes == 0 || remote.num_blocks <= 0) {
    return invalidArgument(
        "remote slab needs a worker address, an rkey, a base address, a block size and at least "
        "one block");
  }
  // Nothing UCX would refuse by aborting the process may reach it.
  if (Status status = checkPeerAddress(remote.worker_address); !status.isOk()) return status;
  if (Status status = checkPackedRkey(remote.packed_rkey); !status.isOk()) return status;
  std::shared_ptr<UcxPeer> peer(new UcxPeer(shared_from_this(), remote));

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(remote.worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxCallbacks::endpointError;
  params.err_handler.arg = peer->state_.get();
  {
    BusyScope busy(*this);
    ucp_ep_h endpoint = nullptr;
    ucs_status_t status = ucp_ep_create(worker_, &params, &endpoint);
    if (status != UCS_OK) {
      return unavailable("cannot create a UCX endpoint to the peer: " + ucxError(status));
    }
    std::unique_lock lock(peer->endpoint_mutex_);
    peer->endpoint_ = endpoint;
    status = ucp_ep_rkey_unpack(endpoint, remote.packed_rkey.data(), &peer->rkey_);
    if (status != UCS_OK) {
      peer->rkey_ = nullptr;
      lock.unlock();
      peer->closeEndpoint(/*force=*/true);
      return unavailable("the peer's memory key cannot be used: " + ucxError(status));
    }
  }

  // The first touch of a fresh mapping is slow (wire-up, attaching the
  // peer's memory): pay it here rather than in the first transfer.
  auto batch = std::make_shared<UcxBatch>();
  batch->message.resize(std::min(kWarmupBytes, remote.block_bytes));
  UcxBatch::Op& op = batch->ops.emplace_back();
  op.remote_address = remote.base_address;
  op.local_address = reinterpret_cast<uint8_t*>(batch->message.data());
  op.bytes = batch->message.size();
  op.num_blocks = 1;
  Status status = peer->runBatch(batch, deadline);
  if (status.isOk() && op.status != UCS_OK) {
    status = unavailable("warm-up read from the peer failed: " + ucxError(op.status));
  }
  if (!status.isOk()) return Status(status.code(), "connecting: " + status.message());
  if (options_.prefault_bytes > 0) peer->prefault(options_.prefault_bytes, deadline);
  return peer;
}

void UcxPeer::prefault(uint64_t limit_bytes, Deadline deadline) {
  // Where the peer's slab is mapped into this process (shared memory), the
  // first read of every page takes a page fault; populate the page tables
  // now instead, in chunks so that the deadline is honoured.
  void* mapped = nullptr;
  {
    std::shared_lock lock(endpoint_mutex_);
    if (rkey_ == nullptr || ucp_rkey_ptr(rkey_, remote_.base_address, &mapped) != UCS_OK) return;
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t slab_bytes = remote_.block_bytes * static_cast<uint64_t>(remote_.num_blocks);
  uintptr_t at = reinterpret_cast<uintptr_t>(mapped) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(mapped) + std::min(slab_bytes, limit_bytes);
  constexpr uintptr_t kChunk = uintptr_t{64} << 20;  // ~10 ms each
  while (at < end && Clock::now() < deadline) {
    uintptr_t length = std::min(kChunk, end - at);
    // Best effort: kernels before 5.14 refuse MADV_POPULATE_READ.
    if (::madvise(reinterpret_cast<void*>(at), length, MADV_POPULATE_READ) != 0) return;
    at += length;
  }
}

// ------------------------------------------------------------------- UcxPeer

UcxPeer::UcxPeer(std::shared_ptr<UcxContext> context, RemoteSlab remote)
    : context_(std::move(context)),
      remote_(std::move(remote)),
      state_(std::make_shared<EndpointState>()) {}

UcxPeer::~UcxPeer() { closeEndpoint(/*force=*/state_->failed.load()); }

void UcxPeer::markFailed(const std::string& reason) { state_->fail(unavailable(reason)); }

Status UcxPeer::health() const {
  if (state_->failed.load()) return state_->status();
  std::shared_lock lock(endpoint_mutex_);
  if (endpoint_ == nullptr) return unavailable("the endpoint to the peer is closed");
  return Status::ok();
}

void UcxPeer::closeEndpoint(bool force) {
  UcxContext::BusyScope busy(*context_);
  std::unique_lock lock(endpoint_mutex_);
  if (endpoint_ == nullptr) return;
  auto batch = std::make_shared<UcxBatch>();
  UcxBatch::Op& op = batch->ops.emplace_back();
  op.batch = batch.get();
  batch->pending = 1;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  param.cb.send = &UcxCallbacks::operationDone;
  param.user_data = &op;
  ucs_status_ptr_t request = ucp_ep_close_nbx(endpoint_, &param);
  endpoint_ = nullptr;
  ucp_rkey_h rkey = std::exchange(rkey_, nullptr);
  ucp_rkey_h words_rkey = std::exchange(words_rkey_, nullptr);
  lock.unlock();

  bool closed = true;
  if (UCS_PTR_IS_PTR(request)) {
    ucp_worker_signal(context_->worker_);
    closed = context_->waitFor(*batch, Clock::now() + kCloseWait);
  }
  if (closed) {
    // Only now can no request refer to the key any more.
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    if (words_rkey != nullptr) ucp_rkey_destroy(words_rkey);
    return;
  }
  TANDEM_LOG(kWarn) << "closing the UCX endpoint to a peer did not finish in time; its state is "
                       "kept until the worker is destroyed";
  context_->retire(batch);
  context_->retire(state_);
}

Status UcxPeer::runBatch(const std::shared_ptr<UcxBatch>& batch, Deadline deadline) {
  if (state_->failed.load()) return state_->status();
  const Deadline start = Clock::now();
  if (start >= deadline) {
    return Status(StatusCode::kDeadlineExceeded,
                  "the deadline passed before anything was sent to the peer");
  }
  UcxContext::BusyScope busy(*context_);
  {
    std::shared_lock lock(endpoint_mutex_);
    if (endpoint_ == nullptr) return unavailable("the endpoint to the peer is closed");
    {
      std::lock_guard batch_lock(batch->mutex);
      batch->pending = batch->ops.size();
    }
    batch->issued = true;
    for (UcxBatch::Op& op : batch->ops) {
      op.batch = batch.get();
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = &UcxCallbacks::operationDone;
      param.user_data = &op;
      ucs_status_ptr_t request;
      if (batch->kind == UcxBatch::Kind::kRead) {
        if (batch->local_memory != nullptr) {
          param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
          param.memh = batch->local_memory;
        }
        request = ucp_get_nbx(endpoint_, op.local_address, op.bytes, op.remote_address,
                              batch->words ? words_rkey_ : rkey_, &param);
      } else {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_EAGER;
        request = ucp_am_send_nbx(endpoint_, kNotifyMessageId, nullptr, 0, batch->message.data(),
                                  batch->message.size(), &param);
      }
      // Immediate completion (or failure) does not call the callback.
      if (request == nullptr) {
        batch->finish(op, UCS_OK);
      } else if (UCS_PTR_IS_ERR(request)) {
        batch->finish(op, UCS_PTR_STATUS(request));
      }
    }
  }
  ucp_worker_signal(context_->worker_);
  if (context_->waitFor(*batch, deadline)) return Status::ok();

  size_t unfinished = 0;
  {
    std::lock_guard lock(batch->mutex);
    unfinished = batch->pending;
  }
  Status late(StatusCode::kDeadlineExceeded,
              std::to_string(unfinished) + " of " + std::to_string(batch->ops.size()) +
                  " UCX operations to the peer did not finish within the deadline (" +
                  durationText(start, deadline) + "); the endpoint was closed");
  state_->fail(unavailable("an earlier operation missed its deadline: " + late.message()));
  // A forced close cancels what is in flight, so no late read can land in
  // local blocks the caller is about to recompute.
  closeEndpoint(/*force=*/true);
  if (!context_->waitFor(*batch, Clock::now() + kCloseWait)) context_->retire(batch);
  return late;
}

ReadResult UcxPeer::readBlocks(const LocalSlab& local, std::span<const BlockPair> pairs,
                               Deadline deadline) {
  ReadResult result;
  auto failAll = [&](Status status) {
    result.status = std::move(status);
    for (const BlockPair& pair : pairs) result.failed_local_blocks.push_back(pair.local_block);
    std::sort(result.failed_local_blocks.begin(), result.failed_local_blocks.end());
    result.failed_local_blocks.erase(
        std::unique(result.failed_local_blocks.begin(), result.failed_local_blocks.end()),
        result.failed_local_blocks.end());
    return result;
  };

  if (local.base == nullptr || local.block_bytes == 0 || local.num_blocks <= 0) {
    return failAll(invalidArgument("local slab needs a base address, a block size and blocks"));
  }
  if (local.block_bytes != remote_.block_bytes) {
    return failAll(invalidArgument("local block size " + std::to_string(local.block_bytes) +
                                   " bytes differs from the peer's " +
                                   std::to_string(remote_.block_bytes) + " bytes"));
  }
  for (const BlockPair& pair : pairs) {
    if (pair.remote_block < 0 || pair.remote_block >= remote_.num_blocks) {
      return failAll(invalidArgument("remote block id " + std::to_string(pair.remote_block) +
                                     " is out of range: the peer has blocks 0.." +
                                     std::to_string(remote_.num_blocks - 1)));
    }
    if (pair.local_block < 0 || pair.local_block >= local.num_blocks) {
      return failAll(invalidArgument("local block id " + std::to_string(pair.local_block) +
                                     " is out of range: the local slab has blocks 0.." +
                                     std::to_string(local.num_blocks - 1)));
    }
  }
  std::vector<BlockPair> sorted(pairs.begin(), pairs.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const BlockPair& a, const BlockPair& b) { return a.local_block < b.local_block; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].local_block == sorted[i - 1].local_block) {
      return failAll(invalidArgument("local block " + std::to_string(sorted[i].local_block) +
                                     " is the destination of more than one read"));
    }
  }
  if (sorted.empty()) return result;

  // One operation per run where remote and local ids both go up by one.
  std::sort(sorted.begin(), sorted.end(), [](const BlockPair& a, const BlockPair& b) {
    return a.remote_block != b.remote_block ? a.remote_block < b.remote_block
                                            : a.local_block < b.local_block;
  });
  auto batch = std::make_shared<UcxBatch>();
  batch->kind = UcxBatch::Kind::kRead;
  batch->local_memory = local.memory_handle;
  for (const BlockPair& pair : sorted) {
    if (!batch->ops.empty()) {
      UcxBatch::Op& last = batch->ops.back();
      if (pair.remote_block == last.remote_first + last.num_blocks &&
          pair.local_block == last.local_first + last.num_blocks) {
        ++last.num_blocks;
        last.bytes += local.block_bytes;
        continue;
      }
    }
    UcxBatch::Op& op = batch->ops.emplace_back();
    op.remote_first = pair.remote_block;
    op.local_first = pair.local_block;
    op.num_blocks = 1;
    op.remote_address =
        remote_.base_address + static_cast<uint64_t>(pair.remote_block) * remote_.block_bytes;
    op.local_address = local.base + static_cast<uint64_t>(pair.local_block) * local.block_bytes;
    op.bytes = local.block_bytes;
  }

  Status status = runBatch(batch, deadline);
  if (!batch->issued) return failAll(std::move(status));
  result.num_operations = static_cast<int64_t>(batch->ops.size());
  std::lock_guard lock(batch->mutex);
  for (const UcxBatch::Op& op : batch->ops) {
    if (op.status == UCS_OK) {
      result.bytes_read += op.bytes;
      continue;
    }
    for (int64_t i = 0; i < op.num_blocks; ++i) {
      result.failed_local_blocks.push_back(static_cast<engine::BlockId>(op.local_first + i));
    }
    if (status.isOk()) {
      status = unavailable("reading remote blocks " + blockRange(op.remote_first, op.num_blocks) +
                           " into local blocks " + blockRange(op.local_first, op.num_blocks) +
                           " failed: " + ucxError(op.status));
    }
  }
  std::sort(result.failed_local_blocks.begin(), result.failed_local_blocks.end());
  result.status = std::move(status);
  return result;
}

Status UcxPeer::attachWords(const RemoteSlab& words) {
  if (words.worker_address != remote_.worker_address) {
    return invalidArgument("the word region names another UCX worker than the peer's slab");
  }
  if (words.packed_rkey.empty() || words.base_address == 0 || words.block_bytes != 8 ||
      words.num_blocks <= 0) {
    return invalidArgument(
        "the word region needs an rkey, a base address, 8-byte words and at least one word");
  }
  if (Status status = UcxContext::checkPackedRkey(words.packed_rkey); !status.isOk()) {
    return status;
  }
  if (state_->failed.load()) return state_->status();
  UcxContext::BusyScope busy(*context_);
  std::unique_lock lock(endpoint_mutex_);
  if (endpoint_ == nullptr) return unavailable("the endpoint to the peer is closed");
  if (words_rkey_ != nullptr) return failedPrecondition("a word region is already attached");
  ucs_status_t status = ucp_ep_rkey_unpack(endpoint_, words.packed_rkey.data(), &words_rkey_);
  if (status != UCS_OK) {
    words_rkey_ = nullptr;
    return unavailable("the peer's word region key cannot be used: " + ucxError(status));
  }
  words_ = words;
  return Status::ok();
}

StatusOr<std::array<uint8_t, 8>> UcxPeer::readWord(int64_t index, Deadline deadline) {
  if (words_.num_blocks == 0) return invalidArgument("no word region is attached to this peer");
  if (index < 0 || index >= words_.num_blocks) {
    return invalidArgument("word " + std::to_string(index) +
                           " is out of range: the peer's region has words 0.." +
                           std::to_string(words_.num_blocks - 1));
  }
  auto batch = std::make_shared<UcxBatch>();
  batch->kind = UcxBatch::Kind::kRead;
  batch->words = true;
  batch->message.assign(8, '\0');
  UcxBatch::Op& op = batch->ops.emplace_back();
  op.remote_address = words_.base_address + static_cast<uint64_t>(index) * 8;
  op.local_address = reinterpret_cast<uint8_t*>(batch->message.data());
  op.bytes = 8;
  op.num_blocks = 1;
  Status status = runBatch(batch, deadline);
  if (!status.isOk()) return Status(status.code(), "reading a word: " + status.message());
  std::lock_guard lock(batch->mutex);
  if (op.status != UCS_OK) return unavailable("reading a word failed: " + ucxError(op.status));
  std::array<uint8_t, 8> word{};
  std::memcpy(word.data(), batch->message.data(), word.size());
  return word;
}

Status UcxPeer::notify(std::string_view message, Deadline deadline) {
  if (message.size() > kMaxMessageBytes) {
    return invalidArgument("notification of " + std::to_string(message.size()) +
                           " bytes exceeds the limit of " + std::to_string(kMaxMessageBytes));
  }
  auto batch = std::make_shared<UcxBatch>();
  batch->kind = UcxBatch::Kind::kMessage;
  batch->message = std::string(message);
  UcxBatch::Op& op = batch->ops.emplace_back();
  Status status = runBatch(batch, deadline);
  if (!status.isOk()) return Status(status.code(), "notifying the peer: " + status.message());
  if (op.status != UCS_OK) {
    return unavailable("notifying the peer failed: " + ucxError(op.status));
  }
  return Status::ok();
}

}  // namespace tandem::transport
