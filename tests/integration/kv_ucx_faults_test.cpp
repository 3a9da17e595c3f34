// Faults in the prefill → decode hand-off between real agent processes:
// injected block drops (segmented prefill recomputes exactly the gaps), a
// failed handshake, a prefill agent killed after answering, a prefill agent
// stalled while the decode agent reads (others keep being served; a client
// that leaves loses nothing). Every case ends with every agent's blocks free.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

class KvUcxFaults : public UcxTransportTest {
 protected:
  static std::vector<std::string> faulty(const json& faults, const std::string& policy,
                                         json extra = json::object()) {
    extra["fault_injection"] = faults;
    extra["kv_load_failure_policy"] = policy;
    return {"--enable-fault-injection", "--kv-transfer-config", ucxConfig("kv_consumer", extra)};
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
  // Neither decode agent read the blocks. The first, whose connector offered
  // them and never loaded them (the injected failure is the read's; the
  // release message goes through), let them go when its request ended.
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
  int released = 0;
  releaseOn(prefiller, params, &released);
  EXPECT_EQ(released, 404) << "released once only";
  // Other requests are unaffected.
  EXPECT_EQ(tokenIds(fail.post("/v1/completions", greedy(randomPrompt(10, 3), 3))).size(), 3u);
}

TEST_P(KvUcxFaults, DroppedReleaseMessageIsCoveredByTheHoldTimeout) {
  const std::vector<int> prompt = randomPrompt(75, 44);
  // A hold of 7 s leaves a read of at most 1 s time to end 5 s before it.
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"abort_timeout_s", 7}})});
  Agent decoder(faulty({{"drop_notifications", true}}, "recompute", {{"read_timeout_s", 1}}));
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

// A producer that does not answer costs its readers one read timeout, not
// one per request (each queued behind the last, and every read of other
// producers behind them): a read for a producer that went silent moments ago
// fails at once (peer_down) and its prompt is computed.
TEST_P(KvUcxFaults, ASilentProducerCostsOneTimeoutNotOnePerRequest) {
  const std::vector<int> first_prompt = randomPrompt(75, 48);
  const std::vector<int> second_prompt = randomPrompt(75, 49);
  const std::vector<int> first_want = expected(first_prompt);
  const std::vector<int> second_want = expected(second_prompt);
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"read_timeout_s", 3}})});
  const json first_params = prefillOn(prefiller, first_prompt);
  const json second_params = prefillOn(prefiller, second_prompt);
  prefiller.process().signal(SIGSTOP);
  std::vector<int> first_got, second_got;
  std::thread first([&] { first_got = tokenIds(decodeOn(decoder, first_prompt, first_params)); });
  std::thread second(
      [&] { second_got = tokenIds(decodeOn(decoder, second_prompt, second_params)); });
  first.join();
  second.join();
  prefiller.process().signal(SIGCONT);
  EXPECT_EQ(first_got, first_want);
  EXPECT_EQ(second_got, second_want);
  auto failures = [&](const std::string& reason) {
    return decoder.metric("tandem_kv_transfer_failures_total", "reason=\"" + reason + "\"");
  };
  EXPECT_EQ(failures("unreachable") + failures("timeout"), 1);
  EXPECT_EQ(failures("peer_down"), 1);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  // Nobody read them: released as a router gives a transfer up.
  for (const json& params : {first_params, second_params}) {
    prefiller.post("/v1/kv_transfer/release", {{"kv_transfer_params", params}});
  }
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

// Bytes of UCX shared-memory segments (SYSV and posix) mapped into a process:
// its own KV slab and those of the peers it reads from.
int64_t sharedSegmentBytes(int pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int64_t bytes = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/SYSV") == std::string::npos &&
        line.find("/dev/shm/ucx_shm_posix") == std::string::npos) {
      continue;
    }
    std::istringstream fields(line);
    std::string range;
    fields >> range;
    const size_t dash = range.find('-');
    bytes += static_cast<int64_t>(std::stoull(range.substr(dash + 1), nullptr, 16) -
                                  std::stoull(range.substr(0, dash), nullptr, 16));
  }
  return bytes;
}

int64_t residentBytes(int pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

// A reader keeps one endpoint and one mapping per live producer: when a
// producer is killed and restarted (a new engine, a new slab), the reader
// drops the dead one's endpoint and memory key, which unmaps its slab.
TEST(KvUcxPeers, RestartedProducersLeaveNoSlabMappedInTheReader) {
  ::setenv("UCX_TLS", "sm", 1);  // peers' slabs are mapped into the reader
  Agent colocated;
  // A 64 MiB producer slab (16384 blocks of 4 KiB), a 1 MiB reader slab.
  const std::vector<std::string> producer_args = {"--num-blocks", "16384", "--kv-transfer-config",
                                                  ucxConfig("kv_producer")};
  constexpr int64_t kProducerSlabBytes = int64_t{16384} * 4096;
  Agent decoder({"--num-blocks", "256", "--kv-transfer-config", ucxConfig("kv_consumer")});
  const int pid = decoder.process().pid();
  int64_t mapped_with_one_producer = 0;
  int64_t resident_with_one_producer = 0;
  for (int round = 0; round < 5; ++round) {
    // A new prompt each round: the reader must read it all.
    const std::vector<int> prompt = randomPrompt(75, 48 + round);
    Agent prefiller(producer_args);
    EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, prefillOn(prefiller, prompt))),
              tokenIds(colocated.post("/v1/completions", greedy(prompt, 8))));
    EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4 * (round + 1));
    EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
    if (round == 0) {
      mapped_with_one_producer = sharedSegmentBytes(pid);
      resident_with_one_producer = residentBytes(pid);
      EXPECT_GE(mapped_with_one_producer, kProducerSlabBytes) << "the producer's slab is mapped";
    } else {
      // The dead producers' slabs are unmapped once the reader notices
      // (keepalive), the live one's stays.
      EXPECT_TRUE(eventually([&] { return sharedSegmentBytes(pid) <= mapped_with_one_producer; }))
          << "round " << round << ": " << sharedSegmentBytes(pid) << " bytes of shared memory "
          << "mapped, " << mapped_with_one_producer << " with one producer";
    }
    prefiller.process().signal(SIGKILL);
    prefiller.process().wait(std::chrono::seconds(30));
  }
  EXPECT_LT(residentBytes(pid) - resident_with_one_producer, kProducerSlabBytes)
      << "resident memory grew by a producer's slab";
  // With no producer left, the last one is dropped too.
  EXPECT_TRUE(eventually([&] {
    return sharedSegmentBytes(pid) <= mapped_with_one_producer - kProducerSlabBytes;
  })) << sharedSegmentBytes(pid);
  ::unsetenv("UCX_TLS");
}

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
           {{"--enable-fault-injection"},
            {{"throw_on_lookup", 1}},
            "fault_injection.throw_on_lookup must be a string"},
           {{"--enable-fault-injection"},
            {{"fail_staging_copies", "sideways"}},
            "fault_injection.fail_staging_copies must be out, in or both, got sideways"},
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
