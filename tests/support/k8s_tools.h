// Finds the kubectl and helm binaries the tests run: $<env_var> when set,
// else the pinned binary `make deps` unpacks under the build tree
// (scripts/fetch-k8s-tools.sh; this build's, then build/'s), else the one on
// PATH.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::testing {

inline std::string k8sToolPath(const std::string& name, const char* env_var) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') return env;
  for (const std::filesystem::path& dir :
       {std::filesystem::path(TANDEM_K8S_TOOLS_DIR),
        std::filesystem::path(TANDEM_SOURCE_DIR) / "build/third_party/k8s-tools"}) {
    if (::access((dir / name).c_str(), X_OK) == 0) return (dir / name).string();
  }
  return name;
}

}  // namespace tandem::testing
