#include "agent/kv/multi/multi_connector.h"

#include <algorithm>

#include "agent/kv/connector_registry.h"
#include "common/check.h"
#include "common/logging.h"

namespace tandem::kv {
namespace {

// The engine loads in the same step as it looks up; a winner is left behind
// only when the request found no room for its blocks and was then aborted.
// Past this many, all remembered winners are stale and are forgotten.

}  // namespace

MultiConnector::MultiConnector(const KvTransferConfig& config, int32_t block_size,
                               std::vector<std::unique_ptr<KvConnector>> members)
    : config_(config), block_size_(block_size), members_(std::move(members)) {
  TANDEM_CHECK(!members_.empty(), "a multi connector needs members");
  TANDEM_CHECK(block_size_ > 0, "a multi connector needs the KV block size");
}

std::unique_ptr<MultiConnector> MultiConnector::create(const KvTransferConfig& config,
                                                       engine::KvCache& cache,
                                                       const std::string& model_identity) {
  if (config.members.empty()) {
    throw Error(
        "multi connector: kv_connector_extra_config.connectors must list at least one "
        "connector");
  }
  std::vector<std::unique_ptr<KvConnector>> members;
  for (size_t i = 0; i < config.members.size(); ++i) {
    const KvTransferConfig& member = config.members[i];
    if (member.connector == "multi") {
      throw Error("multi connector: kv_connector_extra_config.connectors[" + std::to_string(i) +
                  "] is a multi connector; multi connectors cannot be nested");
    }
    try {
      members.push_back(makeConnector(member, cache, model_identity));
    } catch (const Error& error) {
      throw Error("multi connector: kv_connector_extra_config.connectors[" + std::to_string(i) +
                  "]: " + error.what());
    }
  }
  return std::make_unique<MultiConnector>(config, cache.blockSize(), std::move(members));
}

std::map<std::string, int64_t> MultiConnector::failureCounts() const {
  std::map<std::string, int64_t> counts = failures_.snapshot();
  for (const auto& member : members_) {
    for (const auto& [reason, count] : member->failureCounts()) counts[reason] += count;
  }
  return counts;
}

Status MultiConnector::validate(const nlohmann::json& kv_transfer_params) const {
  for (const auto& member : members_) {
    Status status = member->scheduler().validate(kv_transfer_params);
    if (!status.isOk()) return status;
  }
  return Status::ok();
}

StatusOr<std::string> MultiConnector::releaseTarget(
    const nlohmann::json& kv_transfer_params) const {
  for (const auto& member : members_) {
    StatusOr<std::string> target = member->scheduler().releaseTarget(kv_transfer_params);
    if (target.isOk() || target.status().code() != StatusCode::kUnimplemented) return target;
  }
  return Status(StatusCode::kUnimplemented, "no member of this multi connector holds blocks");
}

Status MultiConnector::advertiseAddress(const std::string& listen_host, int port) {
  for (const auto& member : members_) {
    Status status = member->advertiseAddress(listen_host, port);
    if (!status.isOk()) return status;
  }
  return Status::ok();
}

StatusOr<nlohmann::json> MultiConnector::handshake(const nlohmann::json& request) const {
  for (const auto& member : members_) {
    StatusOr<nlohmann::json> answer = member->handshake(request);
    if (answer.isOk() || answer.status().code() != StatusCode::kNotFound) return answer;
  }
  return notFound("no member of this multi connector serves a KV handshake");
}

Status MultiConnector::authorizeRequest(std::string_view path, const nlohmann::json& body) const {
  // Every member with a secret must accept it.
  for (const auto& member : members_) {
    Status status = member->authorizeRequest(path, body);
    if (!status.isOk()) return status;
  }
  return Status::ok();
}

bool MultiConnector::verifiesRequests() const {
  return std::any_of(members_.begin(), members_.end(),
                     [](const auto& member) { return member->verifiesRequests(); });
}

nlohmann::json MultiConnector::info() const {
  for (const auto& member : members_) {
    nlohmann::json answer = member->info();
    if (!answer.is_null()) return answer;
  }
  return nullptr;
}

LookupResult MultiConnector::lookup(const ConnectorRequest& request, int64_t num_local_tokens) {
  const std::string id(request.request_id);
  winners_.erase(id);
  if (!config_.consumes()) return {};
  LookupResult best;
  size_t winner = 0;
  bool pending = false;
  for (size_t i = 0; i < members_.size(); ++i) {
    LookupResult answer = members_[i]->scheduler().lookup(request, num_local_tokens);
    if (answer.state == LookupResult::State::kPending) {
      pending = true;
    } else if (answer.state == LookupResult::State::kAvailable &&
               answer.num_tokens > best.num_tokens) {
      best = answer;
      winner = i;
    }
  }
  if (pending) {
    // A pending member may offer more, unless the best answer already
    // reaches the last whole block before the request's last token.
    const int64_t loadable_blocks = (static_cast<int64_t>(request.tokens.size()) - 1) / block_size_;
    if (num_local_tokens + best.num_tokens < loadable_blocks * block_size_) {
      return LookupResult{LookupResult::State::kPending, 0};
    }
  }
  if (best.state != LookupResult::State::kAvailable) return {};
  winners_[id] = winner;
  return best;
}

FinishDecision MultiConnector::requestFinished(const ConnectorRequest& request,
                                               std::span<const BlockId> blocks,
                                               int64_t num_computed_tokens) {
  winners_.erase(std::string(request.request_id));
  for (const auto& member : members_) {
    FinishDecision decision =
        member->scheduler().requestFinished(request, blocks, num_computed_tokens);
    if (decision.hold || !decision.kv_transfer_params.is_null()) return decision;
  }
  return {};
}

void MultiConnector::requestAbandoned(std::string_view request_id) {
  winners_.erase(std::string(request_id));
  for (const auto& member : members_) member->scheduler().requestAbandoned(request_id);
}

void MultiConnector::lookupNotTaken(std::string_view request_id) {
  winners_.erase(std::string(request_id));
  for (const auto& member : members_) member->scheduler().lookupNotTaken(request_id);
}

void MultiConnector::holdEnded(std::string_view request_id) {
  for (const auto& member : members_) member->scheduler().holdEnded(request_id);
}

LoadResult MultiConnector::load(const ConnectorRequest& request, int64_t first_block,
                                std::span<const BlockId> block_ids) {
  auto it = winners_.find(std::string(request.request_id));
  if (it == winners_.end()) {
    // Only a load without a lookup gets here; its blocks are recomputed.
    TANDEM_LOG(kWarn) << "multi connector: request " << request.request_id
                      << " loads without a lookup; recomputing its blocks";
    LoadResult result;
    for (size_t i = 0; i < block_ids.size(); ++i) {
      result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
    }
    failures_.add("missing", static_cast<int64_t>(block_ids.size()));
    return result;
  }
  const size_t winner = it->second;
  KvConnector& member = *members_[winner];
  winners_.erase(it);
  for (size_t i = 0; i < members_.size(); ++i) {
    if (i != winner) members_[i]->scheduler().lookupNotTaken(request.request_id);
  }
  LoadResult result = member.worker().load(request, first_block, block_ids);
  if (result.source.empty()) result.source = member.config().connector;
  return result;
}

void MultiConnector::save(const ConnectorRequest& request, int64_t first_block,
                          std::span<const BlockId> block_ids) {
  if (!config_.produces()) return;
  for (const auto& member : members_) member->worker().save(request, first_block, block_ids);
}

std::vector<KvConnectorWorker::FinishedLoad> MultiConnector::poll() {
  std::vector<FinishedLoad> finished;
  for (const auto& member : members_) {
    for (auto& load : member->worker().poll()) {
      if (load.source.empty()) load.source = member->config().connector;
      finished.push_back(std::move(load));
    }
  }
  return finished;
}

std::vector<std::string> MultiConnector::pollReleased() {
  std::vector<std::string> released;
  for (const auto& member : members_) {
    for (auto& id : member->worker().pollReleased()) released.push_back(std::move(id));
  }
  return released;
}

}  // namespace tandem::kv
