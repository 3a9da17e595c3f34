// The helm binary the tests run ($TANDEM_HELM overrides; k8s_tools.h), and
// a helper that runs it with a home of its own.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/command.h"
#include "tests/support/k8s_tools.h"

namespace tandem::testing {

inline std::string helmPath() { return k8sToolPath("helm", "TANDEM_HELM"); }

// helm ARGS... with HOME, HELM_CACHE_HOME, HELM_CONFIG_HOME and
// HELM_DATA_HOME under `home` (so no user's helm state is read or written),
// KUBECONFIG set when `kubeconfig` is given; stderr kept in `stderr_path`.
inline CommandResult runHelm(const std::vector<std::string>& args,
                             const std::filesystem::path& home,
                             const std::filesystem::path& stderr_path,
                             std::chrono::milliseconds timeout = std::chrono::seconds(120),
                             const std::filesystem::path& kubeconfig = {}) {
  std::vector<std::string> argv = {helmPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string dir = home.string();
  std::vector<std::pair<std::string, std::string>> env = {{"HOME", dir},
                                                          {"HELM_CACHE_HOME", dir + "/cache"},
                                                          {"HELM_CONFIG_HOME", dir + "/config"},
                                                          {"HELM_DATA_HOME", dir + "/data"}};
  if (!kubeconfig.empty()) env.emplace_back("KUBECONFIG", kubeconfig.string());
  return runToEnd(argv, stderr_path, timeout, env);
}

}  // namespace tandem::testing
