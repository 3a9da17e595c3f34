#include "common/structured/tool_calls.h"

#include "common/structured/json_schema.h"

namespace tandem::structured {

std::string toolCallsSpec(ToolCallFormat format, bool parallel,
                          const nlohmann::ordered_json& tools) {
  nlohmann::ordered_json spec = {
      {"format", format == ToolCallFormat::kHermes ? "hermes" : "llama3_json"},
      {"parallel", parallel},
      {"tools", tools}};
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
      // Checked on its own first: a refused schema may leave rules it
      // declared undefined in a shared builder.
      StatusOr<Grammar> alone = compileJsonSchema(*parameters);
      if (alone.isOk()) {
        StatusOr<int32_t> rule = addJsonSchemaRule(builder, *parameters, rule_name + "_args");
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
    if (hermes) call = seq({literal("<tool_call>\n"), std::move(call), literal("\n</tool_call>")});
    calls.push_back(std::move(call));
  }
  const int32_t call = builder.add("tool_call", alt(std::move(calls)));
  Expr root = ref(call);
  if (spec.value("parallel", false)) {
    root = seq({ref(call), star(seq({literal(hermes ? "\n" : "; "), ref(call)}))});
  }
  return builder.build(builder.add("tool_calls", std::move(root)));
}

}  // namespace tandem::structured
