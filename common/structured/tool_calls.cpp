#include "common/structured/tool_calls.h"

#include <algorithm>

#include "common/structured/json_schema.h"

namespace tandem::structured {
namespace {

// Keywords that say what a schema's values are; a parameters schema without
// any of them is taken as an object schema.
constexpr const char* kTypingKeywords[] = {"type", "anyOf", "oneOf", "allOf",
                                           "$ref", "enum",  "const", "not"};

ByteSet whiteSpace() {
  ByteSet set;
  for (uint8_t c : {' ', '\t', '\n', '\r'}) set.add(c, c);
  return set;
}

// Any bytes at all.
Expr anyText() { return star(bytes(ByteSet::range(0, 255))); }

// llama3_json with tool_choice "auto": output that, after white space and an
// optional <|python_tag|> and white space, starts with "{" is tool calls (the
// parser's rule, tool_call_parser.h); any other output is free text.
Expr llama3Optional(GrammarBuilder& builder, Expr calls) {
  const std::string tag = "<|python_tag|>";
  const ByteSet space = whiteSpace();
  // After the tag and white space: calls, white space, or text that starts
  // with another byte. Before it, '<' may begin the tag.
  ByteSet not_other = space;
  not_other.add('{', '{');
  const ByteSet other_after_tag = not_other.complement();
  not_other.add('<', '<');
  const ByteSet other_first = not_other.complement();
  const int32_t after_tag = builder.declare("after_python_tag");
  builder.define(after_tag, alt({literal(""), seq({bytes(space), ref(after_tag)}), calls,
                                 seq({bytes(other_after_tag), anyText()})}));
  // "<" then the tag's next bytes, or text that leaves it.
  Expr in_tag = ref(after_tag);
  for (size_t i = tag.size(); i-- > 1;) {
    const ByteSet leave = ByteSet::of(static_cast<uint8_t>(tag[i])).complement();
    in_tag = alt({literal(""), seq({bytes(leave), anyText()}),
                  seq({literal(tag.substr(i, 1)), std::move(in_tag)})});
  }
  const int32_t lead = builder.declare("llama3_lead");
  builder.define(
      lead, alt({literal(""), seq({bytes(space), ref(lead)}), std::move(calls),
                 seq({literal("<"), std::move(in_tag)}), seq({bytes(other_first), anyText()})}));
  return ref(lead);
}

}  // namespace

std::string toolCallsSpec(ToolCallFormat format, bool parallel, const nlohmann::ordered_json& tools,
                          bool optional) {
  nlohmann::ordered_json spec = {
      {"format", format == ToolCallFormat::kHermes ? "hermes" : "llama3_json"},
      {"parallel", parallel},
      {"tools", tools}};
  if (optional) spec["optional"] = true;
  return spec.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

StatusOr<Grammar> compileToolCalls(const nlohmann::ordered_json& spec) {
  const auto format = spec.find("format");
  const auto tools = spec.find("tools");
  if (format == spec.end() || !format->is_string() || tools == spec.end() || !tools->is_array() ||
      tools->empty()) {
    return invalidArgument("tool calls: a format and at least one tool are needed");
  }
  const bool hermes = *format == "hermes";
  if (!hermes && *format != "llama3_json") {
    return invalidArgument("tool calls: unknown format " + format->dump());
  }
  GrammarBuilder builder;
  std::vector<Expr> calls;
  for (size_t i = 0; i < tools->size(); ++i) {
    const auto& tool = (*tools)[i];
    const std::string name = tool.value("name", "");
    const auto parameters = tool.find("parameters");
    const std::string rule_name = "tool_" + std::to_string(i);
    Expr arguments = literal("{}");
    if (parameters != tool.end() && !parameters->is_null()) {
      // Arguments are an object: a schema that says nothing of its type
      // ({} or bare properties) would otherwise allow any JSON value.
      nlohmann::ordered_json schema = *parameters;
      const bool typed = std::any_of(
          std::begin(kTypingKeywords), std::end(kTypingKeywords),
          [&](const char* keyword) { return schema.is_object() && schema.contains(keyword); });
      if (schema.is_object() && !typed) schema["type"] = "object";
      // Checked on its own first: a refused schema may leave rules it
      // declared undefined in a shared builder.
      StatusOr<Grammar> alone = compileJsonSchema(schema);
      if (alone.isOk()) {
        StatusOr<int32_t> rule = addJsonSchemaRule(builder, schema, rule_name + "_args");
        if (!rule.isOk()) return rule.status();
        arguments = ref(*rule);
      } else if (tool.value("strict", false)) {
        return Status(alone.status().code(), "function " + nlohmann::json(name).dump() +
                                                 " (strict): " + alone.status().message());
      } else {
        arguments = ref(addAnyJsonObjectRule(builder));
      }
    }
    const std::string quoted = nlohmann::json(name).dump();
    const std::string head =
        "{\"name\":" + quoted + (hermes ? ",\"arguments\":" : ",\"parameters\":");
    Expr call = seq({literal(head), std::move(arguments), literal("}")});
    // hermes: what follows the <tool_call> tag (added below).
    if (hermes) call = seq({literal("\n"), std::move(call), literal("\n</tool_call>")});
    calls.push_back(std::move(call));
  }
  const std::string tag = "<tool_call>";
  const int32_t after_tag = hermes ? builder.add("tool_call_rest", alt(std::move(calls))) : -1;
  const int32_t call = builder.add(
      "tool_call", hermes ? seq({literal(tag), ref(after_tag)}) : alt(std::move(calls)));
  const bool parallel = spec.value("parallel", false);
  Expr more = parallel ? star(seq({literal(hermes ? "\n" : "; "), ref(call)})) : literal("");
  Expr root;
  if (!spec.value("optional", false)) {
    root = seq({ref(call), std::move(more)});
  } else if (hermes) {
    // tool_choice "auto": text up to the first tag, which the calls follow.
    root = textUntil(builder, "text", tag, seq({ref(after_tag), std::move(more)}));
  } else {
    root = llama3Optional(builder, seq({ref(call), std::move(more)}));
  }
  return builder.build(builder.add("tool_calls", std::move(root)));
}

}  // namespace tandem::structured
