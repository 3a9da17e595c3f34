#include "operator/local/cluster_spec.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "common/status.h"

namespace tandem::local {
namespace {

using nlohmann::json;

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

// Where a document sits in the file, for messages.
struct DocumentContext {
  std::string source;
  int index = 0;
  std::string kind;
  std::string name;
  // False for objects from the API: their line numbers mean nothing to a user.
  bool show_lines = true;

  // "document 2 (DecodePool \"decode\")"
  std::string label() const {
    std::string text = "document " + std::to_string(index);
    if (!kind.empty()) {
      text += " (" + kind;
      if (!name.empty()) text += " \"" + name + "\"";
      text += ")";
    }
    return text;
  }
  // An object from the API (index 0) is named by `source` alone.
  std::string where() const { return index == 0 ? source : source + ": " + label(); }
};

// Set while poolSpecFieldPaths() parses its sample: every field path read.
thread_local std::vector<std::string>* field_collector = nullptr;

std::string lineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return " (line " + std::to_string(mark.line + 1) + ")";
}

[[noreturn]] void fail(const DocumentContext& context, const std::string& path,
                       const std::string& problem, const YAML::Node& node) {
  throw Error(context.where() + ": " + path + " " + problem +
              (context.show_lines ? lineOf(node) : ""));
}

// How a value was written, for "got ..." in messages.
std::string described(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? "the string \"" + node.Scalar() + "\""
                               : "\"" + node.Scalar() + "\"";
    default:
      return "nothing";
  }
}

// A plain (unquoted) scalar, as YAML's core schema reads it.
bool isPlain(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string joined(const std::vector<std::string>& items, const std::string& last_separator) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) text += i + 1 == items.size() ? last_separator : ", ";
    text += items[i];
  }
  return text;
}

// Reads one mapping: fields are taken by name, and whatever was not taken is
// refused as unknown (a typo must not be silently ignored).
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, const DocumentContext& context)
      : node_(node), path_(std::move(path)), context_(context) {}

  std::string pathOf(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  // The value of `key`, unless absent or null.
  std::optional<YAML::Node> get(const std::string& key) {
    known_.push_back(key);
    if (field_collector != nullptr) field_collector->push_back(pathOf(key));
    const YAML::Node& node = node_;
    const YAML::Node value = node[key];
    if (!value || value.IsNull()) return std::nullopt;
    return value;
  }
  YAML::Node require(const std::string& key) {
    auto value = get(key);
    if (!value) fail(context_, pathOf(key), "is required", node_);
    return *value;
  }
  void rejectUnknown() const {
    for (const auto& entry : node_) {
      if (!entry.first.IsScalar()) {
        fail(context_, path_.empty() ? context_.kind : path_,
             "has a key that is not a plain name (got " + described(entry.first) + ")",
             entry.first);
      }
      const std::string key = entry.first.as<std::string>();
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      fail(context_, pathOf(key),
           "is not a field of " + (path_.empty() ? context_.kind : path_) +
               " (accepted: " + joined(known_, " and ") + ")",
           entry.first);
    }
  }

 private:
  YAML::Node node_;
  std::string path_;
  const DocumentContext& context_;
  std::vector<std::string> known_;
};

void requireMapping(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context) {
  if (!node.IsMap()) fail(context, path, "must be a mapping, got " + described(node), node);
}

void requireList(const YAML::Node& node, const std::string& path, const DocumentContext& context) {
  if (!node.IsSequence()) fail(context, path, "must be a list, got " + described(node), node);
}

std::string rangeText(int64_t min, int64_t max) {
  if (max == kNoMax) {
    if (min == 0) return "a non-negative integer";
    if (min == 1) return "a positive integer";
    return "an integer of at least " + std::to_string(min);
  }
  return "an integer between " + std::to_string(min) + " and " + std::to_string(max);
}

int64_t readInteger(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                    int64_t min, int64_t max = kNoMax) {
  int64_t value = 0;
  bool ok = isPlain(node) && YAML::convert<int64_t>::decode(node, value);
  if (!ok || value < min || value > max) {
    fail(context, path, "must be " + rangeText(min, max) + ", got " + described(node), node);
  }
  return value;
}

// A number; `min_exclusive` makes the lower bound strict.
double readNumber(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                  double min, bool min_exclusive) {
  double value = 0;
  bool ok = isPlain(node) && YAML::convert<double>::decode(node, value) && std::isfinite(value);
  if (!ok || value < min || (min_exclusive && value == min)) {
    std::ostringstream bound;
    bound << min;
    fail(context, path,
         std::string("must be a number ") + (min_exclusive ? "greater than " : "of at least ") +
             bound.str() + ", got " + described(node),
         node);
  }
  return value;
}

bool readBool(const YAML::Node& node, const std::string& path, const DocumentContext& context) {
  bool value = false;
  if (!isPlain(node) || !YAML::convert<bool>::decode(node, value)) {
    fail(context, path, "must be true or false, got " + described(node), node);
  }
  return value;
}

std::string readString(const YAML::Node& node, const std::string& path,
                       const DocumentContext& context) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    fail(context, path, "must be a non-empty string, got " + described(node), node);
  }
  return node.Scalar();
}

std::string readEnum(const YAML::Node& node, const std::string& path,
                     const DocumentContext& context, const std::vector<std::string>& accepted) {
  const std::string value = node.IsScalar() ? node.Scalar() : "";
  if (std::find(accepted.begin(), accepted.end(), value) == accepted.end()) {
    fail(context, path, "must be " + joined(accepted, " or ") + ", got " + described(node), node);
  }
  return value;
}

// Kubernetes object names (RFC 1123 labels): agents are named "<name>-<index>".
void checkName(const std::string& name, const YAML::Node& node, const DocumentContext& context) {
  static const std::regex kLabel("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  if (name.size() > 56 || !std::regex_match(name, kLabel)) {
    fail(context, "metadata.name",
         "must be at most 56 lowercase letters, digits and '-', starting and ending with a "
         "letter or digit, got \"" +
             name + "\"",
         node);
  }
}

// kvCacheMemory in the agent's syntax ("2GiB", "512MiB", "1e9", bytes), also
// Kubernetes quantities "2Gi", "512Mi", "64Ki"; returns the agent's form.
std::string readByteSize(const YAML::Node& node, const std::string& path,
                         const DocumentContext& context) {
  static const std::regex kSize(
      R"(([0-9]+(\.[0-9]+)?([eE][0-9]+)?)(B|K|M|G|KB|MB|GB|KiB|MiB|GiB|Ki|Mi|Gi)?)");
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  std::smatch match;
  const bool matched = std::regex_match(text, match, kSize);
  // strtod, not stod: a number past the double range (1e400) is refused here
  // instead of escaping as std::out_of_range.
  const double value = matched ? std::strtod(match[1].str().c_str(), nullptr) : 0;
  if (!matched || !(value > 0) || !std::isfinite(value)) {
    fail(context, path,
         "must be a positive size such as 8GiB, 8Gi, 512MiB or 1073741824, got " + described(node),
         node);
  }
  const std::string unit = match[4].str();
  if (unit == "Ki" || unit == "Mi" || unit == "Gi") return match[1].str() + unit + "B";
  return text;
}

// A YAML value as JSON, reading plain scalars as YAML's core schema does.
json toJson(const YAML::Node& node, const DocumentContext& context, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: {
      json array = json::array();
      for (const auto& item : node) array.push_back(toJson(item, context, path));
      return array;
    }
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          fail(context, path,
               "has a key that is not a plain name (got " + described(entry.first) + ")",
               entry.first);
        }
        object[entry.first.as<std::string>()] = toJson(entry.second, context, path);
      }
      return object;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      static const std::regex kInteger("[-+]?[0-9]+");
      static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (text == "null" || text == "Null" || text == "NULL" || text == "~") return nullptr;
      if (std::regex_match(text, kInteger)) {
        try {
          return std::stoll(text);
        } catch (const std::out_of_range&) {
        }
      }
      if (std::regex_match(text, kInteger) || std::regex_match(text, kFloat)) {
        // A number past the double range (1e400) stays text, so that the
        // field's own check names it instead of std::stod throwing.
        const double value = std::strtod(text.c_str(), nullptr);
        if (std::isfinite(value)) return value;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

// Resource requirements are for Kubernetes; their shape is still checked.
void checkResources(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context) {
  requireMapping(node, path, context);
  MapReader resources(node, path, context);
  for (const char* key : {"limits", "requests"}) {
    if (auto quantities = resources.get(key)) {
      requireMapping(*quantities, resources.pathOf(key), context);
      for (const auto& entry : *quantities) {
        if (!entry.second.IsScalar()) {
          fail(context, resources.pathOf(key) + "." + entry.first.as<std::string>(),
               "must be a quantity such as 1, 500m or 8Gi, got " + described(entry.second),
               entry.second);
        }
      }
    }
  }
  if (auto claims = resources.get("claims")) {
    const std::string claims_path = resources.pathOf("claims");
    requireList(*claims, claims_path, context);
    for (size_t i = 0; i < claims->size(); ++i) {
      const std::string item_path = claims_path + "[" + std::to_string(i) + "]";
      requireMapping((*claims)[i], item_path, context);
      MapReader claim((*claims)[i], item_path, context);
      readString(claim.require("name"), claim.pathOf("name"), context);
      claim.rejectUnknown();
    }
  }
  resources.rejectUnknown();
}

// spec.model.volume / spec.modelVolume: one of persistentVolumeClaim and hostPath.
ModelVolumeSpec readModelVolume(const YAML::Node& node, const std::string& path,
                                const DocumentContext& context) {
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  ModelVolumeSpec volume;
  if (auto claim = reader.get("persistentVolumeClaim")) {
    const std::string claim_path = reader.pathOf("persistentVolumeClaim");
    requireMapping(*claim, claim_path, context);
    MapReader claim_reader(*claim, claim_path, context);
    volume.claim_name =
        readString(claim_reader.require("claimName"), claim_reader.pathOf("claimName"), context);
    if (auto read_only = claim_reader.get("readOnly")) {
      volume.claim_read_only = readBool(*read_only, claim_reader.pathOf("readOnly"), context);
    }
    claim_reader.rejectUnknown();
  }
  if (auto host = reader.get("hostPath")) {
    const std::string host_path = reader.pathOf("hostPath");
    requireMapping(*host, host_path, context);
    MapReader host_reader(*host, host_path, context);
    volume.host_path = readString(host_reader.require("path"), host_reader.pathOf("path"), context);
    host_reader.rejectUnknown();
  }
  if (auto sub_path = reader.get("subPath")) {
    volume.sub_path = readString(*sub_path, reader.pathOf("subPath"), context);
  }
  reader.rejectUnknown();
  // The field-listing sample sets both sources to reach every field.
  const bool listing_fields = field_collector != nullptr;
  if (!listing_fields && volume.claim_name.empty() == volume.host_path.empty()) {
    fail(context, path, "must set one of persistentVolumeClaim and hostPath", node);
  }
  return volume;
}

EngineSpec readEngine(const YAML::Node& node, const DocumentContext& context) {
  const std::string path = "spec.engine";
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  EngineSpec engine;
  auto integer = [&](const char* key, std::optional<int64_t>& target, int64_t min,
                     int64_t max = kNoMax) {
    if (auto value = reader.get(key))
      target = readInteger(*value, reader.pathOf(key), context, min, max);
  };
  integer("blockSize", engine.block_size, 1, 1024);
  integer("numBlocks", engine.num_blocks, 1);
  if (auto value = reader.get("kvCacheMemory")) {
    engine.kv_cache_memory = readByteSize(*value, reader.pathOf("kvCacheMemory"), context);
  }
  if (engine.num_blocks && engine.kv_cache_memory) {
    fail(context, path, "sets both numBlocks and kvCacheMemory: set one", node);
  }
  if (auto value = reader.get("kvDtype")) {
    engine.kv_dtype = readEnum(*value, reader.pathOf("kvDtype"), context, {"bf16", "f32"});
  }
  integer("maxNumSeqs", engine.max_num_seqs, 1);
  integer("maxNumBatchedTokens", engine.max_num_batched_tokens, 1);
  integer("maxModelLen", engine.max_model_len, 0);
  integer("maxWaitingRequests", engine.max_waiting_requests, 1);
  if (auto value = reader.get("prefixCachingHash")) {
    engine.prefix_caching_hash =
        readEnum(*value, reader.pathOf("prefixCachingHash"), context, {"xxhash", "sha256"});
  }
  if (auto value = reader.get("shutdownTimeoutSeconds")) {
    engine.shutdown_timeout_s =
        readNumber(*value, reader.pathOf("shutdownTimeoutSeconds"), context, 0, false);
  }
  integer("threads", engine.threads, 0, 1024);
  reader.rejectUnknown();
  return engine;
}

KvTransferSpec readKvTransfer(const YAML::Node& node, PoolKind kind,
                              const DocumentContext& context) {
  const std::string path = "spec.kvTransfer";
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  KvTransferSpec transfer;
  if (auto value = reader.get("connector")) {
    transfer.connector = readEnum(*value, reader.pathOf("connector"), context,
                                  {"ucx", "storage", "offload", "multi"});
  }
  if (auto value = reader.get("role")) {
    // A prefill pool must hand KV out, a decode pool must take it in.
    transfer.role =
        kind == PoolKind::kPrefill
            ? readEnum(*value, reader.pathOf("role"), context, {"kv_producer", "kv_both"})
            : readEnum(*value, reader.pathOf("role"), context, {"kv_consumer", "kv_both"});
  }
  if (auto value = reader.get("extraConfig")) {
    requireMapping(*value, reader.pathOf("extraConfig"), context);
    transfer.extra_config = toJson(*value, context, reader.pathOf("extraConfig"));
  }
  if (auto value = reader.get("secretRef")) {
    const std::string secret_path = reader.pathOf("secretRef");
    requireMapping(*value, secret_path, context);
    MapReader secret(*value, secret_path, context);
    SecretKeyRef ref;
    ref.name = readString(secret.require("name"), secret.pathOf("name"), context);
    ref.key = readString(secret.require("key"), secret.pathOf("key"), context);
    secret.rejectUnknown();
    transfer.secret_ref = std::move(ref);
  }
  reader.rejectUnknown();
  return transfer;
}

std::vector<std::pair<std::string, std::string>> readEnv(const YAML::Node& node,
                                                         const DocumentContext& context) {
  static const std::regex kEnvName("[A-Za-z_][A-Za-z0-9_]*");
  requireList(node, "spec.env", context);
  std::vector<std::pair<std::string, std::string>> env;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "spec.env[" + std::to_string(i) + "]";
    requireMapping(node[i], path, context);
    MapReader item(node[i], path, context);
    const YAML::Node name_node = item.require("name");
    const std::string name = readString(name_node, item.pathOf("name"), context);
    if (!std::regex_match(name, kEnvName)) {
      fail(context, item.pathOf("name"),
           "must be letters, digits and '_', not starting with a digit, got \"" + name + "\"",
           name_node);
    }
    std::string value;
    if (auto value_node = item.get("value")) {
      if (!value_node->IsScalar()) {
        fail(context, item.pathOf("value"), "must be a string, got " + described(*value_node),
             *value_node);
      }
      value = value_node->Scalar();
    }
    item.rejectUnknown();
    env.emplace_back(name, value);
  }
  return env;
}

PoolSpec readPool(const YAML::Node& node, PoolKind kind, const DocumentContext& context) {
  PoolSpec pool;
  pool.kind = kind;
  pool.name = context.name;
  pool.document = context.index;
  requireMapping(node, "spec", context);
  MapReader spec(node, "spec", context);
  if (auto value = spec.get("replicas")) {
    pool.replicas = readInteger(*value, "spec.replicas", context, 0, 1000);
  }
  const YAML::Node model = spec.require("model");
  requireMapping(model, "spec.model", context);
  MapReader model_reader(model, "spec.model", context);
  pool.model_path = readString(model_reader.require("path"), "spec.model.path", context);
  if (auto value = model_reader.get("name")) {
    pool.served_model_name = readString(*value, "spec.model.name", context);
  } else {
    // The agent's own default: the directory's name.
    std::string path = pool.model_path;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    pool.served_model_name = std::filesystem::path(path).filename().string();
  }
  if (auto value = model_reader.get("volume")) {
    pool.model_volume = readModelVolume(*value, "spec.model.volume", context);
  }
  model_reader.rejectUnknown();
  if (auto value = spec.get("image")) pool.image = readString(*value, "spec.image", context);
  if (auto value = spec.get("resources")) {
    checkResources(*value, "spec.resources", context);
    pool.resources = toJson(*value, context, "spec.resources");
  }
  if (auto value = spec.get("engine")) pool.engine = readEngine(*value, context);
  if (auto value = spec.get("kvTransfer")) pool.kv_transfer = readKvTransfer(*value, kind, context);
  if (auto value = spec.get("env")) pool.env = readEnv(*value, context);
  if (auto value = spec.get("extraArgs")) {
    requireList(*value, "spec.extraArgs", context);
    for (size_t i = 0; i < value->size(); ++i) {
      const YAML::Node arg = (*value)[i];
      if (!arg.IsScalar()) {
        fail(context, "spec.extraArgs[" + std::to_string(i) + "]",
             "must be a string, got " + described(arg), arg);
      }
      pool.extra_args.push_back(arg.Scalar());
    }
  }
  spec.rejectUnknown();
  return pool;
}

std::vector<AgentAddress> readAgentList(const YAML::Node& node, const std::string& path,
                                        const DocumentContext& context) {
  requireList(node, path, context);
  std::vector<AgentAddress> agents;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    requireMapping(node[i], item_path, context);
    MapReader item(node[i], item_path, context);
    AgentAddress agent;
    agent.name = readString(item.require("name"), item.pathOf("name"), context);
    agent.host = readString(item.require("host"), item.pathOf("host"), context);
    agent.port =
        static_cast<int>(readInteger(item.require("port"), item.pathOf("port"), context, 1, 65535));
    item.rejectUnknown();
    agents.push_back(std::move(agent));
  }
  return agents;
}

// A list of pool names (a Router's prefillPools / decodePools).
std::vector<std::string> readNameList(const YAML::Node& node, const std::string& path,
                                      const DocumentContext& context) {
  requireList(node, path, context);
  std::vector<std::string> names;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    names.push_back(readString(node[i], item_path, context));
  }
  return names;
}

RouterSpec readRouter(const std::optional<YAML::Node>& node, const DocumentContext& context) {
  RouterSpec router;
  router.name = context.name;
  if (!node) return router;
  requireMapping(*node, "spec", context);
  MapReader spec(*node, "spec", context);
  if (auto value = spec.get("host")) router.host = readString(*value, "spec.host", context);
  if (auto value = spec.get("port")) {
    router.port = static_cast<int>(readInteger(*value, "spec.port", context, 0, 65535));
  }
  if (auto value = spec.get("policy")) {
    router.policy = readEnum(*value, "spec.policy", context, {"kv", "round_robin", "random"});
  }
  if (auto value = spec.get("disaggThresholdTokens")) {
    router.disagg_threshold_tokens = readInteger(*value, "spec.disaggThresholdTokens", context, 0);
  }
  if (auto value = spec.get("pullBack"))
    router.pull_back = readBool(*value, "spec.pullBack", context);
  if (auto value = spec.get("maxQueuedRequests")) {
    router.max_queued_requests = readInteger(*value, "spec.maxQueuedRequests", context, 0);
  }
  if (auto value = spec.get("maxInflightRequests")) {
    router.max_inflight_requests = readInteger(*value, "spec.maxInflightRequests", context, 1);
  }
  if (auto value = spec.get("upstreamTimeoutSeconds")) {
    router.upstream_timeout_s = readNumber(*value, "spec.upstreamTimeoutSeconds", context, 0, true);
  }
  if (auto value = spec.get("threads")) {
    router.threads = static_cast<int>(readInteger(*value, "spec.threads", context, 1, 256));
  }
  if (auto value = spec.get("modelPath")) {
    router.model_path = readString(*value, "spec.modelPath", context);
  }
  if (auto value = spec.get("pollIntervalSeconds")) {
    router.poll_interval_s = readNumber(*value, "spec.pollIntervalSeconds", context, 0, true);
  }
  if (auto value = spec.get("prefill"))
    router.prefill = readAgentList(*value, "spec.prefill", context);
  if (auto value = spec.get("decode"))
    router.decode = readAgentList(*value, "spec.decode", context);
  if (auto value = spec.get("prefillPools")) {
    router.prefill_pools = readNameList(*value, "spec.prefillPools", context);
  }
  if (auto value = spec.get("decodePools")) {
    router.decode_pools = readNameList(*value, "spec.decodePools", context);
  }
  // Kubernetes only.
  if (auto value = spec.get("replicas")) {
    router.replicas = readInteger(*value, "spec.replicas", context, 0, 100);
  }
  if (auto value = spec.get("image")) router.image = readString(*value, "spec.image", context);
  if (auto value = spec.get("resources")) {
    checkResources(*value, "spec.resources", context);
    router.resources = toJson(*value, context, "spec.resources");
  }
  if (auto value = spec.get("modelVolume")) {
    router.model_volume = readModelVolume(*value, "spec.modelVolume", context);
    if (!router.model_path) {
      fail(context, "spec.modelVolume", "is mounted at spec.modelPath, which is not set", *value);
    }
  }
  if (auto value = spec.get("service")) {
    requireMapping(*value, "spec.service", context);
    MapReader service(*value, "spec.service", context);
    if (auto type = service.get("type")) {
      router.service_type =
          readEnum(*type, "spec.service.type", context, {"ClusterIP", "NodePort", "LoadBalancer"});
    }
    if (auto port = service.get("port")) {
      router.service_port =
          static_cast<int>(readInteger(*port, "spec.service.port", context, 1, 65535));
    }
    service.rejectUnknown();
  }
  spec.rejectUnknown();
  return router;
}

// One parsed document of either file kind.
struct Document {
  DocumentContext context;
  std::optional<PoolSpec> pool;
  std::optional<RouterSpec> router;
  YAML::Node node;
};

// An event handler that only remembers where the document began.
class DocumentStart : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { mark_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  const YAML::Mark& mark() const { return mark_; }

 private:
  YAML::Mark mark_ = YAML::Mark::null_mark();
};

// yaml-cpp's LoadAll never returns on some malformed streams (a ',' where
// a document should start): the parser yields an empty document
// without consuming anything, forever, and memory grows until the process
// dies. Walk the documents first and refuse a stream that stops advancing.
void checkDocumentsAdvance(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  int previous_pos = -1;
  while (true) {
    DocumentStart start;
    if (!parser.HandleNextDocument(start)) return;
    const YAML::Mark& mark = start.mark();
    if (mark.pos == previous_pos) {
      const size_t at = static_cast<size_t>(mark.pos);
      const std::string found = at < text.size() ? "'" + text.substr(at, 1) + "'" : "the end";
      throw YAML::ParserException(mark, "unexpected " + found + " where a document should start");
    }
    previous_pos = mark.pos;
  }
}

Document parseDocument(const YAML::Node& node, DocumentContext document_context);

std::vector<Document> parseDocuments(const std::string& text, const std::string& source) {
  std::vector<YAML::Node> nodes;
  try {
    checkDocumentsAdvance(text);
    nodes = YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    throw Error(source + ": not valid YAML: " + e.msg + " (line " +
                std::to_string(e.mark.line + 1) + ")");
  }
  std::vector<Document> documents;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const YAML::Node& node = nodes[i];
    if (node.IsNull()) continue;  // an empty document ("---" at the end)
    DocumentContext context;
    context.source = source;
    context.index = static_cast<int>(i) + 1;
    documents.push_back(parseDocument(node, std::move(context)));
  }
  return documents;
}

// One document (or API object): apiVersion, kind, metadata, spec, status.
Document parseDocument(const YAML::Node& node, DocumentContext document_context) {
  Document document;
  document.node = node;
  document.context = std::move(document_context);
  DocumentContext& context = document.context;
  if (!node.IsMap()) {
    throw Error(context.where() + ": must be a mapping with apiVersion, kind, metadata and spec" +
                lineOf(node));
  }
  MapReader top(node, "", context);
  const YAML::Node api_version = top.require("apiVersion");
  if (!api_version.IsScalar() || api_version.Scalar() != kApiVersion) {
    fail(context, "apiVersion",
         std::string("must be ") + kApiVersion + ", got " + described(api_version), api_version);
  }
  context.kind =
      readEnum(top.require("kind"), "kind", context, {"PrefillPool", "DecodePool", "Router"});
  const bool is_router = context.kind == "Router";
  if (auto metadata = top.get("metadata")) {
    requireMapping(*metadata, "metadata", context);
    // Other ObjectMeta fields (labels, namespace, ...) are accepted and unused.
    const YAML::Node& const_metadata = *metadata;
    if (const YAML::Node name = const_metadata["name"]; name && !name.IsNull()) {
      context.name = readString(name, "metadata.name", context);
      checkName(context.name, name, context);
    }
  }
  if (!is_router && context.name.empty()) fail(context, "metadata.name", "is required", node);
  std::optional<YAML::Node> spec = top.get("spec");
  top.get("status");  // as `kubectl get -o yaml` writes it; not read
  top.rejectUnknown();
  if (is_router) {
    document.router = readRouter(spec, context);
  } else {
    if (!spec) fail(context, "spec", "is required", node);
    document.pool = readPool(
        *spec, context.kind == "PrefillPool" ? PoolKind::kPrefill : PoolKind::kDecode, context);
  }
  return document;
}

std::string readWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The pools must agree on what makes KV blocks interchangeable.
void checkPoolsAgree(const std::vector<Document>& documents) {
  const Document* first = nullptr;
  for (const Document& document : documents) {
    if (!document.pool) continue;
    if (first == nullptr) {
      first = &document;
      continue;
    }
    const PoolSpec& pool = *document.pool;
    const PoolSpec& reference = *first->pool;
    const std::string other = " in " + first->context.label();
    auto mismatch = [&](const std::string& field, const std::string& ours,
                        const std::string& theirs, const std::string& why) {
      if (ours == theirs) return;
      fail(document.context, field,
           "\"" + ours + "\" differs from \"" + theirs + "\"" + other + ": " + why,
           document.node["spec"]);
    };
    mismatch("spec.model.name", pool.served_model_name, reference.served_model_name,
             "the pools of one cluster serve one model");
    mismatch("spec.engine.blockSize", std::to_string(pool.engine.block_size.value_or(16)),
             std::to_string(reference.engine.block_size.value_or(16)),
             "KV blocks move between pools of the same block size only");
    mismatch("spec.engine.kvDtype", pool.engine.kv_dtype.value_or("bf16"),
             reference.engine.kv_dtype.value_or("bf16"),
             "KV blocks move between pools of the same KV dtype only");
    mismatch("spec.engine.prefixCachingHash", pool.engine.prefix_caching_hash.value_or("xxhash"),
             reference.engine.prefix_caching_hash.value_or("xxhash"),
             "the router finds blocks by the agents' block hashes");
  }
}

// A Router's prefillPools / decodePools must name pools of the file, of that
// kind (local mode still routes to every pool it runs).
void checkRoutedPoolsExist(const Document& router,
                           const std::map<std::string, const Document*>& pools) {
  auto check = [&](const std::optional<std::vector<std::string>>& names, PoolKind kind,
                   const std::string& path) {
    if (!names) return;
    for (size_t i = 0; i < names->size(); ++i) {
      const std::string& name = (*names)[i];
      auto it = pools.find(name);
      if (it == pools.end() || it->second->pool->kind != kind) {
        fail(router.context, path + "[" + std::to_string(i) + "]",
             "names \"" + name + "\", which is not a " + poolKindName(kind) + " of this file",
             router.node["spec"]);
      }
    }
  };
  check(router.router->prefill_pools, PoolKind::kPrefill, "spec.prefillPools");
  check(router.router->decode_pools, PoolKind::kDecode, "spec.decodePools");
}

// An API object as a YAML node: JSON is YAML, and JSON strings come back
// quoted, so "1" stays a string where the schema wants a number.
YAML::Node objectNode(const nlohmann::json& object, const std::string& source) {
  try {
    return YAML::Load(object.dump());
  } catch (const YAML::Exception& e) {
    throw Error(source + ": cannot be read: " + e.msg);
  }
}

Document parseObject(const nlohmann::json& object, const std::string& source) {
  if (!object.is_object()) throw Error(source + ": must be a JSON object");
  DocumentContext context;
  context.source = source;
  context.index = 0;
  context.show_lines = false;
  Document document = parseDocument(objectNode(object, source), std::move(context));
  if (document.context.name.empty()) {
    fail(document.context, "metadata.name", "is required", document.node);
  }
  return document;
}

// The spec field paths read while parsing `sample`, without "spec.", list
// items as "[]".
std::vector<std::string> specFieldPaths(const char* sample) {
  std::vector<std::string> paths;
  field_collector = &paths;
  try {
    parseDocuments(sample, "sample");
  } catch (...) {
    field_collector = nullptr;
    throw;
  }
  field_collector = nullptr;
  std::vector<std::string> fields;
  std::set<std::string> seen;
  for (std::string path : paths) {
    if (!path.starts_with("spec.")) continue;
    path = std::regex_replace(path.substr(5), std::regex(R"(\[[0-9]+\])"), "[]");
    if (seen.insert(path).second) fields.push_back(path);
  }
  return fields;
}

}  // namespace

PoolSpec parsePoolObject(const nlohmann::json& object, PoolKind kind, const std::string& source) {
  Document document = parseObject(object, source);
  if (!document.pool || document.pool->kind != kind) {
    throw Error(source + ": kind must be " + poolKindName(kind) + ", got " + document.context.kind);
  }
  return *document.pool;
}

RouterSpec parseRouterObject(const nlohmann::json& object, const std::string& source) {
  Document document = parseObject(object, source);
  if (!document.router) {
    throw Error(source + ": kind must be Router, got " + document.context.kind);
  }
  if (!document.router->prefill.empty() || !document.router->decode.empty()) {
    fail(document.context, document.router->prefill.empty() ? "spec.decode" : "spec.prefill",
         "lists agents, which the controller finds from the pools: use prefillPools and "
         "decodePools",
         document.node);
  }
  return *document.router;
}

const char* poolKindName(PoolKind kind) {
  return kind == PoolKind::kPrefill ? "PrefillPool" : "DecodePool";
}

const char* poolRole(PoolKind kind) { return kind == PoolKind::kPrefill ? "prefill" : "decode"; }

ClusterSpec parseClusterSpec(const std::string& text, const std::string& source) {
  std::vector<Document> documents = parseDocuments(text, source);
  ClusterSpec cluster;
  cluster.source = source;
  std::map<std::string, const Document*> by_name;
  const Document* router = nullptr;
  bool has_decode = false;
  for (const Document& document : documents) {
    if (document.router) {
      if (router != nullptr) {
        throw Error(document.context.where() + ": a cluster has one Router document; " +
                    router->context.label() + " is one already");
      }
      router = &document;
      const YAML::Node spec = document.node["spec"];
      if (!document.router->prefill.empty() || !document.router->decode.empty()) {
        fail(document.context, document.router->prefill.empty() ? "spec.decode" : "spec.prefill",
             "lists agents, which local mode starts from the pools: remove it", spec);
      }
      cluster.router = *document.router;
      continue;
    }
    const PoolSpec& pool = *document.pool;
    auto [it, inserted] = by_name.emplace(pool.name, &document);
    if (!inserted) {
      fail(document.context, "metadata.name",
           "\"" + pool.name + "\" is used by " + it->second->context.label() +
               " already: pool names are unique",
           document.node["metadata"]);
    }
    has_decode = has_decode || pool.kind == PoolKind::kDecode;
    cluster.pools.push_back(pool);
  }
  if (!has_decode) {
    throw Error(source +
                ": no DecodePool document: a cluster needs at least one (with any "
                "number of PrefillPools), see docs/local-mode.md");
  }
  checkPoolsAgree(documents);
  if (router != nullptr) checkRoutedPoolsExist(*router, by_name);
  return cluster;
}

ClusterSpec loadClusterSpec(const std::filesystem::path& path) {
  return parseClusterSpec(readWholeFile(path), path.string());
}

RouterSpec parseRouterSpec(const std::string& text, const std::string& source) {
  std::vector<Document> documents = parseDocuments(text, source);
  if (documents.size() != 1 || !documents[0].router) {
    const Document* pool = nullptr;
    for (const Document& document : documents) {
      if (document.pool) pool = &document;
    }
    if (pool != nullptr) {
      throw Error(pool->context.where() + ": a router file holds one Router document; " +
                  "pools are for `tandem-operator local -f`");
    }
    throw Error(source + ": a router file holds exactly one Router document, found " +
                std::to_string(documents.size()));
  }
  return *documents[0].router;
}

RouterSpec loadRouterSpec(const std::filesystem::path& path) {
  return parseRouterSpec(readWholeFile(path), path.string());
}

AgentAddress parseAgentAddress(const std::string& text, const std::string& default_name,
                               const std::string& what) {
  AgentAddress agent;
  std::string address = text;
  if (const size_t equals = text.find('='); equals != std::string::npos) {
    agent.name = text.substr(0, equals);
    address = text.substr(equals + 1);
  } else {
    agent.name = default_name;
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  try {
    size_t end = 0;
    if (colon != std::string::npos) port = std::stoi(address.substr(colon + 1), &end);
    if (colon == std::string::npos || end != address.size() - colon - 1) port = 0;
  } catch (const std::exception&) {
    port = 0;
  }
  if (agent.name.empty() || colon == std::string::npos || colon == 0 || port < 1 || port > 65535) {
    throw Error(what +
                " must be NAME=HOST:PORT or HOST:PORT with a port between 1 and 65535, got \"" +
                text + "\"");
  }
  agent.host = address.substr(0, colon);
  if (agent.host.size() > 2 && agent.host.front() == '[' && agent.host.back() == ']') {
    agent.host = agent.host.substr(1, agent.host.size() - 2);
  }
  agent.port = port;
  return agent;
}

std::vector<std::string> poolSpecFieldPaths() {
  // A sample that has every optional mapping, so that every field is read.
  return specFieldPaths(R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: sample}
spec:
  model: {path: /models/m, volume: {persistentVolumeClaim: {claimName: c}, hostPath: {path: /m}}}
  resources: {limits: {}, requests: {}, claims: [{name: c}]}
  engine: {}
  kvTransfer: {extraConfig: {}, secretRef: {name: s, key: k}}
  env: [{name: A}]
  extraArgs: []
)");
}

std::vector<std::string> routerSpecFieldPaths() {
  std::vector<std::string> fields = specFieldPaths(R"(apiVersion: tandem.dev/v1alpha1
kind: Router
spec:
  modelPath: /m
  resources: {limits: {}, requests: {}, claims: [{name: c}]}
  modelVolume: {persistentVolumeClaim: {claimName: c}, hostPath: {path: /m}}
  service: {}
  prefillPools: []
  decodePools: []
)");
  std::erase_if(fields,
                [](const std::string& path) { return path == "prefill" || path == "decode"; });
  return fields;
}

}  // namespace tandem::local
