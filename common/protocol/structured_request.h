// The structured-output fields of a completion or chat request, as OpenAI
// and vLLM name them:
//   response_format: {"type": "text" | "json_object" | "json_schema",
//                     "json_schema": {"name", "schema", "strict", ...}}
//   structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
//   guided_json, guided_regex, guided_choice, guided_grammar (vLLM's older names)
// At most one constraint per request. The constraint is compiled here once
// (without a vocabulary) so a request the engine could not run is a 400
// naming the field and what in it is refused, in the agent and the router
// alike.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "common/protocol/openai_protocol.h"
#include "common/protocol/tool_call_parser.h"
#include "common/structured/constraint.h"

namespace tandem::server {

//
// Chat requests (`tool_call_parser` given: the server's, or nullopt when it
// has none) may also force a tool call: tool_choice "required" or
// {"type": "function", "function": {"name"}} constrains the output to calls
// of the request's tools (all of them, or the named one) in the parser's
// format, one or several as parallel_tool_calls (default true) allows
// (structured/tool_calls.h); the parser then reads the calls back. Without
// a parser the server cannot know the model's format: a 400 saying so.
//
// `root` is the request body with its keys in the client's order (a JSON
// schema's properties are generated in that order); sets *out, and *field
// to the field it came from, when the request has a constraint.
std::optional<ApiError> readStructuredOutput(
    const nlohmann::ordered_json& root, bool chat,
    std::optional<protocol::ToolCallParserKind> tool_call_parser,
    std::optional<structured::Constraint>* out, std::string* field);

}  // namespace tandem::server
