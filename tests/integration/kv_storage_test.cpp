// The storage connector between real agent processes: a producer saves KV
// blocks to a shared path, a fresh consumer loads them instead of computing,
// with identical output; corrupted, truncated and missing files cost only the
// affected blocks (segmented prefill) or fail the request, by policy.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/support/agent_server.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

std::string storageConfig(const fs::path& path, const std::string& role,
                          const std::string& policy = "recompute") {
  return json{{"kv_connector", "storage"},
              {"kv_role", role},
              {"kv_connector_extra_config",
               {{"shared_storage_path", path.string()}, {"kv_load_failure_policy", policy}}}}
      .dump();
}

std::vector<fs::path> blockFiles(const fs::path& root) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().extension() == ".kvblock") files.push_back(entry.path());
  }
  return files;
}

// The file of block `index` of a prompt: the producer's files ordered by the
// order they were written is not observable, so find it by elimination: save
// a prompt truncated after the block, and diff the file sets.
class KvStorage : public ::testing::Test {
 protected:
  TempDir store_{"tandem-kv-store"};
  // 75 tokens: 4 full blocks can be loaded (the last token is always computed).
  std::vector<int> prompt_ = randomPrompt(75, 77);

  // Runs the prompt on a producer and returns its greedy tokens.
  std::vector<int> produce() {
    Agent producer({"--kv-transfer-config", storageConfig(store_.path(), "kv_producer")});
    return tokenIds(producer.post("/v1/completions", greedy(prompt_, 8)));
  }

  // The block file holding prompt block `index`, found by saving prefixes.
  fs::path fileOfBlock(int index) {
    TempDir probe("tandem-kv-probe");
    Agent producer({"--kv-transfer-config", storageConfig(probe.path(), "kv_producer")});
    std::vector<int> shorter(prompt_.begin(), prompt_.begin() + 16 * index + 1);
    producer.post("/v1/completions", greedy(shorter, 1));
    const auto before = blockFiles(probe.path());
    std::vector<int> longer(prompt_.begin(), prompt_.begin() + 16 * (index + 1) + 1);
    producer.post("/v1/completions", greedy(longer, 1));
    for (const auto& file : blockFiles(probe.path())) {
      if (std::find(before.begin(), before.end(), file) == before.end()) {
        return store_.path() / file.parent_path().filename() / file.filename();
      }
    }
    return {};
  }
};

TEST_F(KvStorage, ConsumerLoadsWhatTheProducerSavedWithIdenticalOutput) {
  const std::vector<int> expected = produce();
  EXPECT_EQ(blockFiles(store_.path()).size(), 5u) << "4 prompt blocks + 1 of generated tokens";
  Agent consumer({"--kv-transfer-config", storageConfig(store_.path(), "kv_consumer")});
  const double computed_before = consumer.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(consumer.post("/v1/completions", greedy(prompt_, 8))), expected);
  EXPECT_EQ(consumer.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 4);
  // 64 tokens loaded: 11 prompt tokens and 7 decode steps computed.
  EXPECT_EQ(consumer.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  EXPECT_EQ(blockFiles(store_.path()).size(), 5u) << "a consumer writes nothing";
}

TEST_F(KvStorage, CorruptedBlockIsRecomputedAloneAndOutputIsIdentical) {
  const std::vector<int> expected = produce();
  const fs::path victim = fileOfBlock(1);
  ASSERT_TRUE(fs::exists(victim)) << victim;
  {
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x5a');
    file.put('\xa5');
  }
  Agent consumer({"--kv-transfer-config", storageConfig(store_.path(), "kv_consumer")});
  const double computed_before = consumer.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(consumer.post("/v1/completions", greedy(prompt_, 8))), expected);
  EXPECT_EQ(consumer.metric("tandem_kv_blocks_recomputed_total"), 1);
  EXPECT_EQ(consumer.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 3);
  EXPECT_EQ(consumer.metric("tandem_kv_transfer_failures_total", "reason=\"checksum\""), 1);
  // Segmented prefill: block 1 (16 tokens), the 11-token tail and 7 decode
  // steps; blocks 2 and 3 after the gap are kept.
  EXPECT_EQ(consumer.metric("tandem_computed_tokens_total") - computed_before, 16 + 11 + 7);
}

TEST_F(KvStorage, TruncatedAndMissingFilesCostOnlyTheirBlocks) {
  const std::vector<int> expected = produce();
  const fs::path truncated = fileOfBlock(2);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  Agent consumer({"--kv-transfer-config", storageConfig(store_.path(), "kv_consumer")});
  EXPECT_EQ(tokenIds(consumer.post("/v1/completions", greedy(prompt_, 8))), expected);
  EXPECT_EQ(consumer.metric("tandem_kv_blocks_recomputed_total"), 1);

  // A missing file ends the run of loadable blocks: block 0 only.
  fs::remove(fileOfBlock(1));
  Agent second({"--kv-transfer-config", storageConfig(store_.path(), "kv_consumer")});
  EXPECT_EQ(tokenIds(second.post("/v1/completions", greedy(prompt_, 8))), expected);
  EXPECT_EQ(second.metric("tandem_kv_blocks_loaded_total", "source=\"storage\""), 1);
  EXPECT_EQ(second.metric("tandem_kv_blocks_recomputed_total"), 0);
}

TEST_F(KvStorage, FailPolicyEndsTheRequestWithAClearErrorAndKeepsServing) {
  produce();
  const fs::path victim = fileOfBlock(0);
  fs::resize_file(victim, 10);
  Agent consumer({"--kv-transfer-config", storageConfig(store_.path(), "kv_consumer", "fail")});
  int status = 0;
  json error = consumer.post("/v1/completions", greedy(prompt_, 8), &status);
  EXPECT_EQ(status, 500);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("failed to load"), std::string::npos)
      << error.dump();
  // Other requests are unaffected.
  EXPECT_EQ(tokenIds(consumer.post("/v1/completions", greedy(randomPrompt(10, 3), 3))).size(), 3u);
}

// An error raised inside an engine step (here the connector's lookup, by
// fault injection, for requests whose id contains "boom": a caller's
// X-Request-Id leads the id) ends that request with a 500 naming the cause;
// the agent serves everyone else, counts the failed step, and answers
// /health 503 only while steps keep failing with none completing.
TEST_F(KvStorage, AFailingStepEndsItsRequestsAndTheAgentGoesOn) {
  json config = json::parse(storageConfig(store_.path(), "kv_both"));
  config["kv_connector_extra_config"]["fault_injection"] = {{"throw_on_lookup", "boom"}};
  Agent agent({"--kv-transfer-config", config.dump(), "--enable-fault-injection"});
  auto postAs = [&](const std::string& request_id, const json& body) {
    auto res = agent.client()->Post("/v1/completions", {{"X-Request-Id", request_id}}, body.dump(),
                                    "application/json");
    if (!res) throw std::runtime_error("no response");
    return std::make_pair(res->status, json::parse(res->body));
  };
  const std::vector<int> expected = tokenIds(agent.post("/v1/completions", greedy(prompt_, 4)));
  auto [status, error] = postAs("boom-1", greedy(randomPrompt(30, 5), 4));
  EXPECT_EQ(status, 500);
  const std::string message = error["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("the engine failed computing this request: injected fault: the KV "
                         "connector's lookup of request boom-1"),
            std::string::npos)
      << message;
  EXPECT_EQ(agent.metric("tandem_engine_step_failures_total"), 1);
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"error\""), 1);
  EXPECT_EQ(agent.client()->Get("/health")->status, 200) << "one failed step in a row";

  // Others are served as before (a prefix-cache hit now).
  auto [good_status, good] = postAs("fine-1", greedy(prompt_, 4));
  EXPECT_EQ(good_status, 200);
  EXPECT_EQ(tokenIds(good), expected);

  for (const char* id : {"boom-2", "boom-3", "boom-4"}) {
    EXPECT_EQ(postAs(id, greedy(randomPrompt(30, 6), 4)).first, 500);
  }
  auto health = agent.client()->Get("/health");
  EXPECT_EQ(health->status, 503);
  const json failing = json::parse(health->body);
  EXPECT_EQ(failing["status"], "engine_failing");
  EXPECT_EQ(failing["failed_steps_in_a_row"], 3);
  EXPECT_NE(failing["error"].get<std::string>().find("boom-4"), std::string::npos);
  // One step that completes makes it healthy again.
  EXPECT_EQ(postAs("fine-2", greedy(randomPrompt(20, 7), 2)).first, 200);
  EXPECT_EQ(agent.client()->Get("/health")->status, 200);
  EXPECT_EQ(agent.metric("tandem_engine_step_failures_total"), 4);
}

TEST(KvTransferConfig, BadConfigsAreRefusedAtStartNamingTheField) {
  TempDir logs("tandem-kv-config");
  struct Case {
    std::string config;
    std::string message;
  };
  for (
      const Case& c : std::vector<Case>{
          {"not json", "--kv-transfer-config is not valid JSON (byte 2)"},
          {R"({"kv_connector":"nixl"})", "kv_connector \"nixl\" is not supported"},
          {R"({"kv_connector":"storage","kv_role":"reader"})", "kv_role must be"},
          {R"({"kv_connector":"storage"})", "shared_storage_path"},
          {R"({"kv_connector":"storage","kv_connector_extra_config":{"shared_storage_path":"/tmp/x","kv_load_failure_policy":"retry"}})",
           "kv_load_failure_policy must be recompute or fail"}}) {
    ChildProcess agent({std::string(TANDEM_BIN_DIR) + "/tandem-agent", "serve", "--model",
                        tinyModelDir().string(), "--port", "0", "--kv-transfer-config", c.config},
                       logs.path() / "stderr");
    EXPECT_EQ(agent.wait(std::chrono::seconds(30)), 1) << c.config;
    EXPECT_NE(agent.stderrText().find(c.message), std::string::npos)
        << c.config << " → " << agent.stderrText();
  }
}

}  // namespace
