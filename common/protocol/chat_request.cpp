#include "common/protocol/chat_request.h"

#include <optional>
#include <utility>

#include "common/json_parse.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;

std::string quoted(const std::string& text) { return compactDump(nlohmann::json(text)); }

// A field given with a value (absent and null both mean "not given").
const ordered_json* given(const ordered_json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError wrongType(const std::string& name, const char* expected, const ordered_json& value) {
  return invalidRequest(name + " must be " + expected + ", got " + value.type_name(), name);
}

// Content parts: only text. kString joins the texts with "\n" (vLLM's
// "string" format); kOpenAi keeps the list.
Result<ordered_json> readContentParts(const std::string& name, const ordered_json& parts,
                                      ChatContentFormat format) {
  std::string joined;
  for (size_t j = 0; j < parts.size(); ++j) {
    const ordered_json& part = parts[j];
    const std::string part_name = name + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return wrongType(part_name, "an object", part);
    const ordered_json* type = given(part, "type");
    if (type == nullptr || !type->is_string()) {
      return invalidRequest(part_name + ".type must be \"text\"", part_name + ".type");
    }
    if (type->get<std::string>() != "text") {
      return invalidRequest(part_name + " is of type " + quoted(type->get<std::string>()) +
                                "; only text parts ({\"type\": \"text\", \"text\": ...}) are "
                                "accepted",
                            part_name + ".type");
    }
    const ordered_json* text = given(part, "text");
    if (text == nullptr || !text->is_string()) {
      return invalidRequest(part_name + ".text must be a string, got " +
                                (text == nullptr ? "nothing" : text->type_name()),
                            part_name + ".text");
    }
    if (j > 0) joined += '\n';
    joined += text->get<std::string>();
  }
  if (format == ChatContentFormat::kOpenAi) return parts;
  return ordered_json(std::move(joined));
}

// An assistant message's tool_calls, with string arguments decoded as vLLM
// does (arguments that are not valid JSON stay a string; empty or missing
// arguments become {}).
Result<ordered_json> readToolCalls(const std::string& name, ordered_json calls) {
  if (!calls.is_array()) return wrongType(name, "an array", calls);
  for (size_t k = 0; k < calls.size(); ++k) {
    ordered_json& call = calls[k];
    const std::string call_name = name + "[" + std::to_string(k) + "]";
    if (!call.is_object()) return wrongType(call_name, "an object", call);
    const ordered_json* function = given(call, "function");
    if (function == nullptr) {
      return invalidRequest(call_name + ".function is required ({name, arguments})",
                            call_name + ".function");
    }
    if (!function->is_object()) return wrongType(call_name + ".function", "an object", *function);
    ordered_json& fn = call["function"];
    const ordered_json* fn_name = given(fn, "name");
    if (fn_name == nullptr || !fn_name->is_string()) {
      return invalidRequest(call_name + ".function.name must be a string",
                            call_name + ".function.name");
    }
    const ordered_json* arguments = given(fn, "arguments");
    if (arguments == nullptr || (arguments->is_string() && arguments->get<std::string>().empty())) {
      fn["arguments"] = ordered_json::object();
    } else if (arguments->is_string()) {
      // JSON inside a string gets the same nesting bound as the body, so a
      // value handed to the template nests at most twice the bound.
      JsonParseError error;
      const JsonBounds bounds{kMaxJsonDepth, kMaxRequestJsonValues};
      if (auto decoded = parseOrderedJson(arguments->get<std::string>(), error, bounds)) {
        fn["arguments"] = std::move(*decoded);
      } else if (error.tooDeep() || error.tooManyValues()) {
        return boundsError(error, call_name + ".function.arguments");
      }
    }
  }
  return calls;
}

Result<ordered_json> readMessages(const ordered_json& root, ChatContentFormat format,
                                  bool reasoning_as_thinking) {
  const ordered_json* messages = given(root, "messages");
  if (messages == nullptr) {
    return invalidRequest("messages is required (a non-empty array of {role, content} objects)",
                          "messages");
  }
  if (!messages->is_array()) return wrongType("messages", "an array", *messages);
  if (messages->empty()) return invalidRequest("messages must not be empty", "messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    ordered_json message = (*messages)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) return wrongType(name, "an object", message);
    const ordered_json* role = given(message, "role");
    if (role == nullptr) {
      return invalidRequest(name +
                                ".role is required (a string such as system, user, "
                                "assistant or tool)",
                            name + ".role");
    }
    if (!role->is_string()) return wrongType(name + ".role", "a string", *role);
    const bool assistant = role->get<std::string>() == "assistant";
    if (const ordered_json* calls = given(message, "tool_calls"); calls != nullptr && assistant) {
      auto read = readToolCalls(name + ".tool_calls", *calls);
      if (!read.isOk()) return read.error();
      if (read.value().empty()) {
        message.erase("tool_calls");  // as vLLM: an empty list is no calls
      } else {
        message["tool_calls"] = std::move(read).value();
      }
    } else if (calls == nullptr) {
      message.erase("tool_calls");  // null
    }
    if (assistant && reasoning_as_thinking && given(message, "thinking") == nullptr) {
      for (const char* key : {"reasoning_content", "reasoning"}) {
        const ordered_json* reasoning = given(message, key);
        if (reasoning == nullptr) continue;
        if (!reasoning->is_string()) return wrongType(name + "." + key, "a string", *reasoning);
        if (!reasoning->get_ref<const std::string&>().empty()) message["thinking"] = *reasoning;
        break;
      }
    }
    const std::string content_name = name + ".content";
    const ordered_json* content = given(message, "content");
    if (content == nullptr) {
      // An assistant's content is null beside its tool calls (openai-python
      // sends back the message it got, LangChain sends None), and a tool's
      // result may be empty: as vLLM, no content is empty content, which
      // templates can test and iterate (null made 8 of the 21 real
      // templates fail: "argument of type 'NoneType' is not iterable").
      if (!assistant && role->get<std::string>() != "tool") {
        return invalidRequest(content_name +
                                  " is required (a string or an array of text parts; null only "
                                  "in an assistant or tool message)",
                              content_name);
      }
      // "" in either content format: a string reaches templates as given
      // (an empty list would fail those that read content[0]).
      message["content"] = "";
    } else if (content->is_array()) {
      // A tool's result is text for every template (as vLLM joins it):
      // parts would print as dicts in templates that write it out whole.
      auto parts = readContentParts(
          content_name, *content,
          role->get<std::string>() == "tool" ? ChatContentFormat::kString : format);
      if (!parts.isOk()) return parts.error();
      message["content"] = std::move(parts).value();
    } else if (!content->is_string()) {
      return wrongType(content_name, "a string or an array of text parts", *content);
    }
    out.push_back(std::move(message));
  }
  return out;
}

// The tools' shape: function tools with a name (and a description string
// and a parameters object when given); the error naming the first wrong one.
std::optional<ApiError> checkTools(const ordered_json& tools) {
  if (!tools.is_array()) return wrongType("tools", "an array of function tools", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& tool = tools[i];
    const std::string name = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) return wrongType(name, "an object", tool);
    const ordered_json* type = given(tool, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "function") {
      return invalidRequest(name + ".type must be \"function\"", name + ".type");
    }
    const ordered_json* function = given(tool, "function");
    if (function == nullptr) {
      return invalidRequest(name + ".function is required ({name, description?, parameters?})",
                            name + ".function");
    }
    if (!function->is_object()) return wrongType(name + ".function", "an object", *function);
    const ordered_json* fn_name = given(*function, "name");
    if (fn_name == nullptr || !fn_name->is_string() || fn_name->get<std::string>().empty()) {
      return invalidRequest(name + ".function.name must be a non-empty string",
                            name + ".function.name");
    }
    if (const ordered_json* d = given(*function, "description"); d != nullptr && !d->is_string()) {
      return wrongType(name + ".function.description", "a string", *d);
    }
    if (const ordered_json* p = given(*function, "parameters"); p != nullptr && !p->is_object()) {
      return wrongType(name + ".function.parameters", "a JSON schema object", *p);
    }
  }
  return std::nullopt;
}

// Checks tool_choice. The tools reach the template whatever it is, "none"
// included (as vLLM does by default: that output is not parsed for calls,
// and a conversation switching tool_choice keeps one prompt prefix). A
// forced call ("required", a named function) is checked against the tools
// here and constrained by structured_request.h.
std::optional<ApiError> checkToolChoice(const ordered_json& root, const ordered_json* tools) {
  const ordered_json* choice = given(root, "tool_choice");
  if (choice == nullptr) return std::nullopt;
  const bool has_tools = tools != nullptr && tools->is_array() && !tools->empty();
  if (choice->is_string()) {
    const std::string value = choice->get<std::string>();
    if (value == "auto" || value == "none") return std::nullopt;
    if (value == "required") {
      // An empty list is no tools to call: as vLLM and OpenAI, "none".
      const bool empty_list = tools != nullptr && tools->is_array() && tools->empty();
      if (!has_tools && !empty_list) {
        return invalidRequest("tool_choice \"required\" needs at least one tool in tools",
                              "tool_choice");
      }
      return std::nullopt;
    }
    return invalidRequest(
        "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}, got " +
            quoted(value),
        "tool_choice");
  }
  if (choice->is_object()) {
    const ordered_json* function = given(*choice, "function");
    const ordered_json* name =
        function != nullptr && function->is_object() ? given(*function, "name") : nullptr;
    const ordered_json* type = given(*choice, "type");
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
      return invalidRequest(
          "tool_choice naming a function must be {\"type\": \"function\", \"function\": "
          "{\"name\": ...}}",
          "tool_choice");
    }
    for (size_t i = 0; has_tools && i < tools->size(); ++i) {
      const ordered_json& tool = (*tools)[i];
      if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
          tool["function"].value("name", "") == name->get<std::string>()) {
        return std::nullopt;
      }
    }
    return invalidRequest("tool_choice.function.name " + quoted(name->get<std::string>()) +
                              " is not the name of a function in tools",
                          "tool_choice.function.name");
  }
  return wrongType("tool_choice", "\"auto\", \"none\", \"required\" or a named function", *choice);
}

Result<bool> readBool(const ordered_json& root, const char* key, bool fallback) {
  const ordered_json* value = given(root, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return wrongType(key, "a boolean", *value);
  return value->get<bool>();
}

}  // namespace

Result<ChatTemplateInput> readChatInput(const ordered_json& root, const ChatTemplate& chat_template,
                                        bool reasoning_as_thinking) {
  if (given(root, "chat_template") != nullptr) {
    return invalidRequest(
        "chat_template in the request is not supported; the model's own template is used",
        "chat_template");
  }
  ChatTemplateInput input;
  auto messages = readMessages(root, chat_template.contentFormat(), reasoning_as_thinking);
  if (!messages.isOk()) return messages.error();
  input.messages = std::move(messages).value();

  const ordered_json* tools = given(root, "tools");
  if (tools != nullptr) {
    if (auto error = checkTools(*tools)) return *error;
  }
  if (auto error = checkToolChoice(root, tools)) return *error;
  if (tools != nullptr) input.tools = *tools;
  if (const ordered_json* documents = given(root, "documents")) {
    if (!documents->is_array()) return wrongType("documents", "an array of objects", *documents);
    for (size_t i = 0; i < documents->size(); ++i) {
      if (!(*documents)[i].is_object()) {
        return wrongType("documents[" + std::to_string(i) + "]", "an object", (*documents)[i]);
      }
    }
    input.documents = *documents;
  }
  if (const ordered_json* kwargs = given(root, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return wrongType("chat_template_kwargs", "an object", *kwargs);
    input.kwargs = *kwargs;
  }
  // OpenAI's reasoning_effort reaches the template as the variable of that
  // name (gpt-oss's template reads it), as vLLM passes it; a
  // chat_template_kwargs entry of that name wins.
  if (const ordered_json* effort = given(root, "reasoning_effort")) {
    if (!effort->is_string()) return wrongType("reasoning_effort", "a string", *effort);
    if (!input.kwargs.contains("reasoning_effort")) input.kwargs["reasoning_effort"] = *effort;
  }
  auto add_generation_prompt = readBool(root, "add_generation_prompt", true);
  if (!add_generation_prompt.isOk()) return add_generation_prompt.error();
  auto continue_final = readBool(root, "continue_final_message", false);
  if (!continue_final.isOk()) return continue_final.error();
  input.add_generation_prompt = add_generation_prompt.value();
  input.continue_final_message = continue_final.value();
  if (input.add_generation_prompt && input.continue_final_message) {
    return invalidRequest(
        "add_generation_prompt and continue_final_message cannot both be true; set "
        "add_generation_prompt to false to continue the final message",
        "continue_final_message");
  }
  return input;
}

Result<std::string> renderChatRequest(const ordered_json& root, const ChatTemplate* chat_template,
                                      const std::atomic<bool>* cancel, std::string* template_time,
                                      bool reasoning_as_thinking) {
  if (chat_template == nullptr || !chat_template->hasTemplate()) {
    return invalidRequest(ChatTemplate::noTemplateMessage(), "messages");
  }
  auto input = readChatInput(root, *chat_template, reasoning_as_thinking);
  if (!input.isOk()) return input.error();
  jinja::RenderOptions options;
  options.cancel = cancel;
  if (const ordered_json* time = given(root, "chat_template_time")) {
    constexpr const char* kAccepted = "a time such as \"2025-03-07T09:05:03\"";
    if (!time->is_string()) return wrongType("chat_template_time", kAccepted, *time);
    options.now = jinja::parseNaiveTime(time->get_ref<const std::string&>());
    if (!options.now) {
      return invalidRequest("chat_template_time must be " + std::string(kAccepted) + ", got " +
                                quoted(time->get<std::string>()),
                            "chat_template_time");
    }
  } else {
    options.now = jinja::localNaiveNow();
  }
  if (template_time != nullptr) *template_time = jinja::formatNaiveTime(*options.now);
  auto rendered = chat_template->render(input.value(), options);
  if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) {
    return invalidRequest("the chat template failed: " + error->describe(), "messages");
  }
  return std::get<std::string>(std::move(rendered));
}

}  // namespace tandem::server
