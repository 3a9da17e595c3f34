#include "agent/engine/speculative.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem::engine {
namespace {

SpeculativeConfig lookup(int32_t min, int32_t max) {
  SpeculativeConfig config;
  config.num_speculative_tokens = 8;
  config.prompt_lookup_min = min;
  config.prompt_lookup_max = max;
  return config;
}

std::vector<TokenId> draftOf(const std::vector<TokenId>& tokens, const SpeculativeConfig& config,
                             int64_t max_tokens) {
  std::vector<TokenId> draft = {99};  // cleared by every call
  proposeNgramDraft(tokens, config, max_tokens, draft);
  return draft;
}

TEST(NgramDraft, ProposesWhatFollowedTheLatestOfTheLongestMatches) {
  // The suffix [1, 2, 3] occurred at 0 (followed by 7 8) and at 5 (followed
  // by 4 5); [2, 3] alone also at 10 (followed by 6).
  const std::vector<TokenId> tokens = {1, 2, 3, 7, 8, 1, 2, 3, 4, 5, 2, 3, 6, 0, 1, 2, 3};
  EXPECT_EQ(draftOf(tokens, lookup(2, 3), 2), (std::vector<TokenId>{4, 5}));
  // Only 2-grams: the latest occurrence of [2, 3] wins.
  EXPECT_EQ(draftOf(tokens, lookup(2, 2), 3), (std::vector<TokenId>{6, 0, 1}));
  // Longer than anything that matches: nothing.
  EXPECT_TRUE(draftOf(tokens, lookup(4, 5), 3).empty());
  EXPECT_TRUE(draftOf(tokens, lookup(2, 3), 0).empty());
}

TEST(NgramDraft, ACycleIsContinuedPastTheEndOfTheTokens) {
  // A run of one token: the latest match is one token back, and the copy
  // of what followed it goes on copying itself.
  const std::vector<TokenId> run = {5, 5, 5, 5};
  EXPECT_EQ(draftOf(run, lookup(1, 2), 6), (std::vector<TokenId>{5, 5, 5, 5, 5, 5}));
  // A cycle of three: continued for as many drafts as asked.
  const std::vector<TokenId> cycle = {1, 2, 3, 1, 2, 3, 1, 2};
  EXPECT_EQ(draftOf(cycle, lookup(2, 2), 8), (std::vector<TokenId>{3, 1, 2, 3, 1, 2, 3, 1}));
  EXPECT_EQ(draftOf(cycle, lookup(1, 5), 4), (std::vector<TokenId>{3, 1, 2, 3}));
  // Far enough back, the tokens that followed are copied as they are.
  const std::vector<TokenId> far = {4, 8, 9, 6, 7, 0, 4};
  EXPECT_EQ(draftOf(far, lookup(1, 3), 4), (std::vector<TokenId>{8, 9, 6, 7}));
  EXPECT_TRUE(draftOf({7}, lookup(1, 1), 4).empty());
  EXPECT_TRUE(draftOf({}, lookup(1, 1), 4).empty());
  EXPECT_TRUE(draftOf({1, 2, 3, 4}, lookup(1, 3), 4).empty());
}

TEST(SpeculativeConfig, ReadsVllmsNgramConfig) {
  auto config = SpeculativeConfig::parse(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 6,
          "prompt_lookup_min": 2, "disable_by_batch_size": 16})");
  ASSERT_TRUE(config.isOk()) << config.status().message();
  EXPECT_EQ(config->num_speculative_tokens, 4);
  EXPECT_EQ(config->prompt_lookup_min, 2);
  EXPECT_EQ(config->prompt_lookup_max, 6);
  EXPECT_EQ(config->disable_by_batch_size, 16);
  EXPECT_TRUE(config->enabled());

  // vLLM's defaults: neither bound, both 5; one, the other equals it.
  config = SpeculativeConfig::parse(R"({"model": "[ngram]", "num_speculative_tokens": 3})");
  ASSERT_TRUE(config.isOk()) << config.status().message();
  EXPECT_EQ(config->prompt_lookup_min, 5);
  EXPECT_EQ(config->prompt_lookup_max, 5);
  EXPECT_EQ(config->disable_by_batch_size, 0);
  config = SpeculativeConfig::parse(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})");
  ASSERT_TRUE(config.isOk());
  EXPECT_EQ(config->prompt_lookup_min, 3);
  config = SpeculativeConfig::parse(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 7})");
  ASSERT_TRUE(config.isOk());
  EXPECT_EQ(config->prompt_lookup_max, 7);
  EXPECT_FALSE(SpeculativeConfig{}.enabled());
}

TEST(SpeculativeConfig, RefusesWhatItCannotRunNamingTheField) {
  auto refused = [](const std::string& text) {
    auto config = SpeculativeConfig::parse(text);
    EXPECT_FALSE(config.isOk()) << text;
    return config.isOk() ? std::string() : config.status().message();
  };
  EXPECT_EQ(refused(R"({"method": "eagle", "model": "x", "num_speculative_tokens": 3})"),
            "speculative-config: method \"eagle\" is not supported; accepted: ngram (prompt "
            "lookup, no draft model)");
  EXPECT_EQ(refused(R"({"model": "org/draft-1b", "num_speculative_tokens": 3})"),
            "speculative-config: model \"org/draft-1b\": draft models are not supported; "
            "accepted: method ngram (prompt lookup)");
  EXPECT_EQ(refused(R"({"num_speculative_tokens": 3})"),
            "speculative-config needs method; accepted: ngram (prompt lookup)");
  EXPECT_EQ(refused(R"({"method": "ngram"})"),
            "speculative-config needs num_speculative_tokens, the drafts per step (1 to 64)");
  EXPECT_EQ(refused(R"({"method": "ngram", "num_speculative_tokens": 0})"),
            "speculative-config: num_speculative_tokens must be an integer from 1 to 64, got 0");
  EXPECT_EQ(refused(R"({"method": "ngram", "num_speculative_tokens": "4"})"),
            "speculative-config: num_speculative_tokens must be an integer from 1 to 64, got "
            "\"4\"");
  EXPECT_EQ(refused(R"({"method": "ngram", "num_speculative_tokens": 2,
                        "prompt_lookup_min": 4, "prompt_lookup_max": 3})"),
            "speculative-config: prompt_lookup_min 4 must not exceed prompt_lookup_max 3");
  EXPECT_EQ(refused(R"({"method": "ngram", "num_speculative_tokens": 2,
                        "prompt_lookup_max": 65})"),
            "speculative-config: prompt_lookup_max must be an integer from 1 to 64, got 65");
  EXPECT_EQ(refused(R"({"method": "ngram", "num_speculative_tokens": 2,
                        "disable_by_batch_size": 1})"),
            "speculative-config: disable_by_batch_size must be an integer from 2 to 1073741824, "
            "got 1");
  EXPECT_EQ(
      refused(
          R"({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1})"),
      "speculative-config: unknown field \"draft_tensor_parallel_size\"; accepted: method, "
      "model, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, "
      "disable_by_batch_size");
  EXPECT_EQ(refused("[1]"), "speculative-config must be a JSON object, got array");
  EXPECT_TRUE(refused("{\"method\": ").starts_with("speculative-config is not valid JSON"));
}

}  // namespace
}  // namespace tandem::engine
