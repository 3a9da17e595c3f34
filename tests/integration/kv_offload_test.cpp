// The offload and multi connectors in real agent processes. An agent whose
// KV cache is too small to keep a prompt's blocks (other requests evict them)
// loads them back from its host tier instead of recomputing, with identical
// greedy output; a tier smaller than the working set evicts the least
// recently used blocks. A multi connector (offload in front of storage) in a
// fresh process loads from storage while its tier is empty, then from the
// tier; one with a ucx member hands a prompt from prefill to decode. Bad
// configs are refused at start, naming the field.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "tests/support/agent_server.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

json offloadMember(int capacity_blocks) {
  return {{"kv_connector", "offload"},
          {"kv_connector_extra_config", {{"capacity_blocks", capacity_blocks}}}};
}

std::string offloadConfig(int capacity_blocks) { return offloadMember(capacity_blocks).dump(); }

std::string multiConfig(int capacity_blocks, const fs::path& store) {
  json storage = {{"kv_connector", "storage"},
                  {"kv_connector_extra_config", {{"shared_storage_path", store.string()}}}};
  json connectors = json::array({offloadMember(capacity_blocks), storage});
  return json{{"kv_connector", "multi"},
              {"kv_connector_extra_config", {{"connectors", connectors}}}}
      .dump();
}

// 8 blocks of 16 tokens: one 75-token prompt with 8 generated tokens takes 6,
// so two other such requests evict every block of the first from the cache.
constexpr const char* kNumBlocks = "8";

class KvOffload : public ::testing::Test {
 protected:
  // 75 tokens: 4 full blocks can be loaded (the last token is always computed).
  std::vector<int> prompt_ = randomPrompt(75, 41);
  std::vector<int> other_a_ = randomPrompt(75, 42);
  std::vector<int> other_b_ = randomPrompt(75, 43);

  static std::vector<int> run(const Agent& agent, const std::vector<int>& prompt) {
    return tokenIds(agent.post("/v1/completions", greedy(prompt, 8)));
  }
  // Runs the two other prompts, which push the first one's blocks out of the
  // agent's KV cache.
  void evictPrompt(const Agent& agent) {
    run(agent, other_a_);
    run(agent, other_b_);
  }
  static void expectFreeBlocksAtBaseline(const Agent& agent, double baseline) {
    EXPECT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == baseline; }))
        << agent.metricsText();
  }
};

TEST_F(KvOffload, EvictedPrefixLoadsFromTheTierWithIdenticalOutput) {
  Agent agent({"--num-blocks", kNumBlocks, "--kv-transfer-config", offloadConfig(16)});
  const double free_blocks = agent.metric("tandem_kv_cache_free_blocks");
  EXPECT_EQ(free_blocks, 8);
  const std::vector<int> expected = run(agent, prompt_);
  evictPrompt(agent);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 0);

  const double computed_before = agent.metric("tandem_computed_tokens_total");
  const double hits_before = agent.metric("tandem_prefix_cache_hits_total");
  EXPECT_EQ(run(agent, prompt_), expected);
  EXPECT_EQ(agent.metric("tandem_prefix_cache_hits_total") - hits_before, 0)
      << "the prompt's blocks must have left the KV cache";
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 4);
  // 64 tokens loaded: the 11-token tail and 7 decode steps computed.
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_recomputed_total"), 0);
  expectFreeBlocksAtBaseline(agent, free_blocks);
}

TEST_F(KvOffload, TierSmallerThanTheWorkingSetEvictsTheLeastRecentlyUsed) {
  // 10 blocks hold two requests' 5 full blocks each: the third evicts the first.
  Agent agent({"--num-blocks", kNumBlocks, "--kv-transfer-config", offloadConfig(10)});
  const double free_blocks = agent.metric("tandem_kv_cache_free_blocks");
  const std::vector<int> expected = run(agent, prompt_);
  const std::vector<int> expected_a = run(agent, other_a_);
  run(agent, other_b_);

  // other_a_ is still in the tier: with what the KV cache kept of it (at
  // most 2 of its blocks survived other_b_), its 4 blocks are not computed.
  double computed_before = agent.metric("tandem_computed_tokens_total");
  EXPECT_EQ(run(agent, other_a_), expected_a);
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  EXPECT_GE(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 2);
  const double loaded = agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\"");

  // The first prompt, least recently used, left the tier: all computed.
  computed_before = agent.metric("tandem_computed_tokens_total");
  EXPECT_EQ(run(agent, prompt_), expected);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), loaded);
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 75 + 7);
  expectFreeBlocksAtBaseline(agent, free_blocks);
}

TEST_F(KvOffload, MultiLoadsFromStorageInAFreshProcessThenFromItsTier) {
  TempDir store("tandem-kv-multi-store");
  std::vector<int> expected;
  {
    Agent first(
        {"--num-blocks", kNumBlocks, "--kv-transfer-config", multiConfig(16, store.path())});
    expected = run(first, prompt_);
    EXPECT_EQ(first.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 0);
  }
  Agent agent({"--num-blocks", kNumBlocks, "--kv-transfer-config", multiConfig(16, store.path())});
  const double free_blocks = agent.metric("tandem_kv_cache_free_blocks");
  double computed_before = agent.metric("tandem_computed_tokens_total");
  EXPECT_EQ(run(agent, prompt_), expected);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 4);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 0);
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);

  // The loaded blocks were saved into the tier too; once the KV cache lost
  // them, the tier (first in the list, and as long as storage) serves them.
  evictPrompt(agent);
  computed_before = agent.metric("tandem_computed_tokens_total");
  EXPECT_EQ(run(agent, prompt_), expected);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 4);
  EXPECT_EQ(agent.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 4);
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  expectFreeBlocksAtBaseline(agent, free_blocks);
}

// A multi connector with a ucx member: the prefill agent's ucx member holds
// the blocks and answers where they are (requestFinished and validate go
// through the multi), the decode agent's KV cache is allocated by UCX for its
// ucx member, which reads the blocks asynchronously (source="ucx"). When the
// decode agent's tier (first in its list) serves the next hand-off of the
// same prompt instead, its ucx member lets the prefill agent's hold go at
// once, not at the hold's timeout.
TEST_F(KvOffload, MultiWithAUcxMemberHandsPrefillToDecode) {
  struct UcxOverTcp {
    UcxOverTcp() { ::setenv("UCX_TLS", "tcp", 1); }
    ~UcxOverTcp() { ::unsetenv("UCX_TLS"); }
  } transport;
  std::vector<int> expected;
  {
    Agent colocated;
    expected = run(colocated, prompt_);
  }
  auto config = [](const std::string& ucx_role, bool ucx_first) {
    json ucx = {{"kv_connector", "ucx"}, {"kv_role", ucx_role}};
    json connectors =
        ucx_first ? json::array({ucx, offloadMember(16)}) : json::array({offloadMember(16), ucx});
    return json{{"kv_connector", "multi"},
                {"kv_connector_extra_config", {{"connectors", connectors}}}}
        .dump();
  };
  Agent prefiller({"--kv-transfer-config", config("kv_producer", true)});
  Agent decoder({"--num-blocks", kNumBlocks, "--kv-transfer-config", config("kv_consumer", false)});
  const double prefill_free_blocks = prefiller.metric("tandem_kv_cache_free_blocks");
  const double decode_free_blocks = decoder.metric("tandem_kv_cache_free_blocks");

  json body = greedy(prompt_, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  json params = prefiller.post("/v1/completions", body)["kv_transfer_params"];
  ASSERT_TRUE(params.is_object()) << "the prefill response must say where its KV is";
  EXPECT_EQ(params["remote_block_ids"].size(), 4u);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5);

  body = greedy(prompt_, 8);
  params["do_remote_prefill"] = true;
  body["kv_transfer_params"] = params;
  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decoder.post("/v1/completions", body)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 0);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));

  // Once the decode agent's KV cache lost the prompt, its tier and the
  // prefill agent offer the same blocks; the tier wins the tie.
  evictPrompt(decoder);
  body = greedy(prompt_, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  params = prefiller.post("/v1/completions", body)["kv_transfer_params"];
  ASSERT_TRUE(params.is_object());
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5);
  body = greedy(prompt_, 8);
  params["do_remote_prefill"] = true;
  body["kv_transfer_params"] = params;
  EXPECT_EQ(tokenIds(decoder.post("/v1/completions", body)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"offload\""), 4);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }))
      << "the prefill agent's hold is kept for nobody";
  expectFreeBlocksAtBaseline(prefiller, prefill_free_blocks);
  expectFreeBlocksAtBaseline(decoder, decode_free_blocks);
}

TEST(KvOffloadConfig, BadConfigsAreRefusedAtStartNamingTheField) {
  TempDir logs("tandem-kv-offload-config");
  const json offload = offloadMember(8);
  struct Case {
    std::string config;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"kv_connector":"offload"})",
            "kv_connector_extra_config needs exactly one of capacity_blocks"},
           {R"({"kv_connector":"offload","kv_connector_extra_config":{"capacity_blocks":-3}})",
            "kv_connector_extra_config.capacity_blocks must be a positive integer, got -3"},
           {R"({"kv_connector":"offload","kv_connector_extra_config":{"capacity_bytes":10}})",
            "capacity_bytes 10 holds no KV block"},
           {R"({"kv_connector":"multi"})",
            "kv_connector_extra_config.connectors must be a non-empty array"},
           {json{{"kv_connector", "multi"},
                 {"kv_connector_extra_config",
                  {{"connectors", json::array({offload, {{"kv_connector", "nixl"}}})}}}}
                .dump(),
            "kv_connector_extra_config.connectors[1].kv_connector \"nixl\" is not supported "
            "(accepted: storage, ucx, offload, multi)"},
           {json{
                {"kv_connector", "multi"},
                {"kv_connector_extra_config",
                 {{"connectors", json::array({json{{"kv_connector", "multi"},
                                                   {"kv_connector_extra_config",
                                                    {{"connectors", json::array({offload})}}}}})}}}}
                .dump(),
            "kv_connector_extra_config.connectors[0].kv_connector \"multi\" cannot be a member"},
           {json{{"kv_connector", "multi"},
                 {"kv_connector_extra_config",
                  {{"connectors", json::array({offload, {{"kv_connector", "storage"}}})}}}}
                .dump(),
            "kv_connector_extra_config.connectors[1]: storage connector: "
            "kv_connector_extra_config.shared_storage_path must name a directory"},
       }) {
    ChildProcess agent({std::string(TANDEM_BIN_DIR) + "/tandem-agent", "serve", "--model",
                        tinyModelDir().string(), "--port", "0", "--kv-transfer-config", c.config},
                       logs.path() / "stderr");
    EXPECT_EQ(agent.wait(std::chrono::seconds(30)), 1) << c.config;
    EXPECT_NE(agent.stderrText().find(c.message), std::string::npos)
        << c.config << " → " << agent.stderrText();
  }
}

}  // namespace
