// The cluster file parser: every field of the PrefillPool/DecodePool/Router
// documents, the errors a user can cause (each naming the file, document,
// kind, name, field and line), and the CRDs in crds/ against the parser.
#include "operator/spec/cluster_spec.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>
#include <string>

#include "common/status.h"
#include "operator/spec/spec_reader.h"

namespace tandem::spec {
namespace {

namespace fs = std::filesystem;

const char* kPrefill = R"(apiVersion: tandem.dev/v1alpha1
kind: PrefillPool
metadata:
  name: prefill
spec:
  model:
    path: /models/small
)";

const char* kDecode = R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata:
  name: decode
spec:
  model:
    path: /models/small
)";

std::string documents(std::initializer_list<std::string> parts) {
  std::string text;
  for (const std::string& part : parts) {
    if (!text.empty()) text += "---\n";
    text += part;
  }
  return text;
}

// The message parseClusterSpec throws for `text`.
std::string errorFor(const std::string& text) {
  try {
    parseClusterSpec(text, "c.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(ClusterSpecTest, ReadsEveryField) {
  const std::string text = documents({R"(apiVersion: tandem.dev/v1alpha1
kind: PrefillPool
metadata:
  name: prefill
  labels: {team: serving}
spec:
  replicas: 3
  model:
    path: /models/llama/
    name: llama
  image: ghcr.io/tandem/agent:0.1
  resources:
    limits: {nvidia.com/gpu: 1, memory: 64Gi}
    requests: {cpu: 500m}
  engine:
    blockSize: 32
    kvCacheMemory: 8Gi
    kvDtype: f32
    computeDtype: bf16
    device: cuda
    maxNumSeqs: 128
    schedulingPolicy: priority
    maxNumBatchedTokens: 4096
    maxModelLen: 8192
    maxWaitingRequests: 100
    prefixCachingHash: sha256
    shutdownTimeoutSeconds: 2.5
    threads: 4
  kvTransfer:
    connector: ucx
    role: kv_producer
    extraConfig:
      abort_timeout_s: 60
      read_timeout_s: 2.5
      secret: "123"
      kv_load_failure_policy: fail
      nested: {list: [1, true, ~]}
    secretRef: {name: kv, key: secret}
  env:
    - {name: UCX_TLS, value: tcp}
    - {name: EMPTY}
  extraArgs: [--insecure-kv]
status:
  replicas: 3
)",
                                      R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata:
  name: decode
spec:
  replicas: 0
  model: {path: /models/llama, name: llama}
  engine: {blockSize: 32, kvDtype: f32, computeDtype: bf16, prefixCachingHash: sha256, numBlocks: 4096,
           schedulingPolicy: priority}
)",
                                      R"(apiVersion: tandem.dev/v1alpha1
kind: Router
spec:
  host: 0.0.0.0
  port: 9000
  policy: round_robin
  disaggThresholdTokens: 64
  pullBack: false
  maxQueuedRequests: 10
  maxInflightRequests: 5
  upstreamTimeoutSeconds: 30
  maxMigrations: 1
  migrationTimeoutSeconds: 12.5
  threads: 4
  modelPath: /models/llama
  pollIntervalSeconds: 0.25
  extraArgs: [--max-connections, "4096", --api-key-exempt-paths, "", --portable]
)"});
  const ClusterSpec cluster = parseClusterSpec(text, "c.yaml");
  ASSERT_EQ(cluster.pools.size(), 2u);
  const PoolSpec& prefill = cluster.pools[0];
  EXPECT_EQ(prefill.kind, PoolKind::kPrefill);
  EXPECT_EQ(prefill.name, "prefill");
  EXPECT_EQ(prefill.document, 1);
  EXPECT_EQ(prefill.replicas, 3);
  EXPECT_EQ(prefill.model_path, "/models/llama/");
  EXPECT_EQ(prefill.served_model_name, "llama");
  EXPECT_EQ(prefill.image, "ghcr.io/tandem/agent:0.1");
  EXPECT_EQ(prefill.engine.block_size, 32);
  EXPECT_EQ(prefill.engine.kv_cache_memory, "8GiB");  // the agent's spelling
  EXPECT_EQ(prefill.engine.kv_dtype, "f32");
  EXPECT_EQ(prefill.engine.compute_dtype, "bf16");
  EXPECT_EQ(prefill.engine.device, "cuda");
  EXPECT_EQ(prefill.engine.max_num_seqs, 128);
  EXPECT_EQ(prefill.engine.scheduling_policy, "priority");
  EXPECT_EQ(prefill.engine.max_num_batched_tokens, 4096);
  EXPECT_EQ(prefill.engine.max_model_len, 8192);
  EXPECT_EQ(prefill.engine.max_waiting_requests, 100);
  EXPECT_EQ(prefill.engine.prefix_caching_hash, "sha256");
  EXPECT_EQ(prefill.engine.shutdown_timeout_s, 2.5);
  EXPECT_EQ(prefill.engine.threads, 4);
  EXPECT_FALSE(prefill.engine.num_blocks.has_value());
  EXPECT_EQ(prefill.kv_transfer.connector, "ucx");
  EXPECT_EQ(prefill.kv_transfer.role, "kv_producer");
  // Plain scalars keep their YAML types; quoted ones are strings.
  EXPECT_EQ(prefill.kv_transfer.extra_config,
            nlohmann::json::parse(R"({"abort_timeout_s": 60, "read_timeout_s": 2.5,
              "secret": "123", "kv_load_failure_policy": "fail",
              "nested": {"list": [1, true, null]}})"));
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", "tcp"}, {"EMPTY", ""}};
  EXPECT_EQ(prefill.env, env);
  EXPECT_EQ(prefill.extra_args, std::vector<std::string>{"--insecure-kv"});

  const PoolSpec& decode = cluster.pools[1];
  EXPECT_EQ(decode.kind, PoolKind::kDecode);
  EXPECT_EQ(decode.document, 2);
  EXPECT_EQ(decode.replicas, 0);
  EXPECT_EQ(decode.engine.num_blocks, 4096);

  const RouterSpec& router = cluster.router;
  EXPECT_EQ(router.host, "0.0.0.0");
  EXPECT_EQ(router.port, 9000);
  EXPECT_EQ(router.policy, "round_robin");
  EXPECT_EQ(router.disagg_threshold_tokens, 64);
  EXPECT_EQ(router.pull_back, false);
  EXPECT_EQ(router.max_queued_requests, 10);
  EXPECT_EQ(router.max_inflight_requests, 5);
  EXPECT_EQ(router.upstream_timeout_s, 30.0);
  EXPECT_EQ(router.max_migrations, 1);
  EXPECT_EQ(router.migration_timeout_s, 12.5);
  EXPECT_EQ(router.threads, 4);
  EXPECT_EQ(router.model_path, "/models/llama");
  EXPECT_EQ(router.poll_interval_s, 0.25);
  EXPECT_EQ(router.extra_args,
            (std::vector<std::string>{"--max-connections", "4096", "--api-key-exempt-paths", "",
                                      "--portable"}));
}

TEST(ClusterSpecTest, Defaults) {
  const ClusterSpec cluster = parseClusterSpec(documents({kPrefill, kDecode}), "c.yaml");
  ASSERT_EQ(cluster.pools.size(), 2u);
  for (const PoolSpec& pool : cluster.pools) {
    EXPECT_EQ(pool.replicas, 1);
    EXPECT_EQ(pool.served_model_name, "small");  // the directory's name, as the agent's
    EXPECT_EQ(pool.engine, EngineSpec{});
    EXPECT_EQ(pool.kv_transfer.connector, "ucx");
    EXPECT_EQ(pool.kv_transfer.role, "kv_both");
    EXPECT_TRUE(pool.kv_transfer.extra_config.empty());
  }
  EXPECT_EQ(cluster.router, RouterSpec{});
}

// Numbers in extraConfig past the double range stay text, so that the
// connector's own check names the field; they are never an exception.
TEST(ClusterSpecTest, ExtraConfigNumbersPastTheDoubleRangeStayText) {
  const std::string huge_integer(400, '9');
  const ClusterSpec spec = parseClusterSpec(
      std::string(kDecode) + "  kvTransfer:\n    extraConfig: {abort_timeout_s: 1e400, big: " +
          huge_integer + ", rate: 2.5e3, count: 7}\n",
      "c.yaml");
  const nlohmann::json& extra = spec.pools.at(0).kv_transfer.extra_config;
  EXPECT_EQ(extra.at("abort_timeout_s"), "1e400");
  EXPECT_EQ(extra.at("big"), huge_integer);
  EXPECT_EQ(extra.at("rate"), 2500.0);
  EXPECT_EQ(extra.at("count"), 7);
}

TEST(ClusterSpecTest, EmptyDocumentsAreSkippedButCounted) {
  const ClusterSpec cluster = parseClusterSpec(
      std::string("---\n") + kPrefill + "---\n---\n" + kDecode + "---\n", "c.yaml");
  ASSERT_EQ(cluster.pools.size(), 2u);
  EXPECT_EQ(cluster.pools[1].document, 3);
}

TEST(ClusterSpecTest, ErrorsNameTheDocumentFieldAndLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::string decode_spec =
      "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
      "metadata: {name: decode}\nspec:\n  model: {path: /m/small}\n";
  const std::vector<Case> cases = {
      {documents({kPrefill, decode_spec + "  engine:\n    blockSize: big\n"}),
       "c.yaml: document 2 (DecodePool \"decode\"): spec.engine.blockSize must be an integer "
       "between 1 and 1024, got \"big\" (line 15)"},  // lines count in the file
      {documents({kPrefill, decode_spec + "  engine:\n    blockSze: 16\n"}),
       "c.yaml: document 2 (DecodePool \"decode\"): spec.engine.blockSze is not a field of "
       "spec.engine (accepted: blockSize, numBlocks, "},
      {documents({decode_spec + "  replicas: -1\n"}),
       "c.yaml: document 1 (DecodePool \"decode\"): spec.replicas must be an integer between 0 "
       "and 1000, got \"-1\" (line 6)"},
      {documents({decode_spec + "  engine: {maxNumSeqs: \"64\"}\n"}),
       "spec.engine.maxNumSeqs must be a positive integer, got the string \"64\""},
      {documents({decode_spec + "  engine: {maxNumSeqs: 0}\n"}),
       "spec.engine.maxNumSeqs must be a positive integer, got \"0\""},
      {documents({decode_spec + "  engine: {kvDtype: fp8, device: cuda}\n"}),
       "spec.engine sets kvDtype fp8 and device cuda: an fp8 KV cache runs on the CPU backend "
       "only (set device cpu, or kvDtype bf16)"},
      {documents({decode_spec + "  engine: {kvDtype: fp16}\n"}),
       "spec.engine.kvDtype must be bf16, f32 or fp8, got \"fp16\""},
      {documents({decode_spec + "  engine: {schedulingPolicy: lifo}\n"}),
       "spec.engine.schedulingPolicy must be fcfs or priority, got \"lifo\""},
      {documents({decode_spec + "  engine: {computeDtype: f16}\n"}),
       "spec.engine.computeDtype must be f32 or bf16, got \"f16\""},
      {documents({decode_spec + "  engine: {device: gpu}\n"}),
       "spec.engine.device must be cpu, cuda or auto, got \"gpu\""},
      {documents({decode_spec + "  engine: {kvCacheMemory: lots}\n"}),
       "spec.engine.kvCacheMemory must be a size from 1 byte to 1PiB such as 8GiB, 8Gi, 512MiB "
       "or 1073741824, got \"lots\""},
      {documents({decode_spec + "  engine: {[1]: x}\n"}),
       "spec.engine has a key that is not a plain name (got a list)"},
      {documents({decode_spec + "  kvTransfer: {role: kv_consumer, extraConfig: {[1]: x}}\n"}),
       "spec.kvTransfer.extraConfig has a key that is not a plain name (got a list)"},
      {documents({decode_spec + "  engine: {kvCacheMemory: 1e400MiB}\n"}),
       "spec.engine.kvCacheMemory must be a size from 1 byte to 1PiB such as 8GiB, 8Gi, 512MiB "
       "or 1073741824, got \"1e400MiB\""},
      // What the agent refuses is refused here: a fraction of a byte, past 1 PiB.
      {documents({decode_spec + "  engine: {kvCacheMemory: 1.5}\n"}),
       "spec.engine.kvCacheMemory must be a size from 1 byte to 1PiB such as 8GiB, 8Gi, 512MiB "
       "or 1073741824, got \"1.5\""},
      {documents({decode_spec + "  engine: {kvCacheMemory: 2PiB}\n"}),
       "spec.engine.kvCacheMemory must be a size from 1 byte to 1PiB such as 8GiB, 8Gi, 512MiB "
       "or 1073741824, got \"2PiB\""},
      {documents({decode_spec + "  engine: {kvCacheMemory: 1GiB, numBlocks: 10}\n"}),
       "spec.engine sets both numBlocks and kvCacheMemory: set one"},
      {documents({decode_spec + "  engine: {shutdownTimeoutSeconds: -1}\n"}),
       "spec.engine.shutdownTimeoutSeconds must be a number of at least 0 and at most 86400, "
       "got \"-1\""},
      {documents({decode_spec + "  kvTransfer: {role: kv_producer}\n"}),
       "document 1 (DecodePool \"decode\"): spec.kvTransfer.role must be kv_consumer or kv_both, "
       "got \"kv_producer\""},
      {documents({std::string(kPrefill) + "  kvTransfer: {role: kv_consumer}\n", kDecode}),
       "document 1 (PrefillPool \"prefill\"): spec.kvTransfer.role must be kv_producer or "
       "kv_both, got \"kv_consumer\""},
      {documents({decode_spec + "  kvTransfer: {connector: nixl}\n"}),
       "spec.kvTransfer.connector must be ucx, storage, offload or multi, got \"nixl\""},
      {documents({decode_spec + "  kvTransfer: {extraConfig: [1]}\n"}),
       "spec.kvTransfer.extraConfig must be a mapping, got a list"},
      {documents({decode_spec + "  env: [{name: 1A}]\n"}),
       "spec.env[0].name must be letters, digits and '_', not starting with a digit, got \"1A\""},
      {documents({decode_spec + "  env: [{value: x}]\n"}), "spec.env[0].name is required"},
      {documents({decode_spec + "  env: [{name: A, value: x}, {name: B}, {name: A}]\n"}),
       "spec.env[2].name \"A\" is set already by spec.env[0]"},
      {documents({decode_spec + "  env: [{name: POD_IP, value: 10.0.0.1}]\n"}),
       "spec.env[0].name \"POD_IP\" is set by the controller (the pod's IP, for KV transfer); "
       "leave it out of spec.env"},
      {documents({decode_spec + "  kvTransfer: {secretRef: {name: kv, key: s}}\n"
                                "  env: [{name: A}, {name: TANDEM_KV_SECRET, value: x}]\n"}),
       "spec.env[1].name \"TANDEM_KV_SECRET\" is set by spec.kvTransfer.secretRef"},
      {documents({decode_spec + "  apiKeySecretRef: {name: api}\n"
                                "  env: [{name: TANDEM_API_KEY, value: x}]\n"}),
       "spec.env[0].name \"TANDEM_API_KEY\" is set by spec.apiKeySecretRef"},
      {documents({decode_spec + "  replicas: 2\n  replicas: 3\n"}),
       "c.yaml: document 1 (DecodePool \"decode\"): spec.replicas is given twice (line 7)"},
      // Free-form maps are strict too, down to their nested keys.
      {documents({decode_spec + "  kvTransfer: {extraConfig: {secret: a-secret, secret: b}}\n"}),
       "spec.kvTransfer.extraConfig.secret is given twice"},
      {documents({decode_spec +
                  "  kvTransfer: {connector: multi, extraConfig: {connectors: "
                  "[{kv_connector: ucx, kv_connector_extra_config: {a: 1, a: 2}}]}}\n"}),
       "spec.kvTransfer.extraConfig.connectors[0].kv_connector_extra_config.a is given twice"},
      // A secret that is not text would go onto the agent's command line
      // (logged, shown by ps): refused, its value unshown.
      {documents({decode_spec + "  kvTransfer: {extraConfig: {secret: 8675309867530986}}\n"}),
       "spec.kvTransfer.extraConfig.secret must be a non-empty string (quote it: YAML reads "
       "digits, true or a list as another type; the value is not shown)"},
      {documents({decode_spec +
                  "  kvTransfer: {connector: multi, extraConfig: {connectors: "
                  "[{kv_connector: ucx, kv_connector_extra_config: {secret: true}}]}}\n"}),
       "spec.kvTransfer.extraConfig.connectors[0].kv_connector_extra_config.secret must be a "
       "non-empty string"},
      // Passed in the agents' environment, a NUL ended it: the agents had
      // no secret at all.
      {documents({decode_spec + "  kvTransfer: {extraConfig: {secret: \"\\0s3cret\"}}\n"}),
       "spec.kvTransfer.extraConfig.secret must not contain a NUL character (\\0): it reaches "
       "the agents in their environment, where a NUL ends it (the value is not shown)"},
      {documents({decode_spec + "  extraArgs: [{a: b}]\n"}),
       "spec.extraArgs[0] must be a string, got a mapping"},
      {documents({decode_spec + "  resources: {limits: {cpu: [1]}}\n"}),
       "spec.resources.limits.cpu must be a quantity of at least 0 such as 1, 500m, 8Gi or 1e9, "
       "got a list"},
      {documents({decode_spec + "  resources: {requests: {memory: 8GiB}}\n"}),
       "spec.resources.requests.memory must be a quantity of at least 0 such as 1, 500m, 8Gi or "
       "1e9, got "
       "\"8GiB\""},
      // Negative amounts, which a real API server refuses in the Deployment
      // (after the Service and the budget were written).
      {documents({decode_spec + "  resources: {limits: {nvidia.com/gpu: '-1'}}\n"}),
       "spec.resources.limits.nvidia.com/gpu must be a quantity of at least 0 such as 1, 500m, "
       "8Gi or 1e9, got the string \"-1\""},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata: {name: d}\n"
                  "spec: {model: {source: hf://org/m, cache: {sizeLimit: '-40Gi'}}}\n"}),
       "spec.model.cache.sizeLimit must be a quantity of at least 0 such as 1, 500m, 8Gi or 1e9, "
       "got the string \"-40Gi\""},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata: {name: d}\n"
                  "spec: {model: {source: hf://org/m, cache: {sizeLimit: 40GiB}}}\n"}),
       "spec.model.cache.sizeLimit must be a quantity of at least 0 such as 1, 500m, 8Gi or 1e9, "
       "got "
       "\"40GiB\""},
      {documents({decode_spec + "  image: {}\n"}), "spec.image must be a non-empty string"},
      {documents({kPrefill, "apiVersion: tandem.dev/v1\nkind: DecodePool\n"}),
       "c.yaml: document 2: apiVersion must be tandem.dev/v1alpha1, got \"tandem.dev/v1\" "
       "(line 9)"},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: Pool\n"}),
       "c.yaml: document 1: kind must be PrefillPool, DecodePool or Router, got \"Pool\" "
       "(line 2)"},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nspec: {}\n"}),
       "c.yaml: document 1 (DecodePool): metadata.name is required"},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
                  "metadata: {name: Decode}\nspec: {}\n"}),
       "metadata.name must be at most 56 lowercase letters, digits and '-'"},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
                  "metadata: {name: 70b-decode}\nspec: {}\n"}),
       "starting with a letter and ending with a letter or digit (the name of its Service, a "
       "DNS-1035 label), got \"70b-decode\""},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
                  "metadata: {name: decode}\n"}),
       "c.yaml: document 1 (DecodePool \"decode\"): spec is required"},
      {documents({"apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
                  "metadata: {name: decode}\nspec: {model: {}}\n"}),
       "spec.model must set source (hf://org/name[@revision], pvc://claim[/path], oci://image) or "
       "path"},
      {documents({decode_spec + "spek: {}\n"}),
       "c.yaml: document 1 (DecodePool \"decode\"): spek is not a field of DecodePool "
       "(accepted: apiVersion, kind, metadata, spec and status) (line 6)"},
      {documents({"- 1\n"}),
       "c.yaml: document 1: must be a mapping with apiVersion, kind, metadata and spec"},
      {documents({kPrefill, std::string(kPrefill)}),
       "c.yaml: document 2 (PrefillPool \"prefill\"): metadata.name \"prefill\" is used by "
       "document 1 (PrefillPool \"prefill\") already: pool names are unique"},
      {documents({kPrefill}), "c.yaml: no DecodePool document: a cluster needs at least one"},
      {documents({kDecode, "apiVersion: tandem.dev/v1alpha1\nkind: Router\n",
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"}),
       "c.yaml: document 3 (Router): a cluster has one Router document; document 2 (Router) is "
       "one already"},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n  decode:\n"
                  "    - {name: d, host: h, port: 1}\n"}),
       "c.yaml: document 2 (Router): spec.decode lists agents, which local mode starts from the "
       "pools: remove it"},
      // Seconds past a day overflowed the router's deadlines: every call failed at once.
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {upstreamTimeoutSeconds: 1e10}\n"}),
       "spec.upstreamTimeoutSeconds must be a number greater than 0 and at most 86400, got "
       "\"1e10\""},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {pollIntervalSeconds: 86400.5}\n"}),
       "spec.pollIntervalSeconds must be a number greater than 0 and at most 86400, got "
       "\"86400.5\""},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {itlTargetMs: 1e20}\n"}),
       "spec.itlTargetMs must be a number greater than 0 and at most 86400000, got \"1e20\""},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {disaggThresholdTokens: 99999999999999999999}\n"}),
       "spec.disaggThresholdTokens must be a non-negative integer (at most 9223372036854775807), "
       "got \"99999999999999999999\""},
      {documents({kDecode, "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec: {policy: lru}\n"}),
       "document 2 (Router): spec.policy must be kv, round_robin, random, dynamo, llm_d or sglang, "
       "got \"lru\""},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {extraArgs: [--max-connections, \"9\", --shutdown-timeout=600]}\n"}),
       "document 2 (Router): spec.extraArgs[2] gives --shutdown-timeout, which Tandem sets "
       "itself: set spec.shutdownTimeoutSeconds (the pod's termination grace period follows it)"},
      {documents(
           {kDecode,
            "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec: {extraArgs: [--port, \"9\"]}\n"}),
       "document 2 (Router): spec.extraArgs[0] gives --port, which Tandem sets itself"},
      {documents(
           {decode_spec + "  extraArgs: [--max-num-seqs, \"8\", \"--kv-transfer-config={}\"]\n"}),
       "spec.extraArgs[2] gives --kv-transfer-config, which Tandem sets itself: set "
       "spec.kvTransfer"},
      {documents({decode_spec + "  extraArgs: [--port, \"9\"]\n"}),
       "spec.extraArgs[0] gives --port, which Tandem sets itself"},
      {documents({decode_spec + "  extraArgs: [--api-key=k]\n"}),
       "spec.extraArgs[0] gives --api-key, which Tandem sets itself: set spec.apiKeySecretRef (a "
       "key on the command line shows in ps)"},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {extraArgs: [--decode, \"10.0.0.1:8000\"]}\n"}),
       "document 2 (Router): spec.extraArgs[0] gives --decode, which Tandem sets itself: the "
       "router finds its agents by discovery"},
      {documents(
           {kDecode, "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec: {extraArgs: x}\n"}),
       "document 2 (Router): spec.extraArgs must be a list, got \"x\""},
      {documents({kDecode, "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec: {port: 70000}\n"}),
       "spec.port must be an integer between 0 and 65535, got \"70000\""},
      {documents({kDecode,
                  "apiVersion: tandem.dev/v1alpha1\nkind: Router\n"
                  "spec: {pullBack: maybe}\n"}),
       "spec.pullBack must be true or false, got \"maybe\""},
      {documents({kPrefill, decode_spec + "  engine: {blockSize: 32}\n"}),
       "c.yaml: document 2 (DecodePool \"decode\"): spec.engine.blockSize \"32\" differs from "
       "\"16\" in document 1 (PrefillPool \"prefill\"): KV blocks move between pools of the same "
       "block size only"},
      {documents({kPrefill,
                  "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
                  "metadata: {name: decode}\nspec:\n  model: {path: /m/big}\n"}),
       "spec.model.name \"big\" differs from \"small\" in document 1 (PrefillPool \"prefill\"): "
       "the pools of one cluster serve one model"},
      {documents({kPrefill, decode_spec + "  engine: {kvDtype: f32}\n"}),
       "spec.engine.kvDtype \"f32\" differs from \"bf16\""},
      {documents({kPrefill, decode_spec + "  engine: {kvDtype: fp8}\n"}),
       "spec.engine.kvDtype \"fp8\" differs from \"bf16\""},
      {documents({kPrefill, decode_spec + "  engine: {schedulingPolicy: priority}\n"}),
       "spec.engine.schedulingPolicy \"priority\" differs from \"fcfs\" in document 1 "
       "(PrefillPool \"prefill\"): a request's priority is read by its prefill agent and its "
       "decode agent alike"},
      {documents({kPrefill, decode_spec + "  engine: {computeDtype: bf16}\n"}),
       "spec.engine.computeDtype \"bf16\" differs from \"auto\""},
      {"apiVersion: [\n", "c.yaml: not valid YAML: "},
  };
  for (const Case& c : cases) {
    const std::string message = errorFor(c.text);
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "expected \"" << c.message << "\"\n got \"" << message << "\"\n for:\n"
        << c.text;
  }
}

// yaml-cpp's LoadAll alone never returns on a ',' where a document should
// start: it yields empty documents forever and grows until memory runs out.
// Each parse runs in a child process with bounded memory (outside sanitizer
// builds, which reserve more address space than the bound), so that a
// regression fails instead of exhausting the machine. Exit code 0: refused
// with the expected message.
int refuseInBoundedMemory(const std::string& text) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  const rlimit limit{1UL << 30, 1UL << 30};
  ::setrlimit(RLIMIT_AS, &limit);
#endif
  const std::string message = errorFor(text);
  return message.find(
             "c.yaml: not valid YAML: unexpected ',' where a document should start "
             "(line ") == 0
             ? 0
             : 1;
}

TEST(ClusterSpecTest, StreamThatStopsAdvancingIsRefused) {
  const std::string cases[] = {",", std::string(kPrefill) + "---\n,\n"};
  for (const std::string& text : cases) {
    EXPECT_EXIT(std::exit(refuseInBoundedMemory(text)), ::testing::ExitedWithCode(0), "") << text;
  }
}

TEST(ClusterSpecTest, RouterFile) {
  const RouterSpec router = parseRouterSpec(R"(apiVersion: tandem.dev/v1alpha1
kind: Router
spec:
  port: 0
  prefill:
    - {name: p0, host: 10.0.0.1, port: 8001}
  decode:
    - {name: d0, host: 10.0.0.2, port: 8002}
    - {name: d1, host: 10.0.0.3, port: 8003}
)",
                                            "router.yaml");
  EXPECT_EQ(router.port, 0);
  EXPECT_EQ(router.prefill, (std::vector<AgentAddress>{{"p0", "10.0.0.1", 8001}}));
  EXPECT_EQ(router.decode,
            (std::vector<AgentAddress>{{"d0", "10.0.0.2", 8002}, {"d1", "10.0.0.3", 8003}}));

  try {
    parseRouterSpec(kDecode, "router.yaml");
    FAIL() << "a pool in a router file was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "router.yaml: document 1 (DecodePool \"decode\"): a router file holds one Router "
                 "document; pools are for `tandem-operator local -f`");
  }
  try {
    parseRouterSpec(
        "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n  decode:\n"
        "    - {name: d0, host: h, port: 0}\n",
        "router.yaml");
    FAIL() << "port 0 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "router.yaml: document 1 (Router): spec.decode[0].port must be an integer "
                 "between 1 and 65535, got \"0\" (line 5)");
  }
}

TEST(ClusterSpecTest, AgentAddresses) {
  EXPECT_EQ(parseAgentAddress("p=10.0.0.1:8001", "prefill-0", "--prefill"),
            (AgentAddress{"p", "10.0.0.1", 8001}));
  EXPECT_EQ(parseAgentAddress("localhost:8001", "prefill-3", "--prefill"),
            (AgentAddress{"prefill-3", "localhost", 8001}));
  EXPECT_EQ(parseAgentAddress("d=[::1]:9", "decode-0", "--decode"), (AgentAddress{"d", "::1", 9}));
  for (const char* bad :
       {"host", "host:", ":80", "host:0", "host:x", "host:80x", "=host:80", "host:70000"}) {
    try {
      parseAgentAddress(bad, "decode-0", "--decode");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--decode must be NAME=HOST:PORT or HOST:PORT with a port between 1 "
                            "and 65535, got \"") +
                    bad + "\"");
    }
  }
}

TEST(ClusterSpecTest, ExampleFilesParse) {
  for (const char* name : {"cluster.yaml", "cluster-2p2d.yaml"}) {
    const ClusterSpec cluster = loadClusterSpec(fs::path(TANDEM_SOURCE_DIR) / "examples" / name);
    EXPECT_EQ(cluster.router.port, 8000) << name;
    int64_t prefill = 0;
    int64_t decode = 0;
    for (const PoolSpec& pool : cluster.pools) {
      EXPECT_EQ(pool.model_path, "models/small") << name;
      (pool.kind == PoolKind::kPrefill ? prefill : decode) += pool.replicas;
    }
    const int64_t expected = std::string(name) == "cluster.yaml" ? 1 : 2;
    EXPECT_EQ(prefill, expected) << name;
    EXPECT_EQ(decode, expected) << name;
  }
}

// Field paths under `schema` (a CRD's spec schema), as poolSpecFieldPaths()
// writes them: "engine.blockSize", list items' fields as "env[].name".
void collectSchemaPaths(const YAML::Node& schema, const std::string& prefix,
                        std::set<std::string>& paths) {
  for (const auto& property : schema["properties"]) {
    const std::string path = prefix + property.first.as<std::string>();
    paths.insert(path);
    const YAML::Node& child = property.second;
    if (child["properties"]) collectSchemaPaths(child, path + ".", paths);
    if (child["items"] && child["items"]["properties"]) {
      collectSchemaPaths(child["items"], path + "[].", paths);
    }
  }
}

TEST(ClusterSpecTest, CrdsMatchTheParser) {
  struct Crd {
    const char* file;
    const char* kind;
    const char* plural;
    std::vector<std::string> roles;
    PoolKind pool_kind;
  };
  for (const Crd& crd : {Crd{"prefillpools.tandem.dev.yaml",
                             "PrefillPool",
                             "prefillpools",
                             {"kv_producer", "kv_both"},
                             PoolKind::kPrefill},
                         Crd{"decodepools.tandem.dev.yaml",
                             "DecodePool",
                             "decodepools",
                             {"kv_consumer", "kv_both"},
                             PoolKind::kDecode}}) {
    SCOPED_TRACE(crd.file);
    const std::vector<std::string> parser_fields = poolSpecFieldPaths(crd.pool_kind);
    const std::set<std::string> parser_paths(parser_fields.begin(), parser_fields.end());
    const YAML::Node root = YAML::LoadFile(fs::path(TANDEM_SOURCE_DIR) / "crds" / crd.file);
    EXPECT_EQ(root["apiVersion"].as<std::string>(), "apiextensions.k8s.io/v1");
    EXPECT_EQ(root["kind"].as<std::string>(), "CustomResourceDefinition");
    EXPECT_EQ(root["metadata"]["name"].as<std::string>(), std::string(crd.plural) + ".tandem.dev");
    const YAML::Node spec = root["spec"];
    EXPECT_EQ(spec["group"].as<std::string>(), "tandem.dev");
    EXPECT_EQ(spec["names"]["kind"].as<std::string>(), crd.kind);
    EXPECT_EQ(spec["names"]["plural"].as<std::string>(), crd.plural);
    ASSERT_EQ(spec["versions"].size(), 1u);
    const YAML::Node version = spec["versions"][0];
    EXPECT_EQ(std::string(kApiVersion), "tandem.dev/" + version["name"].as<std::string>());
    EXPECT_TRUE(version["served"].as<bool>());
    EXPECT_TRUE(version["storage"].as<bool>());
    EXPECT_TRUE(version["subresources"]["status"].IsMap());
    EXPECT_EQ(version["subresources"]["scale"]["specReplicasPath"].as<std::string>(),
              ".spec.replicas");
    EXPECT_EQ(version["subresources"]["scale"]["statusReplicasPath"].as<std::string>(),
              ".status.replicas");
    EXPECT_GE(version["additionalPrinterColumns"].size(), 4u);

    const YAML::Node schema = version["schema"]["openAPIV3Schema"];
    const YAML::Node spec_schema = schema["properties"]["spec"];
    std::set<std::string> crd_paths;
    collectSchemaPaths(spec_schema, "", crd_paths);
    EXPECT_EQ(crd_paths, parser_paths);
    EXPECT_EQ(spec_schema["properties"]["kvTransfer"]["properties"]["role"]["enum"]
                  .as<std::vector<std::string>>(),
              crd.roles);
    const YAML::Node status = schema["properties"]["status"]["properties"];
    for (const char* field :
         {"replicas", "readyReplicas", "conditions", "observedGeneration", "selector"}) {
      EXPECT_TRUE(status[field]) << "status." << field;
    }
  }
}

TEST(ClusterSpecTest, RouterCrdMatchesTheParser) {
  const std::vector<std::string> parser_fields = routerSpecFieldPaths();
  const std::set<std::string> parser_paths(parser_fields.begin(), parser_fields.end());
  const YAML::Node root =
      YAML::LoadFile(fs::path(TANDEM_SOURCE_DIR) / "crds" / "routers.tandem.dev.yaml");
  EXPECT_EQ(root["metadata"]["name"].as<std::string>(), "routers.tandem.dev");
  const YAML::Node spec = root["spec"];
  EXPECT_EQ(spec["names"]["kind"].as<std::string>(), "Router");
  EXPECT_EQ(spec["names"]["categories"][0].as<std::string>(), "tandem");
  const YAML::Node version = spec["versions"][0];
  EXPECT_EQ(std::string(kApiVersion), "tandem.dev/" + version["name"].as<std::string>());
  EXPECT_TRUE(version["subresources"]["status"].IsMap());
  const YAML::Node schema = version["schema"]["openAPIV3Schema"];
  std::set<std::string> crd_paths;
  collectSchemaPaths(schema["properties"]["spec"], "", crd_paths);
  EXPECT_EQ(crd_paths, parser_paths);
  const YAML::Node status = schema["properties"]["status"]["properties"];
  for (const char* field : {"replicas", "readyReplicas", "updatedReplicas", "conditions",
                            "observedGeneration", "selector"}) {
    EXPECT_TRUE(status[field]) << "status." << field;
  }
}

TEST(ClusterSpecTest, AutoscalingIsReadForEachKind) {
  const ClusterSpec cluster = parseClusterSpec(
      documents({std::string(kPrefill) +
                     "  autoscaling:\n    minReplicas: 2\n    maxReplicas: 6\n"
                     "    targetTTFTSeconds: 0.5\n    targetQueuedPrefillTokensPerReplica: 4096\n"
                     "    quantile: 0.95\n    windowSeconds: 30\n"
                     "    scaleUpStabilizationSeconds: 5\n    scaleDownStabilizationSeconds: 60\n"
                     "    maxStep: 2\n    pendingTimeoutSeconds: 120\n",
                 std::string(kDecode) +
                     "  autoscaling: {maxReplicas: 4, targetITLSeconds: 0.04, "
                     "targetKVCacheUsage: 0.8, targetRunningSequencesPerReplica: 32}\n"}),
      "c.yaml");
  ASSERT_EQ(cluster.pools.size(), 2u);
  ASSERT_TRUE(cluster.pools[0].autoscaling);
  const planner::AutoscalingSpec& prefill = cluster.pools[0].autoscaling->spec;
  EXPECT_EQ(prefill.min_replicas, 2);
  EXPECT_EQ(prefill.max_replicas, 6);
  EXPECT_EQ(prefill.target_ttft_seconds, 0.5);
  EXPECT_FALSE(prefill.target_itl_seconds);
  EXPECT_EQ(prefill.target_queued_prefill_tokens_per_replica, 4096);
  EXPECT_EQ(prefill.quantile, 0.95);
  EXPECT_EQ(prefill.window_seconds, 30);
  EXPECT_EQ(prefill.scale_up_stabilization_seconds, 5);
  EXPECT_EQ(prefill.scale_down_stabilization_seconds, 60);
  EXPECT_EQ(prefill.max_step, 2);
  EXPECT_EQ(prefill.pending_timeout_seconds, 120);
  ASSERT_TRUE(cluster.pools[1].autoscaling);
  const planner::AutoscalingSpec& decode = cluster.pools[1].autoscaling->spec;
  EXPECT_EQ(decode.target_itl_seconds, 0.04);
  EXPECT_EQ(decode.target_kv_cache_usage, 0.8);
  EXPECT_EQ(decode.target_running_sequences_per_replica, 32);
  // The defaults (docs/planner.md).
  EXPECT_EQ(decode.min_replicas, 1);
  EXPECT_EQ(decode.max_replicas, 4);
  EXPECT_EQ(decode.quantile, 0.9);
  EXPECT_EQ(decode.window_seconds, 60);
  EXPECT_EQ(decode.scale_up_stabilization_seconds, 0);
  EXPECT_EQ(decode.scale_down_stabilization_seconds, 300);
  EXPECT_EQ(decode.max_step, 4);
  EXPECT_EQ(decode.pending_timeout_seconds, 300);

  // Without the field there is no planner; a reload compares what was written.
  EXPECT_FALSE(parseClusterSpec(kDecode, "c.yaml").pools[0].autoscaling);
  const auto decodeWith = [](const std::string& autoscaling) {
    return parseClusterSpec(std::string(kDecode) + "  autoscaling: " + autoscaling + "\n", "c.yaml")
        .pools[0];
  };
  EXPECT_EQ(decodeWith("{maxReplicas: 4, targetITLSeconds: 0.04}"),
            decodeWith("{targetITLSeconds: 0.04, maxReplicas: 4}"));
  EXPECT_NE(decodeWith("{maxReplicas: 4, targetITLSeconds: 0.04}"),
            decodeWith("{maxReplicas: 5, targetITLSeconds: 0.04}"));
}

TEST(ClusterSpecTest, AutoscalingErrorsNameTheField) {
  const std::string where = "c.yaml: document 1 (DecodePool \"decode\"): ";
  const std::string prefill_where = "c.yaml: document 1 (PrefillPool \"prefill\"): ";
  // The field's line: kDecode has 7 lines, "  autoscaling:" is line 8.
  auto decode = [](const std::string& fields) {
    return std::string(kDecode) + "  autoscaling:\n    targetITLSeconds: 0.04\n" + fields;
  };
  auto prefill = [](const std::string& fields) {
    return std::string(kPrefill) + "  autoscaling:\n    targetTTFTSeconds: 0.5\n" + fields;
  };
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {decode("    maxReplicas: 4\n    quantile: 1.5\n"),
       where + "spec.autoscaling.quantile must be a number above 0 and below 1, got 1.5 (line 11)"},
      {decode("    maxReplicas: 4\n    quantile: high\n"),
       where + "spec.autoscaling.quantile must be a number above 0 and below 1, got \"high\" "
               "(line 11)"},
      {decode("    maxReplicas: 0\n"),
       where + "spec.autoscaling.maxReplicas must be an integer between 1 and 1000, got 0 "
               "(line 10)"},
      {decode("    maxReplicas: 2.5\n"),
       where + "spec.autoscaling.maxReplicas must be an integer between 1 and 1000, got 2.5 "
               "(line 10)"},
      {decode("    minReplicas: 0\n    maxReplicas: 4\n"),
       where + "spec.autoscaling.minReplicas must be an integer between 1 and 1000, got 0 "
               "(line 10)"},
      {decode("    minReplicas: 5\n    maxReplicas: 4\n"),
       where + "spec.autoscaling.maxReplicas must be at least minReplicas (5), got 4 (line 11)"},
      {decode(""),
       where + "spec.autoscaling.maxReplicas is required (an integer between minReplicas and "
               "1000) (line 9)"},
      {std::string(kDecode) + "  autoscaling:\n    maxReplicas: 4\n",
       where + "spec.autoscaling.targetITLSeconds is required on a DecodePool (a number of "
               "seconds above 0 and up to 3600) (line 9)"},
      {std::string(kDecode) + "  autoscaling:\n    maxReplicas: 4\n    targetITLSeconds: 0\n",
       where + "spec.autoscaling.targetITLSeconds must be a number above 0 and up to 3600, got 0"},
      {decode("    maxReplicas: 4\n    targetITLSeconds: 0.1\n"),
       where + "spec.autoscaling.targetITLSeconds is given twice (line 11)"},
      {decode("    maxReplicas: 4\n    targetKVCacheUsage: 1.2\n"),
       where + "spec.autoscaling.targetKVCacheUsage must be a number above 0 and up to 1, got "
               "1.2 (line 11)"},
      {decode("    maxReplicas: 4\n    targetRunningSequencesPerReplica: -1\n"),
       where + "spec.autoscaling.targetRunningSequencesPerReplica must be a number above 0 and "
               "up to 1e+06, got -1 (line 11)"},
      {decode("    maxReplicas: 4\n    windowSeconds: 0.5\n"),
       where + "spec.autoscaling.windowSeconds must be a number from 1 to 3600, got 0.5 (line 11)"},
      {decode("    maxReplicas: 4\n    scaleUpStabilizationSeconds: -1\n"),
       where + "spec.autoscaling.scaleUpStabilizationSeconds must be a number from 0 to 3600, "
               "got -1 (line 11)"},
      {decode("    maxReplicas: 4\n    scaleDownStabilizationSeconds: 4000\n"),
       where + "spec.autoscaling.scaleDownStabilizationSeconds must be a number from 0 to 3600, "
               "got 4000 (line 11)"},
      {decode("    maxReplicas: 4\n    maxStep: 0\n"),
       where + "spec.autoscaling.maxStep must be an integer between 1 and 1000, got 0 (line 11)"},
      {decode("    maxReplicas: 4\n    pendingTimeoutSeconds: 0\n"),
       where + "spec.autoscaling.pendingTimeoutSeconds must be a number from 1 to 86400, got 0 "
               "(line 11)"},
      {decode("    maxReplicas: 4\n    targetTTFTSeconds: 1\n"),
       where + "spec.autoscaling.targetTTFTSeconds applies to PrefillPools only; a decode pool "
               "accepts: minReplicas, maxReplicas, targetITLSeconds, "},
      {prefill("    maxReplicas: 4\n    targetITLSeconds: 1\n"),
       prefill_where + "spec.autoscaling.targetITLSeconds applies to DecodePools only; a "
                       "prefill pool accepts: minReplicas, maxReplicas, targetTTFTSeconds, "},
      {prefill("    maxReplicas: 4\n    targetKVCacheUsage: 0.5\n"),
       prefill_where + "spec.autoscaling.targetKVCacheUsage applies to DecodePools only"},
      {prefill("    maxReplicas: 4\n    targetQueuedPrefillTokensPerReplica: 0\n"),
       prefill_where + "spec.autoscaling.targetQueuedPrefillTokensPerReplica must be a number "
                       "above 0 and up to 1e+09, got 0 (line 11)"},
      {decode("    maxReplicas: 4\n    maxReplica: 4\n"),
       where + "spec.autoscaling.maxReplica is not a field of spec.autoscaling; accepted: "
               "minReplicas, maxReplicas, targetITLSeconds, "},
      {std::string(kDecode) + "  autoscaling: 3\n", where + "spec.autoscaling must be a mapping"},
      {std::string(kDecode) + "  autoscaling: {[1]: x}\n",
       where + "spec.autoscaling has a key that is not a plain name (got a list)"},
  };
  for (const Case& c : cases) {
    const std::string message = errorFor(c.text);
    EXPECT_TRUE(message.starts_with(c.message))
        << "got:    " << message << "\nwanted: " << c.message;
  }
}

TEST(ClusterSpecTest, PoolCrdsDeclareTheKubernetesStatus) {
  for (const char* file : {"prefillpools.tandem.dev.yaml", "decodepools.tandem.dev.yaml"}) {
    const YAML::Node version =
        YAML::LoadFile(fs::path(TANDEM_SOURCE_DIR) / "crds" / file)["spec"]["versions"][0];
    EXPECT_TRUE(version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
                       ["updatedReplicas"])
        << file;
    bool ready_column = false;
    for (const auto& column : version["additionalPrinterColumns"]) {
      if (column["jsonPath"].as<std::string>().find("@.type==\"Ready\"") != std::string::npos) {
        ready_column = true;
      }
      EXPECT_EQ(column["jsonPath"].as<std::string>().find("Available"), std::string::npos);
    }
    EXPECT_TRUE(ready_column) << file;
  }
}

// spec.model.source: a Hub repository, a claim or an image in place of a
// path, with the fields each kind takes, and the served name each implies.
// The GPU-cluster quick start's pools (docs/kubernetes.md).
TEST(ClusterSpecTest, GpuClusterExampleReadsItsHubSourceAndTemplate) {
  const ClusterSpec cluster = loadClusterSpec(fs::path(TANDEM_SOURCE_DIR) / "examples" /
                                              "kubernetes-gpu" / "llama-hf.yaml");
  ASSERT_EQ(cluster.pools.size(), 2u);
  for (const PoolSpec& pool : cluster.pools) {
    ASSERT_TRUE(pool.model_source.has_value()) << pool.name;
    EXPECT_EQ(pool.model_source->source.text, "hf://meta-llama/Llama-3.1-8B-Instruct");
    EXPECT_EQ(pool.model_source->token_secret_ref, (SecretKeyRef{"hf-token", "HF_TOKEN"}));
    EXPECT_EQ(pool.model_source->cache_claim, "hf-cache");
    EXPECT_EQ(pool.served_model_name, "meta-llama/Llama-3.1-8B-Instruct");
    EXPECT_EQ(pool.pod_template["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
  }
  EXPECT_FALSE(cluster.router.model_path.has_value());
}

TEST(ClusterSpecTest, QuantitiesAreReadAsTheApiServerParsesThem) {
  for (const char* good : {"1", "0.5", ".5", "5.", "-2", "+3", "500m", "8Gi", "1e3", "2E-2", "10Ki",
                           "1.5T", "100n", "3u"}) {
    EXPECT_TRUE(isQuantity(good)) << good;
  }
  for (const char* bad : {"", "8GiB", "lots", "1e", "Gi", "1 Gi", "1.2.3", "8gi", "1Ki2", "e3"}) {
    EXPECT_FALSE(isQuantity(bad)) << bad;
  }
}

// The scanners that replaced std::regex (whose matching recursed once per
// character) accept exactly what the patterns did: every string of up to
// four characters of the alphabet the patterns care about.
TEST(ClusterSpecTest, ScannersAcceptWhatThePatternsDid) {
  const std::regex quantity(
      R"([+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?)");
  const std::regex integer("[-+]?[0-9]+");
  const std::regex number(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  const std::regex size(
      R"(([0-9]+(\.[0-9]+)?([eE][0-9]+)?)(B|K|M|G|T|P|KB|MB|GB|TB|PB|KiB|MiB|GiB|TiB|PiB|Ki|Mi|Gi|Ti|Pi)?)");
  const std::string alphabet = "07.eE+-KiMGB";
  int64_t strings = 0;
  std::string text;
  std::function<void(size_t)> each = [&](size_t length) {
    if (text.size() == length) {
      ++strings;
      EXPECT_EQ(isQuantity(text), std::regex_match(text, quantity)) << text;
      EXPECT_EQ(isDecimalInteger(text), std::regex_match(text, integer)) << text;
      EXPECT_EQ(scanDecimal(text, 0, DecimalForm{}) == text.size(), std::regex_match(text, number))
          << text;
      // A size is also a whole number of bytes from 1 to 1 PiB, which no
      // pattern says: what is read matches the pattern.
      if (byteSizeOf(text)) {
        EXPECT_TRUE(std::regex_match(text, size)) << text;
      }
      return;
    }
    for (char c : alphabet) {
      text.push_back(c);
      each(length);
      text.pop_back();
    }
  };
  for (size_t length = 0; length <= 4; ++length) each(length);
  EXPECT_EQ(strings, 1 + 12 + 144 + 1728 + 20736);
}

// A CRD pattern without maxLength lets a real API server store values of
// any length; the controller reads them like any other (it crashed here,
// in std::regex, on a 200,000-digit cpu limit).
TEST(ClusterSpecTest, ValuesHundredsOfKilobytesLongAreReadLikeShortOnes) {
  const std::string digits(200000, '1');
  const std::string name(100000, 'A');
  const ClusterSpec spec =
      parseClusterSpec(std::string(kDecode) + "  resources:\n    limits:\n      cpu: \"" + digits +
                           "\"\n  env:\n    - name: " + name + "\n      value: x\n",
                       "c.yaml");
  ASSERT_EQ(spec.pools.size(), 1u);
  ASSERT_EQ(spec.pools[0].env.size(), 1u);
  EXPECT_EQ(spec.pools[0].env[0].first, name);
  EXPECT_NE(errorFor(std::string(kDecode) + "  engine:\n    kvCacheMemory: \"" + digits + "\"\n")
                .find("spec.engine.kvCacheMemory must be a size from 1 byte to 1PiB"),
            std::string::npos);
  EXPECT_NE(errorFor(std::string(kDecode) + "  env:\n    - name: " + name + "-\n      value: x\n")
                .find("spec.env[0].name must be letters, digits and '_'"),
            std::string::npos);
}

TEST(ClusterSpecTest, ModelSourcesAreReadWithTheFieldsTheirKindTakes) {
  auto decodeWith = [](const std::string& model) {
    return std::string(
               "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata:\n"
               "  name: decode\nspec:\n  model: ") +
           model + "\n";
  };
  const PoolSpec hub =
      parseClusterSpec(decodeWith("{source: hf://org/m@v1, tokenSecretRef: {name: hf, key: t}, "
                                  "endpoint: http://mirror:8080, cache: {claimName: c, "
                                  "sizeLimit: 10Gi}}"),
                       "c.yaml")
          .pools.at(0);
  ASSERT_TRUE(hub.model_source.has_value());
  EXPECT_EQ(hub.model_source->source.repo, "org/m");
  EXPECT_EQ(hub.model_source->source.revision, "v1");
  EXPECT_EQ(hub.model_source->token_secret_ref, (SecretKeyRef{"hf", "t"}));
  EXPECT_EQ(hub.model_source->endpoint, "http://mirror:8080");
  EXPECT_EQ(hub.model_source->cache_claim, "c");
  EXPECT_EQ(hub.model_source->cache_size_limit, "10Gi");
  EXPECT_EQ(hub.model_path, "");
  EXPECT_EQ(hub.served_model_name, "org/m");
  EXPECT_EQ(parseClusterSpec(decodeWith("{source: hf://m, tokenSecretRef: {name: hf}}"), "c.yaml")
                .pools.at(0)
                .model_source->token_secret_ref->key,
            "HF_TOKEN");
  EXPECT_EQ(parseClusterSpec(decodeWith("{source: oci://r/x/tiny:2, name: t}"), "c.yaml")
                .pools.at(0)
                .served_model_name,
            "t");
  const PoolSpec plain = parseClusterSpec(decodeWith("{source: /models/x/}"), "c.yaml").pools.at(0);
  EXPECT_FALSE(plain.model_source.has_value());
  EXPECT_EQ(plain.model_path, "/models/x/");
  EXPECT_EQ(plain.served_model_name, "x");

  const std::string where = "c.yaml: document 1 (DecodePool \"decode\"): ";
  EXPECT_EQ(errorFor(decodeWith("{path: /m, source: hf://o/m}")),
            where + "spec.model sets both path and source: give one (line 6)");
  EXPECT_EQ(errorFor(decodeWith("{name: m}")),
            where +
                "spec.model must set source (hf://org/name[@revision], pvc://claim[/path], "
                "oci://image) or path (line 6)");
  EXPECT_EQ(errorFor(decodeWith("{source: s3://b/m}")),
            where +
                "spec.model.source model source \"s3://b/m\" is not valid: accepted schemes are "
                "hf://, pvc:// and oci://, or a plain path (line 6)");
  EXPECT_EQ(errorFor(decodeWith("{source: pvc://c, tokenSecretRef: {name: s}}")),
            where + "spec.model.tokenSecretRef is for hf:// sources only (line 6)");
  EXPECT_EQ(errorFor(decodeWith("{source: hf://o/m, imageMount: Copy}")),
            where + "spec.model.imageMount is for oci:// sources only (line 6)");
  EXPECT_EQ(errorFor(decodeWith("{source: pvc://c, volume: {hostPath: {path: /m}}}")),
            where +
                "spec.model.volume is for a path; a pvc:// source names its claim, an hf:// "
                "source its cache (line 6)");
  EXPECT_EQ(
      errorFor(decodeWith("{source: hf://o/m, endpoint: mirror}")),
      where + "spec.model.endpoint must be an http:// or https:// URL, got \"mirror\" (line 6)");
}

// Names of Secrets and claims, and Secret keys, are what the API server
// accepts (the CRDs' patterns say the same to `kubectl apply`): a pool
// naming another would never find its Secret or claim.
TEST(ClusterSpecTest, SecretAndClaimNamesAreKubernetesNames) {
  auto decodeWith = [](const std::string& spec) {
    return std::string(
               "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata:\n"
               "  name: decode\nspec:\n") +
           spec;
  };
  const std::string where = "c.yaml: document 1 (DecodePool \"decode\"): ";
  const std::string name_rule =
      " must be a Kubernetes object name (a DNS-1123 subdomain: lower-case letters, digits, '-' "
      "and '.', starting and ending with a letter or digit, at most 253 characters), got ";
  EXPECT_EQ(errorFor(decodeWith("  model: {source: hf://o/m, tokenSecretRef: {name: HF_Token}}\n")),
            where + "spec.model.tokenSecretRef.name" + name_rule + "\"HF_Token\" (line 6)");
  EXPECT_EQ(errorFor(decodeWith("  model: {source: hf://o/m, cache: {claimName: cache.}}\n")),
            where + "spec.model.cache.claimName" + name_rule + "\"cache.\" (line 6)");
  EXPECT_EQ(errorFor(decodeWith("  model: {path: /m, volume: {persistentVolumeClaim: {claimName: "
                                "-models}}}\n")),
            where + "spec.model.volume.persistentVolumeClaim.claimName" + name_rule +
                "\"-models\" (line 6)");
  EXPECT_EQ(errorFor(decodeWith("  model: {path: /m}\n  kvTransfer: {secretRef: {name: kv, key: "
                                "\"a/b\"}}\n")),
            where +
                "spec.kvTransfer.secretRef.key must be a Secret key (letters, digits, '-', '_' "
                "and '.', at most 253 characters, not \".\" or starting with \"..\"), got the "
                "string \"a/b\" (line 7)");
  for (const char* key : {"\".\"", "\"..\"", "..data"}) {
    EXPECT_NE(errorFor(decodeWith("  model: {source: hf://o/m, tokenSecretRef: {name: hf, key: " +
                                  std::string(key) + "}}\n"))
                  .find("spec.model.tokenSecretRef.key must be a Secret key"),
              std::string::npos)
        << key;
  }
  EXPECT_EQ(errorFor(decodeWith(
                "  model: {path: /m}\n  apiKeySecretRef: {name: " + std::string(254, 'a') + "}\n")),
            where + "spec.apiKeySecretRef.name" + name_rule + "\"" + std::string(254, 'a') +
                "\" (line 7)");
  // What the API server accepts is accepted.
  const PoolSpec pool =
      parseClusterSpec(decodeWith("  model: {source: hf://o/m, tokenSecretRef: {name: hf.tokens-1, "
                                  "key: HF_TOKEN.v2}, cache: {claimName: models}}\n"),
                       "c.yaml")
          .pools.at(0);
  EXPECT_EQ(pool.model_source->token_secret_ref->name, "hf.tokens-1");
  EXPECT_EQ(pool.model_source->token_secret_ref->key, "HF_TOKEN.v2");
}

TEST(ClusterSpecTest, KubernetesOnlyPoolFieldsAreRead) {
  const ClusterSpec cluster = parseClusterSpec(documents({R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata:
  name: decode
spec:
  model:
    path: /models/small
    volume:
      persistentVolumeClaim: {claimName: models, readOnly: false}
      subPath: small
  resources:
    limits: {nvidia.com/gpu: 1}
  kvTransfer:
    secretRef: {name: kv, key: secret}
)"}),
                                               "c.yaml");
  const PoolSpec& pool = cluster.pools.at(0);
  ASSERT_TRUE(pool.model_volume.has_value());
  EXPECT_EQ(pool.model_volume->claim_name, "models");
  EXPECT_FALSE(pool.model_volume->claim_read_only);
  EXPECT_EQ(pool.model_volume->sub_path, "small");
  EXPECT_EQ(pool.resources, nlohmann::json::parse(R"({"limits":{"nvidia.com/gpu":1}})"));
  ASSERT_TRUE(pool.kv_transfer.secret_ref.has_value());
  EXPECT_EQ(pool.kv_transfer.secret_ref->name, "kv");
  EXPECT_EQ(pool.kv_transfer.secret_ref->key, "secret");

  const std::string both = errorFor(documents({R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode}
spec:
  model:
    path: /m
    volume: {hostPath: {path: /a}, persistentVolumeClaim: {claimName: b}}
)"}));
  EXPECT_NE(both.find("spec.model.volume must set one of persistentVolumeClaim and hostPath"),
            std::string::npos)
      << both;
}

TEST(ClusterSpecTest, DisruptionBudgetTakesOneBoundAsANumberOrAPercentage) {
  const std::string decode =
      "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata: {name: decode}\n"
      "spec:\n  model: {path: /m}\n";
  EXPECT_EQ(parseClusterSpec(documents({decode}), "c.yaml").pools.at(0).disruption_budget,
            DisruptionBudgetSpec{});
  const DisruptionBudgetSpec percent =
      parseClusterSpec(documents({decode + "  disruptionBudget: {minAvailable: \"75%\"}\n"}),
                       "c.yaml")
          .pools.at(0)
          .disruption_budget;
  EXPECT_EQ(percent.min_available, "75%");
  EXPECT_TRUE(percent.max_unavailable.is_null());
  const DisruptionBudgetSpec number =
      parseClusterSpec(documents({decode + "  disruptionBudget: {maxUnavailable: 2}\n"}), "c.yaml")
          .pools.at(0)
          .disruption_budget;
  EXPECT_EQ(number.max_unavailable, 2);
  EXPECT_FALSE(
      parseClusterSpec(documents({decode + "  disruptionBudget: {enabled: false}\n"}), "c.yaml")
          .pools.at(0)
          .disruption_budget.enabled);
  for (const auto& [field, message] : std::vector<std::pair<std::string, std::string>>{
           {"{maxUnavailable: 1, minAvailable: 1}",
            "spec.disruptionBudget sets both maxUnavailable and minAvailable: a "
            "PodDisruptionBudget takes one"},
           {"{maxUnavailable: \"150%\"}",
            "spec.disruptionBudget.maxUnavailable must be a whole number or a percentage from 0% "
            "to 100%, got the string \"150%\""},
           {"{minAvailable: -1}",
            "spec.disruptionBudget.minAvailable must be an integer between 0"},
           {"{maxUnavilable: 1}", "spec.disruptionBudget.maxUnavilable is not a field"}}) {
    const std::string error = errorFor(documents({decode + "  disruptionBudget: " + field + "\n"}));
    EXPECT_NE(error.find(message), std::string::npos) << field << ": " << error;
  }
  // A Router's, read the same way.
  const std::string router =
      "apiVersion: tandem.dev/v1alpha1\nkind: Router\nmetadata: {name: front}\nspec:\n";
  const ClusterSpec with_router = parseClusterSpec(
      documents({decode, router + "  disruptionBudget: {maxUnavailable: \"50%\"}\n"}), "c.yaml");
  EXPECT_EQ(with_router.router.disruption_budget.max_unavailable, "50%");
  EXPECT_NE(errorFor(documents({decode, router + "  disruptionBudget: {enabled: 1}\n"}))
                .find("spec.disruptionBudget.enabled must be true or false"),
            std::string::npos);
}

TEST(ClusterSpecTest, RolloutTakesSurgeUnavailableAndAStartupTimeout) {
  const std::string decode =
      "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata: {name: decode}\n"
      "spec:\n  model: {path: /m}\n";
  const RolloutSpec defaults = parseClusterSpec(documents({decode}), "c.yaml").pools.at(0).rollout;
  EXPECT_EQ(defaults.max_surge, 1);
  EXPECT_EQ(defaults.max_unavailable, 0);
  EXPECT_EQ(defaults.startup_timeout_s, 600);
  const RolloutSpec set =
      parseClusterSpec(documents({decode + "  rollout: {maxSurge: 0, maxUnavailable: \"25%\", "
                                           "startupTimeoutSeconds: 1800}\n"}),
                       "c.yaml")
          .pools.at(0)
          .rollout;
  EXPECT_EQ(set.max_surge, 0);
  EXPECT_EQ(set.max_unavailable, "25%");
  EXPECT_EQ(set.startup_timeout_s, 1800);
  for (const auto& [field, message] : std::vector<std::pair<std::string, std::string>>{
           {"{maxSurge: 0}",
            "spec.rollout sets maxSurge and maxUnavailable both to 0: no agent could ever be "
            "replaced"},
           {"{maxSurge: \"0%\", maxUnavailable: 0}", "both to 0"},
           {"{maxUnavailable: \"150%\"}",
            "spec.rollout.maxUnavailable must be a whole number or a percentage from 0% to 100%"},
           {"{startupTimeoutSeconds: 5}",
            "spec.rollout.startupTimeoutSeconds must be an integer between 10"},
           {"{surge: 1}", "spec.rollout.surge is not a field"}}) {
    const std::string error = errorFor(documents({decode + "  rollout: " + field + "\n"}));
    EXPECT_NE(error.find(message), std::string::npos) << field << ": " << error;
  }
}

// A rollout's bounds in agents, as a Deployment resolves them: maxSurge's
// percentage rounded up, maxUnavailable's down, and maxUnavailable 1 when
// both come to 0.
TEST(ClusterSpecTest, RolloutBoundsResolveAsADeploymentsDo) {
  auto bounds = [](nlohmann::json surge, nlohmann::json unavailable, int64_t replicas) {
    RolloutSpec rollout;
    rollout.max_surge = std::move(surge);
    rollout.max_unavailable = std::move(unavailable);
    const RolloutBounds resolved = resolveRollout(rollout, replicas);
    return std::make_pair(resolved.max_surge, resolved.max_unavailable);
  };
  EXPECT_EQ(bounds(1, 0, 4), std::make_pair(int64_t{1}, int64_t{0}));
  EXPECT_EQ(bounds("25%", "25%", 5), std::make_pair(int64_t{2}, int64_t{1}));
  EXPECT_EQ(bounds("25%", "25%", 4), std::make_pair(int64_t{1}, int64_t{1}));
  EXPECT_EQ(bounds(0, "10%", 3), std::make_pair(int64_t{0}, int64_t{1}));
  EXPECT_EQ(bounds("0%", "100%", 3), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(bounds("100%", 0, 0), std::make_pair(int64_t{0}, int64_t{1}));
  EXPECT_EQ(bounds(3, 2, 1), std::make_pair(int64_t{3}, int64_t{2}));
}

TEST(ClusterSpecTest, RouterPoolListsMustNamePoolsOfTheFile) {
  const std::string router = R"(apiVersion: tandem.dev/v1alpha1
kind: Router
spec:
  decodePools: [decode]
  prefillPools: [decode]
)";
  const std::string message = errorFor(documents({kPrefill, kDecode, router}));
  EXPECT_NE(message.find("spec.prefillPools[0] names \"decode\", which is not a PrefillPool of "
                         "this file"),
            std::string::npos)
      << message;
  const ClusterSpec ok =
      parseClusterSpec(documents({kPrefill, kDecode, R"(apiVersion: tandem.dev/v1alpha1
kind: Router
metadata: {name: front}
spec:
  replicas: 2
  prefillPools: [prefill]
  service: {type: NodePort, port: 30080}
)"}),
                       "c.yaml");
  EXPECT_EQ(ok.router.prefill_pools, std::vector<std::string>{"prefill"});
  EXPECT_FALSE(ok.router.decode_pools.has_value());
  EXPECT_EQ(ok.router.name, "front");
  EXPECT_EQ(ok.router.replicas, 2);
  EXPECT_EQ(ok.router.service_type, "NodePort");
  EXPECT_EQ(ok.router.service_port, 30080);
}

TEST(ClusterSpecTest, ApiObjectsParseWithTheSameChecks) {
  // As the API returns it: server metadata, defaults, a status; JSON strings stay strings.
  const nlohmann::json object = nlohmann::json::parse(R"({
    "apiVersion": "tandem.dev/v1alpha1", "kind": "PrefillPool",
    "metadata": {"name": "prefill", "namespace": "serving", "uid": "u-1", "generation": 3,
                 "resourceVersion": "42", "managedFields": [{"manager": "kubectl"}]},
    "spec": {"replicas": 2, "model": {"path": "/models/small"},
             "engine": {"kvCacheMemory": "8Gi", "maxNumSeqs": 16},
             "kvTransfer": {"connector": "ucx", "role": "kv_both"}},
    "status": {"replicas": 2}})");
  const PoolSpec pool = parsePoolObject(object, PoolKind::kPrefill, "PrefillPool serving/prefill");
  EXPECT_EQ(pool.name, "prefill");
  EXPECT_EQ(pool.replicas, 2);
  EXPECT_EQ(pool.engine.kv_cache_memory, "8GiB");
  EXPECT_EQ(pool.engine.max_num_seqs, 16);

  nlohmann::json quoted = object;
  quoted["spec"]["engine"]["maxNumSeqs"] = "16";
  try {
    parsePoolObject(quoted, PoolKind::kPrefill, "PrefillPool serving/prefill");
    FAIL() << "a quoted number was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "PrefillPool serving/prefill: spec.engine.maxNumSeqs must be a positive integer, "
              "got the string \"16\"");
  }
  EXPECT_THROW(parsePoolObject(object, PoolKind::kDecode, "x"), Error);

  // A template nested past any field's depth (preserve-unknown-fields lets
  // the API server keep up to its own bound of 10,000 levels) is named.
  nlohmann::json deep = object;
  nlohmann::json inner = 1;
  for (int i = 0; i < 5000; ++i) inner = nlohmann::json{{"a", std::move(inner)}};
  deep["spec"]["template"] = {{"spec", {{"affinity", std::move(inner)}}}};
  try {
    parsePoolObject(deep, PoolKind::kPrefill, "PrefillPool serving/prefill");
    FAIL() << "a 5,000-level template was read";
  } catch (const Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "PrefillPool serving/prefill: spec.template.spec.affinity" +
            [] {
              std::string path;
              for (int i = 0; i < 60; ++i) path += ".a";
              return path;
            }() +
            " is nested deeper than 64 objects and lists, which no field of these kinds "
            "needs");
  }

  const nlohmann::json router = nlohmann::json::parse(R"({
    "apiVersion": "tandem.dev/v1alpha1", "kind": "Router",
    "metadata": {"name": "front", "namespace": "serving"},
    "spec": {"replicas": 1, "policy": "kv", "decodePools": ["decode"]}})");
  const RouterSpec parsed = parseRouterObject(router, "Router serving/front");
  EXPECT_EQ(parsed.name, "front");
  EXPECT_EQ(parsed.decode_pools, std::vector<std::string>{"decode"});
  nlohmann::json with_agents = router;
  with_agents["spec"]["decode"] = nlohmann::json::parse(R"([{"name":"d","host":"h","port":1}])");
  EXPECT_THROW(parseRouterObject(with_agents, "Router serving/front"), Error);
}

}  // namespace
}  // namespace tandem::spec
