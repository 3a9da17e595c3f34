// Runs the real kubectl against a test API server: the pinned binary `make
// deps` unpacks under the build tree (scripts/fetch-k8s-tools.sh), else
// $TANDEM_KUBECTL, else the one on PATH. Each Kubectl has its own kubeconfig
// and a fresh --cache-dir, so discovery is never shared between tests.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/subprocess.h"

namespace tandem::testing {

// The kubectl binary the tests use.
inline std::string kubectlPath() {
  if (const char* env = std::getenv("TANDEM_KUBECTL"); env != nullptr && *env != '\0') return env;
  for (const std::filesystem::path& dir :
       {std::filesystem::path(TANDEM_K8S_TOOLS_DIR),
        std::filesystem::path(TANDEM_SOURCE_DIR) / "build/third_party/k8s-tools"}) {
    if (::access((dir / "kubectl").c_str(), X_OK) == 0) return (dir / "kubectl").string();
  }
  return "kubectl";
}

struct KubectlResult {
  int exit_status = -1;  // -1: still running at the deadline (then killed)
  std::string out;
  std::string err;
};

class Kubectl {
 public:
  // `work_dir` holds the cache directory and the stderr files.
  Kubectl(std::filesystem::path kubeconfig, std::filesystem::path work_dir)
      : kubeconfig_(std::move(kubeconfig)), work_dir_(std::move(work_dir)) {
    std::filesystem::create_directories(work_dir_ / "kubectl-cache");
  }

  // kubectl --kubeconfig K --cache-dir D ARGS...
  KubectlResult run(const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    std::vector<std::string> argv = {kubectlPath(), "--kubeconfig", kubeconfig_.string(),
                                     "--cache-dir", (work_dir_ / "kubectl-cache").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto err_path = work_dir_ / ("kubectl-" + std::to_string(++calls_) + ".err");
    Subprocess process(argv, err_path, {{"HOME", work_dir_.string()}});
    KubectlResult result;
    result.out = process.readStdout(timeout);
    result.exit_status = process.wait(std::chrono::seconds(5));
    result.err = process.stderrText();
    return result;
  }

 private:
  std::filesystem::path kubeconfig_;
  std::filesystem::path work_dir_;
  int calls_ = 0;
};

}  // namespace tandem::testing
