#include "tests/integration/dockerfile_parser.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

// Splits on blanks, keeping quoted parts together and dropping the quotes
// (a backslash escapes the next character inside double quotes).
std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && i + 1 < text.size()) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

struct Instruction {
  int line = 0;
  std::string keyword;  // upper case
  std::string arguments;
};

// Joins continued lines and drops comments and blank lines.
std::vector<Instruction> instructionsOf(const std::string& text) {
  std::vector<Instruction> instructions;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  Instruction current;
  bool continuing = false;
  while (std::getline(lines, line)) {
    ++number;
    const std::string trimmed = trim(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    std::string part = trimmed;
    const bool continues = part.back() == '\\';
    if (continues) part.pop_back();
    if (!continuing) {
      current = Instruction{};
      current.line = number;
      const size_t space = part.find_first_of(" \t");
      current.keyword = upper(part.substr(0, space));
      current.arguments = space == std::string::npos ? "" : trim(part.substr(space));
    } else {
      current.arguments += ' ';
      current.arguments += trim(part);
    }
    continuing = continues;
    if (!continuing) instructions.push_back(current);
  }
  if (continuing) instructions.push_back(current);
  return instructions;
}

// Substitutes ${X}, $X, ${X:-word} and ${X:+word} from `variables`; a name
// not there is reported in `problems` and replaced by "".
std::string substitute(const std::string& text, const std::map<std::string, std::string>& variables,
                       const std::string& where, std::vector<std::string>& problems) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    std::string name;
    std::string modifier;
    std::string word;
    if (text[i + 1] == '{') {
      const size_t close = text.find('}', i + 2);
      if (close == std::string::npos) {
        problems.push_back(where + ": unterminated ${ in \"" + text + "\"");
        return out;
      }
      std::string inside = text.substr(i + 2, close - i - 2);
      const size_t colon = inside.find(':');
      if (colon != std::string::npos && colon + 1 < inside.size()) {
        modifier = inside.substr(colon + 1, 1);
        word = inside.substr(colon + 2);
        inside = inside.substr(0, colon);
      }
      name = inside;
      i = close;
    } else {
      size_t end = i + 1;
      while (end < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
        ++end;
      }
      if (end == i + 1) {
        out += '$';
        continue;
      }
      name = text.substr(i + 1, end - i - 1);
      i = end - 1;
    }
    const auto found = variables.find(name);
    const bool set = found != variables.end() && !found->second.empty();
    if (modifier == "-") {
      out += set ? found->second : word;
    } else if (modifier == "+") {
      out += set ? word : "";
    } else if (found == variables.end()) {
      problems.push_back(where + ": ${" + name +
                         "} is not declared in this stage (an ARG before FROM must be "
                         "declared again, without a value, inside each stage that uses it)");
    } else {
      out += found->second;
    }
  }
  return out;
}

// KEY=VALUE pairs of LABEL, ENV and ARG, variables substituted.
std::vector<std::pair<std::string, std::string>> keyValues(
    const std::string& arguments, const std::map<std::string, std::string>& variables,
    const std::string& where, std::vector<std::string>& problems) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const std::string& word : splitWords(arguments)) {
    const size_t equals = word.find('=');
    if (equals == std::string::npos) {
      pairs.emplace_back(word, "");
      continue;
    }
    pairs.emplace_back(word.substr(0, equals),
                       substitute(word.substr(equals + 1), variables, where, problems));
  }
  return pairs;
}

DockerCopy parseCopy(const Instruction& instruction, const std::map<std::string, std::string>& vars,
                     const std::string& where, std::vector<std::string>& problems) {
  DockerCopy copy;
  copy.line = instruction.line;
  copy.is_add = instruction.keyword == "ADD";
  std::vector<std::string> words = splitWords(instruction.arguments);
  std::vector<std::string> paths;
  size_t index = 0;
  for (; index < words.size() && startsWith(words[index], "--"); ++index) {
    if (startsWith(words[index], "--from=")) copy.from_stage = words[index].substr(7);
  }
  const size_t bracket = instruction.arguments.find('[');
  if (index < words.size() && startsWith(words[index], "[") && bracket != std::string::npos) {
    // JSON form: the quotes are part of the syntax, so parse the raw text.
    const nlohmann::json array =
        nlohmann::json::parse(instruction.arguments.substr(bracket), nullptr, false);
    if (!array.is_array()) {
      problems.push_back(where + ": " + instruction.keyword + " JSON form is not a JSON array");
      return copy;
    }
    for (const auto& item : array) paths.push_back(item.is_string() ? item.get<std::string>() : "");
  } else {
    paths.assign(words.begin() + static_cast<std::ptrdiff_t>(index), words.end());
  }
  for (std::string& path : paths) path = substitute(path, vars, where, problems);
  if (paths.size() < 2) {
    problems.push_back(where + ": " + instruction.keyword + " needs a source and a destination");
    return copy;
  }
  copy.destination = paths.back();
  paths.pop_back();
  copy.sources = paths;
  return copy;
}

}  // namespace

Dockerfile parseDockerfile(const std::string& name, const std::string& text) {
  Dockerfile file;
  file.name = name;
  for (const Instruction& instruction : instructionsOf(text)) {
    const std::string where = name + ":" + std::to_string(instruction.line);
    const std::string& keyword = instruction.keyword;
    if (keyword == "FROM") {
      std::vector<std::string> words;
      for (const std::string& word : splitWords(instruction.arguments)) {
        if (!startsWith(word, "--")) words.push_back(word);
      }
      DockerStage stage;
      stage.line = instruction.line;
      if (words.empty()) {
        file.problems.push_back(where + ": FROM without an image");
        continue;
      }
      stage.base_image = substitute(words[0], file.global_args, where, file.problems);
      if (words.size() >= 3 && upper(words[1]) == "AS") stage.name = words[2];
      file.stages.push_back(stage);
      continue;
    }
    if (keyword == "ARG") {
      std::map<std::string, std::string>& scope =
          file.stages.empty() ? file.global_args : file.stages.back().variables;
      for (const auto& [key, value] :
           keyValues(instruction.arguments, scope, where, file.problems)) {
        const bool has_value = instruction.arguments.find(key + "=") != std::string::npos;
        if (has_value || file.stages.empty()) {
          scope[key] = value;
        } else {
          // A global ARG declared again inside a stage takes its default.
          const auto global = file.global_args.find(key);
          scope[key] = global == file.global_args.end() ? "" : global->second;
        }
      }
      continue;
    }
    if (file.stages.empty()) {
      file.problems.push_back(where + ": " + keyword + " before the first FROM");
      continue;
    }
    DockerStage& stage = file.stages.back();
    if (keyword == "RUN") {
      stage.run_commands.push_back(instruction.arguments);
      stage.run_lines.push_back(instruction.line);
    } else if (keyword == "COPY" || keyword == "ADD") {
      stage.copies.push_back(parseCopy(instruction, stage.variables, where, file.problems));
    } else if (keyword == "USER") {
      stage.user = trim(substitute(instruction.arguments, stage.variables, where, file.problems));
      stage.user_line = instruction.line;
    } else if (keyword == "LABEL") {
      for (const auto& [key, value] :
           keyValues(instruction.arguments, stage.variables, where, file.problems)) {
        stage.labels[key] = value;
      }
    } else if (keyword == "ENV") {
      for (const auto& [key, value] :
           keyValues(instruction.arguments, stage.variables, where, file.problems)) {
        stage.env[key] = value;
        stage.variables[key] = value;
      }
    } else if (keyword == "ENTRYPOINT") {
      stage.entrypoint_line = instruction.line;
      const nlohmann::json array = nlohmann::json::parse(instruction.arguments, nullptr, false);
      stage.entrypoint_exec_form = array.is_array();
      if (array.is_array()) {
        for (const auto& item : array) {
          stage.entrypoint.push_back(item.is_string() ? item.get<std::string>() : "");
        }
      } else {
        stage.entrypoint = splitWords(instruction.arguments);
      }
    } else if (keyword == "WORKDIR" || keyword == "CMD" || keyword == "EXPOSE" ||
               keyword == "VOLUME" || keyword == "STOPSIGNAL" || keyword == "HEALTHCHECK" ||
               keyword == "SHELL" || keyword == "ONBUILD") {
      // Not checked.
    } else {
      file.problems.push_back(where + ": unknown instruction " + keyword);
    }
  }
  return file;
}

std::vector<std::string> aptInstallPackages(const std::string& run_command) {
  // One simple command at a time: split at && || ; | and newlines.
  static const std::regex kSeparator(R"(\&\&|\|\||;|\||\n)");
  std::vector<std::string> packages;
  for (std::sregex_token_iterator it(run_command.begin(), run_command.end(), kSeparator, -1), end;
       it != end; ++it) {
    std::vector<std::string> words = splitWords(*it);
    size_t index = 0;
    // Leading VAR=value assignments and `env`.
    while (index < words.size() &&
           (words[index] == "env" ||
            (words[index].find('=') != std::string::npos && !startsWith(words[index], "-")))) {
      ++index;
    }
    if (index >= words.size() || (words[index] != "apt-get" && words[index] != "apt")) continue;
    const auto install = std::find(words.begin() + static_cast<std::ptrdiff_t>(index), words.end(),
                                   std::string("install"));
    if (install == words.end()) continue;
    for (auto word = install + 1; word != words.end(); ++word) {
      if (!startsWith(*word, "-")) packages.push_back(*word);
    }
  }
  return packages;
}

std::set<std::string> cmakeBuildTargets(const std::string& run_command) {
  std::set<std::string> targets;
  const std::vector<std::string> words = splitWords(run_command);
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] != "--target" && words[i] != "-t") continue;
    for (size_t j = i + 1; j < words.size(); ++j) {
      if (startsWith(words[j], "-") || words[j] == "&&" || words[j] == ";" || words[j] == "\\") {
        break;
      }
      targets.insert(words[j]);
    }
  }
  return targets;
}

DockerIgnore::DockerIgnore(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    Rule rule;
    if (line[0] == '!') {
      rule.exception = true;
      line = trim(line.substr(1));
    }
    while (startsWith(line, "/")) line.erase(0, 1);
    while (line.size() > 1 && line.back() == '/') line.pop_back();
    rule.pattern = line;
    rules_.push_back(rule);
  }
}

namespace {

// `*` and `?` stay within one path component; `**` spans any number of them.
bool globMatches(const std::string& pattern, const std::string& path) {
  std::string regex;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '*' && i + 1 < pattern.size() && pattern[i + 1] == '*') {
      const bool slash_after = i + 2 < pattern.size() && pattern[i + 2] == '/';
      regex += slash_after ? "(.*/)?" : ".*";
      i += slash_after ? 2 : 1;
    } else if (c == '*') {
      regex += "[^/]*";
    } else if (c == '?') {
      regex += "[^/]";
    } else if (std::string("\\^$.|+()[]{}").find(c) != std::string::npos) {
      regex += '\\';
      regex += c;
    } else {
      regex += c;
    }
  }
  return std::regex_match(path, std::regex(regex));
}

}  // namespace

bool DockerIgnore::excludes(const std::string& raw_path) const {
  std::string path = fs::path(raw_path).lexically_normal().generic_string();
  while (startsWith(path, "./")) path.erase(0, 2);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.empty() || path == ".") return false;
  // A rule applies to a path it matches or to one of its parent folders
  // (a left-out folder leaves out what is in it); the last applying rule
  // decides, so a later `!` rule can bring a file of a left-out folder back.
  std::vector<std::string> candidates;
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    candidates.push_back(path.substr(0, slash));
  }
  candidates.push_back(path);
  bool excluded = false;
  for (const Rule& rule : rules_) {
    for (const std::string& candidate : candidates) {
      if (globMatches(rule.pattern, candidate)) {
        excluded = !rule.exception;
        break;
      }
    }
  }
  return excluded;
}

std::string packageFamily(const std::string& package) {
  std::string family = package;
  if (family.size() > 3 && family.compare(family.size() - 3, 3, "t64") == 0) {
    family.resize(family.size() - 3);
  }
  while (!family.empty() && (std::isdigit(static_cast<unsigned char>(family.back())) ||
                             family.back() == '.' || family.back() == '-')) {
    family.pop_back();
  }
  return family;
}

}  // namespace tandem::testing
