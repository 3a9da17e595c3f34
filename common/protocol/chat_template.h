// Chat templates: turning a conversation into the prompt text a model expects.
//
// Hugging Face models ship a Jinja template in tokenizer_config.json. Until a
// Jinja engine exists, only ChatML is rendered: a template is accepted when,
// read with the settings Hugging Face uses (trim_blocks, lstrip_blocks, no
// trailing newline), it is the plain ChatML loop
//   <|im_start|>{role}\n{content}<|im_end|>\n   per message
//   <|im_start|>assistant\n                     when add_generation_prompt
// whatever its spacing, whitespace control (`{%-`), quote style or
// `message.role` / `message['role']` spelling. Anything else (default system
// prompts, tool handling, other formats) is refused rather than rendered
// differently from what the model was trained on.
//
// Pure functions; safe from any thread.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem::server {

struct ChatMessage {
  std::string role;     // system, user, assistant or tool (checked by the caller)
  std::string content;  // text parts already joined
};

struct ChatTemplateOptions {
  // Ends the prompt with the opening of an assistant turn.
  bool add_generation_prompt = true;
  // Leaves the last message open (no end-of-turn marker) so the model
  // continues it; excludes add_generation_prompt, as in vLLM.
  bool continue_final_message = false;
};

// Whether `chat_template` is a template renderChatTemplate supports.
bool isChatMlTemplate(std::string_view chat_template);

// The prompt text for `messages`, equal to what Hugging Face's Jinja rendering
// of the template gives. Errors: FailedPrecondition when the template is empty
// or not supported; InvalidArgument when `messages` is empty or the options
// conflict.
StatusOr<std::string> renderChatTemplate(std::string_view chat_template,
                                         std::span<const ChatMessage> messages,
                                         const ChatTemplateOptions& options);

}  // namespace tandem::server
