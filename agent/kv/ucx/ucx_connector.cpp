#include "agent/kv/ucx/ucx_connector.h"

#include <arpa/inet.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "common/hmac.h"
#include "common/json_parse.h"
#include "common/logging.h"

namespace tandem::kv {
namespace {

using nlohmann::json;

constexpr int kProtocolVersion = 4;
// Hold tickets (kv_connector_extra_config.hold_slots): 8 bytes each.
constexpr int64_t kDefaultHoldSlots = 65536;
constexpr int64_t kMaxHoldSlots = int64_t{1} << 24;
// A read must end this long before the producer's hold does (clocks of the
// two agents, and the time between the producer's answer and this agent's
// arrival, which the hold already counts).
constexpr auto kHoldMargin = std::chrono::seconds(5);

int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
constexpr std::string_view kReleaseMessage = "release";
constexpr char kHandshakePath[] = "/v1/kv_transfer/handshake";
// Larger handshake answers are not ours (ours are a few hundred bytes).
constexpr size_t kMaxHandshakeBytes = 1 << 20;
constexpr size_t kMaxHostChars = 253;
constexpr size_t kMaxIdChars = 512;
constexpr size_t kMaxCompatibilityChars = 16384;

// The first "key=value" field that differs between two compatibility strings.
std::string firstDifference(const std::string& ours, const std::string& theirs) {
  auto fields = [](const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find(';', start);
      if (end == std::string::npos) end = text.size();
      out.push_back(text.substr(start, end - start));
      start = end + 1;
    }
    return out;
  };
  auto a = fields(ours), b = fields(theirs);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    std::string x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x != y) return "ours " + x + ", theirs " + y;
  }
  return "none";
}

bool flag(const json& params, const char* name) {
  auto it = params.find(name);
  return it != params.end() && it->is_boolean() && it->get<bool>();
}

Status checkFlag(const json& params, const char* name) {
  auto it = params.find(name);
  if (it != params.end() && !it->is_boolean()) {
    return invalidArgument(std::string("kv_transfer_params.") + name + " must be true or false");
  }
  return Status::ok();
}

// What is signed: every field a reader acts on.
std::string canonical(const UcxConnector::Descriptor& d) {
  std::string text = "tandem-kv-transfer/4\n" + d.transfer_id + "\n" + d.engine_id + "\n" + d.host +
                     "\n" + std::to_string(d.port) + "\n" + std::to_string(d.num_blocks) + "\n" +
                     std::to_string(d.num_tokens) + "\n";
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(d.block_ids[i]);
  }
  text += "\n" + d.compatibility + "\n";
  for (size_t i = 0; i < d.last_block_hashes.size(); ++i) {
    if (i > 0) text += ',';
    text += d.last_block_hashes[i];
  }
  return text + "\n" + std::to_string(d.hold_until_ms) + "\n" +
         (d.hold_slot >= 0 ? std::to_string(d.hold_slot) : std::string()) + "\n" + d.hold_ticket;
}

std::string releaseCanonical(std::string_view transfer_id) {
  return "tandem-kv-release/1\n" + std::string(transfer_id);
}

std::string handshakeRequestCanonical(std::string_view nonce) {
  return "tandem-kv-handshake-request/1\n" + std::string(nonce);
}

std::string handshakeCanonical(std::string_view nonce, std::string_view engine_id,
                               std::string_view compatibility, std::string_view slab_text,
                               std::string_view holds_text) {
  return "tandem-kv-handshake/2\n" + std::string(nonce) + "\n" + std::string(engine_id) + "\n" +
         std::string(compatibility) + "\n" + std::string(slab_text) + "\n" +
         std::string(holds_text);
}

// What a descriptor's remote_host (and advertise_host) may be: a host name or
// IPv4 address (letters, digits, '.', '-', '_'), or an IPv6 address, bare or
// in brackets, with an optional zone ("fe80::1%eth0"). Never a port
// ("host:8000" has one ':' and is no IPv6 address), a user ('@'), a path
// ('/'), whitespace or control characters.
constexpr char kHostAccepted[] =
    "a host name or IP address without a port (a host name or IPv4 address: letters, digits, '.', "
    "'-', '_'; an IPv6 address, bare or in brackets)";

bool isNameChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
         c == '-' || c == '_';
}

bool isHostName(std::string_view host) {
  if (host.empty() || host.size() > kMaxHostChars) return false;
  if (host.find_first_of(":[]%") == std::string_view::npos) {
    return std::all_of(host.begin(), host.end(), isNameChar);
  }
  std::string_view inner = host;
  if (host.front() == '[') {
    if (host.size() < 2 || host.back() != ']') return false;
    inner = host.substr(1, host.size() - 2);
  }
  const size_t percent = inner.find('%');
  if (percent != std::string_view::npos) {
    const std::string_view zone = inner.substr(percent + 1);
    if (zone.empty() || !std::all_of(zone.begin(), zone.end(), isNameChar)) return false;
    inner = inner.substr(0, percent);
  }
  in6_addr address{};
  return inner.find_first_not_of("0123456789abcdefABCDEF:.") == std::string_view::npos &&
         inet_pton(AF_INET6, std::string(inner).c_str(), &address) == 1;
}

// The host as a socket library takes it: an IPv6 address without brackets.
std::string connectHost(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

bool isWildcardHost(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// An integer JSON value as int64, or nullopt (not an integer, or beyond int64).
std::optional<int64_t> integerValue(const json& value) {
  if (value.is_number_unsigned()) {
    const auto unsigned_value = value.get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(unsigned_value);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

}  // namespace

UcxConnector::UcxConnector(const KvTransferConfig& config, engine::KvCache& cache,
                           const std::string& model_identity)
    : config_(config), cache_(cache) {
  const auto* allocator = dynamic_cast<const transport::UcxSlabAllocator*>(&cache.allocator());
  auto buffer_options = parseKvBufferOptions(config.extra);
  if (!buffer_options.isOk()) throw Error(buffer_options.status().message());
  secret_ = kvSecret(config);
  if (!secret_.empty()) {
    request_verifier_ = std::make_unique<kv_auth::RequestVerifier>(secret_, kv_auth::instanceId());
  }
  if (auto it = config.extra.find("remote_pull_threshold"); it != config.extra.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      throw Error(
          "kv_connector_extra_config.remote_pull_threshold must be a positive number of blocks, "
          "got " +
          it->dump());
    }
    pull_threshold_blocks_ = it->get<int64_t>();
  }
  int64_t hold_slots = kDefaultHoldSlots;
  if (auto it = config.extra.find("hold_slots"); it != config.extra.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxHoldSlots) {
      throw Error("kv_connector_extra_config.hold_slots must be a number of holds between 1 and " +
                  std::to_string(kMaxHoldSlots) + ", got " + it->dump());
    }
    hold_slots = it->get<int64_t>();
  }
  if (auto it = config.extra.find("read_timeout_s"); it != config.extra.end()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      throw Error("kv_connector_extra_config.read_timeout_s must be a positive number, got " +
                  it->dump());
    }
    read_timeout_ = std::chrono::duration_cast<transport::Clock::duration>(
        std::chrono::duration<double>(it->get<double>()));
  }
  if (auto it = config.extra.find("peer_idle_timeout_s"); it != config.extra.end()) {
    if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 1e9) {
      throw Error(
          "kv_connector_extra_config.peer_idle_timeout_s must be a positive number of seconds "
          "(at most 1e9), got " +
          it->dump());
    }
    peer_idle_timeout_ = std::chrono::duration_cast<transport::Clock::duration>(
        std::chrono::duration<double>(it->get<double>()));
  }
  if (auto it = config.extra.find("advertise_host"); it != config.extra.end()) {
    if (!it->is_string() || !isHostName(it->get<std::string>()) ||
        isWildcardHost(it->get<std::string>())) {
      throw Error(
          "kv_connector_extra_config.advertise_host must be an address peers can reach, not a "
          "wildcard such as 0.0.0.0: " +
          std::string(kHostAccepted) + "; got " + it->dump());
    }
  }
  auto faults = FaultInjection::parse(config.extra);
  if (!faults.isOk()) throw Error(faults.status().message());
  faults_ = *faults;
  // A reader takes a hold only with read_timeout_s + kHoldMargin left: an
  // agent that both produces and reads, with holds shorter than that, can
  // read none of its peers' holds when they are configured alike.
  const auto hold = std::chrono::duration<double>(config.abort_timeout_s);
  if (config.produces() && config.consumes() && hold <= read_timeout_ + kHoldMargin) {
    TANDEM_LOG(kWarn) << "ucx connector: kv_connector_extra_config.abort_timeout_s ("
                      << config.abort_timeout_s << " s) is not above read_timeout_s + "
                      << std::chrono::duration<double>(kHoldMargin).count()
                      << " s: a reader takes a hold only with that much left, so agents "
                         "configured alike compute every prompt instead of reading it";
  }

  context_ = allocator != nullptr ? allocator->context() : transport::UcxContext::create();
  ucx_memory_types_ = context_->memoryTypes();
  auto path =
      chooseKvBuffer(*buffer_options, cache.hostAccessible(), context_->supportsCudaMemory());
  if (!path.isOk()) throw Error(path.status().message());
  buffer_path_ = *path;
  if (buffer_path_ == KvBufferPath::kSlab && allocator == nullptr) {
    if (buffer_options->requested != "auto") {
      throw Error(
          "kv_connector_extra_config.kv_buffer \"slab\" needs the KV cache allocated by UCX "
          "(got the " +
          cache.allocator().name() + " allocator); use \"staging\" or \"auto\"");
    }
    buffer_path_ = KvBufferPath::kStaging;
  }
  const auto& kv = cache.config();
  compatibility_ =
      "model=" + model_identity + ";kv_dtype=" + dtypeShortName(kv.dtype) +
      ";block_size=" + std::to_string(kv.block_size) + ";layers=" + std::to_string(kv.num_layers) +
      ";kv_heads=" + std::to_string(kv.num_kv_heads) + ";head_dim=" + std::to_string(kv.head_dim) +
      ";protocol=" + std::to_string(kProtocolVersion);
  // RDMA transports register the KV buffer: say whether they can, before
  // anything is allocated (an allocation that fails for it says the rest).
  locked_memory_ = transport::lockedMemory();
  // The KV buffer and the hold tickets' words; UCX registers receive pools
  // of its own besides, so this is what is needed at least.
  const uint64_t buffer_bytes =
      (buffer_path_ == KvBufferPath::kStaging
           ? static_cast<uint64_t>(buffer_options->staging_blocks) * cache.blockBytes()
           : static_cast<uint64_t>(allocator->bytes())) +
      (config_.produces() ? static_cast<uint64_t>(hold_slots) * 8 : 0);
  if (!locked_memory_.canRegister(buffer_bytes)) {
    TANDEM_LOG(kWarn) << "ucx connector: " << transport::describe(locked_memory_)
                      << ": the KV buffer's " << buffer_bytes
                      << " bytes cannot be registered for RDMA (UCX's rc, dc and ud transports); "
                         "transfers over them fail and are recomputed. Raise the limit "
                         "(LimitMEMLOCK=infinity for the container runtime, ulimit -l "
                         "unlimited) or run the agent with CAP_IPC_LOCK as root "
                         "(docs/kubernetes.md)";
  } else {
    TANDEM_LOG(kInfo) << "ucx connector: " << transport::describe(locked_memory_);
  }
  const transport::UcxSlabAllocator* registered = allocator;
  if (buffer_path_ == KvBufferPath::kStaging) {
    staging_capacity_ = buffer_options->staging_blocks;
    staging_allocator_ = std::make_unique<transport::UcxSlabAllocator>(context_);
    staging_base_ = static_cast<uint8_t*>(
        staging_allocator_->allocate(static_cast<size_t>(staging_capacity_) * cache.blockBytes()));
    if (staging_base_ == nullptr) {
      throw Error("ucx connector: UCX cannot allocate a staging area of " +
                  std::to_string(staging_capacity_) + " blocks of " +
                  std::to_string(cache.blockBytes()) +
                  " bytes (kv_connector_extra_config.staging_blocks)");
    }
    // Block copies between a device slab and the slots run from page-locked
    // memory (the CUDA backend pins it; host backends have nothing to pin).
    if (!cache.hostAccessible()) {
      staging_pinned_ = cache.backend()->pinHost(staging_base_, staging_allocator_->bytes());
    }
    free_slots_.reserve(static_cast<size_t>(staging_capacity_));
    // Taken from the back: lowest ids first.
    for (int64_t slot = staging_capacity_ - 1; slot >= 0; --slot) {
      free_slots_.push_back(static_cast<BlockId>(slot));
    }
    registered = staging_allocator_.get();
  }
  TANDEM_LOG(kInfo) << "ucx connector: KV buffer " << kvBufferPathName(buffer_path_)
                    << (buffer_path_ == KvBufferPath::kStaging
                            ? " (" + std::to_string(staging_capacity_) + " host block slots)"
                            : std::string())
                    << "; UCX memory types: " << json(ucx_memory_types_).dump();
  auto local = registered->localSlab(cache.blockBytes());
  auto remote = registered->remoteSlab(cache.blockBytes());
  if (!local.isOk() || !remote.isOk()) {
    throw Error("ucx connector: " +
                (local.isOk() ? remote.status().message() : local.status().message()));
  }
  local_slab_ = *local;
  serialized_slab_ = remote->serialize();
  num_slab_blocks_ = remote->num_blocks;
  std::random_device random;
  if (config_.produces()) {
    // The hold tickets' words (hold_tickets.h), readers read them like the slab.
    holds_allocator_ = std::make_unique<transport::UcxSlabAllocator>(context_);
    holds_base_ =
        static_cast<uint8_t*>(holds_allocator_->allocate(static_cast<size_t>(hold_slots) * 8));
    auto holds = holds_base_ != nullptr
                     ? holds_allocator_->remoteSlab(8)
                     : StatusOr<transport::RemoteSlab>(unavailable("UCX cannot allocate it"));
    if (!holds.isOk()) {
      throw Error(
          "ucx connector: the table of " + std::to_string(hold_slots) +
          " hold tickets (kv_connector_extra_config.hold_slots): " + holds.status().message());
    }
    serialized_holds_ = holds->serialize();
    // Any start: tickets differ from a restarted producer's too.
    const uint64_t first = ((uint64_t{random()} << 32) | random()) >> 2;
    tickets_ = std::make_unique<HoldTickets>(holds_base_, hold_slots, first);
  }
  engine_id_ = std::to_string(random()) + std::to_string(random());
  context_->setMessageHandler([this](const std::string& message) { onMessage(message); });
  loader_ = std::thread([this] { loaderLoop(); });
}

UcxConnector::~UcxConnector() {
  {
    std::lock_guard<std::mutex> lock(jobs_mutex_);
    stopping_ = true;
  }
  jobs_ready_.notify_all();
  loader_.join();  // finishes the reads already queued (each bounded by read_timeout_s)
  context_->setMessageHandler(nullptr);
  if (staging_allocator_ != nullptr) {
    if (staging_pinned_) cache_.backend()->unpinHost(staging_base_);
    staging_allocator_->release(staging_base_, staging_allocator_->bytes());
  }
  if (holds_base_ != nullptr) holds_allocator_->release(holds_base_, holds_allocator_->bytes());
}

json UcxConnector::info() const {
  json out = {{"kv_buffer", kvBufferPathName(buffer_path_)},
              {"ucx_memory_types", ucx_memory_types_},
              {"memlock_limit_bytes",
               locked_memory_.limit_bytes ? json(*locked_memory_.limit_bytes) : json("unlimited")},
              {"ipc_lock", locked_memory_.ipc_lock},
              {"rdma_devices", locked_memory_.rdma_devices}};
  if (buffer_path_ == KvBufferPath::kStaging) {
    std::lock_guard<std::mutex> lock(staging_mutex_);
    out["staging_blocks"] = staging_capacity_;
    out["staging_pinned"] = staging_pinned_;
    out["staging_blocks_used"] = staging_capacity_ - static_cast<int64_t>(free_slots_.size());
  }
  if (tickets_ != nullptr) {
    out["hold_slots"] = tickets_->capacity();
    out["hold_slots_used"] = tickets_->used();
  }
  return out;
}

std::vector<BlockId> UcxConnector::takeSlots(int64_t n) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  if (n <= 0 || static_cast<int64_t>(free_slots_.size()) < n) return {};
  std::vector<BlockId> slots(free_slots_.end() - n, free_slots_.end());
  free_slots_.resize(free_slots_.size() - static_cast<size_t>(n));
  return slots;
}

void UcxConnector::freeSlots(const std::vector<BlockId>& slots) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  returnSlotsLocked(slots);
}

void UcxConnector::returnSlotsLocked(const std::vector<BlockId>& slots) const {
  // Reversed, so that takeSlots (from the back) hands out the lowest first.
  free_slots_.insert(free_slots_.end(), slots.rbegin(), slots.rend());
}

void UcxConnector::endHold(const std::string& transfer_id) const {
  // The ticket first: once it is zero no reader takes what the slots (or the
  // blocks the engine frees next) hold afterwards.
  if (tickets_ != nullptr) tickets_->end(transfer_id);
  freeStagedHold(transfer_id);
}

void UcxConnector::holdEnded(std::string_view request_id) { endHold(std::string(request_id)); }

void UcxConnector::freeStagedHold(const std::string& transfer_id) const {
  if (buffer_path_ != KvBufferPath::kStaging) return;
  std::lock_guard<std::mutex> lock(staging_mutex_);
  auto it = staged_holds_.find(transfer_id);
  if (it == staged_holds_.end()) return;
  returnSlotsLocked(it->second.slots);
  staged_holds_.erase(it);
}

void UcxConnector::freeExpiredHolds() {
  if (buffer_path_ != KvBufferPath::kStaging) return;
  const auto now = transport::Clock::now();
  std::lock_guard<std::mutex> lock(staging_mutex_);
  for (auto it = staged_holds_.begin(); it != staged_holds_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    // Its ticket ends before its slots can be reused.
    if (tickets_ != nullptr) tickets_->end(it->first);
    returnSlotsLocked(it->second.slots);
    it = staged_holds_.erase(it);
  }
}

void UcxConnector::copyOutOfSlab(BlockId block, uint8_t* staging) {
  if (faults_.fail_copies_out) throw Error("injected fault: the copy into the staging area failed");
  cache_.copyBlockToHost(block, staging);
}

void UcxConnector::copyIntoSlab(BlockId block, const uint8_t* staging) {
  if (faults_.fail_copies_in)
    throw Error("injected fault: the copy out of the staging area failed");
  cache_.copyBlockFromHost(block, staging);
}

std::vector<BlockId> UcxConnector::stageBlocks(std::span<const BlockId> blocks) {
  std::vector<BlockId> slots = takeSlots(static_cast<int64_t>(blocks.size()));
  if (slots.empty()) return slots;
  const size_t block_bytes = cache_.blockBytes();
  try {
    for (size_t i = 0; i < blocks.size(); ++i) {
      copyOutOfSlab(blocks[i], staging_base_ + static_cast<size_t>(slots[i]) * block_bytes);
    }
  } catch (...) {
    freeSlots(slots);  // a failed device copy gives its slots back
    throw;
  }
  return slots;
}

Status UcxConnector::advertiseAddress(const std::string& listen_host, int port) {
  std::string host;
  if (auto it = config_.extra.find("advertise_host"); it != config_.extra.end()) {
    host = it->get<std::string>();  // checked at construction
  } else if (!isWildcardHost(listen_host)) {
    host = listen_host;
  } else if (const char* pod_ip = std::getenv("POD_IP"); pod_ip != nullptr && *pod_ip != 0) {
    host = pod_ip;
    if (!isHostName(host) || isWildcardHost(host)) {
      return failedPrecondition("the POD_IP environment variable must be an IP address, got \"" +
                                host + "\"");
    }
  } else if (config_.produces()) {
    return failedPrecondition(
        "the ucx connector must tell readers an address they can reach, and this agent listens "
        "on " +
        (listen_host.empty() ? std::string("all addresses") : listen_host) +
        ": set kv_connector_extra_config.advertise_host or the POD_IP environment variable");
  }
  std::lock_guard<std::mutex> lock(advertised_mutex_);
  advertised_host_ = host;
  advertised_port_ = port;
  return Status::ok();
}

StatusOr<json> UcxConnector::handshake(const json& request) const {
  if (!config_.produces()) {
    return notFound("this agent's kv_role is kv_consumer: it lends no KV blocks");
  }
  auto nonce = request.find("nonce");
  if (nonce == request.end() || !nonce->is_string() ||
      !kv_auth::isNonce(nonce->get_ref<const std::string&>())) {
    return invalidArgument("nonce must be a string of " + std::to_string(kv_auth::kMinNonceChars) +
                           " to " + std::to_string(kv_auth::kMaxNonceChars) + " hex characters");
  }
  const std::string& nonce_text = nonce->get_ref<const std::string&>();
  if (!secret_.empty()) {
    auto signature = request.find("signature");
    if (signature == request.end() || !signature->is_string() ||
        !constantTimeEquals(signature->get_ref<const std::string&>(),
                            hmacSha256Hex(secret_, handshakeRequestCanonical(nonce_text)))) {
      failures_.add("auth");
      return permissionDenied(
          "signature is missing or does not match: this agent answers KV handshakes only from "
          "peers with its shared KV secret");
    }
  }
  json answer = {{"engine_id", engine_id_},
                 {"compatibility", compatibility_},
                 {"remote_slab", serialized_slab_},
                 {"remote_holds", serialized_holds_}};
  if (!secret_.empty()) {
    answer["signature"] =
        hmacSha256Hex(secret_, handshakeCanonical(nonce_text, engine_id_, compatibility_,
                                                  serialized_slab_, serialized_holds_));
  }
  return answer;
}

Status UcxConnector::authorizeRequest(std::string_view path, const json& body) const {
  if (request_verifier_ == nullptr) return Status::ok();
  Status status = request_verifier_->verify(path, body);
  if (status.code() == StatusCode::kPermissionDenied) failures_.add("auth");
  return status;
}

void UcxConnector::onMessage(const std::string& message) {
  // "release\n<transfer id>[\n<signature>]"
  const size_t first = message.find('\n');
  if (first == std::string::npos || std::string_view(message).substr(0, first) != kReleaseMessage) {
    return;
  }
  const size_t second = message.find('\n', first + 1);
  std::string id = message.substr(
      first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  const std::string signature = second == std::string::npos ? "" : message.substr(second + 1);
  if (!secret_.empty() &&
      !constantTimeEquals(signature, hmacSha256Hex(secret_, releaseCanonical(id)))) {
    TANDEM_LOG(kWarn) << "ucx connector: ignoring a release of transfer " << id
                      << " not signed with this agent's KV secret";
    failures_.add("auth");
    return;
  }
  endHold(id);
  std::lock_guard<std::mutex> lock(released_mutex_);
  released_.push_back(std::move(id));
}

StatusOr<UcxConnector::Descriptor> UcxConnector::parseDescriptor(const json& params,
                                                                 const std::string& field) const {
  if (!params.is_object()) return invalidArgument(field + " must be an object");
  if (params.contains("remote_slab")) {
    return invalidArgument(field +
                           ".remote_slab is not accepted: a reader fetches the producer's UCX "
                           "address from the producer itself (remote_host, remote_port)");
  }
  Descriptor d;
  auto text = [&](const char* name, std::string& out) -> Status {
    auto it = params.find(name);
    if (it == params.end() || !it->is_string()) {
      return invalidArgument(field + "." + name + " must be a string");
    }
    out = it->get<std::string>();
    return Status::ok();
  };
  for (auto [name, out] :
       {std::pair{"transfer_id", &d.transfer_id}, std::pair{"remote_engine_id", &d.engine_id},
        std::pair{"remote_host", &d.host}, std::pair{"compatibility", &d.compatibility}}) {
    if (Status status = text(name, *out); !status.isOk()) return status;
  }
  // Ours are a few dozen characters (a transfer id is a request id, at most
  // 256 of the client's plus ours); longer ones would only fill logs.
  for (auto [name, value, most] :
       {std::tuple{"transfer_id", &d.transfer_id, kMaxIdChars},
        std::tuple{"remote_engine_id", &d.engine_id, kMaxIdChars},
        std::tuple{"compatibility", &d.compatibility, kMaxCompatibilityChars}}) {
    if (value->size() > most) {
      return invalidArgument(field + "." + name + " must be at most " + std::to_string(most) +
                             " characters, got " + std::to_string(value->size()));
    }
  }
  if (!isHostName(d.host) || isWildcardHost(d.host)) {
    return invalidArgument(field + ".remote_host must be " + kHostAccepted + "; at most " +
                           std::to_string(kMaxHostChars) + " characters and not a wildcard; got " +
                           json(d.host).dump(-1, ' ', false, json::error_handler_t::replace));
  }
  auto integer = [&](const char* name, int64_t low, int64_t high, int64_t* out) -> Status {
    auto it = params.find(name);
    std::optional<int64_t> value;
    if (it != params.end()) value = integerValue(*it);
    if (!value || *value < low || *value > high) {
      return invalidArgument(
          field + "." + name + " must be an integer between " + std::to_string(low) + " and " +
          std::to_string(high) +
          (it == params.end() ? std::string(", got nothing") : ", got " + it->dump()));
    }
    *out = *value;
    return Status::ok();
  };
  int64_t port = 0;
  if (Status status = integer("remote_port", 1, 65535, &port); !status.isOk()) return status;
  d.port = static_cast<int>(port);
  if (Status status =
          integer("remote_num_blocks", 1, std::numeric_limits<BlockId>::max(), &d.num_blocks);
      !status.isOk()) {
    return status;
  }
  if (Status status =
          integer("remote_num_tokens", 0, std::numeric_limits<int64_t>::max(), &d.num_tokens);
      !status.isOk()) {
    return status;
  }
  auto ids = params.find("remote_block_ids");
  if (ids == params.end() || !ids->is_array()) {
    return invalidArgument(field + ".remote_block_ids must be an array of block ids");
  }
  // Ids are range-checked here, before a signature or anything else uses them.
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    const std::string name = field + ".remote_block_ids[" + std::to_string(i) + "]";
    // A whole number past 2^64 arrives as a float (from 2^63 on, none is
    // an int64): outside, as any other.
    const bool beyond = id.is_number_float() && std::fabs(id.get<double>()) >= 0x1p63 &&
                        std::isfinite(id.get<double>());
    if (!id.is_number_integer() && !beyond) {
      return invalidArgument(name + " must be an integer, got " + id.dump());
    }
    std::optional<int64_t> value = integerValue(id);
    if (!value || *value < 0 || *value >= d.num_blocks) {
      return invalidArgument(name + " = " + id.dump() + " is outside the other agent's " +
                             std::to_string(d.num_blocks) + " blocks (accepted: 0 to " +
                             std::to_string(d.num_blocks - 1) + ")");
    }
    d.block_ids.push_back(*value);
  }
  if (auto it = params.find("signature"); it != params.end()) {
    if (!it->is_string()) return invalidArgument(field + ".signature must be a string");
    d.signature = it->get<std::string>();
  }
  if (auto it = params.find("remote_hold_until_ms"); it != params.end()) {
    const std::optional<int64_t> value = integerValue(*it);
    if (!value || *value < 0) {
      return invalidArgument(field +
                             ".remote_hold_until_ms must be a non-negative integer (Unix "
                             "milliseconds)");
    }
    d.hold_until_ms = *value;
  }
  if (auto it = params.find("remote_hold_slot"); it != params.end()) {
    const std::optional<int64_t> value = integerValue(*it);
    if (!value || *value < 0 || *value >= kMaxHoldSlots) {
      return invalidArgument(field + ".remote_hold_slot must be an integer between 0 and " +
                             std::to_string(kMaxHoldSlots - 1) + ", got " + it->dump());
    }
    d.hold_slot = *value;
  }
  if (auto it = params.find("remote_hold_ticket"); it != params.end()) {
    if (!it->is_string() || !HoldTickets::fromHex(it->get_ref<const std::string&>())) {
      return invalidArgument(field +
                             ".remote_hold_ticket must be a string of 16 lower-case hex "
                             "characters");
    }
    d.hold_ticket = it->get<std::string>();
  }
  if (auto it = params.find("remote_last_block_hashes"); it != params.end()) {
    const std::string accepted =
        " must be an array of one or two block hashes (hex strings of at most 64 characters)";
    if (!it->is_array() || it->empty() || it->size() > 2) {
      return invalidArgument(field + ".remote_last_block_hashes" + accepted);
    }
    for (const json& hash : *it) {
      if (!hash.is_string() || hash.get_ref<const std::string&>().empty() ||
          hash.get_ref<const std::string&>().size() > 64) {
        return invalidArgument(field + ".remote_last_block_hashes" + accepted);
      }
      d.last_block_hashes.push_back(hash.get<std::string>());
    }
  }
  return d;
}

// A descriptor longer than the prompt is not refused here: its prompt is
// another one (lookup() reads nothing of it and computes the prompt).
Status UcxConnector::checkDescriptor(const Descriptor& d, const std::string& field) const {
  // Authenticity first: an unsigned peer learns nothing more.
  if (!secret_.empty()) {
    if (d.signature.empty()) {
      return permissionDenied(field +
                              ".signature is missing: this agent accepts only transfers signed "
                              "with its shared KV secret");
    }
    if (!constantTimeEquals(d.signature, hmacSha256Hex(secret_, canonical(d)))) {
      return permissionDenied(field +
                              ".signature does not match: the other agent uses a different KV "
                              "secret, or the parameters were altered");
    }
  }
  if (d.compatibility != compatibility_) {
    return failedPrecondition(field + ".compatibility: the other agent's KV layout differs (" +
                              firstDifference(compatibility_, d.compatibility) + ")");
  }
  if (!d.block_ids.empty() && (d.hold_slot < 0 || d.hold_ticket.empty())) {
    return invalidArgument(field + (d.hold_slot < 0 ? ".remote_hold_slot" : ".remote_hold_ticket") +
                           " is missing: remote_hold_slot and remote_hold_ticket must come with "
                           "remote_block_ids: a reader checks with them that the producer still "
                           "held the blocks it read");
  }
  const int64_t block_size = cache_.blockSize();
  const auto num_ids = static_cast<int64_t>(d.block_ids.size());
  if (d.num_tokens != num_ids * block_size) {
    return invalidArgument(field + ".remote_num_tokens (" + std::to_string(d.num_tokens) +
                           ") must be remote_block_ids' length (" + std::to_string(num_ids) +
                           ") times the block size " + std::to_string(block_size));
  }
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    const int64_t id = d.block_ids[i];
    if (!seen.insert(id).second) {
      return invalidArgument(field + ".remote_block_ids[" + std::to_string(i) +
                             "] = " + std::to_string(id) + " is named twice");
    }
  }
  return Status::ok();
}

Status UcxConnector::validate(const json& params) const {
  Status status = checkParams(params);
  if (!status.isOk()) {
    failures_.add(status.code() == StatusCode::kPermissionDenied     ? "auth"
                  : status.code() == StatusCode::kFailedPrecondition ? "incompatible"
                                                                     : "bad_params");
  }
  return status;
}

Status UcxConnector::checkParams(const json& params) const {
  if (!params.is_object()) return invalidArgument("kv_transfer_params must be an object");
  for (const char* name : {"do_remote_prefill", "do_remote_decode"}) {
    if (Status status = checkFlag(params, name); !status.isOk()) return status;
  }
  auto check = [&](const json& source, const std::string& field) -> Status {
    if (!config_.consumes()) {
      return invalidArgument(field + ": this agent's kv_role is kv_producer; it reads no KV");
    }
    auto descriptor = parseDescriptor(source, field);
    if (!descriptor.isOk()) return descriptor.status();
    return checkDescriptor(*descriptor, field);
  };
  if (flag(params, "do_remote_prefill")) return check(params, "kv_transfer_params");
  if (auto it = params.find("remote_prefix"); it != params.end()) {
    return check(*it, "kv_transfer_params.remote_prefix");
  }
  return Status::ok();
}

StatusOr<std::string> UcxConnector::releaseTarget(const json& params) const {
  auto descriptor = parseDescriptor(params, "kv_transfer_params");
  if (!descriptor.isOk()) return descriptor.status();
  if (!secret_.empty() &&
      !constantTimeEquals(descriptor->signature, hmacSha256Hex(secret_, canonical(*descriptor)))) {
    failures_.add("auth");
    return permissionDenied(
        "kv_transfer_params.signature does not match this agent's KV secret: only the "
        "parameters this agent returned can release its blocks");
  }
  if (descriptor->engine_id != engine_id_) {
    return notFound("kv_transfer_params.remote_engine_id names another agent, not this one");
  }
  // The engine frees the hold next (if it still exists); its ticket and
  // slots go now.
  endHold(descriptor->transfer_id);
  return descriptor->transfer_id;
}

const json* UcxConnector::sourceOf(const ConnectorRequest& request) const {
  const json* params = request.kv_transfer_params;
  if (!config_.consumes() || params == nullptr || !params->is_object() ||
      request.remote_source_spent) {
    return nullptr;
  }
  if (flag(*params, "do_remote_prefill")) return params;
  auto it = params->find("remote_prefix");
  if (it != params->end() && it->is_object()) return &*it;
  return nullptr;
}

LookupResult UcxConnector::lookup(const ConnectorRequest& request, int64_t num_local_tokens) {
  LookupResult result;
  const json* source = sourceOf(request);
  if (source == nullptr) return result;
  // Checked at admission; a parse here cannot fail but is cheap to repeat.
  auto descriptor = parseDescriptor(*source, "kv_transfer_params");
  if (!descriptor.isOk()) return result;
  const int64_t block_size = cache_.blockSize();
  // Full remote blocks, never the last token (its logits are needed here).
  const int64_t last = static_cast<int64_t>(request.tokens.size()) - 1;
  const int64_t blocks =
      std::min<int64_t>({static_cast<int64_t>(descriptor->block_ids.size()),
                         descriptor->num_tokens / block_size, last / block_size});
  const int64_t wanted = blocks * block_size - num_local_tokens;
  const bool pull_back = source != request.kv_transfer_params;
  const std::string id(request.request_id);
  if (declined_.count(id) != 0) return result;
  if (descriptor->block_ids.empty()) {
    // It offers nothing and holds nothing: no read, and no release to send.
    declined_.insert(id);
    return result;
  }
  const int64_t minimum = pull_back ? pull_threshold_blocks_ * block_size : 1;
  // The producer's KV is of its tokens: when this agent's own prompt
  // differs (its chat template rendered another date, another time zone),
  // its hash of the last block it would read differs, and nothing is read.
  const auto left = timeLeftToRead(*descriptor);
  if (left && *left < read_timeout_) {
    // The producer lets the blocks go before a read could be sure to end
    // (the request waited here, or on its way): they may hold another
    // request's KV by then.
    TANDEM_LOG(kWarn) << "ucx connector: request " << id
                      << ": the producer's hold of its blocks ends too soon to read them; "
                         "the prompt is computed here";
    failures_.add("hold_expired");
    declined_.insert(id);
    return result;
  }
  const bool same_prefix = samePrefix(*descriptor, request, blocks);
  if (!same_prefix) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << id
                      << ": the producer's KV is of another prompt (block " << blocks - 1
                      << "'s hash differs); its " << blocks << " blocks are recomputed here";
    failures_.add("prefix_mismatch");
  }
  Descriptor source_blocks = std::move(descriptor).value();
  source_blocks.block_ids.clear();
  if (wanted < minimum || !same_prefix) {
    // Nothing to read (this agent holds it all already), or cheaper to
    // recompute: let the owner go now rather than at its hold timeout.
    offered_.erase(id);
    declined_.insert(id);
    enqueueRelease(id, std::move(source_blocks));
    return result;
  }
  offered_[id] = std::move(source_blocks);
  result.state = LookupResult::State::kAvailable;
  result.num_tokens = wanted;
  return result;
}

void UcxConnector::enqueueRelease(const std::string& request_id, Descriptor source) {
  LoadJob job;
  job.request_id = request_id;
  job.source = std::move(source);
  job.release_only = true;
  enqueue(std::move(job));
}

bool UcxConnector::releaseOffered(const std::string& request_id) {
  auto it = offered_.find(request_id);
  if (it == offered_.end()) return false;
  Descriptor source = std::move(it->second);
  offered_.erase(it);
  enqueueRelease(request_id, std::move(source));
  return true;
}

void UcxConnector::lookupNotTaken(std::string_view request_id) {
  const std::string id(request_id);
  if (releaseOffered(id)) declined_.insert(id);  // offered once, released: never read
}

std::optional<transport::Clock::duration> UcxConnector::timeLeftToRead(const Descriptor& d) {
  if (d.hold_until_ms <= 0) return std::nullopt;
  // At most a day: a later end is as good as none, and nanoseconds of
  // anything past 292 years would not fit the clock's duration.
  constexpr int64_t kDayMs = 24 * 3600 * 1000;
  const auto left =
      std::chrono::milliseconds(std::min(d.hold_until_ms - unixMillis(), kDayMs)) - kHoldMargin;
  return std::chrono::duration_cast<transport::Clock::duration>(left);
}

bool UcxConnector::samePrefix(const Descriptor& d, const ConnectorRequest& request,
                              int64_t blocks) {
  if (blocks <= 0) return true;  // nothing is read
  if (d.last_block_hashes.empty()) {
    // Nothing to compare: a producer longer than this prompt had another one.
    return d.num_tokens <= static_cast<int64_t>(request.tokens.size());
  }
  // The hashes are of the producer's last offered blocks, the last one
  // last; this agent reads `blocks` of them.
  const auto offered = static_cast<int64_t>(d.block_ids.size());
  const int64_t back = offered - blocks;  // 0: the last hash, 1: the one before
  const auto count = static_cast<int64_t>(d.last_block_hashes.size());
  if (back < 0 || back >= count || blocks > static_cast<int64_t>(request.block_hashes.size())) {
    return false;  // a prompt shorter than the producer's by a block or more: another prompt
  }
  return d.last_block_hashes[static_cast<size_t>(count - 1 - back)] ==
         request.block_hashes[static_cast<size_t>(blocks - 1)].toHex();
}

StatusOr<UcxConnector::Handshake> UcxConnector::fetchHandshake(const std::string& host, int port,
                                                               transport::Deadline deadline,
                                                               std::string* reason) const {
  const std::string where = host + ":" + std::to_string(port);
  const auto remaining = deadline - transport::Clock::now();
  if (remaining <= transport::Clock::duration::zero()) {
    *reason = "timeout";
    return Status(StatusCode::kDeadlineExceeded, "no time left for the handshake with " + where);
  }
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(remaining).count();
  httplib::Client client(connectHost(host), port);
  client.set_keep_alive(false);
  client.set_connection_timeout(micros / 1000000, micros % 1000000);
  client.set_read_timeout(micros / 1000000, micros % 1000000);
  client.set_write_timeout(micros / 1000000, micros % 1000000);
  const std::string nonce = kv_auth::randomNonce();
  json body = {{"nonce", nonce}};
  if (!secret_.empty())
    body["signature"] = hmacSha256Hex(secret_, handshakeRequestCanonical(nonce));
  auto response = client.Post(kHandshakePath, body.dump(), "application/json");
  if (!response) {
    *reason = "unreachable";
    return unavailable("KV handshake with " + where +
                       " failed: " + httplib::to_string(response.error()));
  }
  if (response->status != 200) {
    *reason = response->status == 403 ? "auth" : "bad_handshake";
    return unavailable("KV handshake with " + where + " answered HTTP " +
                       std::to_string(response->status) + ": " + response->body.substr(0, 300));
  }
  *reason = "bad_handshake";
  if (response->body.size() > kMaxHandshakeBytes) {
    return invalidArgument("KV handshake answer from " + where + " is larger than " +
                           std::to_string(kMaxHandshakeBytes) + " bytes");
  }
  json answer = parseJsonOrDiscarded(response->body);
  Handshake handshake;
  auto text = [&](const char* name, std::string& out) {
    auto it = answer.find(name);
    if (it == answer.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  if (answer.is_discarded() || !answer.is_object() || !text("engine_id", handshake.engine_id) ||
      !text("compatibility", handshake.compatibility) ||
      !text("remote_slab", handshake.slab_text) || !text("remote_holds", handshake.holds_text)) {
    return invalidArgument("KV handshake answer from " + where +
                           " must be a JSON object with the strings engine_id, compatibility, "
                           "remote_slab and remote_holds");
  }
  if (!secret_.empty()) {
    std::string signature;
    if (!text("signature", signature) ||
        !constantTimeEquals(
            signature,
            hmacSha256Hex(secret_,
                          handshakeCanonical(nonce, handshake.engine_id, handshake.compatibility,
                                             handshake.slab_text, handshake.holds_text)))) {
      *reason = "auth";
      return permissionDenied("KV handshake answer from " + where +
                              " is not signed with this agent's KV secret over our nonce");
    }
  }
  reason->clear();
  return handshake;
}

void UcxConnector::dropStalePeers() {
  const auto now = transport::Clock::now();
  for (auto it = peers_.begin(); it != peers_.end();) {
    Status health = it->second.peer->health();
    const bool idle = now - it->second.last_used > peer_idle_timeout_;
    if (health.isOk() && !idle) {
      ++it;
      continue;
    }
    TANDEM_LOG(kInfo) << "ucx connector: dropping the peer " << it->first << " at "
                      << it->second.host << ":" << it->second.port << " ("
                      << (health.isOk() ? std::string("unused") : health.message()) << ")";
    it = peers_.erase(it);  // closes the endpoint and unmaps the peer's slab
  }
}

void UcxConnector::dropReplacedPeers(const std::string& host, int port,
                                     const std::string& engine_id) {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->first == engine_id || it->second.host != host || it->second.port != port) {
      ++it;
      continue;
    }
    TANDEM_LOG(kInfo) << "ucx connector: dropping the peer " << it->first << ": " << host << ":"
                      << port << " now answers as " << engine_id;
    it->second.peer->markFailed("replaced by " + engine_id + " at " + host + ":" +
                                std::to_string(port));
    it = peers_.erase(it);
  }
}

std::shared_ptr<transport::UcxPeer> UcxConnector::peerFor(const Descriptor& source,
                                                          transport::Deadline deadline,
                                                          PeerFailure* failure) {
  auto fail = [&](std::string reason, Status status) -> std::shared_ptr<transport::UcxPeer> {
    failure->reason = std::move(reason);
    failure->status = std::move(status);
    return nullptr;
  };
  if (auto it = peers_.find(source.engine_id); it != peers_.end()) {
    if (it->second.peer->health().isOk()) {
      if (it->second.peer->remote().num_blocks != source.num_blocks) {
        return fail("bad_params",
                    invalidArgument("remote_num_blocks " + std::to_string(source.num_blocks) +
                                    " differs from the " +
                                    std::to_string(it->second.peer->remote().num_blocks) +
                                    " blocks engine " + source.engine_id + " has"));
      }
      it->second.last_used = transport::Clock::now();
      return it->second.peer;
    }
    peers_.erase(it);
  }
  std::string reason;
  auto handshake = fetchHandshake(source.host, source.port, deadline, &reason);
  if (!handshake.isOk()) return fail(reason, handshake.status());
  dropReplacedPeers(source.host, source.port, handshake->engine_id);
  const std::string where = source.host + ":" + std::to_string(source.port);
  if (handshake->engine_id != source.engine_id) {
    return fail("peer_restarted",
                unavailable(where + " answers as engine " + handshake->engine_id + ", not " +
                            source.engine_id + " (the producer restarted; its blocks are gone)"));
  }
  if (handshake->compatibility != compatibility_) {
    return fail(
        "incompatible",
        failedPrecondition(where + ": the other agent's KV layout differs (" +
                           firstDifference(compatibility_, handshake->compatibility) + ")"));
  }
  auto slab = transport::RemoteSlab::parse(handshake->slab_text);
  if (!slab.isOk()) return fail("bad_handshake", slab.status());
  if (slab->block_bytes != cache_.blockBytes() || slab->num_blocks != source.num_blocks) {
    return fail(
        "bad_handshake",
        invalidArgument(where + " advertises " + std::to_string(slab->num_blocks) + " blocks of " +
                        std::to_string(slab->block_bytes) + " bytes; expected " +
                        std::to_string(source.num_blocks) + " blocks (remote_num_blocks) of " +
                        std::to_string(cache_.blockBytes()) + " bytes"));
  }
  auto holds = transport::RemoteSlab::parse(handshake->holds_text);
  if (!holds.isOk()) return fail("bad_handshake", holds.status());
  auto peer = context_->connect(*slab, deadline);
  if (!peer.isOk()) {
    return fail(peer.status().code() == StatusCode::kInvalidArgument    ? "bad_handshake"
                : peer.status().code() == StatusCode::kDeadlineExceeded ? "timeout"
                                                                        : "unreachable",
                peer.status());
  }
  if (Status attached = (*peer)->attachWords(*holds); !attached.isOk()) {
    return fail(attached.code() == StatusCode::kInvalidArgument ? "bad_handshake" : "unreachable",
                Status(attached.code(), where + ": remote_holds: " + attached.message()));
  }
  peers_[source.engine_id] = {source.host, source.port, *peer, transport::Clock::now()};
  return *peer;
}

LoadResult UcxConnector::load(const ConnectorRequest& request, int64_t first_block,
                              std::span<const BlockId> block_ids) {
  LoadResult result;
  auto fail_all = [&](const std::string& why) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << request.request_id << ": " << why;
    failures_.add("bad_params");
    for (size_t i = 0; i < block_ids.size(); ++i) {
      result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
    }
    return result;
  };
  const json* source = sourceOf(request);
  if (source == nullptr) return fail_all("no transfer to load from");
  auto descriptor = parseDescriptor(*source, "kv_transfer_params");
  if (!descriptor.isOk()) return fail_all(descriptor.status().message());
  LoadJob job;
  job.request_id = std::string(request.request_id);
  job.first_block = first_block;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const size_t index = static_cast<size_t>(first_block) + i;
    if (index >= descriptor->block_ids.size()) {
      return fail_all("remote_block_ids is shorter than the blocks to load");
    }
    // In [0, remote_num_blocks), which fits a BlockId (parseDescriptor).
    job.pairs.push_back({static_cast<BlockId>(descriptor->block_ids[index]), block_ids[i]});
  }
  offered_.erase(job.request_id);  // the job's read releases the owner
  job.source = std::move(descriptor).value();
  job.source.block_ids.clear();
  // The read runs on the loader thread: a slow or stalled peer never holds up
  // the engine's steps. The engine keeps the blocks until poll() reports it.
  enqueue(std::move(job));
  result.done = false;
  return result;
}

void UcxConnector::enqueue(LoadJob job) {
  {
    std::lock_guard<std::mutex> lock(jobs_mutex_);
    jobs_.push_back(std::move(job));
  }
  jobs_ready_.notify_one();
}

void UcxConnector::loaderLoop() {
  for (;;) {
    LoadJob job;
    {
      std::unique_lock<std::mutex> lock(jobs_mutex_);
      // Wakes now and then without work to drop idle or failed peers.
      const auto sweep =
          std::min<transport::Clock::duration>(std::chrono::seconds(1), peer_idle_timeout_ / 2);
      jobs_ready_.wait_for(lock, sweep, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) {
        if (stopping_) return;
        lock.unlock();
        dropStalePeers();
        freeExpiredHolds();
        continue;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    dropStalePeers();
    freeExpiredHolds();
    LoadOutcome finished = runLoad(job);
    if (job.release_only) continue;
    std::lock_guard<std::mutex> lock(finished_mutex_);
    finished_.push_back(std::move(finished));
  }
}

UcxConnector::LoadOutcome UcxConnector::runLoad(const LoadJob& job) {
  // The transfer's duration: connecting (when not yet connected) and reading;
  // not the wait in the queue, nor the release message after.
  const auto start = transport::Clock::now();
  LoadOutcome outcome;
  FinishedLoad& finished = outcome.finished;
  finished.request_id = job.request_id;
  finished.num_blocks = static_cast<int64_t>(job.pairs.size());
  finished.from_peer = true;
  // `counted`: a failure already counted for this load is not counted again.
  auto fail_all = [&](const std::string& reason, const std::string& why, bool counted = false) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << job.request_id << ": " << why;
    if (!counted) failures_.add(reason);
    finished.failed_block_indices.clear();
    for (size_t i = 0; i < job.pairs.size(); ++i) {
      finished.failed_block_indices.push_back(job.first_block + static_cast<int64_t>(i));
    }
  };
  // The read ends within read_timeout_s, and before the producer's hold
  // does: after it, the blocks may hold another request's KV.
  auto budget = read_timeout_;
  const auto hold_left = timeLeftToRead(job.source);
  if (hold_left) budget = std::min(budget, *hold_left);
  const auto deadline = transport::Clock::now() + budget;
  const std::string address = job.source.host + ":" + std::to_string(job.source.port);
  const auto down = down_peers_.find(address);
  if (down != down_peers_.end() && transport::Clock::now() - down->second >= read_timeout_) {
    down_peers_.erase(down);
  }
  PeerFailure failure;
  std::shared_ptr<transport::UcxPeer> peer;
  // Only a peer given the whole read timeout is judged down by its silence.
  const bool full_budget = budget == read_timeout_;
  if (hold_left && *hold_left <= transport::Clock::duration::zero()) {
    // Queued here (behind slow peers) past the producer's hold: nothing to
    // read, nor to release.
    if (job.release_only) return outcome;
    fail_all("hold_expired", "the producer's hold of the blocks ended while the read waited");
  } else if (down_peers_.count(address) != 0) {
    fail_all("peer_down",
             "peer " + job.source.engine_id + " at " + address +
                 " did not answer moments ago; not tried again before " +
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::seconds>(read_timeout_).count()) +
                 " s");
  } else if (peer = peerFor(job.source, deadline, &failure); peer == nullptr) {
    // A release-only job's lender is gone: its hold times out there.
    fail_all(failure.reason, "peer " + job.source.engine_id + ": " + failure.status.message());
    if (full_budget && (failure.reason == "unreachable" || failure.reason == "timeout")) {
      down_peers_[address] = transport::Clock::now();
    }
  } else {
    // Staging: read into free slots of our staging area; poll() copies them
    // into the slab blocks on the engine thread.
    std::vector<transport::BlockPair> pairs = job.pairs;
    bool staged_ok = true;
    if (buffer_path_ == KvBufferPath::kStaging && !pairs.empty()) {
      outcome.slots = takeSlots(static_cast<int64_t>(pairs.size()));
      if (outcome.slots.empty()) {
        staged_ok = false;
        fail_all("staging_full", "no " + std::to_string(pairs.size()) +
                                     " free staging slots (kv_connector_extra_config."
                                     "staging_blocks is " +
                                     std::to_string(staging_capacity_) + "); recomputing");
      } else {
        for (size_t i = 0; i < pairs.size(); ++i) pairs[i].local_block = outcome.slots[i];
      }
    }
    transport::ReadResult read;
    if (staged_ok && !pairs.empty()) read = peer->readBlocks(local_slab_, pairs, deadline);
    if (!read.status.isOk()) {
      const std::string reason =
          read.status.code() == StatusCode::kDeadlineExceeded ? "timeout" : "read_error";
      if (reason == "timeout" && full_budget) down_peers_[address] = transport::Clock::now();
      fail_all(reason, read.status.message());
      finished.failed_block_indices.clear();
      for (BlockId failed : read.failed_local_blocks) {
        for (size_t i = 0; i < pairs.size(); ++i) {
          if (pairs[i].local_block == failed) {
            finished.failed_block_indices.push_back(job.first_block + static_cast<int64_t>(i));
          }
        }
      }
    }
    if (staged_ok && !outcome.slots.empty()) {
      std::unordered_set<BlockId> failed(read.failed_local_blocks.begin(),
                                         read.failed_local_blocks.end());
      for (size_t i = 0; i < pairs.size(); ++i) {
        if (failed.count(pairs[i].local_block) == 0) {
          outcome.staged.push_back({pairs[i].local_block, job.pairs[i].local_block,
                                    job.first_block + static_cast<int64_t>(i)});
        }
      }
    }
    // Read blocks count only if the producer still held them when they were
    // read: its ticket, read after them, is still in its word (hold_tickets.h).
    // The check has a deadline of its own: the ticket, not the clock, says
    // whether the blocks were still held.
    bool hold_ended = false;
    if (staged_ok && read.failed_local_blocks.size() < pairs.size()) {
      auto word = peer->readWord(job.source.hold_slot, transport::Clock::now() + read_timeout_);
      std::string reason;
      std::string why;
      if (!word.isOk()) {
        reason = word.status().code() == StatusCode::kDeadlineExceeded ? "timeout" : "read_error";
        why = "checking the producer's hold after the read: " + word.status().message();
      } else if (HoldTickets::toHex(*word) != job.source.hold_ticket) {
        reason = "hold_ended";
        why = "the producer's hold of transfer " + job.source.transfer_id +
              " had ended when its blocks were read (released, timed out, or read before); they "
              "may hold other KV, so they are not used";
        hold_ended = true;
      }
      if (!reason.empty()) {
        fail_all(reason, why, /*counted=*/!read.status.isOk());
        outcome.staged.clear();
      }
    }
    finished.seconds = std::chrono::duration<double>(transport::Clock::now() - start).count();
    // Whatever happened, the owner may free its blocks now (unless their
    // hold is over: its id may name a newer hold by then).
    if (!hold_ended) sendRelease(*peer, job.source.transfer_id);
    // A failed peer is dropped at once: its slab is unmapped here.
    if (!peer->health().isOk()) {
      peer.reset();
      dropStalePeers();
    }
  }
  if (finished.seconds == 0) {
    finished.seconds = std::chrono::duration<double>(transport::Clock::now() - start).count();
  }
  if (job.release_only && !outcome.slots.empty()) freeSlots(outcome.slots);
  return outcome;
}

std::vector<KvConnectorWorker::FinishedLoad> UcxConnector::poll() {
  std::vector<LoadOutcome> outcomes;
  {
    std::lock_guard<std::mutex> lock(finished_mutex_);
    outcomes = std::exchange(finished_, {});
  }
  if (!outcomes.empty() && buffer_path_ == KvBufferPath::kStaging) {
    // Engine thread: the backend is ours while we copy. The engine keeps the
    // destination blocks until this load is reported.
    // A copy that fails (a device error) fails its block and the rest of
    // the load's: they are recomputed (or the request fails, by policy);
    // the slots go back either way, and the other loads are reported.
    const size_t block_bytes = cache_.blockBytes();
    for (LoadOutcome& outcome : outcomes) {
      std::vector<int64_t>& failed = outcome.finished.failed_block_indices;
      for (size_t i = 0; i < outcome.staged.size(); ++i) {
        const LoadOutcome::Staged& staged = outcome.staged[i];
        try {
          copyIntoSlab(staged.block,
                       staging_base_ + static_cast<size_t>(staged.slot) * block_bytes);
        } catch (const std::exception& error) {
          TANDEM_LOG(kError) << "ucx connector: request " << outcome.finished.request_id
                             << ": copying " << outcome.staged.size() - i
                             << " staged blocks into the KV cache failed: " << error.what()
                             << "; they are not used";
          failures_.add("copy_error");
          for (size_t j = i; j < outcome.staged.size(); ++j) {
            failed.push_back(outcome.staged[j].index);
          }
          std::sort(failed.begin(), failed.end());
          failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
          break;
        }
      }
      if (!outcome.slots.empty()) freeSlots(outcome.slots);
    }
  }
  std::vector<FinishedLoad> out;
  out.reserve(outcomes.size());
  for (LoadOutcome& outcome : outcomes) out.push_back(std::move(outcome.finished));
  return out;
}

void UcxConnector::sendRelease(transport::UcxPeer& peer, const std::string& transfer_id) {
  if (faults_.drop_notifications) return;
  if (faults_.delay_notifications_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(faults_.delay_notifications_ms));
  }
  std::string message = std::string(kReleaseMessage) + "\n" + transfer_id;
  if (!secret_.empty()) {
    message += '\n';
    message += hmacSha256Hex(secret_, releaseCanonical(transfer_id));
  }
  Status notified = peer.notify(message, transport::Clock::now() + read_timeout_);
  if (!notified.isOk()) {
    TANDEM_LOG(kWarn) << "ucx connector: release message not sent: " << notified.message();
  }
}

void UcxConnector::requestEnded(const std::string& request_id) {
  releaseOffered(request_id);  // ended (finished, aborted, refused) without its load
  declined_.erase(request_id);
}

void UcxConnector::requestAbandoned(std::string_view request_id) {
  requestEnded(std::string(request_id));
}

FinishDecision UcxConnector::requestFinished(const ConnectorRequest& request,
                                             std::span<const BlockId> blocks,
                                             int64_t num_computed_tokens) {
  requestEnded(std::string(request.request_id));
  FinishDecision decision;
  const json* params = request.kv_transfer_params;
  if (!config_.produces() || params == nullptr || !params->is_object() ||
      !flag(*params, "do_remote_decode")) {
    return decision;
  }
  Descriptor d;
  d.transfer_id = std::string(request.request_id);
  d.engine_id = engine_id_;
  {
    std::lock_guard<std::mutex> lock(advertised_mutex_);
    d.host = advertised_host_;
    d.port = advertised_port_;
  }
  d.num_blocks = num_slab_blocks_;
  d.compatibility = compatibility_;
  int64_t full_blocks = std::min<int64_t>(num_computed_tokens / cache_.blockSize(),
                                          static_cast<int64_t>(blocks.size()));
  // A stale earlier hold under the same id ends first (its ticket, its slots).
  endHold(d.transfer_id);
  std::optional<HoldTickets::Taken> ticket;
  if (full_blocks > 0) {
    ticket = tickets_->take(d.transfer_id);
    if (!ticket) {
      TANDEM_LOG(kWarn) << "ucx connector: request " << d.transfer_id << ": all "
                        << tickets_->capacity()
                        << " hold tickets are taken (kv_connector_extra_config.hold_slots); the "
                           "reader recomputes";
      failures_.add("holds_full");
      full_blocks = 0;
    }
  }
  if (buffer_path_ == KvBufferPath::kStaging) {
    // Readers see the staging slots, never the slab.
    std::vector<BlockId> slots;
    try {
      if (full_blocks > 0) slots = stageBlocks(blocks.first(static_cast<size_t>(full_blocks)));
    } catch (...) {
      endHold(d.transfer_id);  // the ticket goes back with the error
      throw;
    }
    if (full_blocks > 0 && slots.empty()) {
      TANDEM_LOG(kWarn) << "ucx connector: request " << d.transfer_id << ": no " << full_blocks
                        << " free staging slots (staging_blocks is " << staging_capacity_
                        << "); the reader recomputes";
      failures_.add("staging_full");
      full_blocks = 0;
      tickets_->end(d.transfer_id);
      ticket.reset();
    } else if (!slots.empty()) {
      const auto timeout = std::chrono::duration_cast<transport::Clock::duration>(
          std::chrono::duration<double>(config_.abort_timeout_s));
      std::lock_guard<std::mutex> lock(staging_mutex_);
      if (tickets_->holds(d.transfer_id, ticket->ticket)) {
        staged_holds_[d.transfer_id] = {slots, transport::Clock::now() + timeout};
      } else {
        // Ended meanwhile (a release of an earlier hold under this id, on
        // another thread): nobody will free these slots but us.
        returnSlotsLocked(slots);
      }
    }
    d.block_ids.assign(slots.begin(), slots.end());
  } else {
    d.block_ids.assign(blocks.begin(), blocks.begin() + full_blocks);
  }
  d.num_tokens = full_blocks * cache_.blockSize();
  d.hold_until_ms = unixMillis() + static_cast<int64_t>(config_.abort_timeout_s * 1000);
  // A descriptor that offers no block (no ticket or staging slot was free,
  // or the prompt is shorter than a block) holds nothing: the blocks go back
  // now, rather than when the reader's release or the timeout comes.
  decision.hold = full_blocks > 0;
  decision.copied = decision.hold && buffer_path_ == KvBufferPath::kStaging;
  decision.kv_transfer_params = {{"remote_engine_id", d.engine_id},
                                 {"remote_host", d.host},
                                 {"remote_port", d.port},
                                 {"remote_num_blocks", d.num_blocks},
                                 {"remote_block_ids", d.block_ids},
                                 {"remote_num_tokens", d.num_tokens},
                                 {"transfer_id", d.transfer_id},
                                 {"compatibility", d.compatibility},
                                 {"remote_hold_until_ms", d.hold_until_ms}};
  if (ticket) {
    d.hold_slot = ticket->slot;
    d.hold_ticket = HoldTickets::toHex(ticket->ticket);
    decision.kv_transfer_params["remote_hold_slot"] = d.hold_slot;
    decision.kv_transfer_params["remote_hold_ticket"] = d.hold_ticket;
  }
  // The hashes of the last two offered blocks (a reader takes all of them,
  // or one fewer when its last token ends the last): a reader whose own
  // prompt gives other hashes reads nothing.
  json last_hashes = json::array();
  for (int64_t i = std::max<int64_t>(full_blocks - 2, 0);
       i < full_blocks && i < static_cast<int64_t>(request.block_hashes.size()); ++i) {
    last_hashes.push_back(request.block_hashes[static_cast<size_t>(i)].toHex());
  }
  if (!last_hashes.empty() && std::ssize(last_hashes) == std::min<int64_t>(full_blocks, 2)) {
    d.last_block_hashes = last_hashes.get<std::vector<std::string>>();
    decision.kv_transfer_params["remote_last_block_hashes"] = std::move(last_hashes);
  }
  if (!secret_.empty()) {
    decision.kv_transfer_params["signature"] = hmacSha256Hex(secret_, canonical(d));
  }
  return decision;
}

std::vector<std::string> UcxConnector::pollReleased() {
  std::lock_guard<std::mutex> lock(released_mutex_);
  return std::exchange(released_, {});
}

}  // namespace tandem::kv
