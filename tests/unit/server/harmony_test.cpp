// The harmony parser (gpt-oss): headers, what each message becomes, output
// outside the format, the chat layer's tool calls and parser pairing, and a
// round trip through gpt-oss's own chat template: what the template writes
// for an assistant turn, parsed, gives back the turn. Streaming against the
// whole parse for every split is in chat_output_test.cpp's property tests.
#include "common/protocol/harmony.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <variant>

#include "common/protocol/chat_output.h"
#include "common/protocol/chat_request.h"
#include "common/protocol/chat_template.h"

namespace tandem::protocol {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(HarmonyHeader, ChannelRecipientAndContentTypeWhereverTheyAre) {
  struct Case {
    const char* header;
    HarmonyHeader expected;
  };
  const Case cases[] = {
      {"<|channel|>analysis", {"analysis", "", ""}},
      {"assistant<|channel|>final", {"final", "", ""}},
      {" to=functions.get_weather<|channel|>commentary json",
       {"commentary", "functions.get_weather", "json"}},
      {"<|channel|>commentary to=functions.get_weather <|constrain|>json",
       {"commentary", "functions.get_weather", "json"}},
      {"assistant to=browser.search<|channel|>analysis code",
       {"analysis", "browser.search", "code"}},
      {"", {"", "", ""}},
      {"assistant", {"", "", ""}},
  };
  for (const Case& c : cases) {
    const HarmonyHeader parsed = parseHarmonyHeader(c.header);
    EXPECT_EQ(parsed.channel, c.expected.channel) << c.header;
    EXPECT_EQ(parsed.recipient, c.expected.recipient) << c.header;
    EXPECT_EQ(parsed.content_type, c.expected.content_type) << c.header;
  }
}

TEST(Harmony, AnalysisIsReasoningAndFinalIsContent) {
  const HarmonyPieces pieces = parseHarmony(
      "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.");
  EXPECT_EQ(pieces.reasoning, "User asks 2+2. Simple.");
  EXPECT_EQ(pieces.content, "2 + 2 = 4.");
  EXPECT_TRUE(pieces.calls.empty());
}

TEST(Harmony, ACallIsAMessageToAFunction) {
  // The recipient after the channel, with <|constrain|> (what gpt-oss writes)...
  HarmonyPieces pieces = parseHarmony(
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}");
  EXPECT_EQ(pieces.reasoning, "Need the weather.");
  EXPECT_EQ(pieces.content, "");
  ASSERT_EQ(pieces.calls.size(), 1u);
  EXPECT_EQ(pieces.calls[0].name, "get_weather");
  EXPECT_EQ(pieces.calls[0].content_type, "json");
  EXPECT_EQ(pieces.calls[0].arguments, "{\"city\": \"Paris\"}");
  // ...or before it with a bare content type (what the template writes),
  // ended by <|call|> when the stop token is kept in the text.
  pieces = parseHarmony(" to=functions.f<|channel|>commentary json<|message|>{}<|call|>");
  ASSERT_EQ(pieces.calls.size(), 1u);
  EXPECT_EQ(pieces.calls[0].name, "f");
  EXPECT_EQ(pieces.calls[0].arguments, "{}");
}

TEST(Harmony, MessagesOfAPartJoinWithANewline) {
  const HarmonyPieces pieces = parseHarmony(
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>"
      "<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|><|start|>assistant"
      "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final"
      "<|message|>done<|return|>");
  EXPECT_EQ(pieces.reasoning, "a\nb");           // the empty message adds nothing
  EXPECT_EQ(pieces.content, "Checking.\ndone");  // a preamble is shown to the user
}

TEST(Harmony, BuiltInToolCallsAreNotFunctionCalls) {
  // gpt-oss's browser and python tools: vLLM's chat completions drop them
  // outside the analysis channel; in it they are reasoning.
  HarmonyPieces pieces =
      parseHarmony("<|channel|>commentary to=python code<|message|>print(1)<|call|>");
  EXPECT_EQ(pieces.reasoning, "");
  EXPECT_EQ(pieces.content, "");
  EXPECT_TRUE(pieces.calls.empty());
  pieces = parseHarmony("<|channel|>analysis to=browser.search code<|message|>{\"q\": \"x\"}");
  EXPECT_EQ(pieces.reasoning, "{\"q\": \"x\"}");
  EXPECT_TRUE(pieces.calls.empty());
}

TEST(Harmony, OutputOutsideTheFormatIsContent) {
  EXPECT_EQ(parseHarmony("{\"answer\": 4}").content, "{\"answer\": 4}");
  EXPECT_EQ(parseHarmony("<|channel|>final<|message|>x<|end|>stray").content, "x\nstray");
  // A header the output ends inside has no text; a body cut short keeps its
  // text, a partial marker included.
  const HarmonyPieces cut = parseHarmony("<|channel|>analysis<|message|>r<|end|><|start|>assist");
  EXPECT_EQ(cut.reasoning, "r");
  EXPECT_EQ(cut.content, "");
  EXPECT_EQ(parseHarmony("<|channel|>final<|message|>partial <|e").content, "partial <|e");
  // <|start|> without <|end|> still begins the next message.
  EXPECT_EQ(parseHarmony("<|channel|>final<|message|>a<|start|>assistant<|channel|>final"
                         "<|message|>b")
                .content,
            "a\nb");
}

TEST(Harmony, StreamHoldsHeadersAndPartialMarkers) {
  HarmonyStream stream;
  EXPECT_EQ(stream.feed("<|channel|>analy").reasoning, "");
  EXPECT_EQ(stream.feed("sis<|message|>thinking <|").reasoning, "thinking ");
  HarmonyPieces pieces = stream.feed("end|><|start|>assistant<|channel|>final<|message|>ans");
  EXPECT_EQ(pieces.reasoning, "");
  EXPECT_EQ(pieces.content, "ans");
  pieces = stream.finish();
  EXPECT_EQ(pieces.content, "");
}

ChatOutputOptions harmonyOptions(bool tools) {
  ChatOutputOptions options;
  options.reasoning_parser = ReasoningParserKind::kOpenAiGptOss;
  if (tools) options.tool_call_parser = ToolCallParserKind::kOpenAi;
  options.next_tool_call_id = [next = 0]() mutable { return "call-" + std::to_string(next++); };
  return options;
}

TEST(HarmonyChatOutput, CallsBecomeToolCallsWithTheirArgumentsAsCompactJson) {
  const std::string text =
      "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\",\n \"unit\": "
      "\"C\"}";
  ChatOutput output = parseChatOutput(harmonyOptions(true), text);
  EXPECT_EQ(output.reasoning_content, "Weather.");
  EXPECT_EQ(output.content, std::nullopt);
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].id, "call-0");
  EXPECT_EQ(output.tool_calls[0].name, "get_weather");
  EXPECT_EQ(output.tool_calls[0].arguments, R"({"city":"Paris","unit":"C"})");
  EXPECT_EQ(chatFinishReason(!output.tool_calls.empty(), "stop"), "tool_calls");

  // No tools offered (the request's tool parser is off): the call is dropped,
  // the reasoning stays.
  output = parseChatOutput(harmonyOptions(false), text);
  EXPECT_EQ(output.reasoning_content, "Weather.");
  EXPECT_TRUE(output.tool_calls.empty());

  // Arguments that are not JSON are kept as written (vLLM's openai parser);
  // a content type other than JSON is not parsed.
  output = parseChatOutput(harmonyOptions(true),
                           " to=functions.f<|channel|>commentary json<|message|>{bad");
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].arguments, "{bad");
  output = parseChatOutput(harmonyOptions(true),
                           " to=functions.f<|channel|>commentary code<|message|>{ \"a\" : 1 }");
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].arguments, "{ \"a\" : 1 }");

  ChatOutputOptions no_reasoning = harmonyOptions(true);
  no_reasoning.include_reasoning = false;
  EXPECT_EQ(parseChatOutput(no_reasoning, text).reasoning_content, std::nullopt);
}

TEST(HarmonyChatOutput, ParsersArePairedOrRefused) {
  ChatOutputOptions tools_only;
  tools_only.tool_call_parser = ToolCallParserKind::kOpenAi;
  ASSERT_TRUE(pairChatOutputParsers(tools_only).isOk());
  EXPECT_EQ(tools_only.reasoning_parser, ReasoningParserKind::kOpenAiGptOss);
  EXPECT_TRUE(tools_only.harmony());

  ChatOutputOptions reasoning_only;
  reasoning_only.reasoning_parser = ReasoningParserKind::kOpenAiGptOss;
  ASSERT_TRUE(pairChatOutputParsers(reasoning_only).isOk());
  EXPECT_EQ(reasoning_only.tool_call_parser, std::nullopt);

  ChatOutputOptions mixed;
  mixed.reasoning_parser = ReasoningParserKind::kOpenAiGptOss;
  mixed.tool_call_parser = ToolCallParserKind::kHermes;
  Status status = pairChatOutputParsers(mixed);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "--tool-call-parser hermes and --reasoning-parser openai_gptoss read different output "
            "formats: gpt-oss's harmony format is read by --tool-call-parser openai with "
            "--reasoning-parser openai_gptoss (or neither)");
  mixed.reasoning_parser = ReasoningParserKind::kQwen3;
  mixed.tool_call_parser = ToolCallParserKind::kOpenAi;
  EXPECT_FALSE(pairChatOutputParsers(mixed).isOk());

  ChatOutputOptions other;
  other.reasoning_parser = ReasoningParserKind::kQwen3;
  other.tool_call_parser = ToolCallParserKind::kHermes;
  ASSERT_TRUE(pairChatOutputParsers(other).isOk());
  EXPECT_FALSE(other.harmony());
}

// gpt-oss's own template (tests/data/chat_templates) writes an assistant
// turn the way the model is trained to write it: what follows the generation
// prompt in a conversation that ends with that turn is what the model would
// have generated, and the parser must give the turn back.
class HarmonyTemplateRoundTrip : public ::testing::Test {
 protected:
  static std::shared_ptr<const server::ChatTemplate> chatTemplate() {
    const std::filesystem::path file =
        std::filesystem::path(TANDEM_SOURCE_DIR) /
        "tests/data/chat_templates/templates/openai-gpt-oss-120b.jinja";
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    auto created = server::ChatTemplate::create(
        {{"default", text.str(), file.string()}},
        ordered_json{{"bos_token", "<|startoftext|>"}, {"eos_token", "<|return|>"}});
    EXPECT_TRUE(created.isOk()) << created.status().toString();
    return created.isOk() ? *created : nullptr;
  }

  static std::string render(const ordered_json& messages, bool add_generation_prompt) {
    const auto chat_template = chatTemplate();
    if (chat_template == nullptr) return "";
    server::ChatTemplateInput input;
    input.messages = messages;
    input.add_generation_prompt = add_generation_prompt;
    auto rendered = chat_template->render(input);
    if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) {
      ADD_FAILURE() << error->describe();
      return "";
    }
    return std::get<std::string>(rendered);
  }

  // The text the template writes after the generation prompt for `turn`.
  static std::string generated(const ordered_json& turn) {
    const ordered_json user = {{"role", "user"}, {"content", "Weather in Paris?"}};
    const std::string prompt = render(ordered_json::array({user}), true);
    const std::string whole = render(ordered_json::array({user, turn}), false);
    EXPECT_EQ(whole.substr(0, prompt.size()), prompt) << whole;
    EXPECT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;
    return whole.substr(prompt.size());
  }
};

TEST_F(HarmonyTemplateRoundTrip, ThinkingAndAnswer) {
  const std::string text = generated({{"role", "assistant"},
                                      {"thinking", "The user wants the weather; I have no tool."},
                                      {"content", "I cannot check the weather."}});
  const ChatOutput output = parseChatOutput(harmonyOptions(true), text);
  EXPECT_EQ(output.reasoning_content, "The user wants the weather; I have no tool.") << text;
  EXPECT_EQ(output.content, "I cannot check the weather.") << text;
  EXPECT_TRUE(output.tool_calls.empty());
}

TEST_F(HarmonyTemplateRoundTrip, ToolCall) {
  const ordered_json arguments = {{"city", "Paris"}, {"unit", "celsius"}};
  const std::string text = generated(
      {{"role", "assistant"},
       {"thinking", "Call get_weather."},
       {"tool_calls", ordered_json::array(
                          {{{"type", "function"},
                            {"function", {{"name", "get_weather"}, {"arguments", arguments}}}}})}});
  const ChatOutput output = parseChatOutput(harmonyOptions(true), text);
  EXPECT_EQ(output.reasoning_content, "Call get_weather.") << text;
  EXPECT_EQ(output.content, std::nullopt) << text;
  ASSERT_EQ(output.tool_calls.size(), 1u) << text;
  EXPECT_EQ(output.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(output.tool_calls[0].arguments), json(arguments));
}

// A tool-calling loop: the client sends back the assistant turn it got
// (content null, the reasoning as reasoning_content) and the tool's result.
// Under harmony the reasoning reaches the template as `thinking`, so the
// prompt holds the analysis that led to the call, as vLLM's harmony input
// writes it; otherwise the message goes to the template as sent.
TEST_F(HarmonyTemplateRoundTrip, ReasoningContentSentBackIsTheAnalysisBeforeTheCall) {
  const ordered_json request = {
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"reasoning_content", "Need get_weather."},
         {"tool_calls",
          {{{"id", "call-0"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call-0"}, {"content", "18 C"}}}}};
  const auto chat_template = chatTemplate();
  ASSERT_NE(chat_template, nullptr);
  const std::string analysis = "<|channel|>analysis<|message|>Need get_weather.<|end|>";
  auto harmony = server::renderChatRequest(request, chat_template.get(), nullptr, nullptr,
                                           /*reasoning_as_thinking=*/true);
  ASSERT_TRUE(harmony.isOk()) << harmony.error().message;
  EXPECT_NE(harmony.value().find(analysis + "<|start|>assistant to=functions.get_weather"),
            std::string::npos)
      << harmony.value();
  auto plain = server::renderChatRequest(request, chat_template.get());
  ASSERT_TRUE(plain.isOk()) << plain.error().message;
  EXPECT_EQ(plain.value().find(analysis), std::string::npos) << plain.value();

  ordered_json wrong = request;
  wrong["messages"][1]["reasoning_content"] = 7;
  auto refused = server::renderChatRequest(wrong, chat_template.get(), nullptr, nullptr, true);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "messages[1].reasoning_content");
}

}  // namespace
}  // namespace tandem::protocol
