// The router's pure parts: the ownership index applies KV event streams
// (gaps untrust an agent, snapshots rebuild it) and the policy picks agents
// by cached prefix and load, prefills locally when the uncached part is
// short, asks for pull-back when the decode agent holds more, and ignores
// the KV under round-robin.
#include <gtest/gtest.h>

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

AgentView agent(const std::string& name, int64_t leading_blocks, int64_t running = 0) {
  AgentView view;
  view.name = name;
  view.leading_blocks = leading_blocks;
  view.running = running;
  return view;
}

TEST(Policy, PrefillGoesWhereThePrefixIsAndDecodeWhereLoadIsLow) {
  Chooser chooser({Policy::kKv, 64, true, 4});
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
  Chooser chooser({Policy::kKv, 64, true, 4});
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
  Chooser chooser({Policy::kKv, 16, true, 4});
  DecisionInput input;
  input.num_prompt_tokens = 320;
  input.prefill = {agent("p0", 2)};
  input.decode = {agent("d0", 6)};
  EXPECT_TRUE(chooser.choose(input).pull_back);
  input.decode[0].leading_blocks = 5;  // only 3 more
  EXPECT_FALSE(chooser.choose(input).pull_back);
  Chooser off({Policy::kKv, 16, false, 4});
  input.decode[0].leading_blocks = 10;
  EXPECT_FALSE(off.choose(input).pull_back);
}

TEST(Policy, RoundRobinAlternatesWhateverTheKv) {
  Chooser chooser({Policy::kRoundRobin, 64, true, 4});
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
  Chooser chooser({Policy::kKv, 64, true, 4});
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
  EXPECT_NE(bad.status().message().find("kv, round_robin or random"), std::string::npos);
}

}  // namespace
}  // namespace tandem::router
