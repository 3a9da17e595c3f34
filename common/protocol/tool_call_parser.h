// Tool-call parsers: turn a model's output text into OpenAI `tool_calls`
// (and the content text around them), as vLLM's `--tool-call-parser` does.
// Chosen per server by name.
//
//   hermes       Hermes 2 Pro, Qwen 2.5 / Qwen3: one or more blocks
//                `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//                (white space around the JSON is ignored). The text before the
//                first block is content; text between and after blocks is
//                dropped. A last block the output ends inside (no
//                `</tool_call>`) still counts.
//   llama3_json  Llama 3.1 / 3.2 JSON tool calls: output that, after white
//                space and an optional `<|python_tag|>` and white space,
//                starts with `{` and is one or more objects
//                `{"name": ..., "parameters": {...}}` ("arguments" is accepted
//                for "parameters") separated by `;` (a trailing `;` and white
//                space are allowed). Such output has no content. Any other
//                output is all content.
//
//   openai       gpt-oss: calls are harmony messages to `functions.NAME`,
//                read with the reasoning by the harmony parser (harmony.h;
//                chat_output.h runs it). The functions here see no calls in
//                any text for it: all of it is content.
//
// Every call must have a string "name"; its arguments (any JSON value) are
// re-serialised as compact JSON keeping the model's key order; a call without
// arguments gets "{}" (vLLM would refuse it; an argument-less function is
// common enough to accept). If any block or object is not valid JSON or not
// a call, the output has no tool calls and all of it is content, as in vLLM.
// Empty content is absent (nullopt). When there are tool calls the chat
// completion's finish_reason is "tool_calls" (see chat_output.h).
//
// Each call gets the id "chatcmpl-tool-" + 32 lowercase hex digits from the
// id generator (random by default; tests inject their own).
//
// Streaming: ToolCallStream is fed the (content) text in arbitrary byte
// pieces. Content streams as it arrives, less a possibly partial
// `<tool_call>` tag (hermes) or the undecided start of the output
// (llama3_json). Once the output has turned out to hold tool calls, the rest
// is held until finish(), because a malformed call anywhere makes the whole
// output content; finish() then hands back either the calls or the held text
// as content. The concatenation of everything handed back equals
// parseToolCalls() on the whole text.
//
// Thread-safety: the free functions are pure (the default id generator uses
// a per-thread random engine); a ToolCallStream belongs to one request.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::protocol {

enum class ToolCallParserKind { kHermes, kLlama3Json, kOpenAi };

// Accepted names, in the order error messages list them.
const std::vector<std::string>& toolCallParserNames();
// "hermes" / "llama3_json" / "openai".
const char* toolCallParserName(ToolCallParserKind kind);
// The parser of that name, or InvalidArgument naming the accepted names:
// `unknown tool call parser "x" (--tool-call-parser); accepted: hermes, llama3_json, openai`.
StatusOr<ToolCallParserKind> toolCallParserFromName(std::string_view name);

// `text` re-serialised as the parsers write arguments (compact JSON, key
// order kept); nullopt when it is not valid JSON or nests past the bound.
std::optional<std::string> compactArguments(std::string_view text);

// Returns a fresh tool call id each call.
using ToolCallIdGenerator = std::function<std::string()>;
// "chatcmpl-tool-" + 32 random lowercase hex digits.
std::string randomToolCallId();

// One OpenAI tool call; its type is always "function".
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ToolCallSplit {
  std::optional<std::string> content;  // nullopt when empty
  std::vector<ToolCall> tool_calls;
};

// `next_id` empty: randomToolCallId.
ToolCallSplit parseToolCalls(ToolCallParserKind kind, std::string_view text,
                             const ToolCallIdGenerator& next_id = {});

// Text and calls decided by one feed() or finish() call.
struct ToolCallPieces {
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls, in order
};

class ToolCallStream {
 public:
  // `next_id` empty: randomToolCallId.
  explicit ToolCallStream(ToolCallParserKind kind, ToolCallIdGenerator next_id = {});

  ToolCallPieces feed(std::string_view text);
  // The output has ended. Feeding after finish() is a caller bug.
  ToolCallPieces finish();

 private:
  enum class State { kStart, kContent, kHolding };

  void drain(ToolCallPieces& out, bool at_end);

  ToolCallParserKind kind_;
  ToolCallIdGenerator next_id_;
  State state_;
  std::string held_;
};

}  // namespace tandem::protocol
