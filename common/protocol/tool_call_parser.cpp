#include "common/protocol/tool_call_parser.h"

#include <nlohmann/json.hpp>
#include <random>

#include "common/json_parse.h"
#include "common/protocol/parser_registry.h"
#include "common/protocol/stream_text.h"

namespace tandem::protocol {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kToolCallStart = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::optional<std::string> nonEmpty(std::string_view text) {
  if (text.empty()) return std::nullopt;
  return std::string(text);
}

// The JSON value in `text`, keeping key order; nullopt when it is not valid
// JSON or nests past the bound (nothing thrown).
std::optional<ordered_json> parseOrderedJson(std::string_view text) {
  JsonParseError error;
  return tandem::parseOrderedJson(text, error);
}

// Arguments as every parser writes them: compact JSON, the model's key
// order kept, invalid UTF-8 replaced.
std::string argumentsText(const ordered_json& arguments) {
  return arguments.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
}

// The call an object describes, or nullopt when it is not one: an object
// with a string "name" and arguments under one of `argument_keys`; without
// them, a call with {} when `arguments_optional` (hermes: the <tool_call> tag
// says it is a call), else none (llama3_json, as vLLM's: any answer that is
// a JSON object with a "name", {"name": "Bob", "age": 3}, would otherwise
// become a call with its other fields dropped).
std::optional<ToolCall> toolCallFromJson(const ordered_json& call,
                                         std::initializer_list<const char*> argument_keys,
                                         bool arguments_optional) {
  if (!call.is_object()) return std::nullopt;
  const auto name = call.find("name");
  if (name == call.end() || !name->is_string()) return std::nullopt;
  ToolCall tool_call;
  tool_call.name = name->get<std::string>();
  for (const char* key : argument_keys) {
    const auto arguments = call.find(key);
    if (arguments != call.end()) {
      tool_call.arguments = argumentsText(*arguments);
      return tool_call;
    }
  }
  if (!arguments_optional) return std::nullopt;
  tool_call.arguments = "{}";
  return tool_call;
}

std::string_view trimWhitespace(std::string_view text) {
  const size_t begin = skipWhitespace(text, 0);
  size_t end = text.size();
  while (end > begin && (text[end - 1] == ' ' || text[end - 1] == '\t' || text[end - 1] == '\n' ||
                         text[end - 1] == '\r')) {
    --end;
  }
  return text.substr(begin, end - begin);
}

// Calls in hermes blocks; nullopt when a block is malformed.
std::optional<std::vector<ToolCall>> hermesCalls(std::string_view text) {
  std::vector<ToolCall> calls;
  size_t start = text.find(kToolCallStart);
  while (start != std::string_view::npos) {
    const size_t body = start + kToolCallStart.size();
    const size_t end = text.find(kToolCallEnd, body);
    const std::string_view block =
        text.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
    const std::optional<ordered_json> json = parseOrderedJson(trimWhitespace(block));
    if (!json) return std::nullopt;
    std::optional<ToolCall> call =
        toolCallFromJson(*json, {"arguments"}, /*arguments_optional=*/true);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    if (end == std::string_view::npos) break;
    start = text.find(kToolCallStart, end + kToolCallEnd.size());
  }
  return calls;
}

// Index just past the `}` that closes the object opening at text[open], or
// npos when the text ends first. Strings (with escapes) are skipped, so
// braces inside them do not count.
size_t jsonObjectEnd(std::string_view text, size_t open) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// Where the first JSON object of llama3_json output begins, or npos when the
// output is content. `complete` false: the text so far may still become
// either; then npos with *undecided set.
size_t llamaCallsStart(std::string_view text, bool complete, bool* undecided) {
  *undecided = false;
  size_t at = skipWhitespace(text, 0);
  if (startsWith(text.substr(at), kPythonTag)) {
    at = skipWhitespace(text, at + kPythonTag.size());
  } else if (at < text.size() && startsWith(kPythonTag, text.substr(at))) {
    *undecided = !complete;
    return std::string_view::npos;
  }
  if (at == text.size()) {
    *undecided = !complete;
    return std::string_view::npos;
  }
  return text[at] == '{' ? at : std::string_view::npos;
}

// Calls in llama3_json output from `at` on; nullopt when malformed.
std::optional<std::vector<ToolCall>> llamaCalls(std::string_view text, size_t at) {
  std::vector<ToolCall> calls;
  while (at < text.size()) {
    if (text[at] != '{') return std::nullopt;
    const size_t end = jsonObjectEnd(text, at);
    if (end == std::string_view::npos) return std::nullopt;
    const std::optional<ordered_json> json = parseOrderedJson(text.substr(at, end - at));
    if (!json) return std::nullopt;
    std::optional<ToolCall> call =
        toolCallFromJson(*json, {"parameters", "arguments"}, /*arguments_optional=*/false);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    at = skipWhitespace(text, end);
    if (at < text.size()) {
      if (text[at] != ';') return std::nullopt;
      at = skipWhitespace(text, at + 1);
    }
  }
  return calls;
}

// Every parser and its name, in the order error messages list them.
constexpr ParserTable<ToolCallParserKind, 3> kParsers = {
    {ToolCallParserKind::kHermes, "hermes"},
    {ToolCallParserKind::kLlama3Json, "llama3_json"},
    {ToolCallParserKind::kOpenAi, "openai"},
};

}  // namespace

const std::vector<std::string>& toolCallParserNames() {
  static const std::vector<std::string> kNames = parserNames(kParsers);
  return kNames;
}

const char* toolCallParserName(ToolCallParserKind kind) { return parserName(kParsers, kind); }

StatusOr<ToolCallParserKind> toolCallParserFromName(std::string_view name) {
  return parserFromName(kParsers, name, "tool call parser", "--tool-call-parser");
}

std::optional<std::string> compactArguments(std::string_view text) {
  std::optional<ordered_json> json = parseOrderedJson(text);
  if (!json) return std::nullopt;
  return argumentsText(*json);
}

std::string randomToolCallId() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int word = 0; word < 2; ++word) {
    uint64_t bits = engine();
    for (int digit = 0; digit < 16; ++digit, bits >>= 4) id.push_back(kHex[bits & 0xF]);
  }
  return id;
}

ToolCallSplit parseToolCalls(ToolCallParserKind kind, std::string_view text,
                             const ToolCallIdGenerator& next_id) {
  ToolCallSplit split;
  std::optional<std::vector<ToolCall>> calls;
  std::string_view content = text;
  if (kind == ToolCallParserKind::kHermes) {
    const size_t start = text.find(kToolCallStart);
    if (start != std::string_view::npos) {
      calls = hermesCalls(text);
      content = text.substr(0, start);
    }
  } else if (kind == ToolCallParserKind::kLlama3Json) {
    bool undecided = false;
    const size_t start = llamaCallsStart(text, /*complete=*/true, &undecided);
    if (start != std::string_view::npos) {
      calls = llamaCalls(text, start);
      content = {};
    }
  }
  if (!calls) {
    split.content = nonEmpty(text);
    return split;
  }
  split.content = nonEmpty(content);
  split.tool_calls = std::move(*calls);
  for (ToolCall& call : split.tool_calls) call.id = next_id ? next_id() : randomToolCallId();
  return split;
}

ToolCallStream::ToolCallStream(ToolCallParserKind kind, ToolCallIdGenerator next_id)
    : kind_(kind),
      next_id_(std::move(next_id)),
      state_(kind == ToolCallParserKind::kLlama3Json ? State::kStart : State::kContent) {}

ToolCallPieces ToolCallStream::feed(std::string_view text) {
  ToolCallPieces out;
  held_.append(text);
  drain(out, /*at_end=*/false);
  return out;
}

ToolCallPieces ToolCallStream::finish() {
  ToolCallPieces out;
  drain(out, /*at_end=*/true);
  if (state_ == State::kHolding) {
    // held_ is the whole output from the first call on; whatever came before
    // was content and has been handed back already.
    ToolCallSplit split = parseToolCalls(kind_, held_, next_id_);
    if (split.tool_calls.empty()) {
      out.content.append(held_);
    } else {
      out.content.append(split.content.value_or(""));
      out.tool_calls = std::move(split.tool_calls);
    }
    held_.clear();
  }
  return out;
}

void ToolCallStream::drain(ToolCallPieces& out, bool at_end) {
  if (state_ == State::kStart) {
    bool undecided = false;
    const size_t start = llamaCallsStart(held_, at_end, &undecided);
    if (undecided) return;
    state_ = start == std::string::npos ? State::kContent : State::kHolding;
  }
  if (state_ == State::kHolding) return;
  if (kind_ == ToolCallParserKind::kHermes) {
    const size_t start = held_.find(kToolCallStart);
    if (start != std::string::npos) {
      out.content.append(held_, 0, start);
      held_.erase(0, start);
      state_ = State::kHolding;
      return;
    }
    const size_t keep = at_end ? 0 : partialTagSuffix(held_, kToolCallStart);
    out.content.append(held_, 0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return;
  }
  out.content.append(held_);  // llama3_json past its start; openai: no calls here
  held_.clear();
}

}  // namespace tandem::protocol
