#include "agent/kv/fault_injection.h"

#include <algorithm>
#include <unordered_map>

#include "common/logging.h"

namespace tandem::kv {

bool FaultInjection::drops(int64_t index, int64_t num_blocks) const {
  if (index < 0 || index >= num_blocks) return false;
  switch (drop) {
    case Drop::kNone:
      return false;
    case Drop::kAll:
      return true;
    case Drop::kEveryNth:
      return every_nth > 0 && index % every_nth == every_nth - 1;
    case Drop::kGrowingGaps: {
      if (index == num_blocks - 1) return false;
      // Segments valid 1, gap 1, valid 2, gap 2, ...
      int64_t start = 0;
      for (int64_t length = 1;; ++length) {
        start += length;  // the valid segment
        if (index < start) return false;
        start += length;  // the gap
        if (index < start) return true;
      }
    }
  }
  return false;
}

StatusOr<FaultInjection> FaultInjection::parse(const nlohmann::json& extra) {
  FaultInjection faults;
  if (!extra.is_object() || !extra.contains("fault_injection")) return faults;
  const nlohmann::json& config = extra["fault_injection"];
  const std::string prefix = "kv_connector_extra_config.fault_injection";
  if (!config.is_object()) return invalidArgument(prefix + " must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "drop_blocks") {
      const std::string pattern = value.is_string() ? value.get<std::string>() : value.dump();
      if (pattern == "growing_gaps") {
        faults.drop = Drop::kGrowingGaps;
      } else if (pattern == "all") {
        faults.drop = Drop::kAll;
      } else if (pattern.starts_with("every_nth:")) {
        faults.drop = Drop::kEveryNth;
        try {
          size_t used = 0;
          faults.every_nth = std::stoll(pattern.substr(10), &used);
          if (used != pattern.size() - 10) faults.every_nth = 0;
        } catch (const std::exception&) {
          faults.every_nth = 0;
        }
        if (faults.every_nth <= 0) {
          return invalidArgument(prefix + ".drop_blocks every_nth:N needs a positive N, got " +
                                 pattern);
        }
      } else {
        return invalidArgument(
            prefix + ".drop_blocks must be growing_gaps, every_nth:N or all, got " + pattern);
      }
    } else if (key == "fail_handshake" || key == "drop_notifications") {
      if (!value.is_boolean())
        return invalidArgument(prefix + "." + key + " must be true or false");
      (key == "fail_handshake" ? faults.fail_handshake : faults.drop_notifications) =
          value.get<bool>();
    } else if (key == "delay_notifications_ms") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return invalidArgument(prefix + ".delay_notifications_ms must be a non-negative integer");
      }
      faults.delay_notifications_ms = value.get<int64_t>();
    } else if (key == "fail_staging_copies") {
      const std::string which = value.is_string() ? value.get<std::string>() : value.dump();
      if (which != "out" && which != "in" && which != "both") {
        return invalidArgument(prefix + ".fail_staging_copies must be out, in or both, got " +
                               which);
      }
      faults.fail_copies_out = which != "in";
      faults.fail_copies_in = which != "out";
    } else if (key == "throw_on_lookup") {
      if (!value.is_string()) {
        return invalidArgument(prefix + ".throw_on_lookup must be a string (part of request ids)");
      }
      faults.throw_on_lookup = value.get<std::string>();
    } else {
      return invalidArgument(prefix + "." + key +
                             " is not a known fault (accepted: drop_blocks, fail_handshake, "
                             "drop_notifications, delay_notifications_ms, fail_staging_copies, "
                             "throw_on_lookup)");
    }
  }
  return faults;
}

namespace {

class FaultInjectingConnector : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  FaultInjectingConnector(std::unique_ptr<KvConnector> inner, FaultInjection faults,
                          int64_t block_size)
      : inner_(std::move(inner)), faults_(faults), block_size_(block_size) {}

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return inner_->config(); }
  nlohmann::json info() const override { return inner_->info(); }
  std::map<std::string, int64_t> failureCounts() const override {
    auto counts = inner_->failureCounts();
    for (const auto& [reason, count] : failures_.snapshot()) counts[reason] += count;
    return counts;
  }

  Status validate(const nlohmann::json& params) const override {
    return inner_->scheduler().validate(params);
  }
  StatusOr<std::string> releaseTarget(const nlohmann::json& params) const override {
    return inner_->scheduler().releaseTarget(params);
  }
  Status advertiseAddress(const std::string& listen_host, int port) override {
    return inner_->advertiseAddress(listen_host, port);
  }
  StatusOr<nlohmann::json> handshake(const nlohmann::json& request) const override {
    return inner_->handshake(request);
  }
  Status authorizeRequest(std::string_view path, const nlohmann::json& body) const override {
    return inner_->authorizeRequest(path, body);
  }
  bool verifiesRequests() const override { return inner_->verifiesRequests(); }
  LookupResult lookup(const ConnectorRequest& request, int64_t num_local_tokens) override {
    if (faults_.throw_on_lookup &&
        request.request_id.find(*faults_.throw_on_lookup) != std::string_view::npos) {
      throw Error("injected fault: the KV connector's lookup of request " +
                  std::string(request.request_id) + " threw");
    }
    LookupResult result = inner_->scheduler().lookup(request, num_local_tokens);
    if (result.state == LookupResult::State::kAvailable) {
      // Drop patterns are laid over the blocks this request may load.
      loadable_blocks_[std::string(request.request_id)] =
          (num_local_tokens + result.num_tokens) / block_size_;
    }
    return result;
  }
  FinishDecision requestFinished(const ConnectorRequest& request, std::span<const BlockId> blocks,
                                 int64_t num_computed_tokens) override {
    loadable_blocks_.erase(std::string(request.request_id));
    return inner_->scheduler().requestFinished(request, blocks, num_computed_tokens);
  }
  void requestAbandoned(std::string_view request_id) override {
    loadable_blocks_.erase(std::string(request_id));
    inner_->scheduler().requestAbandoned(request_id);
  }
  void lookupNotTaken(std::string_view request_id) override {
    loadable_blocks_.erase(std::string(request_id));
    inner_->scheduler().lookupNotTaken(request_id);
  }
  void holdEnded(std::string_view request_id) override {
    inner_->scheduler().holdEnded(request_id);
  }

  LoadResult load(const ConnectorRequest& request, int64_t first_block,
                  std::span<const BlockId> block_ids) override {
    const std::string id(request.request_id);
    if (faults_.fail_handshake) {
      LoadResult result;
      for (size_t i = 0; i < block_ids.size(); ++i) {
        result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
      }
      failures_.add("injected_handshake");
      TANDEM_LOG(kWarn) << "fault injection: handshake for request " << id << " failed";
      loadable_blocks_.erase(id);
      return result;
    }
    LoadResult result = inner_->worker().load(request, first_block, block_ids);
    const auto found = loadable_blocks_.find(id);
    const int64_t loadable = found != loadable_blocks_.end()
                                 ? found->second
                                 : first_block + static_cast<int64_t>(block_ids.size());
    if (found != loadable_blocks_.end()) loadable_blocks_.erase(found);
    std::vector<int64_t> dropped;
    for (size_t i = 0; i < block_ids.size(); ++i) {
      const int64_t index = first_block + static_cast<int64_t>(i);
      if (faults_.drops(index, loadable)) dropped.push_back(index);
    }
    if (result.done) {
      addDropped(result.failed_block_indices, dropped);
    } else if (!dropped.empty()) {
      pending_drops_[id] = std::move(dropped);  // applied when the load finishes
    }
    return result;
  }
  std::vector<FinishedLoad> poll() override {
    std::vector<FinishedLoad> finished = inner_->worker().poll();
    for (FinishedLoad& load : finished) {
      auto it = pending_drops_.find(load.request_id);
      if (it == pending_drops_.end()) continue;
      addDropped(load.failed_block_indices, it->second);
      pending_drops_.erase(it);
    }
    return finished;
  }
  void save(const ConnectorRequest& request, int64_t first_block,
            std::span<const BlockId> block_ids) override {
    inner_->worker().save(request, first_block, block_ids);
  }
  std::vector<std::string> pollReleased() override { return inner_->worker().pollReleased(); }

 private:
  // Adds the dropped block indices to `failed` (kept sorted, no duplicates).
  void addDropped(std::vector<int64_t>& failed, const std::vector<int64_t>& dropped) {
    for (int64_t index : dropped) {
      if (std::find(failed.begin(), failed.end(), index) != failed.end()) continue;
      failed.push_back(index);
      failures_.add("injected");
    }
    std::sort(failed.begin(), failed.end());
  }

  std::unique_ptr<KvConnector> inner_;
  FaultInjection faults_;
  int64_t block_size_;
  // Engine thread only.
  std::unordered_map<std::string, int64_t> loadable_blocks_;
  std::unordered_map<std::string, std::vector<int64_t>> pending_drops_;
};

}  // namespace

FaultInjection checkFaultInjection(const nlohmann::json& extra, bool enabled) {
  auto faults = FaultInjection::parse(extra);
  if (!faults.isOk()) throw Error(faults.status().message());
  if (faults->any() && !enabled) {
    throw Error(
        "kv_connector_extra_config.fault_injection is for tests and is refused unless the "
        "agent is started with --enable-fault-injection");
  }
  return *faults;
}

std::unique_ptr<KvConnector> withFaultInjection(std::unique_ptr<KvConnector> inner, bool enabled,
                                                int64_t block_size) {
  const FaultInjection faults = checkFaultInjection(inner->config().extra, enabled);
  if (!faults.any()) return inner;
  TANDEM_LOG(kWarn) << "KV fault injection is on: " << inner->config().extra["fault_injection"];
  return std::make_unique<FaultInjectingConnector>(std::move(inner), faults, block_size);
}

}  // namespace tandem::kv
