// A local cluster file: PrefillPool and DecodePool documents in the shape of
// the CRDs (crds/*.yaml) and an optional Router document, in one multi-document
// YAML file (docs/local-mode.md). Parsing is strict, as `kubectl apply
// --validate=strict` is: an unknown field, a wrong type or a value out of range
// throws tandem::Error naming the file, the document (numbered from 1), its kind
// and name, the field's path and its line, e.g.
//
//   cluster.yaml: document 2 (DecodePool "decode"): spec.engine.blockSize must be
//   an integer between 1 and 1024, got "big" (line 14)
//
// The parsed types are plain values; nothing here starts a process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/model_source/model_source.h"
#include "operator/planner/autoscaling_spec.h"

namespace tandem::spec {

// Seconds fields (and flags) are at most a day: a deadline one past a
// clock's range would overflow it, and a longer wait is no wait at all.
inline constexpr double kMaxSeconds = 86400;

// What a number field or flag accepts, for its refusal: "a number greater
// than 0 and at most 86400" (no upper part for an infinite max).
std::string numberRangeText(double min, bool min_exclusive, double max);
// The same for an integer: "an integer between 1 and 256", "a positive
// integer" (max: int64's largest, no upper part).
std::string integerRangeText(int64_t min, int64_t max);

inline constexpr const char* kApiVersion = "tandem.dev/v1alpha1";

enum class PoolKind { kPrefill, kDecode };
// "PrefillPool" or "DecodePool".
const char* poolKindName(PoolKind kind);
// The agent's --role: "prefill" or "decode".
const char* poolRole(PoolKind kind);

// spec.engine: each field maps to one `tandem-agent serve` flag (see
// agent_command.h); unset fields leave the agent's default.
struct EngineSpec {
  std::optional<int64_t> block_size;               // blockSize → --block-size
  std::optional<int64_t> num_blocks;               // numBlocks → --num-blocks
  std::optional<std::string> kv_cache_memory;      // kvCacheMemory → --kv-cache-memory
  std::optional<std::string> kv_dtype;             // kvDtype → --kv-dtype
  std::optional<std::string> compute_dtype;        // computeDtype → --compute-dtype
  std::optional<int64_t> max_num_seqs;             // maxNumSeqs → --max-num-seqs
  std::optional<std::string> scheduling_policy;    // schedulingPolicy → --scheduling-policy
  std::optional<int64_t> max_num_batched_tokens;   // maxNumBatchedTokens
  std::optional<int64_t> max_model_len;            // maxModelLen
  std::optional<int64_t> max_waiting_requests;     // maxWaitingRequests
  std::optional<std::string> prefix_caching_hash;  // prefixCachingHash
  std::optional<double> shutdown_timeout_s;        // shutdownTimeoutSeconds → --shutdown-timeout
  std::optional<int64_t> threads;                  // threads → --threads
  std::optional<std::string> device;               // device → --device (cpu, cuda, auto)
  std::optional<std::string> simulate;             // simulate → --simulate (a step profile path)
  bool operator==(const EngineSpec&) const = default;
};

// spec.kvTransfer.secretRef: the Secret key that holds the shared KV secret
// (Kubernetes only: the agent's environment TANDEM_KV_SECRET).
struct SecretKeyRef {
  std::string name;
  std::string key;
  bool operator==(const SecretKeyRef&) const = default;
};

// spec.kvTransfer: the agent's --kv-transfer-config.
struct KvTransferSpec {
  std::string connector = "ucx";                           // kv_connector
  std::string role = "kv_both";                            // kv_role
  nlohmann::json extra_config = nlohmann::json::object();  // kv_connector_extra_config
  std::optional<SecretKeyRef> secret_ref;                  // secretRef (Kubernetes only)
  bool operator==(const KvTransferSpec&) const = default;
};

// Where a model directory comes from in Kubernetes (a pool's spec.model.volume,
// a Router's spec.modelVolume): exactly one of a PersistentVolumeClaim and a
// host path, mounted read-only at the model path. Local mode ignores it.
struct ModelVolumeSpec {
  std::string claim_name;       // persistentVolumeClaim.claimName, or empty
  bool claim_read_only = true;  // persistentVolumeClaim.readOnly
  std::string host_path;        // hostPath.path, or empty
  std::string sub_path;         // subPath: a directory inside the volume; empty: its root
  bool operator==(const ModelVolumeSpec&) const = default;
};

// spec.model.source when it is not a plain path, with the fields its kind
// takes (docs/kubernetes.md, "Model sources"). Local mode fetches hf://
// sources itself and refuses pvc:// and oci://; the controller turns each
// into volumes, an init container and the agent's --model.
struct ModelSourceSpec {
  model_source::ModelSource source;
  // hf:// only: spec.model.tokenSecretRef (key default HF_TOKEN), given to the
  // fetch as HF_TOKEN; spec.model.endpoint (a mirror; "" = the Hub); and
  // spec.model.cache: a claim the pool's pods share, else an emptyDir per pod
  // (sizeLimit, a quantity, when set).
  std::optional<SecretKeyRef> token_secret_ref;
  std::string endpoint;
  std::string cache_claim;
  std::string cache_size_limit;
  // oci:// only: spec.model.imageMount, "Copy" (an init container copies the
  // image's /models into an emptyDir) or "ImageVolume" (the image mounted
  // as a volume; Kubernetes 1.33+ with the ImageVolume feature).
  std::string image_mount = "Copy";
  bool operator==(const ModelSourceSpec&) const = default;
};

// spec.disruptionBudget (Kubernetes only): the pool's (or Router's)
// PodDisruptionBudget, which keeps voluntary disruptions (node drains,
// cluster upgrades) from taking more than this many agents (routers) at once. Each bound is an
// integer or a percentage ("25%"); at most one is set; neither: maxUnavailable 1.
struct DisruptionBudgetSpec {
  bool enabled = true;
  nlohmann::json max_unavailable;  // null when unset
  nlohmann::json min_available;    // null when unset
  bool operator==(const DisruptionBudgetSpec&) const = default;
};

// spec.rollout: how a changed pool replaces its agents, the Deployment's
// in Kubernetes, local mode's own locally (maxSurge and maxUnavailable: an
// integer or a percentage, not both zero; default 1 and 0: a new agent is
// ready before an old one goes, which needs room for one more), and how long
// an agent may take to start (load its model) before the kubelet restarts
// it (Kubernetes only).
struct RolloutSpec {
  nlohmann::json max_surge = 1;
  nlohmann::json max_unavailable = 0;
  int64_t startup_timeout_s = 600;
  bool operator==(const RolloutSpec&) const = default;
};

// A rollout's bounds in agents for a pool of `replicas`, as a Deployment
// resolves them: a percentage of maxSurge rounds up, one of maxUnavailable
// down, and when both come to 0, maxUnavailable is 1.
struct RolloutBounds {
  int64_t max_surge = 0;
  int64_t max_unavailable = 0;
};
RolloutBounds resolveRollout(const RolloutSpec& rollout, int64_t replicas);

// spec.autoscaling: the SLA planner's settings for the pool (docs/planner.md),
// parsed by planner::parseAutoscalingSpec. Two are equal when written alike
// (`written` is the field as JSON), which is what a file reload compares.
struct PoolAutoscaling {
  planner::AutoscalingSpec spec;
  nlohmann::json written;
  bool operator==(const PoolAutoscaling& other) const { return written == other.written; }
};

struct PoolSpec {
  PoolKind kind = PoolKind::kDecode;
  std::string name;  // metadata.name; agents are "<name>-<index>"
  int document = 0;  // position in the file, from 1 (for messages)
  int64_t replicas = 1;
  std::string model_path;  // spec.model.path as written (or a path source); "" with model_source
  // spec.model.name, else: the path's last component; an hf:// source's
  // repository ("org/name"); a pvc:// source's last component; an oci://
  // image's repository name.
  std::string served_model_name;
  std::optional<ModelSourceSpec> model_source;  // spec.model.source, unless a plain path
  std::string image;                            // Kubernetes only
  // Kubernetes only: spec.model.volume, and spec.resources as written
  // ({limits, requests, claims}; an empty object when unset).
  std::optional<ModelVolumeSpec> model_volume;
  nlohmann::json resources = nlohmann::json::object();
  EngineSpec engine;
  KvTransferSpec kv_transfer;
  std::vector<std::pair<std::string, std::string>> env;  // spec.env
  std::vector<std::string> extra_args;                   // spec.extraArgs
  std::optional<PoolAutoscaling> autoscaling;            // spec.autoscaling
  DisruptionBudgetSpec disruption_budget;                // spec.disruptionBudget
  RolloutSpec rollout;                                   // spec.rollout
  // spec.apiKeySecretRef (Kubernetes only; key default "api-key"): the
  // Secret key with the API key clients must send, the agents' environment
  // TANDEM_API_KEY. Local mode: TANDEM_API_KEY in its own environment.
  std::optional<SecretKeyRef> api_key_secret_ref;
  // spec.template (Kubernetes only): the pod template fragment merged into
  // the agents' pods ({metadata, spec}; an empty object when unset).
  nlohmann::json pod_template = nlohmann::json::object();
  bool operator==(const PoolSpec&) const = default;
};

// An agent as the router is given it: by local mode from its supervisor, by
// `tandem-operator router` from its flags or file.
struct AgentAddress {
  std::string name;
  std::string host;
  int port = 0;
  bool operator==(const AgentAddress&) const = default;
};

// The Router document's spec; unset fields keep RouterConfig's defaults
// (operator/router/router.h).
struct RouterSpec {
  std::optional<std::string> host;
  std::optional<int> port;
  std::optional<std::string> policy;  // a policy name (router.h: parsePolicy)
  std::optional<int64_t> disagg_threshold_tokens;
  std::optional<bool> pull_back;
  std::optional<int64_t> max_queued_requests;
  std::optional<int64_t> max_inflight_requests;
  std::optional<double> upstream_timeout_s;
  std::optional<int64_t> max_migrations;
  std::optional<double> migration_timeout_s;
  // Seconds in-flight requests get when the router stops (SIGTERM, a
  // rollout, local mode ending): --shutdown-timeout.
  std::optional<double> shutdown_timeout_s;
  std::optional<int> threads;
  std::optional<std::string> model_path;
  std::optional<double> poll_interval_s;
  // The kv policy's step-time model: a simulation profile file (local mode
  // defaults it to the pools' engine.simulate profile when they share one).
  std::optional<std::string> profile;
  std::optional<double> itl_target_ms;
  std::optional<int64_t> seed;
  std::optional<int64_t> debug_decisions;
  // Static agents: `tandem-operator router` only (local mode fills them).
  std::vector<AgentAddress> prefill;
  std::vector<AgentAddress> decode;
  // The pools routed to, by name (unset: every pool). Local mode checks that
  // they name pools of the file and routes to every pool of the file; the
  // controller routes to exactly these pools of the Router's namespace.
  std::optional<std::vector<std::string>> prefill_pools;
  std::optional<std::vector<std::string>> decode_pools;
  // Kubernetes only (accepted and unused elsewhere): the router's Deployment
  // and Service.
  std::string name;                                     // metadata.name; may be empty in a file
  int64_t replicas = 1;                                 // spec.replicas
  std::string image;                                    // spec.image
  nlohmann::json resources = nlohmann::json::object();  // spec.resources as written
  std::optional<ModelVolumeSpec> model_volume;          // spec.modelVolume, at modelPath
  std::string service_type = "ClusterIP";               // spec.service.type
  int service_port = 8000;                              // spec.service.port
  // spec.kvSecretRef (Kubernetes only): the Secret key with the agents'
  // shared KV secret (the pools' kvTransfer.secretRef), given to the router
  // as TANDEM_KV_SECRET to sign its pull-back holds with.
  std::optional<SecretKeyRef> kv_secret_ref;
  // spec.apiKeySecretRef (Kubernetes only; key default "api-key"): the
  // Secret key with the API key, the router's TANDEM_API_KEY: clients must
  // send it, and the router sends it to the agents (give the pools the same).
  std::optional<SecretKeyRef> api_key_secret_ref;
  // spec.extraArgs (Kubernetes only): appended to the router's command line
  // (its flags take the last value given, so these win over the generated
  // ones).
  std::vector<std::string> extra_args;
  // spec.template (Kubernetes only): merged into the router's pods.
  nlohmann::json pod_template = nlohmann::json::object();
  // spec.disruptionBudget (Kubernetes only): the Router's
  // PodDisruptionBudget, as a pool's (counting router pods).
  DisruptionBudgetSpec disruption_budget;
  // Kubernetes only, never read from a document: with modelPath unset, the
  // model source of the first decode pool routed to and that pool's image
  // ("" = the controller's default agent image), filled by the controller;
  // the router's pod fetches (tokenizer files only) or mounts it.
  std::optional<ModelSourceSpec> pools_model_source;
  std::string pools_image;
  // Local mode only, never read from a document: the decode pools' KV secret
  // (poolKvSecret in agent_command.h), which the in-process router signs
  // its pull-back holds with.
  std::string kv_secret;
  bool operator==(const RouterSpec&) const = default;
};

struct ClusterSpec {
  std::vector<PoolSpec> pools;  // in file order
  RouterSpec router;
  std::string source;  // the file name used in messages
};

// Parses a cluster file's text; `source` names it in messages. At least one
// DecodePool is required, at most one Router; pool names are unique; every
// pool serves the same model name with the same KV block size and dtype (KV
// blocks move between them). The Router document must not list agents.
ClusterSpec parseClusterSpec(const std::string& text, const std::string& source);
ClusterSpec loadClusterSpec(const std::filesystem::path& path);

// A router file: one Router document (`tandem-operator router --config`).
RouterSpec parseRouterSpec(const std::string& text, const std::string& source);
RouterSpec loadRouterSpec(const std::filesystem::path& path);

// "NAME=HOST:PORT" or "HOST:PORT" (named `default_name`); throws tandem::Error
// naming `what` (e.g. "--prefill").
AgentAddress parseAgentAddress(const std::string& text, const std::string& default_name,
                               const std::string& what);

// One PrefillPool, DecodePool or Router object as the Kubernetes API returns
// it (JSON; metadata and status as the server writes them are accepted), with
// the same strict checks as a cluster file's documents. `source` names the
// object in messages, e.g. "PrefillPool default/prefill"; throws tandem::Error
// ("PrefillPool default/prefill: spec.engine.blockSize must be ..."). A pool
// must have the kind `kind`; a Router must not list static agents.
PoolSpec parsePoolObject(const nlohmann::json& object, PoolKind kind, const std::string& source);
RouterSpec parseRouterObject(const nlohmann::json& object, const std::string& source);

// Every field path a pool's (a Router's) spec accepts ("replicas",
// "model.path", "engine.blockSize", "autoscaling.maxReplicas", ...), for
// checking the CRDs against the parser; a pool's autoscaling targets depend on
// its kind. The Router's static agent lists (prefill, decode) are for files
// only and not listed.
std::vector<std::string> poolSpecFieldPaths(PoolKind kind);
std::vector<std::string> routerSpecFieldPaths();

}  // namespace tandem::spec
