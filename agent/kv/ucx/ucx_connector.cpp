#include "agent/kv/ucx/ucx_connector.h"

#include <cstdlib>
#include <random>
#include <thread>
#include <unordered_set>

#include "common/hmac.h"
#include "common/logging.h"

namespace tandem::kv {
namespace {

using nlohmann::json;

constexpr int kProtocolVersion = 1;
constexpr std::string_view kReleaseMessage = "release";

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
  std::string text = "tandem-kv-transfer/1\n" + d.transfer_id + "\n" + d.engine_id + "\n" +
                     d.slab_text + "\n" + std::to_string(d.num_tokens) + "\n";
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(d.block_ids[i]);
  }
  return text + "\n" + d.compatibility;
}

std::string releaseCanonical(std::string_view transfer_id) {
  return "tandem-kv-release/1\n" + std::string(transfer_id);
}

}  // namespace

std::string kvSecret(const KvTransferConfig& config) {
  auto it = config.extra.find("secret");
  if (it != config.extra.end() && it->is_string()) return it->get<std::string>();
  const char* env = std::getenv("TANDEM_KV_SECRET");
  return env != nullptr ? env : "";
}

UcxConnector::UcxConnector(const KvTransferConfig& config, engine::KvCache& cache,
                           const std::string& model_identity)
    : config_(config), cache_(cache) {
  const auto* allocator = dynamic_cast<const transport::UcxSlabAllocator*>(&cache.allocator());
  if (allocator == nullptr) {
    throw Error("ucx connector: the KV cache must be allocated by UCX (got the " +
                cache.allocator().name() + " allocator)");
  }
  if (auto it = config.extra.find("secret");
      it != config.extra.end() && (!it->is_string() || it->get<std::string>().empty())) {
    throw Error("kv_connector_extra_config.secret must be a non-empty string");
  }
  secret_ = kvSecret(config);
  if (auto it = config.extra.find("remote_pull_threshold"); it != config.extra.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      throw Error(
          "kv_connector_extra_config.remote_pull_threshold must be a positive number of blocks, "
          "got " +
          it->dump());
    }
    pull_threshold_blocks_ = it->get<int64_t>();
  }
  if (auto it = config.extra.find("read_timeout_s"); it != config.extra.end()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      throw Error("kv_connector_extra_config.read_timeout_s must be a positive number, got " +
                  it->dump());
    }
    read_timeout_ = std::chrono::duration_cast<transport::Clock::duration>(
        std::chrono::duration<double>(it->get<double>()));
  }
  auto faults = FaultInjection::parse(config.extra);
  if (!faults.isOk()) throw Error(faults.status().message());
  faults_ = *faults;

  context_ = allocator->context();
  const auto& kv = cache.config();
  compatibility_ =
      "model=" + model_identity + ";kv_dtype=" + dtypeShortName(kv.dtype) +
      ";block_size=" + std::to_string(kv.block_size) + ";layers=" + std::to_string(kv.num_layers) +
      ";kv_heads=" + std::to_string(kv.num_kv_heads) + ";head_dim=" + std::to_string(kv.head_dim) +
      ";protocol=" + std::to_string(kProtocolVersion);
  auto local = allocator->localSlab(cache.blockBytes());
  auto remote = allocator->remoteSlab(cache.blockBytes());
  if (!local.isOk() || !remote.isOk()) {
    throw Error("ucx connector: " +
                (local.isOk() ? remote.status().message() : local.status().message()));
  }
  local_slab_ = *local;
  serialized_slab_ = remote->serialize();
  std::random_device random;
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
  std::lock_guard<std::mutex> lock(released_mutex_);
  released_.push_back(std::move(id));
}

StatusOr<UcxConnector::Descriptor> UcxConnector::parseDescriptor(const json& params,
                                                                 const std::string& field) const {
  if (!params.is_object()) return invalidArgument(field + " must be an object");
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
        std::pair{"remote_slab", &d.slab_text}, std::pair{"compatibility", &d.compatibility}}) {
    if (Status status = text(name, *out); !status.isOk()) return status;
  }
  auto tokens = params.find("remote_num_tokens");
  if (tokens == params.end() || !tokens->is_number_integer() || tokens->get<int64_t>() < 0) {
    return invalidArgument(field + ".remote_num_tokens must be a non-negative integer");
  }
  d.num_tokens = tokens->get<int64_t>();
  auto ids = params.find("remote_block_ids");
  if (ids == params.end() || !ids->is_array()) {
    return invalidArgument(field + ".remote_block_ids must be an array of block ids");
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    if (!id.is_number_integer()) {
      return invalidArgument(field + ".remote_block_ids[" + std::to_string(i) +
                             "] must be an integer, got " + id.dump());
    }
    d.block_ids.push_back(id.get<BlockId>());
  }
  if (auto it = params.find("signature"); it != params.end()) {
    if (!it->is_string()) return invalidArgument(field + ".signature must be a string");
    d.signature = it->get<std::string>();
  }
  return d;
}

Status UcxConnector::checkDescriptor(const Descriptor& d, const std::string& field,
                                     int64_t num_prompt_tokens) const {
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
  auto slab = transport::RemoteSlab::parse(d.slab_text);
  if (!slab.isOk()) return invalidArgument(field + ".remote_slab: " + slab.status().message());
  if (slab->block_bytes != cache_.blockBytes()) {
    return invalidArgument(field + ".remote_slab: block size " + std::to_string(slab->block_bytes) +
                           " bytes differs from ours " + std::to_string(cache_.blockBytes()));
  }
  const int64_t block_size = cache_.blockSize();
  const auto num_ids = static_cast<int64_t>(d.block_ids.size());
  if (d.num_tokens != num_ids * block_size) {
    return invalidArgument(field + ".remote_num_tokens (" + std::to_string(d.num_tokens) +
                           ") must be remote_block_ids' length (" + std::to_string(num_ids) +
                           ") times the block size " + std::to_string(block_size));
  }
  if (d.num_tokens > num_prompt_tokens) {
    return invalidArgument(field + ".remote_num_tokens (" + std::to_string(d.num_tokens) +
                           ") exceeds the prompt's " + std::to_string(num_prompt_tokens) +
                           " tokens");
  }
  std::unordered_set<BlockId> seen;
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    const BlockId id = d.block_ids[i];
    if (id < 0 || id >= slab->num_blocks) {
      return invalidArgument(field + ".remote_block_ids[" + std::to_string(i) +
                             "] = " + std::to_string(id) + " is outside the other agent's " +
                             std::to_string(slab->num_blocks) + " blocks");
    }
    if (!seen.insert(id).second) {
      return invalidArgument(field + ".remote_block_ids[" + std::to_string(i) +
                             "] = " + std::to_string(id) + " is named twice");
    }
  }
  return Status::ok();
}

Status UcxConnector::validate(const json& params, int64_t num_prompt_tokens) const {
  Status status = checkParams(params, num_prompt_tokens);
  if (!status.isOk()) {
    failures_.add(status.code() == StatusCode::kPermissionDenied     ? "auth"
                  : status.code() == StatusCode::kFailedPrecondition ? "incompatible"
                                                                     : "bad_params");
  }
  return status;
}

Status UcxConnector::checkParams(const json& params, int64_t num_prompt_tokens) const {
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
    return checkDescriptor(*descriptor, field, num_prompt_tokens);
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
  return descriptor->transfer_id;
}

const json* UcxConnector::sourceOf(const ConnectorRequest& request) const {
  const json* params = request.kv_transfer_params;
  if (!config_.consumes() || params == nullptr || !params->is_object()) return nullptr;
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
  const int64_t minimum = pull_back ? pull_threshold_blocks_ * block_size : 1;
  if (wanted < minimum) {
    // Nothing to read (this agent holds it all already), or cheaper to
    // recompute: let the owner go now rather than at its hold timeout.
    if (declined_.size() >= 4096) declined_.clear();  // aborted requests never finish here
    declined_.insert(id);
    enqueue({id, descriptor->transfer_id, descriptor->slab_text, 0, {}, true});
    return result;
  }
  result.state = LookupResult::State::kAvailable;
  result.num_tokens = wanted;
  return result;
}

StatusOr<std::shared_ptr<transport::UcxPeer>> UcxConnector::peerFor(
    const std::string& serialized_slab, transport::Deadline deadline) {
  auto it = peers_.find(serialized_slab);
  if (it != peers_.end() && it->second->health().isOk()) return it->second;
  auto remote = transport::RemoteSlab::parse(serialized_slab);
  if (!remote.isOk()) return remote.status();
  auto peer = context_->connect(*remote, deadline);
  if (!peer.isOk()) return peer.status();
  peers_[serialized_slab] = *peer;
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
  job.transfer_id = descriptor->transfer_id;
  job.slab_text = descriptor->slab_text;
  job.first_block = first_block;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const size_t index = static_cast<size_t>(first_block) + i;
    if (index >= descriptor->block_ids.size()) {
      return fail_all("remote_block_ids is shorter than the blocks to load");
    }
    job.pairs.push_back({descriptor->block_ids[index], block_ids[i]});
  }
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
      jobs_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping with nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    FinishedLoad finished = runLoad(job);
    if (job.release_only) continue;
    std::lock_guard<std::mutex> lock(finished_mutex_);
    finished_.push_back(std::move(finished));
  }
}

KvConnectorWorker::FinishedLoad UcxConnector::runLoad(const LoadJob& job) {
  // The transfer's duration: connecting (when not yet connected) and reading;
  // not the wait in the queue, nor the release message after.
  const auto start = transport::Clock::now();
  FinishedLoad finished;
  finished.request_id = job.request_id;
  finished.num_blocks = static_cast<int64_t>(job.pairs.size());
  auto fail_all = [&](const std::string& reason, const std::string& why) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << job.request_id << ": " << why;
    failures_.add(reason);
    finished.failed_block_indices.clear();
    for (size_t i = 0; i < job.pairs.size(); ++i) {
      finished.failed_block_indices.push_back(job.first_block + static_cast<int64_t>(i));
    }
  };
  const auto deadline = transport::Clock::now() + read_timeout_;
  auto peer = peerFor(job.slab_text, deadline);
  if (!peer.isOk()) {
    // A release-only job's lender is gone: its hold times out there.
    fail_all("unreachable", peer.status().message());
  } else {
    transport::ReadResult read;
    if (!job.pairs.empty()) read = (*peer)->readBlocks(local_slab_, job.pairs, deadline);
    if (!read.status.isOk()) {
      const std::string reason =
          read.status.code() == StatusCode::kDeadlineExceeded ? "timeout" : "read_error";
      fail_all(reason, read.status.message());
      finished.failed_block_indices.clear();
      for (BlockId failed : read.failed_local_blocks) {
        for (size_t i = 0; i < job.pairs.size(); ++i) {
          if (job.pairs[i].local_block == failed) {
            finished.failed_block_indices.push_back(job.first_block + static_cast<int64_t>(i));
          }
        }
      }
    }
    finished.seconds = std::chrono::duration<double>(transport::Clock::now() - start).count();
    // Whatever happened, the owner may free its blocks now.
    sendRelease(**peer, job.transfer_id);
  }
  if (finished.seconds == 0) {
    finished.seconds = std::chrono::duration<double>(transport::Clock::now() - start).count();
  }
  return finished;
}

std::vector<KvConnectorWorker::FinishedLoad> UcxConnector::poll() {
  std::lock_guard<std::mutex> lock(finished_mutex_);
  return std::exchange(finished_, {});
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

FinishDecision UcxConnector::requestFinished(const ConnectorRequest& request,
                                             std::span<const BlockId> blocks,
                                             int64_t num_computed_tokens) {
  declined_.erase(std::string(request.request_id));
  FinishDecision decision;
  const json* params = request.kv_transfer_params;
  if (!config_.produces() || params == nullptr || !params->is_object() ||
      !flag(*params, "do_remote_decode")) {
    return decision;
  }
  Descriptor d;
  d.transfer_id = std::string(request.request_id);
  d.engine_id = engine_id_;
  d.slab_text = serialized_slab_;
  d.compatibility = compatibility_;
  const int64_t full_blocks = std::min<int64_t>(num_computed_tokens / cache_.blockSize(),
                                                static_cast<int64_t>(blocks.size()));
  d.block_ids.assign(blocks.begin(), blocks.begin() + full_blocks);
  d.num_tokens = full_blocks * cache_.blockSize();
  decision.hold = true;
  decision.kv_transfer_params = {
      {"remote_engine_id", d.engine_id}, {"remote_slab", d.slab_text},
      {"remote_block_ids", d.block_ids}, {"remote_num_tokens", d.num_tokens},
      {"transfer_id", d.transfer_id},    {"compatibility", d.compatibility}};
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
