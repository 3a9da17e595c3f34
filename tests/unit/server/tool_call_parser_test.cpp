// Tool-call parsers on whole outputs in the formats Hermes / Qwen and
// Llama 3.1 / 3.2 produce: calls found, content around them, malformed calls
// left as content, ids, and the name registry.
#include "common/protocol/tool_call_parser.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

namespace tandem::protocol {
namespace {

constexpr auto kHermes = ToolCallParserKind::kHermes;
constexpr auto kLlama = ToolCallParserKind::kLlama3Json;

ToolCallIdGenerator counterIds() {
  return [next = 0]() mutable { return "call-" + std::to_string(next++); };
}

ToolCallSplit parse(ToolCallParserKind kind, std::string_view text) {
  return parseToolCalls(kind, text, counterIds());
}

TEST(ToolCallParserRegistry, KnownNamesResolve) {
  EXPECT_EQ(toolCallParserNames(), (std::vector<std::string>{"hermes", "llama3_json", "openai"}));
  for (const std::string& name : toolCallParserNames()) {
    StatusOr<ToolCallParserKind> kind = toolCallParserFromName(name);
    ASSERT_TRUE(kind.isOk()) << name;
    EXPECT_EQ(toolCallParserName(*kind), name);
  }
}

TEST(ToolCallParserRegistry, UnknownNameNamesTheAcceptedOnes) {
  StatusOr<ToolCallParserKind> kind = toolCallParserFromName("llama3");
  ASSERT_FALSE(kind.isOk());
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kind.status().message(),
            "unknown tool call parser \"llama3\" (--tool-call-parser); accepted: hermes, "
            "llama3_json, openai");
}

TEST(ToolCallIds, RandomIdsHaveTheOpenAiShape) {
  const std::regex shape("chatcmpl-tool-[0-9a-f]{32}");
  const std::string first = randomToolCallId();
  const std::string second = randomToolCallId();
  EXPECT_TRUE(std::regex_match(first, shape)) << first;
  EXPECT_TRUE(std::regex_match(second, shape)) << second;
  EXPECT_NE(first, second);
  ToolCallSplit split = parseToolCalls(kHermes, R"(<tool_call>{"name": "f"}</tool_call>)");
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_TRUE(std::regex_match(split.tool_calls[0].id, shape)) << split.tool_calls[0].id;
}

TEST(HermesToolCalls, OneCallWithArgumentsCompacted) {
  ToolCallSplit split = parse(kHermes,
                              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>");
  EXPECT_EQ(split.content, std::nullopt);
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].id, "call-0");
  EXPECT_EQ(split.tool_calls[0].name, "get_weather");
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");
}

TEST(HermesToolCalls, TwoParallelCalls) {
  ToolCallSplit split =
      parse(kHermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Paris\"}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n"
            "</tool_call>");
  EXPECT_EQ(split.content, std::nullopt);
  ASSERT_EQ(split.tool_calls.size(), 2u);
  EXPECT_EQ(split.tool_calls[0].id, "call-0");
  EXPECT_EQ(split.tool_calls[0].name, "get_weather");
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(split.tool_calls[1].id, "call-1");
  EXPECT_EQ(split.tool_calls[1].name, "get_time");
  EXPECT_EQ(split.tool_calls[1].arguments, R"({"tz":"Europe/Paris"})");
}

TEST(HermesToolCalls, TextBeforeTheFirstCallIsContent) {
  ToolCallSplit split = parse(kHermes,
                              "Let me look that up.\n<tool_call>\n{\"name\": \"search\", "
                              "\"arguments\": {\"q\": \"tandem\"}}\n</tool_call>\ntrailing");
  EXPECT_EQ(split.content, "Let me look that up.\n");
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"q":"tandem"})");
}

TEST(HermesToolCalls, KeyOrderAndUnicodeKept) {
  ToolCallSplit split = parse(
      kHermes,
      R"(<tool_call>{"name": "地図", "arguments": {"z": 1, "a": "東京 🙂", "m": [true, null]}}</tool_call>)");
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].name, "地図");
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"z":1,"a":"東京 🙂","m":[true,null]})");
}

TEST(HermesToolCalls, UnclosedLastBlockStillCounts) {
  ToolCallSplit split = parse(kHermes, R"(<tool_call>{"name": "f", "arguments": {}})");
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].arguments, "{}");
}

TEST(HermesToolCalls, MissingArgumentsBecomeEmptyObject) {
  ToolCallSplit split = parse(kHermes, R"(<tool_call>{"name": "now"}</tool_call>)");
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].arguments, "{}");
}

TEST(HermesToolCalls, MalformedJsonStaysContent) {
  const std::string malformed =
      "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  ToolCallSplit split = parse(kHermes, malformed);
  EXPECT_TRUE(split.tool_calls.empty());
  EXPECT_EQ(split.content, malformed);

  // One bad block makes the whole output content, as in vLLM.
  const std::string one_bad =
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{oops}</tool_call>";
  split = parse(kHermes, one_bad);
  EXPECT_TRUE(split.tool_calls.empty());
  EXPECT_EQ(split.content, one_bad);

  for (const char* not_a_call :
       {R"(<tool_call>{"arguments": {}}</tool_call>)", R"(<tool_call>{"name": 3}</tool_call>)",
        R"(<tool_call>[1, 2]</tool_call>)", "<tool_call></tool_call>",
        R"(<tool_call>{"name": "f", "x": 1e400}</tool_call>)"}) {
    split = parse(kHermes, not_a_call);
    EXPECT_TRUE(split.tool_calls.empty()) << not_a_call;
    EXPECT_EQ(split.content, not_a_call);
  }
}

TEST(HermesToolCalls, PlainTextIsContent) {
  ToolCallSplit split = parse(kHermes, "The weather in Paris is sunny.");
  EXPECT_TRUE(split.tool_calls.empty());
  EXPECT_EQ(split.content, "The weather in Paris is sunny.");
  EXPECT_EQ(parse(kHermes, "").content, std::nullopt);
}

TEST(Llama3JsonToolCalls, PythonTagCall) {
  ToolCallSplit split =
      parse(kLlama, R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})");
  EXPECT_EQ(split.content, std::nullopt);
  ASSERT_EQ(split.tool_calls.size(), 1u);
  EXPECT_EQ(split.tool_calls[0].id, "call-0");
  EXPECT_EQ(split.tool_calls[0].name, "get_weather");
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"city":"Paris"})");
}

TEST(Llama3JsonToolCalls, BareJsonAndSemicolonSeparatedCalls) {
  ToolCallSplit split = parse(kLlama,
                              " \n{\"name\": \"a\", \"parameters\": {\"s\": \"}{;\"}}; "
                              "{\"name\": \"b\", \"arguments\": {\"n\": [1, {\"k\": 2}]}};\n");
  EXPECT_EQ(split.content, std::nullopt);
  ASSERT_EQ(split.tool_calls.size(), 2u);
  EXPECT_EQ(split.tool_calls[0].name, "a");
  EXPECT_EQ(split.tool_calls[0].arguments, R"({"s":"}{;"})");
  EXPECT_EQ(split.tool_calls[1].name, "b");
  EXPECT_EQ(split.tool_calls[1].arguments, R"({"n":[1,{"k":2}]})");
}

TEST(Llama3JsonToolCalls, OtherOutputIsContent) {
  for (const char* text :
       {"The answer is {42}.", "<|python_tag|>print('hi')",
        R"({"name": "f", "parameters": {"a": 1})",                 // cut short
        R"({"name": "f", "parameters": {}} and then some words)",  // trailing text
        R"({"tool": "f"})", " <|python_tag|>", R"(x {"name": "f", "parameters": {}})",
        R"({"name": "Bob", "age": 3})"}) {  // an answer with a "name", no arguments
    ToolCallSplit split = parse(kLlama, text);
    EXPECT_TRUE(split.tool_calls.empty()) << text;
    EXPECT_EQ(split.content, text);
  }
}

TEST(ToolCallStream, HoldsBackAPartialToolCallTag) {
  ToolCallStream stream(kHermes, counterIds());
  EXPECT_EQ(stream.feed("Checking <tool_").content, "Checking ");
  ToolCallPieces pieces =
      stream.feed("call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>");
  EXPECT_EQ(pieces.content, "");
  EXPECT_TRUE(pieces.tool_calls.empty());
  pieces = stream.finish();
  EXPECT_EQ(pieces.content, "");
  ASSERT_EQ(pieces.tool_calls.size(), 1u);
  EXPECT_EQ(pieces.tool_calls[0].name, "f");
  EXPECT_EQ(pieces.tool_calls[0].arguments, R"({"x":1})");
}

TEST(ToolCallStream, Llama3JsonDecidesOnTheFirstByteAfterTheTag) {
  ToolCallStream content(kLlama, counterIds());
  EXPECT_EQ(content.feed("  <|python").content, "");
  EXPECT_EQ(content.feed("_tag|> x").content, "  <|python_tag|> x");

  ToolCallStream calls(kLlama, counterIds());
  EXPECT_EQ(calls.feed(R"(<|python_tag|>{"name": "f", "parameters": {}})").content, "");
  ToolCallPieces last = calls.finish();
  ASSERT_EQ(last.tool_calls.size(), 1u);
  EXPECT_EQ(last.tool_calls[0].arguments, "{}");
}

}  // namespace
}  // namespace tandem::protocol
