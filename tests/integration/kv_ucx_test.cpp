// The prefill → decode hand-off over UCX between real agent processes: the
// decode agent reads the prefill agent's blocks one-sidedly, computes only
// the rest, and produces the tokens a colocated agent produces; the prefill
// agent frees its held blocks when released (or after its hold times out).
// Each case runs over shared memory and over TCP.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "tests/support/agent_server.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

std::string ucxConfig(const std::string& role, double abort_timeout_s = 120) {
  return json{{"kv_connector", "ucx"},
              {"kv_role", role},
              {"kv_connector_extra_config", {{"abort_timeout_s", abort_timeout_s}}}}
      .dump();
}

class KvUcx : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", GetParam().c_str(), 1); }
  void TearDown() override { ::unsetenv("UCX_TLS"); }

  // 75 tokens: 4 full blocks move, the 11-token tail is computed by decode.
  std::vector<int> prompt_ = randomPrompt(75, 31);

  static json prefill(const Agent& agent, const std::vector<int>& prompt) {
    json body = greedy(prompt, 1);
    body["kv_transfer_params"] = {{"do_remote_decode", true}};
    json response = agent.post("/v1/completions", body);
    return response["kv_transfer_params"];
  }
  static json decode(const Agent& agent, const std::vector<int>& prompt, json params) {
    json body = greedy(prompt, 8);
    params["do_remote_prefill"] = true;
    body["kv_transfer_params"] = params;
    return agent.post("/v1/completions", body);
  }
};

TEST_P(KvUcx, DecodeReadsThePrefilledBlocksAndMatchesAColocatedAgent) {
  std::vector<int> expected;
  {
    Agent colocated;
    expected = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));
  }
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object()) << "the prefill response must say where its KV is";
  EXPECT_EQ(params["remote_block_ids"].size(), 4u);
  EXPECT_EQ(params["remote_num_tokens"], 64);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5)
      << "the request's blocks (4 full + 1 partial) are held for the reader";

  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  // 4 blocks of the tiny model: 2 layers x K,V x 16 tokens x 2 KV heads x 16 x 2 bytes.
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_bytes_total"), 4 * 4096);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_duration_seconds_count"), 1);
  // The release message frees the prefill agent's blocks (also checked by
  // ~Agent: nothing referenced at the end).
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_cache_usage_ratio") == 0 &&
           prefiller.metric("tandem_kv_held_blocks") == 0;
  }));
}

TEST_P(KvUcx, DecodeReadsOnlyTheBlocksItLacks) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  // The decode agent already holds the first 2 blocks (an earlier turn).
  std::vector<int> earlier(prompt_.begin(), prompt_.begin() + 40);
  decoder.post("/v1/completions", greedy(earlier, 1));
  json params = prefill(prefiller, prompt_);
  json out = decode(decoder, prompt_, params);
  EXPECT_EQ(out["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 2);
  Agent colocated;
  EXPECT_EQ(tokenIds(out), tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
}

TEST_P(KvUcx, IncompatibleOrBogusParametersAreRecomputedNotRead) {
  // Refused transfers are never released by a reader: a short hold.
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", 1.0)});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent colocated;
  const std::vector<int> expected = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));

  json params = prefill(prefiller, prompt_);
  json mismatched = params;
  mismatched["compatibility"] = "model=other";
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, mismatched)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);

  std::vector<int> other = randomPrompt(75, 32);
  json bogus = prefill(prefiller, other);
  // Far outside the peer's advertised slab.
  bogus["remote_block_ids"] = {1 << 30, (1 << 30) + 1, (1 << 30) + 2, (1 << 30) + 3};
  EXPECT_EQ(tokenIds(decode(decoder, other, bogus)),
            tokenIds(colocated.post("/v1/completions", greedy(other, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 4)
      << "ids outside the peer's slab are refused, the blocks recomputed";
}

TEST_P(KvUcx, HeldBlocksAreFreedWhenNoReaderComes) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", 0.2)});
  json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_cache_usage_ratio") == 0; }))
      << "the hold must time out";
}

INSTANTIATE_TEST_SUITE_P(Transports, KvUcx, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
