// The router's pure parts: the ownership index applies KV event streams
// (gaps untrust an agent, snapshots rebuild it) and the policy picks agents
// by cached prefix and load, prefills locally when the uncached part is
// short, asks for pull-back when the decode agent holds more, and ignores
// the KV under round-robin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <random>
#include <set>

#include "common/block_hash.h"
#include "operator/router/ownership_index.h"
#include "operator/router/policy.h"

namespace tandem::router {
namespace {

using nlohmann::json;

std::vector<BlockHash> hashesOf(int n, uint32_t seed) {
  BlockHasher hasher(HashAlgorithm::kXxh3_128, "model", 4);
  std::vector<TokenId> tokens;
  for (int i = 0; i < n * 4; ++i) tokens.push_back(static_cast<TokenId>(seed * 1000 + i));
  return hasher.hashFullBlocks(tokens, "");
}

json stored(uint64_t sequence, const std::vector<BlockHash>& hashes) {
  json list = json::array();
  for (const auto& h : hashes) list.push_back(h.toHex());
  return {{"sequence", sequence}, {"type", "BlockStored"}, {"block_hashes", list}};
}

TEST(OwnershipIndex, AppliesStoredRemovedAndClearedInOrder) {
  OwnershipIndex index;
  const auto hashes = hashesOf(5, 1);
  EXPECT_TRUE(index.apply("a", stored(1, {hashes.begin(), hashes.begin() + 3})));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 3);
  EXPECT_EQ(index.leadingBlocks("b", hashes), 0);
  EXPECT_TRUE(index.apply(
      "a", {{"sequence", 2}, {"type", "BlockRemoved"}, {"block_hashes", {hashes[1].toHex()}}}));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 1) << "a leading run stops at the first gap";
  EXPECT_EQ(index.holders(hashes[2]), std::vector<std::string>{"a"});
  EXPECT_TRUE(index.apply("a", {{"sequence", 3}, {"type", "AllCleared"}}));
  EXPECT_EQ(index.numBlocks("a"), 0);
  EXPECT_EQ(index.lastSequence("a"), 3u);
}

TEST(OwnershipIndex, ExpectedBlocksCountUntilStoredOrLapsed) {
  using std::chrono::hours;
  OwnershipIndex index;
  const auto hashes = hashesOf(6, 7);
  ASSERT_TRUE(index.apply("a", stored(1, {hashes.begin(), hashes.begin() + 2})));
  ASSERT_TRUE(index.apply("b", stored(1, {hashes.begin(), hashes.begin() + 1})));
  // A decision sends the whole prompt to a: it counts as held at once.
  index.expect("a", std::span(hashes).subspan(2), hours(1));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("a"), 6);
  EXPECT_EQ(index.leadingBlocks("a", hashes), 6);
  EXPECT_EQ(index.numBlocks("a"), 2) << "expected blocks are not stored ones";
  EXPECT_EQ(index.holders(hashes[4]), std::vector<std::string>{"a"});
  // The agent stores some and evicts one of those it was expected to store.
  ASSERT_TRUE(index.apply("a", stored(2, {hashes.begin() + 2, hashes.begin() + 4})));
  ASSERT_TRUE(index.apply(
      "a", {{"sequence", 3}, {"type", "BlockRemoved"}, {"block_hashes", {hashes[4].toHex()}}}));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("a"), 4);
  EXPECT_TRUE(index.holders(hashes[4]).empty());
  // An expectation that lapses unconfirmed is dropped: the lookups that
  // route requests never count it, even with nothing else changing the
  // index in between; what was stored stays.
  index.expect("b", std::span(hashes).subspan(1), std::chrono::seconds(0));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("b"), 1);
  index.expect("b", std::span(hashes).subspan(1), std::chrono::seconds(0));
  EXPECT_EQ(index.leadingBlocks("b", hashes), 1);
  EXPECT_EQ(index.holders(hashes[5]), std::vector<std::string>{"a"})
      << "a's expectation of hash 5 has an hour to go";
  // A request that failed on its agent takes back what it expected there,
  // never what the agent stored.
  index.expect("b", std::span(hashes).subspan(1), hours(1));
  EXPECT_EQ(index.leadingBlocks("b", hashes), 6);
  index.unexpect("b", hashes);
  EXPECT_EQ(index.leadingBlocks("b", hashes), 1);
  EXPECT_EQ(index.holders(hashes[5]), std::vector<std::string>{"a"});
  // An untrusted agent expects nothing; a snapshot clears expectations.
  index.untrust("b");
  index.expect("b", hashes, hours(1));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("b"), 0);
  json snapshot = {{"sequence", 9}, {"type", "Snapshot"}, {"block_hashes", json::array()}};
  ASSERT_TRUE(index.apply("a", snapshot));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("a"), 0);
  EXPECT_TRUE(index.holders(hashes[3]).empty());
}

TEST(OwnershipIndex, AConnectedStreamTrustsTheAgentBeforeItsFirstEvent) {
  using std::chrono::hours;
  OwnershipIndex index;
  const auto hashes = hashesOf(4, 3);
  // A fresh agent: its stream is open, no event has come.
  index.expect("a", hashes, hours(1));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 0) << "not connected: untrusted";
  index.connected("a");
  EXPECT_TRUE(index.trusted("a"));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 0);
  index.expect("a", hashes, hours(1));
  EXPECT_EQ(index.leadingBlocksForAll(hashes).at("a"), 4) << "a burst sees where it is computed";
  // The replay that follows starts at sequence 1 (or is a Snapshot).
  EXPECT_TRUE(index.apply("a", stored(1, {hashes.begin(), hashes.begin() + 2})));
  EXPECT_EQ(index.numBlocks("a"), 2);
  // Reconnecting starts over: what was known is cleared until the replay.
  index.connected("a");
  EXPECT_EQ(index.numBlocks("a"), 0);
  EXPECT_EQ(index.leadingBlocks("a", hashes), 0);
  EXPECT_TRUE(index.apply("a", stored(1, hashes)));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 4);
}

TEST(OwnershipIndex, AGapUntrustsTheAgentUntilASnapshot) {
  OwnershipIndex index;
  const auto hashes = hashesOf(4, 2);
  ASSERT_TRUE(index.apply("a", stored(1, hashes)));
  EXPECT_FALSE(index.apply("a", stored(3, hashes))) << "sequence 2 was skipped";
  EXPECT_FALSE(index.trusted("a"));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 0);
  json snapshot = {{"sequence", 9}, {"type", "Snapshot"}, {"block_hashes", json::array()}};
  for (const auto& h : hashes) snapshot["block_hashes"].push_back(h.toHex());
  EXPECT_TRUE(index.apply("a", snapshot));
  EXPECT_TRUE(index.trusted("a"));
  EXPECT_EQ(index.leadingBlocks("a", hashes), 4);
  EXPECT_TRUE(index.apply("a", {{"sequence", 10}, {"type", "AllCleared"}}));
  index.untrust("a");
  EXPECT_EQ(index.lastSequence("a"), 0u) << "a dropped stream starts over from the beginning";
}

TEST(OwnershipIndex, IgnoresHashesThatAreNotHexAndAcceptsEitherCase) {
  OwnershipIndex index;
  const auto hashes = hashesOf(3, 3);
  std::string upper = hashes[1].toHex();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ASSERT_TRUE(index.apply("a", {{"sequence", 1},
                                {"type", "BlockStored"},
                                {"block_hashes", {hashes[0].toHex(), upper, "not-a-hash", 7}}}));
  EXPECT_EQ(index.numBlocks("a"), 2);
  EXPECT_EQ(index.leadingBlocks("a", hashes), 2);
}

// Every agent's answer from the one walk equals its own leadingBlocks, and
// both equal a plain reference (hex strings per agent), over random streams
// of stores, removals, clears, snapshots, gaps, untrusts and removals of
// agents, with more agents than one 64-bit word of slots.
TEST(OwnershipIndex, LeadingBlocksForAllEqualsEachAgentsLeadingBlocks) {
  std::mt19937 random(7);
  constexpr int kPrompts = 12;
  constexpr int kBlocksPerPrompt = 40;
  std::vector<std::vector<BlockHash>> prompts;
  for (int p = 0; p < kPrompts; ++p) {
    // Prompts share a leading part of varying length with prompt 0.
    std::vector<BlockHash> hashes = hashesOf(kBlocksPerPrompt, 100 + p);
    const auto base = hashesOf(kBlocksPerPrompt, 100);
    const int shared = p == 0 ? 0 : static_cast<int>(random() % kBlocksPerPrompt);
    std::copy(base.begin(), base.begin() + shared, hashes.begin());
    prompts.push_back(hashes);
  }
  OwnershipIndex index;
  std::map<std::string, std::set<std::string>> reference;  // trusted agents only
  std::map<std::string, uint64_t> sequence;
  auto hexOf = [](const std::vector<BlockHash>& hashes) {
    json list = json::array();
    for (const auto& h : hashes) list.push_back(h.toHex());
    return list;
  };
  for (int step = 0; step < 3000; ++step) {
    const std::string agent = "agent-" + std::to_string(random() % 70);
    const auto& prompt = prompts[random() % kPrompts];
    const size_t from = random() % prompt.size();
    const size_t to = from + random() % (prompt.size() - from) + 1;
    const std::vector<BlockHash> some(prompt.begin() + from, prompt.begin() + to);
    const int what = static_cast<int>(random() % 100);
    if (what < 55) {
      // Mostly leading runs, as an agent stores a prompt's blocks.
      const std::vector<BlockHash> leading(prompt.begin(), prompt.begin() + to);
      ASSERT_TRUE(index.apply(agent, stored(++sequence[agent], leading)));
      for (const auto& h : leading) reference[agent].insert(h.toHex());
    } else if (what < 80) {
      ASSERT_TRUE(index.apply(agent, {{"sequence", ++sequence[agent]},
                                      {"type", "BlockRemoved"},
                                      {"block_hashes", hexOf(some)}}));
      for (const auto& h : some) reference[agent].erase(h.toHex());
    } else if (what < 84) {
      ASSERT_TRUE(index.apply(agent, {{"sequence", ++sequence[agent]}, {"type", "AllCleared"}}));
      reference[agent].clear();
    } else if (what < 88) {
      sequence[agent] = 50 + random() % 10;
      ASSERT_TRUE(index.apply(
          agent,
          {{"sequence", sequence[agent]}, {"type", "Snapshot"}, {"block_hashes", hexOf(some)}}));
      reference[agent].clear();
      for (const auto& h : some) reference[agent].insert(h.toHex());
    } else if (what < 92) {
      if (sequence[agent] == 0) continue;
      EXPECT_FALSE(index.apply(agent, stored(sequence[agent] + 2, some)));
      sequence[agent] = 0;
      reference.erase(agent);
    } else if (what < 96) {
      index.untrust(agent);
      sequence[agent] = 0;
      reference.erase(agent);
    } else {
      index.remove(agent);
      sequence[agent] = 0;
      reference.erase(agent);
    }
    if (step % 50 != 0) continue;
    for (const auto& query : prompts) {
      const auto all = index.leadingBlocksForAll(query);
      for (int a = 0; a < 70; ++a) {
        const std::string name = "agent-" + std::to_string(a);
        int64_t expected = 0;
        auto held = reference.find(name);
        while (held != reference.end() && expected < static_cast<int64_t>(query.size()) &&
               held->second.count(query[expected].toHex()) != 0) {
          ++expected;
        }
        ASSERT_EQ(index.leadingBlocks(name, query), expected) << name << " at step " << step;
        auto it = all.find(name);
        ASSERT_EQ(it == all.end() ? 0 : it->second, expected) << name << " at step " << step;
      }
    }
  }
}

PolicyOptions options(Policy policy, int64_t disagg_threshold_tokens, bool pull_back,
                      int64_t pull_back_min_blocks) {
  PolicyOptions options;
  options.policy = policy;
  options.disagg_threshold_tokens = disagg_threshold_tokens;
  options.pull_back = pull_back;
  options.pull_back_min_blocks = pull_back_min_blocks;
  return options;
}

AgentView agent(const std::string& name, int64_t leading_blocks, int64_t running = 0) {
  AgentView view;
  view.name = name;
  view.leading_blocks = leading_blocks;
  view.running = running;
  view.external_requests = running;  // none of them this router's
  return view;
}

TEST(Policy, PrefillGoesWhereThePrefixIsAndDecodeWhereLoadIsLow) {
  Chooser chooser(options(Policy::kKv, 64, true, 4));
  DecisionInput input;
  input.num_prompt_tokens = 320;  // 20 blocks
  input.prefill = {agent("p0", 0), agent("p1", 10)};
  input.decode = {agent("d0", 0, 3), agent("d1", 0, 0)};
  Decision decision = chooser.choose(input);
  EXPECT_EQ(decision.kind, Decision::Kind::kDisaggregated);
  EXPECT_EQ(decision.prefill, 1u);
  EXPECT_EQ(decision.decode, 1u);
  EXPECT_FALSE(decision.pull_back);
  EXPECT_DOUBLE_EQ(decision.overlap_ratio, 0.5);
}

TEST(Policy, ShortUncachedPartIsPrefilledOnTheDecodeAgent) {
  Chooser chooser(options(Policy::kKv, 64, true, 4));
  DecisionInput input;
  input.num_prompt_tokens = 320;
  input.prefill = {agent("p0", 0)};
  input.decode = {agent("d0", 17)};  // 320 - 272 = 48 tokens left
  Decision decision = chooser.choose(input);
  EXPECT_EQ(decision.kind, Decision::Kind::kLocalPrefill);
  EXPECT_FALSE(decision.prefill.has_value());
  input.prefill[0].healthy = false;
  input.decode[0].leading_blocks = 0;
  EXPECT_EQ(chooser.choose(input).kind, Decision::Kind::kLocalPrefill)
      << "no healthy prefill agent";
}

TEST(Policy, PullBackWhenTheDecodeAgentHoldsEnoughMore) {
  Chooser chooser(options(Policy::kKv, 16, true, 4));
  DecisionInput input;
  input.num_prompt_tokens = 320;
  input.prefill = {agent("p0", 2)};
  input.decode = {agent("d0", 6)};
  EXPECT_TRUE(chooser.choose(input).pull_back);
  input.decode[0].leading_blocks = 5;  // only 3 more
  EXPECT_FALSE(chooser.choose(input).pull_back);
  Chooser off(options(Policy::kKv, 16, false, 4));
  input.decode[0].leading_blocks = 10;
  EXPECT_FALSE(off.choose(input).pull_back);
}

TEST(Policy, RoundRobinAlternatesWhateverTheKv) {
  Chooser chooser(options(Policy::kRoundRobin, 64, true, 4));
  DecisionInput input;
  input.num_prompt_tokens = 320;
  input.prefill = {agent("p0", 20)};
  input.decode = {agent("d0", 19), agent("d1", 0)};
  std::vector<size_t> picks;
  for (int i = 0; i < 4; ++i) {
    Decision decision = chooser.choose(input);
    EXPECT_EQ(decision.kind, Decision::Kind::kDisaggregated);
    EXPECT_FALSE(decision.pull_back);
    picks.push_back(*decision.decode);
  }
  EXPECT_EQ(picks, (std::vector<size_t>{0, 1, 0, 1}));
}

TEST(Policy, NoHealthyDecodeAgentMeansNoDecision) {
  Chooser chooser(options(Policy::kKv, 64, true, 4));
  DecisionInput input;
  input.num_prompt_tokens = 100;
  input.prefill = {agent("p0", 0)};
  input.decode = {agent("d0", 0)};
  input.decode[0].healthy = false;
  EXPECT_EQ(chooser.choose(input).kind, Decision::Kind::kNone);
}

TEST(Policy, ParsesPolicyNames) {
  EXPECT_EQ(*parsePolicy("round_robin"), Policy::kRoundRobin);
  auto bad = parsePolicy("fastest");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("kv, round_robin, random, dynamo, llm_d or sglang"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::router
