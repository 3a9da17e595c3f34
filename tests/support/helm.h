// Finds the helm binary the tests run: $TANDEM_HELM, else the pinned binary
// `make deps` unpacks under the build tree (scripts/fetch-k8s-tools.sh), else
// the one on PATH. The same lookup order as kubectlPath() in kubectl.h.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::testing {

// The helm binary the tests use.
inline std::string helmPath() {
  if (const char* env = std::getenv("TANDEM_HELM"); env != nullptr && *env != '\0') return env;
  for (const std::filesystem::path& dir :
       {std::filesystem::path(TANDEM_K8S_TOOLS_DIR),
        std::filesystem::path(TANDEM_SOURCE_DIR) / "build/third_party/k8s-tools"}) {
    if (::access((dir / "helm").c_str(), X_OK) == 0) return (dir / "helm").string();
  }
  return "helm";
}

}  // namespace tandem::testing
