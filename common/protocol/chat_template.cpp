#include "common/protocol/chat_template.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "common/file_text.h"
#include "common/status.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;

// What transformers appends to the final message to find where it ends in
// the rendered text.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

bool isPythonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '\x1c' ||
         c == '\x1d' || c == '\x1e' || c == '\x1f';
}

std::string_view strip(std::string_view text) {
  while (!text.empty() && isPythonSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && isPythonSpace(text.back())) text.remove_suffix(1);
  return text;
}

jinja::TemplateError failure(std::string message) {
  return jinja::TemplateError{std::move(message), 0, false};
}

// vLLM's content-format detection reads the template's syntax tree for a
// loop over a message's content; the same shapes are found in the text:
// `for part in message['content']`, `for part in msg.content`.
bool loopsOverContent(const std::string& text) {
  static const std::regex kLoop(
      R"(for\s+\w+\s+in\s+\w+\s*(\[\s*['"]content['"]\s*\]|\.content\b))");
  return std::regex_search(text, kLoop);
}

StatusOr<std::string> readTemplateFile(const std::filesystem::path& path) {
  // A FIFO, a device or a directory is refused, not waited on, read
  // without end or read as an empty template.
  std::optional<std::string> text;
  try {
    text = readModelFile(path);
  } catch (const Error& e) {
    return invalidArgument(std::string("the chat template file ") + e.what());
  }
  if (!text) return invalidArgument("cannot read the chat template file " + path.string());
  return std::move(*text);
}

}  // namespace

StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::create(
    std::vector<Source> sources, nlohmann::ordered_json special_tokens) {
  std::shared_ptr<ChatTemplate> chat(new ChatTemplate());
  if (special_tokens.is_object()) chat->special_tokens_ = std::move(special_tokens);
  for (Source& source : sources) {
    auto parsed = jinja::Template::parse(source.text);
    if (const auto* error = std::get_if<jinja::TemplateError>(&parsed)) {
      return invalidArgument(source.origin +
                             ": chat template does not parse: " + error->describe());
    }
    if (loopsOverContent(source.text)) chat->content_format_ = ChatContentFormat::kOpenAi;
    chat->templates_.push_back(
        Parsed{std::move(source.name), std::get<jinja::Template>(std::move(parsed))});
  }
  return std::shared_ptr<const ChatTemplate>(std::move(chat));
}

StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::load(
    const Tokenizer& tokenizer, const std::filesystem::path& override_file) {
  std::vector<Source> sources;
  if (!override_file.empty()) {
    auto text = readTemplateFile(override_file);
    if (!text.isOk()) return text.status();
    sources.push_back({"default", std::move(*text), override_file.string()});
  } else {
    for (const auto& named : tokenizer.chatTemplates()) {
      sources.push_back({named.name, named.text, named.origin});
    }
  }
  return create(std::move(sources), tokenizer.specialTokensMap());
}

Status ChatTemplate::checkFile(const std::filesystem::path& file) {
  auto text = readTemplateFile(file);
  if (!text.isOk()) return text.status();
  return create({{"default", std::move(*text), file.string()}}, nlohmann::ordered_json::object())
      .status();
}

std::string ChatTemplate::noTemplateMessage() {
  return "this model has no chat template (tokenizer_config.json has no chat_template and the "
         "model directory has no chat_template.jinja or chat_template.json); start the server with "
         "--chat-template "
         "FILE, or use /v1/completions with a prompt";
}

const jinja::Template* ChatTemplate::choose(bool has_tools, std::string* error) const {
  // As transformers' apply_chat_template picks from named templates: a
  // request with tools gets "tool_use" when there is one, every other one
  // "default" (a lone string template is "default"); no such template is
  // an error, not another template.
  const Parsed* fallback = nullptr;
  for (const Parsed& named : templates_) {
    if (has_tools && named.name == "tool_use") return &named.parsed;
    if (named.name == "default") fallback = &named;
  }
  if (fallback != nullptr) return &fallback->parsed;
  std::string names;
  for (const Parsed& named : templates_) names += (names.empty() ? "" : ", ") + named.name;
  *error = "this model's chat templates (" + names + ") include none named \"default\"" +
           (has_tools ? std::string() : std::string(" for a request without tools")) +
           "; give one with --chat-template FILE";
  return nullptr;
}

jinja::TemplateResult<std::string> ChatTemplate::render(const ChatTemplateInput& input,
                                                        const jinja::RenderOptions& options) const {
  if (templates_.empty()) return failure(noTemplateMessage());
  if (input.add_generation_prompt && input.continue_final_message) {
    return failure(
        "continue_final_message and add_generation_prompt are not compatible: use "
        "continue_final_message to continue the final message, add_generation_prompt to start a "
        "new assistant message");
  }
  std::string choose_error;
  const jinja::Template* chosen = choose(!input.tools.is_null(), &choose_error);
  if (chosen == nullptr) return failure(choose_error);

  ordered_json variables = ordered_json::object();
  variables["messages"] = input.messages;
  variables["tools"] = input.tools;
  variables["documents"] = input.documents;
  variables["add_generation_prompt"] = input.add_generation_prompt;
  for (const auto& [key, value] : special_tokens_.items()) variables[key] = value;
  if (input.kwargs.is_object()) {
    for (const auto& [key, value] : input.kwargs.items()) variables[key] = value;
  }

  // continue_final_message: mark the end of the final message's text, render,
  // and cut the output there (transformers' way).
  std::string final_text;
  if (input.continue_final_message) {
    ordered_json& messages = variables["messages"];
    if (!messages.is_array() || messages.empty() || !messages.back().is_object()) {
      return failure("continue_final_message is set but there is no final message to continue");
    }
    ordered_json& content = messages.back()["content"];
    if (content.is_string()) {
      final_text = content.get<std::string>();
      content = final_text + std::string(kContinueTag);
    } else if (content.is_array()) {
      bool found = false;
      for (auto part = content.rbegin(); part != content.rend(); ++part) {
        if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) {
          final_text = (*part)["text"].get<std::string>();
          (*part)["text"] = final_text + std::string(kContinueTag);
          found = true;
          break;
        }
      }
      if (!found) {
        return failure(
            "continue_final_message is set but we could not find any text to continue in the "
            "final message!");
      }
    } else {
      return failure(
          "continue_final_message is set but the final message's content is not text (got " +
          std::string(content.type_name()) + ")");
    }
  }

  auto rendered = chosen->render(variables, options);
  if (!input.continue_final_message || std::holds_alternative<jinja::TemplateError>(rendered)) {
    return rendered;
  }
  std::string& text = std::get<std::string>(rendered);
  const std::string_view tag = strip(kContinueTag);
  if (text.find(strip(final_text)) == std::string::npos || text.find(tag) == std::string::npos) {
    return failure(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template! This can happen if the chat template deletes portions of the "
        "final message. Please verify the chat template and final message in your chat to ensure "
        "they are compatible.");
  }
  const size_t tag_at = text.rfind(tag);
  const bool spacing_kept = text.compare(tag_at, kContinueTag.size(), kContinueTag) == 0;
  text.resize(tag_at);
  if (!spacing_kept) {
    while (!text.empty() && isPythonSpace(text.back())) text.pop_back();
  }
  return rendered;
}

}  // namespace tandem::server
