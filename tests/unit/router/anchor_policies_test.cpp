// The anchor policies (Dynamo's KV router, llm-d's default scheduling
// profile, SGLang's cache_aware): each formula checked against costs worked
// out by hand, ties spread at random, unhealthy agents skipped, and the
// conditional disaggregation all three share.
#include "operator/router/anchor_policies.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace tandem::router {
namespace {

using ChooseFn = Decision (*)(const DecisionInput&, const PolicyOptions&, std::mt19937_64&);

struct Anchor {
  const char* name;
  ChooseFn choose;
};

const Anchor kAnchors[] = {
    {"dynamo", &chooseDynamo}, {"llm_d", &chooseLlmD}, {"sglang", &chooseSglang}};

AgentView agent(const std::string& name, int64_t leading_blocks = 0) {
  AgentView view;
  view.name = name;
  view.leading_blocks = leading_blocks;
  return view;
}

// A 256-token prompt (16 blocks of 16).
DecisionInput input(std::vector<AgentView> prefill, std::vector<AgentView> decode,
                    int64_t num_prompt_tokens = 256) {
  DecisionInput in;
  in.num_prompt_tokens = num_prompt_tokens;
  in.max_tokens = 64;
  in.block_size = 16;
  in.prefill = std::move(prefill);
  in.decode = std::move(decode);
  return in;
}

PolicyOptions explained() {
  PolicyOptions options;
  options.explain = true;
  return options;
}

double costOf(const Decision& decision, const std::string& name, bool prefill) {
  for (const CandidateCost& c : decision.candidates) {
    if (c.agent == name && c.prefill == prefill) return c.cost;
  }
  ADD_FAILURE() << "no candidate " << name;
  return 0;
}

std::string decodeName(const DecisionInput& in, const Decision& d) {
  return d.decode ? in.decode[*d.decode].name : "";
}

std::string prefillName(const DecisionInput& in, const Decision& d) {
  return d.prefill ? in.prefill[*d.prefill].name : "";
}

// ---- Dynamo ----

TEST(DynamoPolicy, AggregatedCostIsPrefillBlocksPlusActiveBlocks) {
  std::mt19937_64 random(1);
  AgentView a = agent("a");
  AgentView b = agent("b", 8);
  b.reserved_kv_tokens = 160;
  // No prefill agent: the aggregated cost, weight 1.
  //   a: prefill (0 + 256 - 0) / 16 = 16;  active 0 / 16 + 16 request blocks = 16  -> 32
  //   b: prefill (0 + 256 - 128) / 16 = 8; active 160 / 16 + 16 = 26             -> 34
  DecisionInput in = input({}, {a, b});
  Decision d = chooseDynamo(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "a");
  EXPECT_EQ(d.kind, Decision::Kind::kLocalPrefill);
  EXPECT_DOUBLE_EQ(costOf(d, "a", false), 32);
  EXPECT_DOUBLE_EQ(costOf(d, "b", false), 34);

  // b with half the active blocks: 8 + 80 / 16 + 16 = 29 < 32. A zero overlap
  // weight would give a 16 against b 21 and keep a.
  in.decode[1].reserved_kv_tokens = 80;
  d = chooseDynamo(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "b");
  EXPECT_DOUBLE_EQ(costOf(d, "b", false), 29);

  // Active prompt tokens count as prefill blocks: (64 + 128) / 16 + 5 + 16 = 33 > 32.
  in.decode[1].reserved_prefill_tokens = 64;
  d = chooseDynamo(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "a");
  EXPECT_DOUBLE_EQ(costOf(d, "b", false), 33);
}

TEST(DynamoPolicy, DisaggregatedDecodeIsChosenByActiveBlocksAlone) {
  std::mt19937_64 random(2);
  AgentView holder = agent("holder", 16);
  holder.reserved_kv_tokens = 320;
  AgentView idle = agent("idle");
  idle.reserved_kv_tokens = 160;
  AgentView p1 = agent("p1");
  AgentView p2 = agent("p2", 8);
  p2.reserved_prefill_tokens = 200;
  // Decode, no overlap: holder 320 / 16 + 16 = 36, idle 160 / 16 + 16 = 26. With
  // the overlap term holder would cost 36 and idle 16 + 26 = 42.
  // Prefill, no active blocks: p1 (0 + 256) / 16 = 16, p2 (200 + 128) / 16 = 20.5.
  DecisionInput in = input({p1, p2}, {holder, idle});
  Decision d = chooseDynamo(in, explained(), random);
  EXPECT_EQ(d.kind, Decision::Kind::kDisaggregated);
  EXPECT_EQ(decodeName(in, d), "idle");
  EXPECT_EQ(prefillName(in, d), "p1");
  EXPECT_DOUBLE_EQ(costOf(d, "holder", false), 36);
  EXPECT_DOUBLE_EQ(costOf(d, "idle", false), 26);
  EXPECT_DOUBLE_EQ(costOf(d, "p1", true), 16);
  EXPECT_DOUBLE_EQ(costOf(d, "p2", true), 20.5);
  EXPECT_DOUBLE_EQ(d.overlap_ratio, 0.0);
  EXPECT_FALSE(d.pull_back);

  // p2 with fewer active tokens: (100 + 128) / 16 = 14.25 < 16.
  in.prefill[1].reserved_prefill_tokens = 100;
  d = chooseDynamo(in, explained(), random);
  EXPECT_EQ(prefillName(in, d), "p2");
  EXPECT_DOUBLE_EQ(costOf(d, "p2", true), 14.25);
  EXPECT_DOUBLE_EQ(d.overlap_ratio, 0.5);  // p2 holds 8 of 16 blocks
}

// ---- llm-d ----

TEST(LlmDPolicy, WeightedSumOfQueueKvCacheAndPrefixScores) {
  std::mt19937_64 random(3);
  AgentView a = agent("a");
  a.kv_usage = 0.5;
  AgentView b = agent("b", 8);
  b.waiting = 4;
  b.kv_usage = 0.2;
  AgentView c = agent("c", 16);
  c.waiting = 2;
  c.kv_usage = 0.9;
  // Queue min 0, max 4: a 1, b 0, c 0.5. KV 1 - usage: a 0.5, b 0.8, c 0.1.
  // Prefix held / 16: a 0, b 0.5, c 1.
  //   a: 2 x 1   + 2 x 0.5 + 3 x 0   = 3
  //   b: 2 x 0   + 2 x 0.8 + 3 x 0.5 = 3.1
  //   c: 2 x 0.5 + 2 x 0.1 + 3 x 1   = 4.2
  // (Queue 3 and prefix 2 would make a 4, b 2.6, c 3.7 and pick a.)
  DecisionInput in = input({}, {a, b, c});
  Decision d = chooseLlmD(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "c");
  EXPECT_NEAR(costOf(d, "a", false), -3.0, 1e-12);
  EXPECT_NEAR(costOf(d, "b", false), -3.1, 1e-12);
  EXPECT_NEAR(costOf(d, "c", false), -4.2, 1e-12);
}

TEST(LlmDPolicy, KvCacheScoreIsOneMinusUsageAndEqualQueuesScoreOne) {
  std::mt19937_64 random(4);
  AgentView empty = agent("empty");
  AgentView full = agent("full");
  full.kv_usage = 0.9;
  // Equal queues score 1 each: empty 2 + 2 x 1 = 4, full 2 + 2 x 0.1 = 2.2.
  DecisionInput in = input({}, {full, empty});
  Decision d = chooseLlmD(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "empty");
  EXPECT_NEAR(costOf(d, "empty", false), -4.0, 1e-12);
  EXPECT_NEAR(costOf(d, "full", false), -2.2, 1e-12);
}

TEST(LlmDPolicy, QueueCountsReservedRequestsTheAgentDoesNotYetRun) {
  std::mt19937_64 random(5);
  AgentView a = agent("a");  // polled idle, but 5 reserved and 1 running: 4 waiting
  a.running = 1;
  a.reserved_requests = 5;
  AgentView b = agent("b");
  b.waiting = 2;
  AgentView c = agent("c");
  c.waiting = 1;
  // Waiting 4, 2, 1: queue scores 0, 2/3, 1 -> c (costs -2, -3.333, -4).
  // The polled queues alone (0, 2, 1) would pick a.
  DecisionInput in = input({}, {a, b, c});
  Decision d = chooseLlmD(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "c");
  EXPECT_NEAR(costOf(d, "a", false), -2.0, 1e-12);
  EXPECT_NEAR(costOf(d, "b", false), -(2.0 * 2 / 3 + 2), 1e-12);
  EXPECT_NEAR(costOf(d, "c", false), -4.0, 1e-12);
}

TEST(LlmDPolicy, PrefillProfileScoresThePrefillPoolOnItsOwn) {
  std::mt19937_64 random(6);
  AgentView p1 = agent("p1", 4);  // 2 + 2 + 3 x 0.25 = 4.75
  AgentView p2 = agent("p2", 12);
  p2.waiting = 3;  // queue 0: 0 + 2 + 3 x 0.75 = 4.25
  AgentView d1 = agent("d1");
  DecisionInput in = input({p1, p2}, {d1});
  Decision d = chooseLlmD(in, explained(), random);
  EXPECT_EQ(d.kind, Decision::Kind::kDisaggregated);
  EXPECT_EQ(prefillName(in, d), "p1");
  EXPECT_NEAR(costOf(d, "p1", true), -4.75, 1e-12);
  EXPECT_NEAR(costOf(d, "p2", true), -4.25, 1e-12);
}

// ---- SGLang ----

TEST(SglangPolicy, BalancedLoadGoesToTheLongestMatchAboveTheCacheThreshold) {
  std::mt19937_64 random(7);
  AgentView holder = agent("holder", 5);  // 80 of 256 tokens: 0.3125 > 0.3
  holder.reserved_requests = 10;
  holder.kv_usage = 0.5;
  AgentView other = agent("other");
  other.kv_usage = 0.1;
  DecisionInput in = input({}, {holder, other});
  Decision d = chooseSglang(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "holder");
  EXPECT_DOUBLE_EQ(costOf(d, "holder", false), -5);

  // 64 of 256 tokens (0.25): a miss, the most free cache wins.
  in.decode[0].leading_blocks = 4;
  d = chooseSglang(in, explained(), random);
  EXPECT_EQ(decodeName(in, d), "other");
  EXPECT_DOUBLE_EQ(costOf(d, "other", false), 0.1);
  EXPECT_DOUBLE_EQ(costOf(d, "holder", false), 0.5);
}

TEST(SglangPolicy, MatchRateMustExceedTheCacheThreshold) {
  std::mt19937_64 random(8);
  AgentView holder = agent("holder", 3);  // 48 of 160 tokens: exactly 0.3
  holder.kv_usage = 0.5;
  AgentView other = agent("other");
  other.kv_usage = 0.1;
  DecisionInput in = input({}, {holder, other}, 160);
  EXPECT_EQ(decodeName(in, chooseSglang(in, explained(), random)), "other");
  in.decode[0].leading_blocks = 4;  // 64 of 160: 0.4
  EXPECT_EQ(decodeName(in, chooseSglang(in, explained(), random)), "holder");
}

TEST(SglangPolicy, ImbalancedLoadGoesToTheShortestQueue) {
  std::mt19937_64 random(9);
  AgentView holder = agent("holder", 16);
  AgentView idle = agent("idle");
  DecisionInput in = input({}, {holder, idle});
  const auto chosen = [&](int64_t holder_load, int64_t idle_load) {
    in.decode[0].reserved_requests = holder_load;
    in.decode[1].reserved_requests = idle_load;
    return decodeName(in, chooseSglang(in, explained(), random));
  };
  // Imbalanced when max - min > 64 and max > 1.5 x min.
  EXPECT_EQ(chosen(70, 5), "idle");       // 65 > 64, 70 > 7.5
  EXPECT_EQ(chosen(70, 6), "holder");     // 64, not > 64: balanced, full match
  EXPECT_EQ(chosen(196, 130), "idle");    // 66 > 64, 196 > 195
  EXPECT_EQ(chosen(195, 130), "holder");  // 195 not > 195
  in.decode[0].reserved_requests = 70;
  in.decode[1].reserved_requests = 5;
  Decision d = chooseSglang(in, explained(), random);
  EXPECT_DOUBLE_EQ(costOf(d, "holder", false), 70);
  EXPECT_DOUBLE_EQ(costOf(d, "idle", false), 5);
}

TEST(SglangPolicy, EachPoolIsBalancedOnItsOwnLoads) {
  std::mt19937_64 random(10);
  AgentView p_holder = agent("p_holder", 16);
  p_holder.reserved_requests = 100;
  AgentView p_idle = agent("p_idle");
  AgentView d_holder = agent("d_holder", 8);
  d_holder.reserved_requests = 100;
  AgentView d_busy = agent("d_busy");
  d_busy.reserved_requests = 90;
  // Prefill loads 100 / 0: imbalanced, p_idle. Decode 100 / 90: balanced, and
  // d_holder's 8 blocks (0.5) are a hit.
  // d_holder lacks 128 tokens: disaggregated under a 64-token threshold.
  PolicyOptions options = explained();
  options.disagg_threshold_tokens = 64;
  DecisionInput in = input({p_holder, p_idle}, {d_holder, d_busy});
  Decision d = chooseSglang(in, options, random);
  EXPECT_EQ(d.kind, Decision::Kind::kDisaggregated);
  EXPECT_EQ(prefillName(in, d), "p_idle");
  EXPECT_EQ(decodeName(in, d), "d_holder");
}

// ---- All three ----

TEST(AnchorPolicies, TiesAreBrokenAtRandom) {
  for (const Anchor& anchor : kAnchors) {
    std::mt19937_64 random(11);
    std::vector<AgentView> four = {agent("a"), agent("b"), agent("c"), agent("d")};
    DecisionInput in = input(four, four);
    PolicyOptions options;
    std::map<size_t, int> decode_count;
    std::map<size_t, int> prefill_count;
    for (int i = 0; i < 1000; ++i) {
      const Decision d = anchor.choose(in, options, random);
      ASSERT_TRUE(d.decode && d.prefill) << anchor.name;
      ++decode_count[*d.decode];
      ++prefill_count[*d.prefill];
    }
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_GE(decode_count[i], 150) << anchor.name << " decode " << i;
      EXPECT_LE(decode_count[i], 350) << anchor.name << " decode " << i;
      EXPECT_GE(prefill_count[i], 150) << anchor.name << " prefill " << i;
      EXPECT_LE(prefill_count[i], 350) << anchor.name << " prefill " << i;
    }
  }
}

TEST(AnchorPolicies, UnhealthyAgentsAreNeverChosen) {
  for (const Anchor& anchor : kAnchors) {
    std::mt19937_64 random(12);
    // The sick agents hold the whole prompt and carry no load: each policy's
    // favourite were they healthy.
    AgentView sick_prefill = agent("sick_p", 16);
    sick_prefill.healthy = false;
    AgentView sick_decode = agent("sick_d", 16);
    sick_decode.healthy = false;
    AgentView prefill = agent("p");
    prefill.reserved_requests = 3;
    prefill.reserved_prefill_tokens = 512;
    prefill.waiting = 3;
    AgentView decode = agent("d");
    decode.reserved_requests = 3;
    decode.reserved_kv_tokens = 960;
    decode.waiting = 3;
    DecisionInput in = input({sick_prefill, prefill}, {sick_decode, decode});
    for (int i = 0; i < 50; ++i) {
      const Decision d = anchor.choose(in, explained(), random);
      EXPECT_EQ(decodeName(in, d), "d") << anchor.name;
      EXPECT_EQ(prefillName(in, d), "p") << anchor.name;
      EXPECT_EQ(d.candidates.size(), 2u) << anchor.name;
    }
    // No healthy prefill agent: the decode agent prefills.
    in.prefill[1].healthy = false;
    const Decision d = anchor.choose(in, explained(), random);
    EXPECT_EQ(d.kind, Decision::Kind::kLocalPrefill) << anchor.name;
    EXPECT_FALSE(d.prefill) << anchor.name;
    EXPECT_EQ(decodeName(in, d), "d") << anchor.name;
  }
}

TEST(AnchorPolicies, ShortUncachedPartIsPrefilledOnTheDecodeAgent) {
  for (const Anchor& anchor : kAnchors) {
    std::mt19937_64 random(13);
    PolicyOptions options;
    options.disagg_threshold_tokens = 100;
    // 256 tokens, the decode agent holds 10 blocks: 96 uncached < 100.
    DecisionInput in = input({agent("p")}, {agent("d", 10)});
    Decision d = anchor.choose(in, options, random);
    EXPECT_EQ(d.kind, Decision::Kind::kLocalPrefill) << anchor.name;
    EXPECT_FALSE(d.prefill) << anchor.name;
    EXPECT_FALSE(d.pull_back) << anchor.name;
    EXPECT_DOUBLE_EQ(d.overlap_ratio, 10.0 / 16) << anchor.name;
    // 100 uncached of 260: not shorter than the threshold, disaggregated.
    in.num_prompt_tokens = 260;
    d = anchor.choose(in, options, random);
    EXPECT_EQ(d.kind, Decision::Kind::kDisaggregated) << anchor.name;
    EXPECT_EQ(prefillName(in, d), "p") << anchor.name;
    EXPECT_FALSE(d.pull_back) << anchor.name;
  }
}

TEST(AnchorPolicies, NoHealthyDecodeAgentMeansNoDecision) {
  for (const Anchor& anchor : kAnchors) {
    std::mt19937_64 random(14);
    AgentView sick = agent("d", 16);
    sick.healthy = false;
    DecisionInput in = input({agent("p")}, {sick});
    Decision d = anchor.choose(in, explained(), random);
    EXPECT_EQ(d.kind, Decision::Kind::kNone) << anchor.name;
    EXPECT_FALSE(d.decode) << anchor.name;
    EXPECT_FALSE(d.prefill) << anchor.name;
    in.decode.clear();
    d = anchor.choose(in, explained(), random);
    EXPECT_EQ(d.kind, Decision::Kind::kNone) << anchor.name;
  }
}

}  // namespace
}  // namespace tandem::router
