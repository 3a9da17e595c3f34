// The router in front of real prefill and decode agents: completions through
// it equal a colocated agent's (streamed and not), conversations follow their
// KV (and round-robin does not), conditional disaggregation and pull-back
// show in the decision metrics, bad input gets the agents' errors, client
// kv_transfer_params are ignored, and failed agents are routed around.
#include "operator/router/router.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/block_hash.h"
#include "common/loopback_socket.h"
#include "common/tokenizer.h"
#include "tests/support/drain_checks.h"
#include "tests/support/httplib_serving.h"
#include "tests/support/router_cluster.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using tandem::connectLoopback;
using tandem::listenLoopback;
using tandem::prometheusSample;
using tandem::prometheusSum;
using tandem::resetAndClose;
using tandem::sendAll;
using tandem::router::AgentEndpoint;
using tandem::router::Policy;
using tandem::router::Router;
using tandem::router::RouterConfig;

// A LoRA adapter (every projection) for the tiny model.
const fs::path& tinyLoraDir() {
  static TempDir dir("tandem-router-lora");
  static fs::path path = [] {
    tandem::tools::writeTestLoraAdapter(
        {}, tandem::engine::ModelConfig::fromFile(tinyModelDir() / "config.json"),
        dir.path() / "sql");
    return dir.path() / "sql";
  }();
  return path;
}
std::vector<std::string> loraArgs() { return {"--lora-modules", "sql=" + tinyLoraDir().string()}; }
// Another adapter's files (another seed) served under the same name.
std::vector<std::string> otherLoraArgs() {
  static TempDir dir("tandem-router-lora-other");
  static fs::path path = [] {
    tandem::tools::TestLoraOptions options;
    options.seed = 2;
    tandem::tools::writeTestLoraAdapter(
        options, tandem::engine::ModelConfig::fromFile(tinyModelDir() / "config.json"),
        dir.path() / "sql");
    return dir.path() / "sql";
  }();
  return {"--lora-modules", "sql=" + path.string()};
}

// An agent of `role` ("prefill", "decode") with the UCX connector (kv_both).
std::vector<std::string> roleArgs(const std::string& role) {
  return {"--role", role, "--kv-transfer-config", ucxConfig("kv_both")};
}

// The tiny model's shape and tokenizer with other weights: another model
// identity (a rollout's new model).
const fs::path& otherTinyModelDir() {
  static TempDir dir("tandem-router-other-model");
  static fs::path path = [] {
    tandem::tools::TestModelOptions options;
    options.seed = 22;
    tandem::tools::writeTestModel(options, dir.path() / "tiny");
    return dir.path() / "tiny";
  }();
  return path;
}

class RouterTest : public RouterCluster {
 protected:
  // Whether every decode agent runs at least `count` requests within 20 s.
  bool decodeAgentsRun(double count) {
    return eventually(
        [&] {
          for (auto& agent : decode_) {
            if (agent->metric("tandem_num_requests_running") < count) return false;
          }
          return true;
        },
        std::chrono::seconds(20));
  }
  void turnTwoFollowsTurnOne(Agent& colocated,
                             const std::function<json(const std::vector<int>&, int)>& request);
  json expectDisaggregatedExactly(const fs::path& model,
                                  const std::vector<std::string>& agent_args = {});
  // A tiny model of `architecture` is disaggregated exactly, and its answer
  // is not the tiny dense Llama's: that architecture is what ran.
  void expectArchitectureDisaggregatedExactly(const std::string& architecture, uint64_t seed);
  // Starts `prefills` + `decodes` agents (ucx, kv_both) and a router.
  void start(int prefills, int decodes, Policy policy = Policy::kKv,
             int64_t disagg_threshold_tokens = 16, int64_t max_inflight = 256,
             int64_t max_queued = 1024, const fs::path& model = tinyModelDir()) {
    RouterClusterOptions options;
    options.prefills = prefills;
    options.decodes = decodes;
    options.policy = policy;
    options.disagg_threshold_tokens = disagg_threshold_tokens;
    options.max_inflight = max_inflight;
    options.max_queued = max_queued;
    options.model = model;
    startCluster(options);
  }

  struct Answer {
    int status = 0;
    json body;
    std::string decision, prefill_agent, decode_agent;
    int blocks_moved = 0;
  };
  // One prefill and one decode agent of the small model, the decode
  // agent stopping at most 1 s after a drain begins.
  void startWithAShortShutdownTimeout() {
    RouterClusterOptions options;
    options.model = smallModelDir();
    options.agent_args = [](bool prefill, int) {
      return prefill ? std::vector<std::string>{}
                     : std::vector<std::string>{"--shutdown-timeout", "1"};
    };
    startCluster(options);
  }
  // Once the lone decode agent (of the small model, beside one prefill
  // agent) runs `busy` requests: drains it, waits for it to exit and lists
  // a new decode agent in its place, as a rollout with maxSurge 0 does (or,
  // `in_place`, starts the new one on the old one's port, under its name,
  // as a process or pod restarted in place). The replacement, or null if
  // the agent never got that busy, refused the drain or failed.
  std::unique_ptr<Agent> replaceLoneDecodeAgentOnceBusy(int busy, bool in_place = false) {
    Agent& lone = *decode_[0];
    if (!eventually([&] { return lone.metric("tandem_num_requests_running") >= busy; },
                    std::chrono::seconds(20))) {
      return nullptr;
    }
    auto res = lone.client()->Post("/admin/drain", "{}", "application/json");
    if (!res || res->status != 202) return nullptr;
    if (lone.process().wait(std::chrono::seconds(30)) != 0) return nullptr;
    std::vector<std::string> args = roleArgs("decode");
    if (in_place) args.insert(args.end(), {"--port", std::to_string(lone.port())});
    auto replacement = std::make_unique<Agent>(args, smallModelDir());
    if (!in_place) {
      router_->setAgents({{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
                         {{"decode-0", "127.0.0.1", replacement->port()}});
    }
    return replacement;
  }
  // Sends `body` (a whole answer) to the router from `client`, a thread of
  // its own (joined by the caller; status and body land in `answer`), and
  // waits until the lone decode agent runs it: whether it did.
  bool postWholeUntilRunning(const json& body, std::pair<int, json>& answer, std::thread& client) {
    client = std::thread([port = router_->port(), text = body.dump(), &answer] {
      httplib::Client http("127.0.0.1", port);
      http.set_read_timeout(120, 0);
      auto res = http.Post("/v1/completions", text, "application/json");
      if (res) answer = {res->status, json::parse(res->body, nullptr, false)};
    });
    return eventually([&] { return decode_[0]->metric("tandem_num_requests_running") >= 1; },
                      std::chrono::seconds(20));
  }
  Answer post(const json& body, const std::string& path = "/v1/completions") {
    Answer answer;
    auto res = client_->Post(path.c_str(), body.dump(), "application/json");
    if (!res) return answer;
    answer.status = res->status;
    answer.body = json::parse(res->body, nullptr, false);
    answer.decision = res->get_header_value("x-tandem-decision");
    answer.prefill_agent = res->get_header_value("x-tandem-prefill-agent");
    answer.decode_agent = res->get_header_value("x-tandem-decode-agent");
    const std::string moved = res->get_header_value("x-tandem-kv-blocks-moved");
    answer.blocks_moved = moved.empty() ? 0 : std::stoi(moved);
    return answer;
  }
  // `answer` is a 400 naming `param` with `message`.
  static void expectInvalid(const Answer& answer, const std::string& param,
                            const std::string& message) {
    EXPECT_EQ(answer.status, 400) << answer.body.dump();
    EXPECT_EQ(answer.body["error"]["param"], param);
    EXPECT_EQ(answer.body["error"]["message"], message);
  }
  // Token ids of a streamed completion, and the raw SSE text.
  std::vector<int> streamedTokens(json body, std::string* raw = nullptr) {
    body["stream"] = true;
    auto res = client_->Post("/v1/completions", body.dump(), "application/json");
    std::vector<int> ids;
    if (!res) return ids;
    if (raw != nullptr) *raw = res->body;
    std::istringstream lines(res->body);
    std::string line;
    while (std::getline(lines, line)) {
      if (!line.starts_with("data: {")) continue;
      json chunk = json::parse(line.substr(6), nullptr, false);
      if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
      for (int id : chunk["choices"][0].value("token_ids", std::vector<int>{})) ids.push_back(id);
    }
    return ids;
  }
  double routerMetric(const std::string& name, const std::string& filter = "") {
    return prometheusSample(routerMetrics(), name, filter).value_or(0);
  }
  // signalRunningDecodeAgent, once the router has seen the first token of
  // an answer begun after this call.
  std::thread signalDecodeAgentMidAnswer(int signal, Agent** signalled = nullptr);
  void conversationFollowsItsKv(const std::string& adapter);
};

TEST_F(RouterTest, CompletionsThroughTheRouterEqualAColocatedAgentsStreamedAndNot) {
  start(1, 1);
  Agent colocated;
  for (uint32_t seed : {61u, 62u, 63u}) {
    const std::vector<int> prompt = randomPrompt(70 + seed % 7, seed);
    const std::vector<int> expected =
        tokenIds(colocated.post("/v1/completions", greedy(prompt, 8)));
    Answer answer = post(greedy(prompt, 8));
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(tokenIds(answer.body), expected);
    EXPECT_EQ(answer.decision, "disaggregated");
    EXPECT_EQ(answer.prefill_agent, "prefill-0");
    EXPECT_EQ(answer.decode_agent, "decode-0");
    EXPECT_EQ(answer.blocks_moved, 4);
    EXPECT_EQ(streamedTokens(greedy(randomPrompt(70, seed + 100), 8)),
              tokenIds(colocated.post("/v1/completions", greedy(randomPrompt(70, seed + 100), 8))));
  }
  EXPECT_GE(decode_[0]->metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 12);
  EXPECT_TRUE(eventually([&] {
    return routerMetric("tandem_router_requests_total", "decision=\"disaggregated\"") == 6;
  }));
  EXPECT_GT(routerMetric("tandem_router_time_to_first_token_seconds_count"), 0);
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }));
}

// API keys: the router asks its clients for its key and sends the agents'
// key on every call to them (load polls, KV events, models, prefill, decode,
// holds and releases); the agents refuse anyone without theirs.
// The answer's id (inside cmpl-…) starts with the router's X-Request-Id,
// which starts with the client's: one id traces a request through the
// router's and the agents' logs.
TEST_F(RouterTest, TheAnswersIdStartsWithTheRoutersRequestId) {
  start(1, 1);
  json body = greedy(randomPrompt(40, 3), 4);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    body["stream"] = stream;
    auto res = client_->Post("/v1/completions", httplib::Headers{{"X-Request-Id", "client-7"}},
                             body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const std::string header = res->get_header_value("X-Request-Id");
    EXPECT_TRUE(header.starts_with("client-7-")) << header;
    std::string text = res->body;
    if (stream) text = text.substr(text.find("data: ") + 6, text.find('\n') - 6);
    const std::string id = json::parse(text)["id"];
    EXPECT_TRUE(id.starts_with("cmpl-" + header + "-")) << id << " vs " << header;
  }
}

// The router's /health once it answers 503 "model not loaded" (or the last
// answer, if it never does).
json healthOnceTheModelIsNotLoaded(httplib::Client& router) {
  json health;
  eventually([&] {
    auto res = router.Get("/health");
    if (!res || res->status != 503) return false;
    health = json::parse(res->body, nullptr, false);
    return health.value("status", "") == "model not loaded";
  });
  return health;
}

// A router polling stand-in decode agents (HTTP servers whose routes the
// test set; decode-0, decode-1, ...) every 0.1 s, for what a real agent never
// answers. `configure` may change the router's configuration.
class RouterOverAFakeAgent {
 public:
  explicit RouterOverAFakeAgent(httplib::Server& fake,
                                const std::function<void(RouterConfig&)>& configure = {})
      : RouterOverAFakeAgent(std::vector<httplib::Server*>{&fake}, configure) {}
  RouterOverAFakeAgent(std::vector<httplib::Server*> fakes,
                       const std::function<void(RouterConfig&)>& configure = {})
      : fakes_(std::move(fakes)) {
    RouterConfig config;
    config.port = 0;
    config.poll_interval_s = 0.1;
    for (httplib::Server* fake : fakes_) {
      const int port = fake->bind_to_any_port("127.0.0.1");
      serving_.push_back(serveOnThread(*fake));
      config.decode.push_back(
          {"decode-" + std::to_string(config.decode.size()), "127.0.0.1", port});
    }
    if (configure) configure(config);
    router_ = std::make_unique<Router>(config);
    router_->start();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", router_->port());
  }
  ~RouterOverAFakeAgent() {
    router_->stop();
    for (httplib::Server* fake : fakes_) fake->stop();
    for (std::thread& thread : serving_) thread.join();
  }
  httplib::Client& client() { return *client_; }

 private:
  std::vector<httplib::Server*> fakes_;
  std::vector<std::thread> serving_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<httplib::Client> client_;
};

// The router's tandem_router_agent_healthy of `agent`: 1, 0, or none.
std::optional<double> agentHealthy(httplib::Client& client, const std::string& agent) {
  auto res = client.Get("/metrics");
  if (!res) return std::nullopt;
  return prometheusSample(res->body, "tandem_router_agent_healthy", "agent=\"" + agent + "\"");
}

// The routes of a healthy stand-in agent serving the real agent's models
// answer `models`.
void serveAsAnAgent(httplib::Server& fake, const std::string& models,
                    std::atomic<bool>* healthy = nullptr) {
  fake.Get("/health", [healthy](const httplib::Request&, httplib::Response& res) {
    if (healthy != nullptr && !*healthy) {
      res.status = 503;
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  fake.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("tandem_num_requests_running 0\n", "text/plain");
  });
  fake.Get("/v1/models", [models](const httplib::Request&, httplib::Response& res) {
    res.set_content(models, "application/json");
  });
}

// An agent's 501 (a simulated agent's answer to prompt logprobs or
// structured outputs) is its answer to the request, which every agent
// would give alike: the client gets it, where the router took it for the
// agent failing, tried every agent and answered 503.
TEST(RouterForwarding, AnAgentsNotImplementedAnswerReachesTheClient) {
  Agent real({"--role", "decode"});
  httplib::Client real_client("127.0.0.1", real.port());
  const std::string models = real_client.Get("/v1/models")->body;
  const std::string not_implemented =
      R"({"error":{"message":"prompt_logprobs are not simulated","type":"not_implemented_error","param":"prompt_logprobs","code":null}})";
  httplib::Server fake;
  serveAsAnAgent(fake, models);
  std::atomic<int> completions{0};
  fake.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    ++completions;
    res.status = 501;
    res.set_content(not_implemented, "application/json");
  });
  RouterOverAFakeAgent router(fake);
  httplib::Client& client = router.client();
  ASSERT_TRUE(eventually([&] {
    auto res = client.Get("/health");
    return res && res->status == 200;
  }));
  const json body = {
      {"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 2}, {"prompt_logprobs", 1}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 501) << res->body;
  EXPECT_EQ(json::parse(res->body), json::parse(not_implemented));
  EXPECT_EQ(completions, 1);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(prometheusSum(metrics->body, "tandem_router_upstream_errors_total").value_or(0), 0);
}

// A forwarded call (/tokenize here) to an agent that does not answer goes
// no further than forward_timeout_s: it waited for --upstream-timeout (600 s
// by default) even after the agent was marked unhealthy.
TEST(RouterForwarding, AForwardedCallAnAgentDoesNotAnswerEndsAtTheForwardTimeout) {
  httplib::Server fake;
  serveAsAnAgent(fake, R"({"object":"list","data":[]})");
  fake.Post("/tokenize", [](const httplib::Request&, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    res.set_content(R"({"tokens":[1],"count":1})", "application/json");
  });
  RouterOverAFakeAgent router(fake, [](RouterConfig& config) { config.forward_timeout_s = 0.5; });
  httplib::Client& client = router.client();
  client.set_read_timeout(std::chrono::seconds(30));
  ASSERT_TRUE(eventually([&] { return agentHealthy(client, "decode-0") == 1.0; }));
  auto res = client.Post("/tokenize", R"({"prompt":"hi"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "no healthy agent");
}

// Every agent busy (429) on a forwarded call: the client gets the agent's
// 429, not 503 "no healthy agent".
TEST(RouterForwarding, BusyAgentsAnswerBusy) {
  httplib::Server fake;
  serveAsAnAgent(fake, R"({"object":"list","data":[]})");
  const std::string busy = R"({"error":{"message":"too many requests","type":"rate_limit_error"}})";
  fake.Post("/tokenize", [&](const httplib::Request&, httplib::Response& res) {
    res.status = 429;
    res.set_content(busy, "application/json");
  });
  RouterOverAFakeAgent router(fake);
  httplib::Client& client = router.client();
  ASSERT_TRUE(eventually([&] { return agentHealthy(client, "decode-0") == 1.0; }));
  auto res = client.Post("/tokenize", R"({"prompt":"hi"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->body, busy);
}

// A /tokenize naming a LoRA adapter whose agents are all unhealthy gets 503,
// as a completion naming it does, not another agent's 404 for the name.
TEST(RouterForwarding, AnAdapterWhoseAgentsAreDownIsNotAskedOfOthers) {
  Agent real({"--role", "decode"});
  httplib::Client real_client("127.0.0.1", real.port());
  const std::string plain_models = real_client.Get("/v1/models")->body;
  json with_adapter = json::parse(plain_models);
  with_adapter["data"].push_back({{"id", "sql"},
                                  {"object", "model"},
                                  {"parent", "tiny"},
                                  {"tandem", {{"model_identity", "sql-identity"}}}});
  httplib::Server plain, serving;
  std::atomic<bool> serving_healthy{true};
  serveAsAnAgent(plain, plain_models);
  serveAsAnAgent(serving, with_adapter.dump(), &serving_healthy);
  std::atomic<int> plain_tokenized{0};
  plain.Post("/tokenize", [&](const httplib::Request&, httplib::Response& res) {
    ++plain_tokenized;
    res.status = 404;
    res.set_content(R"({"error":{"message":"model \"sql\" does not exist"}})", "application/json");
  });
  serving.Post("/tokenize", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"tokens":[7],"count":1})", "application/json");
  });
  RouterOverAFakeAgent router({&plain, &serving});
  httplib::Client& client = router.client();
  const std::string body = R"({"model":"sql","prompt":"hello"})";
  ASSERT_TRUE(eventually([&] {
    auto res = client.Post("/tokenize", body, "application/json");
    return res && res->status == 200;
  })) << "the adapter was never seen";
  plain_tokenized = 0;  // asked before the router knew the adapter
  serving_healthy = false;
  ASSERT_TRUE(eventually([&] { return agentHealthy(client, "decode-1") == 0.0; }));
  auto res = client.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(plain_tokenized, 0);
}

// A router that cannot read the model's tokenizer says so on /health,
// rather than blaming decode agents that are healthy.
TEST(RouterHealth, AModelItCannotLoadIsNamedNotBlamedOnTheAgents) {
  Agent decode({"--role", "decode"});
  RouterConfig config;
  config.port = 0;
  config.poll_interval_s = 0.1;
  config.model_dir = "/nonexistent/tandem-model";
  config.decode.push_back({"decode-0", "127.0.0.1", decode.port()});
  Router router(config);
  router.start();
  httplib::Client client("127.0.0.1", router.port());
  const json health = healthOnceTheModelIsNotLoaded(client);
  EXPECT_EQ(health.value("status", ""), "model not loaded") << health.dump();
  EXPECT_NE(health.value("error", "")
                .find("cannot load the tokenizer from "
                      "/nonexistent/tandem-model"),
            std::string::npos)
      << health.dump();
  // The agent names its model directory absolutely.
  httplib::Client agent("127.0.0.1", decode.port());
  const json models = json::parse(agent.Get("/v1/models")->body);
  EXPECT_TRUE(fs::path(models["data"][0]["root"].get<std::string>()).is_absolute()) << models;
  router.stop();
}

// An agent whose /v1/models answer is not shaped as an agent's (here: its
// "data" an object) is named on /health, and the agent is still polled: once
// it answers as an agent does, the router learns the model from it.
TEST(RouterHealth, AMisshapenModelsAnswerIsNamedAndPollingGoesOn) {
  Agent real({"--role", "decode"});
  httplib::Client real_client("127.0.0.1", real.port());
  const std::string agent_models = real_client.Get("/v1/models")->body;
  // An adapter listed without the identity its blocks are hashed under is
  // not taken (its prompts could not be hashed as the agent does): the
  // router serves the model and answers 404 for the adapter.
  json without_identity = json::parse(agent_models);
  without_identity["data"].push_back({{"id", "sql"}, {"object", "model"}, {"parent", "tiny"}});
  std::atomic<int> shape{0};  // 0: data not a list; 1: an adapter without identity; 2: shaped
  std::atomic<int> models_asked{0};
  httplib::Server fake;
  fake.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  fake.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("tandem_num_requests_running 0\n", "text/plain");
  });
  fake.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    ++models_asked;
    res.set_content(shape == 2   ? agent_models
                    : shape == 1 ? without_identity.dump()
                                 : R"({"object":"list","data":{"id":"tiny"}})",
                    "application/json");
  });
  RouterOverAFakeAgent router(fake);
  httplib::Client& client = router.client();
  const json health = healthOnceTheModelIsNotLoaded(client);
  EXPECT_EQ(health.value("status", ""), "model not loaded") << health.dump();
  EXPECT_NE(health.value("error", "").find("the /v1/models answer of decode-0 is not an agent's"),
            std::string::npos)
      << health.dump();
  shape = 1;
  EXPECT_TRUE(eventually([&] {
    auto res = client.Get("/health");
    return res && res->status == 200;
  })) << "the agent's polling ended";
  // Two reads of the agent's models after the change: the adapter was seen.
  const int asked = models_asked;
  ASSERT_TRUE(eventually([&] { return models_asked >= asked + 2; }));
  const json body = {{"model", "sql"}, {"prompt", "Hello"}, {"max_tokens", 1}};
  auto refused = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 404) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["message"],
            "model \"sql\" does not exist; this server serves \"tiny\"");
  shape = 2;
  EXPECT_TRUE(eventually([&] {
    auto res = client.Get("/health");
    return res && res->status == 200;
  })) << "the agent's polling ended";
}

// Request counts an agent reports that are not counts (not a number,
// negative, infinite, beyond any real count) do not reach the router's
// comparisons as they are: not a number and negative read as 0, the rest
// are capped at 10^12; and polling goes on.
TEST(RouterHealth, MetricsThatAreNotCountsAreReadSafely) {
  std::atomic<int> answer{0};
  const std::vector<std::string> metrics = {
      "tandem_num_requests_running NaN\ntandem_num_requests_waiting -4\n"
      "tandem_kv_cache_usage_ratio NaN\n",
      "tandem_num_requests_running +Inf\ntandem_num_requests_waiting 1e300\n"
      "tandem_kv_cache_usage_ratio 7\n",
      "tandem_num_requests_running 3\ntandem_num_requests_waiting 2\n"};
  httplib::Server fake;
  fake.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  fake.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics[static_cast<size_t>(answer.load())], "text/plain");
  });
  RouterOverAFakeAgent router(fake);
  httplib::Client& client = router.client();
  const auto agentRequests = [&]() -> std::optional<double> {
    auto res = client.Get("/metrics");
    if (!res) return std::nullopt;
    return prometheusSample(res->body, "tandem_router_agent_requests", "agent=\"decode-0\"");
  };
  const std::vector<double> expected = {0, 2e12, 5};
  for (size_t i = 0; i < metrics.size(); ++i) {
    answer = static_cast<int>(i);
    EXPECT_TRUE(eventually([&] { return agentRequests() == expected[i]; }))
        << "answer " << i << ": " << agentRequests().value_or(-1);
  }
}

// GET /debug/decisions?n=N returns the last N decisions kept, oldest first
// (the default 20; a count past size_t all kept; 0 none), each naming its
// agents and predictions.
TEST_F(RouterTest, DebugDecisionsListTheRecentDecisions) {
  start(1, 1);
  // More than the default 20.
  for (int i = 0; i < 22; ++i) {
    ASSERT_EQ(post(greedy(randomPrompt(40, 100 + i), 1)).status, 200);
  }
  const auto decisions = [&](const std::string& query) {
    auto res = client_->Get("/debug/decisions" + query);
    EXPECT_TRUE(res && res->status == 200);
    return res ? json::parse(res->body) : json();
  };
  const json all = decisions("?n=99999999999999999999999");
  ASSERT_TRUE(all.is_array()) << all;
  ASSERT_EQ(all.size(), 22u);
  EXPECT_EQ(decisions("?n=1000"), all);
  EXPECT_EQ(decisions("?n=2"), json({all[20], all[21]}));
  const json last_20(all.begin() + 2, all.end());
  EXPECT_EQ(decisions(""), last_20);
  EXPECT_EQ(decisions("?n=abc"), last_20);
  EXPECT_EQ(decisions("?n=0"), json::array());
  for (const json& decision : all) {
    EXPECT_EQ(decision.value("policy", ""), "kv") << decision;
    EXPECT_TRUE(decision.contains("candidates")) << decision;
  }
}

// A draining router (SIGTERM with --drain-delay) is not ready but still
// serves what load balancers send before they notice.
TEST_F(RouterTest, ADrainingRouterIsNotReadyButStillServes) {
  start(1, 1);
  router_->beginDrain();
  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body), json::parse(R"({"status":"draining"})"));
  const Answer answer = post(greedy(randomPrompt(40, 9), 4));
  EXPECT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(tokenIds(answer.body).size(), 4u);
}

TEST_F(RouterTest, ApiKeysGuardTheRouterAndItsCallsToTheAgents) {
  RouterClusterOptions options;
  options.api_key = "sk-router-key";
  options.agent_api_key = "sk-agent-key";
  options.agent_args = [](bool, int) {
    return std::vector<std::string>{"--api-key", "sk-agent-key"};
  };
  startCluster(options);
  const std::vector<int> prompt = randomPrompt(70, 901);
  // No key, a wrong key, the agents' key: 401 in OpenAI's shape.
  for (const char* header : {"", "Bearer sk-wrong", "Bearer sk-agent-key", "sk-router-key"}) {
    httplib::Headers headers;
    if (*header != '\0') headers.emplace("Authorization", header);
    auto res =
        client_->Post("/v1/completions", headers, greedy(prompt, 4).dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << header;
    EXPECT_EQ(res->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  }
  // With the key: disaggregated as usual, the tokens a colocated agent gives.
  const httplib::Headers authorized = {{"Authorization", "Bearer sk-router-key"}};
  auto res =
      client_->Post("/v1/completions", authorized, greedy(prompt, 4).dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("x-tandem-decision"), "disaggregated");
  Agent colocated;
  EXPECT_EQ(tokenIds(json::parse(res->body)),
            tokenIds(colocated.post("/v1/completions", greedy(prompt, 4))));
  // The agents themselves: 401 without their key, their probes and metrics open.
  httplib::Client agent("127.0.0.1", decode_[0]->port());
  auto direct = agent.Post("/v1/completions", greedy(prompt, 4).dump(), "application/json");
  ASSERT_TRUE(direct);
  EXPECT_EQ(direct->status, 401);
  EXPECT_EQ(agent.Get("/v1/models")->status, 401);
  EXPECT_EQ(agent.Get("/health")->status, 200);
  EXPECT_EQ(agent.Get("/metrics")->status, 200);
  const httplib::Headers agent_key = {{"Authorization", "bearer sk-agent-key"}};
  EXPECT_EQ(agent.Get("/v1/models", agent_key)->status, 200);
}

// A router not given the agents' key (it sends its own, which they refuse)
// says why it serves nothing: the /v1/models refusal, in its log once, in
// its /health and in the 503 a request gets. Before, it logged the agent
// healthy and answered only "no agent is ready yet".
TEST(RouterAgentKey, ARouterTheAgentsRefuseSaysWhy) {
  Agent decode({"--role", "decode", "--api-key", "sk-agent-key"});
  tandem::router::RouterConfig config;
  config.port = 0;
  config.poll_interval_s = 0.1;
  config.api_key = "sk-router-key";
  config.api_key_exempt = {"/health"};
  config.decode.push_back({"decode-0", "127.0.0.1", decode.port()});
  tandem::router::Router router(config);
  router.start();
  httplib::Client client("127.0.0.1", router.port());
  const std::string why =
      "agent decode-0 refused GET /v1/models with HTTP 401: give the router the agents' API key "
      "(--agent-api-key or TANDEM_AGENT_API_KEY)";
  std::string health;
  EXPECT_TRUE(eventually([&] {
    auto res = client.Get("/health");
    health = res ? res->body : "";
    return res && res->status == 503 && health.find(why) != std::string::npos;
  })) << health;
  const httplib::Headers key = {{"Authorization", "Bearer sk-router-key"}};
  auto res = client.Post("/v1/completions", key, greedy(randomPrompt(20, 902), 4).dump(),
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_NE(res->body.find("no agent is ready yet: " + why), std::string::npos) << res->body;
  router.stop(1.0);
}

// Pools that store KV differently (here the block size; a kvDtype works
// the same), as while a rollout changes one pool's: the decode agent
// refuses the transfer (400 naming kv_transfer_params), and the router
// falls back to prefilling there, as the docs say, releasing the prefill
// agent's hold. Before, the client got that 400, about a field it never
// sent, for every disaggregated request.
TEST_F(RouterTest, ADecodeAgentThatCannotReadTheTransferPrefillsItself) {
  RouterClusterOptions options;
  options.policy = Policy::kRoundRobin;
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{"--block-size", "32"} : std::vector<std::string>{};
  };
  startCluster(options);
  Agent colocated;
  for (bool stream : {false, true}) {
    json body = greedy(randomPrompt(70, 903 + (stream ? 1 : 0)), 6);
    const json expected = colocated.post("/v1/completions", body);
    if (stream) {
      EXPECT_EQ(streamedTokens(body), tokenIds(expected));
      continue;
    }
    const Answer answer = post(body);
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decision, "local_prefill");
    EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
  }
  EXPECT_EQ(routerMetric("tandem_router_transfer_refusals_total"), 2);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"retried\""), 2);
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }))
      << "the prefill agent's holds were released";
}

// A constrained request through the router: prefilled on the prefill agent
// (which samples its first token under the mask too) and decoded on the
// decode agent, it gives the colocated agent's tokens; a constraint the
// compilers refuse is the router's own 400.
TEST_F(RouterTest, StructuredOutputsAcrossTheHandOffEqualColocated) {
  start(1, 1);
  Agent colocated;
  const json schema = json::parse(R"({"type": "object", "properties": {
      "city": {"enum": ["Oslo", "Rome"]}, "days": {"type": "integer", "minimum": 1,
      "maximum": 9}, "note": {"type": "string", "maxLength": 5}}, "required": ["city", "days"]})");
  for (uint32_t seed : {71u, 72u, 73u}) {
    json body = greedy(randomPrompt(70, seed), 60);
    body.erase("ignore_eos");
    body["guided_json"] = schema;
    if (seed == 72u) {
      body["temperature"] = 1.0;
      body["seed"] = seed;
    }
    const json expected = colocated.post("/v1/completions", body);
    Answer answer = post(body);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decision, "disaggregated");
    EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
    EXPECT_EQ(answer.body["choices"][0]["text"], expected["choices"][0]["text"]);
    EXPECT_EQ(answer.body["choices"][0]["finish_reason"], "stop");
    const json parsed = json::parse(answer.body["choices"][0]["text"].get<std::string>());
    EXPECT_TRUE(parsed["city"] == "Oslo" || parsed["city"] == "Rome") << parsed.dump();
  }
  json refused = greedy(randomPrompt(20, 1), 4);
  refused["guided_regex"] = "(a)\\1";
  Answer answer = post(refused);
  EXPECT_EQ(answer.status, 400);
  EXPECT_EQ(answer.body["error"]["param"], "guided_regex");
  EXPECT_TRUE(answer.decision.empty());  // never sent to an agent
}

// n > 1 through the router: the choices share the prompt on one decode
// agent (prefilled there, not handed off), and equal the colocated answer.
TEST_F(RouterTest, SeveralChoicesArePrefilledOnTheDecodeAgent) {
  start(1, 1);
  Agent colocated;
  json body = greedy(randomPrompt(70, 950), 6);
  body["n"] = 3;
  body["temperature"] = 1.0;
  body["seed"] = 7;
  body["stream"] = true;
  const std::string raw = client_->Post("/v1/completions", body.dump(), "application/json")->body;
  // The decision (disaggregated for this new prompt) was overridden: its
  // prediction was another path's, so the answer taught the learned costs
  // nothing, and no prediction ratio was observed.
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos) << raw;
  EXPECT_EQ(routerMetric("tandem_router_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(routerMetric("tandem_router_ttft_prediction_ratio_count"), 0);
  body["stream"] = false;
  Answer answer = post(body);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  ASSERT_EQ(answer.body["choices"].size(), 3u);
  EXPECT_EQ(answer.body["choices"], colocated.post("/v1/completions", body)["choices"]);
}

// A client's own resumed stream (resume_token_ids) with echo and logprobs
// needs no prompt position's logprobs (the stream it resumes sent them): it
// is disaggregated as any request, its prefill call without echo, and
// answers as an agent alone does. Before, the prefill agent refused it
// ("echo needs every prompt position computed by this agent").
TEST_F(RouterTest, AResumedStreamWithEchoAndLogprobsIsPrefilledOnAPrefillAgent) {
  start(1, 1);
  Agent colocated;
  json body = greedy(randomPrompt(70, 955), 6);
  const std::vector<int> all = tokenIds(colocated.post("/v1/completions", body));
  ASSERT_EQ(all.size(), 6u);
  body["stream"] = true;
  body["echo"] = true;
  body["logprobs"] = 1;
  body["resume_token_ids"] = std::vector<int>(all.begin(), all.begin() + 2);
  // The token ids and logprobs a stream carries.
  auto read = [](const std::string& sse) {
    json tokens = json::array(), logprobs = json::array();
    std::istringstream events(sse);
    for (std::string line; std::getline(events, line);) {
      if (!line.starts_with("data: {")) continue;
      const json event = json::parse(line.substr(6));
      if (!event.contains("choices")) {
        tokens.push_back(event);  // an error event
        continue;
      }
      const json& choice = event["choices"][0];
      for (const json& id : choice.value("token_ids", json::array())) tokens.push_back(id);
      for (const json& value : choice["logprobs"].value("token_logprobs", json::array())) {
        logprobs.push_back(value);
      }
    }
    return std::pair{tokens, logprobs};
  };
  auto res = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("x-tandem-decision"), "disaggregated") << res->body;
  const auto alone = colocated.client()->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(alone);
  EXPECT_EQ(read(res->body), read(alone->body)) << res->body;
  EXPECT_EQ(read(res->body).first, json(std::vector<int>(all.begin() + 2, all.end())));
  EXPECT_EQ(read(res->body).second.size(), 4u) << res->body;
}

// The prompt's logprobs (echo with logprobs, prompt_logprobs) are computed
// where they are asked for, best_of's candidates share the prompt, and a
// batch of prompts is answered as one: all prefilled on the decode agent,
// equal to the colocated answer.
TEST_F(RouterTest, PromptLogprobsAndBestOfArePrefilledOnTheDecodeAgent) {
  start(1, 1);
  Agent colocated;
  json echoed = greedy(randomPrompt(70, 951), 6);
  echoed["echo"] = true;
  echoed["logprobs"] = 2;
  echoed["prompt_logprobs"] = 1;
  Answer answer = post(echoed);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  ASSERT_EQ(answer.body["choices"][0]["prompt_logprobs"].size(), 70u);
  EXPECT_EQ(answer.body["choices"], colocated.post("/v1/completions", echoed)["choices"]);

  json ranked = greedy(randomPrompt(70, 952), 5);
  ranked["n"] = 2;
  ranked["best_of"] = 3;
  ranked["temperature"] = 1.0;
  ranked["seed"] = 11;
  answer = post(ranked);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  ASSERT_EQ(answer.body["choices"].size(), 2u);
  EXPECT_EQ(answer.body["choices"], colocated.post("/v1/completions", ranked)["choices"]);

  // A batch of prompts is answered as one, by the decode agent (a client's
  // kv_transfer_params dropped, as for one prompt).
  json batch = greedy({1}, 5);
  batch["prompt"] = {randomPrompt(70, 953), randomPrompt(40, 954), "the river"};
  json spoofed = batch;
  spoofed["kv_transfer_params"] = {{"do_remote_prefill", true}, {"remote_block_ids", {1, 2}}};
  answer = post(spoofed);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  ASSERT_EQ(answer.body["choices"].size(), 3u);
  const json alone = colocated.post("/v1/completions", batch);
  EXPECT_EQ(answer.body["choices"], alone["choices"]);
  EXPECT_EQ(answer.body["usage"], alone["usage"]);
  EXPECT_EQ(prefill_[0]->metric("tandem_prompt_tokens_total"), 0);
}

// vLLM's allowed_token_ids, bad_words and truncate_prompt_tokens across the
// hand-off (the router parses requests with the agents' parser, so its block
// hashes are the truncated prompt's): the answer equals a colocated agent's.
TEST_F(RouterTest, VllmsTokenFieldsCrossTheHandOffAsOnAColocatedAgent) {
  start(1, 1);
  Agent colocated;
  json body = greedy(randomPrompt(90, 961), 6);
  body["truncate_prompt_tokens"] = 70;
  body["allowed_token_ids"] = {5, 9, 300, 301, 302, 400};
  body["bad_words"] = {"the", "and"};
  const json expected = colocated.post("/v1/completions", body);
  ASSERT_EQ(expected["usage"]["prompt_tokens"], 70) << expected;
  Answer answer = post(body);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "disaggregated");
  EXPECT_EQ(answer.blocks_moved, 4);  // the 70 tokens' 4 whole blocks
  EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
  EXPECT_EQ(answer.body["usage"]["prompt_tokens"], 70);
}

// A text prompt cut by truncate_prompt_tokens goes on to the agents as the
// ids the router kept: agents taking bodies of 4 KiB at most serve a prompt
// of twice what could fit max_model_len (the router's text bound is 4
// times) cut to 70 tokens, as a colocated agent taking it whole does.
TEST_F(RouterTest, ATruncatedTextPromptReachesTheAgentsAsTheIdsKept) {
  RouterClusterOptions options;
  options.agent_args = [](bool, int) {
    return std::vector<std::string>{"--max-body-bytes", "4096"};
  };
  startCluster(options);
  Agent colocated;
  const auto per_token = tandem::Tokenizer::fromDirectory(tinyModelDir())->maxTextBytesPerToken();
  ASSERT_TRUE(per_token.has_value());
  const auto models = colocated.client()->Get("/v1/models");
  ASSERT_TRUE(models);
  const auto max_model_len = json::parse(models->body)["data"][0]["max_model_len"].get<int64_t>();
  const char* const words[] = {"the", "river", "carried", "seven", "stones", "north,", "and"};
  std::string text;
  for (uint32_t i = 0; text.size() < 2 * static_cast<size_t>(*per_token * max_model_len); ++i) {
    text += words[(i * 2654435761u >> 7) % 7];
    text += ' ';
  }
  ASSERT_GT(text.size(), 4096u);
  json body = greedy({1}, 6);
  body["prompt"] = text;
  body["truncate_prompt_tokens"] = 70;
  const json expected = colocated.post("/v1/completions", body);
  ASSERT_EQ(expected["usage"]["prompt_tokens"], 70) << expected;
  Answer answer = post(body);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "disaggregated");
  EXPECT_EQ(answer.blocks_moved, 4);
  EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
  EXPECT_EQ(answer.body["usage"]["prompt_tokens"], 70);
}

// The TCP connections whose remote port is one of `ports` (/proc/net/tcp
// and tcp6), as "local remote", that a client of these listeners closed
// first: in TIME_WAIT, or with `closing` also those on their way there
// (FIN_WAIT1, FIN_WAIT2, CLOSING).
std::set<std::string> timeWaitsTowards(const std::set<int>& ports, bool closing = false) {
  std::set<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = remote.rfind(':');
      const bool waits =
          state == "06" || (closing && (state == "04" || state == "05" || state == "0B"));
      if (!waits || colon == std::string::npos) continue;
      if (ports.count(std::stoi(remote.substr(colon + 1), nullptr, 16))) {
        found.insert(local + " " + remote);
      }
    }
  }
  return found;
}

// The router's calls to its agents ask them to close first (Connection:
// close) and wait for it: the TIME_WAIT each closed connection leaves is the
// agents' (on their listening port), never the router's, whose ephemeral
// ports to one agent would otherwise run out at some 470 calls a second.
TEST_F(RouterTest, AgentsCloseTheRoutersConnectionsFirst) {
  start(1, 1);
  const std::set<int> agent_ports = {prefill_[0]->port(), decode_[0]->port()};
  // What the router's start-up closed (a first KV event stream, say) is not
  // this test's.
  const std::set<std::string> before = timeWaitsTowards(agent_ports, /*closing=*/true);
  for (uint32_t seed = 0; seed < 10; ++seed) {
    Answer answer = post(greedy(randomPrompt(40, 980 + seed), 4));
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decision, "disaggregated");
  }
  EXPECT_FALSE(streamedTokens(greedy(randomPrompt(40, 990), 4)).empty());
  std::vector<std::string> new_ones;
  for (const std::string& entry : timeWaitsTowards(agent_ports)) {
    if (!before.count(entry)) new_ones.push_back(entry);
  }
  // The calls (two or more per completion, polls every 0.1 s) leave none;
  // a KV event stream the router drops and opens again (a gap in its
  // events) is the router's to close, rarely.
  EXPECT_LE(new_ones.size(), 2u) << new_ones.size() << " router-side TIME_WAITs, e.g. "
                                 << new_ones.front();
}

TEST_F(RouterTest, ShortUncachedPromptsArePrefilledOnTheDecodeAgent) {
  start(1, 1, Policy::kKv, /*disagg_threshold_tokens=*/64);
  Agent colocated;
  const std::vector<int> prompt = randomPrompt(40, 64);
  Answer answer = post(greedy(prompt, 6));
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  EXPECT_EQ(answer.prefill_agent, "decode-0");
  EXPECT_EQ(tokenIds(answer.body), tokenIds(colocated.post("/v1/completions", greedy(prompt, 6))));
  EXPECT_TRUE(eventually([&] {
    return routerMetric("tandem_router_requests_total", "decision=\"local_prefill\"") == 1;
  }));
  EXPECT_EQ(prefill_[0]->metric("tandem_prompt_tokens_total"), 0);
}

// Turn 1 of a conversation (70 prompt tokens, 70 generated), then turn 2
// (180 tokens) once the index knows where turn 1's blocks are: turn 2 goes
// to turn 1's decode agent (8 blocks), which, holding 4 more blocks than
// the prefill agent, lends them (pull-back). Both answers equal
// `colocated`'s; `request` makes a body of a prompt and a max_tokens.
void RouterTest::turnTwoFollowsTurnOne(
    Agent& colocated, const std::function<json(const std::vector<int>&, int)>& request) {
  std::vector<int> conversation = randomPrompt(70, 65);
  Answer first = post(request(conversation, 70));
  ASSERT_EQ(first.status, 200) << first.body.dump();
  ASSERT_EQ(first.decision, "disaggregated");
  const std::vector<int> reply = tokenIds(first.body);
  EXPECT_EQ(reply, tokenIds(colocated.post("/v1/completions", request(conversation, 70))));
  conversation.insert(conversation.end(), reply.begin(), reply.end());
  const std::vector<int> question = randomPrompt(40, 66);
  conversation.insert(conversation.end(), question.begin(), question.end());
  // The index learns what each agent holds, and the router sees turn 1 gone
  // from its decode agent (a stale running request would weigh against it).
  ASSERT_TRUE(eventually([&] {
    return routerMetric("tandem_router_index_blocks", "agent=\"" + first.decode_agent + "\"") >= 8;
  }));
  ASSERT_TRUE(eventually([&] {
    return routerMetric("tandem_router_agent_requests", "agent=\"" + first.decode_agent + "\"") ==
           0;
  }));
  Answer second = post(request(conversation, 8));
  ASSERT_EQ(second.status, 200) << second.body.dump();
  EXPECT_EQ(second.decode_agent, first.decode_agent);
  EXPECT_EQ(second.decision, "pull_back");
  EXPECT_EQ(tokenIds(second.body),
            tokenIds(colocated.post("/v1/completions", request(conversation, 8))));
}

// Turn 2 of a conversation goes to the decode agent holding turn 1, which
// lends its blocks to the prefill agent (pull-back). With `adapter`, every
// request names that LoRA adapter (the agents serve it): the router hashes,
// holds and lends the adapter's blocks.
void RouterTest::conversationFollowsItsKv(const std::string& adapter) {
  // What turn 1's transfer took on a loaded machine must not price turn 2's
  // pull-back out: the model's predictions alone decide here.
  RouterClusterOptions options;
  options.prefills = 2;
  options.decodes = 2;
  options.learn_costs = false;
  std::vector<std::string> agent_args;
  if (!adapter.empty()) agent_args = loraArgs();
  options.agent_args = [agent_args](bool, int) { return agent_args; };
  startCluster(options);
  Agent colocated(agent_args);
  auto request = [&](const std::vector<int>& prompt, int max_tokens) {
    json body = greedy(prompt, max_tokens);
    if (!adapter.empty()) body["model"] = adapter;
    return body;
  };
  turnTwoFollowsTurnOne(colocated, request);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(eventually(
      [&] { return routerMetric("tandem_router_requests_total", "decision=\"pull_back\"") == 1; }));
  double pulled = 0;
  for (auto& agent : prefill_) {
    pulled += agent->metric("tandem_kv_blocks_loaded_total", "source=\"ucx\"");
  }
  EXPECT_GE(pulled, 4) << "the prefill agent read the lent blocks";
  for (auto& agent : decode_) {
    EXPECT_TRUE(eventually([&] { return agent->metric("tandem_kv_held_blocks") == 0; }));
  }
  for (auto& agent : prefill_) {
    EXPECT_TRUE(eventually([&] { return agent->metric("tandem_kv_held_blocks") == 0; }));
  }
}

TEST_F(RouterTest, ConversationsFollowTheirKvAndPullBackLendsTheDecodePrefix) {
  conversationFollowsItsKv("");
}

TEST_F(RouterTest, ALoraAdaptersConversationIsLentItsOwnBlocks) { conversationFollowsItsKv("sql"); }

TEST_F(RouterTest, RoundRobinIgnoresWhereTheKvIs) {
  start(1, 2, Policy::kRoundRobin);
  std::vector<std::string> decoders;
  const std::vector<int> prompt = randomPrompt(70, 67);
  for (int i = 0; i < 4; ++i) {
    Answer answer = post(greedy(prompt, 4));
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    decoders.push_back(answer.decode_agent);
  }
  EXPECT_NE(decoders[0], decoders[1]) << "the same prompt alternates between decode agents";
  EXPECT_EQ(decoders[0], decoders[2]);
}

TEST_F(RouterTest, BadInputGetsTheAgentsErrorsAndClientKvParamsAreIgnored) {
  start(1, 1);
  json bad = greedy(randomPrompt(20, 68), 4);
  bad["max_tokens"] = -1;
  Answer from_router = post(bad);
  int agent_status = 0;
  json from_agent = decode_[0]->post("/v1/completions", bad, &agent_status);
  EXPECT_EQ(from_router.status, agent_status);
  EXPECT_EQ(from_router.body, from_agent);
  json missing_model = greedy(randomPrompt(20, 68), 4);
  missing_model["model"] = "other";
  from_router = post(missing_model);
  from_agent = decode_[0]->post("/v1/completions", missing_model, &agent_status);
  EXPECT_EQ(from_router.status, agent_status);
  EXPECT_EQ(from_router.body, from_agent);
  // Counted by the router (no agent saw them through it), as an agent counts
  // what it refuses under finish_reason="invalid".
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"invalid\""), 2);
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"invalid\""), 2)
      << "the two sent to the agent directly";

  json spoofed = greedy(randomPrompt(70, 69), 4);
  spoofed["kv_transfer_params"] = {{"do_remote_prefill", true}, {"remote_block_ids", {1, 2, 3}}};
  Answer answer = post(spoofed);
  EXPECT_EQ(answer.status, 200) << "client kv_transfer_params are stripped: " << answer.body.dump();
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"invalid\""), 2);
}

// A streamed request that passes the checks but that nothing can continue
// at its first token (its structured output against its allowed ids) is
// answered through the router as the agent answers it: a 200 stream whose
// one event is the error, then [DONE]. Before, the prefill agent's 400
// reached the client as a plain HTTP 400 on the disaggregated path, so the
// same request failed one way on an agent and another through the router.
// A whole answer keeps the 400, as on an agent.
TEST_F(RouterTest, AStreamRefusedAtItsFirstTokenIsAnErrorEventAsOnAnAgent) {
  start(1, 1);
  json body = greedy(randomPrompt(70, 70), 4);
  body["guided_choice"] = json::array({"ab"});
  body["allowed_token_ids"] = json::array({0});
  body["stream"] = true;
  Agent colocated;
  auto from_agent = colocated.client()->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(from_agent);
  ASSERT_EQ(from_agent->status, 200);
  ASSERT_NE(from_agent->body.find("\"error\""), std::string::npos) << from_agent->body;
  auto through_router = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(through_router);
  EXPECT_EQ(through_router->status, 200) << through_router->body;
  EXPECT_EQ(through_router->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(through_router->body, from_agent->body);
  EXPECT_GE(prefill_[0]->metric("tandem_prompt_tokens_total"), 70)
      << "the request went the disaggregated way";

  body["stream"] = false;
  int agent_status = 0;
  const json whole_from_agent = colocated.post("/v1/completions", body, &agent_status);
  Answer whole = post(body);
  EXPECT_EQ(agent_status, 400);
  EXPECT_EQ(whole.status, agent_status);
  EXPECT_EQ(whole.body, whole_from_agent);
  // The two fields that leave nothing: the structured output's, and the ids.
  EXPECT_EQ(whole.body["error"]["param"], "guided_choice") << whole.body;
  EXPECT_NE(whole.body["error"]["message"].get<std::string>().find("allowed_token_ids"),
            std::string::npos)
      << whole.body;
  for (Agent* agent : {prefill_[0].get(), decode_[0].get()}) {
    EXPECT_TRUE(eventually([&] { return agent->metric("tandem_kv_held_blocks") == 0; }));
    EXPECT_EQ(agent->metric("tandem_num_requests_running"), 0);
  }
}

// The tiny model with a chat template that puts the hour in the prompt, as
// Llama 3.1's puts the date.
fs::path clockTemplateModel(const TempDir& dir) {
  const fs::path model = dir.path() / "tiny-clock";
  fs::copy(tinyModelDir(), model, fs::copy_options::recursive);
  const fs::path config_path = model / "tokenizer_config.json";
  json config = json::parse(readFile(config_path));
  config["chat_template"] =
      "Now: {{ strftime_now('%Y-%m-%d %H') }}h\n" + config["chat_template"].get<std::string>();
  writeFile(config_path, config.dump());
  return model;
}

// A chat template that reads the clock renders the same prompt on the
// prefill and the decode agent through the router, though their time zones
// are 9 hours apart: the router sends the time its own render showed
// (chat_template_time) and the decode agent reads the prefill agent's KV.
// Called directly without it, the two agents render different prompts and
// the decode agent computes its own (which shows the zones do differ).
TEST_F(RouterTest, AChatTemplateReadingTheClockRendersOnePromptOnBothAgents) {
  TempDir dir("tandem-router-clock");
  RouterClusterOptions options;
  options.model = clockTemplateModel(dir);
  options.agent_env = [](bool prefill, int) {
    return Agent::Environment{{"TZ", prefill ? "UTC0" : "XXX-9"}};
  };
  startCluster(options);
  std::string question;
  for (int i = 0; i < 6; ++i) question += "Tell me about the sea and its tides. ";
  const json body = {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", question}}}},
                     {"max_tokens", 4},
                     {"temperature", 0}};
  Answer answer = post(body, "/v1/chat/completions");
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "disaggregated");
  Agent& decoder = *decode_[0];
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"prefix_mismatch\""), 0);
  EXPECT_GT(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }));

  // The same request sent to each agent by hand, without the time.
  json to_prefill = body;
  to_prefill["kv_transfer_params"] = {{"do_remote_decode", true}};
  to_prefill["max_tokens"] = 1;
  const json prefilled = prefill_[0]->post("/v1/chat/completions", to_prefill);
  ASSERT_TRUE(prefilled.contains("kv_transfer_params")) << prefilled.dump();
  json to_decode = body;
  to_decode["kv_transfer_params"] = prefilled["kv_transfer_params"];
  to_decode["kv_transfer_params"]["do_remote_prefill"] = true;
  int status = 0;
  const json decoded = decoder.post("/v1/chat/completions", to_decode, &status);
  EXPECT_EQ(status, 200) << decoded.dump();
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"prefix_mismatch\""), 1);
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }));
}

// Sends `signal` to the first decode agent seen running a request (all are
// watched at once: a dead one answers nothing and must not delay the rest)
// and sets `signalled` to it (left null when none was seen). Not before
// `answer_started` holds: an agent killed before the router saw the
// answer's first token fails a request the client heard nothing of, which
// the router sends again as a new one instead of moving it.
std::thread signalRunningDecodeAgent(std::vector<std::unique_ptr<Agent>>& agents, int signal,
                                     std::function<bool()> answer_started,
                                     Agent** signalled = nullptr) {
  return std::thread([&agents, signal, answer_started = std::move(answer_started), signalled] {
    if (!eventually(answer_started, std::chrono::seconds(20))) return;
    eventually(
        [&] {
          for (auto& agent : agents) {
            if (agent->metric("tandem_num_requests_running") > 0) {
              agent->process().signal(signal);
              if (signalled != nullptr) *signalled = agent.get();
              return true;
            }
          }
          return false;
        },
        std::chrono::seconds(4));
  });
}

std::thread RouterTest::signalDecodeAgentMidAnswer(int signal, Agent** signalled) {
  const std::string ttfts = "tandem_router_time_to_first_token_seconds_count";
  const double before = routerMetric(ttfts);
  return signalRunningDecodeAgent(
      decode_, signal, [this, ttfts, before] { return routerMetric(ttfts) > before; }, signalled);
}

// A stream that moved (or not) is the undisturbed one: no error event, one
// [DONE], the same token ids and text.
void expectSameStream(const StreamedCompletion& got, const StreamedCompletion& expected) {
  EXPECT_EQ(got.errors, "");
  EXPECT_EQ(got.done, 1);
  EXPECT_EQ(got.ids, expected.ids);
  EXPECT_EQ(got.text, expected.text);
}
// Each stream is its undisturbed one.
void expectSameStreams(const std::vector<StreamedCompletion>& got,
                       const std::vector<StreamedCompletion>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    expectSameStream(got[i], expected[i]);
  }
}

TEST_F(RouterTest, AKilledPrefillAgentIsRoutedAroundAndAKilledDecodeAgentsStreamMoves) {
  // The small model: the long stream below lasts seconds, so the kill lands
  // mid-stream. A stream with no agent left waits 2 s for one to come.
  RouterClusterOptions options;
  options.decodes = 3;
  options.model = smallModelDir();
  options.migration_timeout_s = 2;
  startCluster(options);
  Agent colocated({}, smallModelDir());
  const std::vector<int> prompt = randomPrompt(70, 70);
  const std::vector<int> expected = tokenIds(colocated.post("/v1/completions", greedy(prompt, 6)));
  prefill_[0]->process().signal(SIGKILL);
  Answer answer = post(greedy(prompt, 6));
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(tokenIds(answer.body), expected) << "prefilled on the decode agent instead";
  EXPECT_EQ(answer.decision, "local_prefill");
  EXPECT_GE(routerMetric("tandem_router_upstream_errors_total", "agent=\"prefill-0\""), 1);

  // A decode agent killed mid-stream: the other decode agent resumes the
  // answer from the tokens sent, and the client's stream is the one an
  // undisturbed agent gives, token for token and byte for byte of text.
  json long_body = greedy(randomPrompt(30, 71), 600);
  long_body["stream"] = true;
  const StreamedCompletion undisturbed = parseStream(
      colocated.client()->Post("/v1/completions", long_body.dump(), "application/json")->body);
  ASSERT_EQ(undisturbed.ids.size(), 600u);
  std::thread killer = signalDecodeAgentMidAnswer(SIGKILL);
  auto res = client_->Post("/v1/completions", long_body.dump(), "application/json");
  killer.join();
  ASSERT_TRUE(res);
  const StreamedCompletion moved = parseStream(res->body);
  expectSameStream(moved, undisturbed);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"failure\""), 1);
  // The prefill agent is dead: the resuming agent recomputed the prompt.
  EXPECT_EQ(routerMetric("tandem_router_migration_prefixes_total", "source=\"recomputed\""), 1);

  // A decode agent killed in the middle of a whole (not streamed) answer:
  // the router had not relayed any of it, so it sends the request again to
  // the last decode agent, and the client gets the undisturbed answer.
  json whole_body = long_body;
  whole_body.erase("stream");
  const double ttfts_before = routerMetric("tandem_router_time_to_first_token_seconds_count");
  std::thread whole_killer = signalDecodeAgentMidAnswer(SIGKILL);
  Answer whole = post(whole_body);
  whole_killer.join();
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  EXPECT_EQ(tokenIds(whole.body), undisturbed.ids);
  EXPECT_EQ(whole.body["choices"][0]["text"], undisturbed.text);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resent\",reason=\"failure\""),
            1);
  // Its first token was seen on the killed agent: the answer's TTFT is
  // observed once, not again for the resent request.
  EXPECT_EQ(routerMetric("tandem_router_time_to_first_token_seconds_count"), ttfts_before + 1);

  // The last decode agent killed mid-stream: nowhere to move (none came
  // within --migration-timeout), so the client gets an error event and the
  // end of the stream.
  std::thread last_killer = signalDecodeAgentMidAnswer(SIGKILL);
  auto cut = client_->Post("/v1/completions", long_body.dump(), "application/json");
  last_killer.join();
  ASSERT_TRUE(cut);
  const StreamedCompletion ended = parseStream(cut->body);
  EXPECT_NE(ended.errors.find("failed mid-stream: no decode agent left to resume it on"),
            std::string::npos)
      << cut->body.substr(cut->body.size() > 2000 ? cut->body.size() - 2000 : 0);
  EXPECT_EQ(ended.done, 1);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"failure\""),
      1);
}

// A TCP proxy in front of an agent that relays every connection both ways,
// except the first completion's answer: that one is cut at a chosen SSE
// event (its bytes up to the event's end go through), then reset, as if the
// agent died there.
class CuttingProxy {
 public:
  // Cuts after the event containing `marker` (the first occurrence).
  CuttingProxy(int upstream_port, std::string marker)
      : upstream_port_(upstream_port), marker_(std::move(marker)) {
    listener_ = listenLoopback(&port_);
    if (listener_ < 0) throw std::runtime_error("the proxy cannot listen");
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~CuttingProxy() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    ::close(listener_);
    for (std::thread& relay : relays_) relay.join();
  }
  int port() const { return port_; }
  bool cut() const { return cut_; }

 private:
  void acceptLoop() {
    for (;;) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      if (stopping_) {
        ::close(client);
        return;
      }
      relays_.emplace_back([this, client] { relay(client); });
    }
  }

  void relay(int client) {
    const int upstream = connectLoopback(upstream_port_);
    if (upstream < 0) {
      ::close(client);
      return;
    }
    bool completion = false, cutting = false;
    std::string answer;  // what the agent sent, while cutting
    size_t forwarded = 0;
    pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
    char buffer[16384];
    while (!stopping_) {
      if (::poll(fds, 2, 100) <= 0) continue;
      if (fds[0].revents != 0) {
        const ssize_t n = ::read(client, buffer, sizeof buffer);
        if (n <= 0) break;
        const std::string_view request(buffer, static_cast<size_t>(n));
        if (!completion && request.starts_with("POST /v1/completions")) {
          completion = true;
          cutting = !claimed_.exchange(true);
        }
        if (!sendAll(upstream, request)) break;
      }
      if (fds[1].revents != 0) {
        const ssize_t n = ::read(upstream, buffer, sizeof buffer);
        if (n <= 0) break;
        if (!cutting) {
          if (!sendAll(client, std::string_view(buffer, static_cast<size_t>(n)))) break;
          continue;
        }
        answer.append(buffer, static_cast<size_t>(n));
        const size_t marker = answer.find(marker_);
        const size_t end =
            marker == std::string::npos ? std::string::npos : answer.find("\n\n", marker);
        const size_t upto = end == std::string::npos ? answer.size() : end + 2;
        // Said before the event goes through: the router may answer its
        // client, and the test ask, as soon as it has read it.
        if (end != std::string::npos) cut_ = true;
        // Everything before the cut goes through as it comes.
        if (!sendAll(client, std::string_view(answer).substr(forwarded, upto - forwarded))) {
          break;
        }
        forwarded = upto;
        if (end != std::string::npos) {
          resetAndClose(client);
          resetAndClose(upstream);
          return;
        }
      }
    }
    ::close(upstream);
    ::close(client);
  }

  int upstream_port_;
  std::string marker_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false}, claimed_{false}, cut_{false};
  std::thread acceptor_;
  std::vector<std::thread> relays_;  // the acceptor's only
};

// A decode agent that dies after its answer's last token is sent, before
// [DONE] or before the end of the body: the answer is whole, so the router
// ends the stream itself (no resume: an agent would refuse to continue a
// finished answer), with exactly one [DONE], and keeps serving. (A
// miscompiled coroutine on this path once killed the router.)
class RouterCutAfterTheLastToken : public RouterCluster,
                                   public ::testing::WithParamInterface<const char*> {};

TEST_P(RouterCutAfterTheLastToken, EndsTheStreamOnceAndKeepsServing) {
  std::unique_ptr<CuttingProxy> proxy;
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 1;
  options.router_port_of = [&](bool prefill, int, int port) {
    if (prefill) return port;
    proxy = std::make_unique<CuttingProxy>(port, GetParam());
    return proxy->port();
  };
  startCluster(options);
  json body = greedy(randomPrompt(40, 91), 12);
  body["stream"] = true;
  Agent colocated;
  const StreamedCompletion undisturbed = parseStream(
      colocated.client()->Post("/v1/completions", body.dump(), "application/json")->body);
  ASSERT_EQ(undisturbed.ids.size(), 12u);

  auto res = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << "the stream did not end whole: " << httplib::to_string(res.error());
  EXPECT_TRUE(proxy->cut()) << "the agent's answer was not cut";
  const StreamedCompletion ended = parseStream(res->body);
  EXPECT_EQ(ended.ids, undisturbed.ids);
  EXPECT_EQ(ended.text, undisturbed.text);
  EXPECT_EQ(ended.done, 1) << res->body;
  EXPECT_EQ(ended.errors, "");
  const std::string metrics = routerMetrics();
  EXPECT_EQ(prometheusSum(metrics, "tandem_router_migrations_total"), 0) << "nothing to resume";

  // Still serving: the next stream goes through whole.
  auto next = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(parseStream(next->body).ids, undisturbed.ids);
  // The agent that was cut off let go of the request's blocks.
  EXPECT_TRUE(eventually([&] { return decode_[0]->metric("tandem_kv_cache_usage_ratio") == 0; }));
}

INSTANTIATE_TEST_SUITE_P(Cuts, RouterCutAfterTheLastToken,
                         ::testing::Values("\"finish_reason\":\"", "data: [DONE]"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "BeforeDone" : "AfterDone");
                         });

// A stream of several choices is not moved when its decode agent dies (a
// resume continues one choice): it ends at once with an error saying why,
// instead of being offered to every other agent, each refusing it.
TEST_F(RouterTest, AStreamOfSeveralChoicesEndsWithAClearErrorWhenItsAgentDies) {
  start(1, 3, Policy::kKv, 16, 256, 1024, smallModelDir());
  json body = greedy(randomPrompt(30, 72), 600);
  body["stream"] = true;
  body["n"] = 2;
  std::thread killer = signalDecodeAgentMidAnswer(SIGKILL);
  auto res = client_->Post("/v1/completions", body.dump(), "application/json");
  killer.join();
  ASSERT_TRUE(res);
  const StreamedCompletion stream = parseStream(res->body);
  EXPECT_NE(
      stream.errors.find("a stream of several choices (n > 1, or several prompts) is not moved"),
      std::string::npos)
      << stream.errors;
  EXPECT_EQ(stream.done, 1);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"failure\""), 0);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"failure\""),
      1);
}

// A chat stream sampled at temperature 1 with a seed, whose client asked for
// no token ids and for usage, moves when its decode agent dies: the content
// and the usage are an undisturbed agent's, and the prompt's blocks are
// lent to the resuming agent by the prefill agent that computed them
// (round-robin disaggregates every prompt past 16 tokens).
TEST_F(RouterTest, ASeededChatStreamMovesToAnotherDecodeAgentUnchanged) {
  start(1, 2, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  Agent colocated({}, smallModelDir());
  // Long enough (over a hundred tokens) that reading the prompt's blocks
  // beats recomputing them.
  std::string question;
  for (int i = 0; i < 20; ++i) question += "Tell me about the sea, its tides and its storms. ";
  const json body = {{"model", "tiny"},   {"messages", {{{"role", "user"}, {"content", question}}}},
                     {"max_tokens", 500}, {"temperature", 1.0},
                     {"seed", 42},        {"ignore_eos", true},
                     {"stream", true},    {"stream_options", {{"include_usage", true}}}};
  auto contentOf = [](const std::string& stream, json& usage, int& done, std::string& errors) {
    std::string content;
    std::istringstream events(stream);
    for (std::string line; std::getline(events, line);) {
      if (line == "data: [DONE]") ++done;
      if (line.rfind("data: {", 0) != 0) continue;
      const json chunk = json::parse(line.substr(6));
      if (chunk.contains("error")) errors += line;
      if (chunk.contains("usage") && chunk["usage"].is_object()) usage = chunk["usage"];
      if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
      EXPECT_FALSE(chunk["choices"][0].contains("token_ids")) << line;
      content += chunk["choices"][0]["delta"].value("content", "");
    }
    return content;
  };
  json expected_usage, usage;
  int expected_done = 0, done = 0;
  std::string errors;
  const std::string expected = contentOf(
      colocated.client()->Post("/v1/chat/completions", body.dump(), "application/json")->body,
      expected_usage, expected_done, errors);
  ASSERT_EQ(expected_usage["completion_tokens"], 500);
  std::thread killer = signalDecodeAgentMidAnswer(SIGKILL);
  auto res = client_->Post("/v1/chat/completions", body.dump(), "application/json");
  killer.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(contentOf(res->body, usage, done, errors), expected);
  EXPECT_EQ(errors, "");
  EXPECT_EQ(done, 1);
  EXPECT_EQ(usage["completion_tokens"], 500);
  EXPECT_EQ(usage["prompt_tokens"], expected_usage["prompt_tokens"]);
  EXPECT_EQ(res->body.find("\"role\"", res->body.find("\"role\"") + 1), std::string::npos)
      << "the role is said once";
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"failure\""), 1);
  EXPECT_EQ(res->get_header_value("x-tandem-decision"), "disaggregated");
  EXPECT_EQ(routerMetric("tandem_router_migration_prefixes_total", "source=\"pulled\""), 1);
  double loaded = 0;  // by the surviving decode agent (a dead one answers nothing)
  for (auto& agent : decode_) loaded += agent->metric("tandem_kv_transfer_bytes_total");
  EXPECT_GT(loaded, 0) << "the resuming agent read the lent prefix";
}

// A decode agent that stops producing (SIGSTOP: a hung process, a frozen
// host) is a failure once nothing has come for the upstream timeout: the
// stream moves and ends as an undisturbed one does.
TEST_F(RouterTest, AStalledDecodeAgentsStreamMovesAfterTheUpstreamTimeout) {
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 2;
  options.model = smallModelDir();
  options.upstream_timeout_s = 2;
  startCluster(options);
  Agent colocated({}, smallModelDir());
  json body = greedy(randomPrompt(30, 73), 300);
  body["stream"] = true;
  const StreamedCompletion undisturbed = parseStream(
      colocated.client()->Post("/v1/completions", body.dump(), "application/json")->body);
  ASSERT_EQ(undisturbed.ids.size(), 300u);
  Agent* stopped = nullptr;
  std::thread stopper = signalDecodeAgentMidAnswer(SIGSTOP, &stopped);
  auto res = client_->Post("/v1/completions", body.dump(), "application/json");
  stopper.join();
  ASSERT_NE(stopped, nullptr);
  stopped->process().signal(SIGCONT);
  ASSERT_TRUE(res);
  const StreamedCompletion moved = parseStream(res->body);
  expectSameStream(moved, undisturbed);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"stall\""),
            1);
}

// `count` greedy streamed completions of `max_tokens`, prompts of 40, 41,
// ... random tokens from seeds `seed`, `seed` + 1, ...
std::vector<json> streamBodies(int count, uint32_t seed, int64_t max_tokens) {
  std::vector<json> bodies;
  for (int i = 0; i < count; ++i) {
    json body = greedy(randomPrompt(40 + i, seed + static_cast<uint32_t>(i)), max_tokens);
    body["stream"] = true;
    bodies.push_back(body);
  }
  return bodies;
}

// The streams a colocated agent of the small model gives `bodies`, all at once.
std::vector<StreamedCompletion> colocatedStreams(const std::vector<json>& bodies) {
  std::vector<StreamedCompletion> streams;
  Agent colocated({}, smallModelDir());
  for (auto& client : streamConcurrently(colocated.port(), bodies, streams)) client.join();
  return streams;
}

// A decode agent drained (POST /admin/drain, as SIGTERM) while streams run
// on it hands each over with its KV: the router resumes them on the other
// decode agents, which read the drained agent's blocks (prompt and output
// so far) instead of recomputing them, and every client's stream equals an
// undisturbed one. The drained agent exits once its blocks were read; the
// others end with no block referenced (Agent's destructor).
TEST_F(RouterTest, ADrainedDecodeAgentHandsItsStreamsOverWithTheirKv) {
  start(1, 3, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  constexpr int kStreams = 8;
  const std::vector<json> bodies = streamBodies(kStreams, 400, 160);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  std::vector<StreamedCompletion> streams;
  const auto streams_start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  Agent* drained = nullptr;
  std::thread drainer([&] {
    eventually(
        [&] {
          for (auto& agent : decode_) {
            if (agent->metric("tandem_num_requests_running") >= 2) {
              drained = agent.get();
              return true;
            }
          }
          return false;
        },
        std::chrono::seconds(20));
    if (drained == nullptr) return;
    auto res = drained->client()->Post("/admin/drain", "{}", "application/json");
    EXPECT_TRUE(res && res->status == 202) << (res ? res->body : "no answer");
  });
  for (auto& client : clients) client.join();
  const double streams_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - streams_start).count();
  drainer.join();
  ASSERT_NE(drained, nullptr) << "no decode agent ran two streams at once";
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    expectSameStream(streams[i], undisturbed[i]);
  }
  ChildProcess& process = drained->process();
  EXPECT_EQ(process.wait(std::chrono::seconds(30)), 0) << process.stderrText();
  const std::string log = process.stderrText();
  EXPECT_NE(log.find("drain: handed over"), std::string::npos) << log;
  EXPECT_EQ(log.find("were not read"), std::string::npos) << log;
  expectDrainMigrations(routerMetrics(), 2, streams_s);
}

// Streams asked at their start to be handed over (another decode agent
// could resume them then) whose agent drains after every other agent left
// (as a rollout to another model replaces the old agents one by one; here
// the other leaves the router's list): the
// router withdraws the ask once no agent could resume them, and the agent
// finishes them as it drains, each equal to an undisturbed stream. Before,
// the agent handed them to nobody, and each client got an error event after
// the router's migration timeout.
TEST_F(RouterTest, AStreamNobodyCouldResumeIsFinishedByItsDrainingAgent) {
  RouterClusterOptions options;
  options.decodes = 2;
  options.policy = Policy::kRoundRobin;
  options.model = smallModelDir();
  options.migration_timeout_s = 5;
  startCluster(options);
  const std::vector<json> bodies = streamBodies(2, 510, 300);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  Agent& first = *decode_[0];
  Agent& second = *decode_[1];
  bool drained = false;
  std::thread drainer([&] {
    // One stream on each agent, both begun while the other agent was fit.
    if (!eventually([&] {
          return first.metric("tandem_num_requests_running") >= 1 &&
                 second.metric("tandem_num_requests_running") >= 1;
        })) {
      return;
    }
    // The second leaves the router's list (its stream runs on there): the
    // first's stream has no agent left to move to.
    router_->setAgents({{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
                       {{"decode-0", "127.0.0.1", first.port()}});
    // The router looks at a stream's agent every 100 ms as its tokens come.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto res = first.client()->Post("/admin/drain", "{}", "application/json");
    drained = res && res->status == 202;
  });
  for (auto& client : clients) client.join();
  drainer.join();
  ASSERT_TRUE(drained) << "the streams never ran on both agents";
  expectSameStreams(streams, undisturbed);
  ChildProcess& process = first.process();
  EXPECT_EQ(process.wait(std::chrono::seconds(60)), 0) << process.stderrText();
  const std::string log = process.stderrText();
  EXPECT_EQ(log.find("were not read"), std::string::npos) << log;
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"drain\""), 0);
}

// The only decode agent, drained while streams run on it: nobody could
// resume them, so the router does not ask for them to be handed over and
// the agent finishes them before it exits (its --shutdown-timeout), each
// equal to an undisturbed stream. Asked to hand them over, it gave them to
// nobody and every client got an error event.
TEST_F(RouterTest, TheOnlyDecodeAgentDrainedFinishesItsStreams) {
  start(1, 1, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  const std::vector<json> bodies = streamBodies(3, 500, 240);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  Agent& decode = *decode_[0];
  bool drained = false;
  double running_when_drained = 0;
  std::thread drainer([&] {
    // Every stream runs on it: none arrives after the drain (it would be
    // refused, with no other agent to go to).
    if (!eventually([&] { return decode.metric("tandem_num_requests_running") >= 3; },
                    std::chrono::seconds(20))) {
      return;
    }
    auto res = decode.client()->Post("/admin/drain", "{}", "application/json");
    drained = res && res->status == 202;
    running_when_drained = decode.metric("tandem_num_requests_running");
  });
  for (auto& client : clients) client.join();
  drainer.join();
  ASSERT_TRUE(drained) << "the agent never ran the three streams at once, or refused the drain";
  EXPECT_GE(running_when_drained, 1) << "the streams ended before the drain: nothing was tested";
  expectSameStreams(streams, undisturbed);
  ChildProcess& process = decode.process();
  EXPECT_EQ(process.wait(std::chrono::seconds(30)), 0) << process.stderrText();
  EXPECT_EQ(process.stderrText().find("drain: handed over"), std::string::npos)
      << process.stderrText();
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"drain\""), 0);
}

// A request the only decode agent refuses because it drains (here: it was
// in prefill when the drain began, so the router had chosen that agent)
// waits for an agent to come, as a handed-over stream does, and is answered
// there with the tokens any agent gives it. Before, it was a 503 "every
// decode agent failed this request" while the replacement was starting.
TEST_F(RouterTest, ARequestEveryDrainingDecodeAgentRefusesWaitsForAReplacement) {
  RouterClusterOptions options;
  options.policy = Policy::kRoundRobin;
  options.model = smallModelDir();
  // The prompt's prefill takes steps (a step's end publishes the metrics):
  // it is seen running.
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{"--max-num-batched-tokens", "32"}
                   : std::vector<std::string>{};
  };
  startCluster(options);
  Agent newcomer(roleArgs("decode"), smallModelDir());
  Agent& decode = *decode_[0];
  // A stream of its own keeps decode-0 draining (a lone agent finishes it).
  json held = greedy(randomPrompt(30, 76), 600);
  held["ignore_eos"] = true;
  held["stream"] = true;
  std::thread holder([&] {
    httplib::Client client("127.0.0.1", decode.port());
    client.set_read_timeout(120, 0);
    client.Post("/v1/completions", held.dump(), "application/json");
  });
  const json body = greedy(randomPrompt(900, 77), 8);
  Answer answer;
  std::thread asker([&] { answer = post(body); });
  bool drained = false;
  bool refused = false;
  if (eventually([&] { return decode.metric("tandem_num_requests_running") >= 1; }) &&
      eventually([&] { return prefill_[0]->metric("tandem_num_requests_running") >= 1; },
                 std::chrono::seconds(20))) {
    auto res = decode.client()->Post("/admin/drain", "{}", "application/json");
    drained = res && res->status == 202;
    refused = eventually(
        [&] { return decode.metric("tandem_requests_total", "finish_reason=\"rejected\"") >= 1; });
    router_->setAgents(
        {{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
        {{"decode-0", "127.0.0.1", decode.port()}, {"decode-2", "127.0.0.1", newcomer.port()}});
  }
  asker.join();
  holder.join();
  ASSERT_TRUE(drained) << "the request's prefill was never seen running beside the stream";
  ASSERT_TRUE(refused) << "decode-0 never refused the request";
  EXPECT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decode_agent, "decode-2");
  auto direct = newcomer.post("/v1/completions", body);
  EXPECT_EQ(tokenIds(answer.body), tokenIds(direct));
  EXPECT_EQ(tokenIds(answer.body).size(), 8u);
}

// A rolling replacement under streams (a Deployment's, local mode's): one
// decode agent leaves the router's list and a new one joins while streams
// run, then both old agents drain. Every agent a stream knew at its start is
// draining or gone, so each resumes on the newcomer, equal to an undisturbed
// stream. Before, a stream knew only the agents listed at its start: the
// unlisted one still looked healthy, refused the stream as it drained, and
// every client got an error event.
TEST_F(RouterTest, StreamsResumeOnADecodeAgentListedAfterTheyBegan) {
  start(1, 2, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  const std::vector<json> bodies = streamBodies(4, 600, 240);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  Agent newcomer(roleArgs("decode"), smallModelDir());
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  double running = 0;
  bool drained = false;
  std::thread replacer([&] {
    if (!decodeAgentsRun(1)) return;
    router_->setAgents({{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
                       {{"decode-0", "127.0.0.1", decode_[0]->port()},
                        {"decode-2", "127.0.0.1", newcomer.port()}});
    if (!eventually([&] {
          return routerMetric("tandem_router_agent_healthy", "agent=\"decode-2\"") == 1;
        })) {
      return;
    }
    running = decode_[0]->metric("tandem_num_requests_running") +
              decode_[1]->metric("tandem_num_requests_running");
    drained = true;
    for (auto& agent : decode_) {
      auto res = agent->client()->Post("/admin/drain", "{}", "application/json");
      drained = drained && res && res->status == 202;
    }
  });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(drained) << "the decode agents never both ran a stream, or refused the drain";
  EXPECT_GE(running, 2) << "the streams ended before the drains: nothing was tested";
  expectSameStreams(streams, undisturbed);
  EXPECT_GE(newcomer.metric("tandem_requests_total", "finish_reason=\"length\""), 2);
  EXPECT_GE(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"drain\""),
            2);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"drain\""), 0);
  for (auto& agent : decode_) {
    EXPECT_EQ(agent->process().wait(std::chrono::seconds(30)), 0) << agent->process().stderrText();
  }
}

// Every decode agent drains at once (a pool renamed, or replaced by an
// edit) and their replacements are listed a moment later. A stream handed
// over by one draining agent may be resumed on the other before the router
// has seen it draining; that agent refuses it, and the stream waits for an
// agent to come, as at its break, then resumes on a replacement. Before, it
// ended with "every decode agent failed this request" though the new
// agents were healthy 100 ms later.
TEST_F(RouterTest, StreamsOfDecodeAgentsDrainedAllAtOnceResumeOnTheirReplacements) {
  RouterClusterOptions options;
  options.decodes = 2;
  options.policy = Policy::kRoundRobin;
  options.model = smallModelDir();
  // One move each: the refused resume is that move, not another.
  options.max_migrations = 1;
  startCluster(options);
  const std::vector<json> bodies = streamBodies(6, 600, 240);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  std::vector<std::unique_ptr<Agent>> replacements;
  for (int i = 0; i < 2; ++i) {
    replacements.push_back(std::make_unique<Agent>(roleArgs("decode"), smallModelDir()));
  }
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  double running = 0;
  bool drained = false;
  std::thread replacer([&] {
    // Every stream has begun (a request still waiting when both drain is
    // refused before it starts: a 503, another matter).
    if (!decodeAgentsRun(3)) return;
    running = decode_[0]->metric("tandem_num_requests_running") +
              decode_[1]->metric("tandem_num_requests_running");
    // Both at once, from two threads.
    std::atomic<int> accepted{0};
    std::vector<std::thread> drains;
    for (auto& agent : decode_) {
      drains.emplace_back([&agent, &accepted] {
        auto res = agent->client()->Post("/admin/drain", "{}", "application/json");
        if (res && res->status == 202) ++accepted;
      });
    }
    for (auto& drain : drains) drain.join();
    drained = accepted == 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    router_->setAgents({{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
                       {{"decode-b0", "127.0.0.1", replacements[0]->port()},
                        {"decode-b1", "127.0.0.1", replacements[1]->port()}});
  });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(drained) << "the decode agents never both ran three streams, or refused the drain";
  EXPECT_GE(running, 6) << "the streams ended before the drains: nothing was tested";
  expectSameStreams(streams, undisturbed);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"drain\""), 0);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"failure\""),
      0);
  double finished = 0;
  for (auto& agent : replacements) {
    finished += agent->metric("tandem_requests_total", "finish_reason=\"length\"");
  }
  EXPECT_GE(finished, 4);
  // Moved mid-answer, not sent again from their start: counted by their
  // migrations, not as retried requests.
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"retried\""), 0);
  EXPECT_GE(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"drain\""),
            4);
}

// The small model's shape and tokenizer with other weights.
const fs::path& otherSmallModelDir() {
  static TempDir dir("tandem-router-other-small");
  static fs::path path = [] {
    tandem::tools::TestModelOptions options;
    options.preset = "small";
    options.seed = 22;
    tandem::tools::writeTestModel(options, dir.path() / "small");
    return dir.path() / "small";
  }();
  return path;
}

// A stream moves only to an agent of its own model: streams run on a lone
// decode agent when another joins that serves another model (a rollout's
// new one); when the first drains, its streams are not asked for (the late
// hand-over ask finds no agent of their model) and it finishes them itself,
// each equal to an undisturbed stream of its model; the other agent gets
// none. Resumed there, a stream would have gone on with the other model's
// tokens.
TEST_F(RouterTest, AStreamMovesOnlyToAnAgentOfItsModel) {
  start(1, 1, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  Agent other(roleArgs("decode"), otherSmallModelDir());
  const std::vector<json> bodies = streamBodies(2, 900, 240);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  Agent& mine = *decode_[0];
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  bool drained = false;
  std::thread replacer([&] {
    if (!eventually([&] { return mine.metric("tandem_num_requests_running") >= 2; },
                    std::chrono::seconds(20))) {
      return;
    }
    router_->setAgents(
        {{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
        {{"decode-0", "127.0.0.1", mine.port()}, {"decode-1", "127.0.0.1", other.port()}});
    if (!eventually([&] {
          return routerMetric("tandem_router_agent_healthy", "agent=\"decode-1\"") == 1;
        })) {
      return;
    }
    auto res = mine.client()->Post("/admin/drain", "{}", "application/json");
    drained = res && res->status == 202;
  });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(drained) << "decode-0 never ran both streams, or refused the drain";
  expectSameStreams(streams, undisturbed);
  EXPECT_EQ(mine.process().wait(std::chrono::seconds(30)), 0) << mine.process().stderrText();
  EXPECT_EQ(mine.process().stderrText().find("drain: handed over"), std::string::npos);
  EXPECT_EQ(other.metric("tandem_requests_total", "finish_reason=\"length\""), 0);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"drain\""),
            0);
}

// A rollout that changes the model runs agents of the old and the new model
// side by side in each pool. The router gives a request a prefill and a
// decode agent of one model (a decode agent refuses KV another model
// computed: before, about half of these requests got that 400), so every
// request is answered as a colocated agent of its decode agent's model
// answers it, and both models serve.
TEST_F(RouterTest, ARequestsPrefillAndDecodeAgentsServeOneModel) {
  // Random picks: the prefill and the decode agent are drawn apart, so
  // half the pairs would mix the models.
  start(1, 1, Policy::kRandom);
  Agent prefill_b(roleArgs("prefill"), otherTinyModelDir());
  Agent decode_b(roleArgs("decode"), otherTinyModelDir());
  router_->setAgents(
      {{"prefill-0", "127.0.0.1", prefill_[0]->port()},
       {"prefill-1", "127.0.0.1", prefill_b.port()}},
      {{"decode-0", "127.0.0.1", decode_[0]->port()}, {"decode-1", "127.0.0.1", decode_b.port()}});
  ASSERT_TRUE(eventually([&] {
    return routerMetric("tandem_router_agent_healthy", "agent=\"prefill-1\"") == 1 &&
           routerMetric("tandem_router_agent_healthy", "agent=\"decode-1\"") == 1;
  }));
  Agent colocated_a;
  Agent colocated_b({}, otherTinyModelDir());
  int on_b = 0;
  for (uint32_t seed = 90; seed < 106; ++seed) {
    SCOPED_TRACE(seed);
    const json body = greedy(randomPrompt(70, seed), 6);
    Answer answer = post(body);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    const bool b = answer.decode_agent == "decode-1";
    on_b += b ? 1 : 0;
    EXPECT_EQ(answer.decision, "disaggregated");
    EXPECT_EQ(answer.prefill_agent, b ? "prefill-1" : "prefill-0");
    EXPECT_EQ(tokenIds(answer.body),
              tokenIds((b ? colocated_b : colocated_a).post("/v1/completions", body)));
  }
  EXPECT_GT(on_b, 0);
  EXPECT_LT(on_b, 16);
  for (Agent* decode : {decode_[0].get(), &decode_b}) {
    EXPECT_EQ(decode->metric("tandem_kv_transfer_failures_total", "reason=\"incompatible\""), 0);
  }
}

// A rollout that changed the model has replaced every agent: the router
// learns the new model from its decode agents and hashes prompts under the
// new identity, so a conversation still follows its KV (turn 2 goes to the
// decode agent holding turn 1, which lends it). Before, the router hashed
// prompts under the first model's identity until it restarted: no agent
// held any of its prompts' blocks, and KV-aware routing was load only.
TEST_F(RouterTest, AfterARolloutToAnotherModelConversationsFollowTheirKv) {
  RouterClusterOptions options;
  options.learn_costs = false;  // the model's predictions alone decide
  startCluster(options);
  Agent prefill_b(roleArgs("prefill"), otherTinyModelDir());
  std::vector<std::unique_ptr<Agent>> decode_b;
  for (int i = 0; i < 2; ++i) {
    decode_b.push_back(std::make_unique<Agent>(roleArgs("decode"), otherTinyModelDir()));
  }
  router_->setAgents({{"prefill-b0", "127.0.0.1", prefill_b.port()}},
                     {{"decode-b0", "127.0.0.1", decode_b[0]->port()},
                      {"decode-b1", "127.0.0.1", decode_b[1]->port()}});
  ASSERT_TRUE(eventually([&] {
    return routerMetric("tandem_router_agent_healthy", "agent=\"decode-b0\"") == 1 &&
           routerMetric("tandem_router_agent_healthy", "agent=\"decode-b1\"") == 1 &&
           routerMetric("tandem_router_agent_healthy", "agent=\"prefill-b0\"") == 1;
  }));
  // A decode agent's first healthy poll has taught the router its model.
  Agent colocated({}, otherTinyModelDir());
  turnTwoFollowsTurnOne(colocated, [](const std::vector<int>& prompt, int max_tokens) {
    return greedy(prompt, max_tokens);
  });
}

// A lone decode agent stopped while a stream outlasts its shutdown timeout
// (here 1 s) ends that stream with finish_reason abort at its deadline.
// The router takes that for a break, waits for a decode agent to come (a
// rollout with maxSurge 0 starts the replacement once the old one has
// stopped) and resumes the stream there, equal to an undisturbed one.
// Before, the client got the cut answer, ending with finish_reason abort
// and [DONE] as if complete.
TEST_F(RouterTest, AStreamCutAtItsAgentsShutdownDeadlineResumesOnItsReplacement) {
  startWithAShortShutdownTimeout();
  const std::vector<json> bodies = streamBodies(2, 1000, 700);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  std::unique_ptr<Agent> replacement;
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  std::thread replacer([&] { replacement = replaceLoneDecodeAgentOnceBusy(2); });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(replacement) << "the agent never ran both streams, refused the drain or failed";
  expectSameStreams(streams, undisturbed);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"error\""),
            2);
  EXPECT_EQ(replacement->metric("tandem_requests_total", "finish_reason=\"length\""), 2);
}

// The same for whole (not streamed) answers: the lone decode agent ends
// each with finish_reason abort at its deadline; the router, which has
// sent the client nothing yet, sends it again from its start to the agent
// that replaces the lone one, and the client gets the undisturbed answer.
// Before, the client got the cut answer as a 200.
TEST_F(RouterTest, AWholeAnswerCutAtItsAgentsShutdownDeadlineIsSentAgainToItsReplacement) {
  startWithAShortShutdownTimeout();
  std::vector<json> bodies = streamBodies(2, 1010, 700);
  std::vector<std::vector<int>> undisturbed;
  {
    Agent colocated({}, smallModelDir());
    for (json& body : bodies) {
      body.erase("stream");
      undisturbed.push_back(tokenIds(colocated.post("/v1/completions", body)));
    }
  }
  std::unique_ptr<Agent> replacement;
  std::vector<std::pair<int, json>> answers(bodies.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < bodies.size(); ++i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", router_->port());
      client.set_read_timeout(120, 0);
      auto res = client.Post("/v1/completions", bodies[i].dump(), "application/json");
      if (res) answers[i] = {res->status, json::parse(res->body, nullptr, false)};
    });
  }
  std::thread replacer([&] { replacement = replaceLoneDecodeAgentOnceBusy(2); });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(replacement) << "the agent never ran both answers, refused the drain or failed";
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto& [status, answer] = answers[i];
    ASSERT_EQ(status, 200) << answer.dump();
    EXPECT_EQ(answer["choices"][0]["finish_reason"], "length") << answer.dump();
    EXPECT_EQ(tokenIds(answer), undisturbed[i]) << i;
  }
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resent\",reason=\"error\""),
            2);
  EXPECT_EQ(replacement->metric("tandem_requests_total", "finish_reason=\"length\""), 2);
}

// A whole answer cut at a lone decode agent's shutdown deadline with no
// agent to replace it within --migration-timeout (here 1 s) is lost: the
// client gets a 503, and the migration is counted exhausted, not resent.
// Before, it was counted resent as soon as it was cut, whether or not any
// agent got it again.
TEST_F(RouterTest, AWholeAnswerCutWithNoAgentToSendItAgainIsCountedExhausted) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  options.migration_timeout_s = 1;
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{}
                   : std::vector<std::string>{"--shutdown-timeout", "1"};
  };
  startCluster(options);
  json body = streamBodies(1, 1015, 700)[0];
  body.erase("stream");
  std::pair<int, json> answer;
  std::thread client;
  const bool busy = postWholeUntilRunning(body, answer, client);
  Agent& lone = *decode_[0];
  auto drained = lone.client()->Post("/admin/drain", "{}", "application/json");
  client.join();
  ASSERT_TRUE(busy) << "the decode agent never ran the request";
  ASSERT_TRUE(drained && drained->status == 202);
  EXPECT_EQ(answer.first, 503) << answer.second.dump();
  EXPECT_EQ(answer.second["error"]["message"],
            "the decode agent stopped before this answer's end, and no other decode agent took "
            "it within --migration-timeout (1 s)")
      << answer.second.dump();
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"error\""), 1);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resent\",reason=\"error\""),
            0);
}

// A whole answer cut by its lone decode agent's crash waits, within
// --migration-timeout, for an agent to send it again to: the agent
// restarted in place (a supervisor's restart) takes it from its start, and
// the client gets the undisturbed answer. Before, it got 503 at once, its
// message saying no agent took it within --migration-timeout.
TEST_F(RouterTest, AWholeAnswerCutByACrashWaitsForTheAgentsRestart) {
  startWithAShortShutdownTimeout();
  json body = streamBodies(1, 1022, 700)[0];
  body.erase("stream");
  std::vector<int> undisturbed;
  {
    Agent colocated({}, smallModelDir());
    undisturbed = tokenIds(colocated.post("/v1/completions", body));
  }
  std::pair<int, json> answer;
  std::thread client;
  const bool busy = postWholeUntilRunning(body, answer, client);
  Agent& lone = *decode_[0];
  ::kill(lone.process().pid(), SIGKILL);
  lone.process().wait(std::chrono::seconds(30));
  std::vector<std::string> args = roleArgs("decode");
  args.insert(args.end(), {"--port", std::to_string(lone.port())});
  Agent restarted(args, smallModelDir());
  client.join();
  ASSERT_TRUE(busy) << "the decode agent never ran the request";
  ASSERT_EQ(answer.first, 200) << answer.second.dump();
  EXPECT_EQ(tokenIds(answer.second), undisturbed);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resent\",reason=\"failure\""),
            1);
  EXPECT_EQ(restarted.metric("tandem_requests_total", "finish_reason=\"length\""), 1);
}

// The same when the lone decode agent is restarted in place (its name and
// address kept, a new process): a stream and a whole answer cut at its
// shutdown deadline go to the new process once it is healthy. Before, the
// router took the address for one it had tried: the client got an error
// after --migration-timeout while the new process stood idle.
TEST_F(RouterTest, AnswersCutOnALoneAgentGoToItsProcessRestartedInPlace) {
  startWithAShortShutdownTimeout();
  // One stream, one whole answer.
  const std::vector<json> streamed = streamBodies(1, 1020, 700);
  json whole_body = streamBodies(1, 1021, 700)[0];
  whole_body.erase("stream");
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(streamed);
  std::vector<int> undisturbed_whole;
  {
    Agent colocated({}, smallModelDir());
    undisturbed_whole = tokenIds(colocated.post("/v1/completions", whole_body));
  }
  std::unique_ptr<Agent> replacement;
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), streamed, streams);
  std::pair<int, json> whole;
  clients.emplace_back([&] {
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(120, 0);
    auto res = client.Post("/v1/completions", whole_body.dump(), "application/json");
    if (res) whole = {res->status, json::parse(res->body, nullptr, false)};
  });
  std::thread replacer([&] { replacement = replaceLoneDecodeAgentOnceBusy(2, true); });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(replacement) << "the agent never ran both answers, refused the drain or failed";
  expectSameStreams(streams, undisturbed);
  ASSERT_EQ(whole.first, 200) << whole.second.dump();
  EXPECT_EQ(tokenIds(whole.second), undisturbed_whole);
  EXPECT_EQ(replacement->metric("tandem_requests_total", "finish_reason=\"length\""), 2);
}

// The small model, round robin, one prefill agent and a decode agent
// started with each of `decode_args`; the router polls every
// `poll_interval_s` (600: once; by default as in other tests).
RouterClusterOptions decodeAgentsStartedWith(
    std::vector<std::vector<std::string>> decode_args,
    double poll_interval_s = RouterClusterOptions().poll_interval_s) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  options.policy = Policy::kRoundRobin;
  options.poll_interval_s = poll_interval_s;
  options.decodes = static_cast<int>(decode_args.size());
  options.agent_args = [decode_args](bool prefill, int index) {
    return prefill ? std::vector<std::string>{} : decode_args.at(static_cast<size_t>(index));
  };
  return options;
}

// A decode agent with one seat and one waiting place (--max-num-seqs 1
// --max-waiting-requests 1).
const std::vector<std::string> kOneSeatAndOnePlace = {"--max-num-seqs", "1",
                                                      "--max-waiting-requests", "1"};

// The small model, round robin, and one decode agent with one seat and one
// waiting place; the router polls every `poll_interval_s`.
RouterClusterOptions oneSeatAndOnePlace(
    double poll_interval_s = RouterClusterOptions().poll_interval_s) {
  return decodeAgentsStartedWith({kOneSeatAndOnePlace}, poll_interval_s);
}

// Fills the waiting queue of `agent` (started with --max-num-seqs 1 and
// --max-waiting-requests 1) from clients of its own: one long request runs
// (1,000 tokens: seconds, however loaded the machine), one waits. The
// clients' threads, to join.
std::vector<std::thread> fillQueueOf(Agent& agent, uint32_t seed) {
  std::vector<std::thread> clients;
  for (uint32_t i = 0; i < 2; ++i) {
    clients.emplace_back([port = agent.port(), seed, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(300, 0);
      client.Post("/v1/completions", greedy(randomPrompt(40, seed + i), 1000).dump(),
                  "application/json");
    });
    // The second once the first runs: one runs, one waits.
    if (i == 0) eventually([&] { return agent.metric("tandem_num_requests_running") == 1; });
  }
  return clients;
}

// A decode agent whose waiting queue is full refuses a request with 503
// "too many waiting requests": load, not a failure. With no other decode
// agent to take it, the client gets that refusal (with Retry-After, to
// retry), counted as rejected and not as the agent's error. Before, it got
// "every decode agent failed this request", and the agent's error count
// rose as if it were broken. (The router polls once here, and the queue
// is filled by the agent's own clients: the router cannot see it full, so
// the agent is the one to refuse.)
TEST_F(RouterTest, AFullDecodeQueueIsPassedOnAsLoadNotAsAFailure) {
  startCluster(oneSeatAndOnePlace(600));
  Agent& decode = *decode_[0];
  std::vector<std::thread> clients = fillQueueOf(decode, 1100);
  const bool full = eventually([&] { return decode.metric("tandem_num_requests_waiting") == 1; });
  auto res = client_->Post("/v1/completions", greedy(randomPrompt(40, 1102), 8).dump(),
                           "application/json");
  for (auto& client : clients) client.join();
  ASSERT_TRUE(full) << "the decode agent's queue never filled: nothing was tested";
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  const json error = json::parse(res->body, nullptr, false);
  EXPECT_EQ(error["error"]["message"], "too many waiting requests (1); retry later") << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 1);
  EXPECT_EQ(routerMetric("tandem_router_upstream_errors_total", "agent=\"decode-0\""), 0);
  EXPECT_EQ(decode.metric("tandem_requests_total", "finish_reason=\"rejected\""), 1);
}

// A decode agent refuses a request for load (its queue filled by its own
// clients; the router polls once and cannot see it): the next decode agent
// serves it, and the request is counted retried, as one sent again after a
// decode agent failed, without counting the refusing agent's error.
TEST_F(RouterTest, ARequestADecodeAgentRefusesForLoadIsServedByTheNextAndCountedRetried) {
  startCluster(decodeAgentsStartedWith({kOneSeatAndOnePlace, {}}, 600));
  Agent& full = *decode_[0];
  std::vector<std::thread> clients = fillQueueOf(full, 1105);
  const bool filled = eventually([&] { return full.metric("tandem_num_requests_waiting") == 1; });
  // Round robin: of two requests, at least one is sent to decode-0 first.
  std::vector<Answer> answers;
  for (uint32_t seed = 1107; seed < 1109 && filled; ++seed) {
    answers.push_back(post(greedy(randomPrompt(40, seed), 8)));
  }
  for (auto& client : clients) client.join();
  ASSERT_TRUE(filled) << "decode-0's queue never filled: nothing was tested";
  for (const Answer& answer : answers) {
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decode_agent, "decode-1");
    EXPECT_EQ(tokenIds(answer.body).size(), 8u);
  }
  const double refused = full.metric("tandem_requests_total", "finish_reason=\"rejected\"");
  EXPECT_GE(refused, 1);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"retried\""), refused);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 0);
  EXPECT_EQ(routerMetric("tandem_router_upstream_errors_total", "agent=\"decode-0\""), 0);
}

// A decode agent whose waiting queue the router saw full at its last poll
// would refuse a request once a prefill agent had computed its prompt: the
// router refuses it first (503, Retry-After), and the prefill agent
// computes nothing for it. Once the queue has room again, requests are
// served. Before, each was prefilled, then refused by the decode agent.
TEST_F(RouterTest, ARequestForAFullDecodeQueueIsRefusedBeforeItsPrefill) {
  startCluster(oneSeatAndOnePlace());
  std::vector<std::thread> clients = fillQueueOf(*decode_[0], 1150);
  Agent& decode = *decode_[0];
  // The router has polled the full queue (it counts running + waiting).
  const bool full = eventually([&] {
    return decode.metric("tandem_num_requests_waiting") == 1 &&
           routerMetric("tandem_router_agent_requests", "agent=\"decode-0\"") == 2;
  });
  const double computed = prefill_[0]->metric("tandem_computed_tokens_total");
  auto refused = client_->Post("/v1/completions", greedy(randomPrompt(40, 1160), 8).dump(),
                               "application/json");
  const double computed_after = prefill_[0]->metric("tandem_computed_tokens_total");
  for (auto& client : clients) client.join();
  ASSERT_TRUE(full) << "the decode agent's queue was never seen full: nothing was tested";
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  const json error = json::parse(refused->body, nullptr, false);
  EXPECT_EQ(error["error"]["message"],
            "every decode agent's waiting queue is full (--max-waiting-requests); retry later")
      << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  EXPECT_EQ(computed_after, computed);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 1);
  EXPECT_EQ(decode.metric("tandem_requests_total", "finish_reason=\"rejected\""), 0);
  EXPECT_EQ(decode.metric("tandem_requests_total", "finish_reason=\"length\""), 2);
  // The queue emptied: the next poll lets requests through again.
  ASSERT_TRUE(eventually(
      [&] { return routerMetric("tandem_router_agent_requests", "agent=\"decode-0\"") == 0; }));
  const Answer served = post(greedy(randomPrompt(40, 1161), 8));
  EXPECT_EQ(served.status, 200) << served.body.dump();
  EXPECT_EQ(served.decision, "disaggregated");
}

// Between two polls the router counts the requests it sent a decode agent
// against that agent's seats and queue (tandem.max_num_seqs and
// max_waiting_requests in its /v1/models): once they are all taken, the
// next request is refused before its prefill, as at a poll that saw the
// queue full. (The router polls once here: only its own count can tell.)
// Before, the request was prefilled, then refused by the decode agent.
TEST_F(RouterTest, TheRequestsTheRouterSentFillADecodeQueueBetweenPolls) {
  startCluster(oneSeatAndOnePlace(600));
  // One runs, one waits: 1,000 tokens each, seconds however loaded. The
  // router holds both on decode-0 (reserved at its decision, before the
  // prefill).
  std::vector<std::thread> clients;
  std::vector<int> statuses(2, 0);
  bool sent = true;
  for (uint32_t i = 0; i < 2 && sent; ++i) {
    clients.emplace_back([port = router_->port(), i, &statuses] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(300, 0);
      auto res = client.Post("/v1/completions", greedy(randomPrompt(40, 1190 + i), 1000).dump(),
                             "application/json");
      statuses[i] = res ? res->status : -1;
    });
    // The first runs on decode-0 before the second comes (one whose KV is
    // still loading waits, and would take the one place).
    sent = eventually([&] {
      return routerMetric("tandem_router_reserved_requests", "agent=\"decode-0\"") == i + 1 &&
             decode_[0]->metric("tandem_num_requests_running") == 1;
    });
  }
  // The second prefilled and waiting there (what the prefill agent computes
  // from here is the third's).
  sent = sent && eventually([&] { return decode_[0]->metric("tandem_num_requests_waiting") == 1; });
  const double computed = prefill_[0]->metric("tandem_computed_tokens_total");
  const Answer refused = post(greedy(randomPrompt(40, 1192), 8));
  const double computed_after = prefill_[0]->metric("tandem_computed_tokens_total");
  for (auto& client : clients) client.join();
  ASSERT_TRUE(sent) << "the router never held both requests on decode-0: " << statuses[0] << " "
                    << statuses[1] << "\n"
                    << routerMetrics();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.body["error"]["message"],
            "every decode agent's waiting queue is full (--max-waiting-requests); retry later");
  EXPECT_EQ(computed_after, computed);
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"rejected\""), 0);
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"length\""), 2);
}

// A request that finds every decode agent's queue full waits for a place,
// its router slot held (RouterConfig::full_queues_wait_s; 1 s by default,
// 60 here): when a request the router sent there ends (its client leaves),
// it is served, where it was refused at once.
TEST_F(RouterTest, ARequestWaitsForAPlaceInAFullDecodeQueue) {
  RouterClusterOptions options = oneSeatAndOnePlace(600);
  options.full_queues_wait_s = 60;
  startCluster(options);
  // The seat: a stream whose client leaves when told; the place: a long
  // whole answer.
  std::atomic<bool> leave{false};
  std::thread leaving([port = router_->port(), &leave] {
    json body = greedy(randomPrompt(40, 1195), 1000);
    body["stream"] = true;
    httplib::Client client("127.0.0.1", port);
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = body.dump();
    request.set_header("Content-Type", "application/json");
    request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return !leave; };
    client.send(request);
  });
  const bool running =
      eventually([&] { return decode_[0]->metric("tandem_num_requests_running") == 1; });
  std::thread waiting_one([port = router_->port()] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(300, 0);
    client.Post("/v1/completions", greedy(randomPrompt(40, 1196), 1000).dump(), "application/json");
  });
  const bool full =
      running && eventually([&] {
        return routerMetric("tandem_router_reserved_requests", "agent=\"decode-0\"") == 2;
      });
  std::future<Answer> third =
      std::async(std::launch::async, [&] { return post(greedy(randomPrompt(40, 1197), 8)); });
  // It holds its router slot, and nothing was prefilled for it.
  const bool held =
      full && eventually([&] { return routerMetric("tandem_router_inflight_requests") == 3; });
  const double computed = prefill_[0]->metric("tandem_computed_tokens_total");
  leave = true;
  const Answer served = third.get();
  leaving.join();
  waiting_one.join();
  ASSERT_TRUE(held) << "the third request never waited with both places taken: nothing was tested";
  EXPECT_EQ(served.status, 200) << served.body.dump();
  EXPECT_GT(prefill_[0]->metric("tandem_computed_tokens_total"), computed);
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"rejected\""), 0);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 0);
}

// With another decode agent's queue open, one whose queue was full at the
// last poll is passed over: it refuses nothing (before, requests sent to it
// were prefilled, refused, then sent to the other agent).
TEST_F(RouterTest, ADecodeAgentWithAFullQueueIsPassedOverForOneWithRoom) {
  startCluster(decodeAgentsStartedWith({kOneSeatAndOnePlace, {}}));
  Agent& full = *decode_[0];
  std::vector<std::thread> clients = fillQueueOf(full, 1170);
  const bool seen_full = eventually(
      [&] { return routerMetric("tandem_router_agent_requests", "agent=\"decode-0\"") == 2; });
  std::vector<Answer> answers;
  for (uint32_t seed = 1180; seed < 1184 && seen_full; ++seed) {
    answers.push_back(post(greedy(randomPrompt(40, seed), 4)));
  }
  for (auto& client : clients) client.join();
  ASSERT_TRUE(seen_full) << "the router never saw decode-0's queue full: nothing was tested";
  for (const Answer& answer : answers) {
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decode_agent, "decode-1");
  }
  EXPECT_EQ(full.metric("tandem_requests_total", "finish_reason=\"rejected\""), 0);
}

// A request with n > 1 is n engine requests on its decode agent, each a
// seat or a place in its queue: the router counts n of them. (The router
// polls once here: only its own count can tell.) Before, it counted one,
// and sent the next request to a decode agent that refused it once
// prefilled.
TEST_F(RouterTest, ARequestOfSeveralChoicesTakesASeatOrAPlacePerChoice) {
  startCluster(oneSeatAndOnePlace(600));
  // Two choices of 1,000 tokens each: seconds, however loaded.
  json two = greedy(randomPrompt(40, 1200), 1000);
  two["n"] = 2;
  std::pair<int, json> answered;
  std::thread client;
  const bool held =
      postWholeUntilRunning(two, answered, client) && eventually([&] {
        return routerMetric("tandem_router_reserved_requests", "agent=\"decode-0\"") == 2;
      });
  const double computed = prefill_[0]->metric("tandem_computed_tokens_total");
  const Answer refused = post(greedy(randomPrompt(40, 1201), 8));
  const double computed_after = prefill_[0]->metric("tandem_computed_tokens_total");
  client.join();
  ASSERT_TRUE(held) << "the router never held both choices on decode-0: nothing was tested\n"
                    << routerMetrics();
  EXPECT_EQ(answered.first, 200) << answered.second.dump();
  EXPECT_EQ(answered.second["choices"].size(), 2u);
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.body["error"]["message"],
            "every decode agent's waiting queue is full (--max-waiting-requests); retry later");
  EXPECT_EQ(computed_after, computed);
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"rejected\""), 0);
  // Released with the answer: the next one is served.
  EXPECT_TRUE(eventually(
      [&] { return routerMetric("tandem_router_reserved_requests", "agent=\"decode-0\"") == 0; }));
  EXPECT_EQ(post(greedy(randomPrompt(40, 1202), 8)).status, 200);
}

// A request of more engine requests (n, best_of, prompts) than a decode
// agent holds at all (--max-num-seqs + --max-waiting-requests) goes to one
// that holds them; one that none holds is a 400 from the router, naming
// the field, with no agent asked. Before, it went where the policy sent it,
// and that agent answered 400 while another could have served it.
TEST_F(RouterTest, ARequestGoesToADecodeAgentThatHoldsAllItsChoices) {
  startCluster(decodeAgentsStartedWith(
      {kOneSeatAndOnePlace, {"--max-num-seqs", "2", "--max-waiting-requests", "2"}}));
  for (uint32_t seed = 1210; seed < 1214; ++seed) {
    json three = greedy(randomPrompt(20, seed), 4);
    three["n"] = 3;
    const Answer answer = post(three);
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decode_agent, "decode-1");
    EXPECT_EQ(answer.body["choices"].size(), 3u) << answer.body.dump();
  }
  json five = greedy(randomPrompt(20, 1215), 4);
  five["n"] = 5;
  expectInvalid(post(five), "n",
                "this request is 5 engine requests (one per choice), more than any decode agent "
                "(--max-num-seqs + --max-waiting-requests) holds at once (4)");
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"invalid\""), 1);
  for (const auto& decode : decode_) {
    EXPECT_EQ(decode->metric("tandem_requests_total", "finish_reason=\"invalid\""), 0);
  }
  EXPECT_EQ(decode_[0]->metric("tandem_requests_total", "finish_reason=\"length\""), 0);
}

// A request the decode agents' KV caches cannot hold (here 24 blocks of 16:
// 384 tokens) is refused by the router in the agents' words, before a
// prefill agent computes its prompt: the decode agent would have refused it
// once it was prefilled. One without max_tokens is served, generating up to
// what the decode agent's cache leaves (the bound the router gives it).
TEST_F(RouterTest, ARequestNoDecodeAgentCanHoldIsRefusedBeforeItsPrefill) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  options.policy = Policy::kRoundRobin;
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{} : std::vector<std::string>{"--num-blocks", "24"};
  };
  startCluster(options);
  json body = greedy(randomPrompt(100, 1200), 285);
  const Answer first = post(body);
  const json& refused = first.body;
  EXPECT_EQ(first.status, 400) << refused.dump();
  EXPECT_EQ(refused["error"]["param"], "max_tokens");
  EXPECT_EQ(refused["error"]["message"],
            "prompt (100 tokens) + max_tokens (285) exceeds what a decode agent's KV cache holds "
            "(384 tokens); max_tokens can be at most 284 for this prompt");
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"invalid\""), 1);
  EXPECT_EQ(prefill_[0]->metric("tandem_computed_tokens_total"), 0);
  body.erase("max_tokens");
  const Answer served = post(body);
  ASSERT_EQ(served.status, 200) << served.body.dump();
  EXPECT_EQ(served.body["usage"]["completion_tokens"], 284);
  EXPECT_EQ(served.decision, "disaggregated");
}

// Decode agents whose KV caches differ (24 blocks of 16, 384 tokens, and
// the default, more than max_model_len 2,048): a request without
// max_tokens generates up to what the smallest one leaves, whichever agent
// serves it. Before, each agent took its own bound: 284 tokens on one,
// 1,948 on the other, for the same request.
TEST_F(RouterTest, ARequestWithoutMaxTokensHasOneBoundWhicheverDecodeAgentServesIt) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  options.decodes = 2;
  options.policy = Policy::kRoundRobin;
  options.agent_args = [](bool prefill, int index) {
    // decode-1's cache is the small one: decode-0 answers the router's
    // forwarded /v1/models.
    return prefill || index == 0 ? std::vector<std::string>{}
                                 : std::vector<std::string>{"--num-blocks", "24"};
  };
  startCluster(options);
  std::set<std::string> served_by;
  for (uint32_t seed = 1210; seed < 1214; ++seed) {
    SCOPED_TRACE(seed);
    json body = greedy(randomPrompt(100, seed), 1);
    body.erase("max_tokens");
    const Answer answer = post(body);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    served_by.insert(answer.decode_agent);
    EXPECT_EQ(answer.body["usage"]["completion_tokens"], 284) << answer.decode_agent;
  }
  EXPECT_EQ(served_by.size(), 2u) << "one decode agent served every request: nothing was tested";
  // The router's model list gives that bound, whichever agent answered it,
  // and no one agent's queue bound.
  for (int i = 0; i < 4; ++i) {
    auto models = client_->Get("/v1/models");
    ASSERT_TRUE(models);
    const json tandem = json::parse(models->body)["data"][0]["tandem"];
    EXPECT_EQ(tandem["kv_cache_tokens"], 24 * 16) << tandem.dump();
    EXPECT_FALSE(tandem.contains("max_waiting_requests")) << tandem.dump();
    EXPECT_FALSE(tandem.contains("max_num_seqs")) << tandem.dump();
  }
}

// A rollout's extra agent on a pool of one (maxSurge 1): streams begun on
// the lone decode agent were not asked to be handed over (nobody could
// resume them then). When that agent drains after another has joined, the
// router sees it unhealthy and asks for each stream's hand-over
// (/admin/hand_over); the streams move with their KV to the newcomer, each
// equal to an undisturbed one, instead of being finished on the draining
// agent within its shutdown timeout (or cut there).
TEST_F(RouterTest, StreamsOfALoneDecodeAgentMoveToOneThatJoinedBeforeItDrains) {
  start(1, 1, Policy::kRoundRobin, 16, 256, 1024, smallModelDir());
  const std::vector<json> bodies = streamBodies(3, 800, 240);
  const std::vector<StreamedCompletion> undisturbed = colocatedStreams(bodies);
  Agent newcomer(roleArgs("decode"), smallModelDir());
  std::vector<StreamedCompletion> streams;
  std::vector<std::thread> clients = streamConcurrently(router_->port(), bodies, streams);
  Agent& lone = *decode_[0];
  double running = 0;
  bool drained = false;
  std::thread replacer([&] {
    if (!eventually([&] { return lone.metric("tandem_num_requests_running") >= 3; },
                    std::chrono::seconds(20))) {
      return;
    }
    router_->setAgents(
        {{"prefill-0", "127.0.0.1", prefill_[0]->port()}},
        {{"decode-0", "127.0.0.1", lone.port()}, {"decode-1", "127.0.0.1", newcomer.port()}});
    if (!eventually([&] {
          return routerMetric("tandem_router_agent_healthy", "agent=\"decode-1\"") == 1;
        })) {
      return;
    }
    running = lone.metric("tandem_num_requests_running");
    auto res = lone.client()->Post("/admin/drain", "{}", "application/json");
    drained = res && res->status == 202;
  });
  for (auto& client : clients) client.join();
  replacer.join();
  ASSERT_TRUE(drained) << "the agent never ran the three streams at once, or refused the drain";
  EXPECT_GE(running, 1) << "the streams ended before the drain: nothing was tested";
  expectSameStreams(streams, undisturbed);
  ChildProcess& process = lone.process();
  EXPECT_EQ(process.wait(std::chrono::seconds(30)), 0) << process.stderrText();
  EXPECT_NE(process.stderrText().find("drain: handed over"), std::string::npos)
      << process.stderrText();
  // (A stream that ended between the drain and the router's next poll ended
  // on the lone agent.)
  EXPECT_GE(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"drain\""),
            1);
  EXPECT_GE(routerMetric("tandem_router_migration_prefixes_total", "source=\"handed_over\""), 1);
  EXPECT_GE(newcomer.metric("tandem_requests_total", "finish_reason=\"length\""), 1);
}

// A decode agent that fails a stream with an error event (here: the
// prompt's KV fails to load and its policy is to fail) does not end the
// client's stream: the router moves it to the other decode agent, and the
// client gets the undisturbed answer.
TEST_F(RouterTest, AStreamEndedByADecodeAgentsErrorMovesToAnother) {
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 2;
  options.policy = Policy::kRoundRobin;
  options.kv_config_of = [](bool prefill, int index) -> std::optional<std::string> {
    if (prefill || index != 0) return std::nullopt;
    return ucxConfig("kv_both", {{"kv_load_failure_policy", "fail"},
                                 {"fault_injection", {{"drop_blocks", "all"}}}});
  };
  options.agent_args = [](bool prefill, int index) {
    return !prefill && index == 0 ? std::vector<std::string>{"--enable-fault-injection"}
                                  : std::vector<std::string>{};
  };
  startCluster(options);
  Agent colocated;
  const auto streams_start = std::chrono::steady_clock::now();
  // Round-robin: of two disaggregated streams, one is decoded by decode-0.
  for (uint32_t seed : {81u, 82u}) {
    json body = greedy(randomPrompt(40, seed), 24);
    body["stream"] = true;
    const StreamedCompletion undisturbed = parseStream(
        colocated.client()->Post("/v1/completions", body.dump(), "application/json")->body);
    auto res = client_->Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    const StreamedCompletion moved = parseStream(res->body);
    expectSameStream(moved, undisturbed);
  }
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"error\""),
            1);
  EXPECT_GE(decode_[0]->metric("tandem_requests_total", "finish_reason=\"error\""), 1);
  // The stream moved before its first event: its client's pause runs from
  // the response's headers, within the test's own time.
  EXPECT_EQ(routerMetric("tandem_router_migration_pause_seconds_count", "reason=\"error\""), 1);
  EXPECT_LE(
      routerMetric("tandem_router_migration_pause_seconds_sum", "reason=\"error\""),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - streams_start).count());
}

// --max-migrations 0: a stream whose decode agent dies is not moved, though
// another decode agent is there; its client gets an error event saying why.
TEST_F(RouterTest, AStreamMovesNoMoreThanTheMigrationBudgetAllows) {
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 2;
  options.model = smallModelDir();
  options.max_migrations = 0;
  startCluster(options);
  json body = greedy(randomPrompt(30, 74), 300);
  body["stream"] = true;
  std::thread killer = signalDecodeAgentMidAnswer(SIGKILL);
  auto res = client_->Post("/v1/completions", body.dump(), "application/json");
  killer.join();
  ASSERT_TRUE(res);
  const StreamedCompletion cut = parseStream(res->body);
  EXPECT_NE(cut.errors.find("it moved 0 times, the most --max-migrations allows"),
            std::string::npos)
      << cut.errors;
  EXPECT_EQ(cut.done, 1);
  EXPECT_LT(cut.ids.size(), 300u);
  EXPECT_EQ(
      routerMetric("tandem_router_migrations_total", "outcome=\"exhausted\",reason=\"failure\""),
      1);
}

TEST_F(RouterTest, AClientLeavingMidStreamFreesTheDecodeAgentsBlocks) {
  // The small model generating 2000 tokens takes seconds: the client leaves
  // long before the end.
  start(1, 1, Policy::kKv, 16, 256, 1024, smallModelDir());
  json body = greedy(randomPrompt(30, 72), 2000);
  body["stream"] = true;
  int chunks = 0;
  httplib::Client leaving("127.0.0.1", router_->port());
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 3;  // leave after a few events
  };
  leaving.send(request);
  EXPECT_GE(chunks, 3);
  // The decode agent sees the router's connection close, aborts the
  // request and frees its blocks (~Agent checks nothing stays referenced).
  EXPECT_TRUE(eventually([&] {
    return decode_[0]->metric("tandem_requests_total", "finish_reason=\"abort\"") == 1 &&
           decode_[0]->metric("tandem_kv_cache_usage_ratio") == 0;
  }));
  EXPECT_EQ(routerMetric("tandem_router_upstream_errors_total"), 0)
      << "a client leaving is not the agent's fault";
}

// Requests still in flight at the router's stop deadline are ended with a
// word, not a closed socket: a stream with an error event and [DONE], a
// whole answer with a 503 naming the stop; the decode agent sees their
// connections close and frees their blocks.
TEST_F(RouterTest, RequestsInFlightAtTheStopDeadlineEndWithAnError) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  // A long prompt's prefill takes steps: it is seen running, and still runs
  // at the deadline.
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{"--max-num-batched-tokens", "16"}
                   : std::vector<std::string>{};
  };
  startCluster(options);
  json body = greedy(randomPrompt(30, 74), 2000);
  body["ignore_eos"] = true;
  std::string streamed;
  int whole_status = 0;
  std::string whole_body;
  std::thread stream_client([&] {
    json streaming = body;
    streaming["stream"] = true;
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(60, 0);
    auto res = client.Post("/v1/completions", streaming.dump(), "application/json");
    if (res) streamed = res->body;
  });
  std::thread whole_client([&] {
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(60, 0);
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    if (!res) return;
    whole_status = res->status;
    whole_body = res->body;
  });
  ASSERT_TRUE(decodeAgentsRun(2));
  int prefilling_status = 0;
  std::string prefilling_body;
  std::thread prefilling_client([&] {
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(60, 0);
    auto res = client.Post("/v1/completions", greedy(randomPrompt(1500, 75), 8).dump(),
                           "application/json");
    if (!res) return;
    prefilling_status = res->status;
    prefilling_body = res->body;
  });
  const bool prefilling =
      eventually([&] { return prefill_[0]->metric("tandem_num_requests_running") >= 1; });
  router_->stop(/*grace_seconds=*/0.2);
  stream_client.join();
  whole_client.join();
  prefilling_client.join();
  ASSERT_TRUE(prefilling) << "the long prompt's prefill was never seen running";
  // The request still in prefill is told too; the prefill agent aborts it.
  EXPECT_EQ(prefilling_status, 503) << prefilling_body;
  EXPECT_NE(prefilling_body.find("the router is stopping"), std::string::npos) << prefilling_body;
  EXPECT_TRUE(eventually([&] {
    return prefill_[0]->metric("tandem_requests_total", "finish_reason=\"abort\"") == 1 &&
           prefill_[0]->metric("tandem_kv_cache_usage_ratio") == 0;
  }));
  EXPECT_TRUE(streamed.starts_with("data: {")) << streamed.substr(0, 200);
  EXPECT_NE(streamed.find("\"error\""), std::string::npos) << streamed.substr(0, 200);
  EXPECT_NE(streamed.find("the router is stopping"), std::string::npos);
  EXPECT_TRUE(streamed.ends_with("data: [DONE]\n\n"))
      << streamed.substr(streamed.size() - std::min<size_t>(streamed.size(), 300));
  EXPECT_EQ(whole_status, 503) << whole_body;
  EXPECT_NE(whole_body.find("the router is stopping"), std::string::npos) << whole_body;
  EXPECT_TRUE(eventually([&] {
    return decode_[0]->metric("tandem_requests_total", "finish_reason=\"abort\"") == 2 &&
           decode_[0]->metric("tandem_kv_cache_usage_ratio") == 0;
  }));
}

// Requests still waiting when the router begins to stop, for a router slot
// or for room in a decode agent's queue, are answered at once and told
// that no agent saw them (safe to retry). Before, the one queued for a
// slot was told the router was overloaded, and the one waiting for room
// that every decode agent's queue was full.
TEST_F(RouterTest, RequestsWaitingAtTheRoutersStopAreToldNoAgentSawThem) {
  RouterClusterOptions options = oneSeatAndOnePlace(600);
  options.full_queues_wait_s = 60;
  options.max_inflight = 3;
  options.max_queued = 1;
  startCluster(options);
  std::vector<std::pair<int, json>> answers(4);
  std::vector<std::thread> clients;
  auto send = [&](size_t i, int tokens) {
    clients.emplace_back([&answers, i, tokens, port = router_->port()] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(120, 0);
      auto res =
          client.Post("/v1/completions",
                      greedy(randomPrompt(40, 1220 + static_cast<uint32_t>(i)), tokens).dump(),
                      "application/json");
      if (res) answers[i] = {res->status, json::parse(res->body, nullptr, false)};
    });
  };
  // The seat and the place: long answers, cut at the stop.
  send(0, 1000);
  bool waiting = eventually([&] { return decode_[0]->metric("tandem_num_requests_running") == 1; });
  send(1, 1000);
  // The second prefilled and waiting there (the prefill agent computes
  // nothing more from here).
  waiting = waiting && eventually([&] {
              return routerMetric("tandem_router_reserved_requests", "agent=\"decode-0\"") == 2 &&
                     decode_[0]->metric("tandem_num_requests_waiting") == 1;
            });
  send(2, 8);  // waits for room, holding the last slot
  waiting =
      waiting && eventually([&] { return routerMetric("tandem_router_inflight_requests") == 3; });
  send(3, 8);  // waits for a slot
  waiting =
      waiting && eventually([&] { return routerMetric("tandem_router_queued_requests") == 1; });
  const double computed = prefill_[0]->metric("tandem_computed_tokens_total");
  router_->stop(/*grace_seconds=*/0.5);
  for (auto& client : clients) client.join();
  ASSERT_TRUE(waiting) << "the two requests never waited: nothing was tested";
  for (const size_t i : {2, 3}) {
    EXPECT_EQ(answers[i].first, 503) << i << " " << answers[i].second.dump();
    EXPECT_EQ(answers[i].second["error"]["message"],
              "the router is stopping and sent this request to no agent; retry it")
        << i;
  }
  EXPECT_EQ(prefill_[0]->metric("tandem_computed_tokens_total"), computed);
}

TEST_F(RouterTest, BeyondItsQueueTheRouterAnswers503WithRetryAfter) {
  start(1, 1, Policy::kKv, 16, /*max_inflight=*/1, /*max_queued=*/1);
  std::vector<int> statuses(4, 0);
  std::vector<std::string> retry_after(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", router_->port());
      client.set_read_timeout(60, 0);
      auto res = client.Post("/v1/completions", greedy(randomPrompt(30, 73 + i), 400).dump(),
                             "application/json");
      if (!res) return;
      statuses[i] = res->status;
      retry_after[i] = res->get_header_value("Retry-After");
    });
  }
  for (auto& client : clients) client.join();
  int ok = 0, refused = 0;
  for (int i = 0; i < 4; ++i) {
    if (statuses[i] == 200) ++ok;
    if (statuses[i] == 503) {
      ++refused;
      EXPECT_EQ(retry_after[i], "1");
    }
  }
  EXPECT_EQ(ok + refused, 4);
  EXPECT_GE(ok, 2) << "one in flight and one queued are served";
  EXPECT_GE(refused, 1) << "four at once overflow one slot and a queue of one";
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), refused);
}

// The gate answers before any parsing: with its slot taken and no queue, a
// request is refused 503 without being read as JSON (parsing, rendering and
// tokenizing every request first queued unbounded work in front of the
// gate); with the slot free, the same body is the 400 its JSON deserves.
TEST_F(RouterTest, TheGateAnswersBeforeTheRequestIsParsed) {
  start(1, 1, Policy::kKv, 16, /*max_inflight=*/1, /*max_queued=*/0);
  httplib::Client other("127.0.0.1", router_->port());
  // The busy request may end before the second one arrives (a fast
  // machine): again, until the second found the gate full.
  int refused_status = 0;
  std::string refused_body;
  for (uint32_t attempt = 0; attempt < 5 && refused_status != 503; ++attempt) {
    std::thread busy([&] {
      httplib::Client client("127.0.0.1", router_->port());
      client.set_read_timeout(60, 0);
      client.Post("/v1/completions", greedy(randomPrompt(30, 78 + attempt), 400).dump(),
                  "application/json");
    });
    const bool in_flight =
        eventually([&] { return routerMetric("tandem_router_inflight_requests") == 1; });
    auto refused = other.Post("/v1/completions", "{not json", "application/json");
    busy.join();
    ASSERT_TRUE(in_flight);
    ASSERT_TRUE(refused);
    refused_status = refused->status;
    refused_body = refused->body;
    // The busy request's slot is given back just after its answer's last byte.
    ASSERT_TRUE(eventually([&] { return routerMetric("tandem_router_inflight_requests") == 0; }));
  }
  EXPECT_EQ(refused_status, 503) << refused_body;
  auto malformed = other.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400) << malformed->body;
}

// The router's hashes (common/block_hash.h with what /v1/models reports)
// are the agent's: every hash the agent announces for random prompts, with
// and without cache_salt, is one the router computes for them, and no other.

// A request naming a LoRA adapter crosses the hand-off: the prefill agent
// computes the adapter's KV, the decode agent reads it, and the tokens are a
// colocated agent's with the adapter, whole and streamed. The base model's
// request for the same prompt gets the base model's tokens: neither agent
// takes the adapter's blocks for it.
TEST_F(RouterTest, ALoraAdaptersRequestsCrossTheHandOffAsOnAColocatedAgent) {
  RouterClusterOptions options;
  options.agent_args = [](bool, int) { return loraArgs(); };
  startCluster(options);
  Agent colocated(loraArgs());
  const std::vector<int> prompt = randomPrompt(70, 71);
  json adapted = greedy(prompt, 8);
  adapted["model"] = "sql";
  const std::vector<int> expected = tokenIds(colocated.post("/v1/completions", adapted));
  const std::vector<int> base_expected =
      tokenIds(colocated.post("/v1/completions", greedy(prompt, 8)));
  ASSERT_EQ(expected.size(), 8u);
  EXPECT_NE(expected, base_expected) << "the adapter changed nothing";

  Answer answer = post(adapted);
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "disaggregated");
  EXPECT_EQ(answer.blocks_moved, 4);
  EXPECT_EQ(answer.body["model"], "sql");
  EXPECT_EQ(tokenIds(answer.body), expected);
  EXPECT_EQ(streamedTokens(adapted), expected);
  EXPECT_GE(decode_[0]->metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);

  // The router hashes the adapter's prompts as the agents do: once its
  // index holds decode-0's blocks of the prompt, the prompt with 6 more
  // tokens leaves 12 uncached (under the threshold, 16) and is prefilled
  // there. The same tokens for the base model match nothing.
  ASSERT_TRUE(eventually(
      [&] { return routerMetric("tandem_router_index_blocks", "agent=\"decode-0\"") >= 4; }));
  std::vector<int> longer = prompt;
  for (int id : randomPrompt(6, 72)) longer.push_back(id);
  json adapted_longer = greedy(longer, 8);
  adapted_longer["model"] = "sql";
  Answer extended = post(adapted_longer);
  ASSERT_EQ(extended.status, 200) << extended.body.dump();
  EXPECT_EQ(extended.decision, "local_prefill");
  EXPECT_EQ(tokenIds(extended.body), tokenIds(colocated.post("/v1/completions", adapted_longer)));
  Answer base = post(greedy(longer, 8));
  ASSERT_EQ(base.status, 200) << base.body.dump();
  EXPECT_EQ(base.decision, "disaggregated");
  EXPECT_EQ(tokenIds(base.body), tokenIds(colocated.post("/v1/completions", greedy(longer, 8))));
  Answer base_prompt = post(greedy(prompt, 8));
  ASSERT_EQ(base_prompt.status, 200) << base_prompt.body.dump();
  EXPECT_EQ(tokenIds(base_prompt.body), base_expected);
  // Each agent counted the requests that named the adapter: the decode
  // agent all three, the prefill agent the first (the streamed one is
  // prefilled there too unless the router has learned by then that
  // decode-0 holds its prompt).
  EXPECT_GE(prefill_[0]->metric("tandem_lora_requests_total", "adapter=\"sql\""), 1);
  EXPECT_LE(prefill_[0]->metric("tandem_lora_requests_total", "adapter=\"sql\""), 2);
  EXPECT_EQ(decode_[0]->metric("tandem_lora_requests_total", "adapter=\"sql\""), 3);

  // The router lists and checks the adapters as an agent does.
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  const json listed = json::parse(models->body);
  ASSERT_EQ(listed["data"].size(), 2u);
  EXPECT_EQ(listed["data"][1]["id"], "sql");
  EXPECT_EQ(listed["data"][1]["parent"], "tiny");
  json unknown = greedy(prompt, 8);
  unknown["model"] = "sq";
  Answer refused = post(unknown);
  EXPECT_EQ(refused.status, 404);
  EXPECT_EQ(
      refused.body["error"]["message"],
      "model \"sq\" does not exist; this server serves \"tiny\" and its LoRA adapters \"sql\"");
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }));
}

// Speculative decoding on the decode pool (docs/speculative-decoding.md):
// through the hand-off, a decode agent with drafts answers what a colocated
// agent without them does, token and logprob for token and logprob, greedy
// and seeded, whole and streamed; its drafts were computed and some
// accepted, while the prefill agent, which computes one token, drafts none.
TEST_F(RouterTest, ADecodePoolThatSpeculatesAnswersAsOneThatDoesNot) {
  RouterClusterOptions options;
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{}
                   : std::vector<std::string>{
                         "--speculative-config",
                         R"({"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":1,)"
                         R"("prompt_lookup_max":4})"};
  };
  startCluster(options);
  // The series exist at 0 before any request (a fresh pod's dashboards see
  // 0, not "no data"); before, they appeared with the first step.
  const std::string fresh = decode_[0]->metricsText();
  EXPECT_EQ(prometheusSample(fresh, "tandem_spec_decode_num_drafts_total"), 0.0) << fresh;
  EXPECT_EQ(prometheusSample(fresh, "tandem_spec_decode_num_accepted_tokens_per_pos_total",
                             "position=\"4\""),
            0.0)
      << fresh;
  Agent colocated;
  // Prompts that repeat themselves, so that their own n-grams predict them.
  auto repeating = [](uint32_t seed) {
    std::vector<int> prompt;
    const std::vector<int> part = randomPrompt(18, seed);
    for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), part.begin(), part.end());
    return prompt;
  };
  json greedy_body = greedy(repeating(81), 40);
  greedy_body["logprobs"] = 2;
  json sampled_body = greedy(repeating(82), 40);
  sampled_body["temperature"] = 0.8;
  sampled_body["seed"] = 17;
  for (const json& body : {greedy_body, sampled_body}) {
    const json expected = colocated.post("/v1/completions", body);
    ASSERT_EQ(tokenIds(expected).size(), 40u) << expected.dump();
    Answer answer = post(body);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decision, "disaggregated");
    EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
    EXPECT_EQ(answer.body["choices"][0]["logprobs"], expected["choices"][0]["logprobs"]);
    EXPECT_EQ(answer.body["choices"][0]["text"], expected["choices"][0]["text"]);
    EXPECT_EQ(streamedTokens(body), tokenIds(expected));
  }
  EXPECT_GT(decode_[0]->metric("tandem_spec_decode_num_drafts_total"), 0);
  const double accepted = decode_[0]->metric("tandem_spec_decode_num_accepted_tokens_total");
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, decode_[0]->metric("tandem_spec_decode_num_draft_tokens_total"));
  double by_position = 0;
  for (int position = 0; position < 5; ++position) {
    by_position += decode_[0]->metric("tandem_spec_decode_num_accepted_tokens_per_pos_total",
                                      "position=\"" + std::to_string(position) + "\"");
  }
  EXPECT_EQ(by_position, accepted);
  EXPECT_EQ(prefill_[0]->metric("tandem_spec_decode_num_drafts_total"), 0);
  EXPECT_EQ(colocated.metric("tandem_spec_decode_num_drafts_total"), 0);
}

// A model whose forward pass differs from the dense bf16 one's (a mixture,
// fp8 weights) keeps the P->D hand-off exact: a greedy request with
// logprobs and a seeded sampled one, disaggregated, answer as a colocated
// agent does, whole and streamed. Returns the colocated greedy answer.
json RouterTest::expectDisaggregatedExactly(const fs::path& model,
                                            const std::vector<std::string>& agent_args) {
  std::vector<std::string> kv = {"--kv-cache-memory", "64MiB"};
  kv.insert(kv.end(), agent_args.begin(), agent_args.end());
  RouterClusterOptions options;
  options.model = model;
  options.agent_args = [&](bool, int) { return kv; };
  startCluster(options);
  Agent colocated(kv, model);
  json greedy_body = greedy(randomPrompt(70, 71), 24);
  greedy_body["logprobs"] = 2;
  json sampled_body = greedy(randomPrompt(90, 72), 24);
  sampled_body["temperature"] = 0.8;
  sampled_body["seed"] = 5;
  for (const json& body : {greedy_body, sampled_body}) {
    const json expected = colocated.post("/v1/completions", body);
    EXPECT_EQ(tokenIds(expected).size(), 24u) << expected.dump();
    Answer answer = post(body);
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decision, "disaggregated");
    EXPECT_GT(answer.blocks_moved, 0);
    EXPECT_EQ(tokenIds(answer.body), tokenIds(expected));
    EXPECT_EQ(answer.body["choices"][0]["logprobs"], expected["choices"][0]["logprobs"]);
    EXPECT_EQ(streamedTokens(body), tokenIds(expected));
  }
  return colocated.post("/v1/completions", greedy_body);
}

void RouterTest::expectArchitectureDisaggregatedExactly(const std::string& architecture,
                                                        uint64_t seed) {
  static TempDir dir("tandem-router-architectures");
  tandem::tools::TestModelOptions options;
  options.architecture = architecture;
  options.seed = seed;
  tandem::tools::writeTestModel(options, dir.path() / architecture);
  const json answer = expectDisaggregatedExactly(dir.path() / architecture);
  Agent llama;
  json body = greedy(randomPrompt(70, 71), 24);
  body["logprobs"] = 2;
  EXPECT_NE(tokenIds(llama.post("/v1/completions", body)), tokenIds(answer));
}

// A mixture of experts (the tiny Qwen3-MoE preset: 8 experts choosing 3, a
// dense first layer): its KV is attention's alone, moved as any model's.
TEST_F(RouterTest, AMixtureOfExpertsIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Qwen3MoeForCausalLM", 23);
}

// Gemma 3 (docs/engine.md#gemma-3): prompts of 70 and 90 tokens cross its
// sliding layers' 24-token window on both agents; the decode agent goes on
// from the moved blocks with a colocated agent's bits.
TEST_F(RouterTest, Gemma3IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Gemma3ForCausalLM", 37);
}

// Gemma 2: the same, with soft-capped scores and logits.
TEST_F(RouterTest, Gemma2IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Gemma2ForCausalLM", 41);
}

// Phi-3 (docs/engine.md#phi-3-and-phi-4): q/k/v and gate/up from one
// matrix each, three quarters of each head rotating with LongRoPE, and a
// 32-token window on every layer that the prompts cross.
TEST_F(RouterTest, Phi3IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Phi3ForCausalLM", 43);
}

// Granite (docs/engine.md#granite): its embedding, score, residual and
// logit scalars on both agents.
TEST_F(RouterTest, GraniteIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("GraniteForCausalLM", 47);
}

// OLMo 2 (docs/engine.md#olmo-2): norms after attention and the MLP, q/k
// norms across heads.
TEST_F(RouterTest, Olmo2IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Olmo2ForCausalLM", 53);
}

// Ministral 3 (docs/engine.md#mistral-small-3-and-ministral-3): YaRN and
// queries scaled from position 32 on, which the prompts cross.
TEST_F(RouterTest, Ministral3IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Ministral3ForCausalLM", 67);
}

// OLMo 3 (docs/engine.md#olmo-3): a 24-token window on its sliding layer,
// which rotates unscaled, and YaRN on its full one; the prompts cross the
// window.
TEST_F(RouterTest, Olmo3IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Olmo3ForCausalLM", 61);
}

// GLM-4 (docs/engine.md#glm-4): half of each head rotating as neighbour
// pairs, q/k/v biases, sandwich norms; its KV moves P->D exactly.
TEST_F(RouterTest, Glm4IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Glm4ForCausalLM", 67);
}

// GLM-4.5 (docs/engine.md#mixture-of-experts): sigmoid routing in groups
// with a correction bias and a routed scale, a shared expert, a dense first
// layer, half of each head rotating as halves; its KV moves P->D exactly.
TEST_F(RouterTest, Glm4MoeIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Glm4MoeForCausalLM", 29);
}

// GPT-OSS (docs/engine.md#gpt-oss): sinks, a window on every other layer,
// YaRN, biased router and experts with the clamped activation; its KV moves
// P->D exactly.
TEST_F(RouterTest, GptOssIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("GptOssForCausalLM", 31);
}

// Granite MoE (docs/engine.md#granite): Granite's scalars around a mixture
// of stacked experts; its KV moves P->D exactly.
TEST_F(RouterTest, GraniteMoeIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("GraniteMoeForCausalLM", 37);
}

// OLMoE (docs/engine.md#olmoe): q/k norms across the heads, a mixture on
// every layer; its KV moves P->D exactly.
TEST_F(RouterTest, OlmoeIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("OlmoeForCausalLM", 41);
}

// Qwen2-MoE: q/k/v biases, a shared expert weighed by its sigmoid gate,
// every second layer a mixture; its KV moves P->D exactly.
TEST_F(RouterTest, Qwen2MoeIsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("Qwen2MoeForCausalLM", 31);
}

// YaRN given by --hf-overrides to every agent (docs/engine.md#yarn): the
// prefill and decode agents read the same model, its KV moves exactly, and
// it answers otherwise than the file alone.
TEST_F(RouterTest, YarnGivenByHfOverridesIsDisaggregatedExactly) {
  static TempDir dir("tandem-router-yarn");
  tandem::tools::TestModelOptions options;
  options.architecture = "Qwen3ForCausalLM";
  options.seed = 61;
  tandem::tools::writeTestModel(options, dir.path());
  const json answer = expectDisaggregatedExactly(
      dir.path(), {"--hf-overrides", R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 128}})"});
  Agent plain({"--kv-cache-memory", "64MiB"}, dir.path());
  json body = greedy(randomPrompt(70, 71), 24);
  body["logprobs"] = 2;
  EXPECT_NE(plain.post("/v1/completions", body)["choices"][0]["logprobs"],
            answer["choices"][0]["logprobs"]);
}

// SmolLM3 (docs/engine.md#smollm3): a layer without RoPE, whose K the
// decode agent receives as the prefill agent computed it.
TEST_F(RouterTest, SmolLM3IsDisaggregatedExactly) {
  expectArchitectureDisaggregatedExactly("SmolLM3ForCausalLM", 59);
}

// fp8 weights (docs/quantization.md), with block scales splitting rows and
// columns: the prefill and decode agents' KV is the same bits.
TEST_F(RouterTest, AnFp8CheckpointIsDisaggregatedExactly) {
  static TempDir dir("tandem-router-fp8");
  tandem::tools::TestModelOptions options;
  options.seed = 29;
  options.quantization = tandem::tools::parseQuantizationSpec("fp8:block=16x32");
  tandem::tools::writeTestModel(options, dir.path() / "fp8");
  options.quantization = {};
  tandem::tools::writeTestModel(options, dir.path() / "bf16");
  const json answer = expectDisaggregatedExactly(dir.path() / "fp8");
  // The same weights unquantized give other log-probabilities: the fp8
  // matrices are what ran.
  Agent unquantized({}, dir.path() / "bf16");
  json body = greedy(randomPrompt(70, 71), 24);
  body["logprobs"] = 2;
  EXPECT_NE(unquantized.post("/v1/completions", body)["choices"][0]["logprobs"],
            answer["choices"][0]["logprobs"]);
}

// An fp8 KV cache with the checkpoint's scales (docs/quantization.md): the
// blocks that move are fp8 bytes, and the decode agent continues from them
// with the bits a colocated agent has.
TEST_F(RouterTest, AnFp8KvCacheIsDisaggregatedExactly) {
  static TempDir dir("tandem-router-fp8-kv");
  tandem::tools::TestModelOptions options;
  options.seed = 31;
  options.kv_cache_scales = true;
  tandem::tools::writeTestModel(options, dir.path());
  const json answer = expectDisaggregatedExactly(dir.path(), {"--kv-dtype", "fp8"});
  // A bf16 cache of the same model gives other log-probabilities: the fp8
  // cache is what ran.
  Agent bf16({}, dir.path());
  json body = greedy(randomPrompt(70, 71), 24);
  body["logprobs"] = 2;
  EXPECT_NE(bf16.post("/v1/completions", body)["choices"][0]["logprobs"],
            answer["choices"][0]["logprobs"]);
}

// A request's priority travels with it to both of its agents. Here the
// prefill agent serves by priority and the decode agent first come, first
// served (a cluster's pools must agree: local mode refuses this one, the
// controller warns): priority 0 is disaggregated as ever, and a priority of 7,
// which the prefill agent takes, is refused by the decode agent with its
// own 400, passed through, and the prefilled blocks are let go.
TEST_F(RouterTest, APriorityReachesThePrefillAndTheDecodeAgent) {
  RouterClusterOptions options;
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{"--scheduling-policy", "priority"}
                   : std::vector<std::string>{};
  };
  startCluster(options);
  json body = greedy(randomPrompt(70, 73), 4);
  body["priority"] = 0;
  const Answer plain = post(body);
  EXPECT_EQ(plain.status, 200) << plain.body.dump();
  EXPECT_EQ(plain.decision, "disaggregated");
  EXPECT_GT(plain.blocks_moved, 0);
  body["prompt"] = randomPrompt(70, 74);
  body["priority"] = 7;
  expectInvalid(post(body), "priority",
                "priority must be 0 on an agent that serves first come, first served, got 7 "
                "(start the agent with --scheduling-policy priority to serve requests by "
                "priority)");
  EXPECT_TRUE(eventually([&] { return prefill_[0]->metric("tandem_kv_held_blocks") == 0; }));
}

// Agents may serve different adapters (llm-d's LoRA-aware routing): the
// router learns each agent's, sends an adapter's requests only to agents
// serving it — here decode-1 alone, so they are prefilled there, the
// prefill agent lacking it — and the base model's anywhere.
TEST_F(RouterTest, AnAdaptersRequestsGoOnlyToTheAgentsServingIt) {
  RouterClusterOptions options;
  options.decodes = 2;
  options.agent_args = [](bool prefill, int index) {
    return !prefill && index == 1 ? loraArgs() : std::vector<std::string>{};
  };
  startCluster(options);
  Agent colocated(loraArgs());
  json probe = greedy(randomPrompt(5, 90), 1);
  probe["model"] = "sql";
  ASSERT_TRUE(eventually([&] { return post(probe).status == 200; }))
      << "the router never learned decode-1's adapter";
  for (uint32_t seed : {91u, 92u, 93u, 94u}) {
    SCOPED_TRACE(seed);
    json adapted = greedy(randomPrompt(40 + seed % 3 * 20, seed), 6);
    adapted["model"] = "sql";
    Answer answer = post(adapted);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.decode_agent, "decode-1");
    EXPECT_EQ(answer.decision, "local_prefill");
    EXPECT_EQ(tokenIds(answer.body), tokenIds(colocated.post("/v1/completions", adapted)));
  }
  EXPECT_EQ(decode_[0]->metric("tandem_lora_requests_total"), 0);
  EXPECT_EQ(prefill_[0]->metric("tandem_prompt_tokens_total"), 0);
  // The base model is served everywhere: its requests still reach decode-0.
  std::set<std::string> base_agents;
  for (uint32_t seed = 95; seed < 101 && base_agents.size() < 2; ++seed) {
    Answer answer = post(greedy(randomPrompt(70, seed), 2));
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    base_agents.insert(answer.decode_agent);
  }
  EXPECT_TRUE(base_agents.count("decode-0")) << "no base request went to decode-0";
  json unknown = probe;
  unknown["model"] = "chat";
  EXPECT_EQ(post(unknown).status, 404);
  // The router's /v1/models lists the adapter though decode-0 answers it.
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  const json listed = json::parse(models->body);
  ASSERT_EQ(listed["data"].size(), 2u) << models->body;
  EXPECT_EQ(listed["data"][1]["id"], "sql");
  EXPECT_EQ(listed["data"][1]["parent"], "tiny");
  EXPECT_EQ(
      listed["data"][1]["tandem"]["model_identity"],
      json::parse(
          decode_[1]->client()->Get("/v1/models")->body)["data"][1]["tandem"]["model_identity"]);
  // /tokenize naming the adapter is forwarded to an agent serving it.
  auto tokenized = client_->Post(
      "/tokenize", json{{"model", "sql"}, {"prompt", "Hello world"}}.dump(), "application/json");
  ASSERT_TRUE(tokenized);
  EXPECT_EQ(tokenized->status, 200) << tokenized->body;
  // Its one decode agent gone, the adapter is not listed (a request for it
  // gets 503 until one serves it again). Before, it was listed with an
  // empty identity.
  ::kill(decode_[1]->pid(), SIGKILL);
  ASSERT_TRUE(eventually(
      [&] { return routerMetric("tandem_router_agent_healthy", "agent=\"decode-1\"") == 0; }));
  auto without = client_->Get("/v1/models");
  ASSERT_TRUE(without);
  EXPECT_EQ(json::parse(without->body)["data"].size(), 1u) << without->body;
  EXPECT_EQ(post(probe).status, 503);
}

// Decode agents serving one adapter name from different files: the router
// sends its requests under the identity most of them give (decode-1's and
// decode-2's), and its /v1/models lists the adapter under that identity,
// though decode-0, which gives the other, is the agent answering the list.
// Before, the list showed decode-0's entry: an adapter the router does not
// route by.
TEST_F(RouterTest, TheRoutersModelListGivesAnAdapterTheIdentityItRoutesBy) {
  RouterClusterOptions options;
  options.decodes = 3;
  options.agent_args = [](bool prefill, int index) {
    if (prefill) return std::vector<std::string>{};
    return index == 0 ? otherLoraArgs() : loraArgs();
  };
  startCluster(options);
  auto identityOn = [](Agent& agent) {
    return json::parse(
               agent.client()->Get("/v1/models")->body)["data"][1]["tandem"]["model_identity"]
        .get<std::string>();
  };
  const std::string most = identityOn(*decode_[1]);
  ASSERT_EQ(identityOn(*decode_[2]), most);
  ASSERT_NE(identityOn(*decode_[0]), most) << "the two adapters' files are the same";
  json probe = greedy(randomPrompt(5, 1230), 1);
  probe["model"] = "sql";
  // Every decode agent's adapters learnt: the requests go to the two.
  ASSERT_TRUE(eventually([&] {
    const Answer answer = post(probe);
    return answer.status == 200 && answer.decode_agent != "decode-0";
  }));
  for (uint32_t seed = 1231; seed < 1235; ++seed) {
    json body = greedy(randomPrompt(30, seed), 2);
    body["model"] = "sql";
    const Answer answer = post(body);
    ASSERT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_NE(answer.decode_agent, "decode-0");
  }
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  const json listed = json::parse(models->body);
  ASSERT_EQ(listed["data"].size(), 2u) << models->body;
  EXPECT_EQ(listed["data"][1]["id"], "sql");
  EXPECT_EQ(listed["data"][1]["tandem"]["model_identity"], most) << models->body;
}

// The block hasher an agent's /v1/models `tandem` section describes, as the
// router builds it.
tandem::BlockHasher hasherOf(const json& tandem_info) {
  return tandem::BlockHasher(
      *tandem::parseHashAlgorithm(tandem_info["prefix_caching_hash"].get<std::string>()),
      tandem_info["model_identity"].get<std::string>(), tandem_info["block_size"].get<int32_t>());
}

// The block hashes `agent` announces on /v1/kv_events (stored blocks, or a
// snapshot's), read until `count` have come (or the stream ends).
std::set<std::string> announcedHashes(Agent& agent, size_t count) {
  std::set<std::string> announced;
  std::string pending;
  auto client = agent.client();
  client->Get("/v1/kv_events?since=0", [&](const char* data, size_t size) {
    pending.append(data, size);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!event.starts_with("data: ")) continue;
      json parsed = json::parse(event.substr(6));
      if (parsed["type"] == "BlockStored" || parsed["type"] == "Snapshot") {
        for (const auto& hash : parsed["block_hashes"]) announced.insert(hash.get<std::string>());
      }
    }
    return announced.size() < count;
  });
  return announced;
}

// The router hashes an adapter's prompt under the identity the agent lists
// for the adapter, and gets the hashes the agent announces for its blocks.
TEST(RouterHashing, AnAdaptersBlocksAreHashedUnderTheIdentityTheAgentListsForIt) {
  Agent agent(loraArgs());
  json models = json::parse(agent.client()->Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 2u);
  const json& base_info = models["data"][0]["tandem"];
  const std::string identity = models["data"][1]["tandem"]["model_identity"];
  EXPECT_EQ(identity.rfind(base_info["model_identity"].get<std::string>() + "/lora-", 0), 0u);
  const tandem::BlockHasher hasher = hasherOf(base_info);
  std::set<std::string> expected;
  for (uint32_t seed = 80; seed < 84; ++seed) {
    const std::vector<int> prompt = randomPrompt(40 + seed % 3 * 13, seed);
    json body = greedy(prompt, 1);
    body["model"] = "sql";
    ASSERT_EQ(tokenIds(agent.post("/v1/completions", body)).size(), 1u);
    const std::vector<tandem::TokenId> ids(prompt.begin(), prompt.end());
    for (const auto& hash : hasher.hashFullBlocks(ids, "", identity)) {
      expected.insert(hash.toHex());
    }
  }
  EXPECT_EQ(announcedHashes(agent, expected.size()), expected);
}

TEST(RouterHashing, TheRouterComputesTheAgentsBlockHashesWithAndWithoutCacheSalt) {
  Agent agent;
  json models = json::parse(agent.client()->Get("/v1/models")->body);
  const json& tandem_info = models["data"][0]["tandem"];
  const tandem::BlockHasher hasher = hasherOf(tandem_info);
  std::set<std::string> expected;
  for (uint32_t seed = 90; seed < 96; ++seed) {
    const std::vector<int> prompt = randomPrompt(40 + seed % 5 * 13, seed);
    json body = greedy(prompt, 1);
    std::string salt;
    if (seed % 2 == 1) {
      salt = "tenant-" + std::to_string(seed);
      body["cache_salt"] = salt;
    }
    ASSERT_EQ(tokenIds(agent.post("/v1/completions", body)).size(), 1u);
    const std::vector<tandem::TokenId> ids(prompt.begin(), prompt.end());
    for (const auto& hash : hasher.hashFullBlocks(ids, salt)) expected.insert(hash.toHex());
  }
  EXPECT_EQ(announcedHashes(agent, expected.size()), expected);
}

}  // namespace

// A step-time profile for simulated agents (agent/engine/simulation/
// step_profile.h), `scale` times slower than the base one; the model
// identity carries the name, so both speeds share one.
std::string routedProfile(double scale) {
  return "name: test-routed\nbase_s: 0.002\nprefill_token_s: 0.00002\n"
         "decode_sequence_s: 0.0005\nscale: " +
         std::to_string(scale) +
         "\nmodel:\n  vocab_size: 512\n  max_position_embeddings: 512\n"
         "  kv_bytes_per_token: 131072\n";
}

TEST_F(RouterTest, TheKvPolicyShiftsLoadAwayFromASlowDecodeAgent) {
  // decode-0 is simulated 10x slower than decode-1 and the router is not
  // told: only its ledger (requests reserved until they end) and the polled
  // load show it. Under round-robin each would finish half the requests.
  TempDir dir("tandem-router-slow");
  dir.write("fast.yaml", routedProfile(1));
  dir.write("slow.yaml", routedProfile(10));
  RouterClusterOptions options;
  options.prefills = 2;
  options.decodes = 2;
  options.agent_args = [&](bool prefill, int index) {
    const bool slow = !prefill && index == 0;
    return std::vector<std::string>{"--simulate",
                                    (dir.path() / (slow ? "slow.yaml" : "fast.yaml")).string()};
  };
  auto profile = tandem::engine::StepProfile::fromYamlText(routedProfile(1), "fast.yaml");
  ASSERT_TRUE(profile.isOk()) << profile.status().message();
  options.profile = *profile;
  startCluster(options);

  constexpr int kClients = 6, kPerClient = 5;
  std::mutex mutex;
  std::map<std::string, int> served;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", router_->port());
      client.set_read_timeout(60, 0);
      for (int i = 0; i < kPerClient; ++i) {
        const auto body = greedy(randomPrompt(70, 500 + c * kPerClient + i), 24);
        auto res = client.Post("/v1/completions", body.dump(), "application/json");
        std::lock_guard<std::mutex> lock(mutex);
        served[res && res->status == 200 ? res->get_header_value("x-tandem-decode-agent")
                                         : "failed"] += 1;
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(served["failed"], 0);
  EXPECT_EQ(served["decode-0"] + served["decode-1"], kClients * kPerClient);
  // Six at once start three and three; then each request goes where fewer
  // are reserved, and decode-0's last several times as long (its steps
  // are 10x longer; the hops and the prefill are not).
  EXPECT_LE(served["decode-0"], 9)
      << "decode-0 (slow) " << served["decode-0"] << ", decode-1 " << served["decode-1"];
  // Every reservation was released.
  EXPECT_TRUE(eventually([&] {
    const std::string text = routerMetrics();
    for (const std::string name : {"prefill-0", "prefill-1", "decode-0", "decode-1"}) {
      if (prometheusSample(text, "tandem_router_reserved_requests", "agent=\"" + name + "\"")
              .value_or(-1) != 0) {
        return false;
      }
    }
    return true;
  }));
}

// A whole (not streamed) answer is silent until it is complete: one that
// takes longer than --upstream-timeout was taken for a stalled agent and
// sent again to every other decode agent. The agent now says it is alive
// (an interim 102 Processing, four per timeout), and the answer arrives once.
// Simulated agents: 300 steps of at least 10 ms each, three times the 1 s
// timeout whatever the machine.
TEST_F(RouterTest, AWholeAnswerLongerThanTheUpstreamTimeoutIsNotTakenForAStall) {
  TempDir dir("tandem-router-long");
  dir.write("slow.yaml", routedProfile(4));
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 2;
  options.upstream_timeout_s = 1;
  options.agent_args = [&](bool, int) {
    return std::vector<std::string>{"--simulate", (dir.path() / "slow.yaml").string()};
  };
  startCluster(options);
  Answer answer = post(greedy(randomPrompt(30, 73), 300));
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.body["usage"]["completion_tokens"], 300);
  // Several choices, answered on the decode agent, alike.
  json several = greedy(randomPrompt(30, 74), 300);
  several["n"] = 2;
  Answer choices = post(several);
  ASSERT_EQ(choices.status, 200) << choices.body.dump();
  EXPECT_EQ(choices.body["choices"].size(), 2u);
  EXPECT_EQ(choices.body["usage"]["completion_tokens"], 600);
  EXPECT_EQ(routerMetric("tandem_router_migrations_total", "outcome=\"resent\",reason=\"stall\""),
            0);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"retried\""), 0);
}

// Calls that wait for the engine's next step (a reader's release of held
// blocks) run on a pool of their own: while four of them wait through a
// long step, the workers that parse requests and answer peers' handshakes
// are free, and /detokenize answers before any of them.
TEST_F(RouterTest, CallsWaitingForTheEngineNeverHoldTheWorkers) {
  TempDir dir("tandem-router-waits");
  // A prefill of 300 tokens takes about 3 s.
  dir.write("slow.yaml",
            "name: test-waits\nbase_s: 0.002\nprefill_token_s: 0.0025\n"
            "decode_sequence_s: 0.0005\nscale: 4\nmodel:\n  vocab_size: 512\n"
            "  max_position_embeddings: 512\n  kv_bytes_per_token: 131072\n");
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 1;
  options.agent_args = [&](bool, int) {
    return std::vector<std::string>{"--simulate", (dir.path() / "slow.yaml").string()};
  };
  startCluster(options);
  Agent& agent = *prefill_[0];
  // Blocks held for a reader: what the releases name.
  json held = greedy(randomPrompt(20, 76), 1);
  held["kv_transfer_params"] = {{"do_remote_decode", true}};
  const json answer = agent.post("/v1/completions", held);
  ASSERT_TRUE(answer.contains("kv_transfer_params")) << answer.dump();
  const std::string release = json{{"kv_transfer_params", answer["kv_transfer_params"]}}.dump();
  // A long step.
  std::thread long_prefill(
      [&] { agent.post("/v1/completions", greedy(randomPrompt(300, 77), 1)); });
  // (Its stats are published after the step: give it a moment to begin.)
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::atomic<int> releases_answered{0};
  std::vector<std::thread> releases;
  for (int i = 0; i < 4; ++i) {
    releases.emplace_back([&] {
      agent.client()->Post("/v1/kv_transfer/release", release, "application/json");
      ++releases_answered;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the releases are waiting
  auto detokenized = agent.client()->Post("/detokenize", R"({"model": "tiny", "tokens": [3, 4]})",
                                          "application/json");
  const int answered_before = releases_answered.load();
  for (std::thread& thread : releases) thread.join();
  long_prefill.join();
  ASSERT_TRUE(detokenized);
  EXPECT_EQ(detokenized->status, 200) << detokenized->body;
  EXPECT_EQ(answered_before, 0) << "/detokenize waited behind the releases";
}

// A whole answer's prompt is done at its first token, which the agent tells
// the router in an interim 102: the prompt tokens reserved on the agent
// that prefills it locally go back then, not at the answer's end, and the
// router observes the answer's TTFT.
TEST_F(RouterTest, AWholeAnswerReleasesItsPrefillReservationAtItsFirstToken) {
  TempDir dir("tandem-router-first-token");
  // A prefill of 100 tokens takes about a second, then 300 steps of ~10 ms.
  dir.write("slow.yaml",
            "name: test-first-token\nbase_s: 0.002\nprefill_token_s: 0.01\n"
            "decode_sequence_s: 0.0005\nscale: 4\nmodel:\n  vocab_size: 512\n"
            "  max_position_embeddings: 512\n  kv_bytes_per_token: 131072\n");
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 1;
  options.disagg_threshold_tokens = 100000;  // every prompt prefilled on the decode agent
  options.agent_args = [&](bool, int) {
    return std::vector<std::string>{"--simulate", (dir.path() / "slow.yaml").string()};
  };
  startCluster(options);
  const double ttfts_before = routerMetric("tandem_router_time_to_first_token_seconds_count");
  Answer answer;
  std::thread client([&] { answer = post(greedy(randomPrompt(100, 75), 300)); });
  bool reserved = false;
  bool released_while_running = false;
  for (int i = 0; i < 2000 && !released_while_running; ++i) {
    const std::string metrics = routerMetrics();
    const double prefill =
        prometheusSum(metrics, "tandem_router_reserved_tokens", "kind=\"prefill\"").value_or(0);
    const double inflight =
        prometheusSum(metrics, "tandem_router_inflight_requests", "").value_or(0);
    reserved = reserved || prefill > 0;
    released_while_running = reserved && prefill == 0 && inflight > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  client.join();
  ASSERT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.decision, "local_prefill");
  EXPECT_TRUE(reserved) << "the prompt was never seen reserved";
  EXPECT_TRUE(released_while_running) << "the prefill reservation lasted until the answer's end";
  EXPECT_EQ(routerMetric("tandem_router_time_to_first_token_seconds_count"), ttfts_before + 1);
}
