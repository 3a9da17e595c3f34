#include "agent/render_chat_command.h"

#include <CLI/CLI.hpp>
#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "common/file_text.h"
#include "common/json_parse.h"
#include "common/protocol/chat_template.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace tandem::agent {
namespace {

using nlohmann::ordered_json;

// --now as the naive time strftime_now shows.
jinja::NaiveTime parseNow(const std::string& text) {
  auto time = jinja::parseNaiveTime(text);
  if (!time) {
    throw Error("--now must be an ISO-8601 time such as 2025-03-07T09:05:03, got \"" + text + "\"");
  }
  return *time;
}

std::string readFile(const std::string& path) {
  std::optional<std::string> text = readFileText(path);
  if (!text) throw Error("cannot read the chat template file " + path);
  return std::move(*text);
}

// --template wins over the model's templates; --bos-token / --eos-token win
// over the model's special tokens.
std::shared_ptr<const server::ChatTemplate> loadTemplate(const RenderChatOptions& options) {
  std::vector<server::ChatTemplate::Source> sources;
  ordered_json special = ordered_json::object();
  if (!options.model_dir.empty()) {
    auto tokenizer = Tokenizer::fromDirectory(options.model_dir);
    special = tokenizer->specialTokensMap();
    if (options.template_file.empty()) {
      for (const auto& named : tokenizer->chatTemplates()) {
        sources.push_back({named.name, named.text, named.origin});
      }
    }
  } else if (options.template_file.empty()) {
    throw Error("--template FILE or --model-dir DIR is required");
  }
  if (!options.template_file.empty()) {
    sources.push_back({"default", readFile(options.template_file), options.template_file});
  }
  if (!options.bos_token.empty()) special["bos_token"] = options.bos_token;
  if (!options.eos_token.empty()) special["eos_token"] = options.eos_token;
  auto created = server::ChatTemplate::create(std::move(sources), std::move(special));
  if (!created.isOk()) throw Error(created.status().message());
  if (!(*created)->hasTemplate()) throw Error(server::ChatTemplate::noTemplateMessage());
  return *created;
}

// One input line to its output object.
ordered_json renderLine(const server::ChatTemplate& chat_template, const std::string& line,
                        const jinja::RenderOptions& render_options) {
  JsonParseError parse_error;
  auto parsed = parseOrderedJson(line, parse_error);
  if (!parsed) return {{"error", "line is not valid JSON: " + parse_error.detail}};
  if (!parsed->is_object()) return {{"error", "line must be a JSON object"}};
  const ordered_json& root = *parsed;
  server::ChatTemplateInput input;
  const auto messages = root.find("messages");
  if (messages == root.end() || !messages->is_array()) {
    return {{"error", "messages is required (an array of message objects)"}};
  }
  input.messages = *messages;
  if (auto it = root.find("tools"); it != root.end()) input.tools = *it;
  if (auto it = root.find("documents"); it != root.end()) input.documents = *it;
  for (const char* key : {"add_generation_prompt", "continue_final_message"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_boolean()) return {{"error", std::string(key) + " must be a boolean"}};
    (std::string_view(key) == "add_generation_prompt" ? input.add_generation_prompt
                                                      : input.continue_final_message) =
        it->get<bool>();
  }
  if (auto it = root.find("kwargs"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) return {{"error", "kwargs must be an object"}};
    input.kwargs = *it;
  }
  auto rendered = chat_template.render(input, render_options);
  if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) {
    return {{"error", error->describe()}};
  }
  return {{"text", std::get<std::string>(rendered)}};
}

}  // namespace

CLI::App* addRenderChatCommand(CLI::App& app, RenderChatOptions& options) {
  CLI::App* command = app.add_subcommand(
      "render-chat", "JSON lines {\"messages\", ...} on stdin to the rendered chat {\"text\"}");
  command->add_option("--template", options.template_file, "Jinja chat template file");
  command->add_option("--now", options.now,
                      "time strftime_now sees, ISO-8601 (default: the clock)");
  command->add_option("--bos-token", options.bos_token, "bos_token passed to the template");
  command->add_option("--eos-token", options.eos_token, "eos_token passed to the template");
  command->add_option("--model-dir", options.model_dir,
                      "model directory: its template (unless --template) and special tokens");
  return command;
}

int runRenderChat(const RenderChatOptions& options, std::istream& in, std::ostream& out) {
  jinja::RenderOptions render_options;
  if (!options.now.empty()) render_options.now = parseNow(options.now);
  const auto chat_template = loadTemplate(options);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ordered_json output;
    try {
      output = renderLine(*chat_template, line, render_options);
    } catch (const std::exception& e) {
      output = {{"error", std::string("cannot render this line: ") + e.what()}};
    }
    out << output.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << '\n';
    out.flush();
  }
  return 0;
}

}  // namespace tandem::agent
