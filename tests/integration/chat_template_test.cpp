// Chat templates end to end: agents started with --chat-template (a
// Llama-3-style template written with the test model's special tokens)
// behind the router. A chat request's prompt is the template's text encoded
// without added special tokens (prompt_tokens and the generated ids equal a
// completion of exactly those ids); a template that raises gives a 400 naming
// its line and the agents keep serving; a template that does not parse stops
// the agent at start-up; `tandem-agent render-chat` renders lines (good and
// bad) with --now fixing strftime_now.
#include <gtest/gtest.h>
#include <stdio.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "operator/router/router.h"
#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// Line 4 raises for roles the template does not know.
constexpr const char* kLlamaStyleTemplate =
    "{{- '<|endoftext|>' -}}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}\n"
    "{{- raise_exception('role ' + message['role'] + ' is not supported') -}}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>' + message['role'] + '<|im_end|>\\n\\n' + message['content'] | trim + "
    "eos_token -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant<|im_end|>\\n\\n' -}}"
    "{%- endif -%}\n";

const std::string kExpectedText =
    "<|endoftext|><|im_start|>system<|im_end|>\n\nBe brief.<|im_end|>"
    "<|im_start|>user<|im_end|>\n\nHello there<|im_end|><|im_start|>assistant<|im_end|>\n\n";

json chatBody() {
  return {{"model", "tiny"},
          {"messages",
           {{{"role", "system"}, {"content", "Be brief."}},
            {{"role", "user"}, {"content", " Hello there "}}}},
          {"max_tokens", 4},
          {"temperature", 0},
          {"ignore_eos", true},
          {"return_token_ids", true}};
}

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    template_file_ = dir_.path() / "llama-style.jinja";
    writeFile(template_file_, kLlamaStyleTemplate);
    // The router reads its tokenizer and template from a model directory: a
    // copy of the test model whose own template is the same file's text, so
    // that it renders (and so routes) exactly as the agents do.
    router_model_ = dir_.path() / "router-model";
    fs::copy(tinyModelDir(), router_model_);
    json config = json::parse(readFile(router_model_ / "tokenizer_config.json"));
    config["chat_template"] = kLlamaStyleTemplate;
    writeFile(router_model_ / "tokenizer_config.json", config.dump());
  }
  void TearDown() override {
    if (router_) router_->stop(5);
  }

  void startCluster() {
    const std::vector<std::string> extra = {"--chat-template", template_file_.string()};
    auto args = [&](const char* role) {
      std::vector<std::string> argv = {"--role", role, "--kv-transfer-config",
                                       ucxConfig("kv_both")};
      argv.insert(argv.end(), extra.begin(), extra.end());
      return argv;
    };
    prefill_ = std::make_unique<Agent>(args("prefill"));
    decode_ = std::make_unique<Agent>(args("decode"));
    tandem::router::RouterConfig config;
    config.port = 0;
    config.poll_interval_s = 0.1;
    config.model_dir = router_model_;
    config.prefill.push_back({"prefill-0", "127.0.0.1", prefill_->port()});
    config.decode.push_back({"decode-0", "127.0.0.1", decode_->port()});
    router_ = std::make_unique<tandem::router::Router>(config);
    router_->start();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", router_->port());
    client_->set_read_timeout(60, 0);
    ASSERT_TRUE(eventually([&] {
      auto res = client_->Get("/health");
      if (!res || res->status != 200) return false;
      // Ready once the router has learnt the model (a chat request parses).
      auto probe = client_->Post("/v1/chat/completions", chatBody().dump(), "application/json");
      return probe && probe->status == 200;
    })) << "the router never became ready";
  }

  json routerPost(const json& body, int* status) {
    auto res = client_->Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) throw std::runtime_error("no response from the router");
    *status = res->status;
    return json::parse(res->body);
  }

  TempDir dir_{"chat-template-integration"};
  fs::path template_file_;
  fs::path router_model_;
  std::unique_ptr<Agent> prefill_, decode_;
  std::unique_ptr<tandem::router::Router> router_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ChatTemplateTest, PromptIsTheRenderedTextThroughRouterAndAgent) {
  startCluster();
  // What tokenizing the expected text gives, special tokens matched as such.
  const json tokenized =
      decode_->post("/tokenize", {{"prompt", kExpectedText}, {"add_special_tokens", false}});
  const std::vector<int> ids = tokenized.at("tokens").get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(),
            decode_->post("/tokenize", {{"prompt", "<|endoftext|>"}, {"add_special_tokens", false}})
                .at("tokens")
                .at(0)
                .get<int>());
  // The agent's /tokenize of the messages renders the same text.
  json tokenize_chat = chatBody();
  tokenize_chat.erase("max_tokens");
  tokenize_chat.erase("temperature");
  tokenize_chat.erase("ignore_eos");
  tokenize_chat.erase("return_token_ids");
  EXPECT_EQ(decode_->post("/tokenize", tokenize_chat).at("tokens").get<std::vector<int>>(), ids);

  const json reference = decode_->post("/v1/completions", greedy(ids, 4));
  for (int round = 0; round < 2; ++round) {
    int status = 0;
    const json answer = routerPost(chatBody(), &status);
    ASSERT_EQ(status, 200) << answer.dump();
    EXPECT_EQ(answer.at("usage").at("prompt_tokens").get<size_t>(), ids.size());
    EXPECT_EQ(tokenIds(answer), tokenIds(reference));
    // Straight to an agent, the same.
    const json direct = decode_->post("/v1/chat/completions", chatBody(), &status);
    ASSERT_EQ(status, 200) << direct.dump();
    EXPECT_EQ(direct.at("usage").at("prompt_tokens").get<size_t>(), ids.size());
    EXPECT_EQ(tokenIds(direct), tokenIds(reference));
  }
}

TEST_F(ChatTemplateTest, TemplateErrorIs400WithTheLineAndServingGoesOn) {
  startCluster();
  json body = chatBody();
  body["messages"].push_back({{"role", "robot"}, {"content", "beep"}});
  const std::string message = "the chat template failed: line 4: role robot is not supported";
  int status = 0;
  json answer = routerPost(body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["message"], message);
  EXPECT_EQ(answer["error"]["param"], "messages");
  answer = decode_->post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["message"], message);
  EXPECT_EQ(answer["error"]["type"], "invalid_request_error");
  // Both keep serving.
  answer = routerPost(chatBody(), &status);
  EXPECT_EQ(status, 200) << answer.dump();
  decode_->post("/v1/chat/completions", chatBody(), &status);
  EXPECT_EQ(status, 200);
}

TEST_F(ChatTemplateTest, BrokenTemplateStopsTheAgentAtStartUp) {
  const fs::path broken = dir_.path() / "broken.jinja";
  writeFile(broken, "{% for m in messages %}\n{{ m.content }}\n{% endif %}\n");
  ChildProcess agent({std::string(TANDEM_BIN_DIR) + "/tandem-agent", "serve", "--model",
                      tinyModelDir().string(), "--port", "0", "--chat-template", broken.string()},
                     dir_.path() / "broken-stderr");
  const int code = agent.wait(std::chrono::seconds(60));
  EXPECT_NE(code, 0);
  const std::string stderr_text = agent.stderrText();
  EXPECT_NE(stderr_text.find(broken.string() + ": chat template does not parse: line 3"),
            std::string::npos)
      << stderr_text;
}

// Runs render-chat with `args` on `input`; its stdout lines.
std::vector<std::string> renderChat(const std::string& args, const std::string& input,
                                    const fs::path& dir) {
  const fs::path in = dir / "render-input.jsonl";
  writeFile(in, input);
  const std::string command = std::string(TANDEM_BIN_DIR) + "/tandem-agent render-chat " + args +
                              " < " + in.string() + " 2>&1";
  std::vector<std::string> lines;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return lines;
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

TEST(RenderChat, LinesInLinesOutWithFixedClock) {
  TempDir dir("render-chat-test");
  writeFile(dir.path() / "t.jinja",
            "{{ bos_token }}{{ strftime_now('%d %b %Y') }}|{% for m in messages %}"
            "{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}"
            "{{ m.role }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}>"
            "{% endif %}{{ flavor }}");
  const std::string input =
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})"
      "\n"
      "not json\n"
      R"({"messages": [{"role": "robot", "content": "x"}]})"
      "\n"
      R"({"messages": [{"role": "assistant", "content": "Once "}], "continue_final_message": true, "kwargs": {"flavor": "!"}})"
      "\n"
      R"({"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": "yes"})"
      "\n";
  const auto lines = renderChat("--template " + (dir.path() / "t.jinja").string() +
                                    " --bos-token '<s>' --now 2025-03-07T09:05:03",
                                input, dir.path());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(json::parse(lines[0]), json({{"text", "<s>07 Mar 2025|user:hi;>"}}));
  EXPECT_EQ(json::parse(lines[1]).at("error").get<std::string>().rfind("line is not valid JSON", 0),
            0u);
  EXPECT_EQ(json::parse(lines[2]), json({{"error", "line 1: no robots"}}));
  EXPECT_EQ(json::parse(lines[3]), json({{"text", "<s>07 Mar 2025|assistant:Once "}}));
  EXPECT_EQ(json::parse(lines[4]), json({{"error", "add_generation_prompt must be a boolean"}}));

  // Another --now, another date.
  const auto later =
      renderChat("--template " + (dir.path() / "t.jinja").string() + " --now 2031-12-25T23:59:00",
                 R"({"messages": []})"
                 "\n",
                 dir.path());
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(json::parse(later[0]), json({{"text", "25 Dec 2031|"}}));
}

}  // namespace
