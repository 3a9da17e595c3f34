#include "agent/kv/ucx/ucx_connector.h"

#include <random>

#include "common/logging.h"

namespace tandem::kv {
namespace {

constexpr int kProtocolVersion = 1;
constexpr std::string_view kReleasePrefix = "release ";
constexpr auto kReadTimeout = std::chrono::seconds(10);

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

}  // namespace

UcxConnector::UcxConnector(const KvTransferConfig& config, engine::KvCache& cache,
                           const std::string& model_identity)
    : config_(config), cache_(cache) {
  const auto* allocator = dynamic_cast<const transport::UcxSlabAllocator*>(&cache.allocator());
  if (allocator == nullptr) {
    throw Error("ucx connector: the KV cache must be allocated by UCX (got the " +
                cache.allocator().name() + " allocator)");
  }
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
  context_->setMessageHandler([this](const std::string& message) {
    if (!message.starts_with(kReleasePrefix)) return;
    std::lock_guard<std::mutex> lock(released_mutex_);
    released_.emplace_back(std::string_view(message).substr(kReleasePrefix.size()));
  });
}

UcxConnector::~UcxConnector() { context_->setMessageHandler(nullptr); }

LookupResult UcxConnector::lookup(const ConnectorRequest& request, int64_t num_local_tokens) {
  LookupResult result;
  const nlohmann::json* params = request.kv_transfer_params;
  if (!config_.consumes() || params == nullptr || !params->is_object() ||
      !params->value("do_remote_prefill", false)) {
    return result;
  }
  if (params->value("compatibility", std::string()) != compatibility_) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << request.request_id
                      << ": the prefill agent's KV is incompatible ("
                      << firstDifference(compatibility_, params->value("compatibility", ""))
                      << "); recomputing";
    return result;
  }
  const auto& ids = params->value("remote_block_ids", nlohmann::json::array());
  const int64_t block_size = cache_.blockSize();
  const int64_t remote_tokens = params->value("remote_num_tokens", int64_t{0});
  // Full remote blocks, never the last token (its logits are needed here).
  const int64_t last = static_cast<int64_t>(request.tokens.size()) - 1;
  const int64_t blocks = std::min<int64_t>(
      {static_cast<int64_t>(ids.size()), remote_tokens / block_size, last / block_size});
  if (blocks * block_size > num_local_tokens) {
    result.state = LookupResult::State::kAvailable;
    result.num_tokens = blocks * block_size - num_local_tokens;
  }
  return result;
}

StatusOr<std::shared_ptr<transport::UcxPeer>> UcxConnector::peerFor(
    const std::string& serialized_slab) {
  auto it = peers_.find(serialized_slab);
  if (it != peers_.end() && it->second->health().isOk()) return it->second;
  auto remote = transport::RemoteSlab::parse(serialized_slab);
  if (!remote.isOk()) return remote.status();
  if (remote->block_bytes != cache_.blockBytes()) {
    return invalidArgument("remote block size " + std::to_string(remote->block_bytes) +
                           " differs from ours " + std::to_string(cache_.blockBytes()));
  }
  auto peer = context_->connect(*remote, transport::Clock::now() + kReadTimeout);
  if (!peer.isOk()) return peer.status();
  peers_[serialized_slab] = *peer;
  return *peer;
}

LoadResult UcxConnector::load(const ConnectorRequest& request, int64_t first_block,
                              std::span<const BlockId> block_ids) {
  LoadResult result;
  auto fail_all = [&](const std::string& why) {
    TANDEM_LOG(kWarn) << "ucx connector: request " << request.request_id << ": " << why;
    for (size_t i = 0; i < block_ids.size(); ++i) {
      result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
    }
    return result;
  };
  const nlohmann::json& params = *request.kv_transfer_params;
  const auto& ids = params["remote_block_ids"];
  std::vector<transport::BlockPair> pairs;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const size_t index = static_cast<size_t>(first_block) + i;
    if (index >= ids.size() || !ids[index].is_number_integer()) {
      return fail_all("remote_block_ids is too short or not integers");
    }
    pairs.push_back({ids[index].get<BlockId>(), block_ids[i]});
  }
  auto peer = peerFor(params.value("remote_slab", std::string()));
  if (!peer.isOk()) return fail_all(peer.status().message());
  transport::ReadResult read =
      (*peer)->readBlocks(local_slab_, pairs, transport::Clock::now() + kReadTimeout);
  if (!read.status.isOk() && read.failed_local_blocks.empty()) {
    return fail_all(read.status.message());
  }
  for (BlockId failed : read.failed_local_blocks) {
    for (size_t i = 0; i < block_ids.size(); ++i) {
      if (block_ids[i] == failed) {
        result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
      }
    }
  }
  // Whatever happened, the producer may free its blocks now.
  Status notified =
      (*peer)->notify(std::string(kReleasePrefix) + params.value("transfer_id", std::string()),
                      transport::Clock::now() + kReadTimeout);
  if (!notified.isOk()) {
    TANDEM_LOG(kWarn) << "ucx connector: release message not sent: " << notified.message();
  }
  return result;
}

FinishDecision UcxConnector::requestFinished(const ConnectorRequest& request,
                                             std::span<const BlockId> blocks,
                                             int64_t num_computed_tokens) {
  FinishDecision decision;
  const nlohmann::json* params = request.kv_transfer_params;
  if (!config_.produces() || params == nullptr || !params->is_object() ||
      !params->value("do_remote_decode", false)) {
    return decision;
  }
  const int64_t full_blocks = num_computed_tokens / cache_.blockSize();
  nlohmann::json ids = nlohmann::json::array();
  for (int64_t i = 0; i < full_blocks && i < static_cast<int64_t>(blocks.size()); ++i) {
    ids.push_back(blocks[i]);
  }
  decision.hold = true;
  decision.kv_transfer_params = {{"remote_engine_id", engine_id_},
                                 {"remote_slab", serialized_slab_},
                                 {"remote_block_ids", std::move(ids)},
                                 {"remote_num_tokens", full_blocks * cache_.blockSize()},
                                 {"transfer_id", std::string(request.request_id)},
                                 {"compatibility", compatibility_}};
  return decision;
}

std::vector<std::string> UcxConnector::pollReleased() {
  std::lock_guard<std::mutex> lock(released_mutex_);
  return std::exchange(released_, {});
}

}  // namespace tandem::kv
