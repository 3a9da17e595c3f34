// Chat templates: turning a conversation into the prompt text a model expects,
// as Hugging Face transformers' apply_chat_template(..., tokenize=False) does.
//
// A ChatTemplate holds a model's Jinja template(s), parsed once at start-up
// (common/jinja/template.h), and the tokenizer's special tokens. It is built
// from `--chat-template FILE` when given, else from the model directory
// (chat_template.jinja, else chat_template.json's "chat_template", else
// tokenizer_config.json "chat_template", a string or a list of named
// templates, whose default the file's replaces). A template that does not parse is a
// start-up error naming the file and the template line.
//
// render() takes the conversation as transformers does (messages passed to
// the template as they are: the OpenAI request handling in
// openai_protocol.cpp does vLLM's preprocessing before calling it) and
// passes the variables transformers passes: messages, tools (None when
// absent), documents (None when absent), add_generation_prompt, the special
// tokens (bos_token, eos_token, ... ; tokens the model lacks are undefined),
// then the extra keyword arguments, which win. With several named
// templates, "tool_use" renders when tools are given and it exists, else
// "default". continue_final_message leaves the last message open, cut
// exactly as transformers cuts it.
//
// Immutable after creation; render() may run on any number of threads.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/jinja/template.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace tandem::server {

// One conversation to render; the JSON values are the template's variables.
struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null: None
  nlohmann::ordered_json documents;  // null: None
  bool add_generation_prompt = false;
  // Excludes add_generation_prompt (render() fails when both are set).
  bool continue_final_message = false;
  // Extra template variables (chat_template_kwargs); they win over the
  // special tokens and over the variables above.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// How OpenAI content parts reach the template (vLLM's
// --chat-template-content-format): kString joins the text parts with "\n";
// kOpenAi passes the list of parts, for templates that iterate over content.
enum class ChatContentFormat { kString, kOpenAi };

class ChatTemplate {
 public:
  struct Source {
    std::string name;    // "default", "tool_use", ...
    std::string text;    // the Jinja source
    std::string origin;  // the file it came from, for error messages
  };

  // Parses every source. Errors (InvalidArgument): "<origin>: line N: what
  // failed". `special_tokens` is an object of template variables
  // (transformers' special_tokens_map).
  static StatusOr<std::shared_ptr<const ChatTemplate>> create(
      std::vector<Source> sources, nlohmann::ordered_json special_tokens);

  // The model's template: `override_file` when not empty (one template,
  // "default"), else the tokenizer's (Tokenizer::chatTemplates()); special
  // tokens from the tokenizer. A model without any template gives a
  // ChatTemplate for which hasTemplate() is false. Errors name the file.
  static StatusOr<std::shared_ptr<const ChatTemplate>> load(
      const Tokenizer& tokenizer, const std::filesystem::path& override_file = {});

  // Reads and parses a --chat-template file alone, for a process that loads
  // it with a tokenizer only later (the router, once an agent names the
  // model): what load() would refuse about the file, named as it names it.
  static Status checkFile(const std::filesystem::path& file);

  bool hasTemplate() const { return !templates_.empty(); }
  // vLLM's "auto" content format, decided from the template text: kOpenAi
  // when the template loops over a message's content, else kString.
  ChatContentFormat contentFormat() const { return content_format_; }
  const nlohmann::ordered_json& specialTokens() const { return special_tokens_; }

  // The prompt text, or what failed (TemplateError::describe() names the
  // line; raised_by_template when the template called raise_exception).
  jinja::TemplateResult<std::string> render(const ChatTemplateInput& input,
                                            const jinja::RenderOptions& options = {}) const;

  // The 400 message for a chat request to a model without a template.
  static std::string noTemplateMessage();

 private:
  struct Parsed {
    std::string name;
    jinja::Template parsed;
  };
  ChatTemplate() = default;
  const jinja::Template* choose(bool has_tools, std::string* error) const;

  std::vector<Parsed> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  ChatContentFormat content_format_ = ChatContentFormat::kString;
};

}  // namespace tandem::server
