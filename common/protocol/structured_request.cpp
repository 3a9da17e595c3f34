#include "common/protocol/structured_request.h"

#include <vector>

#include "common/json_parse.h"
#include "common/structured/tool_calls.h"

namespace tandem::server {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using structured::Constraint;
using structured::ConstraintKind;

struct Found {
  std::string field;  // as the client wrote it, e.g. "response_format.json_schema.schema"
  Constraint constraint;
};

// A schema given as an object or as JSON text (vLLM accepts both).
std::optional<ApiError> readSchema(const ordered_json& value, const std::string& field,
                                   std::string* spec) {
  if (value.is_object() || value.is_boolean()) {
    *spec = value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return std::nullopt;
  }
  if (value.is_string()) {
    JsonParseError error;
    const auto parsed = parseOrderedJson(value.get<std::string>(), error,
                                         JsonBounds{kMaxJsonDepth, kMaxRequestJsonValues});
    if (!parsed) {
      return invalidRequest(field +
                                " must be a JSON schema (an object, or a string holding one); "
                                "its text is not JSON that can be read: " +
                                error.detail,
                            field);
    }
    if (!(parsed->is_object() || parsed->is_boolean())) {
      return invalidRequest(field +
                                " must be a JSON schema (an object, or a string holding one), "
                                "got a string holding " +
                                parsed->type_name(),
                            field);
    }
    *spec = parsed->dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return std::nullopt;
  }
  return invalidRequest(field + " must be a JSON schema object, got " + value.type_name(), field);
}

std::optional<ApiError> readString(const ordered_json& value, const std::string& field,
                                   std::string* out) {
  if (!value.is_string() || value.get<std::string>().empty()) {
    return invalidRequest(field + " must be a non-empty string", field);
  }
  *out = value.get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> readChoice(const ordered_json& value, const std::string& field,
                                   std::string* out) {
  bool valid = value.is_array() && !value.empty();
  for (size_t i = 0; valid && i < value.size(); ++i) {
    valid = value[i].is_string() && !value[i].get<std::string>().empty();
  }
  if (!valid)
    return invalidRequest(field + " must be a non-empty array of non-empty strings", field);
  *out = value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return std::nullopt;
}

// One of structured_outputs' or the guided_* constraint fields.
std::optional<ApiError> readOne(std::string_view kind, const ordered_json& value,
                                const std::string& field, std::vector<Found>& found) {
  Found f{field, {}};
  std::optional<ApiError> error;
  if (kind == "json") {
    f.constraint.kind = ConstraintKind::kJsonSchema;
    error = readSchema(value, field, &f.constraint.spec);
  } else if (kind == "regex") {
    f.constraint.kind = ConstraintKind::kRegex;
    error = readString(value, field, &f.constraint.spec);
  } else if (kind == "choice") {
    f.constraint.kind = ConstraintKind::kChoice;
    error = readChoice(value, field, &f.constraint.spec);
  } else if (kind == "grammar") {
    f.constraint.kind = ConstraintKind::kGrammar;
    error = readString(value, field, &f.constraint.spec);
  } else if (kind == "json_object") {
    if (!value.is_boolean()) return invalidRequest(field + " must be a boolean", field);
    if (!value.get<bool>()) return std::nullopt;
    f.constraint.kind = ConstraintKind::kJsonObject;
  }
  if (error) return error;
  found.push_back(std::move(f));
  return std::nullopt;
}

std::optional<ApiError> readResponseFormat(const ordered_json& format, std::vector<Found>& found) {
  const std::string field = "response_format";
  if (!format.is_object()) {
    return invalidRequest(field + " must be an object, got " + std::string(format.type_name()),
                          field);
  }
  const auto type = format.find("type");
  if (type == format.end() || !type->is_string()) {
    return invalidRequest(
        "response_format.type must be \"text\", \"json_object\" or \"json_schema\"", field);
  }
  const std::string name = type->get<std::string>();
  if (name == "text") return std::nullopt;
  if (name == "json_object") {
    found.push_back(Found{field, Constraint{ConstraintKind::kJsonObject, ""}});
    return std::nullopt;
  }
  if (name != "json_schema") {
    return invalidRequest("response_format.type " + compactDump(json(name)) +
                              " is not supported; use \"text\", \"json_object\" or "
                              "\"json_schema\"",
                          field);
  }
  const auto wrapper = format.find("json_schema");
  if (wrapper == format.end() || !wrapper->is_object()) {
    return invalidRequest("response_format.json_schema must be an object with a \"schema\"",
                          "response_format.json_schema");
  }
  const auto schema = wrapper->find("schema");
  if (schema == wrapper->end() || schema->is_null()) {
    return invalidRequest("response_format.json_schema.schema is required",
                          "response_format.json_schema.schema");
  }
  Found f{"response_format.json_schema.schema", {ConstraintKind::kJsonSchema, ""}};
  if (auto error = readSchema(*schema, f.field, &f.constraint.spec)) return error;
  found.push_back(std::move(f));
  return std::nullopt;
}

std::optional<ApiError> readStructuredOutputs(const ordered_json& options,
                                              std::vector<Found>& found) {
  const std::string field = "structured_outputs";
  if (!options.is_object()) {
    return invalidRequest(field + " must be an object, got " + std::string(options.type_name()),
                          field);
  }
  for (const auto& [key, value] : options.items()) {
    if (value.is_null()) continue;
    const std::string name = field + "." + key;
    if (key == "json" || key == "regex" || key == "choice" || key == "grammar" ||
        key == "json_object") {
      if (auto error = readOne(key, value, name, found)) return error;
    } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties") {
      // Options of other engines' backends: the output here never falls
      // back, has no whitespace and no unlisted properties anyway.
      if (!value.is_boolean()) return invalidRequest(name + " must be a boolean", name);
    } else {
      return invalidRequest(name +
                                " is not supported; structured_outputs takes one of json, "
                                "regex, choice, grammar, json_object",
                            name);
    }
  }
  return std::nullopt;
}

// Whether `tool_choice` is "auto" (or absent) and a tool is a function
// with "strict": true: its calls' arguments are then enforced, the output
// free to be text instead.
bool autoStrictTools(const ordered_json& root) {
  const auto choice = root.find("tool_choice");
  if (choice != root.end() && !choice->is_null() && *choice != "auto") return false;
  const auto tools = root.find("tools");
  if (tools == root.end() || !tools->is_array()) return false;
  for (const auto& tool : *tools) {
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) continue;
    const auto strict = function->find("strict");
    if (strict != function->end() && *strict == true) return true;
  }
  return false;
}

// tool_choice "required" or naming a function (readChatInput checked its
// shape and that the function exists), or "auto" with strict functions
// when the server has a tool-call parser and no other constraint is given
// (optional calls: the output may be text).
std::optional<ApiError> readForcedToolCall(const ordered_json& root,
                                           std::optional<protocol::ToolCallParserKind> parser,
                                           std::vector<Found>& found) {
  const auto choice = root.find("tool_choice");
  const bool optional = autoStrictTools(root);
  // Harmony's calls are written with special tokens, which no grammar
  // writes: a strict function under "auto" is not enforced (as vLLM's openai
  // parser), a forced call is refused below.
  const bool harmony = parser == protocol::ToolCallParserKind::kOpenAi;
  if (optional && (!parser || harmony || !found.empty())) return std::nullopt;
  if (!optional &&
      (choice == root.end() || choice->is_null() || *choice == "auto" || *choice == "none")) {
    return std::nullopt;
  }
  const auto tools = root.find("tools");
  if (tools == root.end() || !tools->is_array()) return std::nullopt;  // refused by readChatInput
  if (tools->empty()) return std::nullopt;  // "required" of no tools: none to force
  const std::string forced = optional              ? ""
                             : choice->is_string() ? "tool_choice \"required\""
                                                   : "tool_choice naming a function";
  if (!parser) {
    return invalidRequest(forced +
                              " needs the server's tool-call parser (--tool-call-parser "
                              "hermes|llama3_json): it gives the model's tool-call format",
                          "tool_choice");
  }
  if (harmony) {
    return invalidRequest(forced +
                              " is not supported with the openai tool-call parser (gpt-oss): "
                              "its calls are harmony messages written with special tokens, "
                              "which a constraint cannot force; accepted: tool_choice \"auto\" "
                              "or \"none\"",
                          "tool_choice");
  }
  const std::string named =
      !optional && choice->is_object() ? choice->at("function").at("name").get<std::string>() : "";
  const auto format = *parser == protocol::ToolCallParserKind::kHermes
                          ? structured::ToolCallFormat::kHermes
                          : structured::ToolCallFormat::kLlama3Json;
  ordered_json specs = ordered_json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const auto& function = (*tools)[i].at("function");
    const std::string name = function.at("name").get<std::string>();
    if (!named.empty() && name != named) continue;
    // readChatInput checked name and parameters; strict is OpenAI's flag.
    const auto strict = function.find("strict");
    const auto parameters = function.find("parameters");
    ordered_json spec = {
        {"name", name},
        {"parameters", parameters == function.end() ? ordered_json() : *parameters},
        {"strict", strict != function.end() && strict->is_boolean() && strict->get<bool>()}};
    // A strict function whose schema cannot be enforced is refused naming
    // its parameters, not the tool_choice the client may never have set.
    if (spec["strict"] == true) {
      const StatusOr<structured::Grammar> alone = structured::compileToolCalls(ordered_json::parse(
          structured::toolCallsSpec(format, false, ordered_json::array({spec}), optional)));
      if (!alone.isOk()) {
        const std::string field = "tools[" + std::to_string(i) + "].function.parameters";
        return invalidRequest(field + ": " + alone.status().message(), field);
      }
    }
    specs.push_back(std::move(spec));
  }
  bool parallel = true;
  if (const auto p = root.find("parallel_tool_calls"); p != root.end() && !p->is_null()) {
    if (!p->is_boolean()) {
      return invalidRequest(
          "parallel_tool_calls must be a boolean, got " + std::string(p->type_name()),
          "parallel_tool_calls");
    }
    parallel = p->get<bool>();
  }
  found.push_back(
      Found{"tool_choice",
            {ConstraintKind::kToolCalls,
             structured::toolCallsSpec(format, parallel && named.empty(), specs, optional)}});
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> readStructuredOutput(const ordered_json& root, bool chat,
                                             std::optional<protocol::ToolCallParserKind> parser,
                                             std::optional<Constraint>* out, std::string* field) {
  static constexpr const char* kGuided[] = {"guided_json", "guided_regex", "guided_choice",
                                            "guided_grammar"};
  std::vector<Found> found;
  // vLLM's older spelling of structured_outputs.whitespace_pattern, which
  // changes the output: refused as that is, never ignored.
  if (const auto it = root.find("guided_whitespace_pattern"); it != root.end() && !it->is_null()) {
    return invalidRequest(
        "guided_whitespace_pattern is not supported; JSON outputs are written without white "
        "space between tokens",
        "guided_whitespace_pattern");
  }
  if (const auto it = root.find("response_format"); it != root.end() && !it->is_null()) {
    if (auto error = readResponseFormat(*it, found)) return error;
  }
  if (const auto it = root.find("structured_outputs"); it != root.end() && !it->is_null()) {
    if (auto error = readStructuredOutputs(*it, found)) return error;
  }
  for (const char* name : kGuided) {
    if (const auto it = root.find(name); it != root.end() && !it->is_null()) {
      if (auto error = readOne(std::string_view(name).substr(7), *it, name, found)) return error;
    }
  }
  if (chat) {
    if (auto error = readForcedToolCall(root, parser, found)) return error;
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    return invalidRequest("only one structured output constraint per request: both " +
                              found[0].field + " and " + found[1].field + " are given",
                          found[1].field);
  }
  StatusOr<structured::Grammar> grammar = structured::compileConstraint(found[0].constraint);
  if (!grammar.isOk()) {
    // Too large or too deep is the request's fault too: a 400, not a 429.
    return invalidRequest(found[0].field + ": " + grammar.status().message(), found[0].field);
  }
  *out = std::move(found[0].constraint);
  *field = std::move(found[0].field);
  return std::nullopt;
}

}  // namespace tandem::server
