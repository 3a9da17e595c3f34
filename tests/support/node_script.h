// Node scripts for tests that check Tandem with independent JavaScript
// tools (Ajv, the official OpenAI client): finding node and the pinned npm
// packages `make deps` installs (scripts/fetch-node-packages.sh), and
// running a script of tests/support under them. Tests fail, not skip, when
// node or a package is missing: the message says how to install them.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/command.h"

namespace tandem::testing {

// The path of `name` in a directory of $PATH, or "" when there is none.
inline std::string findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// node and `packages` under `node_modules` (a test's TANDEM_NODE_MODULES).
class NodeScripts {
 public:
  NodeScripts(std::filesystem::path node_modules, std::vector<std::string> packages)
      : node_(findOnPath("node")),
        node_modules_(std::move(node_modules)),
        packages_(std::move(packages)) {}

  // "" when node and every package are there; otherwise what is missing and
  // that `make deps` installs it, for an ASSERT's message.
  std::string missing() const {
    if (node_.empty()) return "node is not on PATH; `make deps` installs it";
    std::string absent;
    for (const std::string& package : packages_) {
      if (!std::filesystem::exists(node_modules_ / package / "package.json")) {
        absent += (absent.empty() ? "" : ", ") + package;
      }
    }
    if (absent.empty()) return "";
    return absent + " missing from " + node_modules_.string() +
           "; `make deps` installs them (scripts/fetch-node-packages.sh)";
  }

  // Runs tests/support/`script` with `args` until it ends or `timeout`
  // passes, the packages on NODE_PATH; its stderr goes through
  // `stderr_path`.
  CommandResult run(const std::string& script, const std::vector<std::string>& args,
                    const std::filesystem::path& stderr_path,
                    std::chrono::milliseconds timeout) const {
    std::vector<std::string> argv = {
        node_, (std::filesystem::path(TANDEM_SOURCE_DIR) / "tests" / "support" / script).string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return runToEnd(argv, stderr_path, timeout, {{"NODE_PATH", node_modules_.string()}});
  }

 private:
  std::string node_;
  std::filesystem::path node_modules_;
  std::vector<std::string> packages_;
};

}  // namespace tandem::testing
