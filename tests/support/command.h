// Runs a command to its end for a test: its stdout, stderr and exit status
// (the real kubectl, helm, podman, skopeo, scripts). stderr goes through a
// file the caller names, kept for failure messages.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/subprocess.h"

namespace tandem::testing {

struct CommandResult {
  int exit_status = -1;  // -1: still running at the deadline (then killed)
  std::string out;
  std::string err;
};

// argv until it closes its stdout or `timeout` passes, then its exit (5 s
// more at most); `env` is set for it alone.
inline CommandResult runToEnd(const std::vector<std::string>& argv,
                              const std::filesystem::path& stderr_path,
                              std::chrono::milliseconds timeout,
                              const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Subprocess process(argv, stderr_path, env);
  CommandResult result;
  result.out = process.readStdout(timeout);
  result.exit_status = process.wait(std::chrono::seconds(5));
  result.err = process.stderrText();
  return result;
}

}  // namespace tandem::testing
