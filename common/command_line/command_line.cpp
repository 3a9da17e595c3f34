#include "common/command_line/command_line.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/closest_match.h"

namespace tandem {
namespace {

// The command the user gave: the deepest subcommand parsed, or the program.
const CLI::App& commandGiven(const CLI::App& app) {
  const CLI::App* command = &app;
  for (;;) {
    const std::vector<const CLI::App*> parsed = command->get_subcommands({});
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : parsed) {
      if (sub->parsed()) next = sub;
    }
    if (next == nullptr) return *command;
    command = next;
  }
}

// "tandem-agent serve": the names from the program to `command`.
std::string commandPath(const CLI::App& command, const std::string& program) {
  std::string path;
  for (const CLI::App* at = &command; at->get_parent() != nullptr; at = at->get_parent()) {
    path.insert(0, " " + at->get_name());
  }
  return program + path;
}

// Every long option name `command` takes, as "--name"; `with_parents`: its
// parents' too (a subcommand falling through to its parent takes those).
std::vector<std::string> longOptionsOf(const CLI::App& command, bool with_parents) {
  std::vector<std::string> names;
  for (const CLI::App* at = &command; at != nullptr;
       at = with_parents ? at->get_parent() : nullptr) {
    for (const CLI::Option* option : at->get_options({})) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    }
  }
  return names;
}

// The words CLI11 left over, from the program and every parsed subcommand.
std::vector<std::string> leftOver(const CLI::App& app) {
  std::vector<std::string> words = app.remaining();
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!sub->parsed()) continue;
    for (std::string& word : leftOver(*sub)) words.push_back(std::move(word));
  }
  return words;
}

}  // namespace

std::string usageErrorText(const CLI::App& app, const CLI::ParseError& error) {
  const CLI::App& command = commandGiven(app);
  const std::string where = commandPath(command, app.get_name());
  std::vector<std::string> commands;
  for (const CLI::App* sub : command.get_subcommands({})) commands.push_back(sub->get_name());
  std::string commands_text;
  for (const std::string& name : commands) {
    commands_text += (commands_text.empty() ? "" : ", ") + name;
  }
  // The words left over, whatever CLI11 refused first (a required option
  // missing is often one misspelt among them).
  std::string text;
  bool named_command = false;  // a word was taken for a command misspelt
  bool after_option = false;   // a word after an option not known is taken for its value
  const std::vector<std::string> own = longOptionsOf(command, false);
  const std::vector<std::string> taken = longOptionsOf(command, true);
  for (const std::string& word : leftOver(app)) {
    const bool option = word.size() >= 2 && word[0] == '-';
    if (!option && std::exchange(after_option, false)) continue;
    if (!text.empty()) text += "; ";
    if (!option && !commands.empty()) {
      named_command = true;
      text += "\"" + word + "\" is not a command of " + where;
      const std::string near = closestMatch(word, commands);
      text +=
          near.empty() ? " (its commands: " + commands_text + ")" : " (did you mean " + near + "?)";
      continue;
    }
    if (!option) {
      text += "\"" + word + "\" is not an argument " + where + " takes (it takes options only)";
      continue;
    }
    after_option = word.find('=') == std::string::npos;
    const std::string name = word.substr(0, word.find('='));
    if (command.get_parent() != nullptr && std::find(own.begin(), own.end(), name) != own.end()) {
      // Given before the command it belongs to.
      text += name + " is an option of " + where + ": give it after " + command.get_name();
      continue;
    }
    text += name + " is not an option of " + where;
    if (const std::string near = closestMatch(name, taken); !near.empty()) {
      text += " (did you mean " + near + "?)";
    }
  }
  if (command.get_require_subcommand_min() > 0 && command.get_subcommands().empty() &&
      !named_command) {
    return (text.empty() ? "" : text + "; ") + "a command is needed: " + commands_text;
  }
  return text.empty() ? std::string(error.what()) : text;
}

std::optional<int> parseCommandLine(CLI::App& app, int argc, const char* const* argv,
                                    const std::string& program) {
  app.name(program);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    const std::string text = usageErrorText(app, error);
    const std::string where = commandPath(commandGiven(app), program);
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options.\n", program.c_str(),
                 text.c_str(), where.c_str());
    return kUsageExitStatus;
  }
}

}  // namespace tandem
