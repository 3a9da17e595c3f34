// Fuzzes the chat template renderer. Input: one flags byte (bit 0
// add_generation_prompt, bit 1 continue_final_message), the template, then
// NUL-separated role and content pairs. A template the renderer accepts must
// render exactly the ChatML text (the only format it claims to support), and
// isChatMlTemplate must agree with renderChatTemplate.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol/chat_template.h"

namespace {

using tandem::server::ChatMessage;
using tandem::server::ChatTemplateOptions;

std::string expectedChatMl(const std::vector<ChatMessage>& messages,
                           const ChatTemplateOptions& options) {
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    prompt += "<|im_start|>" + messages[i].role + "\n" + messages[i].content;
    if (!(options.continue_final_message && i + 1 == messages.size())) prompt += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) prompt += "<|im_start|>assistant\n";
  return prompt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ChatTemplateOptions options;
  options.add_generation_prompt = (data[0] & 1) != 0;
  options.continue_final_message = (data[0] & 2) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<std::string> parts;
  for (size_t at = rest.find('\0'); at != std::string_view::npos; at = rest.find('\0')) {
    parts.emplace_back(rest.substr(0, at));
    rest.remove_prefix(at + 1);
  }
  parts.emplace_back(rest);
  const std::string& chat_template = parts[0];
  std::vector<ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});

  const bool supported = tandem::server::isChatMlTemplate(chat_template);
  const auto rendered = tandem::server::renderChatTemplate(chat_template, messages, options);
  const bool valid_request =
      !messages.empty() && !(options.add_generation_prompt && options.continue_final_message);
  if (rendered.isOk() != (supported && valid_request)) std::abort();
  if (rendered.isOk() && *rendered != expectedChatMl(messages, options)) std::abort();
  return 0;
}
