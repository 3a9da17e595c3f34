// The kv policy's time model and the router's load ledger, without I/O:
// predictions match the step-time profile's formula, ties spread at random,
// decisions that see each other's reservations spread instead of herding on
// stale polled load, a hot prefix spills to idle agents only when its
// holders' queues cost more than recomputing, local prefill respects the ITL
// target, and every reservation is released exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "operator/router/load_ledger.h"
#include "operator/router/policy.h"

namespace tandem::router {
namespace {

AgentView agent(const std::string& name, int64_t leading_blocks = 0) {
  AgentView view;
  view.name = name;
  view.leading_blocks = leading_blocks;
  return view;
}

engine::StepProfile profile() {
  engine::StepProfile p;
  p.name = "test";
  p.base_s = 0.005;
  p.prefill_token_s = 2e-5;
  p.decode_sequence_s = 4e-6;
  p.context_token_s = 5e-8;
  p.prefill_context_s = 1e-9;
  p.kv_link_bytes_per_s = 4e10;
  p.model.kv_bytes_per_token = 131072;
  return p;
}

PolicyOptions kvOptions() {
  PolicyOptions options;
  options.policy = Policy::kKv;
  options.profile = profile();
  return options;
}

DecisionInput cluster(int prefill, int decode, int64_t prompt, int64_t max_tokens) {
  DecisionInput input;
  input.num_prompt_tokens = prompt;
  input.max_tokens = max_tokens;
  input.block_size = 16;
  for (int i = 0; i < prefill; ++i) {
    input.prefill.push_back(agent(std::string("p").append(std::to_string(i))));
  }
  for (int i = 0; i < decode; ++i) {
    input.decode.push_back(agent(std::string("d").append(std::to_string(i))));
  }
  return input;
}

// What the ledger adds to the chosen agents' views (completion_flow.cpp).
void reserve(DecisionInput& input, const Decision& decision) {
  AgentView& decode = input.decode[*decision.decode];
  decode.reserved_requests += 1;
  decode.reserved_kv_tokens += input.num_prompt_tokens + input.max_tokens;
  if (decision.prefill) {
    AgentView& prefill = input.prefill[*decision.prefill];
    prefill.reserved_requests += 1;
    prefill.reserved_prefill_tokens +=
        input.num_prompt_tokens - prefill.leading_blocks * input.block_size;
  } else {
    decode.reserved_prefill_tokens +=
        input.num_prompt_tokens - decode.leading_blocks * input.block_size;
  }
}

TEST(KvPolicy, PredictedTtftIsTheProfilesFormula) {
  // One idle prefill agent and one idle decode agent, nothing cached:
  // TTFT = prefill step (base + per token + attention) + hand-off of every
  // token + the first decode step.
  const engine::StepProfile p = profile();
  Chooser chooser(kvOptions());
  DecisionInput input = cluster(1, 1, 1024, 32);
  const Decision decision = chooser.choose(input);
  ASSERT_EQ(decision.kind, Decision::Kind::kDisaggregated);
  const double prefill = p.base_s + p.prefill_token_s * 1024 + p.prefill_context_s * 1024 * 1024;
  const double handoff = 1024.0 * 131072 / 4e10;
  const double step = p.base_s + p.decode_sequence_s * 1 + p.context_token_s * (1024 + 32);
  EXPECT_NEAR(decision.predicted_ttft_s, prefill + handoff + step, 1e-12);

  // 3,000 tokens reserved ahead on the prefill agent add their compute.
  input.prefill[0].reserved_prefill_tokens = 3000;
  input.prefill[0].reserved_requests = 2;
  EXPECT_NEAR(chooser.choose(input).predicted_ttft_s,
              prefill + handoff + step + p.prefill_token_s * 3000, 1e-12);

  // A profile twice as slow (scale 2) predicts twice the compute.
  PolicyOptions slow = kvOptions();
  slow.profile->scale = 2;
  Chooser slow_chooser(slow);
  input.prefill[0].reserved_prefill_tokens = 0;
  input.prefill[0].reserved_requests = 0;
  EXPECT_NEAR(slow_chooser.choose(input).predicted_ttft_s, 2 * prefill + handoff + 2 * step, 1e-12);
}

TEST(KvPolicy, WithoutAProfileItPredictsWithTheH100ProfileFile) {
  auto file = engine::StepProfile::fromFile(std::filesystem::path(TANDEM_SOURCE_DIR) /
                                            "profiles/llama3.1-8b-h100.yaml");
  ASSERT_TRUE(file.isOk()) << file.status().message();
  const engine::StepProfile builtin = defaultRoutingProfile();
  EXPECT_EQ(builtin.name, file->name);
  EXPECT_EQ(builtin.base_s, file->base_s);
  EXPECT_EQ(builtin.prefill_token_s, file->prefill_token_s);
  EXPECT_EQ(builtin.decode_sequence_s, file->decode_sequence_s);
  EXPECT_EQ(builtin.context_token_s, file->context_token_s);
  EXPECT_EQ(builtin.prefill_context_s, file->prefill_context_s);
  EXPECT_EQ(builtin.kv_link_bytes_per_s, file->kv_link_bytes_per_s);
  EXPECT_EQ(builtin.model.kv_bytes_per_token, file->model.kv_bytes_per_token);
  // A chooser given no profile predicts what one given the file does.
  PolicyOptions none = kvOptions();
  none.profile.reset();
  PolicyOptions given = kvOptions();
  given.profile = *file;
  Chooser a(none), b(given);
  const DecisionInput input = cluster(2, 2, 3000, 64);
  EXPECT_EQ(a.choose(input).predicted_ttft_s, b.choose(input).predicted_ttft_s);
}

TEST(KvPolicy, EqualCostsSpreadAtRandom) {
  // 2,048 uncached tokens: too long to prefill locally within the ITL
  // target, so every decision disaggregates.
  Chooser chooser(kvOptions(), 42);
  const DecisionInput input = cluster(4, 4, 2048, 32);
  std::map<size_t, int> decode, prefill;
  for (int i = 0; i < 1000; ++i) {
    const Decision decision = chooser.choose(input);
    ASSERT_EQ(decision.kind, Decision::Kind::kDisaggregated);
    decode[*decision.decode] += 1;
    prefill[*decision.prefill] += 1;
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(decode[i], 150) << "decode agent " << i;
    EXPECT_LT(decode[i], 350) << "decode agent " << i;
    EXPECT_GT(prefill[i], 150) << "prefill agent " << i;
    EXPECT_LT(prefill[i], 350) << "prefill agent " << i;
  }
  // The same seed makes the same choices.
  Chooser again(kvOptions(), 42), first(kvOptions(), 42);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(again.choose(input).decode, first.choose(input).decode);
}

TEST(KvPolicy, SimultaneousDecisionsSpreadOverStaleLoad) {
  // 32 requests decided back to back while every agent's polled load is the
  // same stale value: the reservations each decision leaves are what the
  // next one sees, so no agent takes more than its share plus one.
  Chooser chooser(kvOptions(), 7);
  DecisionInput input = cluster(8, 8, 1200, 32);
  for (AgentView& view : input.decode) {
    view.running = 2;  // polled, stale, equal: the router's own requests
  }
  std::map<size_t, int> decode, prefill;
  for (int i = 0; i < 32; ++i) {
    const Decision decision = chooser.choose(input);
    ASSERT_TRUE(decision.decode && decision.prefill);
    decode[*decision.decode] += 1;
    prefill[*decision.prefill] += 1;
    reserve(input, decision);
  }
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_LE(decode[i], 5) << "decode agent " << i;
    EXPECT_LE(prefill[i], 5) << "prefill agent " << i;
  }
}

TEST(KvPolicy, HeldPrefixWinsUntilItsQueueCostsMoreThanRecomputing) {
  const engine::StepProfile p = profile();
  PolicyOptions options = kvOptions();
  options.pull_back = false;  // no lending: the spilled agent recomputes the prefix
  Chooser chooser(options);
  DecisionInput input = cluster(2, 1, 2048 + 64, 32);
  input.prefill[0].leading_blocks = 128;  // holds the 2,048-token system prompt
  Decision decision = chooser.choose(input);
  EXPECT_EQ(decision.prefill, 0u);
  EXPECT_TRUE(decision.affinity);
  EXPECT_FALSE(decision.spilled);
  // The holder's queue now costs more than computing the prefix elsewhere:
  // 2,048 tokens of compute ≈ 2048 * 2e-5 + attention; 3,000 queued tokens
  // cost 0.06 s.
  // (Tokens reserved by no request: the ledger's request count, which makes
  // compute cost more under load, is the next test's.)
  input.prefill[0].reserved_prefill_tokens = 3000;
  decision = chooser.choose(input);
  EXPECT_EQ(decision.prefill, 1u);
  EXPECT_FALSE(decision.affinity);
  EXPECT_TRUE(decision.spilled);
  EXPECT_FALSE(decision.pull_back);
  // Just under the break-even it stays with the holder.
  const double saved =
      p.prefill_token_s * 2048 + p.prefill_context_s * (2112.0 * 2112 - 64.0 * 2112);
  input.prefill[0].reserved_prefill_tokens = static_cast<int64_t>(saved / p.prefill_token_s) - 10;
  decision = chooser.choose(input);
  EXPECT_EQ(decision.prefill, 0u);
  EXPECT_FALSE(decision.spilled);
}

TEST(KvPolicy, UnderLoadRecomputingAHeldPrefixCostsTheRequestsQueuedBehindIt) {
  // The holder's queue (3,000 tokens, 0.06 s) costs more than computing the
  // 2,048-token prefix elsewhere (~0.05 s): idle, the request spills. With
  // 3 requests queued on each prefill agent on average, each second of
  // compute is charged 3 times more, and recomputing loses.
  const engine::StepProfile p = profile();
  PolicyOptions options = kvOptions();
  options.pull_back = false;
  Chooser chooser(options);
  DecisionInput input = cluster(2, 1, 2048 + 64, 32);
  input.prefill[0].leading_blocks = 128;
  input.prefill[0].reserved_prefill_tokens = 3000;
  EXPECT_EQ(chooser.choose(input).prefill, 1u);
  input.prefill[0].reserved_requests = 3;
  input.prefill[1].reserved_requests = 3;
  input.prefill[1].reserved_prefill_tokens = 300;
  Decision decision = chooser.choose(input);
  EXPECT_EQ(decision.prefill, 0u);
  EXPECT_TRUE(decision.affinity);
  // The charge is on the cost, not on the predicted TTFT.
  const double own = 3000 * p.prefill_token_s + p.base_s + p.prefill_token_s * 64 +
                     p.prefill_context_s * 64 * 2112;
  EXPECT_NEAR(decision.predicted_prefill_s, own, 1e-12);
}

TEST(KvPolicy, ASpilledPrefillAgentReadsTheHotPrefixFromItsPrefillHolder) {
  // With lending, the spilled agent reads the 2,048-token prefix from the
  // busy holder instead of computing it: spilling pays once the holder's
  // queue costs more than that read (128 blocks * 16 * 128 KiB / 40 GB/s).
  // (No ITL to spare for local prefill, which could read it too: the
  // disaggregated choice is the one under test.)
  const engine::StepProfile p = profile();
  PolicyOptions no_local = kvOptions();
  no_local.itl_target_s = 0;
  Chooser chooser(no_local);
  DecisionInput input = cluster(3, 1, 2048 + 64, 32);
  input.prefill[0].leading_blocks = 128;
  const double read_s = 2048.0 * 131072 / 4e10;
  input.prefill[0].reserved_prefill_tokens = static_cast<int64_t>(read_s / p.prefill_token_s) + 10;
  input.prefill[0].reserved_requests = 1;
  input.prefill[2].reserved_prefill_tokens = 1;  // p1 is the less-loaded one
  Decision decision = chooser.choose(input);
  ASSERT_EQ(decision.prefill, 1u);
  EXPECT_TRUE(decision.spilled);
  EXPECT_TRUE(decision.pull_back);
  ASSERT_TRUE(decision.lending_prefill.has_value());
  EXPECT_EQ(*decision.lending_prefill, 0u) << "the prefill holder lends, not the decode agent";
  // What the spilled agent then computes: the 64-token suffix, plus the read.
  const double suffix = p.base_s + p.prefill_token_s * 64 + p.prefill_context_s * 64 * 2112;
  EXPECT_NEAR(decision.predicted_prefill_s, suffix + read_s, 1e-12);
  // Just under that queue it stays with the holder.
  input.prefill[0].reserved_prefill_tokens = static_cast<int64_t>(read_s / p.prefill_token_s) - 10;
  decision = chooser.choose(input);
  EXPECT_EQ(decision.prefill, 0u);
  EXPECT_FALSE(decision.pull_back);
  // The decode agent lends when it holds at least as much as any prefill
  // agent.
  input.prefill[0].reserved_prefill_tokens = 100000;
  input.decode[0].leading_blocks = 128;
  decision = chooser.choose(input);
  ASSERT_EQ(decision.kind, Decision::Kind::kDisaggregated);
  EXPECT_TRUE(decision.pull_back);
  EXPECT_FALSE(decision.lending_prefill.has_value());
  EXPECT_EQ(decision.lending_decode, std::optional<size_t>(0)) << "the decision names its lender";
}

TEST(KvPolicy, ALocalPrefillReadsTheHotPrefixFromAnotherDecodeAgent) {
  // No prefill agent: every option is a local prefill. d0 holds the
  // 2,048-token prefix but is busy; d1, idle, reads it from d0 and computes
  // the 64-token suffix, rather than computing all 2,112 tokens again.
  const engine::StepProfile p = profile();
  Chooser chooser(kvOptions());
  DecisionInput input = cluster(0, 2, 2048 + 64, 32);
  input.decode[0].leading_blocks = 128;
  input.decode[0].reserved_prefill_tokens = 100000;
  input.decode[0].reserved_requests = 4;
  const Decision decision = chooser.choose(input);
  ASSERT_EQ(decision.kind, Decision::Kind::kLocalPrefill);
  EXPECT_EQ(decision.decode, 1u);
  EXPECT_TRUE(decision.pull_back);
  ASSERT_TRUE(decision.lending_decode.has_value());
  EXPECT_EQ(*decision.lending_decode, 0u);
  EXPECT_FALSE(decision.lending_prefill.has_value());
  const double read_s = 2048.0 * 131072 / 4e10;
  const double suffix = p.base_s + p.prefill_token_s * 64 + p.prefill_context_s * 64 * 2112;
  EXPECT_GT(decision.predicted_prefill_s, suffix + read_s);  // plus its decode step
  // Without lends it computes the whole prompt, which it predicts slower.
  PolicyOptions no_lends = kvOptions();
  no_lends.pull_back = false;
  const Decision computing = Chooser(no_lends).choose(input);
  EXPECT_EQ(computing.decode, 1u);
  EXPECT_FALSE(computing.pull_back);
  EXPECT_GT(computing.predicted_ttft_s - decision.predicted_ttft_s,
            p.prefill_token_s * 2048 - read_s - 1e-9);
  // A decode agent never lends to itself: alone, d0 computes nothing extra.
  DecisionInput alone = cluster(0, 1, 2048 + 64, 32);
  alone.decode[0].leading_blocks = 128;
  EXPECT_FALSE(chooser.choose(alone).pull_back);
}

TEST(KvPolicy, LocalPrefillOnlyWithinTheItlTarget) {
  PolicyOptions options = kvOptions();
  options.disagg_threshold_tokens = 256;
  Chooser chooser(options);
  DecisionInput input = cluster(1, 1, 1000, 32);
  input.decode[0].leading_blocks = 50;  // 800 held, 200 to compute
  EXPECT_EQ(chooser.choose(input).kind, Decision::Kind::kLocalPrefill);
  // A decode agent so loaded that a 200-token prefill in its step would
  // push its requests' ITL past 25 ms: disaggregate.
  input.decode[0].reserved_requests = 200;
  input.decode[0].reserved_kv_tokens = 200 * 1500;  // step 5 + 0.8 + 15 ms
  EXPECT_EQ(chooser.choose(input).kind, Decision::Kind::kDisaggregated);
  // A larger target allows it again.
  options.itl_target_s = 0.1;
  Chooser relaxed(options);
  EXPECT_EQ(relaxed.choose(input).kind, Decision::Kind::kLocalPrefill);
}

TEST(KvPolicy, TheLocalPrefillGateCountsTheStepAndThePrefillEachWithItsFixedCost) {
  // An idle decode agent's step is base 5 ms + 4 us + 1,032 context tokens
  // x 50 ns = 5.0556 ms; prefilling 200 tokens after 800 held is
  // 5 + 4 + 0.2 ms. The gate adds the two, each with its base: 14.2556 ms
  // (docs/router.md: counting the base once prefilled 20 times as many
  // prompts locally and lost goodput on the multi-turn workload).
  PolicyOptions options = kvOptions();
  DecisionInput input = cluster(1, 1, 1000, 32);
  input.decode[0].leading_blocks = 50;
  options.itl_target_s = 0.0143;
  EXPECT_EQ(Chooser(options).choose(input).kind, Decision::Kind::kLocalPrefill);
  options.itl_target_s = 0.0142;
  EXPECT_EQ(Chooser(options).choose(input).kind, Decision::Kind::kDisaggregated);
}

TEST(KvPolicy, DecodeSideWeighsContextNotJustRequests) {
  // Two decode agents with the same number of requests: the one whose
  // requests hold less KV has the shorter step.
  Chooser chooser(kvOptions());
  DecisionInput input = cluster(1, 2, 600, 32);
  input.decode[0].reserved_requests = 4;
  input.decode[0].reserved_kv_tokens = 4 * 8000;
  input.decode[1].reserved_requests = 4;
  input.decode[1].reserved_kv_tokens = 4 * 600;
  EXPECT_EQ(chooser.choose(input).decode, 1u);
  // External load (another router's, seen in polls) counts too.
  input.decode[1].running = 60;
  input.decode[1].external_requests = 56;
  EXPECT_EQ(chooser.choose(input).decode, 0u);
}

TEST(KvPolicy, ExplainListsEveryHealthyCandidate) {
  PolicyOptions options = kvOptions();
  options.explain = true;
  Chooser chooser(options);
  DecisionInput input = cluster(2, 3, 400, 16);
  input.decode[2].healthy = false;
  const Decision decision = chooser.choose(input);
  ASSERT_EQ(decision.candidates.size(), 4u);
  for (const CandidateCost& c : decision.candidates) {
    EXPECT_NE(c.agent, "d2");
    EXPECT_GT(c.cost, 0) << c.agent;
  }
}

TEST(KvPolicy, LearnsWhatTheModelMissesPerPathAndPerBlockRead) {
  // Truth: 10 ms more before every hand-off, and 2 ms + 0.5 ms per block
  // the decode agent reads after it; local prefills 4 ms more.
  PolicyOptions options = kvOptions();
  options.pull_back = false;
  Chooser chooser(options, 3);
  const LearnedCosts& learned = chooser.learned();
  // What a client sees: the model's prediction (without what was learned so
  // far) plus the truth above.
  auto seen = [&](const Decision& d) {
    const double before =
        d.predicted_prefill_s - learned.beforeHandoff(Path::kDisaggregated) + 0.010;
    const double after = d.predicted_ttft_s - d.predicted_prefill_s -
                         learned.afterHandoff(d.blocks_read) + 0.002 +
                         0.0005 * static_cast<double>(d.blocks_read);
    return std::pair{before, before + after};
  };
  for (int i = 0; i < 600; ++i) {
    DecisionInput input = cluster(1, 1, 2048, 32);
    input.decode[0].leading_blocks = i % 80;  // reads 49..128 blocks: too many to prefill locally
    const Decision d = chooser.choose(input);
    ASSERT_EQ(d.kind, Decision::Kind::kDisaggregated);
    EXPECT_EQ(d.blocks_read, 128 - i % 80);
    // Predicted with what was learned so far.
    EXPECT_NEAR(d.predicted_ttft_s - d.predicted_prefill_s,
                profile().base_s + profile().decode_sequence_s + 5e-8 * (2048 + 32) +
                    static_cast<double>(d.blocks_read) * 16 * 131072 / 4e10 +
                    learned.afterHandoff(d.blocks_read),
                1e-12);
    const auto [prefill, ttft] = seen(d);
    chooser.observe(d, prefill, ttft);
  }
  EXPECT_NEAR(learned.beforeHandoff(Path::kDisaggregated), 0.010, 1e-4);
  EXPECT_NEAR(learned.afterHandoff(0), 0.002, 1e-4);
  EXPECT_NEAR(learned.afterHandoff(100) - learned.afterHandoff(0), 0.050, 1e-3);
  EXPECT_EQ(learned.beforeHandoff(Path::kLocalPrefill), 0);
  EXPECT_EQ(learned.beforeHandoff(Path::kPullBack), 0);

  // A local prefill: the whole residual, the first observation in full.
  DecisionInput local = cluster(1, 1, 1000, 32);
  local.decode[0].leading_blocks = 50;
  const Decision d = chooser.choose(local);
  ASSERT_EQ(d.kind, Decision::Kind::kLocalPrefill);
  chooser.observe(d, -1, d.predicted_ttft_s + 0.004);
  EXPECT_NEAR(learned.beforeHandoff(Path::kLocalPrefill), 0.004, 1e-12);
  // Faster than predicted lowers a term, never below zero.
  for (int i = 0; i < 100; ++i) chooser.observe(chooser.choose(local), -1, 0.0);
  EXPECT_EQ(learned.beforeHandoff(Path::kLocalPrefill), 0);

  // Other policies learn nothing.
  PolicyOptions dynamo = kvOptions();
  dynamo.policy = Policy::kDynamo;
  Chooser other(dynamo);
  Decision guess = d;
  other.observe(guess, -1, 1.0);
  EXPECT_EQ(other.learned().beforeHandoff(Path::kLocalPrefill), 0);
}

AgentPtr agentState(const std::string& name) {
  auto state = std::make_shared<AgentState>();
  state->endpoint.name = name;
  return state;
}

TEST(LoadLedger, EveryReservationIsReleasedExactlyOnce) {
  LoadLedger ledger;
  AgentPtr a = agentState("d0");
  {
    LoadLedger::Reservation r = ledger.reserve(a, {1, 300, 1332});
    EXPECT_EQ(ledger.counts(*a), (LedgerCounts{1, 300, 1332}));
    r.prefillDone();  // first token
    EXPECT_EQ(ledger.counts(*a), (LedgerCounts{1, 0, 1332}));
    r.prefillDone();
    EXPECT_EQ(ledger.counts(*a), (LedgerCounts{1, 0, 1332}));
    r.release();  // finished
    r.release();
    EXPECT_FALSE(r.active());
  }  // destroyed after release: nothing more
  EXPECT_EQ(ledger.counts(*a), LedgerCounts{});

  // Destroyed without release (client abort, error): released.
  { LoadLedger::Reservation r = ledger.reserve(a, {1, 10, 20}); }
  EXPECT_EQ(ledger.counts(*a), LedgerCounts{});

  // Moved (into a prefill call), then the target replaced (retry on another
  // agent): each agent's counts go back to zero.
  AgentPtr b = agentState("d1");
  LoadLedger::Reservation first = ledger.reserve(a, {1, 5, 7});
  LoadLedger::Reservation moved = std::move(first);
  EXPECT_FALSE(first.active());
  EXPECT_EQ(ledger.counts(*a), (LedgerCounts{1, 5, 7}));
  moved = ledger.reserve(b, {1, 9, 11});
  EXPECT_EQ(ledger.counts(*a), LedgerCounts{});
  EXPECT_EQ(ledger.counts(*b), (LedgerCounts{1, 9, 11}));

  // The agent unlisted meanwhile: the reservation keeps its state alive
  // and releases into it.
  std::weak_ptr<AgentState> gone = b;
  b.reset();
  EXPECT_FALSE(gone.expired());
  moved.release();
  EXPECT_TRUE(gone.expired());
}

TEST(LoadLedger, ViewsCarryTheCountsUnderTheLock) {
  LoadLedger ledger;
  AgentPtr a = agentState("p0");
  LoadLedger::Reservation r1 = ledger.reserve(a, {1, 100, 0});
  LoadLedger::Reservation r2 = ledger.reserve(a, {1, 50, 0});
  AgentView view;
  {
    auto lock = ledger.lock();
    LoadLedger::fillView(*a, view);
  }
  EXPECT_EQ(view.reserved_requests, 2);
  EXPECT_EQ(view.reserved_prefill_tokens, 150);
  r1.release();
  {
    auto lock = ledger.lock();
    LoadLedger::fillView(*a, view);
  }
  EXPECT_EQ(view.reserved_requests, 1);
  EXPECT_EQ(view.reserved_prefill_tokens, 50);
}

}  // namespace
}  // namespace tandem::router
