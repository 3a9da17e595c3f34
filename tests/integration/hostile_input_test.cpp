// Inputs a hostile client sends, against real agents and the router in front
// of them: JSON nested 15,000 levels deep in each field a request decodes, a
// 30 MB prompt, a million-id /detokenize, an object of 300,000 members. The
// refused ones get a clean 4xx naming the field and the bound, the others
// their answer; the process keeps serving (the next completion through the
// router succeeds) and every KV block is free afterwards (the Agent fixture
// checks that when it stops).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/support/router_cluster.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

constexpr int kCrashDepth = 15000;

// Peak resident memory of a process (VmHWM), bytes; 0 when unreadable.
int64_t peakResidentBytes(int pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmHWM:")) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

struct Reply {
  int status = 0;
  json body;
};

class HostileInputTest : public RouterCluster {
 protected:
  void SetUp() override {
    RouterClusterOptions options;
    startCluster(options);
  }

  static Reply post(httplib::Client& client, const std::string& path, const std::string& body) {
    auto res = client.Post(path.c_str(), body, "application/json");
    if (!res) return {};
    return {res->status, json::parse(res->body, nullptr, false)};
  }

  // A small completion through the router answers 200.
  void expectStillServing() {
    json body = greedy(randomPrompt(20, 7), 4);
    Reply reply = post(*client_, "/v1/completions", body.dump());
    EXPECT_EQ(reply.status, 200) << reply.body.dump();
    for (Agent* agent : agents()) {
      auto health = agent->client()->Get("/health");
      ASSERT_TRUE(health) << "an agent stopped answering";
      EXPECT_EQ(health->status, 200);
    }
  }

  // `body` refused with a 400 whose param starts with `param` and whose
  // message contains `says`, by the decode agent and by the router.
  void expectRefusedByBoth(const std::string& path, const std::string& body,
                           const std::string& param, const std::string& says) {
    auto direct = decode_[0]->client();
    for (httplib::Client* client : {direct.get(), client_.get()}) {
      SCOPED_TRACE(client == client_.get() ? "router" : "agent");
      Reply reply = post(*client, path, body);
      ASSERT_EQ(reply.status, 400) << "no clean refusal (a crash answers nothing)";
      const json& error = reply.body["error"];
      EXPECT_EQ(error["type"], "invalid_request_error");
      EXPECT_TRUE(error["param"].is_string() &&
                  error["param"].get<std::string>().starts_with(param))
          << error.dump();
      EXPECT_NE(error["message"].get<std::string>().find(says), std::string::npos) << error.dump();
    }
  }
};

TEST_F(HostileInputTest, DeeplyNestedJsonInEveryDecodedFieldIsA400) {
  const std::string deep = nestedJsonObject(kCrashDepth);
  const std::string nesting = "deeper than 128 levels";
  expectRefusedByBoth(
      "/v1/chat/completions",
      R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"x":)" +
          deep + "}}",
      "chat_template_kwargs.x.a", nesting);
  expectRefusedByBoth(
      "/v1/chat/completions",
      R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":)" +
          deep + "}}]}",
      "tools[0].function.parameters", nesting);
  const json messages = json::array(
      {{{"role", "user"}, {"content", "Hi"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "c1"},
                                     {"type", "function"},
                                     {"function", {{"name", "f"}, {"arguments", deep}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}});
  expectRefusedByBoth("/v1/chat/completions",
                      json{{"model", "tiny"}, {"messages", messages}}.dump(),
                      "messages[1].tool_calls[0].function.arguments", nesting);
  // /tokenize is the agent's (the router's answer is checked in its own
  // tests).
  auto direct = decode_[0]->client();
  Reply tokenized = post(*direct, "/tokenize",
                         R"({"messages":[{"role":"user","content":"Hi","extra":)" + deep + "}]}");
  EXPECT_EQ(tokenized.status, 400);
  EXPECT_EQ(tokenized.body["error"]["param"], "messages[0].extra.a.a.a");
  expectStillServing();
}

TEST_F(HostileInputTest, APromptFarPastTheContextIsRefusedBeforeTokenizing) {
  std::string text;
  while (text.size() < 30'000'000) text += "hello ";
  const std::string body = json{{"model", "tiny"}, {"prompt", text}, {"max_tokens", 1}}.dump();
  const int64_t peak_before = peakResidentBytes(decode_[0]->pid());
  ASSERT_GT(peak_before, 0);
  expectRefusedByBoth("/v1/completions", body, "prompt", "refused without tokenizing it");
  // Tokenizing 30 MB used to take the agent past 1 GB; refused by size, the
  // body and its parsed string are all it holds.
  const int64_t peak_after = peakResidentBytes(decode_[0]->pid());
  EXPECT_LT(peak_after - peak_before, int64_t{400} << 20)
      << "peak resident memory grew from " << peak_before << " to " << peak_after << " bytes";
  expectStillServing();
}

TEST_F(HostileInputTest, AMillionIdDetokenizeIsRefused) {
  std::string ids = "[";
  for (int i = 0; i < 2'000'000; ++i) ids += i + 1 < 2'000'000 ? "1," : "1]";
  auto direct = decode_[0]->client();
  Reply reply = post(*direct, "/detokenize", R"({"tokens":)" + ids + "}");
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("1048576 JSON values"),
            std::string::npos)
      << reply.body.dump();
  json within = json::array();
  for (int i = 0; i < 5000; ++i) within.push_back(1);
  reply = post(*direct, "/detokenize", json{{"tokens", within}}.dump());
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["error"]["param"], "tokens");
  expectStillServing();
}

// An object of 300,000 members (3.6 MB, within the value bound) in a field
// nobody reads: parsed in time linear in the text (with keys in the
// client's order, as chat templates and forwarding need them), so agent and
// router answer it like any request. Parsed member by member through
// ordered_map's search, it took minutes and held a worker meanwhile.
TEST_F(HostileInputTest, AnObjectOfManyMembersIsAnsweredLikeAnyRequest) {
  std::string members;
  for (int i = 0; i < 300'000; ++i) {
    if (i > 0) members += ',';
    members += "\"k" + std::to_string(i) + "\":1";
  }
  const std::string junk = R"(,"junk":{)" + members + "}}";
  json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "hello"}}}},
               {"max_tokens", 2},
               {"temperature", 0}};
  std::string chat_body = chat.dump();
  chat_body.pop_back();
  chat_body += junk;
  std::string completion_body = greedy(randomPrompt(20, 8), 2).dump();
  completion_body.pop_back();
  completion_body += junk;
  // Minutes of parsing would run past this (a stall, not a speed figure).
  httplib::Client direct("127.0.0.1", decode_[0]->port());
  httplib::Client router("127.0.0.1", router_->port());
  for (httplib::Client* client : {&direct, &router}) {
    SCOPED_TRACE(client == &router ? "router" : "agent");
    client->set_read_timeout(60, 0);
    Reply reply = post(*client, "/v1/chat/completions", chat_body);
    EXPECT_EQ(reply.status, 200) << reply.body.dump().substr(0, 300);
    reply = post(*client, "/v1/completions", completion_body);
    EXPECT_EQ(reply.status, 200) << reply.body.dump().substr(0, 300);
  }
  expectStillServing();
}

// A constraint whose masks prove too costly partway through the answer
// (a literal, then nested repeats of \w?: with the tiny vocabulary the
// literal's masks fit their budget, the first mask reaching the repeats
// does not) is the request's fault: a 400 naming the field, from the agent
// and through the router; streamed, the last event before [DONE], which the
// router passes on rather than moving the stream to another decode agent,
// where it would fail the same way (several choices too). Every request has the same pattern
// text, so all but the first find the grammar and its memo of moves warm
// from the ones before, and still fail at the same mask: a mask is charged
// what computing it costs, memoized or not (docs/structured-outputs.md).
TEST_F(HostileInputTest, AConstraintTooAmbiguousToFollowIsTheRequestsError) {
  {
    // Too ambiguous from its first mask, found at admission: the same 400.
    json body = greedy(randomPrompt(3, 9), 20);
    body["guided_grammar"] = R"(root ::= (("a"{0,1000}){0,1000}){0,1000})";
    httplib::Client agent("127.0.0.1", decode_[0]->port());
    Reply reply = post(agent, "/v1/completions", body.dump());
    ASSERT_EQ(reply.status, 400) << reply.body.dump();
    EXPECT_EQ(reply.body["error"]["param"], "guided_grammar") << reply.body.dump();
    EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("too ambiguous to follow"),
              std::string::npos);
  }
  auto request = [&](bool stream) {
    json body = greedy(randomPrompt(3, 9), 20);  // under the threshold: decoded where prefilled
    body["structured_outputs"] = {{"regex", "the answer is ((\\w?){60}){60}"}};
    body["stream"] = stream;
    return body.dump();
  };
  httplib::Client direct("127.0.0.1", decode_[0]->port());
  for (httplib::Client* client : {&direct, client_.get()}) {
    SCOPED_TRACE(client == client_.get() ? "router" : "agent");
    Reply reply = post(*client, "/v1/completions", request(false));
    ASSERT_EQ(reply.status, 400) << reply.body.dump();
    EXPECT_EQ(reply.body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(reply.body["error"]["param"], "structured_outputs.regex");
    EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("too ambiguous to follow"),
              std::string::npos);
    auto res = client->Post("/v1/completions", request(true), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const StreamedCompletion stream = parseStream(res->body);
    EXPECT_EQ(stream.done, 1) << res->body;
    ASSERT_FALSE(stream.errors.empty()) << res->body;
    EXPECT_TRUE(stream.text.starts_with("the answer is")) << stream.text;
    const json error = json::parse(stream.errors.substr(6, stream.errors.find('\n') - 6))["error"];
    EXPECT_EQ(error["type"], "invalid_request_error") << error.dump();
    EXPECT_EQ(error["param"], "structured_outputs.regex") << error.dump();
    // Several choices end the same way once their stream has started: the
    // error, then [DONE]. Whether it has started when the first costly mask
    // fails depends on when the HTTP coroutine runs (before: a 400, also
    // right), so a few tries until a stream shows it.
    json several = json::parse(request(true));
    several["n"] = 2;
    several["max_tokens"] = 80;
    several["structured_outputs"]["regex"] =
        "the answer, after a long and careful thought, is ((\\w?){60}){60}";
    bool streamed = false;
    for (int attempt = 0; attempt < 20 && !streamed; ++attempt) {
      auto both = client->Post("/v1/completions", several.dump(), "application/json");
      ASSERT_TRUE(both);
      if (both->status == 400) {
        EXPECT_EQ(json::parse(both->body)["error"]["param"], "structured_outputs.regex");
        continue;
      }
      ASSERT_EQ(both->status, 200) << both->body;
      streamed = true;
      const StreamedCompletion two = parseStream(both->body);
      EXPECT_FALSE(two.errors.empty()) << both->body;
      EXPECT_EQ(two.done, 1) << both->body;
    }
    EXPECT_TRUE(streamed) << "every try failed before its stream started";
  }
  const std::string metrics = routerMetrics();
  EXPECT_EQ(tandem::prometheusSum(metrics, "tandem_router_migrations_total", "").value_or(0.0), 0.0)
      << metrics;
  EXPECT_EQ(tandem::prometheusSum(metrics, "tandem_router_upstream_errors_total", "").value_or(0.0),
            0.0)
      << metrics;
  expectStillServing();
}

}  // namespace
