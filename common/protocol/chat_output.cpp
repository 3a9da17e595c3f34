#include "common/protocol/chat_output.h"

#include <utility>

namespace tandem::protocol {
namespace {

using nlohmann::json;

ReasoningOptions reasoningOptions(const ChatOutputOptions& options) {
  ReasoningOptions reasoning;
  reasoning.kind = options.reasoning_parser.value_or(ReasoningParserKind::kDeepSeekR1);
  reasoning.reasoning_ended_in_prompt = options.reasoning_ended_in_prompt;
  return reasoning;
}

// A harmony message to functions.NAME as an OpenAI tool call.
ToolCall toolCallOf(HarmonyCall call, const ToolCallIdGenerator& next_id) {
  ToolCall tool_call;
  tool_call.id = next_id ? next_id() : randomToolCallId();
  tool_call.name = std::move(call.name);
  tool_call.arguments = std::move(call.arguments);
  if (call.content_type.empty() || call.content_type.find("json") != std::string::npos) {
    if (auto compact = compactArguments(tool_call.arguments)) tool_call.arguments = *compact;
  }
  return tool_call;
}

std::vector<ToolCall> toolCallsOf(std::vector<HarmonyCall> calls,
                                  const ChatOutputOptions& options) {
  std::vector<ToolCall> out;
  if (!options.tool_call_parser) return out;  // no tools offered: calls are dropped
  for (HarmonyCall& call : calls)
    out.push_back(toolCallOf(std::move(call), options.next_tool_call_id));
  return out;
}

}  // namespace

Status pairChatOutputParsers(ChatOutputOptions& options) {
  const bool harmony_tools = options.tool_call_parser == ToolCallParserKind::kOpenAi;
  if (harmony_tools && !options.reasoning_parser) {
    options.reasoning_parser = ReasoningParserKind::kOpenAiGptOss;
  }
  const bool harmony_reasoning = options.reasoning_parser == ReasoningParserKind::kOpenAiGptOss;
  if (options.tool_call_parser && harmony_tools != harmony_reasoning) {
    return invalidArgument(
        std::string("--tool-call-parser ") + toolCallParserName(*options.tool_call_parser) +
        " and --reasoning-parser " + reasoningParserName(*options.reasoning_parser) +
        " read different output formats: gpt-oss's harmony format is read by --tool-call-parser "
        "openai with --reasoning-parser openai_gptoss (or neither)");
  }
  return Status::ok();
}

ChatOutput parseChatOutput(const ChatOutputOptions& options, std::string_view text) {
  // Absent and empty content are the same here; the message reports both as
  // absent.
  ChatOutput output;
  if (options.harmony()) {
    HarmonyPieces pieces = parseHarmony(text);
    if (options.include_reasoning && !pieces.reasoning.empty()) {
      output.reasoning_content = std::move(pieces.reasoning);
    }
    if (!pieces.content.empty()) output.content = std::move(pieces.content);
    output.tool_calls = toolCallsOf(std::move(pieces.calls), options);
    return output;
  }
  std::string content(text);
  if (options.reasoning_parser) {
    ReasoningSplit split = parseReasoning(reasoningOptions(options), text);
    if (options.include_reasoning) output.reasoning_content = std::move(split.reasoning);
    content = split.content.value_or("");
  }
  if (options.tool_call_parser && !content.empty()) {
    ToolCallSplit split =
        parseToolCalls(*options.tool_call_parser, content, options.next_tool_call_id);
    content = split.content.value_or("");
    output.tool_calls = std::move(split.tool_calls);
  }
  if (!content.empty()) output.content = std::move(content);
  return output;
}

std::string chatFinishReason(bool tools_called, std::string_view engine_finish_reason) {
  return tools_called ? "tool_calls" : std::string(engine_finish_reason);
}

json toolCallsJson(const std::vector<ToolCall>& calls) {
  json array = json::array();
  for (const ToolCall& call : calls) {
    array.push_back({{"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return array;
}

json chatOutputMessageJson(const ChatOutput& output) {
  json message = {{"role", "assistant"}};
  message["content"] = output.content ? json(*output.content) : json(nullptr);
  if (output.reasoning_content) message["reasoning_content"] = *output.reasoning_content;
  if (!output.tool_calls.empty()) message["tool_calls"] = toolCallsJson(output.tool_calls);
  return message;
}

json chatStreamDeltaJson(const ChatStreamDelta& delta) {
  json object = json::object();
  if (!delta.reasoning_content.empty()) object["reasoning_content"] = delta.reasoning_content;
  if (!delta.content.empty()) object["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCallDelta& call : delta.tool_calls) {
      json entry = {{"index", call.index}};
      json function = {{"arguments", call.arguments}};
      if (call.id) {
        entry["id"] = *call.id;
        entry["type"] = "function";
      }
      if (call.name) function["name"] = *call.name;
      entry["function"] = std::move(function);
      calls.push_back(std::move(entry));
    }
    object["tool_calls"] = std::move(calls);
  }
  return object;
}

ChatOutputStream::ChatOutputStream(ChatOutputOptions options) : options_(std::move(options)) {
  if (options_.harmony()) {
    harmony_.emplace();
    return;
  }
  if (options_.reasoning_parser) reasoning_.emplace(reasoningOptions(options_));
  if (options_.tool_call_parser) {
    tools_.emplace(*options_.tool_call_parser, options_.next_tool_call_id);
  }
}

ChatStreamDelta ChatOutputStream::feed(std::string_view text) {
  ChatStreamDelta out;
  if (harmony_) {
    routeHarmony(harmony_->feed(text), /*at_end=*/false, out);
  } else if (reasoning_) {
    const ReasoningPieces pieces = reasoning_->feed(text);
    route(pieces.reasoning, pieces.content, /*at_end=*/false, out);
  } else {
    route({}, text, /*at_end=*/false, out);
  }
  return out;
}

ChatStreamDelta ChatOutputStream::finish() {
  ChatStreamDelta out;
  if (harmony_) {
    routeHarmony(harmony_->finish(), /*at_end=*/true, out);
  } else if (reasoning_) {
    const ReasoningPieces pieces = reasoning_->finish();
    route(pieces.reasoning, pieces.content, /*at_end=*/true, out);
  } else {
    route({}, {}, /*at_end=*/true, out);
  }
  return out;
}

void ChatOutputStream::routeHarmony(HarmonyPieces pieces, bool at_end, ChatStreamDelta& out) {
  deliver(pieces.reasoning, pieces.content, toolCallsOf(std::move(pieces.calls), options_), at_end,
          out);
}

void ChatOutputStream::route(std::string_view reasoning, std::string_view content, bool at_end,
                             ChatStreamDelta& out) {
  std::string content_text;
  std::vector<ToolCall> calls;
  if (tools_) {
    ToolCallPieces pieces = tools_->feed(content);
    content_text = std::move(pieces.content);
    if (at_end) {
      ToolCallPieces last = tools_->finish();
      content_text += last.content;
      calls = std::move(last.tool_calls);
    }
  } else {
    content_text = std::string(content);
  }
  deliver(reasoning, content_text, std::move(calls), at_end, out);
}

void ChatOutputStream::deliver(std::string_view reasoning, std::string_view content,
                               std::vector<ToolCall> calls, bool at_end, ChatStreamDelta& out) {
  out.reasoning_content = reasoning_carry_.take(reasoning);
  out.content = content_carry_.take(content);
  if (at_end) {
    out.reasoning_content += reasoning_carry_.flush();
    out.content += content_carry_.flush();
  }
  if (!options_.include_reasoning) out.reasoning_content.clear();
  // One entry per call, whole: an index appears once in a delta (clients
  // that take a list's first appearance as it is, as openai-python's
  // accumulator long did, would otherwise lose the second entry's part).
  for (ToolCall& call : calls) {
    ToolCallDelta delta;
    delta.index = tool_calls_sent_;
    delta.id = std::move(call.id);
    delta.name = std::move(call.name);
    delta.arguments = std::move(call.arguments);
    out.tool_calls.push_back(std::move(delta));
    ++tool_calls_sent_;
  }
}

}  // namespace tandem::protocol
