#include "agent/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplerInput makeInput(const std::vector<float>& logits, const SamplingParams& params,
                       uint64_t seed = 0) {
  SamplerInput input;
  input.logits = logits;
  input.params = &params;
  input.rng = SamplerRng{seed};
  return input;
}

std::vector<float> randomLogits(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(n);
  for (float& x : logits) x = dist(gen);
  return logits;
}

// Reference log-softmax in double, independent of the sampler's code.
std::vector<double> logSoftmax(const std::vector<float>& logits) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float x : logits) max_logit = std::max<double>(max_logit, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max_logit);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - max_logit - std::log(sum));
  return out;
}

int64_t referenceArgmax(const std::vector<float>& x) {
  int64_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = static_cast<int64_t>(i);
  }
  return best;
}

// Logits of the distribution .1 .2 .3 .4.
const std::vector<float> kFourWay = {std::log(0.1f), std::log(0.2f), std::log(0.3f),
                                     std::log(0.4f)};

// Draws `draws` tokens, one per step of one seeded request; returns counts.
std::vector<int64_t> drawCounts(const std::vector<float>& logits, const SamplingParams& params,
                                int64_t draws, uint64_t seed) {
  // Penalties are off, so the history's content is irrelevant; only its
  // length (the step) matters.
  const std::vector<TokenId> history(draws, 0);
  Sampler sampler;
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t step = 0; step < draws; ++step) {
    SamplerInput input = makeInput(logits, params, seed);
    input.output = std::span<const TokenId>(history).first(step);
    ++counts[sampler.sample(input).token];
  }
  return counts;
}

TEST(SamplerTest, GreedyPicksArgmaxWithTiesToSmallestId) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler;
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, -2.0f};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(sampler.sample(makeInput(logits, params, seed)).token, 1);
  }
  const std::vector<float> random = randomLogits(5000, 1);
  EXPECT_EQ(sampler.sample(makeInput(random, params)).token, referenceArgmax(random));
}

// logit_bias is added to the logits the choice is made from, after the
// penalties; logprobs still report the model's own distribution, and a
// biased row is never taken as the raw argmax.
TEST(SamplerTest, LogitBiasMovesTheChoiceNotTheLogprobs) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 0.5f};
  Sampler sampler;
  SamplingParams params;
  params.temperature = 0.0f;
  params.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(sampler.sample(makeInput(logits, params)).token, 3);
  params.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(sampler.sample(makeInput(logits, params)).token, 2);
  EXPECT_FALSE(samplesRawArgmax(params, false));
  params.logprobs = 0;
  const GeneratedToken chosen = sampler.sample(makeInput(logits, params));
  EXPECT_NEAR(chosen.logprob, logSoftmax(logits)[2], 1e-6);
  // Sampled: a banned token is never drawn.
  params = {};
  params.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(drawCounts(logits, params, 500, 9)[1], 0);
}

// allowed_token_ids: only those ids are chosen, greedy or sampled; the
// logprobs still report the model's distribution.
TEST(SamplerTest, AllowedTokenIdsAreTheOnlyChoices) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 0.5f, 4.0f};
  Sampler sampler;
  SamplingParams params;
  params.temperature = 0.0f;
  params.allowed_token_ids = {0, 2, 3};
  EXPECT_EQ(sampler.sample(makeInput(logits, params)).token, 2);
  EXPECT_FALSE(samplesRawArgmax(params, false));
  params.logprobs = 1;
  const GeneratedToken chosen = sampler.sample(makeInput(logits, params));
  EXPECT_NEAR(chosen.logprob, logSoftmax(logits)[2], 1e-6);
  ASSERT_EQ(chosen.top.size(), 1u);
  EXPECT_EQ(chosen.top[0].token, 1);
  // A mask that leaves nothing gives way, except allowed_token_ids.
  params = {};
  params.temperature = 0.0f;
  params.allowed_token_ids = {0, 3};
  params.bad_words_ids = {{0}, {3}};
  EXPECT_EQ(sampler.sample(makeInput(logits, params)).token, 0);
  params = {};
  params.allowed_token_ids = {3, 4};
  const std::vector<int64_t> counts = drawCounts(logits, params, 500, 11);
  EXPECT_EQ(counts[0] + counts[1] + counts[2], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_GT(counts[4], 0);
}

// bad_words: a word's last token is -inf right after the output ends with
// the rest of it (a one-token word always); the prompt does not count.
TEST(SamplerTest, BadWordsBanTheirLastTokenAfterTheRestOfTheWord) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 0.5f, 4.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.bad_words_ids = {{1}, {2, 3, 4}};
  EXPECT_FALSE(samplesRawArgmax(params, false));
  Sampler sampler;
  auto processed = [&](const std::vector<TokenId>& prompt, const std::vector<TokenId>& output) {
    SamplerInput input = makeInput(logits, params);
    input.prompt = prompt;
    input.output = output;
    return sampler.processedLogits(input);
  };
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(processed({}, {}), (std::vector<float>{1.0f, kOff, 3.0f, 0.5f, 4.0f}));
  // The prefix (2, 3) ends the output: 4 is banned; not when it ends the
  // prompt, nor when only part of it ends the output.
  EXPECT_EQ(processed({}, {0, 2, 3}), (std::vector<float>{1.0f, kOff, 3.0f, 0.5f, kOff}));
  EXPECT_EQ(processed({2, 3}, {}), (std::vector<float>{1.0f, kOff, 3.0f, 0.5f, 4.0f}));
  EXPECT_EQ(processed({2}, {3}), (std::vector<float>{1.0f, kOff, 3.0f, 0.5f, 4.0f}));
  EXPECT_EQ(processed({}, {2, 3, 0}), (std::vector<float>{1.0f, kOff, 3.0f, 0.5f, 4.0f}));
  SamplerInput input = makeInput(logits, params);
  const std::vector<TokenId> output = {2, 3};
  input.output = output;
  EXPECT_EQ(sampler.sample(input).token, 2);
}

TEST(SamplerTest, TinyTemperatureBehavesLikeGreedy) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 0.9f};
  Sampler sampler;
  SamplingParams params;
  params.temperature = 1e-7f;  // below kGreedyTemperature: greedy outright
  EXPECT_EQ(sampler.sample(makeInput(logits, params, 3)).token, 1);
  // 0.01 samples, but a 0.1 gap becomes a factor e^10 in probability.
  params.temperature = 0.01f;
  const std::vector<int64_t> counts = drawCounts(logits, params, 2000, 5);
  EXPECT_GE(counts[1], 1990);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  SamplingParams params;
  params.top_k = 1;
  Sampler sampler;
  for (uint32_t trial = 0; trial < 20; ++trial) {
    const std::vector<float> logits = randomLogits(1000, 100 + trial);
    EXPECT_EQ(sampler.sample(makeInput(logits, params, trial)).token, referenceArgmax(logits));
  }
  // Ties at the top: top_k = 1 keeps exactly the smallest id, as greedy does.
  const std::vector<float> tied = {0.0f, 2.0f, 2.0f, 2.0f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    EXPECT_EQ(sampler.sample(makeInput(tied, params, seed)).token, 1);
  }
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheMostLikelyToken) {
  SamplingParams params;
  params.top_p = 1e-6f;
  Sampler sampler;
  for (uint32_t trial = 0; trial < 20; ++trial) {
    const std::vector<float> logits = randomLogits(1000, 200 + trial);
    EXPECT_EQ(sampler.sample(makeInput(logits, params, trial)).token, referenceArgmax(logits));
  }
  // Flat distribution over many tokens: the nucleus needs most of the
  // vocabulary, exercising the growing sorted prefix.
  std::vector<float> flat(5000, 0.0f);
  params.top_p = 0.9f;
  std::vector<int64_t> counts = drawCounts(flat, params, 3000, 9);
  const int64_t kept = static_cast<int64_t>(0.9 * 5000);
  int64_t beyond = 0;
  for (size_t id = kept; id < flat.size(); ++id) beyond += counts[id];
  EXPECT_EQ(beyond, 0);  // ties sort by id, so the nucleus is the lowest ids
}

TEST(SamplerTest, SamplesMatchTheDistribution) {
  SamplingParams params;
  const int64_t draws = 20000;
  const std::vector<int64_t> counts = drawCounts(kFourWay, params, draws, 1234);
  const std::array<double, 4> probs = {0.1, 0.2, 0.3, 0.4};
  double chi_square = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = probs[i] * draws;
    chi_square += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  // 3 degrees of freedom: P(chi2 > 25) is about 1.6e-5.
  EXPECT_LT(chi_square, 25.0) << counts[0] << " " << counts[1] << " " << counts[2] << " "
                              << counts[3];
}

TEST(SamplerTest, TemperatureFlattensAndSharpens) {
  SamplingParams params;
  params.temperature = 2.0f;
  // p^(1/2) renormalized: sqrt(.1), sqrt(.2), ... over their sum.
  std::vector<int64_t> counts = drawCounts(kFourWay, params, 20000, 77);
  double norm = 0.0;
  for (double p : {0.1, 0.2, 0.3, 0.4}) norm += std::sqrt(p);
  EXPECT_NEAR(counts[0] / 20000.0, std::sqrt(0.1) / norm, 0.015);
  EXPECT_NEAR(counts[3] / 20000.0, std::sqrt(0.4) / norm, 0.015);
}

TEST(SamplerTest, TopKKeepsOnlyTheKBest) {
  SamplingParams params;
  params.top_k = 2;
  const std::vector<int64_t> counts = drawCounts(kFourWay, params, 20000, 42);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 0);
  EXPECT_NEAR(counts[3] / 20000.0, 0.4 / 0.7, 0.015);
}

TEST(SamplerTest, LargeTopKKeepsExactlyTheKBest) {
  const std::vector<float> logits = randomLogits(10000, 55);
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  SamplingParams params;
  params.temperature = 2.0f;
  params.top_k = 5000;  // past the heap-selection size
  const std::vector<int64_t> counts = drawCounts(logits, params, 3000, 56);
  int64_t outside = 0;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (logits[id] < sorted[4999]) outside += counts[id];
  }
  EXPECT_EQ(outside, 0);
}

TEST(SamplerTest, TopKOfTheWholeVocabularyChangesNothing) {
  const std::vector<float> logits = randomLogits(300, 57);
  SamplingParams disabled;
  SamplingParams whole;
  whole.top_k = 300;
  Sampler sampler;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    EXPECT_EQ(sampler.sample(makeInput(logits, disabled, seed)).token,
              sampler.sample(makeInput(logits, whole, seed)).token);
  }
}

TEST(SamplerTest, TopPKeepsTheNucleus) {
  SamplingParams params;
  params.top_p = 0.5f;  // .4 alone is short of .5, .4 + .3 reaches it
  std::vector<int64_t> counts = drawCounts(kFourWay, params, 20000, 43);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 0);
  EXPECT_NEAR(counts[3] / 20000.0, 0.4 / 0.7, 0.015);

  params.top_p = 0.75f;  // needs .4 + .3 + .2
  counts = drawCounts(kFourWay, params, 20000, 44);
  EXPECT_EQ(counts[0], 0);
  EXPECT_NEAR(counts[1] / 20000.0, 0.2 / 0.9, 0.015);
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheMax) {
  SamplingParams params;
  params.min_p = 0.4f;  // threshold .16: drops only .1
  std::vector<int64_t> counts = drawCounts(kFourWay, params, 20000, 45);
  EXPECT_EQ(counts[0], 0);
  EXPECT_NEAR(counts[1] / 20000.0, 0.2 / 0.9, 0.015);
  EXPECT_NEAR(counts[3] / 20000.0, 0.4 / 0.9, 0.015);

  params.min_p = 0.6f;  // threshold .24: keeps .3 and .4
  counts = drawCounts(kFourWay, params, 20000, 46);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[2], 0);
}

// vLLM's order: min-p first, then top-p over the survivors' renormalized
// mass. With min_p .6 (threshold .24) only .3 and .4 survive, renormalized
// to 3/7 and 4/7; top_p .5 then keeps .4 alone (4/7 reaches .5). Top-p over
// the whole distribution first would have kept .3 and .4.
TEST(SamplerTest, MinPComesBeforeTopP) {
  SamplingParams params;
  params.min_p = 0.6f;
  params.top_p = 0.5f;
  const std::vector<int64_t> counts = drawCounts(kFourWay, params, 2000, 47);
  EXPECT_EQ(counts[3], 2000) << counts[0] << " " << counts[1] << " " << counts[2];
}

// vLLM's order: the bias is added before the penalties, so the repetition
// penalty divides the biased logit (2 + 3) / 2, not 2 / 2 + 3.
TEST(SamplerTest, TheBiasComesBeforeThePenalties) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f};
  const std::vector<TokenId> prompt = {0, 1};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.logit_bias = {{0, 3.0f}, {1, 2.0f}};
  SamplerInput input = makeInput(logits, params);
  input.prompt = prompt;
  Sampler sampler;
  // Token 1: -1 + 2 = 1 is positive once biased, so it is divided.
  EXPECT_EQ(sampler.processedLogits(input), (std::vector<float>{2.5f, 0.5f, 0.5f}));
}

TEST(SamplerTest, PenaltiesFollowTheFormulas) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f};
  const std::vector<TokenId> prompt = {0, 1};
  const std::vector<TokenId> output = {2, 2, 3, 1};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  SamplerInput input = makeInput(logits, params);
  input.prompt = prompt;
  input.output = output;

  Sampler sampler;
  // Hand-computed: repetition over prompt + output (positive / 2, else * 2),
  // then - (0.5 * count + 0.25) over output ids only.
  const std::vector<float> expected = {
      2.0f / 2.0f,                    // prompt only
      -1.0f * 2.0f - (0.5f + 0.25f),  // prompt and output once
      0.5f / 2.0f - (1.0f + 0.25f),   // output twice
      3.0f / 2.0f - (0.5f + 0.25f),   // output once
      -0.5f,                          // never seen
      1.0f,                           // never seen
  };
  std::vector<float> processed = sampler.processedLogits(input);
  ASSERT_EQ(processed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(processed[i], expected[i]) << i;
  EXPECT_FLOAT_EQ(processed[1], -2.75f);
  EXPECT_FLOAT_EQ(processed[2], -1.0f);

  // The same call again: no state leaks between calls.
  EXPECT_EQ(sampler.processedLogits(input), processed);

  // Greedy sees the penalized logits: 3 was best, now 0 and 5 tie at 1.0.
  params.temperature = 0.0f;
  EXPECT_EQ(sampler.sample(input).token, 0);

  // Without penalties the history changes nothing.
  SamplingParams plain;
  SamplerInput plain_input = input;
  plain_input.params = &plain;
  EXPECT_EQ(sampler.processedLogits(plain_input), logits);
}

TEST(SamplerTest, EachPenaltyAlone) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f};
  const std::vector<TokenId> prompt = {0, 1};
  const std::vector<TokenId> output = {1, 1, 1};
  Sampler sampler;

  SamplingParams repetition;
  repetition.repetition_penalty = 0.5f;  // < 1 favours repeats
  SamplerInput input = makeInput(logits, repetition);
  input.prompt = prompt;
  input.output = output;
  EXPECT_EQ(sampler.processedLogits(input), (std::vector<float>{4.0f, -0.5f, 0.5f}));

  SamplingParams frequency;
  frequency.frequency_penalty = -1.5f;  // prompt ids untouched, count 3
  input.params = &frequency;
  EXPECT_EQ(sampler.processedLogits(input), (std::vector<float>{2.0f, 3.5f, 0.5f}));

  SamplingParams presence;
  presence.presence_penalty = 2.0f;  // once, whatever the count
  input.params = &presence;
  EXPECT_EQ(sampler.processedLogits(input), (std::vector<float>{2.0f, -3.0f, 0.5f}));
}

// The smallest penalty a request can send (a float's nearest to zero: the
// API turns 1e-50 into it) divides positive repeated logits to +inf.
// Every sampling path then picks the smallest id among them, as greedy
// does, and logprobs stay those of the raw logits.
TEST(SamplerTest, PenaltiesThatOverflowToInfinityPickTheSmallestSuchId) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f, 5.0f};
  const std::vector<TokenId> prompt = {2, 1, 3};
  SamplingParams params;
  params.repetition_penalty = std::numeric_limits<float>::denorm_min();
  params.logprobs = 2;
  SamplerInput input = makeInput(logits, params);
  input.prompt = prompt;
  Sampler sampler;
  const std::vector<float> processed = sampler.processedLogits(input);
  EXPECT_EQ(processed[1], kInf);
  EXPECT_EQ(processed[2], kInf);
  EXPECT_EQ(processed[4], 5.0f);

  const std::vector<double> reference = logSoftmax(logits);
  auto expectInfinityWins = [&] {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      input.rng = SamplerRng{seed};
      const GeneratedToken token = sampler.sample(input);
      ASSERT_EQ(token.token, 1) << "seed " << seed;
      EXPECT_NEAR(token.logprob, reference[1], 1e-5);
      ASSERT_EQ(token.top.size(), 2u);
      EXPECT_EQ(token.top[0].token, 4);
    }
  };
  params.temperature = 0.0f;
  expectInfinityWins();
  params.temperature = 1.0f;
  expectInfinityWins();
  params.top_k = 2;
  expectInfinityWins();
  params.top_k = 0;
  params.top_p = 0.5f;
  expectInfinityWins();
  params.top_p = 1.0f;
  params.min_p = 0.1f;
  expectInfinityWins();
}

TEST(SamplerTest, MinTokensMasksTheGivenIdsUntilReached) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 9.0f};
  const std::vector<TokenId> eos = {3};
  const std::vector<TokenId> history = {1, 2};
  SamplingParams params;
  params.temperature = 0.0f;
  params.min_tokens = 2;
  SamplerInput input = makeInput(logits, params);
  input.min_tokens_mask = eos;
  Sampler sampler;

  input.output = std::span<const TokenId>(history).first(1);
  EXPECT_EQ(sampler.processedLogits(input)[3], -kInf);
  EXPECT_EQ(sampler.sample(input).token, 1);

  params.temperature = 1.0f;  // sampling must never pick a masked id either
  for (uint64_t seed = 0; seed < 200; ++seed) {
    input.rng = SamplerRng{seed};
    EXPECT_NE(sampler.sample(input).token, 3);
  }

  params.temperature = 0.0f;
  input.output = history;  // min_tokens reached
  EXPECT_EQ(sampler.sample(input).token, 3);
}

TEST(SamplerTest, EverythingMaskedFallsBackToTheRawArgmax) {
  const std::vector<float> logits = {0.0f, 2.0f};
  const std::vector<TokenId> mask = {0, 1};
  SamplingParams params;
  params.min_tokens = 1;
  SamplerInput input = makeInput(logits, params);
  input.min_tokens_mask = mask;
  Sampler sampler;
  EXPECT_EQ(sampler.sample(input).token, 1);
  params.temperature = 0.0f;
  EXPECT_EQ(sampler.sample(input).token, 1);
}

TEST(SamplerTest, NanLogitsAreNeverChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {nan, 0.0f, nan, 0.0f};
  SamplingParams params;
  Sampler sampler;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const TokenId token = sampler.sample(makeInput(logits, params, seed)).token;
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
}

// Runs one request for `steps` tokens, feeding its output back as history
// so penalties and the step counter both move.
std::vector<TokenId> generate(Sampler& sampler, uint64_t seed, int64_t steps,
                              Sampler* interleaved = nullptr) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 40;
  params.top_p = 0.95f;
  params.frequency_penalty = 0.3f;
  const std::vector<TokenId> prompt = {5, 6, 7};
  std::vector<TokenId> output;
  for (int64_t step = 0; step < steps; ++step) {
    const std::vector<float> logits = randomLogits(300, static_cast<uint32_t>(step));
    if (interleaved != nullptr) {
      // Another request sampling in between must not disturb this one.
      SamplingParams other;
      interleaved->sample(makeInput(logits, other, seed + 1000 + step));
    }
    SamplerInput input = makeInput(logits, params, seed);
    input.prompt = prompt;
    input.output = output;
    output.push_back(sampler.sample(input).token);
  }
  return output;
}

TEST(SamplerTest, SameSeedGivesTheSameTokens) {
  Sampler first;
  Sampler second;
  const std::vector<TokenId> a = generate(first, 7, 200);
  const std::vector<TokenId> b = generate(second, 7, 200, &second);
  EXPECT_EQ(a, b);
  const std::vector<TokenId> c = generate(first, 8, 200);
  EXPECT_NE(a, c);
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != c[i];
  EXPECT_GT(differing, 50);
}

// The pool's rows, on whichever kernel thread took each, are sample()'s:
// in either order, with top-p and without, on two threads and on one.
TEST(SamplerTest, PoolRowsAreIndependentOfOrderCompanyAndThread) {
  SamplingParams plain, nucleus;
  nucleus.temperature = 0.6f;
  nucleus.top_p = 0.9f;
  nucleus.logprobs = 2;
  std::vector<std::vector<float>> rows;
  std::vector<SamplerInput> inputs;
  for (uint32_t i = 0; i < 64; ++i) rows.push_back(randomLogits(500, 300 + i));
  for (uint32_t i = 0; i < 64; ++i) {
    inputs.push_back(makeInput(rows[i], i % 2 == 0 ? plain : nucleus, 11 * i));
  }
  const int threads = kernels::numThreads();
  for (const int pool_threads : {2, 1}) {
    kernels::setNumThreads(pool_threads);
    SamplerPool pool;
    const std::vector<GeneratedToken> forward = pool.sampleRows(inputs);
    std::vector<SamplerInput> reversed(inputs.rbegin(), inputs.rend());
    const std::vector<GeneratedToken> backward = pool.sampleRows(reversed);
    ASSERT_EQ(forward.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const GeneratedToken alone = Sampler().sample(inputs[i]);
      EXPECT_EQ(forward[i].token, backward[inputs.size() - 1 - i].token);
      EXPECT_EQ(forward[i].token, alone.token) << "row " << i;
      EXPECT_EQ(forward[i].logprob, alone.logprob) << "row " << i;
      ASSERT_EQ(forward[i].top.size(), alone.top.size());
      for (size_t t = 0; t < alone.top.size(); ++t) {
        EXPECT_EQ(forward[i].top[t].token, alone.top[t].token);
      }
    }
  }
  kernels::setNumThreads(threads);
}

// topPNucleus against the plain way: every candidate sorted (logit
// descending, smaller id first on ties), walked until the weights added in
// that order reach the target. The same keep and the same ids in order, on
// flat rows (a nucleus of most of the vocabulary), peaked ones, logits
// with many ties, weights that underflow to zero, weights that do not grow
// with the logit, a subset
// of candidates, and targets at, just past and beyond the total.
TEST(SamplerTest, TopPNucleusIsTheSortedWalksPrefix) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 120; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int kind = trial % 6;
    const size_t vocab = trial % 3 == 0 ? 32000 : 1 + rng() % 3000;
    std::vector<float> logits(vocab), weights(vocab);
    std::normal_distribution<float> normal(0.0f, kind == 1 ? 8.0f : 1.0f);
    for (size_t i = 0; i < vocab; ++i) {
      logits[i] = normal(rng);
      if (kind == 2) logits[i] = std::round(logits[i] * 4.0f) / 4.0f;  // ties
    }
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    for (size_t i = 0; i < vocab; ++i) {
      const float scale = kind == 3 ? 60.0f : 1.0f;  // many weights underflow to 0
      weights[i] = std::exp((logits[i] - max_logit) * scale);
      // Not monotone in the logit: the order is the logits', whatever the
      // weights (a vectorized exp's may differ in the last bits; here by
      // more, so that buckets of weight and ranges of logit disagree).
      if (kind == 4 && i % 2 == 0) weights[i] *= 0.6f;
    }
    std::vector<TokenId> candidates;
    for (size_t i = 0; i < vocab; ++i) {
      if (kind != 5 || i % 3 != 0) candidates.push_back(static_cast<TokenId>(i));
    }
    double total = 0.0;
    for (TokenId id : candidates) total += weights[static_cast<size_t>(id)];
    const double fractions[] = {0.0, 0.1, 0.5, 0.9, 0.999, 1.0, 1.0 + 1e-12, 2.0};
    for (const double fraction : fractions) {
      SCOPED_TRACE("target " + std::to_string(fraction) + " of the total");
      const double target = fraction * total;
      std::vector<TokenId> sorted = candidates;
      std::sort(sorted.begin(), sorted.end(), [&](TokenId a, TokenId b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      size_t expected = 0;
      double mass = 0.0;
      while (expected < sorted.size() && (expected == 0 || mass < target)) {
        mass += weights[static_cast<size_t>(sorted[expected])];
        ++expected;
      }
      std::vector<TokenId> nucleus = candidates;
      const size_t keep = topPNucleus(nucleus, logits, weights, target);
      ASSERT_EQ(keep, expected);
      sorted.resize(expected);
      EXPECT_EQ(nucleus, sorted);
    }
  }
}

TEST(SamplerTest, RngIsAPureFunctionOfSeedAndStep) {
  const SamplerRng rng{99};
  for (int64_t step = 0; step < 1000; ++step) {
    const double u = rng.uniform(step);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, SamplerRng{99}.uniform(step));
  }
  EXPECT_NE(SamplerRng{99}.uniform(0), SamplerRng{100}.uniform(0));
  EXPECT_NE(SamplerRng{99}.uniform(0), SamplerRng{99}.uniform(1));

  SamplingParams seeded;
  seeded.seed = 12345;
  EXPECT_EQ(SamplerRng::forRequest(seeded).seed, 12345u);
  const SamplingParams unseeded;
  EXPECT_NE(SamplerRng::forRequest(unseeded).seed, SamplerRng::forRequest(unseeded).seed);
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits = randomLogits(1000, 17);
  const std::vector<double> reference = logSoftmax(logits);
  const std::vector<TokenId> history = {1, 2, 3, 4};
  SamplingParams params;
  params.logprobs = 5;
  // Processing must not leak into the reported logprobs.
  params.temperature = 0.7f;
  params.top_k = 3;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 1.0f;
  SamplerInput input = makeInput(logits, params, 3);
  input.prompt = history;
  input.output = history;
  const GeneratedToken result = Sampler().sample(input);
  EXPECT_NEAR(result.logprob, reference[result.token], 1e-5);

  std::vector<TokenId> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
  ASSERT_EQ(result.top.size(), 5u);
  for (size_t i = 0; i < result.top.size(); ++i) {
    EXPECT_EQ(result.top[i].token, order[i]);
    EXPECT_NEAR(result.top[i].logprob, reference[order[i]], 1e-5);
  }
}

TEST(SamplerTest, LogprobTiesAreOrderedById) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.logprobs = 4;
  const GeneratedToken result = Sampler().sample(makeInput(logits, params));
  const std::vector<double> reference = logSoftmax(logits);
  ASSERT_EQ(result.top.size(), 4u);
  const std::array<TokenId, 4> expected = {1, 3, 2, 4};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(result.top[i].token, expected[i]);
    EXPECT_NEAR(result.top[i].logprob, reference[expected[i]], 1e-5);
  }
}

TEST(SamplerTest, LogprobsZeroReportsOnlyTheChosenToken) {
  const std::vector<float> logits = {0.5f, 0.25f, -1.0f};
  SamplingParams params;
  params.logprobs = 0;
  const GeneratedToken result = Sampler().sample(makeInput(logits, params, 1));
  EXPECT_TRUE(result.top.empty());
  EXPECT_NEAR(result.logprob, logSoftmax(logits)[result.token], 1e-5);

  // More alternatives than the vocabulary has: all of them.
  params.logprobs = 20;
  EXPECT_EQ(Sampler().sample(makeInput(logits, params, 1)).top.size(), 3u);

  // Not asked for: nothing reported.
  params.logprobs.reset();
  const GeneratedToken silent = Sampler().sample(makeInput(logits, params, 1));
  EXPECT_TRUE(silent.top.empty());
  EXPECT_EQ(silent.logprob, 0.0f);
}

std::string validationMessage(const SamplingParams& params, int64_t prompt_len = 10) {
  const Status status = validateSamplingParams(params, 32000, 4096, prompt_len);
  if (status.isOk()) return "ok";
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  return status.message();
}

TEST(SamplerValidationTest, AcceptsDefaultsAndBoundaries) {
  SamplingParams params;
  EXPECT_EQ(validationMessage(params), "ok");
  params.temperature = 0.0f;
  params.top_p = 1.0f;
  params.top_k = -1;
  params.min_p = 1.0f;
  params.frequency_penalty = -2.0f;
  params.presence_penalty = 2.0f;
  params.logprobs = 20;
  params.min_tokens = params.max_tokens;
  params.stop_token_ids = {0, 31999};
  EXPECT_EQ(validationMessage(params), "ok");
  params.max_tokens = 4086;
  params.min_tokens = 0;
  EXPECT_EQ(validationMessage(params), "ok");  // 10 + 4086 is exactly the context
}

TEST(SamplerValidationTest, NamesTheFieldAndTheRange) {
  SamplingParams params;
  params.temperature = 3.5f;
  EXPECT_EQ(validationMessage(params), "temperature must be between 0 and 2, got 3.5");
  params.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(validationMessage(params), "temperature must be between 0 and 2, got nan");

  params = {};
  params.logit_bias = {{4, 101.0f}};
  EXPECT_EQ(validationMessage(params),
            "logit_bias values must be between -100 and 100, got 101 for token 4");

  params = {};
  params.top_p = 0.0f;
  EXPECT_EQ(validationMessage(params), "top_p must be in (0, 1], got 0");
  params.top_p = 1.5f;
  EXPECT_EQ(validationMessage(params), "top_p must be in (0, 1], got 1.5");

  params = {};
  params.top_k = -3;
  EXPECT_EQ(validationMessage(params), "top_k must be 0 (disabled) or positive, got -3");

  params = {};
  params.min_p = 1.25f;
  EXPECT_EQ(validationMessage(params), "min_p must be between 0 and 1, got 1.25");

  params = {};
  params.frequency_penalty = 2.5f;
  EXPECT_EQ(validationMessage(params), "frequency_penalty must be between -2 and 2, got 2.5");
  params = {};
  params.presence_penalty = -3.0f;
  EXPECT_EQ(validationMessage(params), "presence_penalty must be between -2 and 2, got -3");

  params = {};
  params.repetition_penalty = 0.0f;
  EXPECT_EQ(validationMessage(params),
            "repetition_penalty must be greater than 0 and finite, got 0");
  params.repetition_penalty = kInf;
  EXPECT_EQ(validationMessage(params),
            "repetition_penalty must be greater than 0 and finite, got inf");

  params = {};
  params.logprobs = 21;
  EXPECT_EQ(validationMessage(params), "logprobs must be between 0 and 20, got 21");
  params.logprobs = -1;
  EXPECT_EQ(validationMessage(params), "logprobs must be between 0 and 20, got -1");

  params = {};
  params.max_tokens = 0;
  EXPECT_EQ(validationMessage(params), "max_tokens must be at least 1, got 0");

  params = {};
  params.min_tokens = 17;
  EXPECT_EQ(validationMessage(params), "min_tokens must be between 0 and max_tokens (16), got 17");
  params.min_tokens = -1;
  EXPECT_EQ(validationMessage(params), "min_tokens must be between 0 and max_tokens (16), got -1");

  params = {};
  params.stop_token_ids = {2, 32000};
  EXPECT_EQ(validationMessage(params), "stop_token_ids must be token ids in [0, 32000), got 32000");
  params.stop_token_ids = {-1};
  EXPECT_EQ(validationMessage(params), "stop_token_ids must be token ids in [0, 32000), got -1");

  params = {};
  params.max_tokens = 4087;
  EXPECT_EQ(validationMessage(params),
            "prompt (10 tokens) plus max_tokens (4087) exceeds the maximum context length of 4096 "
            "tokens");
  params.max_tokens = std::numeric_limits<int64_t>::max();  // must not overflow
  EXPECT_EQ(validationMessage(params),
            "prompt (10 tokens) plus max_tokens (9223372036854775807) exceeds the maximum context "
            "length of 4096 tokens");
  params = {};
  EXPECT_EQ(validationMessage(params, 5000),
            "prompt (5000 tokens) plus max_tokens (16) exceeds the maximum context length of 4096 "
            "tokens");
}

}  // namespace
}  // namespace tandem::engine
