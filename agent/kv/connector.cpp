#include "agent/kv/connector.h"

#include "agent/kv/storage/storage_connector.h"
#include "agent/kv/ucx/ucx_connector.h"

namespace tandem::kv {

StatusOr<KvTransferConfig> KvTransferConfig::parse(const std::string& json_text) {
  auto root = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return invalidArgument("kv-transfer-config must be a JSON object, got: " + json_text);
  }
  KvTransferConfig config;
  if (!root.contains("kv_connector") || !root["kv_connector"].is_string()) {
    return invalidArgument("kv-transfer-config: kv_connector must be a string (accepted: storage)");
  }
  config.connector = root["kv_connector"].get<std::string>();
  if (config.connector != "storage" && config.connector != "ucx") {
    return invalidArgument("kv-transfer-config: kv_connector \"" + config.connector +
                           "\" is not supported (accepted: storage, ucx)");
  }
  if (root.contains("kv_role")) {
    const auto& role = root["kv_role"];
    const std::string text = role.is_string() ? role.get<std::string>() : role.dump();
    if (text == "kv_producer") {
      config.role = KvRole::kProducer;
    } else if (text == "kv_consumer") {
      config.role = KvRole::kConsumer;
    } else if (text == "kv_both") {
      config.role = KvRole::kBoth;
    } else {
      return invalidArgument(
          "kv-transfer-config: kv_role must be kv_producer, kv_consumer or "
          "kv_both, got " +
          text);
    }
  }
  if (root.contains("kv_connector_extra_config")) {
    if (!root["kv_connector_extra_config"].is_object()) {
      return invalidArgument("kv-transfer-config: kv_connector_extra_config must be an object");
    }
    config.extra = root["kv_connector_extra_config"];
  }
  if (config.extra.contains("kv_load_failure_policy")) {
    const auto& policy = config.extra["kv_load_failure_policy"];
    if (policy == "recompute") {
      config.load_failure_policy = LoadFailurePolicy::kRecompute;
    } else if (policy == "fail") {
      config.load_failure_policy = LoadFailurePolicy::kFail;
    } else {
      return invalidArgument(
          "kv-transfer-config: kv_load_failure_policy must be recompute or fail, got " +
          policy.dump());
    }
  }
  if (config.extra.contains("abort_timeout_s")) {
    const auto& timeout = config.extra["abort_timeout_s"];
    if (!timeout.is_number() || timeout.get<double>() <= 0) {
      return invalidArgument(
          "kv-transfer-config: abort_timeout_s must be a positive number of "
          "seconds, got " +
          timeout.dump());
    }
    config.abort_timeout_s = timeout.get<double>();
  }
  return config;
}

std::unique_ptr<KvConnector> makeConnector(const KvTransferConfig& config, engine::KvCache& cache,
                                           const std::string& model_identity) {
  if (config.connector == "storage") return std::make_unique<StorageConnector>(config, cache);
  if (config.connector == "ucx") {
    return std::make_unique<UcxConnector>(config, cache, model_identity);
  }
  throw Error("kv_connector \"" + config.connector +
              "\" is not supported (accepted: storage, ucx)");
}

}  // namespace tandem::kv
