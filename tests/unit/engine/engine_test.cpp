// The engine with KV connectors (fakes behind the real contract): requests
// wait for an asynchronous load without blocking others, loaded KV gives the
// same tokens as computing it, failed blocks are recomputed, an abort during
// a load frees the blocks only once the load is over, and blocks held for a
// remote reader are freed by an explicit release or when the hold times out
// on the engine's (injected) clock.
#include "agent/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "agent/engine/model_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

// The compute backend the runners here use.
kernels::Backend& cpuBackend() {
  static kernels::cpu::CpuBackend backend;
  return backend;
}

const std::filesystem::path& modelDir() {
  static ::tandem::testing::TempDir dir("tandem-engine-test");
  static bool written = [] {
    tools::TestModelOptions options;
    options.seed = 5;
    tools::writeTestModel(options, dir.path());
    return true;
  }();
  (void)written;
  return dir.path();
}

std::vector<TokenId> randomTokens(size_t n, uint32_t seed) {
  return ::tandem::testing::randomTokenIds(n, seed, 3, 480);
}

// Serves the KV of one prompt, computed in a cache of its own; loads finish
// only when the test says so.
class FakeAsyncConnector : public kv::KvConnector, kv::KvConnectorScheduler, kv::KvConnectorWorker {
 public:
  FakeAsyncConnector(KvCache& engine_cache, std::vector<TokenId> prompt)
      : engine_cache_(engine_cache), prompt_(std::move(prompt)) {
    model_ = Model::load(modelDir());
    KvCacheConfig config = engine_cache.config();
    config.num_blocks = 16;
    source_ = std::make_unique<KvCache>(config, std::make_unique<HostSlabAllocator>());
    ModelRunner runner(*model_, *source_, cpuBackend());
    std::vector<BlockId> blocks(16);
    std::iota(blocks.begin(), blocks.end(), 0);
    SequenceInput input{prompt_, 0, blocks};
    std::vector<float> logits;
    runner.forward({&input, 1}, logits);
    config_.connector = "fake";
  }

  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const kv::KvTransferConfig& config() const override { return config_; }

  kv::LookupResult lookup(const kv::ConnectorRequest& request, int64_t num_local) override {
    kv::LookupResult result;
    if (!complete_when_looked_up_.empty() && request.request_id == complete_when_looked_up_) {
      complete_when_looked_up_.clear();
      complete({});
    }
    // As the UCX connector: a source once read is not read again.
    if (request.remote_source_spent) {
      ++spent_lookups_;
      return result;
    }
    // The prompt's KV, whatever the request generated since.
    if (request.tokens.size() < prompt_.size() ||
        !std::equal(prompt_.begin(), prompt_.end(), request.tokens.begin())) {
      return result;
    }
    const int64_t block = engine_cache_.blockSize();
    const int64_t available = (static_cast<int64_t>(prompt_.size()) - 1) / block * block;
    if (available > num_local) {
      result.state = kv::LookupResult::State::kAvailable;
      result.num_tokens = available - num_local;
    }
    return result;
  }

  kv::LoadResult load(const kv::ConnectorRequest& request, int64_t first_block,
                      std::span<const BlockId> block_ids) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++loads_;
    pending_.push_back({std::string(request.request_id), first_block,
                        std::vector<BlockId>(block_ids.begin(), block_ids.end())});
    loads_started_.notify_all();
    kv::LoadResult result;
    result.done = false;
    return result;
  }

  void save(const kv::ConnectorRequest&, int64_t, std::span<const BlockId>) override {}

  kv::FinishDecision requestFinished(const kv::ConnectorRequest& request, std::span<const BlockId>,
                                     int64_t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_.push_back("finished " + std::string(request.request_id));
    return {};
  }
  void requestAbandoned(std::string_view request_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_.push_back("abandoned " + std::string(request_id));
  }

  std::vector<FinishedLoad> poll() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(finished_, {});
  }
  // How each request's end reached the connector, in order.
  std::vector<std::string> ended() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ended_;
  }

  // The pending load completes (reported at the next step) when request
  // `id` is looked up, i.e. as it is admitted. Call before adding it.
  void completeWhenLookedUp(std::string id) { complete_when_looked_up_ = std::move(id); }
  int loads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }
  int spentLookups() const { return spent_lookups_.load(); }

  // Blocks until a load was started; returns its request id.
  std::string waitForLoad() {
    std::unique_lock<std::mutex> lock(mutex_);
    loads_started_.wait_for(lock, std::chrono::seconds(20), [&] { return !pending_.empty(); });
    return pending_.empty() ? "" : pending_.front().request_id;
  }

  // Writes the blocks (garbage for the failed ones) and reports the load.
  void complete(const std::vector<int64_t>& failed) {
    std::lock_guard<std::mutex> lock(mutex_);
    Pending load = pending_.front();
    pending_.erase(pending_.begin());
    for (size_t i = 0; i < load.blocks.size(); ++i) {
      const int64_t index = load.first_block + static_cast<int64_t>(i);
      uint8_t* to = engine_cache_.blockData(load.blocks[i]);
      if (std::find(failed.begin(), failed.end(), index) != failed.end()) {
        std::memset(to, 0x7f, engine_cache_.blockBytes());
      } else {
        std::memcpy(to, source_->blockData(static_cast<BlockId>(index)),
                    engine_cache_.blockBytes());
      }
    }
    FinishedLoad finished;
    finished.request_id = load.request_id;
    finished.failed_block_indices = failed;
    finished_.push_back(std::move(finished));
  }

 private:
  struct Pending {
    std::string request_id;
    int64_t first_block;
    std::vector<BlockId> blocks;
  };
  KvCache& engine_cache_;
  std::vector<TokenId> prompt_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> source_;
  kv::KvTransferConfig config_;
  std::mutex mutex_;
  std::condition_variable loads_started_;
  std::vector<Pending> pending_;
  std::vector<FinishedLoad> finished_;
  std::vector<std::string> ended_;
  int loads_ = 0;
  std::atomic<int> spent_lookups_{0};
  std::string complete_when_looked_up_;  // engine thread, once set
};

// Collects a request's outputs; waits for the final one.
struct Collector {
  std::mutex mutex;
  std::condition_variable done;
  std::vector<TokenId> tokens;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  int64_t cached_tokens = 0;

  Engine::OutputCallback callback() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& token : out.tokens) tokens.push_back(token.token);
      if (out.finished()) {
        reason = out.finish_reason;
        error = out.error;
        cached_tokens = out.num_cached_tokens;
        done.notify_all();
      }
    };
  }
  bool waitFinished() {
    std::unique_lock<std::mutex> lock(mutex);
    return done.wait_for(lock, std::chrono::seconds(30),
                         [&] { return reason != FinishReason::kNone; });
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(mutex);
    return reason != FinishReason::kNone;
  }
};

Request greedyRequest(const std::string& id, std::vector<TokenId> prompt, int64_t max_tokens) {
  Request request;
  request.id = id;
  request.prompt = std::move(prompt);
  request.sampling.temperature = 0;
  request.sampling.ignore_eos = true;
  request.sampling.max_tokens = max_tokens;
  return request;
}

EngineConfig engineConfig() {
  EngineConfig config;
  config.model_dir = modelDir();
  config.num_blocks = 64;
  return config;
}

// A LoRA adapter (every projection) for modelDir()'s model.
const std::filesystem::path& loraDir() {
  static ::tandem::testing::TempDir dir("tandem-engine-lora");
  static bool written = [] {
    tools::writeTestLoraAdapter({}, ModelConfig::fromFile(modelDir() / "config.json"), dir.path());
    return true;
  }();
  (void)written;
  return dir.path();
}

std::vector<TokenId> generateWithoutConnector(const std::vector<TokenId>& prompt,
                                              int64_t max_tokens = 8) {
  Engine engine(engineConfig());
  Collector collector;
  EXPECT_TRUE(
      engine.addRequest(greedyRequest("r", prompt, max_tokens), collector.callback()).isOk());
  EXPECT_TRUE(collector.waitFinished());
  return collector.tokens;
}

using ::tandem::testing::eventually;

class AsyncLoad : public ::testing::Test {
 protected:
  Engine& start(int64_t num_blocks = 64) {
    EngineConfig config = engineConfig();
    config.num_blocks = num_blocks;
    config.connector_factory = [this](KvCache& cache, const std::string&) {
      auto connector = std::make_unique<FakeAsyncConnector>(cache, prompt_);
      connector_ = connector.get();
      return connector;
    };
    engine_ = std::make_unique<Engine>(config);
    return *engine_;
  }

  std::vector<TokenId> prompt_ = randomTokens(75, 9);  // 4 loadable blocks
  FakeAsyncConnector* connector_ = nullptr;
  std::unique_ptr<Engine> engine_;
};

TEST_F(AsyncLoad, WaitingRequestDoesNotBlockOthersAndLoadedKvGivesTheSameTokens) {
  const std::vector<TokenId> expected = generateWithoutConnector(prompt_);
  Engine& engine = start();
  Collector loaded, other;
  ASSERT_TRUE(engine.addRequest(greedyRequest("loaded", prompt_, 8), loaded.callback()).isOk());
  ASSERT_EQ(connector_->waitForLoad(), "loaded");
  // While "loaded" waits for its KV, another request runs to completion.
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("other", randomTokens(20, 4), 5), other.callback()).isOk());
  ASSERT_TRUE(other.waitFinished());
  EXPECT_FALSE(loaded.finished());
  const int64_t computed_before = engine.stats().num_computed_tokens;
  connector_->complete({});
  ASSERT_TRUE(loaded.waitFinished());
  EXPECT_EQ(loaded.tokens, expected);
  EXPECT_EQ(engine.stats().kv_blocks_loaded, 4);
  // 64 tokens loaded: the 11-token tail and 7 decode steps computed.
  EXPECT_EQ(engine.stats().num_computed_tokens - computed_before, 11 + 7);
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
  EXPECT_EQ(connector_->ended(), (std::vector<std::string>{"finished other", "finished loaded"}));
}

// A loaded request preempted later recomputes its prompt: the producer let
// the blocks it read go, so the connector is told its source is spent and
// nothing is read twice. 16 blocks cannot hold both 225-token requests; the
// loaded one, whose load ends as the other is admitted, is admitted last and
// preempted.
TEST_F(AsyncLoad, APreemptedLoadedRequestNeverReadsItsSourceAgain) {
  const std::vector<TokenId> other_prompt = randomTokens(75, 4);
  const std::vector<TokenId> expected = generateWithoutConnector(prompt_, 150);
  const std::vector<TokenId> other_expected = generateWithoutConnector(other_prompt, 150);
  Engine& engine = start(16);
  Collector loaded, other;
  ASSERT_TRUE(engine.addRequest(greedyRequest("loaded", prompt_, 150), loaded.callback()).isOk());
  ASSERT_EQ(connector_->waitForLoad(), "loaded");
  connector_->completeWhenLookedUp("other");
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("other", other_prompt, 150), other.callback()).isOk());
  ASSERT_TRUE(loaded.waitFinished());
  ASSERT_TRUE(other.waitFinished());
  EXPECT_GE(engine.stats().num_preemptions, 1);
  EXPECT_EQ(connector_->loads(), 1);
  EXPECT_GE(connector_->spentLookups(), 1);
  EXPECT_EQ(loaded.tokens, expected);
  EXPECT_EQ(other.tokens, other_expected);
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 16; }));
}

TEST_F(AsyncLoad, FailedBlocksAreRecomputedAndTheOutputIsUnchanged) {
  const std::vector<TokenId> expected = generateWithoutConnector(prompt_);
  Engine& engine = start();
  Collector loaded;
  ASSERT_TRUE(engine.addRequest(greedyRequest("loaded", prompt_, 8), loaded.callback()).isOk());
  ASSERT_EQ(connector_->waitForLoad(), "loaded");
  const int64_t computed_before = engine.stats().num_computed_tokens;
  connector_->complete({1});  // block 1 gets garbage and is reported failed
  ASSERT_TRUE(loaded.waitFinished());
  EXPECT_EQ(loaded.tokens, expected);
  EXPECT_EQ(engine.stats().kv_blocks_failed, 1);
  EXPECT_EQ(engine.stats().num_computed_tokens - computed_before, 16 + 11 + 7);
}

TEST_F(AsyncLoad, AbortDuringLoadFreesBlocksOnlyAfterTheLoad) {
  Engine& engine = start();
  Collector loaded;
  ASSERT_TRUE(engine.addRequest(greedyRequest("loaded", prompt_, 8), loaded.callback()).isOk());
  ASSERT_EQ(connector_->waitForLoad(), "loaded");
  engine.abort("loaded");
  ASSERT_TRUE(loaded.waitFinished());
  EXPECT_EQ(loaded.reason, FinishReason::kAbort);
  // The connector forgets what it kept for the request (a declined
  // transfer, a lookup's winner)...
  EXPECT_EQ(connector_->ended(), std::vector<std::string>{"abandoned loaded"});
  // ...but may still write its blocks: they stay allocated.
  std::this_thread::yield();
  EXPECT_LT(engine.stats().num_free_blocks, 64);
  connector_->complete({});
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
}

// Holds every finished request's blocks for a reader that never comes.
class HoldingConnector : public kv::KvConnector, kv::KvConnectorScheduler, kv::KvConnectorWorker {
 public:
  HoldingConnector() {
    config_.connector = "holding";
    config_.abort_timeout_s = 30;
  }
  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const kv::KvTransferConfig& config() const override { return config_; }
  // The request `stuck_id` stays queued: its lookup never completes.
  explicit HoldingConnector(std::string stuck_id) : HoldingConnector() {
    stuck_id_ = std::move(stuck_id);
  }
  kv::LookupResult lookup(const kv::ConnectorRequest& request, int64_t) override {
    kv::LookupResult result;
    if (request.request_id == stuck_id_) result.state = kv::LookupResult::State::kPending;
    return result;
  }
  kv::FinishDecision requestFinished(const kv::ConnectorRequest& request, std::span<const BlockId>,
                                     int64_t) override {
    return {true, {{"transfer_id", std::string(request.request_id)}}};
  }
  void holdEnded(std::string_view id) override {
    std::lock_guard<std::mutex> lock(ended_mutex_);
    ended_.emplace_back(id);
  }
  std::vector<std::string> ended() const {
    std::lock_guard<std::mutex> lock(ended_mutex_);
    return ended_;
  }
  StatusOr<std::string> releaseTarget(const nlohmann::json& params) const override {
    return params.value("transfer_id", std::string());
  }
  kv::LoadResult load(const kv::ConnectorRequest&, int64_t, std::span<const BlockId>) override {
    return {};
  }
  void save(const kv::ConnectorRequest&, int64_t, std::span<const BlockId>) override {}

 private:
  kv::KvTransferConfig config_;
  std::string stuck_id_;
  mutable std::mutex ended_mutex_;
  std::vector<std::string> ended_;
};

class HeldBlocks : public ::testing::Test {
 protected:
  Engine& start(int64_t num_blocks = 64, const std::string& stuck_id = "",
                double hold_yield_after_s = 10.0) {
    EngineConfig config = engineConfig();
    config.num_blocks = num_blocks;
    config.hold_yield_after_s = hold_yield_after_s;
    config.lora_modules = lora_modules_;
    config.connector_factory = [this, stuck_id](KvCache&, const std::string&) {
      auto connector = std::make_unique<HoldingConnector>(stuck_id);
      connector_ = connector.get();
      return connector;
    };
    config.clock = [this] { return Clock::time_point(std::chrono::seconds(now_seconds_.load())); };
    engine_ = std::make_unique<Engine>(config);
    return *engine_;
  }
  // Returns once the engine loop has looked at its held blocks with the
  // clock as it is now: each snapshot is served after a release pass.
  void settle() {
    engine_->kvSnapshot();
    engine_->kvSnapshot();
  }

  // Runs `prompt` to its end and lets its held blocks go: they stay cached,
  // unreferenced, for holdPrefix to find.
  void cache(const std::string& id, const std::vector<TokenId>& prompt,
             const std::string& adapter = "") {
    Collector finished;
    Request request = greedyRequest(id, prompt, 1);
    request.adapter = adapter;
    ASSERT_TRUE(engine_->addRequest(std::move(request), finished.callback()).isOk());
    ASSERT_TRUE(finished.waitFinished());
    ASSERT_TRUE(engine_->releaseTransfer({{"transfer_id", id}}).isOk());
    settle();
  }

  std::atomic<int64_t> now_seconds_{1000};
  std::vector<LoraModuleSpec> lora_modules_;  // given to the engine start() makes
  HoldingConnector* connector_ = nullptr;     // owned by engine_
  std::unique_ptr<Engine> engine_;
};

// A finished request whose answer never reached its client (who left while
// it was queued for them) is aborted: the blocks held for a reader that will
// never learn where they are go at once, not at the hold timeout. A lend
// (another id) is not touched.
TEST_F(HeldBlocks, AnAbortOfAFinishedRequestReleasesItsHeldBlocks) {
  Engine& engine = start();
  const std::vector<TokenId> prompt = randomTokens(40, 5);
  Collector finished;
  ASSERT_TRUE(engine.addRequest(greedyRequest("held", prompt, 1), finished.callback()).isOk());
  ASSERT_TRUE(finished.waitFinished());
  ASSERT_TRUE(engine.holdPrefix(prompt, "").isOk());
  EXPECT_EQ(engine.stats().kv_held_blocks, 3);
  engine.abort("held");
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 2) << "the lend of the prompt's 2 full blocks stays";
  engine.abort("held");    // nothing left to release
  engine.abort("hold-1");  // a lend is not a request: an abort leaves it
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 2);
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "hold-1"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

// A pull-back hold names the adapter whose blocks it wants: the base
// model's hold of the same tokens finds none of them.
TEST_F(HeldBlocks, AHoldOfAnAdaptersPromptLendsOnlyThatAdaptersBlocks) {
  lora_modules_ = {{"sql", loraDir()}};
  Engine& engine = start();
  const std::vector<TokenId> prompt = randomTokens(40, 25);
  cache("lora", prompt, "sql");
  const auto base = engine.holdPrefix(prompt, "");
  ASSERT_FALSE(base.isOk());
  EXPECT_EQ(base.status().code(), StatusCode::kNotFound) << base.status().message();
  const auto held = engine.holdPrefix(prompt, "", "sql");
  ASSERT_TRUE(held.isOk()) << held.status().message();
  EXPECT_EQ(engine.stats().kv_held_blocks, 2);
  const auto unknown = engine.holdPrefix(prompt, "", "nope");
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), "this agent serves no LoRA adapter named nope");
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "hold-1"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

TEST_F(HeldBlocks, TheGaugeCountsABlockPinnedByTwoHoldsOnce) {
  Engine& engine = start();
  const std::vector<TokenId> prompt = randomTokens(40, 3);
  Collector finished;
  ASSERT_TRUE(engine.addRequest(greedyRequest("held", prompt, 1), finished.callback()).isOk());
  ASSERT_TRUE(finished.waitFinished());
  EXPECT_EQ(engine.stats().kv_held_blocks, 3);
  const int64_t queries = engine.stats().prefix_cache_queries;
  const int64_t hits = engine.stats().prefix_cache_hits;
  EXPECT_EQ(queries, 40);
  // Two pull-back holds of the prompt's 2 cached full blocks: the same
  // blocks the finished request holds. They are not prompts: the prefix
  // cache's counters stay.
  ASSERT_TRUE(engine.holdPrefix(prompt, "").isOk());
  ASSERT_TRUE(engine.holdPrefix(prompt, "").isOk());
  EXPECT_EQ(engine.stats().kv_held_blocks, 3);
  EXPECT_EQ(engine.stats().prefix_cache_queries, queries);
  EXPECT_EQ(engine.stats().prefix_cache_hits, hits);
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "held"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 2);
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "hold-1"}}).isOk());
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "hold-2"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

TEST_F(HeldBlocks, HoldsPinAtMostAQuarterOfTheCacheEachAndHalfTogether) {
  Engine& engine = start();  // 64 blocks: 16 per hold, 32 for all holds
  EXPECT_EQ(engine.maxHoldBlocks(), 16);
  EXPECT_EQ(engine.maxTotalHoldBlocks(), 32);
  const std::vector<TokenId> first = randomTokens(300, 11), second = randomTokens(300, 12),
                             third = randomTokens(300, 13);
  cache("first", first);  // 18 full blocks cached
  ASSERT_TRUE(engine.holdPrefix(first, "").isOk());
  EXPECT_EQ(engine.stats().kv_held_blocks, 16) << "the leading 16 of 18 blocks";
  // The same prefix again pins nothing new: it fits whatever the total.
  ASSERT_TRUE(engine.holdPrefix(first, "").isOk());
  cache("second", second);
  ASSERT_TRUE(engine.holdPrefix(second, "").isOk());
  EXPECT_EQ(engine.stats().kv_held_blocks, 32);
  cache("third", third);
  auto refused = engine.holdPrefix(third, "");
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(),
            "pull-back holds already pin 32 KV blocks of this agent; this hold would pin 16 more, "
            "past --kv-hold-max-total-blocks 32; retry later");
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 32) << "a refused hold pins nothing";
  for (const char* id : {"hold-1", "hold-2", "hold-3"}) {
    ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", id}}).isOk()) << id;
  }
  settle();
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

TEST_F(HeldBlocks, AHoldNeverTakesTheBlocksAQueuedRequestNeeds) {
  // 24 blocks (6 per hold, 12 in all); a queued request of 360 tokens needs 23.
  Engine& engine = start(24, "stuck");
  const std::vector<TokenId> prompt = randomTokens(40, 3);
  cache("cached", prompt);  // 2 full blocks cached, unreferenced
  ASSERT_TRUE(engine.holdPrefix(prompt, "").isOk()) << "nothing is queued yet";
  ASSERT_TRUE(engine.releaseTransfer({{"transfer_id", "hold-1"}}).isOk());
  Collector stuck;
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("stuck", randomTokens(360, 4), 1), stuck.callback()).isOk());
  auto refused = engine.holdPrefix(prompt, "");
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(),
            "this hold would leave 22 free KV blocks, fewer than the 23 the waiting requests need "
            "(holds never take blocks from admission); retry later");
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  engine.abort("stuck");
  ASSERT_TRUE(stuck.waitFinished());
  EXPECT_TRUE(engine.holdPrefix(prompt, "").isOk()) << "nothing is queued any more";
}

TEST_F(HeldBlocks, AHoldWaitsForPrefixBlocksALiveRequestIsComputing) {
  // A lend asked for while the lender is still computing the prompt (a
  // burst for one system prompt): the hold waits for the blocks coming
  // into the cache and lends them all (the 16-block cap of a 64-block
  // cache), instead of the few computed so far or nothing.
  EngineConfig config = engineConfig();
  config.scheduler.max_num_batched_tokens = 16;  // the prompt takes 19 steps
  config.connector_factory = [](KvCache&, const std::string&) {
    return std::make_unique<HoldingConnector>("");
  };
  engine_ = std::make_unique<Engine>(config);
  const std::vector<TokenId> prompt = randomTokens(300, 21);
  Collector finished;
  ASSERT_TRUE(
      engine_->addRequest(greedyRequest("computing", prompt, 1), finished.callback()).isOk());
  auto held = engine_->holdPrefix(prompt, "");
  ASSERT_TRUE(held.isOk()) << held.status().message();
  ASSERT_TRUE(finished.waitFinished());
  // The request's own blocks go; what stays pinned is the hold's.
  ASSERT_TRUE(engine_->releaseTransfer({{"transfer_id", "computing"}}).isOk());
  settle();
  EXPECT_EQ(engine_->stats().kv_held_blocks, 16);
  ASSERT_TRUE(engine_->releaseTransfer({{"transfer_id", "hold-1"}}).isOk());
  settle();
  EXPECT_EQ(engine_->stats().kv_held_blocks, 0);
  // With nothing coming, a hold answers at once with what is cached.
  const std::vector<TokenId> other = randomTokens(300, 22);
  auto none = engine_->holdPrefix(other, "");
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
}

TEST_F(HeldBlocks, AreFreedWhenTheHoldTimesOutOnTheEnginesClock) {
  Engine& engine = start();
  Collector finished;
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("held", randomTokens(40, 3), 1), finished.callback()).isOk());
  ASSERT_TRUE(finished.waitFinished());
  EXPECT_EQ(engine.stats().kv_held_blocks, 3);  // 40 prompt tokens + 1 → 3 blocks
  now_seconds_ = 1029;                          // abort_timeout_s is 30
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 3) << "held until the timeout";
  now_seconds_ = 1030;
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

// The connector hears of each hold's end once, however it ends (it ends its
// hold ticket there before the blocks are freed), but not of a hold replaced
// under the same id: its requestFinished() for the new one ended that.
TEST_F(HeldBlocks, TheConnectorHearsOfEachHoldsEndOnce) {
  Engine& engine = start();
  auto run = [&](const std::string& id, uint32_t seed) {
    Collector finished;
    ASSERT_TRUE(engine.addRequest(greedyRequest(id, randomTokens(40, seed), 1), finished.callback())
                    .isOk());
    ASSERT_TRUE(finished.waitFinished());
  };
  run("a", 1);
  run("b", 2);
  run("b", 3);  // the same id again: its earlier hold is replaced
  EXPECT_EQ(connector_->ended(), std::vector<std::string>{});
  EXPECT_TRUE(engine.releaseTransfer({{"transfer_id", "a"}}).isOk());
  settle();
  EXPECT_EQ(connector_->ended(), std::vector<std::string>{"a"});
  EXPECT_EQ(engine.releaseTransfer({{"transfer_id", "a"}}).code(), StatusCode::kNotFound);
  now_seconds_ = 1030;  // abort_timeout_s is 30
  settle();
  EXPECT_EQ(connector_->ended(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
}

// Holds of finished requests whose readers have not come give way to a
// request that cannot be admitted without their blocks once they are older
// than hold_yield_after_s (10 s here), oldest first and only as many as it
// lacks; with 0 they wait for their timeout (abort_timeout_s, 30 s).
TEST_F(HeldBlocks, OldHoldsGiveWayToARequestThatNeedsTheirBlocks) {
  for (const double yield_after : {10.0, 0.0}) {
    now_seconds_ = 1000;
    Engine& engine = start(9, "", yield_after);
    for (const char* id : {"a", "b", "c"}) {
      Collector finished;
      ASSERT_TRUE(
          engine.addRequest(greedyRequest(id, randomTokens(40, id[0]), 1), finished.callback())
              .isOk());
      ASSERT_TRUE(finished.waitFinished());
      now_seconds_ += 1;  // a is the oldest
    }
    ASSERT_EQ(engine.stats().kv_held_blocks, 9);  // 3 blocks each, none free
    Collector waiting;
    ASSERT_TRUE(
        engine.addRequest(greedyRequest("d", randomTokens(40, 9), 1), waiting.callback()).isOk());
    now_seconds_ = 1009;  // a has been held 9 s
    settle();
    EXPECT_EQ(engine.stats().num_waiting, 1);
    EXPECT_EQ(engine.stats().num_holds_yielded, 0);
    now_seconds_ = 1010;
    if (yield_after > 0) {
      ASSERT_TRUE(waiting.waitFinished());
      EXPECT_EQ(engine.stats().num_holds_yielded, 1);
      EXPECT_EQ(connector_->ended(), std::vector<std::string>{"a"}) << "one hold was enough";
      EXPECT_EQ(engine.stats().kv_held_blocks, 9) << "b, c and now d";
    } else {
      settle();
      EXPECT_EQ(engine.stats().num_waiting, 1) << "holds wait for their timeout";
      now_seconds_ = 1030;  // a's timeout (abort_timeout_s 30)
      ASSERT_TRUE(waiting.waitFinished());
      EXPECT_EQ(engine.stats().num_holds_yielded, 0);
    }
    now_seconds_ = 1100;  // every hold times out
    settle();
    EXPECT_EQ(engine.stats().kv_held_blocks, 0);
    EXPECT_EQ(engine.stats().num_free_blocks, 9);
    engine_.reset();
  }
}

TEST_F(HeldBlocks, AnExplicitReleaseFreesThemAtOnceAndOnlyOnce) {
  Engine& engine = start();
  Collector finished;
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("held", randomTokens(40, 3), 1), finished.callback()).isOk());
  ASSERT_TRUE(finished.waitFinished());
  EXPECT_EQ(engine.releaseTransfer({{"transfer_id", "other"}}).code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine.releaseTransfer({{"transfer_id", "held"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);
  EXPECT_EQ(engine.releaseTransfer({{"transfer_id", "held"}}).code(), StatusCode::kNotFound);
}

// A drain hands over the running requests that allow it: each ends at once
// (abort, handed_over) with the descriptor of a hold on every full block it
// computed; a request that does not allow it runs to its end; nothing new
// is admitted or lent; releasing the hand-over's hold frees its blocks.
TEST_F(HeldBlocks, ADrainHandsOverTheRequestsThatAllowItWithTheirBlocksHeld) {
  Engine& engine = start(256);
  std::mutex mutex;
  std::condition_variable changed;
  int64_t moved_tokens = 0;
  RequestOutput handed;
  // The drain begins from the request's own output callback (the engine
  // thread, between steps) once it has 20 tokens: the tiny model would
  // otherwise finish all 200 before a waiting test thread could begin it.
  auto on_moved = [&](const RequestOutput& out) {
    std::lock_guard<std::mutex> lock(mutex);
    const bool had_20 = moved_tokens >= 20;
    moved_tokens += std::ssize(out.tokens);
    if (!had_20 && moved_tokens >= 20) engine.drain();
    if (out.finished()) handed = out;
    changed.notify_all();
  };
  // The staying request first: were the test thread descheduled between
  // the two, the movable one could begin the drain before it was admitted.
  Collector staying;
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("staying", randomTokens(30, 6), 40), staying.callback())
          .isOk());
  Request movable = greedyRequest("movable", randomTokens(40, 5), 200);
  movable.hand_over_on_drain = true;
  ASSERT_TRUE(engine.addRequest(movable, on_moved).isOk());
  {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(
        changed.wait_for(lock, std::chrono::seconds(30), [&] { return handed.finished(); }));
  }
  EXPECT_TRUE(engine.draining());
  EXPECT_TRUE(handed.handed_over);
  EXPECT_EQ(handed.finish_reason, FinishReason::kAbort);
  EXPECT_LT(handed.num_generated_tokens, 200);
  // Every full block of the tokens it computed (the last one sampled has no
  // KV yet).
  const int64_t computed = 40 + handed.num_generated_tokens - 1;
  EXPECT_EQ(engine.stats().num_handed_over, 1);
  EXPECT_EQ(engine.stats().num_handed_over_blocks, computed / 16);
  ASSERT_TRUE(handed.kv_transfer_params.is_object()) << handed.kv_transfer_params.dump();

  const Status refused =
      engine.addRequest(greedyRequest("late", randomTokens(20, 7), 4), [](const RequestOutput&) {});
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("draining"), std::string::npos) << refused.message();
  EXPECT_EQ(engine.holdPrefix(randomTokens(40, 5), "").status().code(), StatusCode::kUnavailable);

  ASSERT_TRUE(staying.waitFinished());
  EXPECT_EQ(staying.reason, FinishReason::kLength);
  EXPECT_EQ(staying.tokens.size(), 40u);
  // Both readers release (the staying request's blocks were held for its
  // decode agent, as every finished request's are with this connector).
  EXPECT_TRUE(engine.releaseTransfer(handed.kv_transfer_params).isOk());
  EXPECT_TRUE(engine.releaseTransfer({{"transfer_id", "staying"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 256);
}

// A hand-over asked for after the drain began (a router that found, late,
// another agent to resume the stream on): the request that allows it is
// handed over at once, with its blocks held; one that does not, and an
// unknown id, change nothing (the former runs to its end).
TEST_F(HeldBlocks, ALateAskHandsOverARunningRequestThatAllowsIt) {
  Engine& engine = start(256);
  std::mutex mutex;
  std::condition_variable changed;
  int64_t tokens = 0;
  RequestOutput handed;
  // From the output callback (the engine thread, between steps): the drain
  // after 20 tokens, the asks after 30 (the drain's own hand-over, of no
  // request, is done by then).
  auto on_late = [&](const RequestOutput& out) {
    std::lock_guard<std::mutex> lock(mutex);
    const int64_t before = tokens;
    tokens += std::ssize(out.tokens);
    if (before < 20 && tokens >= 20) engine.drain();
    if (before < 30 && tokens >= 30) {
      engine.askHandOver("fixed");
      engine.askHandOver("nobody");
      engine.askHandOver("late");
    }
    if (out.finished()) handed = out;
    changed.notify_all();
  };
  Collector fixed;
  Request fixed_request = greedyRequest("fixed", randomTokens(30, 6), 60);
  ASSERT_TRUE(engine.addRequest(fixed_request, fixed.callback()).isOk());
  Request late = greedyRequest("late", randomTokens(40, 5), 200);
  late.can_hand_over = true;
  ASSERT_TRUE(engine.addRequest(late, on_late).isOk());
  {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(
        changed.wait_for(lock, std::chrono::seconds(30), [&] { return handed.finished(); }));
  }
  EXPECT_TRUE(handed.handed_over);
  EXPECT_EQ(handed.finish_reason, FinishReason::kAbort);
  EXPECT_GE(handed.num_generated_tokens, 30);
  EXPECT_LT(handed.num_generated_tokens, 200);
  EXPECT_EQ(engine.stats().num_handed_over, 1);
  ASSERT_TRUE(handed.kv_transfer_params.is_object()) << handed.kv_transfer_params.dump();
  ASSERT_TRUE(fixed.waitFinished());
  EXPECT_EQ(fixed.reason, FinishReason::kLength);
  EXPECT_EQ(fixed.tokens.size(), 60u);
  EXPECT_TRUE(engine.releaseTransfer(handed.kv_transfer_params).isOk());
  EXPECT_TRUE(engine.releaseTransfer({{"transfer_id", "fixed"}}).isOk());
  settle();
  EXPECT_EQ(engine.stats().kv_held_blocks, 0);
  EXPECT_EQ(engine.stats().num_free_blocks, 256);
}

// The model identity (what block hashes and connector handshakes are made
// from) names the weights by their content and the kernels whose bits the
// KV has: the same weights under another directory name are the same
// model; other weights of the same shape under the same directory name (a
// Hub snapshot's directory is its revision: "main" for every model) are
// not; and it says which device and instruction set computed it.
TEST(EngineIdentity, NamesTheWeightsByContentAndTheKernelsThatRan) {
  ::tandem::testing::TempDir dir("tandem-identity");
  auto identityOf = [](const std::filesystem::path& model, uint64_t seed) {
    tools::TestModelOptions options;
    options.seed = seed;
    tools::writeTestModel(options, model);
    EngineConfig config = engineConfig();
    config.model_dir = model;
    return Engine(config).modelIdentity();
  };
  const std::string main_a = identityOf(dir.path() / "a" / "main", 5);
  const std::string renamed_a = identityOf(dir.path() / "copy-of-a", 5);
  const std::string main_b = identityOf(dir.path() / "b" / "main", 6);
  EXPECT_EQ(main_a, renamed_a);
  EXPECT_NE(main_a, main_b);
  EXPECT_EQ(main_a.find("main"), std::string::npos) << main_a;
  EXPECT_TRUE(main_a.ends_with("/cpu-" + kernels::isaName())) << main_a;
  // Everything else about the identity is the same for both.
  const std::string digest_a = main_a.substr(main_a.find("/w"), 18);
  const std::string digest_b = main_b.substr(main_b.find("/w"), 18);
  EXPECT_EQ(main_b, std::string(main_a).replace(main_a.find(digest_a), 18, digest_b));
}

// One set of weights under two config.json files whose arithmetic differs
// (rotary base, norm epsilon) is two models: KV of one is never taken for
// the other's. Fields the forward pass never reads (the end-of-sequence
// ids) leave the identity as it is.
TEST(EngineIdentity, NamesTheConfigsArithmetic) {
  ::tandem::testing::TempDir dir("tandem-identity-config");
  tools::TestModelOptions options;
  options.seed = 5;
  tools::writeTestModel(options, dir.path());
  const std::filesystem::path config_path = dir.path() / "config.json";
  const nlohmann::json original = nlohmann::json::parse(::tandem::testing::readFile(config_path));
  auto identityWith = [&](const std::string& field, const nlohmann::json& value) {
    nlohmann::json config = original;
    if (!field.empty()) config[field] = value;
    ::tandem::testing::writeFile(config_path, config.dump(2));
    EngineConfig engine_config = engineConfig();
    engine_config.model_dir = dir.path();
    return Engine(engine_config).modelIdentity();
  };
  const std::string base = identityWith("", nullptr);
  EXPECT_NE(identityWith("rope_theta", 500000.0), base);
  EXPECT_NE(identityWith("rms_norm_eps", 1e-6), identityWith("rms_norm_eps", 1e-5));
  EXPECT_EQ(identityWith("eos_token_id", nlohmann::json::array({3, 4})), base);
  EXPECT_EQ(identityWith("", nullptr), base);
}

// /admin/drain and the KV control calls are signed with TANDEM_KV_SECRET
// even on an agent whose connector checks nothing (here: none at all).
TEST(EngineControl, WithoutAConnectorTheKvSecretStillGuardsControlRequests) {
  {
    Engine open(engineConfig());
    EXPECT_TRUE(open.authorizeKvRequest("/admin/drain", nlohmann::json::object()).isOk());
  }
  ::setenv("TANDEM_KV_SECRET", "delta", 1);
  Engine engine(engineConfig());
  ::unsetenv("TANDEM_KV_SECRET");
  const Status unsigned_drain = engine.authorizeKvRequest("/admin/drain", nlohmann::json::object());
  EXPECT_EQ(unsigned_drain.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(unsigned_drain.message().find("kv_auth"), std::string::npos)
      << unsigned_drain.message();
  nlohmann::json wrong = nlohmann::json::object();
  kv_auth::signRequest(wrong, kv_auth::instanceId(), "/admin/drain", "epsilon");
  EXPECT_EQ(engine.authorizeKvRequest("/admin/drain", wrong).code(), StatusCode::kPermissionDenied);
  nlohmann::json body = nlohmann::json::object();
  kv_auth::signRequest(body, kv_auth::instanceId(), "/admin/drain", "delta");
  EXPECT_TRUE(engine.authorizeKvRequest("/admin/drain", body).isOk());
  // Once only.
  EXPECT_EQ(engine.authorizeKvRequest("/admin/drain", body).code(), StatusCode::kPermissionDenied);
}

// bf16 compute is an engine setting: the backend multiplies bf16-rounded
// activations, and the model identity (what block hashes and connector
// handshakes are made from) says so, so that KV is never reused or loaded
// as the exact path's. A compute dtype the backend lacks is refused by name.
TEST(EngineComputeDType, Bf16ComputeIsPartOfTheModelIdentity) {
  Engine exact(engineConfig());
  EngineConfig config = engineConfig();
  config.compute_dtype = DType::kBF16;
  Engine bf16(config);
  EXPECT_EQ(exact.modelIdentity().find("/compute-"), std::string::npos) << exact.modelIdentity();
  EXPECT_EQ(bf16.modelIdentity(), exact.modelIdentity() + "/compute-bf16");
  EXPECT_NE(bf16.backend().description().find("bf16 compute"), std::string::npos)
      << bf16.backend().description();
  Collector collector;
  ASSERT_TRUE(
      bf16.addRequest(greedyRequest("r", randomTokens(40, 4), 8), collector.callback()).isOk());
  ASSERT_TRUE(collector.waitFinished());
  EXPECT_EQ(collector.tokens.size(), 8u);

  config.compute_dtype = DType::kF16;
  try {
    Engine refused(config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "compute dtype f16 is not supported by cpu (accepted: f32, bf16)");
  }
}

// A request resumed from the first k tokens of its answer (a stream
// migrated from a failed agent) continues exactly: the same tokens, the same
// text after what the first run had emitted by then, and the whole answer
// counted, whether greedy with penalties or sampled with a seed.
// A request names its adapter: the adapter's tokens are its own, and its
// blocks are cached under the adapter alone (the same prompt under the base
// model computes its own, and each reuses its own). Serving an adapter
// changes nothing for the base model's requests.
TEST(EngineLora, AnAdaptersTokensAndCachedBlocksAreItsOwn) {
  EngineConfig config = engineConfig();
  config.lora_modules = {{"sql", loraDir()}};
  Engine engine(config);
  ASSERT_EQ(engine.adapters().size(), 1u);
  EXPECT_EQ(engine.adapters()[0].name, "sql");
  EXPECT_EQ(engine.adapters()[0].rank, 8);
  EXPECT_EQ(engine.adapters()[0].identity.rfind(engine.modelIdentity() + "/lora-", 0), 0u)
      << engine.adapters()[0].identity;
  const std::vector<TokenId> prompt = randomTokens(40, 21);
  struct Run {
    std::vector<TokenId> tokens;
    int64_t cached = 0;
  };
  auto run = [&](const std::string& id, const std::string& adapter) {
    Collector collector;
    Request request = greedyRequest(id, prompt, 8);
    request.adapter = adapter;
    EXPECT_TRUE(engine.addRequest(std::move(request), collector.callback()).isOk());
    EXPECT_TRUE(collector.waitFinished());
    EXPECT_EQ(collector.reason, FinishReason::kLength) << collector.error;
    return Run{collector.tokens, collector.cached_tokens};
  };
  const Run adapted = run("a1", "sql");
  EXPECT_EQ(adapted.cached, 0);
  const Run base = run("b1", "");
  EXPECT_EQ(base.cached, 0) << "the base model reused the adapter's blocks";
  EXPECT_NE(base.tokens, adapted.tokens) << "the adapter changed nothing";
  const Run adapted_again = run("a2", "sql");
  EXPECT_EQ(adapted_again.cached, 32);
  EXPECT_EQ(adapted_again.tokens, adapted.tokens);
  const Run base_again = run("b2", "");
  EXPECT_EQ(base_again.cached, 32);
  EXPECT_EQ(base_again.tokens, base.tokens);
  EXPECT_EQ(base.tokens, generateWithoutConnector(prompt));

  Request unknown = greedyRequest("u", prompt, 8);
  unknown.adapter = "nope";
  const Status refused = engine.addRequest(std::move(unknown), [](const RequestOutput&) {});
  EXPECT_EQ(refused.code(), StatusCode::kNotFound);
  EXPECT_EQ(refused.message(), "this agent serves no LoRA adapter named nope");
}

TEST(EngineLora, AdaptersAreRefusedWhereTheyCannotRun) {
  EngineConfig twice = engineConfig();
  twice.lora_modules = {{"sql", loraDir()}, {"sql", loraDir()}};
  try {
    Engine engine(twice);
    ADD_FAILURE() << "two adapters of one name were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--lora-modules names sql twice");
  }
  EngineConfig simulated = engineConfig();
  simulated.lora_modules = {{"sql", loraDir()}};
  StepProfile profile;
  profile.name = "unit";
  profile.model.max_position_embeddings = 4096;
  simulated.simulate = profile;
  try {
    Engine engine(simulated);
    ADD_FAILURE() << "a simulated engine accepted an adapter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a simulated agent computes no forward pass"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineResume, AResumedRequestContinuesTheUninterruptedAnswer) {
  Engine engine(engineConfig());
  const std::vector<TokenId> prompt = randomTokens(37, 11);
  struct Run {
    std::vector<TokenId> tokens;
    std::vector<std::string> texts;  // per output, in order
    std::string text;
    int64_t generated = 0;
    FinishReason reason = FinishReason::kNone;
  };
  auto run = [&](Request request) {
    Run result;
    std::mutex mutex;
    std::condition_variable done;
    const Status added = engine.addRequest(std::move(request), [&](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& token : out.tokens) {
        result.tokens.push_back(token.token);
        result.texts.push_back(out.text);
      }
      result.text += out.text;
      if (out.finished()) {
        result.generated = out.num_generated_tokens;
        result.reason = out.finish_reason;
        done.notify_all();
      }
    });
    EXPECT_TRUE(added.isOk()) << added.message();
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(60),
                              [&] { return result.reason != FinishReason::kNone; }));
    return result;
  };
  Request penalised = greedyRequest("greedy", prompt, 24);
  penalised.sampling.frequency_penalty = 0.7f;
  penalised.sampling.presence_penalty = 0.3f;
  penalised.sampling.min_tokens = 20;
  Request seeded = greedyRequest("seeded", prompt, 24);
  seeded.sampling.temperature = 1.0f;
  seeded.sampling.seed = 1234;
  for (const Request& base : {penalised, seeded}) {
    SCOPED_TRACE(base.id);
    const Run whole = run(base);
    ASSERT_EQ(whole.tokens.size(), 24u);
    for (size_t k : {size_t{1}, size_t{12}, size_t{23}}) {
      SCOPED_TRACE(k);
      Request resumed = base;
      resumed.id = base.id + "-" + std::to_string(k);
      resumed.resume_output.assign(whole.tokens.begin(), whole.tokens.begin() + k);
      const Run rest = run(resumed);
      EXPECT_EQ(rest.tokens, std::vector<TokenId>(whole.tokens.begin() + static_cast<ptrdiff_t>(k),
                                                  whole.tokens.end()));
      std::string emitted_before;
      for (size_t i = 0; i < k; ++i) emitted_before += whole.texts[i];
      EXPECT_EQ(emitted_before + rest.text, whole.text);
      EXPECT_EQ(rest.generated, 24);
      EXPECT_EQ(rest.reason, whole.reason);
    }
  }
}

TEST(EngineResume, ResumedOutputThatCannotBeResumedIsRefusedNamingWhy) {
  Engine engine(engineConfig());
  Request full = greedyRequest("full", randomTokens(20, 3), 4);
  full.resume_output = {5, 6, 7, 8};
  const Status no_room = engine.addRequest(full, [](const RequestOutput&) {});
  EXPECT_EQ(no_room.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      no_room.message().find(
          "resume_token_ids must leave a token to generate: it holds 4 tokens and max_tokens is 4"),
      std::string::npos)
      << no_room.message();

  Request ended = greedyRequest("ended", randomTokens(20, 3), 8);
  ended.sampling.ignore_eos = false;
  ended.resume_output = {5, engine.eosTokenIds().at(0), 6};
  const Status finished = engine.addRequest(ended, [](const RequestOutput&) {});
  EXPECT_NE(finished.message().find("resume_token_ids must not hold a finished answer: token 1 is"),
            std::string::npos)
      << finished.message();

  Request outside = greedyRequest("outside", randomTokens(20, 3), 8);
  outside.resume_output = {1 << 30};
  EXPECT_NE(engine.addRequest(outside, [](const RequestOutput&) {})
                .message()
                .find("resume_token_ids token id 1073741824 is outside the vocabulary"),
            std::string::npos);
}

// Everything one request reported, collected until its final output.
struct FullRun {
  std::vector<GeneratedToken> tokens;
  std::vector<GeneratedToken> prompt_logprobs;
  int64_t num_cached_tokens = -1;
  int outputs_with_prompt_logprobs = 0;
  FinishReason reason = FinishReason::kNone;
};

FullRun runToEnd(Engine& engine, Request request) {
  FullRun run;
  std::mutex mutex;
  std::condition_variable done;
  const Status added = engine.addRequest(std::move(request), [&](const RequestOutput& out) {
    std::lock_guard<std::mutex> lock(mutex);
    run.tokens.insert(run.tokens.end(), out.tokens.begin(), out.tokens.end());
    if (!out.prompt_logprobs.empty()) {
      run.prompt_logprobs = out.prompt_logprobs;
      ++run.outputs_with_prompt_logprobs;
    }
    if (out.finished()) {
      run.num_cached_tokens = out.num_cached_tokens;
      run.reason = out.finish_reason;
      done.notify_all();
    }
  });
  EXPECT_TRUE(added.isOk()) << added.message();
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(60),
                            [&] { return run.reason != FinishReason::kNone; }));
  return run;
}

// Bits of a logprob, so that equal means the same float.
uint32_t bitsOf(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

void expectSameLogprobs(const GeneratedToken& a, const GeneratedToken& b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(bitsOf(a.logprob), bitsOf(b.logprob)) << a.logprob << " vs " << b.logprob;
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t k = 0; k < a.top.size(); ++k) {
    EXPECT_EQ(a.top[k].token, b.top[k].token) << k;
    EXPECT_EQ(bitsOf(a.top[k].logprob), bitsOf(b.top[k].logprob)) << k;
  }
}

// A Mistral model's sliding_window is applied on every layer by the CPU
// backend: max_model_len is the model's whole context, a prompt within the
// window is computed as without one, a longer one otherwise, and the
// window is part of the model identity. (A backend without window kernels
// caps max_model_len at the window instead: docs/engine.md#models.)
TEST(EngineContext, AMistralWindowIsAppliedOnTheCpu) {
  ::tandem::testing::TempDir dir("tandem-mistral-window");
  tools::TestModelOptions options;
  options.architecture = "MistralForCausalLM";
  tools::writeTestModel(options, dir.path() / "full");
  tools::writeTestModel(options, dir.path() / "window");
  nlohmann::json config =
      nlohmann::json::parse(::tandem::testing::readFile(dir.path() / "window" / "config.json"));
  config["sliding_window"] = 48;
  ::tandem::testing::writeFile(dir.path() / "window" / "config.json", config.dump(2));
  EngineConfig full_config = engineConfig();
  full_config.model_dir = dir.path() / "full";
  EngineConfig window_config = engineConfig();
  window_config.model_dir = dir.path() / "window";
  Engine full(full_config);
  Engine window(window_config);
  EXPECT_EQ(window.maxModelLen(), 512);
  EXPECT_NE(window.modelIdentity(), full.modelIdentity());
  // The tokens and the bits of their logprobs and 3 best alternatives.
  auto logprobs = [](Engine& engine, int64_t length) {
    Request request = greedyRequest("r", randomTokens(length, 4), 2);
    request.sampling.logprobs = 3;
    std::vector<int64_t> seen;
    for (const GeneratedToken& token : runToEnd(engine, std::move(request)).tokens) {
      seen.insert(seen.end(), {token.token, bitsOf(token.logprob)});
      for (const auto& top : token.top) seen.insert(seen.end(), {top.token, bitsOf(top.logprob)});
    }
    return seen;
  };
  // Within the window (40 prompt tokens, 41 with the first generated one):
  // the same bits; past it, other logits.
  EXPECT_EQ(logprobs(window, 40), logprobs(full, 40));
  EXPECT_NE(logprobs(window, 100), logprobs(full, 100));
}

// Prompt logprobs are the model's own predictions: a prompt made of a
// prompt and the greedy answer to it reports, at each answer token, exactly
// the logprob and alternatives the answer reported when it was generated
// (teacher forcing = generation, bit for bit). The same bits whether the
// prompt ran in one step or in chunks of 16, alone or beside another
// request, and again with the prompt already cached (never a prefix-cache
// hit while its logprobs are computed, but its blocks are cached for others).
TEST(EnginePromptLogprobs, AreTheLogprobsTheAnswerHadBitForBit) {
  const std::vector<TokenId> question = randomTokens(37, 21);
  Engine engine(engineConfig());
  Request ask = greedyRequest("ask", question, 24);
  ask.sampling.logprobs = 5;
  const FullRun answer = runToEnd(engine, ask);
  ASSERT_EQ(answer.tokens.size(), 24u);
  EXPECT_TRUE(answer.prompt_logprobs.empty());

  std::vector<TokenId> replay = question;
  for (const GeneratedToken& token : answer.tokens) replay.push_back(token.token);
  Request teacher = greedyRequest("teacher", replay, 2);
  teacher.sampling.prompt_logprobs = 5;
  const FullRun forced = runToEnd(engine, teacher);
  ASSERT_EQ(forced.prompt_logprobs.size(), replay.size());
  EXPECT_EQ(forced.outputs_with_prompt_logprobs, 1);
  EXPECT_EQ(forced.num_cached_tokens, 0);  // the question was cached, not used
  EXPECT_EQ(forced.prompt_logprobs[0].token, replay[0]);
  EXPECT_TRUE(forced.prompt_logprobs[0].top.empty());
  for (size_t i = 1; i < replay.size(); ++i) {
    const GeneratedToken& entry = forced.prompt_logprobs[i];
    EXPECT_EQ(entry.token, replay[i]);
    ASSERT_EQ(entry.top.size(), 5u);
    EXPECT_GE(entry.rank, 1);
    // The rank agrees with the alternatives: rank r <= 5 means the token is
    // r-th among them (no ties in a random model's logits).
    if (entry.rank <= 5) {
      EXPECT_EQ(entry.top[entry.rank - 1].token, entry.token) << i;
    }
  }
  for (size_t j = 0; j < answer.tokens.size(); ++j) {
    SCOPED_TRACE(j);
    expectSameLogprobs(forced.prompt_logprobs[question.size() + j], answer.tokens[j]);
    EXPECT_EQ(forced.prompt_logprobs[question.size() + j].rank, 1);  // greedy: the best
  }

  // Cached now: a plain request with that prompt hits the cache; another
  // with prompt logprobs computes it all again, to the same bits.
  const FullRun plain = runToEnd(engine, greedyRequest("plain", replay, 2));
  EXPECT_GT(plain.num_cached_tokens, 0);
  teacher.id = "teacher-again";
  const FullRun again = runToEnd(engine, teacher);
  EXPECT_EQ(again.num_cached_tokens, 0);
  ASSERT_EQ(again.prompt_logprobs.size(), replay.size());
  for (size_t i = 0; i < replay.size(); ++i) {
    expectSameLogprobs(again.prompt_logprobs[i], forced.prompt_logprobs[i]);
  }
  EXPECT_EQ(again.tokens[0].token, forced.tokens[0].token);

  // Chunks of 16 positions, beside another request.
  EngineConfig chunked_config = engineConfig();
  chunked_config.scheduler.max_num_batched_tokens = 16;
  Engine chunked(chunked_config);
  FullRun beside;
  std::thread other([&] { beside = runToEnd(chunked, greedyRequest("other", question, 30)); });
  teacher.id = "teacher-chunked";
  const FullRun in_chunks = runToEnd(chunked, teacher);
  other.join();
  EXPECT_EQ(beside.tokens.size(), 30u);
  ASSERT_EQ(in_chunks.prompt_logprobs.size(), replay.size());
  for (size_t i = 0; i < replay.size(); ++i) {
    SCOPED_TRACE(i);
    expectSameLogprobs(in_chunks.prompt_logprobs[i], forced.prompt_logprobs[i]);
    EXPECT_EQ(in_chunks.prompt_logprobs[i].rank, forced.prompt_logprobs[i].rank);
  }
}

// Out of range: refused naming the field.
TEST(EnginePromptLogprobs, OutOfRangeIsRefused) {
  Engine engine(engineConfig());
  Request request = greedyRequest("r", randomTokens(8, 2), 2);
  request.sampling.prompt_logprobs = 21;
  const Status refused = engine.addRequest(request, [](const RequestOutput&) {});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "prompt_logprobs must be between 0 and 20, got 21");
}

// Speculative decoding (docs/speculative-decoding.md): drafts change how many
// steps an answer takes, never the answer.

// Runs every request at once on one engine until each has finished. With
// `first` > 0, the engine stops in the first request's first output until
// the requests after the first `first` have been added: they reach the
// scheduler together, when the first `first` have been queued or admitted.
std::vector<FullRun> runAllToEnd(Engine& engine, const std::vector<Request>& requests,
                                 size_t first = 0) {
  std::vector<FullRun> runs(requests.size());
  std::mutex mutex;
  std::condition_variable done;
  size_t finished = 0;
  std::promise<void> gate_reached;
  std::promise<void> rest_added;
  std::shared_future<void> rest_added_future = rest_added.get_future().share();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i == first && first > 0) gate_reached.get_future().wait();
    const Status added = engine.addRequest(requests[i], [&, i](const RequestOutput& out) {
      bool at_gate = false;
      {
        std::lock_guard<std::mutex> lock(mutex);
        FullRun& run = runs[i];
        at_gate = i == 0 && first > 0 && run.tokens.empty() && !out.tokens.empty();
        run.tokens.insert(run.tokens.end(), out.tokens.begin(), out.tokens.end());
        if (out.finished()) {
          run.num_cached_tokens = out.num_cached_tokens;
          run.reason = out.finish_reason;
          ++finished;
          done.notify_all();
        }
      }
      if (at_gate) {
        gate_reached.set_value();
        rest_added_future.wait();
      }
    });
    EXPECT_TRUE(added.isOk()) << added.message();
  }
  if (first > 0) rest_added.set_value();
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_TRUE(
      done.wait_for(lock, std::chrono::seconds(120), [&] { return finished == requests.size(); }));
  return runs;
}

void expectSameRuns(const std::vector<FullRun>& plain, const std::vector<FullRun>& speculated,
                    const std::vector<Request>& requests) {
  ASSERT_EQ(plain.size(), speculated.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    SCOPED_TRACE(requests[i].id);
    EXPECT_EQ(plain[i].reason, speculated[i].reason);
    ASSERT_EQ(plain[i].tokens.size(), speculated[i].tokens.size());
    for (size_t t = 0; t < plain[i].tokens.size(); ++t) {
      SCOPED_TRACE(t);
      expectSameLogprobs(plain[i].tokens[t], speculated[i].tokens[t]);
    }
  }
}

EngineConfig speculatingConfig(int32_t num_speculative_tokens) {
  EngineConfig config = engineConfig();
  config.num_blocks = 128;
  config.speculative.num_speculative_tokens = num_speculative_tokens;
  config.speculative.prompt_lookup_min = 1;
  config.speculative.prompt_lookup_max = 4;
  return config;
}

std::vector<std::string> cachedBlocks(Engine& engine) {
  std::vector<std::string> hashes;
  for (const BlockHash& hash : engine.kvSnapshot().block_hashes) hashes.push_back(hash.toHex());
  std::sort(hashes.begin(), hashes.end());
  return hashes;
}

// For each request, one that continues its answer (`runs[i]`, prompt and
// answer as the new prompt) for `max_tokens` more, with 2 logprobs.
std::vector<Request> followUps(const std::vector<Request>& requests,
                               const std::vector<FullRun>& runs, int64_t max_tokens) {
  std::vector<Request> follow_ups;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request next = greedyRequest(requests[i].id + "-next", requests[i].prompt, max_tokens);
    for (const GeneratedToken& token : runs[i].tokens) next.prompt.push_back(token.token);
    next.sampling.logprobs = 2;
    follow_ups.push_back(next);
  }
  return follow_ups;
}

// Each request alone, in an engine of its own.
std::vector<FullRun> runEachAlone(const EngineConfig& config,
                                  const std::vector<Request>& requests) {
  std::vector<FullRun> runs;
  for (const Request& request : requests) {
    Engine engine(config);
    runs.push_back(runToEnd(engine, request));
  }
  return runs;
}

// A prompt that repeats itself, so that its own n-grams predict it.
std::vector<TokenId> repeatingPrompt(uint32_t seed) {
  const std::vector<TokenId> part = randomTokens(12, seed);
  std::vector<TokenId> prompt;
  for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), part.begin(), part.end());
  return prompt;
}

// Every sampling feature that reads the output so far, batched together:
// the tokens and their logprobs are the same bits with and without drafts;
// drafts were proposed, some accepted and some not; every block came back
// and the prefix cache holds the same blocks (the accepted drafts' KV is
// cached as computed tokens' is); a follow-up request reusing each answer's
// cached blocks continues it alike.
TEST(EngineSpeculative, DraftsChangeNoTokenNorLogprobGreedyOrSampled) {
  std::vector<Request> requests;
  {
    Request greedy = greedyRequest("greedy", repeatingPrompt(1), 40);
    greedy.sampling.logprobs = 3;
    requests.push_back(greedy);
    Request sampled = greedyRequest("sampled", repeatingPrompt(2), 40);
    sampled.sampling.temperature = 0.9f;
    sampled.sampling.top_p = 0.95f;
    sampled.sampling.top_k = 40;
    sampled.sampling.seed = 11;
    sampled.sampling.logprobs = 2;
    requests.push_back(sampled);
    Request hot = greedyRequest("hot", repeatingPrompt(3), 37);
    hot.sampling.temperature = 2.0f;
    hot.sampling.seed = 5;
    requests.push_back(hot);
    Request penalized = greedyRequest("penalties", repeatingPrompt(4), 33);
    penalized.sampling.frequency_penalty = 0.4f;
    penalized.sampling.presence_penalty = 0.2f;
    penalized.sampling.repetition_penalty = 1.1f;
    requests.push_back(penalized);
    Request masked = greedyRequest("bias-min-stop", repeatingPrompt(5), 31);
    masked.sampling.logit_bias = {{repeatingPrompt(5)[3], 4.0f}};
    masked.sampling.min_tokens = 9;
    masked.sampling.stop_token_ids = {repeatingPrompt(5)[7]};
    masked.sampling.ignore_eos = false;
    requests.push_back(masked);
    Request banned = greedyRequest("bad-words", repeatingPrompt(6), 29);
    banned.sampling.bad_words_ids = {{repeatingPrompt(6)[1], repeatingPrompt(6)[2]}};
    requests.push_back(banned);
    Request regex = greedyRequest("regex", randomTokens(20, 7), 48);
    regex.structured_output =
        structured::Constraint{structured::ConstraintKind::kRegex, "(ab|ba|b ){10,}c", {}};
    regex.structured_output_field = "structured_outputs.regex";
    requests.push_back(regex);
  }
  Engine plain(speculatingConfig(0));
  Engine speculating(speculatingConfig(4));
  const std::vector<FullRun> expected = runAllToEnd(plain, requests);
  const std::vector<FullRun> runs = runAllToEnd(speculating, requests);
  expectSameRuns(expected, runs, requests);

  const EngineStats stats = speculating.stats();
  EXPECT_GT(stats.spec_decode_num_drafts, 0);
  EXPECT_GT(stats.spec_decode_num_accepted_tokens, 0);
  EXPECT_LT(stats.spec_decode_num_accepted_tokens, stats.spec_decode_num_draft_tokens);
  ASSERT_EQ(stats.spec_decode_accepted_per_position.size(), 4u);
  EXPECT_EQ(std::accumulate(stats.spec_decode_accepted_per_position.begin(),
                            stats.spec_decode_accepted_per_position.end(), int64_t{0}),
            stats.spec_decode_num_accepted_tokens);
  EXPECT_GE(stats.spec_decode_accepted_per_position[0], stats.spec_decode_accepted_per_position[3]);
  // After its first step with drafts, a sequence drafts at most one token
  // more than its last such step accepted.
  EXPECT_LE(stats.spec_decode_num_draft_tokens, 4 * std::ssize(requests) +
                                                    stats.spec_decode_num_accepted_tokens +
                                                    stats.spec_decode_num_drafts);
  // The rejected drafts were computed too.
  EXPECT_EQ(stats.num_computed_tokens, plain.stats().num_computed_tokens +
                                           stats.spec_decode_num_draft_tokens -
                                           stats.spec_decode_num_accepted_tokens);
  EXPECT_EQ(plain.stats().spec_decode_num_drafts, 0);
  EXPECT_TRUE(plain.stats().spec_decode_accepted_per_position.empty());
  EXPECT_EQ(stats.num_free_blocks, stats.num_blocks);
  EXPECT_EQ(cachedBlocks(speculating), cachedBlocks(plain));

  const std::vector<Request> follow_ups = followUps(requests, expected, 6);
  const std::vector<FullRun> expected_next = runAllToEnd(plain, follow_ups);
  const std::vector<FullRun> next = runAllToEnd(speculating, follow_ups);
  expectSameRuns(expected_next, next, follow_ups);
  for (size_t i = 0; i < next.size(); ++i) {
    // Every full block of the answer's computed tokens (all but its last).
    EXPECT_EQ(next[i].num_cached_tokens, (std::ssize(follow_ups[i].prompt) - 1) / 16 * 16)
        << follow_ups[i].id;
    EXPECT_EQ(next[i].num_cached_tokens, expected_next[i].num_cached_tokens) << follow_ups[i].id;
  }
}

// A model in the engine: each request alone, all of them batched, and
// batched with drafts give the same tokens and logprob bits; follow-ups hit
// every full block of prompt and answer in the prefix cache and continue
// alike; every block comes back.
void expectAloneBatchedSpeculatedAndCachedAlike(const std::filesystem::path& model,
                                                DType kv_dtype = DType::kBF16) {
  auto config = [&](int32_t drafts) {
    EngineConfig c = speculatingConfig(drafts);
    c.model_dir = model;
    c.kv_dtype = kv_dtype;
    return c;
  };
  std::vector<Request> requests;
  Request greedy = greedyRequest("greedy", repeatingPrompt(21), 30);
  greedy.sampling.logprobs = 3;
  requests.push_back(greedy);
  Request sampled = greedyRequest("sampled", repeatingPrompt(22), 30);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 3;
  sampled.sampling.logprobs = 2;
  requests.push_back(sampled);
  requests.push_back(greedyRequest("long", randomTokens(70, 23), 25));

  const std::vector<FullRun> alone = runEachAlone(config(0), requests);
  Engine plain(config(0));
  Engine speculating(config(4));
  const std::vector<FullRun> batched = runAllToEnd(plain, requests);
  expectSameRuns(alone, batched, requests);
  expectSameRuns(alone, runAllToEnd(speculating, requests), requests);
  EXPECT_GT(speculating.stats().spec_decode_num_accepted_tokens, 0);

  const std::vector<Request> follow_ups = followUps(requests, alone, 5);
  const std::vector<FullRun> cold = runEachAlone(config(0), follow_ups);
  const std::vector<FullRun> warm = runAllToEnd(plain, follow_ups);
  expectSameRuns(cold, warm, follow_ups);
  for (size_t i = 0; i < warm.size(); ++i) {
    EXPECT_EQ(warm[i].num_cached_tokens, (std::ssize(follow_ups[i].prompt) - 1) / 16 * 16)
        << follow_ups[i].id;
    EXPECT_EQ(cold[i].num_cached_tokens, 0) << follow_ups[i].id;
  }
  EXPECT_EQ(plain.stats().num_free_blocks, plain.stats().num_blocks);
  EXPECT_EQ(speculating.stats().num_free_blocks, speculating.stats().num_blocks);
}

// The tiny Qwen3-MoE: 8 experts choosing 3, a dense first layer; the tiny
// GLM-4.5: the same with sigmoid routing in groups and a shared expert; the
// tiny Qwen2-MoE: a shared expert with its gate; the tiny GPT-OSS: sinks, a
// window on every other layer, biased router and experts; the tiny Granite
// MoE: Granite's scalars around a mixture.
TEST(EngineMixture, AloneBatchedSpeculatedAndCachedGiveTheSameBits) {
  for (const char* architecture :
       {"Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM",
        "GraniteMoeForCausalLM", "OlmoeForCausalLM"}) {
    SCOPED_TRACE(architecture);
    ::tandem::testing::TempDir dir("tandem-engine-moe");
    tools::TestModelOptions options;
    options.architecture = architecture;
    options.seed = 9;
    tools::writeTestModel(options, dir.path());
    expectAloneBatchedSpeculatedAndCachedAlike(dir.path());
  }
}

// fp8 weights with per-channel scales (docs/quantization.md).
TEST(EngineFp8, AloneBatchedSpeculatedAndCachedGiveTheSameBits) {
  ::tandem::testing::TempDir dir("tandem-engine-fp8");
  tools::TestModelOptions options;
  options.seed = 9;
  options.quantization = tools::parseQuantizationSpec("compressed-tensors:channel");
  tools::writeTestModel(options, dir.path());
  expectAloneBatchedSpeculatedAndCachedAlike(dir.path());
}

// An fp8 KV cache with the checkpoint's K/V scales
// (docs/quantization.md#fp8-kv-cache).
TEST(EngineFp8KvCache, AloneBatchedSpeculatedAndCachedGiveTheSameBits) {
  ::tandem::testing::TempDir dir("tandem-engine-fp8-kv");
  tools::TestModelOptions options;
  options.seed = 9;
  options.kv_cache_scales = true;
  tools::writeTestModel(options, dir.path());
  expectAloneBatchedSpeculatedAndCachedAlike(dir.path(), DType::kF8E4M3);
  // The fp8 cache is what ran: a bf16 cache gives other log-probabilities.
  std::vector<float> logprobs[2];
  for (DType kv_dtype : {DType::kF8E4M3, DType::kBF16}) {
    EngineConfig config = engineConfig();
    config.model_dir = dir.path();
    config.kv_dtype = kv_dtype;
    Engine engine(config);
    Request request = greedyRequest("r", randomTokens(70, 23), 8);
    request.sampling.logprobs = 1;
    for (const GeneratedToken& token : runToEnd(engine, request).tokens) {
      logprobs[kv_dtype == DType::kBF16].push_back(token.logprob);
    }
  }
  ASSERT_EQ(logprobs[0].size(), 8u);
  EXPECT_NE(logprobs[0], logprobs[1]);
}

// An answer that ends inside a step's drafts (a stop string, max_tokens,
// the end of max_model_len) ends where it ends without them, with the same
// text; a sequence preempted for blocks keeps its tokens.
TEST(EngineSpeculative, AnswersEndAndArePreemptedAsWithoutDrafts) {
  Engine plain(speculatingConfig(0));
  Engine speculating(speculatingConfig(6));
  const std::vector<TokenId> prompt = repeatingPrompt(8);
  const FullRun whole = runToEnd(plain, greedyRequest("whole", prompt, 40));
  ASSERT_EQ(whole.tokens.size(), 40u);
  // Alone, the answer takes fewer steps with drafts.
  const int64_t plain_steps = plain.stats().num_steps;
  expectSameRuns({whole}, {runToEnd(speculating, greedyRequest("whole", prompt, 40))},
                 {greedyRequest("whole", prompt, 40)});
  EXPECT_LT(speculating.stats().num_steps, plain_steps);
  EXPECT_GT(speculating.stats().spec_decode_num_accepted_tokens, 0);

  std::vector<Request> requests;
  for (int64_t max_tokens : {1, 2, 5, 13}) {
    requests.push_back(greedyRequest("max-" + std::to_string(max_tokens), prompt, max_tokens));
  }
  Request stopped = greedyRequest("stop-string", prompt, 40);
  {
    // A stop string from the middle of the answer's text.
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::fromDirectory(modelDir());
    std::vector<TokenId> ids;
    for (size_t t = 17; t < 20; ++t) ids.push_back(whole.tokens[t].token);
    const std::string text = tokenizer->decode(ids);
    ASSERT_FALSE(text.empty());
    stopped.sampling.stop = {text};
  }
  requests.push_back(stopped);
  std::vector<FullRun> expected = runAllToEnd(plain, requests);
  std::vector<FullRun> runs = runAllToEnd(speculating, requests);
  expectSameRuns(expected, runs, requests);
  EXPECT_EQ(runs.back().reason, FinishReason::kStop);
  EXPECT_LT(runs.back().tokens.size(), 40u);

  // The context's end: max_model_len 64 leaves 16 tokens after the prompt;
  // no draft is computed past it.
  EngineConfig short_context = speculatingConfig(6);
  short_context.max_model_len = 64;
  Engine short_speculating(short_context);
  const FullRun at_end = runToEnd(short_speculating, greedyRequest("end", prompt, 16));
  ASSERT_EQ(at_end.tokens.size(), 16u);
  for (size_t t = 0; t < at_end.tokens.size(); ++t) {
    EXPECT_EQ(at_end.tokens[t].token, whole.tokens[t].token) << t;
  }
  EXPECT_EQ(at_end.reason, FinishReason::kLength);

  // Few blocks: sequences preempt each other and recompute. (Which blocks
  // stay cached, and when a sequence is preempted, follow the steps, which
  // drafts make fewer: only the tokens are the same.) The first request has
  // its first token before the others are added, in both engines, so the
  // crowd meets in the same steps however fast the machine is: added as the
  // engine ran, the first could finish before the last came, and nobody was
  // preempted.
  EngineConfig tight = speculatingConfig(6);
  tight.num_blocks = 14;
  Engine tight_speculating(tight);
  tight.speculative = {};
  Engine tight_plain(tight);
  std::vector<Request> crowd;
  for (uint32_t seed = 20; seed < 24; ++seed) {
    crowd.push_back(greedyRequest("crowd-" + std::to_string(seed), repeatingPrompt(seed), 30));
  }
  expectSameRuns(runAllToEnd(tight_plain, crowd, 1), runAllToEnd(tight_speculating, crowd, 1),
                 crowd);
  const EngineStats stats = tight_speculating.stats();
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_GT(stats.spec_decode_num_accepted_tokens, 0);
  EXPECT_LT(stats.spec_decode_num_accepted_tokens, stats.spec_decode_num_draft_tokens);
  EXPECT_EQ(stats.num_free_blocks, stats.num_blocks);
}

// Priority scheduling (--scheduling-policy priority) changes the order in
// which requests are served, never an answer.
TEST(EnginePriority, AnswersAreTheBitsTheyHaveAloneWhateverTheirPriority) {
  Engine alone(engineConfig());
  EngineConfig tight = engineConfig();
  tight.num_blocks = 14;
  tight.scheduler.policy = SchedulingPolicy::kPriority;
  tight.scheduler.max_num_seqs = 3;
  Engine prioritized(tight);
  // Three worse requests come first; three better ones come once the first
  // has its first token, and take the seats and blocks of the worse.
  std::vector<Request> crowd;
  const int64_t priorities[] = {3, 3, 2, 1, 0, -1};
  for (uint32_t i = 0; i < 6; ++i) {
    Request request =
        greedyRequest("crowd-" + std::to_string(i), randomTokens(30 + 7 * i, 60 + i), 24);
    request.sampling.logprobs = 2;
    request.priority = priorities[i];
    crowd.push_back(request);
  }
  std::vector<FullRun> expected;
  for (Request request : crowd) {
    request.priority = 0;
    expected.push_back(runToEnd(alone, request));
  }
  expectSameRuns(expected, runAllToEnd(prioritized, crowd, 3), crowd);
  const EngineStats stats = prioritized.stats();
  EXPECT_GT(stats.num_priority_preemptions, 0) << "the test did not exercise priority preemption";
  EXPECT_GE(stats.num_preemptions, stats.num_priority_preemptions);
  EXPECT_EQ(stats.num_free_blocks, stats.num_blocks) << "blocks leaked";
}

TEST(EnginePriority, OnlyPriorityZeroIsAcceptedFirstComeFirstServed) {
  Engine engine(engineConfig());
  Request request = greedyRequest("prioritized", randomTokens(12, 70), 2);
  request.priority = -5;
  const Status refused = engine.addRequest(request, [](const RequestOutput&) {});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "priority must be 0 on an agent that serves first come, first served, got -5 (start "
            "the agent with --scheduling-policy priority to serve requests by priority)");
  request.priority = 0;
  EXPECT_EQ(runToEnd(engine, request).tokens.size(), 2u);
}

// A request with n > 1 (best_of) is admitted with its first choice; its
// answer adds the others once that one has computed the prompt. A stop
// coming between (the first choice may even have ended, its answer's
// handler not yet run) waits for them: they are served, not refused as
// new requests are, and the stop ends once the answer said it is done
// adding (Engine::joinsEnded), or at its deadline.
TEST(EngineStop, LaterChoicesOfAnAdmittedRequestAreServedThoughTheStopCameFirst) {
  const std::vector<TokenId> prompt = randomTokens(20, 71);
  // The request's first choice, admitted for `choices` and run to its end.
  auto firstChoice = [&](Engine& engine, const std::string& id, int64_t choices, Collector& out) {
    Request first = greedyRequest(id, prompt, 3);
    first.admission_places = choices;
    ASSERT_TRUE(engine.addRequest(first, out.callback()).isOk());
    ASSERT_TRUE(out.waitFinished());
  };
  auto laterChoice = [&](const std::string& id) {
    Request later = greedyRequest(id, prompt, 3);
    later.joins = "two-0";
    return later;
  };
  {
    Engine engine(engineConfig());
    Collector first_out;
    firstChoice(engine, "two-0", 2, first_out);
    auto stopped = std::async(std::launch::async,
                              [&] { engine.shutdown(Clock::now() + std::chrono::seconds(60)); });
    EXPECT_EQ(stopped.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
        << "the stop did not wait for the request's second choice";
    const Status refused = engine.addRequest(greedyRequest("new", prompt, 3), [](auto&) {});
    EXPECT_EQ(refused.message(), "the engine is shutting down");
    Collector second_out;
    ASSERT_TRUE(engine.addRequest(laterChoice("two-1"), second_out.callback()).isOk());
    engine.joinsEnded("two-0");
    ASSERT_TRUE(second_out.waitFinished());
    EXPECT_EQ(second_out.reason, FinishReason::kLength);
    EXPECT_EQ(second_out.tokens, first_out.tokens);
    stopped.get();
    const Status after = engine.addRequest(laterChoice("two-2"), [](auto&) {});
    EXPECT_EQ(after.code(), StatusCode::kUnavailable) << after.message();
  }
  {
    // An answer that never says it is done keeps the stop until its deadline.
    Engine engine(engineConfig());
    Collector first_out;
    firstChoice(engine, "three-0", 3, first_out);
    engine.shutdown(Clock::now() + std::chrono::milliseconds(300));
    EXPECT_EQ(engine.addRequest(laterChoice("three-1"), [](auto&) {}).message(),
              "the engine is shutting down");
  }
}

// Blocks taken for drafts that were not accepted go back at the end of the
// step: between steps a sequence holds only the blocks its computed
// positions fill, as without drafts; and one whose answer ends inside its
// drafts is held for its reader with only those.
TEST(EngineSpeculative, BlocksOfDraftsNotAcceptedGoBack) {
  {
    Engine engine(speculatingConfig(6));
    const std::vector<TokenId> prompt = repeatingPrompt(40);
    int64_t received = 0;
    int64_t over = 0;  // outputs that saw more blocks held than computed positions fill
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
    // Each output sees the stats published after the step before its own.
    ASSERT_TRUE(engine
                    .addRequest(greedyRequest("long", prompt, 64),
                                [&](const RequestOutput& out) {
                                  const EngineStats stats = engine.stats();
                                  std::lock_guard<std::mutex> lock(mutex);
                                  const int64_t computed = std::ssize(prompt) + received - 1;
                                  if (received > 0 && stats.num_blocks - stats.num_free_blocks >
                                                          (computed + 15) / 16) {
                                    ++over;
                                  }
                                  received += std::ssize(out.tokens);
                                  if (out.finished()) {
                                    finished = true;
                                    done.notify_all();
                                  }
                                })
                    .isOk());
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
    EXPECT_EQ(over, 0);
    EXPECT_GT(engine.stats().spec_decode_num_draft_tokens,
              engine.stats().spec_decode_num_accepted_tokens);
  }
  // Answers cut by stop strings at every point of a long answer, held by a
  // connector for a reader: the same blocks held as without drafts.
  auto holding = [](int32_t drafts) {
    EngineConfig config = speculatingConfig(drafts);
    config.connector_factory = [](KvCache&, const std::string&) {
      return std::make_unique<HoldingConnector>();
    };
    return std::make_unique<Engine>(config);
  };
  std::unique_ptr<Engine> plain = holding(0);
  std::unique_ptr<Engine> speculating = holding(6);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::fromDirectory(modelDir());
  int64_t compared = 0;
  for (uint32_t seed = 41; seed < 45; ++seed) {
    const std::vector<TokenId> prompt = repeatingPrompt(seed);
    const std::string whole_id = "whole-" + std::to_string(seed);
    const FullRun whole = runToEnd(*plain, greedyRequest(whole_id, prompt, 48));
    ASSERT_TRUE(plain->releaseTransfer({{"transfer_id", whole_id}}).isOk());
    for (size_t cut = 2; cut < 46; ++cut) {
      const std::string text = tokenizer->decode(std::vector<TokenId>{whole.tokens[cut].token});
      if (text.empty()) continue;
      const std::string id = "cut-" + std::to_string(seed) + "-" + std::to_string(cut);
      Request request = greedyRequest(id, prompt, 48);
      request.sampling.stop = {text};
      const FullRun expected = runToEnd(*plain, request);
      const FullRun got = runToEnd(*speculating, request);
      ASSERT_EQ(got.tokens.size(), expected.tokens.size()) << id;
      EXPECT_EQ(speculating->stats().kv_held_blocks, plain->stats().kv_held_blocks) << id;
      EXPECT_GT(plain->stats().kv_held_blocks, 0) << id;
      ASSERT_TRUE(plain->releaseTransfer({{"transfer_id", id}}).isOk());
      ASSERT_TRUE(speculating->releaseTransfer({{"transfer_id", id}}).isOk());
      ++compared;
    }
  }
  EXPECT_GT(compared, 40);
}

TEST(EngineSpeculative, ASimulatedAgentRefusesIt) {
  EngineConfig config = speculatingConfig(4);
  StepProfile profile;
  profile.name = "test";
  config.simulate = profile;
  try {
    Engine engine(config);
    ADD_FAILURE() << "a simulated engine accepted speculative decoding";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "--speculative-config: a simulated agent computes no forward pass to verify drafts "
              "(docs/speculative-decoding.md)");
  }
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// Throws as a broken connector (or a device under it) would: from the lookup
// of a request whose id contains "bad-lookup" (at admission, before the
// step's batch is formed) and from the save of one whose id contains
// "bad-save" (after the forward pass, the batch known).
class ThrowingConnector : public kv::KvConnector, kv::KvConnectorScheduler, kv::KvConnectorWorker {
 public:
  ThrowingConnector() {
    config_.connector = "throwing";
    config_.load_failure_policy = kv::LoadFailurePolicy::kFail;
  }
  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const kv::KvTransferConfig& config() const override { return config_; }
  kv::LookupResult lookup(const kv::ConnectorRequest& request, int64_t) override {
    const bool gated = request.request_id.find("gated") != std::string_view::npos;
    if (gated && !gate_open) return {kv::LookupResult::State::kPending, 0};
    if (request.request_id.find("bad-lookup") != std::string_view::npos) {
      throw Error("lookup failed for " + std::string(request.request_id));
    }
    // "fail-load": its first block is offered, and its load fails at once.
    if (request.request_id.find("fail-load") != std::string_view::npos) {
      return {kv::LookupResult::State::kAvailable, EngineConfig{}.block_size};
    }
    return {};
  }
  kv::FinishDecision requestFinished(const kv::ConnectorRequest& request, std::span<const BlockId>,
                                     int64_t) override {
    if (request.request_id.find("bad-finish") != std::string_view::npos) {
      throw Error("holding failed for " + std::string(request.request_id));
    }
    return {};
  }
  void requestAbandoned(std::string_view id) override { abandoned.emplace_back(id); }
  void holdEnded(std::string_view id) override { ended.emplace_back(id); }
  kv::LoadResult load(const kv::ConnectorRequest&, int64_t first_block,
                      std::span<const BlockId> ids) override {
    kv::LoadResult result;
    for (size_t i = 0; i < ids.size(); ++i) {
      result.failed_block_indices.push_back(first_block + static_cast<int64_t>(i));
    }
    return result;
  }
  void save(const kv::ConnectorRequest& request, int64_t, std::span<const BlockId>) override {
    if (request.request_id.find("bad-save") != std::string_view::npos) {
      throw Error("save failed for " + std::string(request.request_id));
    }
  }
  std::vector<std::string> abandoned;  // engine thread; read once the engine is idle
  std::vector<std::string> ended;      // the same
  // While closed, requests whose id contains "gated" wait in their lookup
  // (pending), so that a test can have them admitted in one step.
  std::atomic<bool> gate_open{true};

 private:
  kv::KvTransferConfig config_;
};

class FailingSteps : public ::testing::Test {
 protected:
  Engine& start() {
    EngineConfig config = engineConfig();
    config.connector_factory = [this](KvCache&, const std::string&) {
      auto connector = std::make_unique<ThrowingConnector>();
      connector_ = connector.get();
      return std::unique_ptr<kv::KvConnector>(std::move(connector));
    };
    engine_ = std::make_unique<Engine>(config);
    return *engine_;
  }
  ThrowingConnector* connector_ = nullptr;  // the engine's
  std::unique_ptr<Engine> engine_;
};

// A request whose admission throws ends with an error naming the cause; the
// request running beside it goes on to the tokens it gives alone, and every
// block returns to the pool.
TEST_F(FailingSteps, AThrowingAdmissionFailsOnlyTheRequestBeingAdmitted) {
  const std::vector<TokenId> prompt = randomTokens(30, 11);
  const std::vector<TokenId> expected = generateWithoutConnector(prompt, 40);
  Engine& engine = start();
  Collector good, bad;
  // Queued together they are usually admitted in one schedule(), "good"
  // first: its admission stands and its chunk is computed in a later step.
  ASSERT_TRUE(engine.addRequest(greedyRequest("good", prompt, 40), good.callback()).isOk());
  ASSERT_TRUE(
      engine.addRequest(greedyRequest("bad-lookup-1", randomTokens(20, 12), 5), bad.callback())
          .isOk());
  ASSERT_TRUE(bad.waitFinished());
  ASSERT_TRUE(good.waitFinished());
  EXPECT_EQ(bad.reason, FinishReason::kError);
  EXPECT_NE(bad.error.find("the engine failed computing this request: lookup failed for "
                           "bad-lookup-1"),
            std::string::npos)
      << bad.error;
  EXPECT_EQ(good.reason, FinishReason::kLength);
  EXPECT_EQ(good.tokens, expected);
  EXPECT_EQ(engine.stats().num_step_failures, 1);
  EXPECT_TRUE(eventually([&] { return engine.stats().consecutive_step_failures == 0; }))
      << "good's later steps completed";
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
}

// A load that failed (policy fail) in the same schedule() as an admission
// that throws is still reported: its request ends with the load's error
// instead of waiting forever, and every block returns to the pool.
TEST_F(FailingSteps, AFailedLoadBesideAThrowingAdmissionStillEndsItsRequest) {
  Engine& engine = start();
  connector_->gate_open = false;
  Collector failed, bad;
  ASSERT_TRUE(engine
                  .addRequest(greedyRequest("gated-fail-load-1", randomTokens(20, 15), 4),
                              failed.callback())
                  .isOk());
  ASSERT_TRUE(
      engine
          .addRequest(greedyRequest("gated-bad-lookup-2", randomTokens(20, 16), 4), bad.callback())
          .isOk());
  // Both wait in their lookups; opened, they are admitted in one step: the
  // load fails, then the other's lookup throws.
  ASSERT_TRUE(eventually([&] { return engine.stats().num_waiting == 2; }));
  connector_->gate_open = true;
  ASSERT_TRUE(bad.waitFinished());
  ASSERT_TRUE(failed.waitFinished()) << "the failed load was never reported";
  EXPECT_EQ(failed.reason, FinishReason::kError);
  EXPECT_NE(failed.error.find("kv_load_failure_policy is fail"), std::string::npos) << failed.error;
  EXPECT_EQ(bad.reason, FinishReason::kError);
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
}

// A connector that throws when a finished request's blocks would be held: the
// answer stands (its tokens, no descriptor), the connector is told the request
// was abandoned, its blocks go back, and the requests beside it and after it
// are served.
TEST_F(FailingSteps, AConnectorThrowingAtTheFinishLosesNeitherTheAnswerNorTheBlocks) {
  Engine& engine = start();
  const std::vector<TokenId> prompt = randomTokens(30, 14);
  const std::vector<TokenId> expected = generateWithoutConnector(prompt, 6);
  Collector bad, beside;
  ASSERT_TRUE(engine.addRequest(greedyRequest("bad-finish-1", prompt, 6), bad.callback()).isOk());
  ASSERT_TRUE(engine.addRequest(greedyRequest("beside", prompt, 6), beside.callback()).isOk());
  ASSERT_TRUE(bad.waitFinished());
  ASSERT_TRUE(beside.waitFinished());
  EXPECT_EQ(bad.reason, FinishReason::kLength);
  EXPECT_EQ(bad.tokens, expected);
  EXPECT_EQ(beside.tokens, expected);
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
  Collector after;
  ASSERT_TRUE(engine.addRequest(greedyRequest("after", prompt, 6), after.callback()).isOk());
  ASSERT_TRUE(after.waitFinished());
  EXPECT_EQ(after.tokens, expected);
  EXPECT_EQ(engine.stats().num_step_failures, 0);
  ASSERT_NE(connector_, nullptr);
  EXPECT_EQ(std::count(connector_->abandoned.begin(), connector_->abandoned.end(), "bad-finish-1"),
            1);
  EXPECT_EQ(std::count(connector_->ended.begin(), connector_->ended.end(), "bad-finish-1"), 1)
      << "what the connector took for a hold goes back";
}

// A step that throws after its forward pass fails its whole batch (the
// engine cannot tell which request caused it); the next request is served
// exactly. Failures in a row with no step completing are counted until one
// completes.
TEST_F(FailingSteps, AThrowingStepFailsItsBatchAndTheEngineGoesOn) {
  Engine& engine = start();
  for (int i = 0; i < kFailingAfterSteps; ++i) {
    Collector failed;
    // 40 tokens: the first step fills two blocks, which are saved.
    ASSERT_TRUE(
        engine
            .addRequest(greedyRequest("bad-save-" + std::to_string(i), randomTokens(40, 13), 5),
                        failed.callback())
            .isOk());
    ASSERT_TRUE(failed.waitFinished());
    EXPECT_EQ(failed.reason, FinishReason::kError);
    EXPECT_TRUE(failed.tokens.empty());
    EXPECT_EQ(engine.stats().consecutive_step_failures, i + 1);
  }
  EXPECT_EQ(engine.stats().num_step_failures, kFailingAfterSteps);
  EXPECT_NE(engine.stats().last_step_error.find("save failed for bad-save-2"), std::string::npos);
  EXPECT_EQ(engine.stats().num_free_blocks, 64);

  const std::vector<TokenId> prompt = randomTokens(40, 13);
  const std::vector<TokenId> expected = generateWithoutConnector(prompt, 5);
  Collector good;
  ASSERT_TRUE(engine.addRequest(greedyRequest("good", prompt, 5), good.callback()).isOk());
  ASSERT_TRUE(good.waitFinished());
  // Its prompt's blocks were computed and cached by the failed steps (the
  // save came after the forward pass): a hit on them gives the same tokens.
  EXPECT_EQ(good.tokens, expected);
  EXPECT_TRUE(eventually([&] { return engine.stats().consecutive_step_failures == 0; }));
  EXPECT_TRUE(eventually([&] { return engine.stats().num_free_blocks == 64; }));
}

}  // namespace
}  // namespace tandem::engine
