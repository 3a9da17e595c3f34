// Fuzzes chat template parsing and rendering, and the chat request handling
// in front of it. Input: one flags byte (bit 0 add_generation_prompt, bit 1
// continue_final_message), a template, a NUL, then a chat request body.
//
// Properties: an arbitrary template parses or fails without crashing, and
// renders a fixed conversation, under small render limits (work, memory,
// time, output), or fails with a message; its output never exceeds
// max_output_bytes, and a render that stopped at a bound says so with kind
// kLimit (and only then); an arbitrary request body is prepared and rendered
// with the ChatML template or refused with a 400 naming a field; when it
// renders and every message's content is a string, the text is exactly the
// ChatML text for those messages.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/json_parse.h"
#include "common/protocol/chat_request.h"
#include "common/protocol/chat_template.h"

namespace {

using nlohmann::ordered_json;
using tandem::server::ChatTemplate;
using tandem::server::ChatTemplateInput;

constexpr std::string_view kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

const ChatTemplate& chatMl() {
  static const auto kTemplate = [] {
    auto created = ChatTemplate::create({{"default", std::string(kChatMl), "chatml"}}, {});
    if (!created.isOk()) std::abort();
    return *created;
  }();
  return *kTemplate;
}

// Small bounds, so that a hostile template is stopped quickly.
tandem::jinja::RenderOptions smallLimits() {
  tandem::jinja::RenderOptions options;
  options.limits.max_steps = 200'000;
  options.limits.max_memory_bytes = 4 << 20;
  options.limits.max_output_bytes = 256 << 10;
  options.limits.max_render_time = std::chrono::milliseconds(1000);
  return options;
}

// The ChatML text for messages whose roles and contents are all strings;
// nullopt for any other shape.
std::optional<std::string> expectedChatMl(const ChatTemplateInput& input) {
  std::string prompt;
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const ordered_json& message = input.messages[i];
    if (!message["role"].is_string() || !message["content"].is_string()) return std::nullopt;
    const std::string content = message["content"].get<std::string>();
    prompt += "<|im_start|>" + message["role"].get<std::string>() + "\n" + content;
    if (input.continue_final_message && i + 1 == input.messages.size()) {
      // transformers' cut: the ChatML template keeps the text as it is.
      return content.find("CONTINUE_FINAL_MESSAGE_TAG") == std::string::npos
                 ? std::optional<std::string>(prompt)
                 : std::nullopt;
    }
    prompt += "<|im_end|>\n";
  }
  if (input.add_generation_prompt) prompt += "<|im_start|>assistant\n";
  return prompt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool add_generation_prompt = (data[0] & 1) != 0;
  const bool continue_final_message = (data[0] & 2) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t split = rest.find('\0');
  const std::string_view template_text = rest.substr(0, split);
  const std::string_view body =
      split == std::string_view::npos ? std::string_view() : rest.substr(split + 1);

  // Any template: parse, then render a fixed conversation.
  auto created = ChatTemplate::create({{"default", std::string(template_text), "fuzz"}},
                                      ordered_json{{"bos_token", "<s>"}});
  if (created.isOk()) {
    ChatTemplateInput input;
    input.messages = ordered_json::parse(
        R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])");
    input.add_generation_prompt = add_generation_prompt;
    input.continue_final_message = continue_final_message && !add_generation_prompt;
    const tandem::jinja::RenderOptions options = smallLimits();
    auto rendered = (*created)->render(input, options);
    if (const auto* error = std::get_if<tandem::jinja::TemplateError>(&rendered)) {
      if (error->describe().empty()) std::abort();
      // Every bound's error ends naming it, "(limit ...)", and has kind
      // kLimit; nothing cancels this render.
      const std::string& message = error->message;
      const size_t last_open = message.rfind('(');
      const bool names_a_bound = !message.empty() && message.back() == ')' &&
                                 last_open != std::string::npos &&
                                 message.compare(last_open, 7, "(limit ") == 0;
      const bool is_limit = error->kind == tandem::jinja::TemplateError::Kind::kLimit;
      if (names_a_bound != is_limit && !error->raised_by_template) std::abort();
      if (error->kind == tandem::jinja::TemplateError::Kind::kCancelled) std::abort();
    } else if (std::get<std::string>(rendered).size() > options.limits.max_output_bytes) {
      std::abort();
    }
  } else if (created.status().message().empty()) {
    std::abort();
  }

  // Any request body, rendered with ChatML.
  tandem::JsonParseError parse_error;
  auto root = tandem::parseOrderedJson(body, parse_error);
  if (!root || !root->is_object()) return 0;
  auto input = tandem::server::readChatInput(*root, chatMl());
  if (!input.isOk()) {
    if (input.error().status != 400 || input.error().message.empty()) std::abort();
    return 0;
  }
  auto rendered = chatMl().render(input.value());
  if (const auto* text = std::get_if<std::string>(&rendered)) {
    if (auto expected = expectedChatMl(input.value()); expected && *expected != *text) {
      std::abort();
    }
  }
  return 0;
}
