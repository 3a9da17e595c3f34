// `tandem-agent serve --simulate PROFILE` as a client sees it: the same API
// checks pass against a simulated agent as against a real one (each API case
// runs on both), its steps last what the profile predicts, it says it is
// simulated, and a prefill → decode hand-off between simulated agents over
// the ucx connector gives the tokens a colocated simulated agent gives and
// lasts at least the profile's modelled link time.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <future>
#include <iomanip>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "tests/support/agent_server.h"
#include "tests/support/test_files.h"
#include "tests/support/ucx_agents.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// Fast decode steps, the tiny model's context, 512 blocks from the default
// 1 GiB (2 MiB per 16-token block); prefill at `prefill_token_s` per token.
std::string shortStepsProfile(const std::string& name, double prefill_token_s) {
  std::ostringstream out;
  out << "name: " << name << "\ndescription: short steps for API tests\nbase_s: 0.0005"
      << "\nprefill_token_s: " << prefill_token_s << "\ndecode_sequence_s: 0.0001"
      << "\nmodel:\n  vocab_size: 512\n  max_position_embeddings: 512\n"
      << "  kv_bytes_per_token: 131072\n";
  return out.str();
}
const std::string kFastProfile = shortStepsProfile("test-fast", 0.00001);

// Steps long enough to dominate scheduling noise; every term matters.
constexpr double kBase = 0.02, kPrefillToken = 0.0005, kDecodeSequence = 0.005,
                 kContextToken = 0.0002, kPrefillContext = 1e-6, kKvBlock = 0.001;

std::string timedProfile() {
  std::ostringstream out;
  out << "name: test-timed\nbase_s: " << kBase << "\nprefill_token_s: " << kPrefillToken
      << "\ndecode_sequence_s: " << kDecodeSequence << "\ncontext_token_s: " << kContextToken
      << "\nprefill_context_s: " << kPrefillContext << "\nkv_block_s: " << kKvBlock
      << "\nmodel:\n  max_position_embeddings: 512\n  kv_bytes_per_token: 131072\n";
  return out.str();
}

// A KV link slow enough to measure: a hand-off of 16 blocks of 16 tokens of
// the profile's 128 KiB (32 MiB) takes kLinkLatency + 0.5 s. Steps as in
// kFastProfile.
constexpr double kLinkBytesPerS = 67108864, kLinkLatency = 0.05;
constexpr int64_t kLinkBlocks = 16, kProfileKvBytesPerToken = 131072, kBlockTokens = 16;
// The tiny model's block, what backs each simulated one: 2 layers x K,V x 16
// tokens x 2 KV heads x 16 x bf16.
constexpr int64_t kBackingBlockBytes = 4096;

// The model's hand-off time, computed here from the formula (step_profile.h).
double modelledHandOff(int64_t blocks) {
  return kLinkLatency +
         static_cast<double>(blocks * kBlockTokens * kProfileKvBytesPerToken) / kLinkBytesPerS;
}

std::string linkProfile(double bytes_per_s) {
  std::ostringstream out;
  out << std::setprecision(17)
      << "name: test-link\nbase_s: 0.0005\nprefill_token_s: 0.00001\ndecode_sequence_s: 0.0001"
      << "\nkv_link_bytes_per_s: " << bytes_per_s << "\nkv_link_latency_s: " << kLinkLatency
      << "\nmodel:\n  vocab_size: 512\n  max_position_embeddings: 512\n  kv_bytes_per_token: "
      << kProfileKvBytesPerToken << "\n";
  return out.str();
}

const fs::path& profileFile(const std::string& name, const std::string& text) {
  static TempDir dir("tandem-sim-profiles");
  static std::map<std::string, fs::path> written;
  auto it = written.find(name);
  if (it == written.end()) {
    dir.write(name, text);
    it = written.emplace(name, dir.path() / name).first;
  }
  return it->second;
}

std::vector<std::string> simulated(std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--simulate", profileFile("fast.yaml", kFastProfile).string()});
  return extra;
}

// Each case on a real agent (false) and a simulated one (true).
class AgentApi : public ::testing::TestWithParam<bool> {
 protected:
  std::vector<std::string> flags(std::vector<std::string> extra = {}) const {
    return GetParam() ? simulated(std::move(extra)) : extra;
  }
};

TEST_P(AgentApi, ConcurrentRequestsEqualSoloRunsWithUsage) {
  Agent agent(flags());
  std::vector<json> bodies;
  for (uint32_t i = 0; i < 6; ++i) bodies.push_back(greedy(randomPrompt(5 + 9 * i, i), 12));
  std::vector<std::vector<int>> solo;
  for (size_t i = 0; i < bodies.size(); ++i) {
    json out = agent.post("/v1/completions", bodies[i]);
    EXPECT_EQ(out["object"], "text_completion");
    EXPECT_EQ(out["usage"]["prompt_tokens"], 5 + 9 * i);
    EXPECT_EQ(out["usage"]["completion_tokens"], 12);
    EXPECT_EQ(out["usage"]["total_tokens"], 5 + 9 * i + 12);
    EXPECT_EQ(out["choices"][0]["finish_reason"], "length");
    solo.push_back(tokenIds(out));
  }
  const std::vector<std::vector<int>> together = postConcurrently(agent, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    ASSERT_EQ(solo[i].size(), 12u);
    EXPECT_EQ(together[i], solo[i]) << "request " << i << " changed when batched";
  }
}

TEST_P(AgentApi, PrefixCacheHitComputesOnlyTheRestAndMatchesAMiss) {
  Agent agent(flags());
  std::vector<int> prefix = randomPrompt(160, 100);
  std::vector<int> first = prefix, second = prefix;
  for (int id : randomPrompt(7, 101)) first.push_back(id);
  for (int id : randomPrompt(9, 102)) second.push_back(id);
  agent.post("/v1/completions", greedy(first, 4));
  const double computed_before = agent.metric("tandem_computed_tokens_total");
  json hit = agent.post("/v1/completions", greedy(second, 4));
  EXPECT_EQ(hit["usage"]["prompt_tokens_details"]["cached_tokens"], 160);
  EXPECT_EQ(agent.metric("tandem_computed_tokens_total") - computed_before, 9 + 3);
  json miss_body = greedy(second, 4);
  miss_body["cache_salt"] = "another-tenant";
  json miss = agent.post("/v1/completions", miss_body);
  EXPECT_EQ(miss["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(tokenIds(miss), tokenIds(hit));
}

TEST_P(AgentApi, SameSeedSameTokens) {
  Agent agent(flags());
  json body = {{"model", "tiny"},
               {"prompt", randomPrompt(20, 300)},
               {"max_tokens", 24},
               {"temperature", 1},
               {"seed", 42},
               {"ignore_eos", true},
               {"return_token_ids", true}};
  auto first = tokenIds(agent.post("/v1/completions", body));
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", body)), first);
  body["seed"] = 43;
  EXPECT_NE(tokenIds(agent.post("/v1/completions", body)), first);
}

TEST_P(AgentApi, BadInputGetsClearErrorsAndServingContinues) {
  Agent agent(flags());
  struct Case {
    std::string path, body;
    int status;
    std::string param, message_part;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "", "not valid JSON"},
      {"/v1/completions", R"({"model":"other","prompt":"hi"})", 404, "model", "other"},
      {"/v1/completions", R"({"model":"tiny","prompt":""})", 400, "prompt",
       "prompt must not be empty"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":0})", 400, "max_tokens",
       "max_tokens must be at least 1, got 0"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","temperature":3.5})", 400, "temperature",
       "temperature must be between 0 and 2, got 3.5"},
      {"/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":100000})", 400,
       "max_tokens", "exceeds max_model_len (512)"},
      {"/v1/chat/completions", R"({"model":"tiny","messages":[]})", 400, "messages", "messages"},
  };
  for (const Case& c : cases) {
    auto res = agent.client()->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << c.body;
    EXPECT_EQ(res->status, c.status) << c.body << " → " << res->body;
    json error = json::parse(res->body).at("error");
    if (!c.param.empty()) {
      EXPECT_EQ(error["param"], c.param) << c.body;
    }
    EXPECT_NE(error["message"].get<std::string>().find(c.message_part), std::string::npos)
        << c.body << " → " << error["message"];
  }
  int status = 0;
  // Structured outputs: a real agent follows the constraint; a simulated
  // one, whose tokens follow its profile, refuses it with 501.
  json choice = agent.post(
      "/v1/completions",
      json{
          {"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 8}, {"guided_choice", {"yes", "no"}}},
      &status);
  if (GetParam()) {
    EXPECT_EQ(status, 501) << choice.dump();
    EXPECT_NE(choice["error"]["message"].get<std::string>().find("not simulated"),
              std::string::npos);
  } else {
    EXPECT_EQ(status, 200) << choice.dump();
    EXPECT_TRUE(choice["choices"][0]["text"] == "yes" || choice["choices"][0]["text"] == "no");
  }
  // Prompt logprobs need logits: the same.
  json prompt_logprobs = agent.post(
      "/v1/completions",
      json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}, {"prompt_logprobs", 1}},
      &status);
  if (GetParam()) {
    EXPECT_EQ(status, 501) << prompt_logprobs.dump();
    EXPECT_NE(prompt_logprobs["error"]["message"].get<std::string>().find("not simulated"),
              std::string::npos);
  } else {
    EXPECT_EQ(status, 200) << prompt_logprobs.dump();
    EXPECT_TRUE(prompt_logprobs["choices"][0]["prompt_logprobs"][0].is_null());
  }
  json too_long = agent.post("/v1/completions", greedy(randomPrompt(600, 5), 4), &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(too_long["error"]["message"].get<std::string>().find("512"), std::string::npos);
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", greedy(randomPrompt(10, 6), 3))).size(), 3u);
}

TEST_P(AgentApi, StopConditionsEndGenerationWhereAsked) {
  Agent agent(flags());
  const std::vector<int> prompt = randomPrompt(15, 11);
  const std::vector<int> free_run = tokenIds(agent.post("/v1/completions", greedy(prompt, 16)));
  ASSERT_EQ(free_run.size(), 16u);
  json body = greedy(prompt, 16);
  body["stop_token_ids"] = {free_run[5]};
  json stopped = agent.post("/v1/completions", body);
  auto first_at = std::find(free_run.begin(), free_run.end(), free_run[5]) - free_run.begin();
  EXPECT_EQ(tokenIds(stopped).size(), static_cast<size_t>(first_at + 1));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  body["min_tokens"] = 12;
  const std::vector<int> at_least = tokenIds(agent.post("/v1/completions", body));
  ASSERT_GE(at_least.size(), 12u);
  EXPECT_EQ(std::find(at_least.begin(), at_least.begin() + 12, free_run[5]), at_least.begin() + 12)
      << "the stop token is masked until min_tokens";

  const std::string text = agent.post("/v1/completions", greedy(prompt, 16))["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  json with_stop = greedy(prompt, 16);
  with_stop["stop"] = stop;
  json cut = agent.post("/v1/completions", with_stop);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_P(AgentApi, LogprobsReportTheChosenTokenFirst) {
  Agent agent(flags());
  json body = greedy(randomPrompt(12, 12), 5);
  body["logprobs"] = 3;
  const json out = agent.post("/v1/completions", body);
  const json& logprobs = out["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    double best = -1e30;
    for (const auto& [token, value] : logprobs["top_logprobs"][i].items()) {
      best = std::max(best, value.get<double>());
    }
    EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][i].get<double>(), best) << "token " << i;
    EXPECT_LE(best, 0.0);
  }
}

TEST_P(AgentApi, ChatCompletionsWholeAndStreamedAgree) {
  Agent agent(flags());
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
  body["stream_options"] = {{"include_usage", true}};
  auto res = agent.client()->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::string content;
  std::vector<int> ids;
  json usage;
  std::istringstream events(res->body);
  std::string line;
  while (std::getline(events, line)) {
    if (line.rfind("data: {", 0) != 0) continue;
    json chunk = json::parse(line.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage") && chunk["usage"].is_object()) usage = chunk["usage"];
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"];
    for (int id : choice.value("token_ids", std::vector<int>{})) ids.push_back(id);
  }
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(ids, tokenIds(whole));
  EXPECT_EQ(usage["completion_tokens"], 8) << usage.dump();
  EXPECT_NE(res->body.find("data: [DONE]"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(RealAndSimulated, AgentApi, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "simulated" : "real"; });

TEST(SimulatedAgent, SaysItIsSimulatedAndWithWhichProfile) {
  Agent agent(simulated());
  auto health = agent.client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json body = json::parse(health->body);
  EXPECT_EQ(body["device"], "cpu");
  const std::string description = body["device_description"];
  EXPECT_EQ(description, "simulated (profile test-fast; KV blocks in cpu memory)");
  EXPECT_EQ(agent.metric("tandem_device_info", "description=\"" + description + "\""), 1);
  EXPECT_EQ(body["simulated"], "test-fast");
  EXPECT_EQ(agent.metric("tandem_simulated_info", "profile=\"test-fast\""), 1);
  // 1 GiB of the profile's 2 MiB blocks.
  EXPECT_EQ(agent.metric("tandem_kv_cache_free_blocks"), 512);
}

TEST(SimulatedAgent, AProfileThatDoesNotParseStopsTheAgentNamingIt) {
  TempDir dir("tandem-sim-bad");
  dir.write("bad.yaml", "name: x\nbase_s: -1\n");
  std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-agent",
                                   "serve",
                                   "--model",
                                   tinyModelDir().string(),
                                   "--port",
                                   "0",
                                   "--simulate",
                                   (dir.path() / "bad.yaml").string()};
  ChildProcess process(argv, dir.path() / "stderr");
  EXPECT_NE(process.wait(std::chrono::seconds(30)), 0);
  const std::string err = process.stderrText();
  EXPECT_NE(err.find("--simulate"), std::string::npos) << err;
  EXPECT_NE(err.find("base_s"), std::string::npos) << err;
}

// The profile's prediction for a step, computed here from the formula
// (step_profile.h) rather than by the agent's code.
double predicted(int64_t prefill_tokens, int64_t prefill_products, int64_t decode_sequences,
                 int64_t context, int64_t blocks) {
  return kBase + kPrefillToken * prefill_tokens + kPrefillContext * prefill_products +
         kDecodeSequence * decode_sequences + kContextToken * context + kKvBlock * blocks;
}

TEST(SimulatedAgent, StepTimesFollowTheProfile) {
  Agent agent({"--simulate", profileFile("timed.yaml", timedProfile()).string()});
  const int64_t prompt = 40, generated = 12, block = 16;
  json out = agent.post("/v1/completions", greedy(randomPrompt(prompt, 7), generated));
  ASSERT_EQ(tokenIds(out).size(), static_cast<size_t>(generated));
  // Step 1: the whole prompt, sampling the first token.
  const double prefill_predicted =
      predicted(prompt, prompt * prompt, 0, 0, (prompt + block - 1) / block);
  // Steps 2..12: one decode token each at position prompt + k - 2.
  double decode_predicted = 0;
  for (int64_t k = 2; k <= generated; ++k) {
    const int64_t attended = prompt + k - 1;
    decode_predicted += predicted(0, 0, 1, attended, (attended + block - 1) / block);
  }
  // Engine-side stage times: first scheduled → first token, first → last.
  EXPECT_TRUE(
      eventually([&] { return agent.metric("tandem_request_decode_time_seconds_count") == 1; }));
  const double prefill_observed = agent.metric("tandem_request_prefill_time_seconds_sum");
  const double decode_observed = agent.metric("tandem_request_decode_time_seconds_sum");
  EXPECT_GE(prefill_observed, prefill_predicted);
  EXPECT_LT(prefill_observed, prefill_predicted * 1.5 + 0.05);
  EXPECT_GE(decode_observed, decode_predicted);
  EXPECT_LT(decode_observed, decode_predicted * 1.5 + 0.05);
}

// A prefill step of a 200-token prompt takes 2 s: long enough for the
// test to fill the queue, or drain the agent, while it runs.
const std::string kSlowPrefillProfile = shortStepsProfile("test-slow-prefill", 0.01);

// A request with n > 1 adds its later choices once the first has computed
// the prompt. They join an admitted request: neither a full agent (their
// places kept for them) nor a drain that began meanwhile refuses them (both used
// to end the request with a 503 after its first choice's work, counted as
// an abort, while requests that came later were served).
TEST(SimulatedAgent, LaterChoicesOfAnAdmittedRequestAreNotRefused) {
  const std::vector<std::string> flags = {
      "--simulate",
      profileFile("slow-prefill.yaml", kSlowPrefillProfile).string(),
      "--max-num-seqs",
      "1",
      "--max-waiting-requests",
      "2"};
  json two = greedy(randomPrompt(200, 41), 3);
  two["n"] = 2;
  for (const bool drain : {false, true}) {
    SCOPED_TRACE(drain ? "drain" : "queue full");
    // Draining, the prompt is prefilled in 40-token chunks (0.4 s steps),
    // so the SIGTERM comes well before its prompt is computed and its
    // second choice comes.
    std::vector<std::string> agent_flags = flags;
    if (drain) agent_flags.insert(agent_flags.end(), {"--max-num-batched-tokens", "40"});
    Agent agent(agent_flags);
    auto first = std::async(std::launch::async, [&] {
      int status = 0;
      json out = agent.post("/v1/completions", two, &status);
      return std::pair{status, out};
    });
    // Its first choice is admitted and in its prefill (the gauges count a
    // step's sequences as it begins, and requests accepted meanwhile).
    auto waiting = [&] { return agent.metric("tandem_num_requests_waiting"); };
    ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 1; }));
    std::vector<std::future<std::pair<int, json>>> later;
    if (drain) {
      ::kill(agent.process().pid(), SIGTERM);
      ASSERT_TRUE(eventually(
          [&] { return agent.stderrText().find("draining for up to") != std::string::npos; }));
    } else {
      auto send = [&](int i) {
        later.push_back(std::async(std::launch::async, [&agent, i] {
          int status = 0;
          json out = agent.post("/v1/completions", greedy(randomPrompt(8, 42 + i), 2), &status);
          return std::pair{status, out};
        }));
      };
      send(0);
      ASSERT_TRUE(eventually([&] { return waiting() == 1; }));
      // The last place is kept for the first request's second choice: a
      // request arriving now, of two choices or of one, is refused, and
      // the agent is full as the first's prefill step ends and its second
      // choice comes.
      for (const int choices : {2, 1}) {
        json another = two;
        another["prompt"] = randomPrompt(8, 50 + static_cast<uint32_t>(choices));
        another["n"] = choices;
        int refused_status = 0;
        const json refused = agent.post("/v1/completions", another, &refused_status);
        EXPECT_EQ(refused_status, 503) << refused.dump();
        EXPECT_EQ(refused["error"]["message"], "too many waiting requests (2); retry later");
      }
    }
    const auto [status, out] = first.get();
    ASSERT_EQ(status, 200) << out.dump();
    ASSERT_EQ(out["choices"].size(), 2u) << out.dump();
    for (const json& choice : out["choices"]) {
      EXPECT_EQ(choice["finish_reason"], "length") << out.dump();
      EXPECT_EQ(choice["token_ids"].size(), 3u) << out.dump();
    }
    if (!drain) {
      for (auto& each : later) {
        const auto [later_status, later_out] = each.get();
        EXPECT_EQ(later_status, 200) << later_out.dump();
      }
      EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"abort\""), 0);
    }
  }
}

// Requests accepted while a step runs wait, and are counted so at once:
// by the waiting bound (they were not until the step after the one that
// took them from the inbox, so more than --max-waiting-requests could
// wait) and by tandem_num_requests_waiting; a step's sequences are
// counted as it begins.
TEST(SimulatedAgent, TheWaitingBoundCountsRequestsAcceptedDuringAStep) {
  Agent agent({"--simulate", profileFile("slow-prefill.yaml", kSlowPrefillProfile).string(),
               "--max-num-seqs", "1", "--max-waiting-requests", "2"});
  std::vector<std::future<int>> served;
  auto send = [&](uint32_t seed) {
    served.push_back(std::async(std::launch::async, [&agent, seed] {
      int status = 0;
      agent.post("/v1/completions", greedy(randomPrompt(400, seed), 1), &status);
      return status;
    }));
  };
  auto running = [&] { return agent.metric("tandem_num_requests_running"); };
  auto waiting = [&] { return agent.metric("tandem_num_requests_waiting"); };
  auto refused = [&](uint32_t seed) {
    int status = 0;
    const json out = agent.post("/v1/completions", greedy(randomPrompt(8, seed), 1), &status);
    EXPECT_EQ(status, 503) << out.dump();
    EXPECT_EQ(out["error"]["message"], "too many waiting requests (2); retry later");
  };
  send(60);  // a 4-second prefill step
  ASSERT_TRUE(eventually([&] { return running() == 1; }));
  send(61);
  send(62);
  ASSERT_TRUE(eventually([&] { return waiting() == 2; }));
  refused(63);
  // The first is over; the second's step runs, the third waits.
  ASSERT_TRUE(eventually([&] { return running() == 1 && waiting() == 1; }));
  send(64);
  ASSERT_TRUE(eventually([&] { return waiting() == 2; }));
  refused(65);
  for (auto& each : served) EXPECT_EQ(each.get(), 200);
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"rejected\""), 2);
}

// An agent holds --max-num-seqs + --max-waiting-requests requests at once:
// one arriving while a seat is free is not refused for the queue's bound,
// though it waits in the inbox until the step under way ends. Before, it
// was counted waiting, and a burst was refused with seats free.
TEST(SimulatedAgent, AnAgentHoldsItsSeatsAndItsWaitingQueue) {
  Agent agent({"--simulate", profileFile("slow-prefill.yaml", kSlowPrefillProfile).string(),
               "--max-num-seqs", "2", "--max-waiting-requests", "1"});
  std::vector<std::future<int>> served;
  auto send = [&](uint32_t seed, int tokens) {
    served.push_back(std::async(std::launch::async, [&agent, seed, tokens] {
      int status = 0;
      agent.post("/v1/completions", greedy(randomPrompt(tokens, seed), 1), &status);
      return status;
    }));
  };
  send(70, 400);  // a 4-second prefill step
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 1; }));
  send(71, 20);  // the free seat's, in the inbox while the step runs
  send(72, 20);  // the place's
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_waiting") == 2; }));
  int status = 0;
  const json out = agent.post("/v1/completions", greedy(randomPrompt(8, 73), 1), &status);
  EXPECT_EQ(status, 503) << out.dump();
  EXPECT_EQ(out["error"]["message"], "too many waiting requests (1); retry later");
  for (auto& each : served) EXPECT_EQ(each.get(), 200);
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"rejected\""), 1);
}

// The places of an admitted request's later choices (n > 1) are kept for
// them from its admission until they join: requests arriving meanwhile
// find them taken. Before, only the choices already in the engine were
// counted, and a burst of n=3 requests had 8 admitted where 3 fit (24
// engine requests on an agent holding 10).
TEST(SimulatedAgent, TheLaterChoicesOfAnAdmittedRequestKeepTheirPlaces) {
  Agent agent({"--simulate", profileFile("slow-prefill.yaml", kSlowPrefillProfile).string(),
               "--max-num-seqs", "2", "--max-waiting-requests", "7"});
  auto send = [&](uint32_t seed, int tokens) {
    json body = greedy(randomPrompt(tokens, seed), 2);
    body["n"] = 3;
    return std::async(std::launch::async, [&agent, body] {
      int status = 0;
      json out = agent.post("/v1/completions", body, &status);
      return std::pair{status, out};
    });
  };
  // A's first choice runs a 4-second prefill step; its other two choices
  // come after it. B and C wait in the inbox meanwhile.
  auto a = send(90, 400);
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 1; }));
  auto b = send(91, 8);
  auto c = send(92, 8);
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_waiting") == 2; }));
  // 1 running + 2 waiting + 6 places kept + 3 > 9.
  int status = 0;
  json d = greedy(randomPrompt(8, 93), 2);
  d["n"] = 3;
  const json refused = agent.post("/v1/completions", d, &status);
  EXPECT_EQ(status, 503) << refused.dump();
  EXPECT_EQ(refused["error"]["message"], "too many waiting requests (7); retry later");
  for (auto* answer : {&a, &b, &c}) {
    const auto [answer_status, out] = answer->get();
    EXPECT_EQ(answer_status, 200) << out.dump();
    EXPECT_EQ(out["choices"].size(), 3u) << out.dump();
  }
  // Every place given back: a request of all 9 is admitted once idle.
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 0; }));
  d["n"] = 9;
  const json nine = agent.post("/v1/completions", d, &status);
  EXPECT_EQ(status, 200) << nine.dump();
  EXPECT_EQ(nine["choices"].size(), 9u);
}

// At a stop's deadline a request that never began ends as one of a single
// choice does, whatever its n: 200, every choice "abort" with no tokens.
// Before, its first choice's abort made the answer add the other choices
// to an engine that took no more, and the client got 503 "the engine is
// shutting down" where a request of one choice got its 200.
TEST(SimulatedAgent, AtTheStopsDeadlineEveryChoiceOfARequestNotBegunEndsAborted) {
  Agent agent({"--simulate", profileFile("slow-prefill.yaml", kSlowPrefillProfile).string(),
               "--max-num-seqs", "1", "--shutdown-timeout", "1"});
  auto send = [&](json body) {
    return std::async(std::launch::async, [&agent, body] {
      int status = 0;
      json out = agent.post("/v1/completions", body, &status);
      return std::pair{status, out};
    });
  };
  auto begun = send(greedy(randomPrompt(400, 80), 1));  // a 4-second prefill step
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 1; }));
  auto one = send(greedy(randomPrompt(8, 81), 2));
  json body = greedy(randomPrompt(8, 82), 2);
  body["n"] = 2;
  auto two = send(body);
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_waiting") == 2; }));
  ::kill(agent.process().pid(), SIGTERM);
  for (const auto& [answer, choices] : {std::pair{&one, size_t{1}}, std::pair{&two, size_t{2}}}) {
    const auto [status, out] = answer->get();
    EXPECT_EQ(status, 200) << out.dump();
    ASSERT_EQ(out["choices"].size(), choices) << out.dump();
    for (const json& choice : out["choices"]) {
      EXPECT_EQ(choice["finish_reason"], "abort") << out.dump();
      EXPECT_EQ(choice.value("token_ids", json::array()), json::array()) << out.dump();
    }
  }
  begun.get();
}

// The hand-off between simulated agents over each UCX transport.
class SimulatedHandOff : public UcxTransportTest {};

TEST_P(SimulatedHandOff, DecodeReadsThePrefilledBlocksAndMatchesAColocatedAgent) {
  // 75 tokens: 4 full blocks move, the 11-token tail is computed by decode.
  const std::vector<int> prompt = randomPrompt(75, 31);
  std::vector<int> expected;
  {
    Agent colocated(simulated());
    expected = tokenIds(colocated.post("/v1/completions", greedy(prompt, 8)));
  }
  Agent prefiller(simulated({"--kv-transfer-config", ucxConfig("kv_producer")}));
  Agent decoder(simulated({"--kv-transfer-config", ucxConfig("kv_consumer")}));
  json params = prefillOn(prefiller, prompt);
  ASSERT_TRUE(params.is_object()) << "the prefill response must say where its KV is";
  EXPECT_EQ(params["remote_block_ids"].size(), 4u);
  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  // Real bytes moved: 4 blocks of the tiny model's geometry.
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_bytes_total"), 4 * 4096);
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_cache_usage_ratio") == 0 &&
           prefiller.metric("tandem_kv_held_blocks") == 0;
  }));
}

TEST_P(SimulatedHandOff, ARealAgentRefusesASimulatedAgentsBlocks) {
  const std::vector<int> prompt = randomPrompt(75, 32);
  Agent prefiller(simulated({"--kv-transfer-config", ucxConfig("kv_producer")}));
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  json params = prefillOn(prefiller, prompt);
  ASSERT_TRUE(params.is_object());
  int status = 0;
  json out = decodeOn(decoder, prompt, params, 8, &status);
  // Refused, or recomputed: never a real model's tokens from simulated KV.
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0) << out.dump();
  releaseOn(prefiller, params);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// Flags of an agent on linkProfile(bytes_per_s) with a ucx connector in `role`.
std::vector<std::string> onLink(double bytes_per_s, const std::string& role = "") {
  const std::string name = "link-" + std::to_string(static_cast<int64_t>(bytes_per_s)) + ".yaml";
  std::vector<std::string> flags = {"--simulate",
                                    profileFile(name, linkProfile(bytes_per_s)).string()};
  if (!role.empty()) flags.insert(flags.end(), {"--kv-transfer-config", ucxConfig(role)});
  return flags;
}

// 16 full blocks (256 tokens) move; the 11-token tail is computed.
constexpr int kLinkPromptTokens = kLinkBlocks * kBlockTokens + 11;

TEST_P(SimulatedHandOff, AHandOffLastsTheProfilesLinkTimeAndMovesTheBackingBlocks) {
  const std::vector<int> prompt = randomPrompt(kLinkPromptTokens, 33);
  std::vector<int> expected;
  {
    Agent colocated(onLink(kLinkBytesPerS));
    expected = tokenIds(colocated.post("/v1/completions", greedy(prompt, 8)));
  }
  Agent prefiller(onLink(kLinkBytesPerS, "kv_producer"));
  Agent decoder(onLink(kLinkBytesPerS, "kv_consumer"));
  json params = prefillOn(prefiller, prompt);
  ASSERT_TRUE(params.is_object()) << "the prefill response must say where its KV is";
  ASSERT_EQ(params["remote_block_ids"].size(), static_cast<size_t>(kLinkBlocks));
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), kLinkBlocks);
  // The stand-in blocks' bytes moved, not the profile's 128 KiB per token.
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_bytes_total", "source=\"ucx\""),
            kLinkBlocks * kBackingBlockBytes);
  // The hand-off lasted at least the link's time, as reported and as the
  // request waited for it (first scheduled → first token).
  const double modelled = modelledHandOff(kLinkBlocks);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_duration_seconds_count", "source=\"ucx\""), 1);
  EXPECT_GE(decoder.metric("tandem_kv_transfer_duration_seconds_sum", "source=\"ucx\""), modelled);
  EXPECT_TRUE(
      eventually([&] { return decoder.metric("tandem_request_prefill_time_seconds_count") == 1; }));
  EXPECT_GE(decoder.metric("tandem_request_prefill_time_seconds_sum"), modelled);
  for (const Agent* agent : {&prefiller, &decoder}) {
    EXPECT_TRUE(eventually([&] {
      return agent->metric("tandem_kv_cache_usage_ratio") == 0 &&
             agent->metric("tandem_kv_held_blocks") == 0;
    }));
  }
}

TEST_P(SimulatedHandOff, APullBackOfALentPrefixLastsTheLinkTimeToo) {
  const std::vector<int> prompt = randomPrompt(kLinkPromptTokens, 34);
  Agent lender(onLink(kLinkBytesPerS, "kv_both"));
  lender.post("/v1/completions", greedy(prompt, 4));
  int status = 0;
  json hold = lender.post("/v1/kv_transfer/hold", {{"token_ids", prompt}}, &status);
  ASSERT_EQ(status, 200) << hold.dump();
  ASSERT_EQ(hold["num_tokens"], kLinkBlocks * kBlockTokens);
  Agent reader(onLink(kLinkBytesPerS, "kv_both"));
  json body = greedy(prompt, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true},
                                {"remote_prefix", hold["kv_transfer_params"]}};
  json prefilled = reader.post("/v1/completions", body);
  EXPECT_EQ(reader.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), kLinkBlocks);
  const double modelled = modelledHandOff(kLinkBlocks);
  EXPECT_GE(reader.metric("tandem_kv_transfer_duration_seconds_sum", "source=\"ucx\""), modelled);
  EXPECT_TRUE(
      eventually([&] { return reader.metric("tandem_request_prefill_time_seconds_count") == 1; }));
  EXPECT_GE(reader.metric("tandem_request_prefill_time_seconds_sum"), modelled);
  EXPECT_TRUE(eventually([&] { return lender.metric("tandem_kv_held_blocks") == 0; }));
  EXPECT_EQ(releaseOn(reader, prefilled["kv_transfer_params"])["released"], true);
  for (const Agent* agent : {&lender, &reader}) {
    EXPECT_TRUE(eventually([&] {
      return agent->metric("tandem_kv_cache_usage_ratio") == 0 &&
             agent->metric("tandem_kv_held_blocks") == 0;
    }));
  }
}

// A lend whose answer never reaches the caller (a router whose call timed
// out while the lender finished computing the prefix) is released at once,
// not kept for nobody until abort_timeout_s (120 s here). The prefill lasts
// 2.7 s (prefill_token_s 0.01): the hold is asked for while it runs, and the
// caller closes (then resets) its connection before the engine can answer.
TEST(SimulatedLend, AHoldWhoseAnswerIsNotDeliveredIsReleased) {
  const std::string profile =
      "name: test-slow-prefill\nbase_s: 0.0005\nprefill_token_s: 0.01\n"
      "decode_sequence_s: 0.0001\nmodel:\n  vocab_size: 512\n  max_position_embeddings: 512\n"
      "  kv_bytes_per_token: 131072\n";
  Agent lender({"--simulate", profileFile("slow-prefill.yaml", profile).string(),
                "--kv-transfer-config", ucxConfig("kv_both")});
  // The router's call closes its connection at its timeout (a FIN); a
  // client may reset it too. Either way the answer reaches nobody.
  std::vector<int> prompt;
  for (const bool reset : {false, true}) {
    prompt = randomPrompt(kLinkPromptTokens, reset ? 37 : 36);
    std::thread computing([&] { lender.post("/v1/completions", greedy(prompt, 1)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int fd = tandem::connectLoopback(lender.port());
    ASSERT_GE(fd, 0);
    const std::string body = json{{"token_ids", prompt}}.dump();
    ASSERT_TRUE(tandem::sendAll(fd,
                                "POST /v1/kv_transfer/hold HTTP/1.1\r\nHost: localhost\r\n"
                                "Content-Type: application/json\r\nContent-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n" + body));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (reset) {
      tandem::resetAndClose(fd);
    } else {
      ::close(fd);
    }
    computing.join();
    EXPECT_TRUE(eventually([&] { return lender.metric("tandem_kv_held_blocks") == 0; }))
        << (reset ? "reset" : "closed") << ": the undelivered lend still pins "
        << lender.metric("tandem_kv_held_blocks") << " blocks";
  }
  // The prefix is still cached and lendable to a caller who stays.
  int status = 0;
  const json hold = lender.post("/v1/kv_transfer/hold", {{"token_ids", prompt}}, &status);
  ASSERT_EQ(status, 200) << hold.dump();
  EXPECT_EQ(hold["num_tokens"], kLinkBlocks * kBlockTokens);
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), kLinkBlocks);
  EXPECT_EQ(releaseOn(lender, hold["kv_transfer_params"])["released"], true);
  EXPECT_TRUE(eventually([&] { return lender.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(SimulatedHandOff, AnUntimedLinkAddsNoWait) {
  // kv_link_bytes_per_s 0: the hand-off takes what the real read takes,
  // far below what the slow link would give it (its latency is not paid).
  const std::vector<int> prompt = randomPrompt(kLinkPromptTokens, 35);
  Agent prefiller(onLink(0, "kv_producer"));
  Agent decoder(onLink(0, "kv_consumer"));
  json params = prefillOn(prefiller, prompt);
  ASSERT_TRUE(params.is_object());
  EXPECT_EQ(tokenIds(decodeOn(decoder, prompt, params)).size(), 8u);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), kLinkBlocks);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_duration_seconds_count", "source=\"ucx\""), 1);
  EXPECT_LT(decoder.metric("tandem_kv_transfer_duration_seconds_sum", "source=\"ucx\""),
            modelledHandOff(kLinkBlocks));
}

INSTANTIATE_TEST_SUITE_P(Transports, SimulatedHandOff, ::testing::Values("tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
