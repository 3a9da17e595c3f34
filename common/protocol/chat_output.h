// Chat completion output parsing: a model's generated text becomes the
// assistant message of /v1/chat/completions (content, reasoning_content,
// tool_calls), whole or as stream deltas. It runs the reasoning parser first
// (reasoning_parser.h) and the tool-call parser on the content it leaves
// (tool_call_parser.h); either may be off. See those headers for each
// parser's format and choices. gpt-oss's parsers (reasoning openai_gptoss,
// tool calls openai) are one: the harmony parser (harmony.h) reads its
// messages into reasoning, content and calls at once. A message addressed to
// `functions.NAME` becomes a tool call only when the request's tool parser
// is on (tools offered, tool_choice not "none"); its arguments, when the
// message's content type is JSON or not given, are re-serialised as compact
// JSON keeping the model's key order (as the other parsers do), and kept as
// written when they are not valid JSON (vLLM's openai parser keeps them).
//
// Contract of the streaming side: ChatOutputStream is fed the decoded text in
// arbitrary byte pieces (a tag or a UTF-8 character may be cut anywhere) and
// returns OpenAI stream deltas. No returned text ends inside a tag or inside
// a UTF-8 character (finish() hands back whatever is left, even an
// unfinished character). For any split of an output into pieces, the
// concatenation of all reasoning text, of all content text, and of each
// call's name and arguments fragments equals parseChatOutput() on the whole
// output (absent = empty): nothing is lost or duplicated.
//
// Tool call deltas: the first delta of a call carries index, id, type
// "function" and function.name (arguments ""); later deltas of the same index
// carry function.arguments fragments. Calls come out when finish() decides
// them (see tool_call_parser.h for why).
//
// finish_reason: "tool_calls" whenever the output has tool calls
// (chatFinishReason), as vLLM does, whatever the engine said.
//
// Thread-safety: free functions are pure; a ChatOutputStream belongs to one
// request. Nothing here throws.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol/harmony.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/stream_text.h"
#include "common/protocol/tool_call_parser.h"

namespace tandem::protocol {

struct ChatOutputOptions {
  std::optional<ReasoningParserKind> reasoning_parser;  // nullopt: no reasoning split
  std::optional<ToolCallParserKind> tool_call_parser;   // nullopt: no tool calls
  // The prompt already closed the reasoning (enable_thinking=false): all
  // output is content. Only matters with a reasoning parser.
  bool reasoning_ended_in_prompt = false;
  // vLLM's include_reasoning: false drops the reasoning (it is split off
  // the content all the same, but neither returned nor streamed).
  bool include_reasoning = true;
  // Tool call ids; empty: randomToolCallId.
  ToolCallIdGenerator next_tool_call_id;

  // The output is in the harmony format (gpt-oss): special tokens are kept
  // in its text (the markers) and the harmony parser reads it.
  bool harmony() const { return reasoning_parser == ReasoningParserKind::kOpenAiGptOss; }
};

// The server's parsers, checked as a pair: the openai tool-call parser reads
// the harmony format, so it brings the openai_gptoss reasoning parser when
// none is given. InvalidArgument naming both flags when one of them reads
// harmony and the other another format (`--tool-call-parser hermes` with
// `--reasoning-parser openai_gptoss`).
Status pairChatOutputParsers(ChatOutputOptions& options);

// The assistant message of a non-streamed chat completion.
struct ChatOutput {
  std::optional<std::string> content;            // nullopt: null in JSON
  std::optional<std::string> reasoning_content;  // nullopt: field left out
  std::vector<ToolCall> tool_calls;
};

ChatOutput parseChatOutput(const ChatOutputOptions& options, std::string_view text);

// "tool_calls" when tools were called, else the engine's reason ("stop",
// "length", ...).
std::string chatFinishReason(bool tools_called, std::string_view engine_finish_reason);

// {"role": "assistant", "content": text or null, "reasoning_content": text
// (only when present), "tool_calls": [...] (only when there are calls)}.
nlohmann::json chatOutputMessageJson(const ChatOutput& output);
// [{"id", "type": "function", "function": {"name", "arguments"}}, ...]
nlohmann::json toolCallsJson(const std::vector<ToolCall>& calls);

struct ToolCallDelta {
  size_t index = 0;                 // position of the call in the message
  std::optional<std::string> id;    // first delta of a call only
  std::optional<std::string> name;  // first delta of a call only
  std::string arguments;            // a fragment of the arguments JSON text
};

struct ChatStreamDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

// The "delta" object of a chat.completion.chunk: "reasoning_content",
// "content" and "tool_calls" (each only when non-empty; a first tool call
// delta has "id", "type": "function" and "function": {"name", "arguments"}).
nlohmann::json chatStreamDeltaJson(const ChatStreamDelta& delta);

class ChatOutputStream {
 public:
  explicit ChatOutputStream(ChatOutputOptions options);

  ChatStreamDelta feed(std::string_view text);
  // The output has ended: hands back everything held. Call once, last.
  ChatStreamDelta finish();
  // Whether any tool call has been handed back (for finish_reason).
  bool toolsCalled() const { return tool_calls_sent_ > 0; }

 private:
  // Passes reasoning and content pieces on through the tool parser and the
  // UTF-8 carries into `out`.
  void route(std::string_view reasoning, std::string_view content, bool at_end,
             ChatStreamDelta& out);
  // What the harmony parser decided, into `out`.
  void routeHarmony(HarmonyPieces pieces, bool at_end, ChatStreamDelta& out);
  // Reasoning and content through the UTF-8 carries, and whole calls, into
  // `out`.
  void deliver(std::string_view reasoning, std::string_view content, std::vector<ToolCall> calls,
               bool at_end, ChatStreamDelta& out);

  ChatOutputOptions options_;
  std::optional<HarmonyStream> harmony_;
  std::optional<ReasoningStream> reasoning_;
  std::optional<ToolCallStream> tools_;
  Utf8Carry reasoning_carry_;
  Utf8Carry content_carry_;
  size_t tool_calls_sent_ = 0;
};

}  // namespace tandem::protocol
