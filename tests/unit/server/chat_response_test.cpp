// Chat output parsing in the chat API: which of the server's parsers apply to
// a request (tools offered, tool_choice, enable_thinking), and how the parsed
// output shapes the non-streamed message, the stream deltas and the finish
// reason. The parsers themselves are tested in chat_output_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/protocol/chat_template.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::server {
namespace {

using nlohmann::json;

constexpr char kToolCallOutput[] =
    "<think>The user wants the weather.</think>\n\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"C\"}}\n"
    "</tool_call>";

class ChatResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ::tandem::testing::TempDir("chat-response-test");
    tools::writeTestModel(tools::TestModelOptions{}, dir_->path());
    tokenizer_ = Tokenizer::fromDirectory(dir_->path()).release();
    auto chat_template = ChatTemplate::load(*tokenizer_);
    ASSERT_TRUE(chat_template.isOk()) << chat_template.status().toString();
    chat_template_ = new std::shared_ptr<const ChatTemplate>(*chat_template);
  }
  static void TearDownTestSuite() {
    delete chat_template_;
    delete tokenizer_;
    delete dir_;
  }

  // Limits with both parsers on (hermes tool calls, deepseek_r1 reasoning).
  static ServerLimits limits(bool parsers = true) {
    ServerLimits limits;
    limits.chat_template = *chat_template_;
    limits.served_model_name = "tiny";
    limits.max_model_len = 256;
    limits.vocab_size = tokenizer_->vocabSize();
    if (parsers) {
      limits.chat_output.reasoning_parser = protocol::ReasoningParserKind::kDeepSeekR1;
      limits.chat_output.tool_call_parser = protocol::ToolCallParserKind::kHermes;
    }
    int next = 0;
    limits.chat_output.next_tool_call_id = [next]() mutable {
      return "chatcmpl-tool-" + std::to_string(next++);
    };
    return limits;
  }

  static json body(json extra = json::object()) {
    json request = {{"model", "tiny"},
                    {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
    request.update(extra);
    return request;
  }

  static json weatherTools() {
    const json parameters = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}};
    const json function = {{"name", "get_weather"}, {"parameters", parameters}};
    return json::array({json{{"type", "function"}, {"function", function}}});
  }

  static ParsedRequest parse(const json& request, const ServerLimits& server_limits) {
    auto parsed = parseChatCompletionRequest(request.dump(), server_limits, *tokenizer_);
    EXPECT_TRUE(parsed.isOk()) << (parsed.isOk() ? "" : parsed.error().message);
    return parsed.isOk() ? parsed.value() : ParsedRequest{};
  }

  static protocol::RequestOutput output(std::string text, protocol::FinishReason reason) {
    protocol::RequestOutput out;
    out.text = std::move(text);
    out.finish_reason = reason;
    return out;
  }

  static ::tandem::testing::TempDir* dir_;
  static Tokenizer* tokenizer_;
  static std::shared_ptr<const ChatTemplate>* chat_template_;
};

::tandem::testing::TempDir* ChatResponseTest::dir_ = nullptr;
Tokenizer* ChatResponseTest::tokenizer_ = nullptr;
std::shared_ptr<const ChatTemplate>* ChatResponseTest::chat_template_ = nullptr;

TEST_F(ChatResponseTest, ToolCallParserAppliesOnlyWhenToolsAreOfferedAndNotRefused) {
  const ParsedRequest with_tools = parse(body({{"tools", weatherTools()}}), limits());
  ASSERT_TRUE(with_tools.chat_output.has_value());
  EXPECT_TRUE(with_tools.chat_output->tool_call_parser.has_value());
  EXPECT_TRUE(with_tools.chat_output->reasoning_parser.has_value());
  EXPECT_FALSE(with_tools.chat_output->reasoning_ended_in_prompt);

  const ParsedRequest none =
      parse(body({{"tools", weatherTools()}, {"tool_choice", "none"}}), limits());
  ASSERT_TRUE(none.chat_output.has_value());
  EXPECT_FALSE(none.chat_output->tool_call_parser.has_value());

  const ParsedRequest no_tools = parse(body(), limits());
  ASSERT_TRUE(no_tools.chat_output.has_value());
  EXPECT_FALSE(no_tools.chat_output->tool_call_parser.has_value());

  const ParsedRequest thinking_off =
      parse(body({{"chat_template_kwargs", {{"enable_thinking", false}}}}), limits());
  ASSERT_TRUE(thinking_off.chat_output.has_value());
  EXPECT_TRUE(thinking_off.chat_output->reasoning_ended_in_prompt);

  // No parser on the server: the output is content, as before.
  EXPECT_FALSE(parse(body({{"tools", weatherTools()}}), limits(false)).chat_output.has_value());
}

// With a reasoning parser, a structured output (a schema, a forced tool
// call) starts where the reasoning ends, unless the prompt closed it; the
// parser then finds the structure in the content (vLLM's behaviour).
TEST_F(ChatResponseTest, AConstraintWaitsForTheReasoningToEnd) {
  const json schema = {{"type", "json_schema"},
                       {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  const ParsedRequest reasoning = parse(body({{"response_format", schema}}), limits());
  ASSERT_TRUE(reasoning.request.structured_output.has_value());
  EXPECT_EQ(reasoning.request.structured_output->after, "</think>");
  const ParsedRequest forced =
      parse(body({{"tools", weatherTools()}, {"tool_choice", "required"}}), limits());
  ASSERT_TRUE(forced.request.structured_output.has_value());
  EXPECT_EQ(forced.request.structured_output->after, "</think>");

  const ParsedRequest closed = parse(
      body({{"response_format", schema}, {"chat_template_kwargs", {{"enable_thinking", false}}}}),
      limits());
  ASSERT_TRUE(closed.request.structured_output.has_value());
  EXPECT_EQ(closed.request.structured_output->after, "");
  ServerLimits no_reasoning = limits();
  no_reasoning.chat_output.reasoning_parser.reset();
  const ParsedRequest plain = parse(body({{"response_format", schema}}), no_reasoning);
  ASSERT_TRUE(plain.request.structured_output.has_value());
  EXPECT_EQ(plain.request.structured_output->after, "");
}

TEST_F(ChatResponseTest, NonStreamedMessageCarriesReasoningAndToolCalls) {
  const ParsedRequest parsed = parse(body({{"tools", weatherTools()}}), limits());
  const ResponseMeta meta = makeResponseMeta(parsed, "r1", 0);
  const json response = chatCompletionResponse(
      meta, output(kToolCallOutput, protocol::FinishReason::kStop), *tokenizer_);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << response.dump();
  const json& message = choice["message"];
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["reasoning_content"], "The user wants the weather.");
  ASSERT_EQ(message["tool_calls"].size(), 1u) << message.dump();
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["id"], "chatcmpl-tool-0");
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"unit", "C"}}));
}

// vLLM's include_reasoning false: the reasoning is split off the content
// and dropped, whole and streamed.
TEST_F(ChatResponseTest, IncludeReasoningFalseDropsTheReasoning) {
  const ParsedRequest parsed =
      parse(body({{"tools", weatherTools()}, {"include_reasoning", false}}), limits());
  const ResponseMeta meta = makeResponseMeta(parsed, "r3", 0);
  const json response = chatCompletionResponse(
      meta, output(kToolCallOutput, protocol::FinishReason::kStop), *tokenizer_);
  const json& message = response["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content")) << message.dump();
  EXPECT_EQ(message["tool_calls"].size(), 1u);
  StreamState state;
  const std::string text = kToolCallOutput;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto chunk = chatCompletionChunk(
        meta,
        output(text.substr(i, 1), i + 1 == text.size() ? protocol::FinishReason::kStop
                                                       : protocol::FinishReason::kNone),
        *tokenizer_, state);
    if (chunk) {
      EXPECT_FALSE((*chunk)["choices"][0]["delta"].contains("reasoning_content"));
    }
  }
  auto refused =
      parseChatCompletionRequest(body({{"include_reasoning", "no"}}).dump(), limits(), *tokenizer_);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "include_reasoning");
}

TEST_F(ChatResponseTest, WithoutParsersTheWholeTextIsContent) {
  const ParsedRequest parsed = parse(body({{"tools", weatherTools()}}), limits(false));
  const json response =
      chatCompletionResponse(makeResponseMeta(parsed, "r2", 0),
                             output(kToolCallOutput, protocol::FinishReason::kStop), *tokenizer_);
  EXPECT_EQ(response["choices"][0]["message"]["content"], kToolCallOutput);
  EXPECT_EQ(response["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(response["choices"][0]["message"].contains("tool_calls"));
}

// The output streamed one byte per step: the deltas, joined, give the
// non-streamed message; the first chunk has the role, the last the finish
// reason "tool_calls".
TEST_F(ChatResponseTest, StreamedDeltasJoinToTheNonStreamedMessage) {
  const ParsedRequest parsed = parse(body({{"tools", weatherTools()}}), limits());
  const ResponseMeta meta = makeResponseMeta(parsed, "r3", 0);
  const std::string text = kToolCallOutput;
  StreamState state;
  std::string reasoning, content, name, arguments;
  json last_finish;
  int chunks = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool last = i + 1 == text.size();
    const auto chunk =
        chatCompletionChunk(meta,
                            output(text.substr(i, 1), last ? protocol::FinishReason::kStop
                                                           : protocol::FinishReason::kNone),
                            *tokenizer_, state);
    if (!chunk) continue;
    const json& choice = (*chunk)["choices"][0];
    const json& delta = choice["delta"];
    if (chunks++ == 0) {
      EXPECT_EQ(delta["role"], "assistant") << chunk->dump();
    }
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
    for (const json& call : delta.value("tool_calls", json::array())) {
      EXPECT_EQ(call["index"], 0);
      if (call.contains("id")) {
        EXPECT_EQ(call["id"], "chatcmpl-tool-0");
      }
      name += call["function"].value("name", "");
      arguments += call["function"].value("arguments", "");
    }
    last_finish = choice["finish_reason"];
  }
  EXPECT_GT(chunks, 2);
  EXPECT_EQ(reasoning, "The user wants the weather.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}, {"unit", "C"}}));
  EXPECT_EQ(last_finish, "tool_calls");
  const json whole = chatCompletionResponse(
      meta, output(kToolCallOutput, protocol::FinishReason::kStop), *tokenizer_);
  EXPECT_EQ(content, whole["choices"][0]["message"].value("content", ""));
}

// gpt-oss (harmony): the markers are special tokens, so the request keeps
// them in its text whatever the client asked; the channels become
// reasoning, content and calls; a schema holds from the first token (no
// grammar writes the special tokens that end harmony's reasoning) and a
// forced call is refused naming tool_choice.
TEST_F(ChatResponseTest, HarmonyKeepsSpecialTokensAndReadsTheChannels) {
  ServerLimits harmony = limits(false);
  harmony.chat_output.reasoning_parser = protocol::ReasoningParserKind::kOpenAiGptOss;
  harmony.chat_output.tool_call_parser = protocol::ToolCallParserKind::kOpenAi;
  const ParsedRequest parsed =
      parse(body({{"tools", weatherTools()}, {"skip_special_tokens", true}}), harmony);
  EXPECT_FALSE(parsed.request.sampling.skip_special_tokens);
  ASSERT_TRUE(parsed.chat_output.has_value());
  EXPECT_TRUE(parsed.chat_output->harmony());
  EXPECT_TRUE(
      parse(body({{"skip_special_tokens", true}}), limits()).request.sampling.skip_special_tokens);
  // Without tools offered the channels are still read.
  const ParsedRequest no_tools = parse(body(), harmony);
  ASSERT_TRUE(no_tools.chat_output.has_value());
  EXPECT_TRUE(no_tools.chat_output->harmony());
  EXPECT_FALSE(no_tools.chat_output->tool_call_parser.has_value());
  EXPECT_FALSE(no_tools.request.sampling.skip_special_tokens);

  const std::string text =
      "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
  const json response = chatCompletionResponse(
      makeResponseMeta(parsed, "h1", 0), output(text, protocol::FinishReason::kStop), *tokenizer_);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << response.dump();
  EXPECT_EQ(choice["message"]["reasoning_content"], "Weather needed.");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"], "chatcmpl-tool-0");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");

  const json schema = {{"type", "json_schema"},
                       {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  const ParsedRequest constrained = parse(body({{"response_format", schema}}), harmony);
  ASSERT_TRUE(constrained.request.structured_output.has_value());
  EXPECT_EQ(constrained.request.structured_output->after, "");

  for (const json& choice_value :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    auto refused = parseChatCompletionRequest(
        body({{"tools", weatherTools()}, {"tool_choice", choice_value}}).dump(), harmony,
        *tokenizer_);
    ASSERT_FALSE(refused.isOk()) << choice_value.dump();
    EXPECT_EQ(refused.error().param, "tool_choice");
    EXPECT_NE(refused.error().message.find("not supported with the openai tool-call parser"),
              std::string::npos)
        << refused.error().message;
  }
}

// Real models' tokenizers and templates (tests/data/tokenizers): the chat
// prompt is the rendered text encoded without added special tokens, so the
// template's own BOS appears once and its special tokens are single ids.
class RealTokenizerChat : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTokenizerChat, PromptIsTheTemplatesTextWithSpecialTokensAndOneBos) {
  const std::string dir = std::string(TANDEM_TEST_DATA_DIR) + "/tokenizers/" + GetParam();
  const auto tokenizer = Tokenizer::fromDirectory(dir);
  auto chat_template = ChatTemplate::load(*tokenizer);
  ASSERT_TRUE(chat_template.isOk()) << chat_template.status().toString();
  ServerLimits server_limits;
  server_limits.chat_template = *chat_template;
  server_limits.served_model_name = "real";
  server_limits.max_model_len = 4096;
  server_limits.vocab_size = tokenizer->vocabSize();
  const json request = {
      {"model", "real"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi!"}}}},
      {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto parsed = parseChatCompletionRequest(request.dump(), server_limits, *tokenizer);
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const std::vector<TokenId>& ids = parsed.value().request.prompt;
  EXPECT_EQ(ids, tokenizer->encode(parsed.value().prompt_text, /*add_special_tokens=*/false));
  // Every special token in the text is one id, and BOS (when the model has
  // one) appears exactly once, first.
  int special = 0;
  for (TokenId id : ids) special += tokenizer->isSpecial(id) ? 1 : 0;
  EXPECT_GE(special, 4) << parsed.value().prompt_text;
  if (const auto bos = tokenizer->bosTokenId();
      bos && parsed.value().prompt_text.rfind("<|begin_of_text|>", 0) == 0) {
    EXPECT_EQ(ids.front(), *bos);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), *bos), 1);
  }
  EXPECT_NE(parsed.value().prompt_text.find("Hi!"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Models, RealTokenizerChat, ::testing::Values("llama3", "qwen3"));

}  // namespace
}  // namespace tandem::server
