// The grammar of a forced tool call (tool_choice "required" or naming a
// function) written in the model's own tool-call format, so the server's
// tool-call parser (common/protocol/tool_call_parser.h) reads the output
// back as tool_calls, whole or streamed:
//
//   hermes       <tool_call>\n{"name":"NAME","arguments":ARGS}\n</tool_call>
//                (several calls separated by "\n")
//   llama3_json  {"name":"NAME","parameters":ARGS}  (several separated by "; ")
//
// ARGS follows the function's `parameters` schema (json_schema.h). A
// non-strict function whose schema uses what the schema compiler refuses
// gets any JSON object instead; a strict one is refused, naming the
// function. A function without parameters takes {}; a parameters schema
// that says nothing of its type ({}, properties alone) is an object's.
//
// Optional calls (tool_choice "auto" with strict functions): the output may
// also be text, and calls are constrained where the parser would find them:
// hermes, free text up to the first "<tool_call>", after which the calls
// follow; llama3_json, output whose first byte after white space (and an
// optional <|python_tag|> and white space) is "{" is calls, any other
// output is free text.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

enum class ToolCallFormat { kHermes, kLlama3Json };

// The constraint's spec text (Constraint::spec of kind kToolCalls):
//   {"format": "hermes" | "llama3_json", "parallel": bool, "optional": bool,
//    "tools": [{"name": ..., "parameters": schema or null, "strict": bool}, ...]}
std::string toolCallsSpec(ToolCallFormat format, bool parallel, const nlohmann::ordered_json& tools,
                          bool optional = false);

StatusOr<Grammar> compileToolCalls(const nlohmann::ordered_json& spec);

}  // namespace tandem::structured
