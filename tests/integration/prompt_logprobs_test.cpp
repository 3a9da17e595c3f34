// The prompt's logprobs and best_of through tandem-agent serve: echo with
// logprobs leads the completion's logprobs with the prompt's tokens (whole
// and streamed alike) and those logprobs are the ones the model gave the
// same tokens when it generated them; vLLM's prompt_logprobs for
// completions, n > 1 and chat; best_of > n returns the candidates with the
// largest sum of token logprobs, each equal to the single request with its
// seed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/agent_server.h"

namespace {

using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

std::vector<int> tokenIdsOf(const json& response) {
  return response["choices"][0]["token_ids"].get<std::vector<int>>();
}

// A streamed completion's chunks, parsed.
std::vector<json> streamChunks(const Agent& agent, json body) {
  body["stream"] = true;
  httplib::Client client("127.0.0.1", agent.port());
  client.set_read_timeout(60, 0);
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(res);
  std::vector<json> chunks;
  if (!res) return chunks;
  std::istringstream events(res->body);
  for (std::string line; std::getline(events, line);) {
    if (line.rfind("data: {", 0) == 0) chunks.push_back(json::parse(line.substr(6)));
  }
  return chunks;
}

// echo + logprobs: the prompt's tokens first (the first one's logprob
// null), then the output's; the offsets count characters of the echoed
// text. A second request whose prompt is that whole text's token ids
// reports, for the part the first one generated, exactly the logprobs the
// first one reported for it (the model's predictions are the same whether
// it generated or read the tokens). Streamed, the chunks' logprobs put
// together are the whole answer's.
TEST(PromptLogprobs, EchoLeadsWithThePromptAndMatchesGeneration) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(40, 31);
  json body = greedy(prompt, 10);
  body["logprobs"] = 3;
  body["echo"] = true;
  const json whole = agent.post("/v1/completions", body);
  ASSERT_TRUE(whole.contains("choices")) << whole.dump();
  const json& logprobs = whole["choices"][0]["logprobs"];
  const std::vector<int> generated = tokenIdsOf(whole);
  ASSERT_EQ(generated.size(), 10u);
  ASSERT_EQ(logprobs["tokens"].size(), prompt.size() + generated.size());
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  for (size_t i = 1; i < logprobs["tokens"].size(); ++i) {
    EXPECT_TRUE(logprobs["token_logprobs"][i].is_number()) << i;
    EXPECT_GE(logprobs["top_logprobs"][i].size(), 3u) << i;
    EXPECT_GE(logprobs["text_offset"][i].get<int64_t>(),
              logprobs["text_offset"][i - 1].get<int64_t>())
        << i;
  }
  EXPECT_EQ(whole["usage"]["prompt_tokens"], prompt.size());

  // Teacher forcing: the prompt and the answer as one prompt.
  std::vector<int> replay = prompt;
  replay.insert(replay.end(), generated.begin(), generated.end());
  json forced = greedy(replay, 1);
  forced["logprobs"] = 3;
  forced["echo"] = true;
  const json again = agent.post("/v1/completions", forced);
  const json& replayed = again["choices"][0]["logprobs"];
  ASSERT_EQ(replayed["tokens"].size(), replay.size() + 1);
  for (size_t i = 0; i < replay.size(); ++i) {
    EXPECT_EQ(replayed["token_logprobs"][i], logprobs["token_logprobs"][i]) << i;
    EXPECT_EQ(replayed["top_logprobs"][i], logprobs["top_logprobs"][i]) << i;
    EXPECT_EQ(replayed["tokens"][i], logprobs["tokens"][i]) << i;
  }
  // Generated and greedy: each answer token is its position's best.
  for (size_t j = 0; j < generated.size(); ++j) {
    const size_t i = prompt.size() + j;
    double best = -1e9;
    for (const auto& [text, value] : replayed["top_logprobs"][i].items()) {
      best = std::max(best, value.get<double>());
    }
    EXPECT_EQ(replayed["token_logprobs"][i].get<double>(), best) << i;
  }

  // Streamed: the same lists, in pieces.
  json lists = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
  std::string text;
  for (const json& chunk : streamChunks(agent, body)) {
    const json& choice = chunk["choices"][0];
    text += choice["text"].get<std::string>();
    if (choice["logprobs"].is_null()) continue;
    for (const auto& [key, list] : lists.items()) {
      for (const json& item : choice["logprobs"][key]) list.push_back(item);
    }
  }
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(lists, logprobs);
}

// echo with max_tokens 0 (OpenAI's prompt scoring, kept by vLLM): the
// prompt's text and logprobs alone, the same numbers as with a generated
// token after them; no completion tokens, finish_reason length; streamed
// alike. Without echo, 0 stays refused.
TEST(PromptLogprobs, EchoWithNoTokensScoresThePromptAlone) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(30, 33);
  json body = greedy(prompt, 1);
  body["logprobs"] = 2;
  body["echo"] = true;
  const json with_token = agent.post("/v1/completions", body);
  body["max_tokens"] = 0;
  const json scored = agent.post("/v1/completions", body);
  ASSERT_TRUE(scored.contains("choices")) << scored.dump();
  const json& choice = scored["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["token_ids"], json::array());
  EXPECT_EQ(scored["usage"]["completion_tokens"], 0);
  EXPECT_EQ(scored["usage"]["prompt_tokens"], prompt.size());
  const json& expected = with_token["choices"][0]["logprobs"];
  ASSERT_EQ(choice["logprobs"]["tokens"].size(), prompt.size());
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      EXPECT_EQ(choice["logprobs"][key][i], expected[key][i]) << key << " " << i;
    }
  }
  const std::string generated_text = with_token["choices"][0]["text"];
  const std::string last = expected["tokens"][prompt.size()];
  EXPECT_EQ(choice["text"], generated_text.substr(0, generated_text.size() - last.size()));

  std::string text;
  size_t streamed_tokens = 0;
  for (const json& chunk : streamChunks(agent, body)) {
    const json& part = chunk["choices"][0];
    text += part["text"].get<std::string>();
    if (!part["logprobs"].is_null()) streamed_tokens += part["logprobs"]["tokens"].size();
  }
  EXPECT_EQ(text, choice["text"]);
  EXPECT_EQ(streamed_tokens, prompt.size());

  body["echo"] = false;
  int status = 0;
  const json refused = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "max_tokens");
}

// vLLM's prompt_logprobs: null, then per prompt token its own entry (rank,
// decoded text) and the alternatives asked for, keyed by token id; the same
// numbers as echo's. With n = 3 every choice carries them and the prompt is
// still computed once for the others to read from the cache; chat puts them
// on the response.
TEST(PromptLogprobs, VllmFormForCompletionsChoicesAndChat) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(70, 32);
  json body = greedy(prompt, 4);
  body["prompt_logprobs"] = 2;
  const json answer = agent.post("/v1/completions", body);
  const json& list = answer["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(list.size(), prompt.size()) << answer.dump();
  EXPECT_TRUE(list[0].is_null());
  EXPECT_TRUE(answer["choices"][0]["logprobs"].is_null());

  json echoed = greedy(prompt, 4);
  echoed["echo"] = true;
  echoed["logprobs"] = 2;
  const json echo_answer = agent.post("/v1/completions", echoed);
  const json& echo_logprobs = echo_answer["choices"][0]["logprobs"];
  for (size_t i = 1; i < prompt.size(); ++i) {
    const json& entry = list[i];
    const std::string own = std::to_string(prompt[i]);
    ASSERT_TRUE(entry.contains(own)) << i << entry.dump();
    EXPECT_EQ(entry[own]["logprob"], echo_logprobs["token_logprobs"][i]) << i;
    EXPECT_EQ(entry[own]["decoded_token"], echo_logprobs["tokens"][i]) << i;
    EXPECT_GE(entry[own]["rank"].get<int64_t>(), 1);
    // Two alternatives of rank 1 and 2, plus the token when it is not one.
    std::vector<int64_t> ranks;
    for (const auto& [id, value] : entry.items()) ranks.push_back(value["rank"].get<int64_t>());
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks[0], 1) << entry.dump();
    EXPECT_EQ(ranks[1], 2) << entry.dump();
    EXPECT_EQ(entry.size(), entry[own]["rank"].get<int64_t>() <= 2 ? 2u : 3u) << entry.dump();
  }

  json several = body;
  several["n"] = 3;
  several["temperature"] = 1.0;
  several["seed"] = 40;
  const double hits_before = agent.metric("tandem_prefix_cache_hits_total");
  const json choices = agent.post("/v1/completions", several);
  ASSERT_EQ(choices["choices"].size(), 3u) << choices.dump();
  for (const json& choice : choices["choices"]) EXPECT_EQ(choice["prompt_logprobs"], list);
  // 70 tokens: 4 full blocks, read from the cache by choices 1 and 2 only
  // (the first computes them all for its logprobs).
  EXPECT_EQ(agent.metric("tandem_prefix_cache_hits_total") - hits_before, 2 * 64);

  json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "hello there"}}}},
               {"max_tokens", 3},
               {"temperature", 0},
               {"prompt_logprobs", 1}};
  const json chat_answer = agent.post("/v1/chat/completions", chat);
  ASSERT_TRUE(chat_answer.contains("prompt_logprobs")) << chat_answer.dump();
  EXPECT_EQ(chat_answer["prompt_logprobs"].size(), chat_answer["usage"]["prompt_tokens"]);
  EXPECT_TRUE(chat_answer["prompt_logprobs"][0].is_null());
}

// best_of > n: best_of candidates, candidate i the request with seed + i
// alone; the n returned are those with the largest sum of token logprobs,
// best first (logprobs not shown unless asked for); usage counts every
// candidate's tokens.
TEST(BestOf, ReturnsTheCandidatesWithTheLargestSumOfLogprobs) {
  Agent agent;
  json body = greedy(randomPrompt(30, 33), 8);
  body["temperature"] = 1.0;
  body["seed"] = 70;
  body["n"] = 2;
  body["best_of"] = 5;
  const json answer = agent.post("/v1/completions", body);
  ASSERT_EQ(answer["choices"].size(), 2u) << answer.dump();
  EXPECT_EQ(answer["usage"]["completion_tokens"], 5 * 8);
  std::vector<std::pair<double, std::vector<int>>> candidates;
  for (int i = 0; i < 5; ++i) {
    json single = body;
    single.erase("best_of");
    single["n"] = 1;
    single["seed"] = 70 + i;
    single["logprobs"] = 0;
    const json one = agent.post("/v1/completions", single);
    double sum = 0;
    for (const json& value : one["choices"][0]["logprobs"]["token_logprobs"]) {
      sum += value.get<double>();
    }
    candidates.emplace_back(sum, tokenIdsOf(one));
  }
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return candidates[a].first > candidates[b].first; });
  for (size_t i = 0; i < 2; ++i) {
    const json& choice = answer["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_TRUE(choice["logprobs"].is_null());
    EXPECT_EQ(choice["token_ids"].get<std::vector<int>>(), candidates[order[i]].second) << i;
  }
  EXPECT_NE(candidates[order[0]].second, candidates[order[1]].second);
}

// A batch of prompts (an array, as OpenAI's and vLLM's): prompt p's
// choices come at indices p * n + i, each exactly the answer prompt p gets
// alone with seed + i (text, echo and logprobs included); usage counts each
// prompt once and every choice's tokens. Streamed, each index's chunks put
// together are its whole choice. With best_of, each prompt's best
// candidate is its choice.
TEST(BatchedPrompts, EachPromptIsAnsweredAsAloneIndexedByPromptThenChoice) {
  Agent agent;
  const json prompts = {randomPrompt(30, 51), "the river carried seven stones",
                        randomPrompt(9, 52)};
  json body = greedy({1}, 6);
  body["prompt"] = prompts;
  body["temperature"] = 1.0;
  body["seed"] = 11;
  body["n"] = 2;
  body["echo"] = true;
  body["logprobs"] = 1;
  const json answer = agent.post("/v1/completions", body);
  ASSERT_EQ(answer["choices"].size(), 6u) << answer.dump();
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (size_t i = 0; i < 2; ++i) {
      json single = body;
      single["prompt"] = prompts[p];
      single["n"] = 1;
      single["seed"] = 11 + i;
      const json alone = agent.post("/v1/completions", single);
      if (i == 0) prompt_tokens += alone["usage"]["prompt_tokens"].get<int64_t>();
      json expected = alone["choices"][0];
      expected["index"] = p * 2 + i;
      EXPECT_EQ(answer["choices"][p * 2 + i], expected) << "prompt " << p << " choice " << i;
    }
  }
  EXPECT_EQ(answer["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(answer["usage"]["completion_tokens"], 6 * 6);

  body.erase("echo");
  body.erase("logprobs");
  const json whole = agent.post("/v1/completions", body);
  std::vector<std::vector<int>> streamed(6);
  for (const json& chunk : streamChunks(agent, body)) {
    for (const json& choice : chunk["choices"]) {
      for (const json& token : choice["token_ids"]) {
        streamed[choice["index"].get<size_t>()].push_back(token.get<int>());
      }
    }
  }
  for (size_t c = 0; c < 6; ++c) {
    EXPECT_EQ(streamed[c], whole["choices"][c]["token_ids"].get<std::vector<int>>()) << c;
  }

  body["n"] = 1;
  body["best_of"] = 3;
  body["logprobs"] = 0;
  const json best = agent.post("/v1/completions", body);
  ASSERT_EQ(best["choices"].size(), 3u) << best.dump();
  for (size_t p = 0; p < prompts.size(); ++p) {
    double best_sum = -1e300;
    std::vector<int> best_tokens;
    for (int i = 0; i < 3; ++i) {
      json single = body;
      single["prompt"] = prompts[p];
      single.erase("best_of");
      single["seed"] = 11 + i;
      const json one = agent.post("/v1/completions", single);
      double sum = 0;
      for (const json& value : one["choices"][0]["logprobs"]["token_logprobs"]) {
        sum += value.get<double>();
      }
      if (sum > best_sum) best_sum = sum, best_tokens = tokenIdsOf(one);
    }
    EXPECT_EQ(best["choices"][p]["index"], p);
    EXPECT_EQ(best["choices"][p]["token_ids"].get<std::vector<int>>(), best_tokens) << p;
  }
}

// Every candidate of a batch is held by the engine at once: a batch of
// more than the agent holds (its seats and waiting queue) is a 400 naming
// the limit (a 503 would be retried in vain), one that fits is served.
TEST(BatchedPrompts, MoreCandidatesThanTheAgentHoldsIsA400) {
  Agent agent({"--max-num-seqs", "3", "--max-waiting-requests", "1"});
  json body = greedy({1}, 3);
  body["prompt"] = {randomPrompt(10, 61), randomPrompt(10, 62), randomPrompt(10, 63)};
  body["n"] = 2;
  int status = 0;
  const json refused = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400) << refused.dump();
  EXPECT_EQ(refused["error"]["param"], "prompt");
  EXPECT_EQ(refused["error"]["message"],
            "this request is 6 engine requests (prompts x best_of), more than this agent "
            "(--max-num-seqs 3 + --max-waiting-requests 1) holds at once (4)");
  // One prompt: the field that makes it so many is named, best_of only
  // when given above n.
  json one = greedy(randomPrompt(10, 64), 3);
  one["n"] = 5;
  const json by_n = agent.post("/v1/completions", one, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(by_n["error"]["param"], "n");
  EXPECT_EQ(by_n["error"]["message"],
            "this request is 5 engine requests (one per choice), more than this agent "
            "(--max-num-seqs 3 + --max-waiting-requests 1) holds at once (4)");
  one["n"] = 1;
  one["best_of"] = 5;
  EXPECT_EQ(agent.post("/v1/completions", one, &status)["error"]["param"], "best_of");
  body["prompt"].erase(2);
  const json served = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 200) << served.dump();
  EXPECT_EQ(served["choices"].size(), 4u);
}

}  // namespace
