// The ucx connector's staging KV buffer between real agent processes: a
// producer copies held blocks into a registered host staging area and a
// consumer reads into its own before copying into its slab, exactly as an
// agent whose slab is device memory does over a UCX without CUDA support.
// Forced with kv_buffer "staging" on the CPU backend. Each case runs over
// shared memory and over TCP.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/process_limits.h"
#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// 4 blocks of the tiny model: 2 layers x K,V x 16 tokens x 2 KV heads x 16 x 2 bytes.
constexpr double kBlockBytes = 4096;

json health(const Agent& agent) {
  auto res = agent.client()->Get("/health");
  if (!res) throw std::runtime_error("no answer from /health");
  return json::parse(res->body);
}

// (producer's kv_buffer, consumer's kv_buffer) x UCX transport.
class KvStagingPair : public ::testing::TestWithParam<
                          std::tuple<std::pair<std::string, std::string>, std::string>> {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", std::get<1>(GetParam()).c_str(), 1); }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
  const std::string& producerBuffer() const { return std::get<0>(GetParam()).first; }
  const std::string& consumerBuffer() const { return std::get<0>(GetParam()).second; }
};

TEST_P(KvStagingPair, TokensAndKvBytesEqualAColocatedAgentsAndNothingLeaks) {
  TempDir prefill_dir("tandem-stage-p"), decode_dir("tandem-stage-d"),
      colocated_dir("tandem-stage-c");
  Agent prefiller({"--kv-transfer-config", ucxWithBlockFiles("kv_producer", prefill_dir.path(),
                                                             {{"kv_buffer", producerBuffer()}})});
  Agent decoder({"--kv-transfer-config", ucxWithBlockFiles("kv_consumer", decode_dir.path(),
                                                           {{"kv_buffer", consumerBuffer()}})});
  Agent colocated({"--kv-transfer-config", ucxWithBlockFiles("kv_producer", colocated_dir.path())});
  // The path asked for is the one taken (reported through the multi connector).
  ASSERT_EQ(health(prefiller)["kv_buffer"], producerBuffer()) << health(prefiller).dump();
  ASSERT_EQ(health(decoder)["kv_buffer"], consumerBuffer()) << health(decoder).dump();
  for (uint32_t seed : {91u, 92u}) {
    const std::vector<int> prompt = randomPrompt(75, seed);
    json params = prefillOn(prefiller, prompt);
    ASSERT_TRUE(params.is_object());
    ASSERT_EQ(params["remote_block_ids"].size(), 4u);
    EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)),
              tokenIds(colocated.post("/v1/completions", greedy(prompt, 8))));
  }
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 8);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_bytes_total", "source=\"ucx\""), 8 * kBlockBytes);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 0);
  const auto prefilled = blockFiles(prefill_dir.path());
  const auto decoded = blockFiles(decode_dir.path());
  const auto reference = blockFiles(colocated_dir.path());
  EXPECT_EQ(prefilled.size(), 8u);
  EXPECT_EQ(decoded.size(), 10u);
  for (const auto& [path, bytes] : prefilled) {
    ASSERT_EQ(decoded.count(path), 1u) << path;
    EXPECT_TRUE(decoded.at(path) == bytes) << "read block differs: " << path;
  }
  for (const auto& [path, bytes] : decoded) {
    ASSERT_EQ(reference.count(path), 1u) << path;
    EXPECT_TRUE(reference.at(path) == bytes) << "KV differs from a colocated run's: " << path;
  }
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, KvStagingPair,
    ::testing::Combine(::testing::Values(std::pair<std::string, std::string>{"staging", "staging"},
                                         std::pair<std::string, std::string>{"staging", "slab"},
                                         std::pair<std::string, std::string>{"slab", "staging"}),
                       ::testing::Values("sm", "tcp")),
    [](const auto& info) {
      return std::get<0>(info.param).first + "_to_" + std::get<0>(info.param).second + "_" +
             std::get<1>(info.param);
    });

class KvStaging : public UcxTransportTest {
 protected:
  std::vector<int> prompt_ = randomPrompt(75, 33);
  std::vector<int> expected_;
  std::vector<int> expectedTokens() {
    if (expected_.empty()) {
      Agent colocated;
      expected_ = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));
    }
    return expected_;
  }
};

TEST_P(KvStaging, HealthAndMetricsReportThePathAndStagingSlotsAreFreedWithTheHold) {
  Agent prefiller({"--kv-transfer-config",
                   ucxConfig("kv_producer", {{"kv_buffer", "staging"}, {"staging_blocks", 16}})});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"kv_buffer", "staging"}})});
  Agent slab({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const json staged = health(prefiller);
  EXPECT_EQ(staged["kv_buffer"], "staging") << staged.dump();
  EXPECT_EQ(staged["staging_blocks"], 16);
  EXPECT_EQ(staged["staging_blocks_used"], 0);
  EXPECT_EQ(staged["staging_pinned"], false);  // a host slab: nothing to pin
  ASSERT_TRUE(staged["ucx_memory_types"].is_array());
  EXPECT_NE(
      std::find(staged["ucx_memory_types"].begin(), staged["ucx_memory_types"].end(), json("host")),
      staged["ucx_memory_types"].end());
  EXPECT_EQ(health(decoder)["staging_blocks"], 256) << "the default";
  EXPECT_EQ(health(slab)["kv_buffer"], "slab") << "auto on a host slab";
  EXPECT_FALSE(health(slab).contains("staging_blocks"));
  EXPECT_EQ(prefiller.metric("tandem_kv_buffer_info", "path=\"staging\""), 1);
  EXPECT_EQ(slab.metric("tandem_kv_buffer_info", "path=\"slab\""), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_transfer_failures_total", "reason=\"staging_full\""), 0)
      << "every known reason is there from the start";

  // A transfer: 4 slots taken while held, given back by the reader's release.
  json params = prefillOn(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_EQ(params["remote_num_blocks"], 16) << "readers see the staging area";
  EXPECT_EQ(prefiller.metric("tandem_kv_staging_blocks_used"), 4);
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt_, params)), expectedTokens());
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_held_blocks") == 0 &&
           prefiller.metric("tandem_kv_staging_blocks_used") == 0;
  }));
  EXPECT_EQ(decoder.metric("tandem_kv_staging_blocks_used"), 0);

  // Explicit release (no reader comes): slots and blocks both go.
  params = prefillOn(prefiller, randomPrompt(75, 34));
  EXPECT_EQ(health(prefiller)["staging_blocks_used"], 4);
  int status = 0;
  releaseOn(prefiller, params, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(health(prefiller)["staging_blocks_used"], 0);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvStaging, StagingSlotsAreFreedWhenNoReaderComes) {
  Agent prefiller({"--kv-transfer-config",
                   ucxConfig("kv_producer", {{"kv_buffer", "staging"}, {"abort_timeout_s", 0.2}})});
  json params = prefillOn(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_held_blocks") == 0 &&
           health(prefiller)["staging_blocks_used"] == 0;
  })) << "the hold must time out, slots included";
}

TEST_P(KvStaging, AFullProducerStagingAreaOffersNothingAndTheReaderRecomputes) {
  Agent prefiller({"--kv-transfer-config",
                   ucxConfig("kv_producer", {{"kv_buffer", "staging"}, {"staging_blocks", 3}})});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"kv_buffer", "staging"}})});
  json params = prefillOn(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_EQ(params["remote_block_ids"].size(), 0u) << "4 blocks do not fit 3 slots";
  EXPECT_EQ(prefiller.metric("tandem_kv_transfer_failures_total", "reason=\"staging_full\""), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 0) << "nothing offered, nothing held";
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt_, params)), expectedTokens());
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
  EXPECT_EQ(health(prefiller)["staging_blocks_used"], 0);
}

TEST_P(KvStaging, AFullConsumerStagingAreaFailsTheLoadWhichIsRecomputed) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config",
                 ucxConfig("kv_consumer", {{"kv_buffer", "staging"}, {"staging_blocks", 2}})});
  json params = prefillOn(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt_, params)), expectedTokens());
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"staging_full\""), 1);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 4);
  EXPECT_EQ(health(decoder)["staging_blocks_used"], 0);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// On the staging path readers read the staging copy, never the held slab
// blocks: those give way at once when a waiting request needs them, and
// every transfer still goes through (nothing counts as yielded).
TEST_P(KvStaging, StagedHoldsGiveTheirBlocksToWaitingRequestsAndStillServeTheirReaders) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"kv_buffer", "staging"}}),
                   "--num-blocks", "16"});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"kv_buffer", "staging"}})});
  Agent colocated;
  std::vector<std::vector<int>> prompts;
  std::vector<json> held;
  for (uint32_t seed : {71u, 72u, 73u, 74u}) {
    prompts.push_back(randomPrompt(75, seed));
    held.push_back(prefillOn(prefiller, prompts.back()));
    ASSERT_EQ(held.back()["remote_block_ids"].size(), 4u) << held.back().dump();
  }
  // Three holds pinned 15 of 16 blocks; the fourth took the oldest's.
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 15);
  EXPECT_EQ(health(prefiller)["staging_blocks_used"], 16) << "every copy stays";
  EXPECT_EQ(prefiller.metric("tandem_kv_holds_yielded_total"), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tokenIds(decodeOn(decoder, prompts[i], held[i])),
              tokenIds(colocated.post("/v1/completions", greedy(prompts[i], 8))))
        << "prompt " << i;
  }
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 16);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"hold_ended\""), 0);
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_held_blocks") == 0 &&
           health(prefiller)["staging_blocks_used"] == 0;
  }));
}

TEST_P(KvStaging, PullBackLendsThroughStaging) {
  // A decode agent lends a prefix it holds (pull-back) from its staging area.
  Agent lender({"--kv-transfer-config", ucxConfig("kv_both", {{"kv_buffer", "staging"}})});
  Agent borrower({"--kv-transfer-config",
                  ucxConfig("kv_both", {{"kv_buffer", "staging"}, {"remote_pull_threshold", 1}})});
  lender.post("/v1/completions", greedy(prompt_, 1));
  int status = 0;
  json hold = lender.post("/v1/kv_transfer/hold", {{"token_ids", prompt_}}, &status);
  ASSERT_EQ(status, 200) << hold.dump();
  EXPECT_EQ(hold["num_tokens"], 64);
  EXPECT_EQ(health(lender)["staging_blocks_used"], 4);
  json body = greedy(prompt_, 8);
  body["kv_transfer_params"] = {{"remote_prefix", hold["kv_transfer_params"]}};
  EXPECT_EQ(tokenIds(borrower.post("/v1/completions", body)), expectedTokens());
  EXPECT_EQ(borrower.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] {
    return lender.metric("tandem_kv_held_blocks") == 0 &&
           health(lender)["staging_blocks_used"] == 0;
  }));
}

// Copies between the KV cache and the staging area are device copies on a
// GPU agent, and can fail. A lender whose copies out fail answers its
// prefill without a descriptor and refuses a lend with a 500, holding
// nothing and still serving; a reader whose copies in fail recomputes the
// blocks and gives every slot back.
TEST_P(KvStaging, FailingStagingCopiesLoseNeitherAnswersNorBlocks) {
  auto failing = [](const std::string& role, const std::string& which) {
    return std::vector<std::string>{
        "--enable-fault-injection", "--kv-transfer-config",
        ucxConfig(role, {{"kv_buffer", "staging"},
                         {"fault_injection", {{"fail_staging_copies", which}}}})};
  };
  Agent lender(failing("kv_both", "out"));
  const json answer = lender.post("/v1/completions", [&] {
    json body = greedy(prompt_, 8);
    body["kv_transfer_params"] = {{"do_remote_decode", true}};
    return body;
  }());
  EXPECT_EQ(tokenIds(answer), expectedTokens()) << answer.dump();
  EXPECT_FALSE(answer.contains("kv_transfer_params") && answer["kv_transfer_params"].is_object() &&
               answer["kv_transfer_params"].contains("remote_block_ids"))
      << "nothing was staged, so nothing is offered: " << answer.dump();
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 0);
  EXPECT_EQ(health(lender)["staging_blocks_used"], 0);
  // The prompt's blocks are cached: a lend of them fails at the copy.
  int status = 0;
  const json lend = lender.post("/v1/kv_transfer/hold", {{"token_ids", prompt_}}, &status);
  EXPECT_EQ(status, 500) << lend.dump();
  EXPECT_NE(lend.dump().find("the copy into the staging area failed"), std::string::npos)
      << lend.dump();
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 0);
  EXPECT_EQ(health(lender)["staging_blocks_used"], 0);
  EXPECT_EQ(health(lender)["status"], "ok");
  EXPECT_EQ(tokenIds(lender.post("/v1/completions", greedy(prompt_, 8))), expectedTokens())
      << "the engine goes on serving";

  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent reader(failing("kv_consumer", "in"));
  const json params = prefillOn(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  ASSERT_EQ(params["remote_block_ids"].size(), 4u);
  EXPECT_EQ(tokenIds(decodeOn(reader, prompt_, params)), expectedTokens());
  EXPECT_EQ(reader.metric("tandem_kv_transfer_failures_total", "reason=\"copy_error\""), 1);
  EXPECT_EQ(reader.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(reader.metric("tandem_kv_blocks_recomputed_total"), 4);
  EXPECT_EQ(health(reader)["staging_blocks_used"], 0);
  EXPECT_TRUE(eventually([&] {
    return reader.metric("tandem_kv_cache_usage_ratio") == 0 &&
           prefiller.metric("tandem_kv_held_blocks") == 0;
  }));
}

INSTANTIATE_TEST_SUITE_P(Transports, KvStaging, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

// What registering the KV buffer for RDMA depends on, as the agent found it
// at start: the soft RLIMIT_MEMLOCK it inherited (lowered here), whether it
// has CAP_IPC_LOCK, the node's RDMA devices; and its log says the same.
TEST(KvStagingStart, HealthSaysWhatRdmaRegistrationDependsOn) {
  std::unique_ptr<Agent> agent;
  rlim_t lowered = 0;
  {
    SoftMemlock memlock(3 << 20);
    ASSERT_TRUE(memlock.ok());
    lowered = memlock.bytes();
    agent = std::make_unique<Agent>(
        std::vector<std::string>{"--kv-transfer-config", ucxConfig("kv_producer")});
  }
  const json reported = health(*agent);
  EXPECT_EQ(reported["memlock_limit_bytes"], lowered) << reported.dump();
  EXPECT_EQ(reported["ipc_lock"], hasEffectiveCapability(14)) << reported.dump();
  std::vector<std::string> devices;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/infiniband", error)) {
    devices.push_back(entry.path().filename().string());
  }
  std::sort(devices.begin(), devices.end());
  EXPECT_EQ(reported["rdma_devices"], json(devices)) << reported.dump();
  EXPECT_NE(agent->stderrText().find("ucx connector: locked-memory limit " +
                                     std::to_string(lowered) + " bytes"),
            std::string::npos)
      << agent->stderrText();
}

TEST(KvStagingStart, BadKvBufferSettingsAreRefusedNamingTheField) {
  TempDir logs("tandem-kv-staging-start");
  auto refusal = [&](const json& extra) {
    ChildProcess agent(
        {std::string(TANDEM_BIN_DIR) + "/tandem-agent", "serve", "--model", tinyModelDir().string(),
         "--port", "0", "--kv-transfer-config", ucxConfig("kv_consumer", extra)},
        logs.path() / "stderr");
    EXPECT_EQ(agent.wait(std::chrono::seconds(30)), 1) << extra.dump();
    return agent.stderrText();
  };
  EXPECT_NE(refusal({{"kv_buffer", "staging"}, {"staging_blocks", 0}})
                .find("kv_connector_extra_config.staging_blocks must be an integer number of "
                      "block slots between 1 and 1048576, got 0"),
            std::string::npos);
  EXPECT_NE(refusal({{"staging_blocks", "many"}})
                .find("kv_connector_extra_config.staging_blocks must be an integer"),
            std::string::npos);
  EXPECT_NE(refusal({{"hold_slots", 0}})
                .find("kv_connector_extra_config.hold_slots must be a number of holds between 1 "
                      "and 16777216, got 0"),
            std::string::npos);
  EXPECT_NE(refusal({{"kv_buffer", "gpu"}})
                .find("kv_connector_extra_config.kv_buffer must be \"auto\", \"slab\" or "
                      "\"staging\", got \"gpu\""),
            std::string::npos);
}

}  // namespace
