// A pool's spec as a `tandem-agent serve` command line: each engine field is
// its flag, unset fields are left to the agent, the connector is vLLM's JSON.
#include "operator/spec/agent_command.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

namespace tandem::spec {
namespace {

PoolSpec minimalPool(PoolKind kind) {
  PoolSpec pool;
  pool.kind = kind;
  pool.name = kind == PoolKind::kPrefill ? "prefill" : "decode";
  pool.model_path = "models/small";
  pool.served_model_name = "small";
  return pool;
}

TEST(AgentCommandTest, MinimalPoolPassesOnlyWhatItMust) {
  const std::vector<std::string> expected = {"/bin/tandem-agent",
                                             "serve",
                                             "--model",
                                             "models/small",
                                             "--served-model-name",
                                             "small",
                                             "--host",
                                             "127.0.0.1",
                                             "--port",
                                             "0",
                                             "--role",
                                             "decode",
                                             "--kv-transfer-config",
                                             R"({"kv_connector":"ucx","kv_role":"kv_both"})"};
  EXPECT_EQ(agentArguments(minimalPool(PoolKind::kDecode), "/bin/tandem-agent", "127.0.0.1", 0),
            expected);
}

TEST(AgentCommandTest, EveryEngineFieldIsItsFlag) {
  PoolSpec pool = minimalPool(PoolKind::kPrefill);
  pool.engine.block_size = 32;
  pool.engine.num_blocks = 4096;
  pool.engine.kv_dtype = "f32";
  pool.engine.compute_dtype = "bf16";
  pool.engine.device = "cuda";
  pool.engine.max_num_seqs = 8;
  pool.engine.scheduling_policy = "priority";
  pool.engine.max_num_batched_tokens = 512;
  pool.engine.max_model_len = 1024;
  pool.engine.max_waiting_requests = 100;
  pool.engine.prefix_caching_hash = "sha256";
  pool.engine.shutdown_timeout_s = 2.5;
  pool.engine.threads = 4;
  pool.kv_transfer.role = "kv_producer";
  pool.kv_transfer.extra_config = {{"abort_timeout_s", 60}};
  pool.extra_args = {"--insecure-kv"};
  const std::vector<std::string> expected = {
      "agent",
      "--threads",
      "4",
      "serve",
      "--model",
      "models/small",
      "--served-model-name",
      "small",
      "--host",
      "0.0.0.0",
      "--port",
      "8000",
      "--role",
      "prefill",
      "--block-size",
      "32",
      "--num-blocks",
      "4096",
      "--kv-dtype",
      "f32",
      "--compute-dtype",
      "bf16",
      "--device",
      "cuda",
      "--max-num-seqs",
      "8",
      "--scheduling-policy",
      "priority",
      "--max-num-batched-tokens",
      "512",
      "--max-model-len",
      "1024",
      "--max-waiting-requests",
      "100",
      "--prefix-caching-hash",
      "sha256",
      "--shutdown-timeout",
      "2.5",
      "--kv-transfer-config",
      R"({"kv_connector":"ucx","kv_connector_extra_config":{"abort_timeout_s":60},"kv_role":"kv_producer"})",
      "--insecure-kv"};
  EXPECT_EQ(agentArguments(pool, "agent", "0.0.0.0", 8000), expected);

  pool.engine.num_blocks.reset();
  pool.engine.kv_cache_memory = "8GiB";
  const auto argv = agentArguments(pool, "agent", "0.0.0.0", 8000);
  const auto flag = std::find(argv.begin(), argv.end(), "--kv-cache-memory");
  ASSERT_NE(flag, argv.end());
  EXPECT_EQ(*(flag + 1), "8GiB");
  EXPECT_EQ(std::find(argv.begin(), argv.end(), "--num-blocks"), argv.end());
}

TEST(AgentCommandTest, KvTransferConfigIsVllmShaped) {
  PoolSpec pool = minimalPool(PoolKind::kDecode);
  pool.kv_transfer.connector = "multi";
  pool.kv_transfer.extra_config = nlohmann::json::parse(
      R"({"connectors": [{"kv_connector": "offload",
                          "kv_connector_extra_config": {"capacity_blocks": 64}},
                         {"kv_connector": "ucx"}]})");
  EXPECT_EQ(nlohmann::json::parse(kvTransferConfigJson(pool)),
            nlohmann::json::parse(R"({"kv_connector": "multi", "kv_role": "kv_both",
              "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "offload", "kv_connector_extra_config": {"capacity_blocks": 64}},
                {"kv_connector": "ucx"}]}})"));
}

TEST(AgentCommandTest, PoolKvSecretIsFoundWhereTheAgentsFindIt) {
  ::unsetenv("TANDEM_KV_SECRET");
  PoolSpec pool = minimalPool(PoolKind::kDecode);
  EXPECT_EQ(poolKvSecret(pool), "");
  ::setenv("TANDEM_KV_SECRET", "inherited", 1);
  EXPECT_EQ(poolKvSecret(pool), "inherited");
  pool.env.emplace_back("TANDEM_KV_SECRET", "from-env");
  EXPECT_EQ(poolKvSecret(pool), "from-env");
  pool.kv_transfer.extra_config = nlohmann::json::parse(
      R"({"connectors": [{"kv_connector": "offload"},
                         {"kv_connector": "ucx", "kv_connector_extra_config": {"secret": "member"}}]})");
  EXPECT_EQ(poolKvSecret(pool), "member");
  pool.kv_transfer.extra_config = {{"secret", "extra"}};
  EXPECT_EQ(poolKvSecret(pool), "extra");
  ::unsetenv("TANDEM_KV_SECRET");
}

// A command line is logged and shown by ps: an inline secret reaches the
// agents through their environment instead.
TEST(AgentCommandTest, AnInlineSecretGoesInTheEnvironmentNotTheCommandLine) {
  PoolSpec pool = minimalPool(PoolKind::kDecode);
  pool.env = {{"TANDEM_KV_SECRET", "from-env"}, {"OTHER", "x"}};
  EXPECT_EQ(agentEnvironment(pool), pool.env);
  pool.kv_transfer.connector = "multi";
  pool.kv_transfer.extra_config = nlohmann::json::parse(
      R"({"secret": "top", "connectors": [{"kv_connector": "ucx",
          "kv_connector_extra_config": {"secret": "member", "read_timeout_s": 5}}]})");
  const std::vector<std::string> argv = agentArguments(pool, "tandem-agent", "127.0.0.1", 0);
  for (const std::string& arg : argv) {
    EXPECT_EQ(arg.find("top"), std::string::npos) << arg;
    EXPECT_EQ(arg.find("member"), std::string::npos) << arg;
  }
  EXPECT_EQ(nlohmann::json::parse(kvTransferConfigJson(pool)),
            nlohmann::json::parse(R"({"kv_connector": "multi", "kv_role": "kv_both",
              "kv_connector_extra_config": {"connectors": [{"kv_connector": "ucx",
                "kv_connector_extra_config": {"read_timeout_s": 5}}]}})"));
  const std::vector<std::pair<std::string, std::string>> env = {{"OTHER", "x"},
                                                                {"TANDEM_KV_SECRET", "top"}};
  EXPECT_EQ(agentEnvironment(pool), env);
  // A secret that is no string, or empty, stays for the agent to refuse.
  for (const nlohmann::json& bad : {nlohmann::json(12345678), nlohmann::json("")}) {
    pool.kv_transfer.extra_config = {{"secret", bad}};
    EXPECT_EQ(
        nlohmann::json::parse(kvTransferConfigJson(pool))["kv_connector_extra_config"]["secret"],
        bad);
    EXPECT_EQ(agentEnvironment(pool), (std::vector<std::pair<std::string, std::string>>{
                                          {"TANDEM_KV_SECRET", "from-env"}, {"OTHER", "x"}}));
  }
}

}  // namespace
}  // namespace tandem::spec
