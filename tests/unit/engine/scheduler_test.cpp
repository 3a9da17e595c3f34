// The scheduler with real blocks and a real forward pass: token budgets,
// chunked prefill, prefix reuse, preemption by recompute and segmented
// prefill all give bit-identical logits and KV bytes.
#include "agent/engine/scheduler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "agent/engine/block_manager.h"
#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
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

const Model& tinyModel() {
  static ::tandem::testing::TempDir dir("tandem-scheduler-test");
  static std::unique_ptr<Model> model = [] {
    tools::TestModelOptions options;
    options.seed = 3;
    tools::writeTestModel(options, dir.path());
    return Model::load(dir.path());
  }();
  return *model;
}

std::vector<TokenId> randomTokens(size_t n, uint32_t seed) {
  return ::tandem::testing::randomTokenIds(
      n, seed, 0, static_cast<TokenId>(tinyModel().config().vocab_size - 1));
}

// A block manager, KV cache, scheduler and runner wired as the engine wires them.
struct Harness {
  explicit Harness(int64_t num_blocks, SchedulerConfig scheduler_config = {}) {
    const ModelConfig& mc = tinyModel().config();
    KvCacheConfig kv;
    kv.num_blocks = num_blocks;
    kv.block_size = 16;
    kv.dtype = DType::kF32;
    kv.num_layers = static_cast<int32_t>(mc.num_hidden_layers);
    kv.num_kv_heads = static_cast<int32_t>(mc.num_key_value_heads);
    kv.head_dim = static_cast<int32_t>(mc.head_dim);
    cache = std::make_unique<KvCache>(kv, std::make_unique<HostSlabAllocator>());
    BlockManagerConfig block_config;
    block_config.num_blocks = num_blocks;
    block_config.block_size = 16;
    block_config.model_identity = "scheduler-test";
    blocks = std::make_unique<BlockManager>(block_config);
    scheduler = std::make_unique<Scheduler>(scheduler_config, *blocks);
    runner = std::make_unique<ModelRunner>(tinyModel(), *cache, cpuBackend());
  }

  Sequence* add(const std::string& id, std::vector<TokenId> prompt, int64_t priority = 0) {
    Request request;
    request.id = id;
    request.prompt = std::move(prompt);
    request.priority = priority;
    auto sequence = std::make_unique<Sequence>(std::move(request));
    Sequence* raw = sequence.get();
    scheduler->add(std::move(sequence));
    return raw;
  }

  // One step: schedule, compute, advance; greedy-samples sequences whose chunk
  // ended at their last token. Returns the logits of sampling sequences.
  std::map<std::string, std::vector<float>> step(SchedulerOutput* out = nullptr) {
    SchedulerOutput output = scheduler->schedule();
    std::vector<SequenceInput> inputs;
    for (const ScheduledChunk& chunk : output.chunks) {
      inputs.push_back(
          {std::span<const TokenId>(chunk.sequence->tokens).subspan(chunk.start, chunk.num_tokens),
           chunk.start, chunk.sequence->blocks.blocks});
    }
    std::vector<float> logits;
    if (!inputs.empty()) runner->forward(inputs, logits);
    scheduler->onStepComputed(output);
    std::map<std::string, std::vector<float>> sampled;
    const int64_t vocab = tinyModel().config().vocab_size;
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      if (!output.chunks[i].samples) continue;
      std::vector<float> row(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
      Sequence* sequence = output.chunks[i].sequence;
      sequence->tokens.push_back(static_cast<TokenId>(kernels::argmax(row.data(), vocab)));
      sampled[sequence->request.id] = std::move(row);
    }
    if (out != nullptr) *out = std::move(output);
    return sampled;
  }

  std::vector<uint8_t> kvBytes(const Sequence& sequence, int64_t num_blocks) const {
    std::vector<uint8_t> bytes;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t* data = cache->blockData(sequence.blocks.blocks[b]);
      bytes.insert(bytes.end(), data, data + cache->blockBytes());
    }
    return bytes;
  }

  std::unique_ptr<KvCache> cache;
  std::unique_ptr<BlockManager> blocks;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;
};

// Greedy tokens of one prompt generated alone with a roomy cache.
std::vector<TokenId> generateAlone(const std::vector<TokenId>& prompt, int64_t num_new) {
  Harness h(64);
  Sequence* sequence = h.add("alone", prompt);
  while (sequence->numGenerated() < num_new) h.step();
  return std::vector<TokenId>(sequence->tokens.begin() + prompt.size(), sequence->tokens.end());
}

// Steps until each sequence has generated `num_new` tokens, finishing it
// then (into `finished`, which keeps it alive); returns the generated
// tokens of each by request id (one that never got there is missing).
std::map<std::string, std::vector<TokenId>> runUntilGenerated(
    Harness& h, const std::vector<Sequence*>& sequences, int64_t num_new,
    std::vector<std::unique_ptr<Sequence>>& finished) {
  std::map<std::string, std::vector<TokenId>> results;
  for (int guard = 0; guard < 2000 && results.size() < sequences.size(); ++guard) {
    h.step();
    for (Sequence* s : sequences) {
      if (results.count(s->request.id) != 0) continue;
      if (s->status == SequenceStatus::kRunning && s->numGenerated() >= num_new) {
        results[s->request.id] =
            std::vector<TokenId>(s->tokens.begin() + s->num_prompt_tokens, s->tokens.end());
        finished.push_back(h.scheduler->finish(s));
      }
    }
  }
  return results;
}

TEST(Scheduler, RespectsTokenBudgetAndChunksPrefill) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 20;
  Harness h(32, config);
  Sequence* a = h.add("a", randomTokens(45, 1));
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 20);
  EXPECT_FALSE(out.chunks[0].samples);
  h.step(&out);
  EXPECT_EQ(out.chunks[0].start, 20);
  h.step(&out);
  EXPECT_EQ(out.chunks[0].num_tokens, 5);
  EXPECT_TRUE(out.chunks[0].samples);
  EXPECT_EQ(a->numGenerated(), 1);
}

TEST(Scheduler, DecodeComesBeforeNewPrefill) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 16;
  Harness h(32, config);
  h.add("a", randomTokens(10, 2));
  h.step();  // a prefilled, first token sampled
  h.add("b", randomTokens(40, 3));
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[0].sequence->request.id, "a");
  EXPECT_EQ(out.chunks[0].num_tokens, 1);
  EXPECT_EQ(out.chunks[1].num_tokens, 15) << "the prefill gets what the decode left";
}

TEST(Scheduler, SecondRequestReusesCachedPrefixAndComputesOnlyTheRest) {
  Harness h(64);
  std::vector<TokenId> prefix = randomTokens(160, 4);  // 10 blocks
  std::vector<TokenId> first = prefix, second = prefix;
  for (TokenId t : randomTokens(7, 5)) first.push_back(t);
  for (TokenId t : randomTokens(9, 6)) second.push_back(t);
  Sequence* a = h.add("a", first);
  h.step();
  EXPECT_EQ(a->num_cached_tokens, 0);
  Sequence* b = h.add("b", second);
  SchedulerOutput out;
  auto logits = h.step(&out);
  EXPECT_EQ(b->num_cached_tokens, 160);
  for (const auto& chunk : out.chunks) {
    if (chunk.sequence == b) {
      EXPECT_EQ(chunk.num_tokens, 9) << "only the uncached tail is computed";
    }
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b->blocks.blocks[i], a->blocks.blocks[i]);
  // The hit computes the same logits as a miss.
  Harness fresh(64);
  fresh.add("b", second);
  EXPECT_EQ(fresh.step()["b"], logits["b"]);
  EXPECT_EQ(h.blocks->prefixCacheHitTokens(), 160);
  EXPECT_EQ(h.blocks->prefixCacheQueryTokens(), static_cast<int64_t>(first.size() + second.size()));
}

TEST(Scheduler, APromptWaitsForTheBlocksAnotherIsComputingInsteadOfComputingThemTwice) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 64;  // a's 167 tokens take three steps
  Harness h(64, config);
  const std::vector<TokenId> prefix = randomTokens(160, 40);  // 10 blocks
  std::vector<TokenId> first = prefix, second = prefix;
  for (TokenId t : randomTokens(7, 41)) first.push_back(t);
  for (TokenId t : randomTokens(9, 42)) second.push_back(t);
  Sequence* a = h.add("a", first);
  Sequence* b = h.add("b", second);
  Sequence* c = h.add("c", randomTokens(20, 43));  // shares nothing: not held back
  SchedulerOutput out;
  std::map<std::string, std::vector<float>> sampled;
  int steps = 0;
  while (b->numGenerated() == 0 && steps < 10) {
    auto logits = h.step(&out);
    sampled.insert(logits.begin(), logits.end());
    ++steps;
    for (const ScheduledChunk& chunk : out.chunks) {
      if (chunk.sequence == b) {
        EXPECT_GE(a->num_computed_tokens, 160) << "b computes nothing while a computes the prefix";
      }
    }
  }
  EXPECT_EQ(b->num_cached_tokens, 160) << "the whole shared prefix is a hit";
  EXPECT_EQ(h.scheduler->numInFlightPrefixWaits(), 1);
  EXPECT_FALSE(c->waited_for_in_flight);
  EXPECT_EQ(h.blocks->prefixCacheHitTokens(), 160);
  // The hit computes the same logits as computing b alone.
  Harness fresh(64);
  fresh.add("b", second);
  EXPECT_EQ(fresh.step()["b"], sampled["b"]);
}

TEST(Scheduler, AWaitingPromptGoesAheadWhenTheSequenceItWaitedForEnds) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 32;
  Harness h(64, config);
  const std::vector<TokenId> prompt = randomTokens(100, 44);
  Sequence* a = h.add("a", prompt);
  Sequence* b = h.add("b", prompt);
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].sequence, a);
  h.scheduler->finish(a);  // aborted before its prefix was computed
  h.step(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].sequence, b);
  EXPECT_EQ(b->num_cached_tokens, 32) << "what a had cached before it ended is still a hit";
}

TEST(Scheduler, WithoutPrefixCachingNothingWaits) {
  BlockManagerConfig block_config;
  block_config.num_blocks = 64;
  block_config.block_size = 16;
  block_config.enable_prefix_caching = false;
  BlockManager blocks(block_config);
  Scheduler scheduler(SchedulerConfig{}, blocks);
  const std::vector<TokenId> prompt = randomTokens(100, 45);
  for (const char* id : {"a", "b"}) {
    Request request;
    request.id = id;
    request.prompt = prompt;
    scheduler.add(std::make_unique<Sequence>(std::move(request)));
  }
  EXPECT_EQ(scheduler.schedule().chunks.size(), 2u);
  EXPECT_EQ(scheduler.numInFlightPrefixWaits(), 0);
}

TEST(Scheduler, PreemptedSequencesRecomputeToIdenticalTokens) {
  const std::vector<TokenId> p1 = randomTokens(40, 7), p2 = randomTokens(33, 8),
                             p3 = randomTokens(50, 9);
  const int64_t num_new = 30;
  // 13 blocks cannot hold all three (needs 5 + 4 + 5 at the end): someone is
  // preempted and recomputed along the way.
  Harness h(13);
  Sequence* s1 = h.add("s1", p1);
  Sequence* s2 = h.add("s2", p2);
  Sequence* s3 = h.add("s3", p3);
  const int64_t free_at_start = h.blocks->numFreeBlocks();
  std::vector<std::unique_ptr<Sequence>> finished;
  std::map<std::string, std::vector<TokenId>> results =
      runUntilGenerated(h, {s1, s2, s3}, num_new, finished);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_GT(h.scheduler->numPreemptions(), 0) << "the test did not exercise preemption";
  EXPECT_EQ(results["s1"], generateAlone(p1, num_new));
  EXPECT_EQ(results["s2"], generateAlone(p2, num_new));
  EXPECT_EQ(results["s3"], generateAlone(p3, num_new));
  EXPECT_EQ(h.blocks->numFreeBlocks(), free_at_start) << "blocks leaked";
}

TEST(Scheduler, SegmentedPrefillComputesOnlyTheGap) {
  // Reference: the whole prompt computed in one go.
  const std::vector<TokenId> prompt = randomTokens(90, 10);
  Harness reference(16);
  Sequence* ref = reference.add("r", prompt);
  auto expected = reference.step()["r"];

  // Blocks 2 and 3 (positions 32..63) arrive from elsewhere: copy their KV
  // bytes in, mark them present, and compute only [0, 32) and [64, 90).
  Harness h(16);
  Sequence* s = h.add("s", prompt);
  ASSERT_TRUE(h.blocks->allocate(s->blocks, nullptr, 90));
  for (int b : {2, 3}) {
    std::memcpy(h.cache->blockData(s->blocks.blocks[b]),
                reference.cache->blockData(ref->blocks.blocks[b]), h.cache->blockBytes());
  }
  s->present_ranges = {{32, 64}};
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start, 0);
  EXPECT_EQ(out.chunks[0].num_tokens, 32) << "the chunk must stop at the present range";
  auto logits = h.step(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start, 64) << "the present range must be skipped";
  EXPECT_EQ(out.chunks[0].num_tokens, 26);
  EXPECT_EQ(h.runner->model().config().vocab_size, static_cast<int64_t>(logits["s"].size()));
  EXPECT_TRUE(logits["s"] == expected) << "segmented prefill changed the logits";
  EXPECT_EQ(h.kvBytes(*s, 6), reference.kvBytes(*ref, 6));
}

// A remote source for sequences named L...: their first `remote` tokens are
// loaded (until they are preempted: then they compute everything); loads end
// when the test calls loadFinished.
struct ParkingSource : ExternalKvSource {
  explicit ParkingSource(int64_t remote, bool fail = false) : remote(remote), fail(fail) {}
  Lookup lookup(const Sequence& sequence, int64_t local) override {
    Lookup lookup;
    if (sequence.request.id[0] == 'L' && local == 0 && sequence.num_preemptions == 0) {
      lookup.num_tokens = remote;
    }
    return lookup;
  }
  Load load(const Sequence&, int64_t, int64_t) override { return Load{false, {}}; }
  bool failOnLoadError() const override { return fail; }
  int64_t remote;
  bool fail;
};

// Steps until each sequence has generated `num_new` tokens (then finishes
// it); returns how many finished.
size_t runToEnd(Harness& h, const std::vector<Sequence*>& sequences, int64_t num_new) {
  std::vector<std::unique_ptr<Sequence>> finished;
  return runUntilGenerated(h, sequences, num_new, finished).size();
}

// Sequences whose loads ended hold their blocks while they wait; they never
// stall the queue. 20 blocks: S (100 tokens) grows until it preempts itself
// while L2 and L3 hold 6 blocks each on their loads; once the loads end, S
// (first in line) cannot get its 9 blocks from the 8 free, and nothing runs.
TEST(Scheduler, SequencesHoldingLoadedBlocksNeverStallTheQueue) {
  Harness h(20);
  ParkingSource source(80);
  h.scheduler->setExternalKvSource(&source);
  Sequence* s = h.add("S", randomTokens(100, 1));
  h.step();
  Sequence* l2 = h.add("L2", randomTokens(81, 2));
  Sequence* l3 = h.add("L3", randomTokens(81, 3));
  h.step();
  ASSERT_EQ(h.scheduler->numWaitingForRemoteKv(), 2);
  for (int i = 0; i < 100 && h.scheduler->numRunning() > 0; ++i) h.step();
  ASSERT_EQ(h.scheduler->numRunning(), 0);
  ASSERT_EQ(s->num_preemptions, 1);
  ASSERT_TRUE(h.scheduler->loadFinished("L2", {}));
  ASSERT_TRUE(h.scheduler->loadFinished("L3", {}));
  EXPECT_EQ(runToEnd(h, {s, l2, l3}, 8), 3u);
  EXPECT_EQ(h.blocks->numFreeBlocks(), 20) << "blocks leaked";
}

// Loaded sequences that each hold part of what they need: the one that runs
// would fill the cache and preempt itself for ever while the other waits
// holding its blocks; the waiting one gives them up instead. 9 blocks, a
// 32-token budget: L1 and L2 (100 tokens, 32 of them loaded) hold 4 each.
TEST(Scheduler, ARunningSequenceTakesTheBlocksWaitingOnesHoldBeforePreemptingItself) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 32;
  Harness h(9, config);
  ParkingSource source(32);
  h.scheduler->setExternalKvSource(&source);
  Sequence* l1 = h.add("L1", randomTokens(100, 4));
  Sequence* l2 = h.add("L2", randomTokens(100, 5));
  Sequence* m = h.add("M", randomTokens(40, 6));  // computed; no room for it yet
  h.step();
  ASSERT_EQ(h.scheduler->numWaitingForRemoteKv(), 2);
  ASSERT_EQ(h.blocks->numFreeBlocks(), 1);
  ASSERT_TRUE(h.scheduler->loadFinished("L1", {}));
  ASSERT_TRUE(h.scheduler->loadFinished("L2", {}));
  EXPECT_EQ(runToEnd(h, {l1, l2, m}, 8), 3u);
  EXPECT_GT(l1->num_preemptions + l2->num_preemptions, 0);
  EXPECT_EQ(h.blocks->numFreeBlocks(), 9) << "blocks leaked";
}

// Blocks held outside the scheduler (the engine's KV holds for remote
// readers) give way through the reclaimer, asked for exactly what is
// missing: before a running sequence preempts itself, and when a waiting
// one cannot be admitted, in the same schedule(). A reclaimer that frees
// nothing changes nothing.
TEST(Scheduler, HeldBlocksAreAskedForWhatIsMissingBeforePreemptionAndAdmissionFail) {
  Harness h(8);
  SequenceBlocks held;  // 5 blocks pinned for a reader that does not come
  ASSERT_TRUE(h.blocks->allocate(held, nullptr, 5 * 16));
  std::vector<int64_t> asked;
  bool give = false;
  h.scheduler->setHeldBlocksReclaimer([&](int64_t blocks_short) {
    asked.push_back(blocks_short);
    if (!give || held.blocks.empty()) return false;
    h.blocks->free(held);
    held = SequenceBlocks{};
    return true;
  });
  // A: 40 tokens (3 blocks), then decodes; its 4th block is not free.
  Sequence* a = h.add("A", randomTokens(40, 7));
  for (int i = 0; i < 100 && a->num_preemptions == 0; ++i) h.step();
  ASSERT_EQ(a->num_preemptions, 1) << "nothing given: it preempts itself as before";
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(asked.front(), 1) << "one block missing";
  give = true;
  asked.clear();
  for (int i = 0; i < 200 && a->numGenerated() < 30; ++i) h.step();
  EXPECT_EQ(a->numGenerated(), 30);
  EXPECT_EQ(a->num_preemptions, 1) << "the held blocks gave way; no second preemption";
  EXPECT_EQ(asked, std::vector<int64_t>({1}));
  EXPECT_TRUE(held.blocks.empty());
  h.scheduler->finish(a);

  // A waiting sequence: the reclaimer frees the held blocks inside the same
  // schedule() and it is admitted at once.
  ASSERT_TRUE(h.blocks->allocate(held, nullptr, 7 * 16));
  asked.clear();
  Sequence* b = h.add("B", randomTokens(40, 8));
  SchedulerOutput output;
  h.step(&output);
  ASSERT_EQ(asked, std::vector<int64_t>({2})) << "3 blocks needed, 1 free";
  ASSERT_EQ(output.chunks.size(), 1u);
  EXPECT_EQ(output.chunks[0].sequence, b);
  EXPECT_EQ(runToEnd(h, {b}, 4), 1u);
  EXPECT_EQ(h.blocks->numFreeBlocks(), 8) << "blocks leaked";
}

// A load that failed under the fail policy is reported once and never
// scheduled, even when a new lookup would find nothing to load (the engine
// ends it with an error in that step; a chunk of it would be computed after
// it was freed).
TEST(Scheduler, AFailedLoadIsReportedAndNeverScheduled) {
  Harness h(20);
  ParkingSource source(80, /*fail=*/true);
  h.scheduler->setExternalKvSource(&source);
  Sequence* a = h.add("L", randomTokens(90, 7));
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(h.scheduler->numWaitingForRemoteKv(), 1);
  source.remote = 0;  // a lookup now finds nothing (e.g. the blocks are cached meanwhile)
  ASSERT_TRUE(h.scheduler->loadFinished("L", {0, 1}));
  EXPECT_EQ(h.blocks->numFreeBlocks(), 20);
  out = h.scheduler->schedule();
  ASSERT_EQ(out.failed_loads.size(), 1u);
  EXPECT_EQ(out.failed_loads[0], a);
  EXPECT_TRUE(out.chunks.empty()) << "the failed load was scheduled";
  EXPECT_EQ(h.scheduler->numRunning(), 0);
  EXPECT_EQ(h.scheduler->numPrefillTokensWaiting(), 0);
  out = h.scheduler->schedule();
  EXPECT_TRUE(out.failed_loads.empty());
  EXPECT_TRUE(out.chunks.empty());
  const std::unique_ptr<Sequence> ended = h.scheduler->finish(a);
  EXPECT_EQ(h.blocks->numFreeBlocks(), 20);
  EXPECT_FALSE(h.scheduler->hasWork());
}

// Speculative decoding: a decode chunk takes drafts from the token budget
// and the free blocks left once every other chunk has its share, or as far
// as its own blocks reach (never preempting for them, nor keeping a waiting
// sequence out); they count as computed only as they are accepted, and the
// blocks of those not accepted go back.
TEST(Scheduler, DraftsJoinADecodeChunkWithinTheBudgetAndTheFreeBlocks) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 9;
  Harness h(3, config);
  int64_t offered = -1;
  h.scheduler->setDrafter([&](Sequence& sequence, int64_t max_drafts) {
    offered = max_drafts;
    sequence.draft.assign(static_cast<size_t>(std::min<int64_t>(max_drafts, 5)), 7);
    return static_cast<int64_t>(sequence.draft.size());
  });
  Sequence* a = h.add("a", randomTokens(14, 1));
  // The prompt in chunks of 9 and 5: no drafts for a chunk of prompt.
  for (int i = 0; i < 2; ++i) {
    SchedulerOutput out = h.scheduler->schedule();
    ASSERT_EQ(out.chunks.size(), 1u);
    EXPECT_EQ(out.chunks[0].num_draft_tokens, 0);
    h.scheduler->onStepComputed(out);
  }
  EXPECT_EQ(offered, -1);
  a->tokens.push_back(3);  // the first token
  SchedulerOutput out = h.scheduler->schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(offered, 8);  // the budget left after the token itself
  EXPECT_EQ(out.chunks[0].start, 14);
  EXPECT_EQ(out.chunks[0].num_tokens, 6);
  EXPECT_EQ(out.chunks[0].num_draft_tokens, 5);
  EXPECT_EQ(out.num_tokens, 6);
  EXPECT_EQ(a->blocks.blocks.size(), 2u);  // positions 14..19
  h.scheduler->onStepComputed(out);
  EXPECT_EQ(a->num_computed_tokens, 15);  // the drafts wait to be accepted
  a->tokens.push_back(7);                 // the first draft, sampled
  h.scheduler->acceptDraft(*a);
  EXPECT_EQ(a->num_computed_tokens, 16);
  a->tokens.push_back(9);  // the second draft rejected: 9 sampled instead
  h.scheduler->releaseDraftBlocks(*a);
  EXPECT_EQ(a->blocks.blocks.size(), 1u);  // positions 0..15 computed

  // a decodes on to the end of its second block (32 positions).
  for (int i = 0; i < 14; ++i) {
    a->tokens.push_back(1);
    h.scheduler->acceptDraft(*a);
  }
  ASSERT_EQ(a->num_computed_tokens, 30);  // 31 tokens
  // b arrives needing the last free block. Drafts come after every other
  // chunk: b is admitted with it, and a's drafts stop at the end of a's
  // blocks (position 30 is its last token, 31 its one draft).
  Sequence* b = h.add("b", randomTokens(3, 2));
  SchedulerOutput with_b = h.scheduler->schedule();
  ASSERT_EQ(with_b.chunks.size(), 2u);
  EXPECT_EQ(with_b.chunks[0].sequence, a);
  EXPECT_EQ(with_b.chunks[0].start, 30);
  EXPECT_EQ(with_b.chunks[0].num_draft_tokens, 1);
  EXPECT_EQ(a->draft.size(), 1u);
  EXPECT_EQ(a->blocks.blocks.size(), 2u);
  EXPECT_EQ(with_b.chunks[1].sequence, b);
  EXPECT_EQ(with_b.chunks[1].num_tokens, 3);
  EXPECT_EQ(with_b.num_tokens, 1 + 1 + 3);
  EXPECT_TRUE(with_b.preempted.empty());
  EXPECT_EQ(b->status, SequenceStatus::kRunning);
  EXPECT_EQ(h.scheduler->numPreemptions(), 0);
}

// Drafts take no free block that holds a cached prefix (evicting it), and
// none at all in a step that preempted (its free blocks are the victim's).
TEST(Scheduler, DraftsNeitherEvictCachedBlocksNorRunInAStepThatPreempted) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 64;
  bool propose = true;
  auto drafter = [&](Sequence& sequence, int64_t max_drafts) {
    sequence.draft.assign(static_cast<size_t>(propose ? std::min<int64_t>(max_drafts, 5) : 0), 7);
    return static_cast<int64_t>(sequence.draft.size());
  };
  {
    Harness h(4, config);
    h.scheduler->setDrafter(drafter);
    // Two blocks of a finished prompt stay cached, free.
    Sequence* cached = h.add("cached", randomTokens(33, 3));
    h.step();
    h.scheduler->finish(cached);
    ASSERT_EQ(h.blocks->cachedHashes().size(), 2u);
    Sequence* a = h.add("a", randomTokens(14, 1));
    Sequence* b = h.add("b", randomTokens(3, 2));
    h.step();  // both prompts: a and b take the two free blocks without a hash
    SchedulerOutput out = h.scheduler->schedule();
    ASSERT_EQ(out.chunks.size(), 2u);
    // a's drafts stop at the end of its block (position 15): the next free
    // blocks hold the cached prefix.
    EXPECT_EQ(out.chunks[0].sequence, a);
    EXPECT_EQ(out.chunks[0].num_draft_tokens, 1);
    EXPECT_EQ(out.chunks[1].sequence, b);
    EXPECT_EQ(out.chunks[1].num_draft_tokens, 5);  // b's block has room for 5
    EXPECT_EQ(h.blocks->cachedHashes().size(), 2u);
    EXPECT_EQ(h.blocks->numFreeBlocks(), 2);
  }
  {
    Harness h(2, config);
    h.scheduler->setDrafter(drafter);
    propose = false;
    Sequence* a = h.add("a", randomTokens(14, 1));
    Sequence* b = h.add("b", randomTokens(14, 2));
    while (a->num_computed_tokens < 16) h.step();
    // a's next token needs a second block: b, the newest, is preempted for
    // it. Drafts would fit in a's new block, but not in this step.
    propose = true;
    SchedulerOutput out = h.scheduler->schedule();
    ASSERT_EQ(out.preempted.size(), 1u);
    EXPECT_EQ(out.preempted[0], b);
    ASSERT_EQ(out.chunks.size(), 1u);
    EXPECT_EQ(out.chunks[0].sequence, a);
    EXPECT_EQ(out.chunks[0].num_draft_tokens, 0);
    EXPECT_TRUE(a->draft.empty());
  }
}

// disable_by_batch_size: no drafts in a step in which that many sequences
// run; drafts again once fewer do.
TEST(Scheduler, NoDraftsWhileTheBatchIsAtTheBound) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 64;
  Harness h(8, config);
  int calls = 0;
  h.scheduler->setDrafter(
      [&](Sequence& sequence, int64_t) {
        ++calls;
        sequence.draft.assign(2, 7);
        return int64_t{2};
      },
      /*disable_by_batch_size=*/2);
  Sequence* a = h.add("a", randomTokens(10, 1));
  Sequence* b = h.add("b", randomTokens(10, 2));
  h.step();  // both prompts
  SchedulerOutput out = h.scheduler->schedule();
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(out.chunks[0].num_draft_tokens + out.chunks[1].num_draft_tokens, 0);
  h.scheduler->onStepComputed(out);
  a->tokens.push_back(1);
  h.scheduler->finish(b);
  out = h.scheduler->schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(out.chunks[0].num_draft_tokens, 2);
}

// The queued prefill backlog: every waiting prompt's tokens until it is
// admitted, then nothing for it (a running prompt is no longer queued).
TEST(Scheduler, PrefillTokensWaitingCountsQueuedPromptsUntilAdmitted) {
  SchedulerConfig config;
  config.max_num_batched_tokens = 20;
  config.max_num_seqs = 1;
  Harness h(32, config);
  EXPECT_EQ(h.scheduler->numPrefillTokensWaiting(), 0);
  h.add("a", randomTokens(30, 4));
  h.add("b", randomTokens(12, 5));
  EXPECT_EQ(h.scheduler->numPrefillTokensWaiting(), 42);
  h.step();  // a admitted (its first chunk); b still queued behind the sequence limit
  EXPECT_EQ(h.scheduler->numWaiting(), 1);
  EXPECT_EQ(h.scheduler->numPrefillTokensWaiting(), 12);
}

// Priority scheduling (SchedulingPolicy::kPriority).
SchedulerConfig priorityConfig() {
  SchedulerConfig config;
  config.policy = SchedulingPolicy::kPriority;
  return config;
}

// Runs one sequence at a time to its first token and returns the order in
// which the sequences were served.
std::vector<std::string> servedOneByOne(SchedulingPolicy policy) {
  SchedulerConfig config;
  config.policy = policy;
  config.max_num_seqs = 1;
  Harness h(32, config);
  std::vector<Sequence*> all = {
      h.add("a", randomTokens(9, 11), 5), h.add("b", randomTokens(9, 12), 1),
      h.add("c", randomTokens(9, 13), 1), h.add("d", randomTokens(9, 14), -3),
      h.add("e", randomTokens(9, 15), 5)};
  std::vector<std::string> order;
  std::vector<std::unique_ptr<Sequence>> finished;
  for (int guard = 0; guard < 20 && order.size() < all.size(); ++guard) {
    SchedulerOutput out;
    h.step(&out);
    for (const ScheduledChunk& chunk : out.chunks) {
      order.push_back(chunk.sequence->request.id);
      finished.push_back(h.scheduler->finish(chunk.sequence));
    }
  }
  EXPECT_EQ(h.scheduler->numPreemptions(), 0);
  return order;
}

TEST(SchedulerPriority, TheQueueIsServedByPriorityThenByArrival) {
  EXPECT_EQ(servedOneByOne(SchedulingPolicy::kPriority),
            (std::vector<std::string>{"d", "b", "c", "a", "e"}));
  // First come, first served takes no notice of priorities.
  EXPECT_EQ(servedOneByOne(SchedulingPolicy::kFcfs),
            (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

TEST(SchedulerPriority, ABetterPromptTakesTheStepBeforeWorsePromptsWhichOnlyDecodeBesideIt) {
  for (const SchedulingPolicy policy : {SchedulingPolicy::kPriority, SchedulingPolicy::kFcfs}) {
    SCOPED_TRACE(schedulingPolicyName(policy));
    SchedulerConfig config;
    config.policy = policy;
    config.max_num_batched_tokens = 32;
    Harness h(32, config);
    Sequence* decoding = h.add("decoding", randomTokens(10, 15), 1);
    h.step();  // its prompt and first token
    Sequence* prefilling = h.add("prefilling", randomTokens(100, 16), 1);
    h.step();  // decoding's token and prefilling's first chunk (31 tokens)
    Sequence* better = h.add("better", randomTokens(20, 17), 0);
    SchedulerOutput out;
    h.step(&out);
    auto chunkOf = [&](const Sequence* sequence) -> const ScheduledChunk* {
      for (const ScheduledChunk& chunk : out.chunks) {
        if (chunk.sequence == sequence) return &chunk;
      }
      return nullptr;
    };
    ASSERT_NE(chunkOf(decoding), nullptr) << "a worse decode goes on beside the better prompt";
    EXPECT_EQ(chunkOf(decoding)->num_tokens, 1);
    EXPECT_TRUE(chunkOf(decoding)->samples);
    if (policy == SchedulingPolicy::kPriority) {
      ASSERT_NE(chunkOf(better), nullptr);
      EXPECT_EQ(chunkOf(better)->num_tokens, 20);
      EXPECT_TRUE(chunkOf(better)->samples);
      EXPECT_EQ(out.chunks[0].sequence, better) << "the better one is served first";
      EXPECT_EQ(chunkOf(prefilling), nullptr)
          << "a worse prompt does not lengthen the better prompt's step";
      EXPECT_EQ(out.num_tokens, 21);
      // Once the better one decodes, the worse prompt has the budget again.
      h.step(&out);
      ASSERT_NE(chunkOf(prefilling), nullptr);
      EXPECT_EQ(chunkOf(prefilling)->num_tokens, 30);
    } else {
      EXPECT_EQ(chunkOf(better), nullptr) << "the running prefill takes what decoding left";
      ASSERT_NE(chunkOf(prefilling), nullptr);
      EXPECT_EQ(chunkOf(prefilling)->num_tokens, 31);
    }
    EXPECT_EQ(h.scheduler->numPreemptions(), 0);
  }
}

TEST(SchedulerPriority, AWaitingBetterPriorityTakesTheSeatOfTheWorstRunningOneNeverAnEqual) {
  SchedulerConfig config = priorityConfig();
  config.max_num_seqs = 2;
  Harness h(32, config);
  Sequence* one = h.add("one", randomTokens(10, 18), 1);
  Sequence* two = h.add("two", randomTokens(10, 19), 2);
  h.step();  // one's prompt (two's waits: it would lengthen the step)
  h.step();  // one decodes, two's prompt
  ASSERT_EQ(h.scheduler->numRunning(), 2);
  // An equal of the best running one finds no seat and preempts nobody.
  Sequence* equal = h.add("equal", randomTokens(10, 20), 2);
  SchedulerOutput out;
  h.step(&out);
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(equal->status, SequenceStatus::kWaiting);
  // A better one preempts the worst running one (two, not one).
  Sequence* best = h.add("best", randomTokens(10, 21), 0);
  h.step(&out);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], two);
  EXPECT_EQ(two->status, SequenceStatus::kWaiting);
  EXPECT_EQ(best->status, SequenceStatus::kRunning);
  EXPECT_EQ(one->status, SequenceStatus::kRunning);
  EXPECT_EQ(h.scheduler->numPriorityPreemptions(), 1);
  EXPECT_EQ(h.scheduler->numPreemptions(), 1);
  // The victim waits ahead of the equal that came after it.
  std::vector<std::unique_ptr<Sequence>> finished;
  finished.push_back(h.scheduler->finish(best));
  h.step(&out);
  EXPECT_EQ(two->status, SequenceStatus::kRunning);
  EXPECT_EQ(equal->status, SequenceStatus::kWaiting);
}

TEST(SchedulerPriority, BlocksRunningOutPreemptTheWorstPriorityNotTheNewest) {
  SchedulerConfig config = priorityConfig();
  Harness h(6, config);
  // worse admitted first (2 blocks), better after it (2 blocks); both then
  // decode until the 6 blocks run out.
  Sequence* worse = h.add("worse", randomTokens(30, 22), 1);
  h.step();
  Sequence* better = h.add("better", randomTokens(30, 23), 0);
  h.step();
  ASSERT_EQ(h.scheduler->numRunning(), 2);
  SchedulerOutput out;
  for (int guard = 0; guard < 100 && out.preempted.empty(); ++guard) h.step(&out);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], worse) << "the newest running one is better: the worse goes";
  EXPECT_EQ(better->status, SequenceStatus::kRunning);
  EXPECT_EQ(h.scheduler->numPriorityPreemptions(), 0) << "a growth preemption, not an admission";
}

TEST(SchedulerPriority, PreemptedForABetterPriorityEveryoneEndsWithTheTokensItWouldHaveAlone) {
  const std::vector<TokenId> p1 = randomTokens(40, 24), p2 = randomTokens(33, 25),
                             p3 = randomTokens(70, 26);
  const int64_t num_new = 24;
  Harness h(10, priorityConfig());
  Sequence* s1 = h.add("s1", p1, 3);
  Sequence* s2 = h.add("s2", p2, 2);
  for (int i = 0; i < 4; ++i) h.step();  // both run; 6 blocks taken of 10
  // s3 needs 5 blocks to start: s1, the worst, gives its 3 and waits.
  // (s3 and s2 need all 10 at the end.)
  Sequence* s3 = h.add("s3", p3, 0);
  std::vector<std::unique_ptr<Sequence>> finished;
  std::map<std::string, std::vector<TokenId>> results =
      runUntilGenerated(h, {s1, s2, s3}, num_new, finished);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_GT(h.scheduler->numPreemptions(), 0) << "the test did not exercise preemption";
  EXPECT_GT(h.scheduler->numPriorityPreemptions(), 0);
  EXPECT_GT(s1->num_preemptions, 0) << "the worst priority gives way";
  EXPECT_EQ(s2->num_preemptions, 0);
  EXPECT_EQ(s3->num_preemptions, 0);
  EXPECT_EQ(results["s1"], generateAlone(p1, num_new));
  EXPECT_EQ(results["s2"], generateAlone(p2, num_new));
  EXPECT_EQ(results["s3"], generateAlone(p3, num_new));
  EXPECT_EQ(h.blocks->numFreeBlocks(), 10) << "blocks leaked";
}

TEST(SchedulerPriority, AWaitingBetterPriorityPreemptsForBlocksWhatItNeedsAndNoMore) {
  Harness h(10, priorityConfig());
  // Three worse sequences take 9 of 10 blocks (3 each).
  Sequence* a = h.add("a", randomTokens(40, 27), 5);
  Sequence* b = h.add("b", randomTokens(40, 28), 5);
  Sequence* c = h.add("c", randomTokens(40, 29), 6);
  h.step();  // a's and b's prompts
  h.step();  // a and b decode, c's prompt
  ASSERT_EQ(h.scheduler->numRunning(), 3);
  ASSERT_EQ(h.blocks->numFreeBlocks(), 1);
  // A better one of 60 tokens needs 4 blocks: c (the worst) gives 3 and is
  // enough; a and b (equals of each other, better than c) keep running.
  Sequence* best = h.add("best", randomTokens(60, 30), 0);
  SchedulerOutput out;
  h.step(&out);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], c);
  EXPECT_EQ(best->status, SequenceStatus::kRunning);
  EXPECT_EQ(a->status, SequenceStatus::kRunning);
  EXPECT_EQ(b->status, SequenceStatus::kRunning);
  EXPECT_EQ(h.scheduler->numPriorityPreemptions(), 1);
  EXPECT_TRUE(std::any_of(out.chunks.begin(), out.chunks.end(),
                          [&](const ScheduledChunk& chunk) { return chunk.sequence == best; }));
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
}

TEST(SchedulerPriority, ASequenceThatFindsNoRoomStopsTheQueueForWorsePriorities) {
  Harness h(6, priorityConfig());
  Sequence* running = h.add("running", randomTokens(60, 31), 0);  // 4 blocks of 6
  h.step();
  // big (priority 1) needs 3 blocks, 2 are free, and no worse sequence runs
  // to give way; small (priority 2) would fit but does not pass it.
  Sequence* big = h.add("big", randomTokens(40, 32), 1);
  Sequence* small = h.add("small", randomTokens(10, 33), 2);
  SchedulerOutput out;
  h.step(&out);
  EXPECT_EQ(big->status, SequenceStatus::kWaiting);
  EXPECT_EQ(small->status, SequenceStatus::kWaiting);
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].sequence, running);
}

// A prompt waits for shared blocks another sequence is computing only when
// that one is of its priority or better: a worse one may be served after
// others between them.
TEST(SchedulerPriority, ABetterPromptComputesSharedBlocksItselfRatherThanWaitForAWorseOne) {
  const std::vector<TokenId> prefix = randomTokens(160, 44);  // 10 blocks
  std::vector<TokenId> first = prefix, second = prefix;
  for (TokenId t : randomTokens(7, 45)) first.push_back(t);
  for (TokenId t : randomTokens(9, 46)) second.push_back(t);
  SchedulerConfig config = priorityConfig();
  config.max_num_batched_tokens = 64;  // the first prompt's 167 tokens take three steps
  for (const int64_t priority : {0, 5}) {
    SCOPED_TRACE(priority);
    Harness h(64, config);
    Sequence* producer = h.add("producer", first, 5);
    h.step();
    h.step();  // 128 tokens computed: 8 blocks cached, the last 39 to come
    Sequence* sharer = h.add("sharer", second, priority);
    h.step();
    if (priority == 0) {
      EXPECT_EQ(sharer->num_cached_tokens, 128) << "it takes what is cached, computes the rest";
      EXPECT_FALSE(sharer->waited_for_in_flight) << "a better prompt does not wait";
      EXPECT_EQ(sharer->status, SequenceStatus::kRunning);
      EXPECT_LT(producer->num_computed_tokens, 167);
    } else {
      EXPECT_TRUE(sharer->waited_for_in_flight) << "an equal waits as first come, first served";
      EXPECT_EQ(sharer->status, SequenceStatus::kWaiting);
    }
  }
}

TEST(SchedulerPriority, PolicyNamesAreTheOptionValues) {
  EXPECT_EQ(schedulingPolicyFromName("fcfs"), SchedulingPolicy::kFcfs);
  EXPECT_EQ(schedulingPolicyFromName("priority"), SchedulingPolicy::kPriority);
  EXPECT_STREQ(schedulingPolicyName(SchedulingPolicy::kPriority), "priority");
  EXPECT_STREQ(schedulingPolicyName(SchedulingPolicy::kFcfs), "fcfs");
  try {
    schedulingPolicyFromName("lifo", "scheduling_policy");
    FAIL() << "lifo was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scheduling_policy must be fcfs or priority, got \"lifo\"");
  }
}

}  // namespace
}  // namespace tandem::engine
