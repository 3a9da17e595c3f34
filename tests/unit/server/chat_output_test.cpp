// Chat output parsing, whole and streamed. The central property: for every
// parser combination and every way of cutting an output into pieces (every
// single cut, every pair of cuts on short outputs, byte by byte, random
// cuts), the streamed deltas put together equal the whole-output parse, no
// delta ends inside a UTF-8 character, and tool call deltas are well formed.
// Plus concrete outputs of Qwen3 and Llama 3.1 and the JSON shapes.
#include "common/protocol/chat_output.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tandem::protocol {
namespace {

using nlohmann::json;

ToolCallIdGenerator counterIds() {
  return [next = 0]() mutable { return "call-" + std::to_string(next++); };
}

ChatOutputOptions makeOptions(std::optional<ReasoningParserKind> reasoning,
                              std::optional<ToolCallParserKind> tools, bool ended = false) {
  ChatOutputOptions options;
  options.reasoning_parser = reasoning;
  options.tool_call_parser = tools;
  options.reasoning_ended_in_prompt = ended;
  options.next_tool_call_id = counterIds();
  return options;
}

// Outputs in the formats the supported models produce, plus edge cases for
// tags cut short, tags inside other sections, malformed calls and
// multi-byte characters.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> kOutputs = {
      "",
      "Hello, world!",
      "<think>\nLet me compare 9.11 and 9.8.\n</think>\n\n9.8 is greater.",
      "Reasoning with the start in the prompt</think>Answer",
      "<think>truncated thinking",
      "</think>only content",
      "<think></think>",
      "résumé — 日本語 🙂</think> ünïcödé 🎉",
      "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n"
      "</tool_call>",
      "I'll check.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a<b\"}}\n"
      "</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
      "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{bad}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
      " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": [1, "
      "{\"y\": \"}\"}]}}",
      "{\"name\": \"a\", \"parameters\": {",
      "<|python_tag|>print('hi')",
      "<|python_tag",
      "{not json} trailing",
      "<thi",
      "a < b <tool_ c <think x </thin y <|py",
      "\n\n   ",
      "<think>maybe <tool_call> here</think>real <tool_call>{\"name\":\"f\"}</tool_call>",
      "日本<tool_call>{\"name\": \"名前\", \"arguments\": {\"都市\": \"東京\"}}</tool_call>",
      "<think>思考</think>{\"name\": \"ñ\", \"parameters\": {\"v\": \"€\"}}",
      // gpt-oss's harmony format (the prompt ended with <|start|>assistant).
      "<|channel|>analysis<|message|>The user asks 2+2.<|end|><|start|>assistant<|channel|>final"
      "<|message|>4",
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", "
      "\"unit\": \"C\"}",
      " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"東京\"}<|call|>",
      "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant to=functions.search"
      "<|channel|>commentary json<|message|>{bad json",
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
      "<|end|><|start|>assistant<|channel|>final<|message|>x<|end|><|start|>assistant<|channel|>"
      "final<|message|>y<|return|>",
      "<|channel|>commentary to=python code<|message|>print(1)<|call|>",
      "<|channel|>analys",
      "<|channel|>final<|message|>partial <|e",
      "<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b",
      "<|channel|>analysis<|message|>日本語 🙂<|end|><|start|>assistant<|channel|>final"
      "<|message|>ünï",
      "{\"answer\": 4}",
  };
  return kOutputs;
}

std::vector<ChatOutputOptions> allConfigurations() {
  std::vector<ChatOutputOptions> configurations;
  const std::vector<std::optional<ToolCallParserKind>> tools = {
      std::nullopt, ToolCallParserKind::kHermes, ToolCallParserKind::kLlama3Json};
  for (const auto& tool : tools) {
    configurations.push_back(makeOptions(std::nullopt, tool));
    for (ReasoningParserKind reasoning :
         {ReasoningParserKind::kDeepSeekR1, ReasoningParserKind::kQwen3}) {
      configurations.push_back(makeOptions(reasoning, tool));
      configurations.push_back(makeOptions(reasoning, tool, /*ended=*/true));
    }
  }
  // Harmony (gpt-oss), with and without tools offered.
  configurations.push_back(makeOptions(ReasoningParserKind::kOpenAiGptOss, std::nullopt));
  configurations.push_back(
      makeOptions(ReasoningParserKind::kOpenAiGptOss, ToolCallParserKind::kOpenAi));
  return configurations;
}

std::string describe(const ChatOutputOptions& options) {
  std::string text = "reasoning=";
  text += options.reasoning_parser ? reasoningParserName(*options.reasoning_parser) : "none";
  text += options.reasoning_ended_in_prompt ? "(ended in prompt)" : "";
  text += " tools=";
  text += options.tool_call_parser ? toolCallParserName(*options.tool_call_parser) : "none";
  return text;
}

struct StreamedCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// Feeds `text` cut at `cuts` (ascending offsets) and checks the result
// against the whole-output parse. Returns "" when all holds, else what broke.
std::string checkSplit(const ChatOutputOptions& options, const std::string& text,
                       const std::vector<size_t>& cuts) {
  ChatOutputOptions fresh = options;
  fresh.next_tool_call_id = counterIds();
  const ChatOutput whole = parseChatOutput(fresh, text);
  fresh.next_tool_call_id = counterIds();
  ChatOutputStream stream(fresh);

  std::string reasoning;
  std::string content;
  std::vector<StreamedCall> calls;
  std::string problem;
  auto absorb = [&](const ChatStreamDelta& delta, bool last) {
    // A piece other than the last may not end inside a UTF-8 character: the
    // byte that follows it in its channel must not be a continuation byte.
    auto checkBoundary = [&](const std::string& so_far, const std::optional<std::string>& full,
                             const char* channel) {
      const std::string expected = full.value_or("");
      if (!last && so_far.size() < expected.size() &&
          (static_cast<unsigned char>(expected[so_far.size()]) & 0xC0) == 0x80) {
        problem = std::string(channel) + " piece ends inside a UTF-8 character at byte " +
                  std::to_string(so_far.size());
      }
    };
    reasoning += delta.reasoning_content;
    content += delta.content;
    if (!delta.reasoning_content.empty()) {
      checkBoundary(reasoning, whole.reasoning_content, "reasoning");
    }
    if (!delta.content.empty()) checkBoundary(content, whole.content, "content");
    std::set<size_t> indexes;
    for (const ToolCallDelta& call : delta.tool_calls) {
      if (!indexes.insert(call.index).second) {
        problem = "tool call index " + std::to_string(call.index) + " twice in one delta";
      }
      if (call.index == calls.size()) {
        if (!call.id || !call.name) problem = "first delta of a call lacks id or name";
        calls.push_back({call.id.value_or(""), call.name.value_or(""), call.arguments});
      } else if (call.index + 1 == calls.size()) {
        if (call.id || call.name) problem = "later delta of a call repeats id or name";
        calls.back().arguments += call.arguments;
      } else {
        problem = "tool call delta index " + std::to_string(call.index) + " out of order";
      }
    }
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    absorb(stream.feed(std::string_view(text).substr(at, cut - at)), false);
    at = cut;
  }
  absorb(stream.feed(std::string_view(text).substr(at)), false);
  absorb(stream.finish(), true);
  if (!problem.empty()) return problem;

  if (reasoning != whole.reasoning_content.value_or("")) {
    return "reasoning \"" + reasoning + "\" != \"" + whole.reasoning_content.value_or("") + "\"";
  }
  if (content != whole.content.value_or("")) {
    return "content \"" + content + "\" != \"" + whole.content.value_or("") + "\"";
  }
  if (calls.size() != whole.tool_calls.size()) {
    return std::to_string(calls.size()) +
           " streamed calls != " + std::to_string(whole.tool_calls.size());
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& expected = whole.tool_calls[i];
    if (calls[i].id != expected.id || calls[i].name != expected.name ||
        calls[i].arguments != expected.arguments) {
      return "call " + std::to_string(i) + " " + calls[i].name + calls[i].arguments +
             " != " + expected.name + expected.arguments;
    }
  }
  if (stream.toolsCalled() != !whole.tool_calls.empty()) return "toolsCalled() disagrees";
  return "";
}

std::string cutsText(const std::vector<size_t>& cuts) {
  std::string text;
  for (size_t cut : cuts) text += std::to_string(cut) + " ";
  return text;
}

// Runs every check for one output; stops at the first failure.
void checkAllSplits(const ChatOutputOptions& options, const std::string& text, std::mt19937& rng) {
  std::vector<std::vector<size_t>> splits;
  splits.push_back({});
  for (size_t cut = 0; cut <= text.size(); ++cut) splits.push_back({cut});
  if (text.size() <= 64) {
    for (size_t first = 1; first < text.size(); ++first) {
      for (size_t second = first + 1; second < text.size(); ++second) {
        splits.push_back({first, second});
      }
    }
  }
  std::vector<size_t> bytes;
  for (size_t cut = 1; cut < text.size(); ++cut) bytes.push_back(cut);
  splits.push_back(bytes);
  for (int round = 0; round < 40; ++round) {
    std::vector<size_t> cuts;
    for (size_t cut = 1; cut < text.size(); ++cut) {
      if (rng() % 4 == 0) cuts.push_back(cut);
    }
    splits.push_back(cuts);
  }
  for (const std::vector<size_t>& cuts : splits) {
    const std::string problem = checkSplit(options, text, cuts);
    ASSERT_EQ(problem, "") << describe(options) << "\noutput: " << text
                           << "\ncuts: " << cutsText(cuts);
  }
}

TEST(ChatOutputStreamProperty, StreamedPiecesEqualTheWholeParseForEverySplit) {
  std::mt19937 rng(20240601);
  for (const ChatOutputOptions& options : allConfigurations()) {
    for (const std::string& text : corpus()) {
      checkAllSplits(options, text, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(ChatOutputStreamProperty, RandomOutputsFromTagFragments) {
  // Outputs assembled from tags, tag fragments, JSON and multi-byte text in
  // random order hit the hold-back paths in combinations nobody wrote down.
  const std::vector<std::string> fragments = {"<think>",
                                              "</think>",
                                              "<tool_call>",
                                              "</tool_call>",
                                              "<|python_tag|>",
                                              "<thi",
                                              "</tool",
                                              "{\"name\": \"f\", \"arguments\": {\"k\": \"v\"}}",
                                              "{\"name\": \"g\", \"parameters\": {}}",
                                              ";",
                                              " ",
                                              "\n",
                                              "é",
                                              "🙂",
                                              "text",
                                              "{",
                                              "}",
                                              "<|channel|>",
                                              "<|message|>",
                                              "<|start|>",
                                              "<|end|>",
                                              "<|call|>",
                                              "<|return|>",
                                              "<|constrain|>",
                                              "<|",
                                              "analysis",
                                              "final",
                                              " to=functions.f",
                                              " json"};
  std::mt19937 rng(7);
  const std::vector<ChatOutputOptions> configurations = allConfigurations();
  for (int sample = 0; sample < 300; ++sample) {
    std::string text;
    const int parts = static_cast<int>(rng() % 7);
    for (int part = 0; part < parts; ++part) text += fragments[rng() % fragments.size()];
    const ChatOutputOptions& options = configurations[rng() % configurations.size()];
    std::vector<size_t> bytes;
    for (size_t cut = 1; cut < text.size(); ++cut) bytes.push_back(cut);
    for (const std::vector<size_t>& cuts : {std::vector<size_t>{}, bytes}) {
      const std::string problem = checkSplit(options, text, cuts);
      ASSERT_EQ(problem, "") << describe(options) << "\noutput: " << text
                             << "\ncuts: " << cutsText(cuts);
    }
  }
}

TEST(ChatOutput, Qwen3ThinkingThenToolCall) {
  const ChatOutput output = parseChatOutput(
      makeOptions(ReasoningParserKind::kQwen3, ToolCallParserKind::kHermes),
      "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(output.reasoning_content, "\nThe user wants the weather in Paris.\n");
  EXPECT_EQ(output.content, "\n\n");  // vLLM keeps the text before the call as it is
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].id, "call-0");
  EXPECT_EQ(output.tool_calls[0].name, "get_weather");
  EXPECT_EQ(output.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(chatFinishReason(!output.tool_calls.empty(), "stop"), "tool_calls");
}

TEST(ChatOutput, ToolCallInsideReasoningIsReasoning) {
  const ChatOutput output =
      parseChatOutput(makeOptions(ReasoningParserKind::kDeepSeekR1, ToolCallParserKind::kHermes),
                      "I could use <tool_call>{\"name\": \"f\"}</tool_call></think>No call.");
  EXPECT_EQ(output.reasoning_content, "I could use <tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(output.content, "No call.");
  EXPECT_TRUE(output.tool_calls.empty());
}

TEST(ChatOutput, Llama31PythonTagCall) {
  const ChatOutput output =
      parseChatOutput(makeOptions(std::nullopt, ToolCallParserKind::kLlama3Json),
                      R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})");
  EXPECT_EQ(output.content, std::nullopt);
  EXPECT_EQ(output.reasoning_content, std::nullopt);
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].name, "get_weather");
  EXPECT_EQ(output.tool_calls[0].arguments, R"({"city":"Paris"})");
}

TEST(ChatOutput, NoParsersPassTextThrough) {
  const ChatOutput output =
      parseChatOutput(makeOptions(std::nullopt, std::nullopt), "<think>a</think><tool_call>");
  EXPECT_EQ(output.content, "<think>a</think><tool_call>");
  EXPECT_EQ(output.reasoning_content, std::nullopt);
  EXPECT_TRUE(output.tool_calls.empty());
  EXPECT_EQ(parseChatOutput(makeOptions(std::nullopt, std::nullopt), "").content, std::nullopt);
  EXPECT_EQ(chatFinishReason(false, "length"), "length");
}

TEST(ChatOutput, MessageJson) {
  ChatOutput output;
  output.reasoning_content = "why";
  output.tool_calls.push_back({"call-0", "f", R"({"a":1})"});
  EXPECT_EQ(chatOutputMessageJson(output),
            json::parse(R"({"role": "assistant", "content": null, "reasoning_content": "why",
                "tool_calls": [{"id": "call-0", "type": "function",
                                "function": {"name": "f", "arguments": "{\"a\":1}"}}]})"));
  ChatOutput plain;
  plain.content = "hi";
  EXPECT_EQ(chatOutputMessageJson(plain), json::parse(R"({"role": "assistant", "content": "hi"})"));
}

TEST(ChatOutputStream, DeltasAndTheirJson) {
  ChatOutputStream stream(makeOptions(ReasoningParserKind::kQwen3, ToolCallParserKind::kHermes));
  // An opened reasoning streams as it comes.
  EXPECT_EQ(chatStreamDeltaJson(stream.feed("<think>plan")),
            json::parse(R"({"reasoning_content": "plan"})"));
  ChatStreamDelta delta = stream.feed("</think>Calling.<tool_call>{\"name\": \"f\", ");
  EXPECT_EQ(chatStreamDeltaJson(delta), json::parse(R"({"content": "Calling."})"));
  EXPECT_TRUE(stream.feed("\"arguments\": {\"a\": 1}}</tool_call>").empty());
  EXPECT_FALSE(stream.toolsCalled());
  delta = stream.finish();
  EXPECT_TRUE(stream.toolsCalled());
  EXPECT_EQ(chatStreamDeltaJson(delta), json::parse(R"({"tool_calls": [
      {"index": 0, "id": "call-0", "type": "function",
       "function": {"name": "f", "arguments": "{\"a\":1}"}}]})"));
}

TEST(ChatOutputStream, NeverEndsAPieceInsideAUtf8Character) {
  ChatOutputStream stream(makeOptions(std::nullopt, std::nullopt));
  const std::string smile = "🙂";  // four bytes
  EXPECT_EQ(stream.feed(smile.substr(0, 1)).content, "");
  EXPECT_EQ(stream.feed(smile.substr(1, 2)).content, "");
  EXPECT_EQ(stream.feed(smile.substr(3) + "a\xC3").content, smile + "a");
  // The output ends on half a character: finish hands back what is left.
  EXPECT_EQ(stream.finish().content, "\xC3");
}

}  // namespace
}  // namespace tandem::protocol
