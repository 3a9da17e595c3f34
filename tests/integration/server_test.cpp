// tandem-agent serve as a client sees it: exactness under concurrency,
// prefix caching, preemption, seeds, bad input, disconnects, SSE framing,
// metrics, shutdown. Each test starts a real server process on a free port.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer.h"
#include "tests/support/agent_process.h"
#include "tests/support/agent_server.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

TEST(Server, ConcurrentGreedyRequestsEqualSoloRuns) {
  Agent agent;
  std::vector<json> bodies;
  for (uint32_t i = 0; i < 8; ++i) bodies.push_back(greedy(randomPrompt(5 + 9 * i, i), 12));
  std::vector<std::vector<int>> solo;
  for (const json& body : bodies) solo.push_back(tokenIds(agent.post("/v1/completions", body)));
  const std::vector<std::vector<int>> together = postConcurrently(agent, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    ASSERT_EQ(solo[i].size(), 12u);
    EXPECT_EQ(together[i], solo[i]) << "request " << i << " changed when batched";
  }
}

// logit_bias over HTTP: a +100 bias makes greedy decoding choose that token
// every step; a -100 bias on the undisturbed answer's first token makes the
// answer start with another; the router's parser accepts what the agent's does.
// POST /admin/drain on an idle agent: the drain it begins has nothing to
// wait for and stops the server at once, yet the 202 is written first (the
// drain waits for the handler that answers it); the agent then exits 0.
// (The stop once overtook the answer on a loaded machine, in the chaos
// test; an idle one does not reproduce that race, so this checks the
// contract, not the timing.)
TEST(Server, AnIdleAgentAnswersItsDrainBeforeItExits) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    Agent agent;
    auto res = agent.client()->Post("/admin/drain", "{}", "application/json");
    ASSERT_TRUE(res) << "no answer to the drain: " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 202);
    EXPECT_EQ(res->body, R"({"draining":true})");
    EXPECT_EQ(agent.process().wait(std::chrono::seconds(30)), 0) << agent.stderrText();
  }
}

TEST(Server, LogitBiasSteersGreedyDecoding) {
  Agent agent;
  json body = greedy(randomPrompt(20, 41), 6);
  const std::vector<int> plain = tokenIds(agent.post("/v1/completions", body));
  ASSERT_EQ(plain.size(), 6u);
  body["logit_bias"] = {{"300", 100}};
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", body)), std::vector<int>(6, 300));
  body["logit_bias"] = {{std::to_string(plain[0]), -100}};
  const std::vector<int> banned = tokenIds(agent.post("/v1/completions", body));
  ASSERT_EQ(banned.size(), 6u);
  EXPECT_NE(banned[0], plain[0]);
  int status = 0;
  body["logit_bias"] = {{"300", 250}};
  const json error = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "logit_bias[\"300\"]");
}

// The data events of a streamed answer, parsed ([DONE] left out).
std::vector<json> streamedEvents(const Agent& agent, const json& body) {
  auto res = agent.client()->Post("/v1/completions", body.dump(), "application/json");
  std::vector<json> events;
  if (!res) return events;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("data: {")) events.push_back(json::parse(line.substr(6)));
  }
  return events;
}

// vLLM's allowed_token_ids, bad_words, truncate_prompt_tokens and
// stream_options.continuous_usage_stats over HTTP.
TEST(Server, AllowedTokensBadWordsTruncationAndContinuousUsageAsVllm) {
  Agent agent;
  // allowed_token_ids: every token is one of them.
  json body = greedy(randomPrompt(20, 43), 8);
  body["allowed_token_ids"] = {300, 301, 302};
  for (int id : tokenIds(agent.post("/v1/completions", body))) {
    EXPECT_TRUE(id >= 300 && id <= 302) << id;
  }

  // bad_words: a one-token word a +100 bias would pick every step is never
  // picked.
  std::string word;
  int word_id = -1;
  for (const char* candidate : {"the", "a", "and", "of", "x"}) {
    const json tokens =
        agent.post("/tokenize", {{"prompt", candidate}, {"add_special_tokens", false}});
    if (tokens["tokens"].size() == 1) {
      word = candidate;
      word_id = tokens["tokens"][0];
      break;
    }
  }
  ASSERT_GE(word_id, 0) << "no one-token word in this tokenizer";
  body = greedy(randomPrompt(20, 44), 6);
  body["logit_bias"] = {{std::to_string(word_id), 100}};
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", body)), std::vector<int>(6, word_id));
  body["bad_words"] = {"  " + word};
  const std::vector<int> without = tokenIds(agent.post("/v1/completions", body));
  ASSERT_EQ(without.size(), 6u);
  EXPECT_EQ(std::count(without.begin(), without.end(), word_id), 0) << word;

  // truncate_prompt_tokens: the answer of the prompt's last 8 tokens.
  const std::vector<int> prompt = randomPrompt(30, 45);
  body = greedy(prompt, 6);
  body["truncate_prompt_tokens"] = 8;
  const json cut = agent.post("/v1/completions", body);
  EXPECT_EQ(cut["usage"]["prompt_tokens"], 8) << cut;
  const json last8 =
      agent.post("/v1/completions", greedy(std::vector<int>(prompt.end() - 8, prompt.end()), 6));
  EXPECT_EQ(tokenIds(cut), tokenIds(last8));

  // continuous_usage_stats: every chunk counts the tokens so far.
  body = greedy(prompt, 5);
  body["stream"] = true;
  body["return_token_ids"] = true;
  body["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  int64_t seen = 0;
  const std::vector<json> events = streamedEvents(agent, body);
  ASSERT_FALSE(events.empty());
  for (const json& event : events) {
    ASSERT_TRUE(event.contains("usage") && event["usage"].is_object()) << event;
    EXPECT_EQ(event["usage"]["prompt_tokens"], 30) << event;
    if (!event["choices"].empty()) seen += event["choices"][0]["token_ids"].size();
    EXPECT_EQ(event["usage"]["completion_tokens"], seen) << event;
    EXPECT_EQ(event["usage"]["total_tokens"], 30 + seen) << event;
  }
  EXPECT_EQ(seen, 5);
  EXPECT_TRUE(events.back()["choices"].empty()) << "the last event is the usage chunk";
}

TEST(Server, PrefixCacheHitComputesOnlyTheRestAndMatchesAMiss) {
  Agent agent;
  std::vector<int> prefix = randomPrompt(160, 100);  // 10 blocks of 16
  std::vector<int> first = prefix, second = prefix;
  for (int id : randomPrompt(7, 101)) first.push_back(id);
  for (int id : randomPrompt(9, 102)) second.push_back(id);
  json a = agent.post("/v1/completions", greedy(first, 4));
  EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  const double hits_before = agent.metric("tandem_prefix_cache_hits_total");
  const double computed_before = agent.metric("tandem_computed_tokens_total");
  json b = agent.post("/v1/completions", greedy(second, 4));
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 160);
  EXPECT_EQ(agent.metric("tandem_prefix_cache_hits_total") - hits_before, 160);
  // 9 uncached prompt tokens, then 3 decode steps (the 4th token is sampled
  // from the last one and never computed).
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 9 + 3);

  // A different cache_salt cannot share blocks: a miss, with identical tokens.
  json miss_body = greedy(second, 4);
  miss_body["cache_salt"] = "another-tenant";
  json miss = agent.post("/v1/completions", miss_body);
  EXPECT_EQ(miss["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(tokenIds(miss), tokenIds(b));
}

TEST(Server, PreemptedRequestsRecomputeToIdenticalTokens) {
  // Each request grows to 190 tokens (12 blocks); 20 blocks hold one of them
  // at full length, so running four at once must preempt. The small model is
  // slow enough per token that the four overlap even on a loaded machine.
  Agent agent({"--num-blocks", "20", "--max-num-seqs", "4"}, smallModelDir());
  std::vector<json> bodies;
  for (uint32_t i = 0; i < 4; ++i) bodies.push_back(greedy(randomPrompt(40, 200 + i), 150));
  std::vector<std::vector<int>> solo;
  for (const json& body : bodies) solo.push_back(tokenIds(agent.post("/v1/completions", body)));
  const double preemptions_before = agent.metric("tandem_preemptions_total");
  const std::vector<std::vector<int>> together = postConcurrently(agent, bodies);
  EXPECT_GT(agent.metric("tandem_preemptions_total"), preemptions_before)
      << "nothing was preempted: the test lost its point";
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(together[i], solo[i]) << "request " << i;
  EXPECT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == 20; }))
      << "blocks leaked";
}

// --scheduling-policy priority over HTTP: with both seats taken by worse
// requests, a better one takes the seat of one of them (which recomputes
// later) instead of waiting for it; every answer is the one it has alone.
TEST(Server, ABetterPriorityTakesTheSeatOfAWorseRequestAndNoAnswerChanges) {
  Agent agent({"--scheduling-policy", "priority", "--max-num-seqs", "2"}, smallModelDir());
  std::vector<json> worse;
  for (uint32_t i = 0; i < 2; ++i) {
    worse.push_back(greedy(randomPrompt(30, 210 + i), 150));
    worse.back()["priority"] = 10;
  }
  json better = greedy(randomPrompt(20, 212), 6);
  better["priority"] = -1;
  std::vector<std::vector<int>> solo;
  for (const json& body : worse) solo.push_back(tokenIds(agent.post("/v1/completions", body)));
  const std::vector<int> better_solo = tokenIds(agent.post("/v1/completions", better));
  const double preempted_before = agent.metric("tandem_priority_preemptions_total");
  std::vector<std::vector<int>> together(worse.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < worse.size(); ++i) {
    threads.emplace_back(
        [&, i] { together[i] = tokenIds(agent.post("/v1/completions", worse[i])); });
  }
  // The small model takes long enough per token that both are still
  // running when the better one comes.
  EXPECT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 2; }));
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", better)), better_solo);
  EXPECT_EQ(agent.metric("tandem_priority_preemptions_total") - preempted_before, 1)
      << agent.metricsText();
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < worse.size(); ++i) EXPECT_EQ(together[i], solo[i]) << "request " << i;
}

TEST(Server, SameSeedSameTokens) {
  Agent agent;
  json body = {{"model", "tiny"},
               {"prompt", randomPrompt(20, 300)},
               {"max_tokens", 24},
               {"temperature", 1},
               {"seed", 42},
               {"ignore_eos", true},
               {"return_token_ids", true}};
  auto first = tokenIds(agent.post("/v1/completions", body));
  auto second = tokenIds(agent.post("/v1/completions", body));
  EXPECT_EQ(first, second);
  body["seed"] = 43;
  EXPECT_NE(tokenIds(agent.post("/v1/completions", body)), first);
}

struct BadCase {
  std::string path;
  std::string body;
  int status;
  std::string type;
  std::string param;
  std::string message_part;
};

TEST(Server, BadInputGetsClearErrorsAndServingContinues) {
  Agent agent;
  const std::vector<BadCase> cases = {
      {"/v1/completions", "{not json", 400, "invalid_request_error", "", "not valid JSON"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":"ten"})", 400,
       "invalid_request_error", "max_tokens", "max_tokens"},
      {"/v1/completions", R"({"model":"other","prompt":"hi"})", 404, "not_found_error", "model",
       "other"},
      {"/v1/completions", R"({"model":"tiny","prompt":""})", 400, "invalid_request_error", "prompt",
       "prompt must not be empty"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":0})", 400,
       "invalid_request_error", "max_tokens", "max_tokens must be at least 1, got 0"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","temperature":3.5})", 400,
       "invalid_request_error", "temperature", "temperature must be between 0 and 2, got 3.5"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","top_p":0})", 400,
       "invalid_request_error", "top_p", "top_p"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":100000})", 400,
       "invalid_request_error", "max_tokens", "exceeds max_model_len (512)"},
      {"/v1/chat/completions", R"({"model":"tiny","messages":[]})", 400, "invalid_request_error",
       "messages", "messages"},
      // A first-come-first-served agent takes priority 0 only.
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","priority":3})", 400,
       "invalid_request_error", "priority",
       "priority must be 0 on an agent that serves first come, first served, got 3 (start the "
       "agent with --scheduling-policy priority"},
  };
  for (const BadCase& c : cases) {
    auto res = agent.client()->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << c.body;
    EXPECT_EQ(res->status, c.status) << c.body << " → " << res->body;
    json error = json::parse(res->body).at("error");
    EXPECT_EQ(error["type"], c.type) << c.body;
    if (!c.param.empty()) {
      EXPECT_EQ(error["param"], c.param) << c.body;
    }
    EXPECT_NE(error["message"].get<std::string>().find(c.message_part), std::string::npos)
        << c.body << " → " << error["message"];
  }
  // Long prompt: more tokens than the context.
  int status = 0;
  json too_long = agent.post("/v1/completions", greedy(randomPrompt(600, 5), 4), &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(too_long["error"]["message"].get<std::string>().find("512"), std::string::npos)
      << too_long.dump();
  // Still serving.
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", greedy(randomPrompt(10, 6), 3))).size(), 3u);
}

// A KV cache holding fewer tokens than max_model_len (24 blocks of 16: 384
// of 512) bounds each request as max_model_len does: the agent says so at
// start, a request without max_tokens generates up to the cache's end, and
// one asking more is a 400 naming max_tokens and the most it may be. Before,
// a request without max_tokens got a 400 it could not act on (its default
// of 512 minus the prompt needed more blocks than the agent has, param null).
TEST(Server, AKvCacheSmallerThanMaxModelLenBoundsEachRequest) {
  Agent agent({"--num-blocks", "24"});
  EXPECT_NE(agent.stderrText().find("the KV cache holds 384 tokens (24 blocks of 16), fewer than "
                                    "max_model_len 512"),
            std::string::npos)
      << agent.stderrText();
  json body = greedy(randomPrompt(100, 71), 1);
  body.erase("max_tokens");
  int status = 0;
  const json whole = agent.post("/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["usage"]["completion_tokens"], 284);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  body["max_tokens"] = 285;
  json refused = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "max_tokens");
  EXPECT_EQ(refused["error"]["message"],
            "prompt (100 tokens) + max_tokens (285) exceeds what this agent's KV cache holds (384 "
            "tokens); max_tokens can be at most 284 for this prompt");
  refused = agent.post("/v1/completions", greedy(randomPrompt(384, 72), 1), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "prompt");
  EXPECT_EQ(refused["error"]["message"],
            "prompt is 384 tokens, but this agent's KV cache holds 384 tokens; at most 383 prompt "
            "tokens leave room for one generated token");
}

// TANDEM_LOG_LEVEL is read in any case ("WARNING" as Python writes it);
// a value that is no level is said on stderr and info is kept (it was
// taken silently as info).
TEST(Server, ALogLevelThatIsNoLevelIsSaid) {
  Agent bogus({}, tinyModelDir(), {{"TANDEM_LOG_LEVEL", "verbose"}});
  EXPECT_NE(bogus.stderrText().find("W TANDEM_LOG_LEVEL \"verbose\" is not a level (accepted: "
                                    "debug, info, warn, error): logging at info"),
            std::string::npos)
      << bogus.stderrText();
  EXPECT_NE(bogus.stderrText().find("] serving tiny"), std::string::npos) << bogus.stderrText();
  Agent quiet({}, tinyModelDir(), {{"TANDEM_LOG_LEVEL", "WARNING"}});
  EXPECT_EQ(quiet.stderrText().find("is not a level"), std::string::npos) << quiet.stderrText();
  EXPECT_EQ(quiet.stderrText().find("] serving tiny"), std::string::npos) << quiet.stderrText();
}

TEST(Server, OverloadIsRefusedWithRetryAfter) {
  Agent agent({"--max-num-seqs", "1", "--max-waiting-requests", "1"});
  std::vector<int> statuses(6);
  std::vector<std::string> retry_after(6);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      auto res = agent.client()->Post("/v1/completions", greedy(randomPrompt(30, i), 300).dump(),
                                      "application/json");
      statuses[i] = res ? res->status : -1;
      if (res) retry_after[i] = res->get_header_value("Retry-After");
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (int i = 0; i < 6; ++i) {
    if (statuses[i] == 200) ++ok;
    if (statuses[i] == 503) {
      ++refused;
      EXPECT_EQ(retry_after[i], "1");
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1) << "six concurrent requests against one running + one waiting slot";
  EXPECT_EQ(ok + refused, 6);
}

// Streams `body` from `agent` and goes away after its third chunk, as a
// client that leaves does; returns the chunks read.
int leaveAfterThreeChunks(const Agent& agent, json body) {
  body["stream"] = true;
  int chunks = 0;
  auto client = agent.client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  client->send(req);  // returns once the receiver cancels
  client.reset();     // closes the connection
  return chunks;
}

TEST(Server, ClientDisconnectMidStreamFreesEverything) {
  Agent agent({"--num-blocks", "64"}, smallModelDir());
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == 64; }));
  EXPECT_GE(leaveAfterThreeChunks(agent, greedy(randomPrompt(50, 7), 900)), 3);
  EXPECT_TRUE(eventually([&] {
    return agent.metric("tandem_num_requests_running") == 0 &&
           agent.metric("tandem_kv_cache_free_blocks") == 64;
  })) << agent.metricsText();
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"abort\""), 1);
  // And the server still serves.
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", greedy(randomPrompt(10, 8), 3))).size(), 3u);
}

// A batch of prompts streamed (two prompts, two choices each) whose client
// leaves: every candidate is aborted and every block freed.
TEST(Server, ClientLeavingABatchedStreamFreesEveryCandidate) {
  Agent agent({"--num-blocks", "128"}, smallModelDir());
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == 128; }));
  json body = greedy({1}, 900);
  body["prompt"] = {randomPrompt(50, 9), randomPrompt(30, 10)};
  body["n"] = 2;
  body["temperature"] = 1.0;
  body["seed"] = 3;
  EXPECT_GE(leaveAfterThreeChunks(agent, body), 3);
  EXPECT_TRUE(eventually([&] {
    return agent.metric("tandem_num_requests_running") == 0 &&
           agent.metric("tandem_num_requests_waiting") == 0 &&
           agent.metric("tandem_kv_cache_free_blocks") == 128;
  })) << agent.metricsText();
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"abort\""), 4);
}

TEST(Server, CurlStreamIsStrictServerSentEvents) {
  Agent agent;
  TempDir dir("tandem-curl");
  json body = greedy(randomPrompt(12, 9), 6);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::string command = "curl -sS -N -H 'Content-Type: application/json' -d '" + body.dump() +
                        "' http://127.0.0.1:" + std::to_string(agent.port()) +
                        "/v1/completions > " + (dir.path() / "out").string();
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string out = tandem::testing::readFile(dir.path() / "out");
  // Strict framing: only "data: <payload>\n\n" events, the last one [DONE].
  size_t pos = 0;
  std::vector<std::string> payloads;
  while (pos < out.size()) {
    ASSERT_EQ(out.compare(pos, 6, "data: "), 0) << "event does not start with 'data: ' at " << pos;
    size_t end = out.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << "unterminated event";
    payloads.push_back(out.substr(pos + 6, end - pos - 6));
    ASSERT_EQ(payloads.back().find('\n'), std::string::npos);
    pos = end + 2;
  }
  ASSERT_GE(payloads.size(), 3u);
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::vector<int> streamed_ids;
  std::string finish;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    json chunk = json::parse(payloads[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    if (!chunk["choices"].empty()) {
      for (int id : chunk["choices"][0].value("token_ids", std::vector<int>{}))
        streamed_ids.push_back(id);
      if (chunk["choices"][0]["finish_reason"].is_string())
        finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "length");
  json usage = json::parse(payloads[payloads.size() - 2])["usage"];
  EXPECT_EQ(usage["completion_tokens"], 6);
  EXPECT_EQ(usage["prompt_tokens"], 12);
  json whole = agent.post("/v1/completions", greedy(randomPrompt(12, 9), 6));
  EXPECT_EQ(streamed_ids, tokenIds(whole)) << "streamed and whole responses differ";
}

TEST(Server, MetricsPassPromtoolAndLatencyHistogramsMove) {
  Agent agent;
  const double ttft_before = agent.metric("tandem_time_to_first_token_seconds_count");
  const double itl_before = agent.metric("tandem_inter_token_latency_seconds_count");
  const double generated_before = agent.metric("tandem_generation_tokens_total");
  for (uint32_t i = 0; i < 3; ++i)
    agent.post("/v1/completions", greedy(randomPrompt(10, 400 + i), 5));
  EXPECT_EQ(agent.metric("tandem_time_to_first_token_seconds_count") - ttft_before, 3);
  EXPECT_EQ(agent.metric("tandem_inter_token_latency_seconds_count") - itl_before, 3 * 4);
  EXPECT_EQ(agent.metric("tandem_generation_tokens_total") - generated_before, 15);
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"length\""), 3);

  TempDir dir("tandem-promtool");
  {
    std::ofstream file(dir.path() / "metrics.txt");
    file << agent.metricsText();
  }
  std::string command = "promtool check metrics < " + (dir.path() / "metrics.txt").string() +
                        " > " + (dir.path() / "promtool.out").string() + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0)
      << tandem::testing::readFile(dir.path() / "promtool.out");
}

// Sends SIGTERM once a long stream has started: the stream must end
// normally and the agent exit 0.
void expectSigtermFinishesTheStream(Agent& agent) {
  json body = greedy(randomPrompt(20, 10), 480);
  body["stream"] = true;
  std::mutex mutex;
  std::string received;
  std::thread client([&] {
    auto c = agent.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      received.append(data, length);
      return true;
    };
    c->send(req);
  });
  // Signal as soon as the stream has started.
  const bool started = eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return received.find("data: ") != std::string::npos;
  });
  agent.process().signal(SIGTERM);
  client.join();
  EXPECT_TRUE(started);
  EXPECT_EQ(agent.process().wait(std::chrono::seconds(30)), 0) << agent.process().stderrText();
  EXPECT_NE(received.find("\"finish_reason\":\"length\""), std::string::npos)
      << "the in-flight stream must end normally within the drain deadline";
  EXPECT_NE(received.find("data: [DONE]"), std::string::npos);
}

TEST(Server, SigtermFinishesInFlightStreamsAndExits) {
  Agent agent;
  expectSigtermFinishesTheStream(agent);
}

// `--threads` before `serve` (as the operator writes it) starts the kernel
// threads before serve blocks the termination signals: they must be
// blocked first, or the kernel hands SIGTERM to a kernel thread, whose
// default action ends the process without a drain.
TEST(Server, SigtermDrainsWithKernelThreadsNamedBeforeServe) {
  Agent agent({}, tinyModelDir(), {}, {"--threads", "3"});
  expectSigtermFinishesTheStream(agent);
}

// A model's generation_config.json: its end-of-sequence ids end answers
// (Qwen2.5/Qwen3 instruct list <|endoftext|> only there), and its sampling
// and max_new_tokens are the defaults of requests that leave them out,
// unless --generation-config vllm; /v1/models says which apply.
TEST(Server, GenerationConfigEndsAnswersAndGivesTheDefaults) {
  tandem::testing::TempDir dir("tandem-generation-config");
  const fs::path model = dir.path() / "model";
  fs::copy(tinyModelDir(), model, fs::copy_options::recursive);
  constexpr int kExtraEos = 300;
  tandem::testing::writeFile(
      model / "generation_config.json",
      json{{"eos_token_id", {kExtraEos}}, {"max_new_tokens", 5}, {"temperature", 0.0}}.dump());
  json forced = {{"model", "tiny"},
                 {"prompt", randomPrompt(10, 3)},
                 {"max_tokens", 8},
                 {"temperature", 0},
                 {"logit_bias", {{std::to_string(kExtraEos), 100}}}};
  json defaulted = {{"model", "tiny"}, {"prompt", randomPrompt(10, 4)}, {"ignore_eos", true}};
  {
    Agent agent({}, model);
    json stopped = agent.post("/v1/completions", forced);
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop") << stopped;
    EXPECT_EQ(stopped["usage"]["completion_tokens"], 1) << stopped;
    json answer = agent.post("/v1/completions", defaulted);
    EXPECT_EQ(answer["usage"]["completion_tokens"], 5) << "max_new_tokens: " << answer;
    auto res = agent.client()->Get("/v1/models");
    ASSERT_TRUE(res);
    const json advertised = json::parse(res->body)["data"][0]["tandem"]["generation_defaults"];
    EXPECT_EQ(advertised, (json{{"max_new_tokens", 5}, {"temperature", 0.0}})) << advertised;
  }
  {
    Agent agent({"--generation-config", "vllm"}, model);
    json stopped = agent.post("/v1/completions", forced);
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop") << "end ids are read either way";
    json answer = agent.post("/v1/completions", defaulted);
    EXPECT_GT(answer["usage"]["completion_tokens"].get<int>(), 5) << answer;
  }
  {
    Agent agent({}, tinyModelDir());
    json runs_on = agent.post("/v1/completions", forced);
    EXPECT_EQ(runs_on["choices"][0]["finish_reason"], "length") << runs_on;
  }
}

TEST(Server, StopConditionsEndGenerationWhereAsked) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(15, 11);
  const std::vector<int> free_run = tokenIds(agent.post("/v1/completions", greedy(prompt, 16)));
  ASSERT_EQ(free_run.size(), 16u);

  // stop_token_ids: ends at the first occurrence of the 6th token, which is
  // reported but not part of the text.
  json body = greedy(prompt, 16);
  body["stop_token_ids"] = {free_run[5]};
  json stopped = agent.post("/v1/completions", body);
  auto first_at = std::find(free_run.begin(), free_run.end(), free_run[5]) - free_run.begin();
  EXPECT_EQ(tokenIds(stopped).size(), static_cast<size_t>(first_at + 1));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  // vLLM's stop_reason names it; include_stop_str_in_output adds its text.
  EXPECT_EQ(stopped["choices"][0]["stop_reason"], free_run[5]);
  body["include_stop_str_in_output"] = true;
  json with_token = agent.post("/v1/completions", body);
  body.erase("include_stop_str_in_output");
  json detok = agent.post("/detokenize", {{"model", "tiny"}, {"tokens", {free_run[5]}}});
  EXPECT_EQ(with_token["choices"][0]["text"].get<std::string>(),
            stopped["choices"][0]["text"].get<std::string>() + detok["prompt"].get<std::string>());
  EXPECT_EQ(json(agent.post("/v1/completions", greedy(prompt, 2)))["choices"][0]["stop_reason"],
            nullptr)
      << "a length limit has none";

  // min_tokens keeps generating past that stop token.
  body["min_tokens"] = 12;
  const std::vector<int> at_least = tokenIds(agent.post("/v1/completions", body));
  ASSERT_GE(at_least.size(), 12u);
  EXPECT_EQ(std::vector<int>(free_run.begin(), free_run.begin() + first_at),
            std::vector<int>(at_least.begin(), at_least.begin() + first_at));
  EXPECT_EQ(std::find(at_least.begin(), at_least.begin() + 12, free_run[5]), at_least.begin() + 12)
      << "the stop token is masked until min_tokens";

  // A stop string cuts the text before it.
  json text_run = agent.post("/v1/completions", greedy(prompt, 16));
  const std::string text = text_run["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  json with_stop = greedy(prompt, 16);
  with_stop["stop"] = stop;
  json cut = agent.post("/v1/completions", with_stop);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(cut["choices"][0]["stop_reason"], stop);
  // include_stop_str_in_output (vLLM's): the text ends with the stop string,
  // streamed or not.
  with_stop["include_stop_str_in_output"] = true;
  json kept = agent.post("/v1/completions", with_stop);
  EXPECT_EQ(kept["choices"][0]["text"], text.substr(0, text.find(stop) + stop.size()));
  EXPECT_EQ(kept["choices"][0]["finish_reason"], "stop");
  with_stop["stream"] = true;
  auto streamed = agent.client()->Post("/v1/completions", with_stop.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string joined;
  std::istringstream events(streamed->body);
  for (std::string line; std::getline(events, line);) {
    if (!line.starts_with("data: {")) continue;
    joined += json::parse(line.substr(6))["choices"][0].value("text", "");
  }
  EXPECT_EQ(joined, text.substr(0, text.find(stop) + stop.size()));
}

TEST(Server, LogprobsMatchTheGreedyChoice) {
  Agent agent;
  json body = greedy(randomPrompt(12, 12), 5);
  body["logprobs"] = 3;
  json out = agent.post("/v1/completions", body);
  const json& logprobs = out["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const json& top = logprobs["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u);
    double best = -1e30;
    for (const auto& [token, value] : top.items()) best = std::max(best, value.get<double>());
    // Greedy picks the most likely token: its logprob is the best of the top 3.
    EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][i].get<double>(), best) << "token " << i;
    EXPECT_LE(best, 0.0);
  }
  // As vLLM and OpenAI list them, best first (read keeping the keys' order),
  // whole and streamed, n = 1 and n = 2.
  auto expectBestFirst = [](const nlohmann::ordered_json& choice, const std::string& what) {
    for (const auto& top : choice["logprobs"]["top_logprobs"]) {
      double previous = 1.0;
      for (const auto& [token, value] : top.items()) {
        EXPECT_LE(value.get<double>(), previous) << what << ": " << top.dump();
        previous = value.get<double>();
      }
    }
  };
  for (int n : {1, 2}) {
    body["n"] = n;
    body["temperature"] = 1;
    body["stream"] = false;
    auto res = agent.client()->Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    for (const auto& choice : nlohmann::ordered_json::parse(res->body)["choices"]) {
      expectBestFirst(choice, "whole, n = " + std::to_string(n));
    }
    body["stream"] = true;
    res = agent.client()->Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    std::istringstream events(res->body);
    for (std::string line; std::getline(events, line);) {
      if (!line.starts_with("data: {")) continue;
      const auto chunk = nlohmann::ordered_json::parse(line.substr(6));
      for (const auto& choice : chunk["choices"]) {
        if (choice.contains("logprobs") && !choice["logprobs"].is_null()) {
          expectBestFirst(choice, "streamed, n = " + std::to_string(n));
        }
      }
    }
  }
}

// vLLM's return_tokens_as_token_ids (request field) and
// --return-tokens-as-token-ids (the server's default): logprobs name each
// token "token_id:<id>", the sampled one's id being the token_ids entry;
// the values are those of the text form. A request's false overrides the
// server's default.
TEST(Server, ReturnTokensAsTokenIdsNamesTokensByTheirIds) {
  Agent plain;
  Agent by_id({"--return-tokens-as-token-ids"});
  json body = greedy(randomPrompt(12, 21), 4);
  body["logprobs"] = 2;
  const json as_text = plain.post("/v1/completions", body);
  body["return_tokens_as_token_ids"] = true;
  const json asked = plain.post("/v1/completions", body);
  body.erase("return_tokens_as_token_ids");
  const json by_default = by_id.post("/v1/completions", body);
  for (const json* out : {&asked, &by_default}) {
    const json& choice = (*out)["choices"][0];
    const std::vector<int> ids = tokenIds(*out);
    ASSERT_EQ(ids, tokenIds(as_text));
    ASSERT_EQ(choice["logprobs"]["tokens"].size(), ids.size()) << out->dump();
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(choice["logprobs"]["tokens"][i], "token_id:" + std::to_string(ids[i]));
      EXPECT_EQ(choice["logprobs"]["token_logprobs"][i],
                as_text["choices"][0]["logprobs"]["token_logprobs"][i]);
      for (const auto& [name, value] : choice["logprobs"]["top_logprobs"][i].items()) {
        EXPECT_TRUE(std::regex_match(name, std::regex("token_id:[0-9]+"))) << name;
      }
    }
  }
  body["return_tokens_as_token_ids"] = false;
  EXPECT_EQ(by_id.post("/v1/completions", body)["choices"][0]["logprobs"]["tokens"],
            as_text["choices"][0]["logprobs"]["tokens"]);

  const json chat =
      by_id.post("/v1/chat/completions", {{"model", "tiny"},
                                          {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                          {"max_tokens", 3},
                                          {"temperature", 0},
                                          {"logprobs", true},
                                          {"top_logprobs", 2},
                                          {"return_token_ids", true}});
  const json& content = chat["choices"][0]["logprobs"]["content"];
  const std::vector<int> ids = tokenIds(chat);
  ASSERT_EQ(content.size(), ids.size()) << chat.dump();
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(content[i]["token"], "token_id:" + std::to_string(ids[i]));
    for (const json& top : content[i]["top_logprobs"]) {
      EXPECT_TRUE(std::regex_match(top["token"].get<std::string>(), std::regex("token_id:[0-9]+")))
          << top.dump();
    }
  }
  int status = 0;
  body["return_tokens_as_token_ids"] = "yes";
  const json refused = plain.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "return_tokens_as_token_ids") << refused.dump();
}

TEST(Server, ChatCompletionsWholeAndStreamedAgree) {
  Agent agent;
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Tell me about the sea."}}}},
               {"max_tokens", 8},
               {"temperature", 0},
               {"ignore_eos", true},
               {"return_token_ids", true}};
  json whole = agent.post("/v1/chat/completions", body);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 8);
  body["stream"] = true;
  auto res = agent.client()->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::string content;
  std::vector<int> ids;
  std::istringstream events(res->body);
  std::string line;
  while (std::getline(events, line)) {
    if (line.rfind("data: {", 0) != 0) continue;
    json chunk = json::parse(line.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"];
    for (int id : choice.value("token_ids", std::vector<int>{})) ids.push_back(id);
  }
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(ids, tokenIds(whole));
}

// Streamed chunks as (token ids, text or content) pairs, and the usage.
struct StreamedAnswer {
  std::vector<std::vector<int>> ids;
  std::vector<std::string> texts;
  std::vector<int64_t> text_offsets;  // completions with logprobs
  json usage;
};

StreamedAnswer streamFrom(const Agent& agent, const std::string& path, const json& body) {
  auto res = agent.client()->Post(path.c_str(), body.dump(), "application/json");
  StreamedAnswer answer;
  if (!res) return answer;
  std::istringstream events(res->body);
  for (std::string line; std::getline(events, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    if (chunk.contains("error")) ADD_FAILURE() << line;
    if (chunk.contains("usage") && chunk["usage"].is_object()) answer.usage = chunk["usage"];
    if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    answer.ids.push_back(choice.value("token_ids", std::vector<int>{}));
    const json& delta = choice.contains("delta") ? choice["delta"] : choice;
    answer.texts.push_back(delta.value(choice.contains("delta") ? "content" : "text", ""));
    if (choice.contains("logprobs") && choice["logprobs"].is_object() &&
        choice["logprobs"].contains("text_offset")) {
      for (const json& offset : choice["logprobs"]["text_offset"]) {
        answer.text_offsets.push_back(offset.get<int64_t>());
      }
    }
  }
  return answer;
}

// A resumed stream's logprob text offsets are the uninterrupted stream's,
// also when the first agent held text back at the split (the start of a
// stop string: here the last character before the split, followed by a
// byte the answer never holds, so nothing stops).
TEST(Server, AResumedStreamsTextOffsetsAreTheUninterruptedOnes) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(30, 17);
  json body = greedy(prompt, 16);
  const std::vector<int> all = tokenIds(agent.post("/v1/completions", body));
  ASSERT_EQ(all.size(), 16u);
  const size_t k = 9;
  const std::string before =
      agent
          .post("/detokenize",
                {{"model", "tiny"}, {"tokens", std::vector<int>(all.begin(), all.begin() + k)}})
          .at("prompt");
  ASSERT_FALSE(before.empty());
  body["stop"] = {before.substr(before.size() - 1) + "\x01"};
  body["logprobs"] = 0;
  body["stream"] = true;
  // With echo, the uninterrupted stream's offsets begin after the prompt
  // it echoed; the resumed one, which does not echo it again, too (they
  // began at 0).
  for (const bool echo : {false, true}) {
    SCOPED_TRACE(echo ? "echo" : "no echo");
    body["echo"] = echo;
    const StreamedAnswer whole = streamFrom(agent, "/v1/completions", body);
    ASSERT_EQ(whole.text_offsets.size(), echo ? 16u + prompt.size() : 16u);
    json resumed = body;
    resumed["resume_token_ids"] = std::vector<int>(all.begin(), all.begin() + k);
    const StreamedAnswer rest = streamFrom(agent, "/v1/completions", resumed);
    EXPECT_EQ(rest.text_offsets,
              std::vector<int64_t>(whole.text_offsets.end() - (16 - k), whole.text_offsets.end()));
  }
}

// A stream resumed from the tokens another agent already sent continues it:
// the same remaining tokens and text, the whole answer in its usage, for
// completions and chat; resume_token_ids without a stream is refused.
TEST(Server, AResumedStreamContinuesTheUninterruptedOne) {
  Agent agent;
  const std::vector<int> prompt = randomPrompt(30, 17);
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me a story."}}});
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = greedy(prompt, 20);
    if (chat) {
      body.erase("prompt");
      body["messages"] = messages;
    }
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const StreamedAnswer whole = streamFrom(agent, path, body);
    std::vector<int> all;
    for (const auto& ids : whole.ids) all.insert(all.end(), ids.begin(), ids.end());
    ASSERT_EQ(all.size(), 20u);
    for (size_t k : {size_t{1}, size_t{9}, size_t{19}}) {
      SCOPED_TRACE(k);
      // What the first agent had sent when it died after k tokens.
      std::vector<int> sent;
      std::string sent_text;
      std::string rest_text;
      for (size_t i = 0; i < whole.ids.size(); ++i) {
        if (sent.size() + whole.ids[i].size() <= k) {
          sent.insert(sent.end(), whole.ids[i].begin(), whole.ids[i].end());
          sent_text += whole.texts[i];
        } else {
          rest_text += whole.texts[i];
        }
      }
      ASSERT_EQ(sent.size(), k);
      json resumed = body;
      resumed["resume_token_ids"] = sent;
      const double generated_before = agent.metric("tandem_generation_tokens_total");
      const StreamedAnswer rest = streamFrom(agent, path, resumed);
      // The agent generated the rest only: the first k are the other's.
      EXPECT_EQ(agent.metric("tandem_generation_tokens_total") - generated_before,
                static_cast<double>(20 - k));
      std::vector<int> continued;
      std::string continued_text;
      for (size_t i = 0; i < rest.ids.size(); ++i) {
        continued.insert(continued.end(), rest.ids[i].begin(), rest.ids[i].end());
        continued_text += rest.texts[i];
      }
      EXPECT_EQ(continued, std::vector<int>(all.begin() + static_cast<ptrdiff_t>(k), all.end()));
      EXPECT_EQ(continued_text, rest_text);
      EXPECT_EQ(rest.usage["completion_tokens"], 20);
      EXPECT_EQ(rest.usage["prompt_tokens"], whole.usage["prompt_tokens"]);
      // Its cached tokens are prompt tokens: the cached blocks of its
      // resumed output are not counted (they made cached_tokens exceed
      // prompt_tokens).
      EXPECT_LE(rest.usage.at("prompt_tokens_details").at("cached_tokens").get<int>(),
                rest.usage.at("prompt_tokens").get<int>());
    }
  }
  int status = 0;
  json unstreamed = greedy(prompt, 20);
  unstreamed["resume_token_ids"] = {5, 6};
  const json refused = agent.post("/v1/completions", unstreamed, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["message"], "resume_token_ids continues a stream: set stream to true");
  EXPECT_EQ(refused["error"]["param"], "resume_token_ids");
  // The engine's refusals name the field as sent.
  json full = greedy(prompt, 3);
  full["stream"] = true;
  full["resume_token_ids"] = {5, 6, 7};
  const json no_room = agent.post("/v1/completions", full, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(
      no_room["error"]["message"],
      "resume_token_ids must leave a token to generate: it holds 3 tokens and max_tokens is 3");
  EXPECT_EQ(no_room["error"]["param"], "resume_token_ids");
}

TEST(Server, KvEventsStreamReportsStoredBlocksAndResynchronises) {
  Agent agent;
  // Two full blocks of prompt, computed and registered.
  agent.post("/v1/completions", greedy(randomPrompt(40, 13), 2));
  std::mutex mutex;
  std::string received;
  auto read_events = [&](const std::string& path) {
    auto c = agent.client();
    httplib::Request req;
    req.method = "GET";
    req.path = path;
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      received.append(data, length);
      return received.find("BlockStored") == std::string::npos;  // stop after the first
    };
    c->send(req);
  };
  read_events("/v1/kv_events?since=0");
  ASSERT_NE(received.find("data: {"), std::string::npos);
  json event = json::parse(received.substr(6, received.find("\n\n") - 6));
  EXPECT_EQ(event["type"], "BlockStored");
  EXPECT_EQ(event["sequence"], 1);
  EXPECT_EQ(event["block_hashes"].size(), 2u);
  EXPECT_EQ(event["block_size"], 16);

  // A reader that claims to be ahead of the log (an agent restart) gets a snapshot.
  received.clear();
  {
    auto c = agent.client();
    httplib::Request req;
    req.method = "GET";
    req.path = "/v1/kv_events?since=1000";
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      received.append(data, length);
      return received.find("\n\n") == std::string::npos;
    };
    c->send(req);
  }
  json snapshot = json::parse(received.substr(6, received.find("\n\n") - 6));
  EXPECT_EQ(snapshot["type"], "Snapshot");
  EXPECT_EQ(snapshot["block_hashes"].size(), 2u);

  int status = 0;
  auto res = agent.client()->Get("/v1/kv_events?since=abc");
  ASSERT_TRUE(res);
  status = res->status;
  EXPECT_EQ(status, 400);
}

TEST(Server, YamlConfigAppliesAndFlagsOverrideIt) {
  TempDir dir("tandem-config");
  dir.write("agent.yaml", "num_blocks: 40\nmax-model-len: 256\nserved_model_name: from-yaml\n");
  Agent agent({"--config", (dir.path() / "agent.yaml").string(), "--max-model-len", "300"});
  auto res = agent.client()->Get("/v1/models");
  ASSERT_TRUE(res);
  json models = json::parse(res->body);
  // --served-model-name tiny (given by the test harness) overrides the file.
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 300);
  EXPECT_EQ(models["data"][0]["tandem"]["block_size"], 16);
  EXPECT_EQ(models["data"][0]["tandem"]["prefix_caching_hash"], "xxhash");
  EXPECT_FALSE(models["data"][0]["tandem"]["model_identity"].get<std::string>().empty());
  EXPECT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == 40; }));
}

// --hf-overrides: the model is read as if its config.json said so. YaRN
// over an original 128 of the tiny model's 512 positions, factor 8: 1,024
// positions served, and another model identity than without it.
TEST(Server, HfOverridesChangeTheModelAsItsConfigWould) {
  Agent plain;
  Agent yarn({"--hf-overrides", R"({"rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                    "original_max_position_embeddings": 128}})"});
  auto identity = [](Agent& agent) {
    auto res = agent.client()->Get("/v1/models");
    EXPECT_TRUE(res);
    return res ? json::parse(res->body)["data"][0] : json();
  };
  const json with = identity(yarn);
  const json without = identity(plain);
  EXPECT_EQ(without["max_model_len"], 512);
  EXPECT_EQ(with["max_model_len"], 1024);
  EXPECT_NE(with["tandem"]["model_identity"], without["tandem"]["model_identity"]);
  // A prompt past the file's 512 positions is served.
  json body = {{"model", "tiny"},
               {"prompt", std::vector<int>(600, 7)},
               {"max_tokens", 2},
               {"temperature", 0}};
  auto res = yarn.client()->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

TEST(Server, ReportsItsComputeDeviceInHealthModelsAndMetrics) {
  TempDir dir("tandem-device");
  dir.write("agent.yaml", "device: cpu\n");
  Agent agent({"--config", (dir.path() / "agent.yaml").string()});

  auto health = agent.client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json body = json::parse(health->body);
  EXPECT_EQ(body["status"], "ok");
  EXPECT_EQ(body["device"], "cpu");
  const std::string description = body["device_description"].get<std::string>();
  EXPECT_TRUE(
      std::regex_match(description, std::regex("cpu (avx512|avx2|scalar), [0-9]+ threads?")))
      << description;

  auto models = agent.client()->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["device"], "cpu");

  EXPECT_EQ(agent.metric("tandem_device_info", "device=\"cpu\""), 1);
  EXPECT_EQ(agent.metric("tandem_device_info", "description=\"" + description + "\""), 1);
}

// gpt-oss writes OpenAI's harmony format: the agent reads its chat output
// with the harmony parsers unless told otherwise, and says so in
// /v1/models (the router takes them from there). The test model's greedy
// output is plain text, outside the format: all of it is the message's
// content, the same text /v1/completions gives for the rendered prompt. A
// forced tool call is refused naming tool_choice; parsers of two formats
// stop the agent at start naming both flags.
TEST(Server, GptOssChatIsReadAsHarmonyByDefault) {
  TempDir dir("tandem-server-gpt-oss");
  tandem::tools::TestModelOptions options;
  options.architecture = "GptOssForCausalLM";
  tandem::tools::writeTestModel(options, dir.path());
  Agent agent({}, dir.path());
  auto models = agent.client()->Get("/v1/models");
  ASSERT_TRUE(models);
  const json tandem = json::parse(models->body)["data"][0]["tandem"];
  EXPECT_EQ(tandem["reasoning_parser"], "openai_gptoss");
  EXPECT_EQ(tandem["tool_call_parser"], "openai");

  const json tools = json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
  const json messages = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  int status = 0;
  const json chat = agent.post("/v1/chat/completions",
                               {{"model", "tiny"},
                                {"messages", messages},
                                {"tools", tools},
                                {"max_tokens", 12},
                                {"temperature", 0}},
                               &status);
  ASSERT_EQ(status, 200) << chat.dump();
  const json& message = chat["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content")) << message.dump();
  EXPECT_FALSE(message.contains("tool_calls")) << message.dump();
  const json tokens = agent.post(
      "/tokenize", {{"model", "tiny"}, {"messages", messages}, {"add_generation_prompt", true}},
      &status);
  ASSERT_EQ(status, 200) << tokens.dump();
  const json completion = agent.post(
      "/v1/completions",
      {{"model", "tiny"}, {"prompt", tokens["tokens"]}, {"max_tokens", 12}, {"temperature", 0}},
      &status);
  ASSERT_EQ(status, 200) << completion.dump();
  EXPECT_EQ(message["content"], completion["choices"][0]["text"]);

  const json refused = agent.post("/v1/chat/completions",
                                  {{"model", "tiny"},
                                   {"messages", messages},
                                   {"tools", tools},
                                   {"tool_choice", "required"},
                                   {"max_tokens", 4}},
                                  &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "tool_choice") << refused.dump();

  try {
    Agent mixed({"--reasoning-parser", "qwen3", "--tool-call-parser", "openai"}, dir.path());
    ADD_FAILURE() << "an agent with parsers of two formats started";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("--tool-call-parser openai and --reasoning-parser qwen3 read different "
                        "output formats"),
              std::string::npos)
        << error.what();
  }
}

// A model served with a real SentencePiece-style tokenizer (Mistral 7B's, in
// the legacy Llama format; the small preset has its 32,000 ids): /tokenize
// and /detokenize give the reference's ids and text; a chat prompt starts
// with <s> and "▁[INST]" as Mistral's does; generated text is the generated
// tokens' bytes, the first one's "▁" a space (as vLLM streams it after a
// prompt), whole characters in every streamed piece (byte-fallback tokens
// held back until their character is complete), the same streamed or not.
TEST(Server, ASentencePieceTokenizerServesTheReferenceIdsAndText) {
  const fs::path reference = fs::path(TANDEM_TEST_DATA_DIR) / "tokenizers" / "mistral";
  TempDir dir("tandem-server-test-spm");
  const fs::path model = dir.path() / "model";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(smallModelDir())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tokenizer", 0) == 0 || name == "special_tokens_map.json") continue;
    fs::copy_file(entry.path(), model / name);
  }
  fs::copy_file(reference / "tokenizer.json", model / "tokenizer.json");
  fs::copy_file(reference / "tokenizer_config.json", model / "tokenizer_config.json");
  fs::copy_file(fs::path(TANDEM_SOURCE_DIR) /
                    "tests/data/chat_templates/templates/mistralai-Mistral-7B-Instruct-v0.2.jinja",
                model / "chat_template.jinja");
  Agent agent({}, model);

  std::ifstream lines(reference / "expected.jsonl");
  std::string line;
  int index = 0;
  int checked = 0;
  while (std::getline(lines, line)) {
    const json example = json::parse(line);
    if (example["ids"].empty()) continue;
    // Every fifth line: a spread of scripts, code, spaces and specials.
    if (index++ % 5 != 0) continue;
    ++checked;
    SCOPED_TRACE(example["text"].dump());
    int status = 0;
    const json tokens = agent.post(
        "/tokenize", {{"prompt", example["text"]}, {"add_special_tokens", false}}, &status);
    ASSERT_EQ(status, 200) << tokens.dump();
    EXPECT_EQ(tokens["tokens"], example["ids"]);
    const json text = agent.post("/detokenize", {{"tokens", example["ids"]}}, &status);
    ASSERT_EQ(status, 200) << text.dump();
    EXPECT_EQ(text["prompt"], example["decoded"]);
  }
  EXPECT_GT(checked, 60);

  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json chat_ids = agent.post("/tokenize", {{"messages", messages}})["tokens"];
  ASSERT_GE(chat_ids.size(), 4u) << chat_ids.dump();
  EXPECT_EQ(std::vector<int>(chat_ids.begin(), chat_ids.begin() + 4),
            (std::vector<int>{1, 733, 16289, 28793}))
      << chat_ids.dump();

  const auto tokenizer = tandem::Tokenizer::fromDirectory(model);
  json body = {{"model", "tiny"},  {"prompt", "Once upon a time"}, {"max_tokens", 48},
               {"temperature", 0}, {"ignore_eos", true},           {"return_token_ids", true}};
  int status = 0;
  const json whole = agent.post("/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  const std::vector<int> ids = tokenIds(whole);
  ASSERT_EQ(ids.size(), 48u);
  const std::string text = whole["choices"][0]["text"];
  EXPECT_EQ(text, tokenizer->decode(std::vector<tandem::TokenId>(ids.begin(), ids.end())));
  body["stream"] = true;
  auto streamed = agent.client()->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  // (A piece that split a character would not parse: JSON text is UTF-8.)
  const StreamedCompletion stream = parseStream(streamed->body);
  EXPECT_EQ(stream.ids, ids);
  EXPECT_EQ(stream.text, text);

  // Only the byte tokens of "€" (E2 82 AC) may be chosen, sampled with a
  // seed (here: some whole "€"s among broken sequences): characters split
  // over tokens, whole or broken (U+FFFD), come out the same streamed or not.
  json bytes_body = body;
  bytes_body["stream"] = false;
  bytes_body["max_tokens"] = 48;
  bytes_body["temperature"] = 1;
  bytes_body["seed"] = 1;
  bytes_body["allowed_token_ids"] = json::array();
  for (const char* byte : {"<0xE2>", "<0x82>", "<0xAC>"}) {
    bytes_body["allowed_token_ids"].push_back(tokenizer->tokenToId(byte).value());
  }
  const json bytes_whole = agent.post("/v1/completions", bytes_body, &status);
  ASSERT_EQ(status, 200) << bytes_whole.dump();
  const std::vector<int> byte_ids = tokenIds(bytes_whole);
  EXPECT_EQ(bytes_whole["choices"][0]["text"],
            tokenizer->decode(std::vector<tandem::TokenId>(byte_ids.begin(), byte_ids.end())));
  bytes_body["stream"] = true;
  auto bytes_streamed =
      agent.client()->Post("/v1/completions", bytes_body.dump(), "application/json");
  ASSERT_TRUE(bytes_streamed);
  const StreamedCompletion bytes_stream = parseStream(bytes_streamed->body);
  EXPECT_EQ(bytes_stream.ids, byte_ids);
  EXPECT_EQ(bytes_stream.text, bytes_whole["choices"][0]["text"]);

  const json chat = agent.post(
      "/v1/chat/completions",
      {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0}}, &status);
  EXPECT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(chat["usage"]["prompt_tokens"], chat_ids.size());
}

TEST(Server, BurstOfConnectionsIsAccepted) {
  Agent agent({"--max-num-seqs", "16"});
  constexpr int kClients = 96;
  std::vector<int> statuses(kClients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", agent.port());
      c.set_read_timeout(60, 0);
      auto res =
          c.Post("/v1/completions", greedy(randomPrompt(8, 500 + i), 4).dump(), "application/json");
      statuses[i] = res ? res->status : -1;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::count(statuses.begin(), statuses.end(), 200), kClients)
      << "some connections of the burst were refused or reset";
}

}  // namespace
