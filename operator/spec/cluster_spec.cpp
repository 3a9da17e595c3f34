#include "operator/spec/cluster_spec.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "common/file_text.h"
#include "common/status.h"
#include "operator/spec/router_spec.h"
#include "operator/spec/spec_reader.h"

namespace tandem::spec {
namespace {

// Kubernetes object names: a pool's or router's Service takes its name, and
// Service names are DNS-1035 labels (a letter first, where other objects
// also take a digit); agents are named "<name>-<index>".
void checkName(const std::string& name, const YAML::Node& node, const DocumentContext& context) {
  static const std::regex kLabel("[a-z]([-a-z0-9]*[a-z0-9])?");
  if (name.size() > 56 || !std::regex_match(name, kLabel)) {
    fail(context, "metadata.name",
         "must be at most 56 lowercase letters, digits and '-', starting with a letter and "
         "ending with a letter or digit (the name of its Service, a DNS-1035 label), got \"" +
             name + "\"",
         node);
  }
}

// kvCacheMemory as the agent reads it (byteSizeOf: "2GiB", "512MiB", "1e9",
// bytes, Kubernetes' "2Gi"), refused here when the agent would refuse it;
// returned in the agent's own spelling ("2Gi" as "2GiB", which agents of
// earlier versions read too).
std::string readByteSize(const YAML::Node& node, const std::string& path,
                         const DocumentContext& context) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  if (!byteSizeOf(text)) {
    fail(context, path,
         "must be a size from 1 byte to 1PiB such as 8GiB, 8Gi, 512MiB or 1073741824, got " +
             described(node),
         node);
  }
  return text.ends_with('i') ? text + "B" : text;
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
    engine.kv_dtype = readEnum(*value, reader.pathOf("kvDtype"), context, {"bf16", "f32", "fp8"});
  }
  if (auto value = reader.get("computeDtype")) {
    engine.compute_dtype =
        readEnum(*value, reader.pathOf("computeDtype"), context, {"f32", "bf16"});
  }
  integer("maxNumSeqs", engine.max_num_seqs, 1);
  if (auto value = reader.get("schedulingPolicy")) {
    engine.scheduling_policy =
        readEnum(*value, reader.pathOf("schedulingPolicy"), context, {"fcfs", "priority"});
  }
  integer("maxNumBatchedTokens", engine.max_num_batched_tokens, 1);
  integer("maxModelLen", engine.max_model_len, 0);
  integer("maxWaitingRequests", engine.max_waiting_requests, 1);
  if (auto value = reader.get("prefixCachingHash")) {
    engine.prefix_caching_hash =
        readEnum(*value, reader.pathOf("prefixCachingHash"), context, {"xxhash", "sha256"});
  }
  if (auto value = reader.get("shutdownTimeoutSeconds")) {
    engine.shutdown_timeout_s =
        readNumber(*value, reader.pathOf("shutdownTimeoutSeconds"), context, 0, false, kMaxSeconds);
  }
  integer("threads", engine.threads, 0, 1024);
  if (auto value = reader.get("device")) {
    engine.device = readEnum(*value, reader.pathOf("device"), context, {"cpu", "cuda", "auto"});
  }
  if (auto value = reader.get("simulate")) {
    engine.simulate = readString(*value, reader.pathOf("simulate"), context);
  }
  if (engine.kv_dtype == "fp8" && engine.device == "cuda") {
    fail(context, path,
         "sets kvDtype fp8 and device cuda: an fp8 KV cache runs on the CPU backend only (set "
         "device cpu, or kvDtype bf16)",
         node);
  }
  reader.rejectUnknown();
  return engine;
}

// A KV secret in extraConfig (or a multi connector member's) reaches the
// agent in its environment, never on its command line (agentEnvironment):
// one that is not a non-empty string is refused here, its value unshown.
// Passed on, it went onto the command line (logged, shown by ps) for the
// agent to refuse.
void requireSecretText(const nlohmann::json& extra, const YAML::Node& node, const std::string& path,
                       const DocumentContext& context) {
  auto secret = extra.find("secret");
  if (secret != extra.end() && (!secret->is_string() || secret->get<std::string>().empty())) {
    fail(context, path + ".secret",
         "must be a non-empty string (quote it: YAML reads digits, true or a list as another "
         "type; the value is not shown)",
         node["secret"]);
  }
  // The agent gets it in its environment, where a NUL ends the value: a
  // secret starting with one reached the agents as none at all.
  if (secret != extra.end() && secret->get<std::string>().find('\0') != std::string::npos) {
    fail(context, path + ".secret",
         "must not contain a NUL character (\\0): it reaches the agents in their environment, "
         "where a NUL ends it (the value is not shown)",
         node["secret"]);
  }
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
    const std::string extra_path = reader.pathOf("extraConfig");
    transfer.extra_config = toJson(*value, context, extra_path);
    requireSecretText(transfer.extra_config, *value, extra_path, context);
    const auto members = transfer.extra_config.find("connectors");
    if (members != transfer.extra_config.end() && members->is_array()) {
      for (size_t i = 0; i < members->size(); ++i) {
        const nlohmann::json& member = (*members)[i];
        const char* kExtra = "kv_connector_extra_config";
        if (!member.is_object() || !member.contains(kExtra)) continue;
        requireSecretText(member[kExtra], (*value)["connectors"][i][kExtra],
                          extra_path + ".connectors[" + std::to_string(i) + "]." + kExtra, context);
      }
    }
  }
  if (auto value = reader.get("secretRef")) {
    transfer.secret_ref = readSecretKeyRef(*value, reader.pathOf("secretRef"), context);
  }
  reader.rejectUnknown();
  return transfer;
}

std::vector<std::pair<std::string, std::string>> readEnv(const YAML::Node& node,
                                                         const DocumentContext& context) {
  requireList(node, "spec.env", context);
  std::vector<std::pair<std::string, std::string>> env;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "spec.env[" + std::to_string(i) + "]";
    requireMapping(node[i], path, context);
    MapReader item(node[i], path, context);
    const YAML::Node name_node = item.require("name");
    const std::string name = readString(name_node, item.pathOf("name"), context);
    auto letter = [](char c) {
      return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    };
    if (name.empty() || !letter(name[0]) || !std::all_of(name.begin(), name.end(), [&](char c) {
          return letter(c) || (c >= '0' && c <= '9');
        })) {
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
    for (size_t earlier = 0; earlier < env.size(); ++earlier) {
      // Server-side apply refuses a list with two entries of one name.
      if (env[earlier].first == name) {
        fail(context, item.pathOf("name"),
             "\"" + name + "\" is set already by spec.env[" + std::to_string(earlier) + "]",
             name_node);
      }
    }
    env.emplace_back(name, value);
  }
  return env;
}

// Variables the controller sets in an agent's container beside spec.env: the
// same name in spec.env would be a second entry, which server-side apply
// refuses.
void checkEnvAgainstController(const PoolSpec& pool, const YAML::Node& node,
                               const DocumentContext& context) {
  for (size_t i = 0; i < pool.env.size(); ++i) {
    const std::string& name = pool.env[i].first;
    std::string set_by;
    if (name == "POD_IP") set_by = "the controller (the pod's IP, for KV transfer)";
    if (name == "TANDEM_KV_SECRET" && pool.kv_transfer.secret_ref) {
      set_by = "spec.kvTransfer.secretRef";
    }
    if (name == "TANDEM_API_KEY" && pool.api_key_secret_ref) set_by = "spec.apiKeySecretRef";
    if (!set_by.empty()) {
      fail(context, "spec.env[" + std::to_string(i) + "].name",
           "\"" + name + "\" is set by " + set_by + "; leave it out of spec.env", node[i]["name"]);
    }
  }
}

// spec.autoscaling, checked by the planner's own parser; its message (which
// names the field) gets the document's place and the field's line.
PoolAutoscaling readAutoscaling(const YAML::Node& node, PoolKind kind,
                                const DocumentContext& context) {
  const std::string path = "spec.autoscaling";
  requireMapping(node, path, context);
  PoolAutoscaling autoscaling;
  autoscaling.written = toJson(node, context, path);  // refuses keys that are not names
  {
    // Only marks the fields as read (for poolSpecFieldPaths); the planner's
    // parser refuses unknown ones with the list it accepts.
    MapReader reader(node, path, context);
    for (const auto& field : autoscaling.written.items()) reader.get(field.key());
  }
  StatusOr<planner::AutoscalingSpec> parsed = planner::parseAutoscalingSpec(
      autoscaling.written,
      kind == PoolKind::kPrefill ? planner::PoolKind::kPrefill : planner::PoolKind::kDecode);
  if (!parsed.isOk()) {
    const std::string& message = parsed.status().message();
    YAML::Node at = node;
    const std::string prefix = path + ".";
    if (message.starts_with(prefix)) {
      const std::string field = message.substr(prefix.size(), message.find(' ') - prefix.size());
      const YAML::Node& const_node = node;
      if (const YAML::Node value = const_node[field]) at = value;
    }
    throw Error(context.where() + ": " + message + (context.show_lines ? lineOf(at) : ""));
  }
  autoscaling.spec = std::move(parsed.value());
  return autoscaling;
}

RolloutSpec readRollout(const YAML::Node& node, const DocumentContext& context) {
  const std::string path = "spec.rollout";
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  RolloutSpec rollout;
  if (auto value = reader.get("maxSurge")) {
    rollout.max_surge = readBudgetBound(*value, path + ".maxSurge", context);
  }
  if (auto value = reader.get("maxUnavailable")) {
    rollout.max_unavailable = readBudgetBound(*value, path + ".maxUnavailable", context);
  }
  if (auto value = reader.get("startupTimeoutSeconds")) {
    rollout.startup_timeout_s =
        readInteger(*value, path + ".startupTimeoutSeconds", context, 10, 86400);
  }
  reader.rejectUnknown();
  auto zero = [](const nlohmann::json& bound) { return bound == 0 || bound == "0%"; };
  if (!FieldPathRecorder::active() && zero(rollout.max_surge) && zero(rollout.max_unavailable)) {
    fail(context, path,
         "sets maxSurge and maxUnavailable both to 0: no agent could ever be replaced", node);
  }
  return rollout;
}

// The last component of a path or image repository: a served model's default
// name ("/models/m/" → "m"; "registry:5000/models/tiny:1@sha256:..." → "tiny").
std::string lastComponent(std::string text) {
  if (size_t digest = text.find('@'); digest != std::string::npos) text.resize(digest);
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  if (size_t slash = text.rfind('/'); slash != std::string::npos) text = text.substr(slash + 1);
  return text;
}

std::string imageRepositoryName(const std::string& image) {
  std::string name = lastComponent(image);
  if (size_t tag = name.find(':'); tag != std::string::npos) name.resize(tag);
  return name;
}

// spec.model: a path (with an optional volume) or a source (hf://, pvc://,
// oci://) with the fields its kind takes.
void readPoolModel(const YAML::Node& model, PoolSpec& pool, const DocumentContext& context) {
  requireMapping(model, "spec.model", context);
  MapReader reader(model, "spec.model", context);
  const bool listing_fields = FieldPathRecorder::active();
  std::optional<YAML::Node> path = reader.get("path");
  std::optional<YAML::Node> source_node = reader.get("source");
  if (!listing_fields && path && source_node) {
    fail(context, "spec.model", "sets both path and source: give one", model);
  }
  if (!path && !source_node) {
    fail(context, "spec.model",
         "must set source (hf://org/name[@revision], pvc://claim[/path], oci://image) or path",
         model);
  }
  if (path) pool.model_path = readString(*path, "spec.model.path", context);
  if (source_node && !listing_fields) {
    const std::string text = readString(*source_node, "spec.model.source", context);
    StatusOr<model_source::ModelSource> source = model_source::parseModelSource(text);
    if (!source.isOk()) fail(context, "spec.model.source", source.status().message(), *source_node);
    if (source->kind == model_source::SourceKind::kPath) {
      pool.model_path = source->path;
    } else {
      pool.model_source = ModelSourceSpec{};
      pool.model_source->source = std::move(*source);
    }
  }
  using model_source::SourceKind;
  const std::optional<SourceKind> kind =
      pool.model_source ? std::optional(pool.model_source->source.kind) : std::nullopt;
  // A field that belongs to another kind of source is refused, naming it.
  auto only = [&](const char* field, SourceKind wanted, const char* what) {
    std::optional<YAML::Node> value = reader.get(field);
    if (value && !listing_fields && kind != wanted) {
      fail(context, reader.pathOf(field), std::string("is for ") + what + " sources only", *value);
    }
    return value;
  };
  ModelSourceSpec scratch;
  ModelSourceSpec& fetch = pool.model_source ? *pool.model_source : scratch;
  if (auto value = only("tokenSecretRef", SourceKind::kHuggingFace, "hf://")) {
    fetch.token_secret_ref =
        readSecretKeyRef(*value, reader.pathOf("tokenSecretRef"), context, "HF_TOKEN");
  }
  if (auto value = only("endpoint", SourceKind::kHuggingFace, "hf://")) {
    fetch.endpoint = readString(*value, reader.pathOf("endpoint"), context);
    if (!listing_fields && !fetch.endpoint.starts_with("http://") &&
        !fetch.endpoint.starts_with("https://")) {
      fail(context, reader.pathOf("endpoint"),
           "must be an http:// or https:// URL, got " + described(*value), *value);
    }
  }
  if (auto value = only("cache", SourceKind::kHuggingFace, "hf://")) {
    const std::string cache_path = reader.pathOf("cache");
    requireMapping(*value, cache_path, context);
    MapReader cache(*value, cache_path, context);
    if (auto claim = cache.get("claimName")) {
      fetch.cache_claim = readObjectName(*claim, cache.pathOf("claimName"), context);
    }
    if (auto limit = cache.get("sizeLimit")) {
      fetch.cache_size_limit = readQuantity(*limit, cache.pathOf("sizeLimit"), context);
    }
    cache.rejectUnknown();
  }
  if (auto value = only("imageMount", SourceKind::kImage, "oci://")) {
    fetch.image_mount =
        readEnum(*value, reader.pathOf("imageMount"), context, {"Copy", "ImageVolume"});
  }
  if (auto value = reader.get("volume")) {
    if (!listing_fields && pool.model_source) {
      fail(context, "spec.model.volume",
           "is for a path; a pvc:// source names its claim, an hf:// source its cache", *value);
    }
    pool.model_volume = readModelVolume(*value, "spec.model.volume", context);
  }
  if (auto value = reader.get("name")) {
    pool.served_model_name = readString(*value, "spec.model.name", context);
  } else if (!pool.model_source) {
    pool.served_model_name = lastComponent(pool.model_path);  // the agent's own default
  } else if (*kind == SourceKind::kHuggingFace) {
    pool.served_model_name = pool.model_source->source.repo;  // as vLLM names a Hub model
  } else if (*kind == SourceKind::kClaim) {
    const model_source::ModelSource& source = pool.model_source->source;
    pool.served_model_name = source.path.empty() ? source.claim : lastComponent(source.path);
  } else {
    pool.served_model_name = imageRepositoryName(pool.model_source->source.image);
  }
  reader.rejectUnknown();
}

// The agent flags written from a pool's other fields (spec.extraArgs may not
// give them again: the last value would win).
const OwnedFlag kOwnedAgentFlags[] = {
    {"--host",
     "the agent listens where the controller (or local mode) puts it, where the "
     "probes, the Service and the routers look"},
    {"--port",
     "the agent listens where the controller (or local mode) puts it, where the "
     "probes, the Service and the routers look"},
    {"--model", "set spec.model"},
    {"--served-model-name", "set spec.model.name"},
    {"--role", "the pool's kind sets it"},
    {"--kv-transfer-config", "set spec.kvTransfer"},
    {"--shutdown-timeout",
     "set spec.engine.shutdownTimeoutSeconds (the pod's termination grace period follows it)"},
    {"--config", "set the pool's fields (a file would set what they leave out, unseen)"},
    {"--api-key", "set spec.apiKeySecretRef (a key on the command line shows in ps)"},
};

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
  readPoolModel(spec.require("model"), pool, context);
  if (auto value = spec.get("image")) pool.image = readString(*value, "spec.image", context);
  if (auto value = spec.get("resources")) {
    checkResources(*value, "spec.resources", context);
    pool.resources = toJson(*value, context, "spec.resources");
  }
  if (auto value = spec.get("engine")) pool.engine = readEngine(*value, context);
  if (auto value = spec.get("kvTransfer")) pool.kv_transfer = readKvTransfer(*value, kind, context);
  const std::optional<YAML::Node> env = spec.get("env");
  if (env) pool.env = readEnv(*env, context);
  if (auto value = spec.get("extraArgs")) {
    // An empty argument may be a flag's value.
    pool.extra_args = readStringList(*value, "spec.extraArgs", context, /*allow_empty=*/true);
    refuseOwnedFlags(pool.extra_args, kOwnedAgentFlags, *value, context);
  }
  if (auto value = spec.get("autoscaling"))
    pool.autoscaling = readAutoscaling(*value, kind, context);
  if (auto value = spec.get("disruptionBudget")) {
    pool.disruption_budget = readDisruptionBudget(*value, context);
  }
  if (auto value = spec.get("rollout")) pool.rollout = readRollout(*value, context);
  if (auto value = spec.get("apiKeySecretRef")) {
    pool.api_key_secret_ref =
        readSecretKeyRef(*value, "spec.apiKeySecretRef", context, kApiKeySecretKey);
  }
  if (auto value = spec.get("template")) {
    pool.pod_template = readPodTemplate(*value, "spec.template", context);
  }
  if (env) checkEnvAgainstController(pool, *env, context);
  spec.rejectUnknown();
  return pool;
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
  std::optional<std::string> text = readFileText(path);
  if (!text) throw Error(path.string() + ": cannot be read");
  return std::move(*text);
}

// The pools must agree on what makes KV blocks interchangeable, and on how
// a request is served by its prefill and its decode agent.
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
    mismatch("spec.engine.computeDtype", pool.engine.compute_dtype.value_or("auto"),
             reference.engine.compute_dtype.value_or("auto"),
             "KV blocks move between pools of the same compute dtype only (it is part of the "
             "model identity)");
    mismatch("spec.engine.prefixCachingHash", pool.engine.prefix_caching_hash.value_or("xxhash"),
             reference.engine.prefix_caching_hash.value_or("xxhash"),
             "the router finds blocks by the agents' block hashes");
    mismatch("spec.engine.schedulingPolicy", pool.engine.scheduling_policy.value_or("fcfs"),
             reference.engine.scheduling_policy.value_or("fcfs"),
             "a request's priority is read by its prefill agent and its decode agent alike");
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
// The path ("spec.template.spec.a[0]") of the first value nested deeper
// than `limit` objects and arrays, or "" when none is.
std::string tooDeep(const nlohmann::json& root, size_t limit) {
  struct Frame {
    const nlohmann::json* value;
    std::string path;
    size_t depth;
  };
  std::vector<Frame> stack = {{&root, "", 0}};
  while (!stack.empty()) {
    Frame frame = std::move(stack.back());
    stack.pop_back();
    if (!frame.value->is_structured()) continue;
    if (frame.depth >= limit) return frame.path;
    if (frame.value->is_object()) {
      for (const auto& [key, child] : frame.value->items()) {
        stack.push_back(
            {&child, frame.path.empty() ? key : frame.path + "." + key, frame.depth + 1});
      }
    } else {
      for (size_t i = 0; i < frame.value->size(); ++i) {
        stack.push_back(
            {&(*frame.value)[i], frame.path + "[" + std::to_string(i) + "]", frame.depth + 1});
      }
    }
  }
  return "";
}

YAML::Node objectNode(const nlohmann::json& object, const std::string& source) {
  // Pod specs nest a dozen levels; the YAML reader gives up, with no useful
  // reason, a few hundred levels down.
  constexpr size_t kMaxDepth = 64;
  if (const std::string path = tooDeep(object, kMaxDepth); !path.empty()) {
    throw Error(source + ": " + path + " is nested deeper than " + std::to_string(kMaxDepth) +
                " objects and lists, which no field of these kinds needs");
  }
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
  {
    FieldPathRecorder recorder(paths);
    parseDocuments(sample, "sample");
  }
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

RolloutBounds resolveRollout(const RolloutSpec& rollout, int64_t replicas) {
  // A bound is a whole number or "N%" (readBudgetBound made it so).
  auto resolve = [&](const nlohmann::json& bound, bool round_up) -> int64_t {
    if (bound.is_number_integer()) return bound.get<int64_t>();
    const std::string text = bound.get<std::string>();
    const int64_t percent = std::stoll(text.substr(0, text.size() - 1));
    return (percent * replicas + (round_up ? 99 : 0)) / 100;
  };
  RolloutBounds bounds;
  bounds.max_surge = resolve(rollout.max_surge, true);
  bounds.max_unavailable = resolve(rollout.max_unavailable, false);
  if (bounds.max_surge == 0 && bounds.max_unavailable == 0) bounds.max_unavailable = 1;
  return bounds;
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

std::vector<std::string> poolSpecFieldPaths(PoolKind kind) {
  // A sample that has every optional mapping and every autoscaling field of
  // the kind, so that every field is read.
  const std::string autoscaling =
      kind == PoolKind::kPrefill
          ? "targetTTFTSeconds: 1, targetQueuedPrefillTokensPerReplica: 1"
          : "targetITLSeconds: 1, targetRunningSequencesPerReplica: 1, targetKVCacheUsage: 1";
  const std::string sample = std::string("apiVersion: tandem.dev/v1alpha1\nkind: ") +
                             poolKindName(kind) + R"(
metadata: {name: sample}
spec:
  model: {path: /models/m, volume: {persistentVolumeClaim: {claimName: c}, hostPath: {path: /m}},
    source: hf://o/m, tokenSecretRef: {name: s, key: k}, endpoint: e,
    cache: {claimName: c, sizeLimit: 1Gi}, imageMount: Copy}
  resources: {limits: {}, requests: {}, claims: [{name: c}]}
  engine: {}
  kvTransfer: {extraConfig: {}, secretRef: {name: s, key: k}}
  apiKeySecretRef: {name: s, key: k}
  env: [{name: A}]
  extraArgs: []
  disruptionBudget: {}
  rollout: {}
  template: {metadata: {}, spec: {containers: [{name: a}], initContainers: [{name: a}],
    volumes: [{name: a}], imagePullSecrets: [{name: a}], resourceClaims: [{name: a}]}}
  autoscaling: {minReplicas: 1, maxReplicas: 1, quantile: 0.5, windowSeconds: 1,
    scaleUpStabilizationSeconds: 0, scaleDownStabilizationSeconds: 0, maxStep: 1,
    pendingTimeoutSeconds: 1, )" +
                             autoscaling + "}\n";
  return specFieldPaths(sample.c_str());
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
  kvSecretRef: {name: s, key: k}
  apiKeySecretRef: {name: s, key: k}
  extraArgs: []
  disruptionBudget: {}
  template: {metadata: {}, spec: {containers: [{name: a}], initContainers: [{name: a}],
    volumes: [{name: a}], imagePullSecrets: [{name: a}], resourceClaims: [{name: a}]}}
)");
  std::erase_if(fields,
                [](const std::string& path) { return path == "prefill" || path == "decode"; });
  return fields;
}

}  // namespace tandem::spec
