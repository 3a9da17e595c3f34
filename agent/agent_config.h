// The options of `tandem-agent serve`, from the command line and from the
// YAML file given with --config.
//
// One table holds every option: its key, kind, accepted range and help. The
// same table registers the flags and reads the YAML keys, and one function
// checks each value, so a value is accepted or refused the same way from
// either source, with a message that names the flag (`--block-size`) or the
// file and key (`agent.yaml: block_size`) and says what is accepted. A flag
// given on the command line wins over the file. Unknown YAML keys, YAML values
// of the wrong shape and values out of range are errors.
//
// Start-up code: every function here throws tandem::Error with the message.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "agent/serve_command.h"
#include "common/decimal_text.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace tandem::agent {

// The bounds the table applies, for the docs and the tests.
inline constexpr int64_t kMaxBlockSize = 1024;
inline constexpr int64_t kMaxNumBlocks = (int64_t{1} << 31) - 1;  // block ids are int32
inline constexpr int64_t kMaxNumBatchedTokens = int64_t{1} << 20;
inline constexpr int64_t kMaxNumSeqs = 4096;
inline constexpr int64_t kMaxModelLen = int64_t{1} << 24;
inline constexpr int64_t kMaxWaitingRequests = 1000000;
inline constexpr int64_t kMaxThreads = 1024;
inline constexpr double kMaxTimeoutSeconds = 86400;         // one day
inline constexpr int64_t kMaxKvCacheMemory = kMaxByteSize;  // 1 PiB

enum class OptionKind {
  kString,   // any scalar, non-empty
  kInteger,  // a decimal integer in [min, max]
  kSeconds,  // a finite number in [min, max]
  kBytes,    // a size such as 2GiB in [1, max]
  kChoice,   // one of `choices`
  kFlag,     // true or false; on the command line a flag without a value
  kJson,     // a JSON object: text, or in YAML also a mapping
};

struct OptionSpec {
  std::string key;  // the YAML key; the flag is "--" + key with '-' for '_'
  OptionKind kind;
  int64_t min = 0;
  int64_t max = 0;
  std::vector<std::string> choices;
  std::string help;
  // kJson: the value's own parser (its messages start with the flag's name
  // without the dashes), run on every value the option is given.
  std::function<Status(const std::string& json_text)> check_json = {};

  std::string flag() const;
  // "between 1 and 1024", "one of bf16, f32", ...: what a value must be.
  std::string accepted() const;
};

// The table, in the order of `tandem-agent serve --help`.
const std::vector<OptionSpec>& serveOptionSpecs();

// Registers every option of the table on `command`. Their values are applied
// by applyServeOptions after parsing.
void addServeFlags(CLI::App& command);

// Sets `options` from the flags given on `command` and, for the options not
// given there, from `config` (a YAML mapping read from `config_path`; a null
// node: no file). Checks every value it sets. Options that `command` has but
// the table does not (registered directly with CLI11) take their YAML value
// through CLI11, with CLI11's checks.
void applyServeOptions(CLI::App& command, const YAML::Node& config, const std::string& config_path,
                       ServeOptions& options);

// The integer `text` given for the table's integer option `key` (as
// "threads"), checked as serve checks it; the error names the flag and what
// it accepts. For the options the program also takes before its subcommand.
int64_t checkedIntegerOption(std::string_view key, const std::string& text);

// Reads the YAML file given with --config; the error names the file.
YAML::Node loadServeConfigFile(const std::string& path);

// A YAML node as JSON: mappings become objects, sequences arrays; a plain
// (unquoted) scalar that reads as null, true/false, an integer or a number
// becomes that JSON type, any other scalar a string. A value nesting deeper
// than kMaxJsonDepth (json_parse.h), counting from `depth`, or a mapping
// giving a key twice, is refused, naming its line.
nlohmann::json yamlToJson(const YAML::Node& node, int depth = 0);

}  // namespace tandem::agent
