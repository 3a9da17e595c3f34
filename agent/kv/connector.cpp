#include "agent/kv/connector.h"

#include <algorithm>
#include <iterator>

#include "agent/kv/connector_registry.h"
#include "common/closest_match.h"
#include "common/json_parse.h"

namespace tandem::kv {
namespace {

constexpr double kMaxTimeoutSeconds = 86400;  // one day

// Parses one kv-transfer-config object. `field` prefixes the names in errors:
// empty at the top level, "kv_connector_extra_config.connectors[i]." for a
// member of a multi connector.
// The fields of vLLM's KVTransferConfig that no connector here reads: taken
// (a vLLM configuration starts as it is) and ignored.
constexpr const char* kIgnoredVllmFields[] = {
    "engine_id", "kv_buffer_device",         "kv_buffer_size",
    "kv_rank",   "kv_parallel_size",         "kv_ip",
    "kv_port",   "kv_connector_module_path", "enable_permute_local_kv"};

StatusOr<KvTransferConfig> parseObject(const nlohmann::json& root, const std::string& field) {
  KvTransferConfig config;
  // Any other field is refused: a misspelt kv_connector_extra_config, say,
  // was ignored, its secret and capacities with it.
  for (const auto& [key, value] : root.items()) {
    if (key == "kv_connector" || key == "kv_role" || key == "kv_connector_extra_config" ||
        std::find(std::begin(kIgnoredVllmFields), std::end(kIgnoredVllmFields), key) !=
            std::end(kIgnoredVllmFields)) {
      continue;
    }
    if (key == "kv_load_failure_policy") {
      return invalidArgument("kv-transfer-config: " + field +
                             "kv_load_failure_policy is read from kv_connector_extra_config "
                             "(put it there)");
    }
    return invalidArgument("kv-transfer-config: " + field + key +
                           " is not a field of a kv-transfer-config object (accepted: "
                           "kv_connector, kv_role, kv_connector_extra_config; vLLM's other "
                           "fields are taken and ignored)");
  }
  if (!root.contains("kv_connector") || !root["kv_connector"].is_string()) {
    return invalidArgument("kv-transfer-config: " + field +
                           "kv_connector must be a string (accepted: " + connectorNames() + ")");
  }
  config.connector = root["kv_connector"].get<std::string>();
  const ConnectorKind* kind = findConnectorKind(config.connector);
  if (kind == nullptr) {
    return invalidArgument("kv-transfer-config: " + field + "kv_connector \"" + config.connector +
                           "\" is not supported (accepted: " + connectorNames() + ")");
  }
  if (!field.empty() && !kind->multi_member) {
    return invalidArgument("kv-transfer-config: " + field + "kv_connector \"" + config.connector +
                           "\" cannot be a member of a multi connector (accepted: " +
                           connectorNames(/*members_only=*/true) + ")");
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
      return invalidArgument("kv-transfer-config: " + field +
                             "kv_role must be kv_producer, kv_consumer or kv_both, got " + text);
    }
  }
  if (root.contains("kv_connector_extra_config")) {
    if (!root["kv_connector_extra_config"].is_object()) {
      return invalidArgument("kv-transfer-config: " + field +
                             "kv_connector_extra_config must be an object");
    }
    config.extra = root["kv_connector_extra_config"];
  }
  // A key no connector of this kind reads is refused: a misspelt secret
  // (`secrett`) left the connector without one, a member's fault_injection
  // was never applied.
  {
    std::vector<std::string> accepted = {"secret"};
    if (field.empty()) {
      // A multi connector's members take these from it (their own are
      // refused before they are parsed).
      for (const char* key : {"kv_load_failure_policy", "abort_timeout_s", "fault_injection"}) {
        accepted.emplace_back(key);
      }
    }
    accepted.insert(accepted.end(), kind->extra_keys.begin(), kind->extra_keys.end());
    for (const auto& [key, value] : config.extra.items()) {
      if (std::find(accepted.begin(), accepted.end(), key) != accepted.end()) continue;
      std::string message = "kv-transfer-config: " + field + "kv_connector_extra_config." + key +
                            " is not read by the " + config.connector + " connector";
      if (std::string near = closestMatch(key, accepted); !near.empty()) {
        message += " (did you mean " + near + "?)";
      }
      message += "; accepted keys: ";
      for (size_t i = 0; i < accepted.size(); ++i) message += (i > 0 ? ", " : "") + accepted[i];
      return invalidArgument(message);
    }
  }
  // Named, never shown: the value is a credential.
  if (auto secret = config.extra.find("secret");
      secret != config.extra.end() &&
      (!secret->is_string() || secret->get<std::string>().empty() ||
       secret->get<std::string>().find('\0') != std::string::npos)) {
    // A NUL ends an environment variable's value, where the secret travels
    // too (TANDEM_KV_SECRET, local mode's and Kubernetes' agents).
    return invalidArgument("kv-transfer-config: " + field +
                           "kv_connector_extra_config.secret must be a non-empty string without "
                           "NUL characters");
  }
  if (config.extra.contains("kv_load_failure_policy")) {
    const auto& policy = config.extra["kv_load_failure_policy"];
    if (policy == "recompute") {
      config.load_failure_policy = LoadFailurePolicy::kRecompute;
    } else if (policy == "fail") {
      config.load_failure_policy = LoadFailurePolicy::kFail;
    } else {
      return invalidArgument("kv-transfer-config: " + field +
                             "kv_load_failure_policy must be recompute or fail, got " +
                             policy.dump());
    }
  }
  // Seconds are bounded: a duration past a day is a mistake, and one past
  // the clock's range would overflow it.
  for (const char* key : {"abort_timeout_s", "read_timeout_s"}) {
    if (!config.extra.contains(key)) continue;
    const auto& timeout = config.extra[key];
    if (!timeout.is_number() || !(timeout.get<double>() > 0) ||
        timeout.get<double>() > kMaxTimeoutSeconds) {
      return invalidArgument("kv-transfer-config: " + field + "kv_connector_extra_config." + key +
                             " must be a number of seconds above 0 and at most " +
                             std::to_string(static_cast<int>(kMaxTimeoutSeconds)) + ", got " +
                             timeout.dump());
    }
  }
  if (config.extra.contains("abort_timeout_s")) {
    config.abort_timeout_s = config.extra["abort_timeout_s"].get<double>();
  }
  if (config.connector == "multi") {
    const std::string connectors = field + "kv_connector_extra_config.connectors";
    auto list = config.extra.find("connectors");
    if (list == config.extra.end() || !list->is_array() || list->empty()) {
      return invalidArgument("kv-transfer-config: " + connectors +
                             " must be a non-empty array of kv-transfer-config objects");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string member_field = connectors + "[" + std::to_string(i) + "].";
      const nlohmann::json& object = (*list)[i];
      if (!object.is_object()) {
        return invalidArgument("kv-transfer-config: " + connectors + "[" + std::to_string(i) +
                               "] must be a kv-transfer-config object, got " + object.dump());
      }
      // One policy, one hold timeout and one fault injection for the whole
      // multi connector.
      for (const char* key : {"kv_load_failure_policy", "abort_timeout_s", "fault_injection"}) {
        if (object.contains("kv_connector_extra_config") &&
            object["kv_connector_extra_config"].is_object() &&
            object["kv_connector_extra_config"].contains(key)) {
          return invalidArgument("kv-transfer-config: " + member_field +
                                 "kv_connector_extra_config." + key +
                                 " is not accepted for a member; set it in the multi "
                                 "connector's kv_connector_extra_config");
        }
      }
      StatusOr<KvTransferConfig> member = parseObject(object, member_field);
      if (!member.isOk()) return member.status();
      member->load_failure_policy = config.load_failure_policy;
      member->abort_timeout_s = config.abort_timeout_s;
      config.members.push_back(std::move(*member));
    }
    // One KV secret for the agent, the multi connector's or a member's,
    // given to every member: one left without it would serve its peers
    // unauthenticated while the agent's control routes ask for signatures.
    const nlohmann::json* secret = nullptr;
    std::string secret_field;
    auto take = [&](const nlohmann::json& extra, const std::string& at) -> Status {
      auto it = extra.find("secret");
      if (it == extra.end()) return Status::ok();
      if (secret != nullptr && *secret != *it) {
        return invalidArgument("kv-transfer-config: " + at + "kv_connector_extra_config.secret " +
                               "differs from " + secret_field +
                               ": a multi connector has one KV secret (set it once, in the multi "
                               "connector's kv_connector_extra_config)");
      }
      if (secret == nullptr) {
        secret = &*it;
        secret_field = at + "kv_connector_extra_config.secret";
      }
      return Status::ok();
    };
    if (Status status = take(config.extra, field); !status.isOk()) return status;
    for (size_t i = 0; i < config.members.size(); ++i) {
      Status status = take(config.members[i].extra, connectors + "[" + std::to_string(i) + "].");
      if (!status.isOk()) return status;
    }
    if (secret != nullptr) {
      const nlohmann::json shared = *secret;
      config.extra["secret"] = shared;
      for (KvTransferConfig& member : config.members) member.extra["secret"] = shared;
    }
  }
  return config;
}

}  // namespace

StatusOr<KvTransferConfig> KvTransferConfig::parse(const std::string& json_text) {
  StatusOr<nlohmann::json> root = parseJsonObject(json_text, "kv-transfer-config");
  if (!root.isOk()) return root.status();
  return parseObject(*root, "");
}

int64_t extraCapacityBlocks(const nlohmann::json& extra, const std::string& connector,
                            size_t item_bytes, bool required) {
  const std::string accepted =
      std::string(required ? "exactly" : "at most") +
      " one of capacity_blocks (a positive number of blocks) or capacity_bytes (a positive "
      "number of bytes)";
  const bool has_blocks = extra.contains("capacity_blocks");
  const bool has_bytes = extra.contains("capacity_bytes");
  if ((has_blocks && has_bytes) || (required && !has_blocks && !has_bytes)) {
    throw Error(connector + ": kv_connector_extra_config needs " + accepted +
                (has_blocks ? ", got both" : ", got neither"));
  }
  if (!has_blocks && !has_bytes) return 0;
  const char* field = has_blocks ? "capacity_blocks" : "capacity_bytes";
  const nlohmann::json& value = extra.at(field);
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
    throw Error(connector + ": kv_connector_extra_config." + field +
                " must be a positive integer, got " + value.dump());
  }
  if (has_blocks) return value.get<int64_t>();
  const int64_t blocks = value.get<int64_t>() / static_cast<int64_t>(item_bytes);
  if (blocks == 0) {
    throw Error(connector + ": kv_connector_extra_config.capacity_bytes " +
                std::to_string(value.get<int64_t>()) + " holds no KV block of " +
                std::to_string(item_bytes) + " bytes");
  }
  return blocks;
}

}  // namespace tandem::kv
