// Faults in the prefill → decode hand-off between real agent processes:
// injected block drops (segmented prefill recomputes exactly the gaps), a
// failed handshake, a prefill agent killed after answering, a prefill agent
// stalled while the decode agent reads (others keep being served; a client
// that leaves loses nothing). Every case ends with every agent's blocks free.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

class KvUcxFaults : public UcxTransportTest {
 protected:
  static std::vector<std::string> faulty(const json& faults, const std::string& policy) {
    return {"--enable-fault-injection", "--kv-transfer-config",
            ucxConfig("kv_consumer",
                      {{"fault_injection", faults}, {"kv_load_failure_policy", policy}})};
  }
  std::vector<int> expected(const std::vector<int>& prompt, int max_tokens = 8) {
    Agent colocated;
    return tokenIds(colocated.post("/v1/completions", greedy(prompt, max_tokens)));
  }
};

TEST_P(KvUcxFaults, GrowingGapsRecomputeExactlyTheDroppedBlocks) {
  // 165 tokens: blocks 0-9 are loadable; growing_gaps drops 1 and 4-5 (the
  // gap of 3 would reach the last block, which is never dropped).
  const std::vector<int> prompt = randomPrompt(165, 41);
  const std::vector<int> want = expected(prompt);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder(faulty({{"drop_blocks", "growing_gaps"}}, "recompute"));
  const json params = prefillOn(prefiller, prompt);
  ASSERT_EQ(params["remote_block_ids"].size(), 10u);
  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)), want);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 3);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"injected\""), 3);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 7);
  // The gaps (3 blocks), the 5-token tail, 7 decode steps; blocks after the
  // gaps are kept.
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 3 * 16 + 5 + 7);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcxFaults, EveryNthAndAllDropExactlyThoseBlocks) {
  const std::vector<int> prompt = randomPrompt(165, 42);
  const std::vector<int> want = expected(prompt);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent every_third(faulty({{"drop_blocks", "every_nth:3"}}, "recompute"));
  EXPECT_EQ(tokenIds(decodeOn(every_third, prompt, prefillOn(prefiller, prompt))), want);
  EXPECT_EQ(every_third.metric("tandem_kv_blocks_recomputed_total"), 3);  // 2, 5, 8
  Agent all(faulty({{"drop_blocks", "all"}}, "recompute"));
  EXPECT_EQ(tokenIds(decodeOn(all, prompt, prefillOn(prefiller, prompt))), want);
  EXPECT_EQ(all.metric("tandem_kv_blocks_recomputed_total"), 10);
  EXPECT_EQ(all.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcxFaults, FailedHandshakeRecomputesOrFailsByPolicy) {
  const std::vector<int> prompt = randomPrompt(75, 43);
  const std::vector<int> want = expected(prompt);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent recompute(faulty({{"fail_handshake", true}}, "recompute"));
  json params = prefillOn(prefiller, prompt);
  EXPECT_EQ(tokenIds(decodeOn(recompute, prompt, params)), want);
  EXPECT_EQ(recompute.metric("tandem_kv_blocks_recomputed_total"), 4);
  EXPECT_EQ(recompute.metric("tandem_kv_transfer_failures_total", "reason=\"injected_handshake\""),
            1);
  Agent fail(faulty({{"fail_handshake", true}}, "fail"));
  int status = 0;
  json error = decodeOn(fail, prompt, params, 8, &status);
  EXPECT_EQ(status, 500) << error.dump();
  EXPECT_NE(error.dump().find("kv_load_failure_policy is fail"), std::string::npos) << error.dump();
  // The decode agents never read, so the blocks are released explicitly.
  EXPECT_EQ(releaseOn(prefiller, params)["released"], true);
  // Other requests are unaffected.
  EXPECT_EQ(tokenIds(fail.post("/v1/completions", greedy(randomPrompt(10, 3), 3))).size(), 3u);
}

TEST_P(KvUcxFaults, DroppedReleaseMessageIsCoveredByTheHoldTimeout) {
  const std::vector<int> prompt = randomPrompt(75, 44);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"abort_timeout_s", 0.5}})});
  Agent decoder(faulty({{"drop_notifications", true}}, "recompute"));
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, prefillOn(prefiller, prompt))), expected(prompt));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcxFaults, PrefillAgentKilledAfterAnsweringIsRecomputedOrFailsByPolicy) {
  const std::vector<int> prompt = randomPrompt(75, 45);
  const std::vector<int> want = expected(prompt);
  json params;
  {
    Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
    params = prefillOn(prefiller, prompt);
    prefiller.process().signal(SIGKILL);
    prefiller.process().wait(std::chrono::seconds(30));
  }
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"read_timeout_s", 5}})});
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)), want);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 4);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  Agent strict(
      {"--kv-transfer-config",
       ucxConfig("kv_consumer", {{"read_timeout_s", 5}, {"kv_load_failure_policy", "fail"}})});
  int status = 0;
  json error = decodeOn(strict, prompt, params, 8, &status);
  EXPECT_EQ(status, 500) << error.dump();
  EXPECT_NE(error.dump().find("failed to load"), std::string::npos) << error.dump();
}

TEST_P(KvUcxFaults, StalledPrefillAgentHoldsUpOnlyItsOwnRequest) {
  const std::vector<int> prompt = randomPrompt(75, 46);
  const std::vector<int> want = expected(prompt);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"read_timeout_s", 60}})});
  const json params = prefillOn(prefiller, prompt);
  // Over TCP a read needs the owner's progress thread, so a stopped owner
  // stalls it; over shared memory the read does not involve the owner.
  prefiller.process().signal(SIGSTOP);
  std::atomic<bool> done{false};
  std::vector<int> got;
  std::thread waiting([&] {
    got = tokenIds(decodeOn(decoder, prompt, params));
    done = true;
  });
  // Another request is served meanwhile.
  EXPECT_EQ(tokenIds(decoder.post("/v1/completions", greedy(randomPrompt(20, 4), 4))).size(), 4u);
  if (GetParam() == "tcp") {
    EXPECT_FALSE(done.load()) << "the read cannot finish while its owner is stopped";
  }
  prefiller.process().signal(SIGCONT);
  waiting.join();
  EXPECT_EQ(got, want);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcxFaults, ClientLeavingWhileTheDecodeAgentWaitsLosesNoBlock) {
  const std::vector<int> prompt = randomPrompt(75, 47);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"read_timeout_s", 60}})});
  const double free_before = decoder.metric("tandem_kv_cache_free_blocks");
  json params = prefillOn(prefiller, prompt);
  params["do_remote_prefill"] = true;
  prefiller.process().signal(SIGSTOP);
  {
    json body = greedy(prompt, 64);
    body["stream"] = true;
    body["kv_transfer_params"] = params;
    auto client = decoder.client();
    client->set_read_timeout(0, 300000);  // leaves after 0.3 s without a token
    auto res = client->Post("/v1/completions", body.dump(), "application/json");
    if (GetParam() == "tcp") {
      EXPECT_FALSE(res) << "no token can come while the owner is stopped";
    }
  }
  prefiller.process().signal(SIGCONT);
  // The read completes, the first token finds the client gone, the request
  // is aborted and every block comes back.
  EXPECT_TRUE(eventually([&] {
    return decoder.metric("tandem_num_requests_running") == 0 &&
           decoder.metric("tandem_kv_cache_free_blocks") == free_before;
  }));
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

INSTANTIATE_TEST_SUITE_P(Transports, KvUcxFaults, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(KvUcxFaultConfig, FaultInjectionIsRefusedWithoutItsFlagAndNamesBadFields) {
  TempDir logs("tandem-kv-faults");
  struct Case {
    std::vector<std::string> flags;
    json faults;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{}, {{"drop_blocks", "all"}}, "refused unless the agent is started with"},
           {{"--enable-fault-injection"},
            {{"drop_blocks", "sometimes"}},
            "fault_injection.drop_blocks must be growing_gaps, every_nth:N or all"},
           {{"--enable-fault-injection"},
            {{"drop_blocks", "every_nth:0"}},
            "every_nth:N needs a positive N"},
           {{"--enable-fault-injection"}, {{"explode", true}}, "fault_injection.explode"}}) {
    std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-agent",
                                     "serve",
                                     "--model",
                                     tinyModelDir().string(),
                                     "--port",
                                     "0",
                                     "--kv-transfer-config",
                                     ucxConfig("kv_consumer", {{"fault_injection", c.faults}})};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    ChildProcess agent(argv, logs.path() / "stderr");
    EXPECT_EQ(agent.wait(std::chrono::seconds(30)), 1) << c.faults.dump();
    EXPECT_NE(agent.stderrText().find(c.message), std::string::npos)
        << c.faults.dump() << " → " << agent.stderrText();
  }
}

}  // namespace
