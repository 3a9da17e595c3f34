// The simulated agent's token function: a pure function of the tokens so far
// and the seed (incremental or from scratch alike), never a special or EOS
// token, stepping over forbidden ids; and a simulated Engine emits exactly
// those tokens, alone or batched with other requests.
#include "agent/engine/simulation/simulated_tokens.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "agent/engine/engine.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

const std::filesystem::path& modelDir() {
  static ::tandem::testing::TempDir dir("tandem-simulated-tokens-test");
  static bool written = [] {
    tools::TestModelOptions options;
    options.seed = 9;
    tools::writeTestModel(options, dir.path());
    return true;
  }();
  (void)written;
  return dir.path();
}

std::vector<TokenId> randomTokens(size_t n, uint32_t seed) {
  return ::tandem::testing::randomTokenIds(n, seed, 3, 480);
}

// Generates `count` tokens after `prompt` with a fresh state per token.
std::vector<TokenId> fromScratch(const TokenChooser& chooser, std::vector<TokenId> tokens,
                                 size_t count, std::optional<uint64_t> seed) {
  std::vector<TokenId> out;
  for (size_t i = 0; i < count; ++i) {
    SimulatedTokenState fresh;
    out.push_back(chooser.next(fresh, tokens, seed, {}));
    tokens.push_back(out.back());
  }
  return out;
}

TEST(TokenChooser, IsAFunctionOfTheTokensAndTheSeed) {
  TokenChooser chooser({5, 9, 11, 12, 40, 41, 42, 100});
  const std::vector<TokenId> prompt = randomTokens(30, 1);
  std::vector<TokenId> tokens = prompt;
  SimulatedTokenState state;
  std::vector<TokenId> incremental;
  for (int i = 0; i < 20; ++i) {
    incremental.push_back(chooser.next(state, tokens, std::nullopt, {}));
    tokens.push_back(incremental.back());
  }
  EXPECT_EQ(incremental, fromScratch(chooser, prompt, 20, std::nullopt));
  EXPECT_EQ(fromScratch(chooser, prompt, 20, 7), fromScratch(chooser, prompt, 20, 7));
  EXPECT_NE(fromScratch(chooser, prompt, 20, 7), fromScratch(chooser, prompt, 20, 8));
  EXPECT_NE(fromScratch(chooser, prompt, 20, 7), incremental);
  std::vector<TokenId> other = prompt;
  other[3] += 1;
  EXPECT_NE(fromScratch(chooser, other, 20, std::nullopt), incremental);
  // A state that absorbed a longer, different sequence starts over.
  SimulatedTokenState stale;
  chooser.next(stale, other, std::nullopt, {});
  EXPECT_EQ(chooser.next(stale, std::span<const TokenId>(prompt).first(10), std::nullopt, {}),
            fromScratch(chooser, std::vector<TokenId>(prompt.begin(), prompt.begin() + 10), 1,
                        std::nullopt)[0]);
}

TEST(TokenChooser, StepsOverForbiddenTokensToTheNextCandidate) {
  TokenChooser chooser({5, 9, 11});
  const std::vector<TokenId> prompt = randomTokens(8, 2);
  SimulatedTokenState state;
  const TokenId free_pick = chooser.next(state, prompt, std::nullopt, {});
  const std::vector<TokenId> forbidden = {free_pick};
  const TokenId masked = chooser.next(state, prompt, std::nullopt, forbidden);
  EXPECT_NE(masked, free_pick);
  const auto& c = chooser.candidates();
  const size_t at = static_cast<size_t>(std::find(c.begin(), c.end(), free_pick) - c.begin());
  EXPECT_EQ(masked, c[(at + 1) % c.size()]);
}

TEST(TokenChooser, CandidatesArePlainTextAndNeverSpecialOrEos) {
  auto tokenizer = Tokenizer::fromDirectory(modelDir());
  const TokenId eos = *tokenizer->eosTokenId();
  TokenChooser chooser(*tokenizer, tokenizer->vocabSize(), {eos});
  ASSERT_GT(chooser.candidates().size(), 100u);
  for (TokenId id : chooser.candidates()) {
    EXPECT_NE(id, eos);
    EXPECT_FALSE(tokenizer->isSpecial(id)) << id;
    for (char c : tokenizer->tokenBytes(id)) EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << id;
  }
  const TokenId first = chooser.candidates()[0];
  EXPECT_EQ(chooser.alternative(first, 1), chooser.candidates()[1]);
}

struct Collector {
  std::mutex mutex;
  std::condition_variable done;
  std::vector<TokenId> tokens;
  bool finished = false;
  Engine::OutputCallback callback() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& token : out.tokens) tokens.push_back(token.token);
      if (out.finished()) {
        finished = true;
        done.notify_all();
      }
    };
  }
  std::vector<TokenId> wait() {
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(30), [&] { return finished; }));
    return tokens;
  }
};

Request request(const std::string& id, std::vector<TokenId> prompt, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(SimulatedEngine, EmitsTheTokenFunctionsTokensAloneAndBatched) {
  EngineConfig config;
  config.model_dir = modelDir();
  config.num_blocks = 64;
  config.scheduler.max_num_batched_tokens = 24;  // the long prompt is chunked
  StepProfile profile;
  profile.name = "unit";
  profile.model.max_position_embeddings = 4096;
  config.simulate = profile;
  Engine engine(config);
  EXPECT_EQ(engine.maxModelLen(), 4096);
  EXPECT_EQ(engine.backend().description(), "simulated (profile unit; KV blocks in cpu memory)");
  EXPECT_NE(engine.modelIdentity().find("/simulated:unit"), std::string::npos);

  auto tokenizer = Tokenizer::fromDirectory(modelDir());
  TokenChooser reference(*tokenizer, engine.model().config().vocab_size, engine.eosTokenIds());
  const std::vector<TokenId> prompt = randomTokens(60, 3);
  const std::vector<TokenId> expected = fromScratch(reference, prompt, 10, std::nullopt);

  Collector alone;
  ASSERT_TRUE(engine.addRequest(request("alone", prompt, 10), alone.callback()).isOk());
  EXPECT_EQ(alone.wait(), expected);

  std::vector<std::unique_ptr<Collector>> others;
  Collector batched;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(
        engine
            .addRequest(request("other" + std::to_string(i), randomTokens(9 + i, 10 + i), 12),
                        others.back()->callback())
            .isOk());
  }
  Request salted = request("batched", prompt, 10);
  salted.cache_salt = "no-prefix-reuse";
  ASSERT_TRUE(engine.addRequest(std::move(salted), batched.callback()).isOk());
  EXPECT_EQ(batched.wait(), expected);
  for (auto& other : others) EXPECT_EQ(other->wait().size(), 12u);
}

}  // namespace
}  // namespace tandem::engine
