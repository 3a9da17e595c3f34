// Runs the real kubectl against a test API server ($TANDEM_KUBECTL, else the
// pinned binary `make deps` unpacks, else the one on PATH: k8s_tools.h).
// Each Kubectl has its own kubeconfig and a fresh --cache-dir, so discovery is
// never shared between tests.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/command.h"
#include "tests/support/k8s_tools.h"

namespace tandem::testing {

// The kubectl binary the tests use.
inline std::string kubectlPath() { return k8sToolPath("kubectl", "TANDEM_KUBECTL"); }

using KubectlResult = CommandResult;

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
    return runToEnd(argv, work_dir_ / ("kubectl-" + std::to_string(++calls_) + ".err"), timeout,
                    {{"HOME", work_dir_.string()}});
  }

 private:
  std::filesystem::path kubeconfig_;
  std::filesystem::path work_dir_;
  int calls_ = 0;
};

}  // namespace tandem::testing
