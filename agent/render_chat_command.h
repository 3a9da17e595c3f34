// `tandem-agent render-chat`: renders conversations with a chat template,
// one JSON line in, one JSON line out, with the same ChatTemplate code the
// server uses (common/protocol/chat_template.h), to check a template file
// before serving with it.
//
// Input lines: {"messages", "tools"?, "documents"?, "add_generation_prompt"?,
// "continue_final_message"?, "kwargs"?: {...}}, passed to the template as
// transformers' apply_chat_template passes them. Output: {"text": ...} or
// {"error": ...} per input line; a bad line never stops the command.
#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace tandem::agent {

struct RenderChatOptions {
  std::string template_file;  // --template
  std::string now;            // --now: ISO-8601 time strftime_now sees
  std::string bos_token;      // --bos-token
  std::string eos_token;      // --eos-token
  std::string model_dir;      // --model-dir: template and special tokens of a model
};

CLI::App* addRenderChatCommand(CLI::App& app, RenderChatOptions& options);

// Reads `in` to its end, writes one line per input line to `out`. Start-up
// problems (no template, a template that does not parse, a bad --now) throw
// tandem::Error. Returns the exit status.
int runRenderChat(const RenderChatOptions& options, std::istream& in, std::ostream& out);

}  // namespace tandem::agent
