// Helpers for tests that install charts/tandem on the test API server the
// way a user would: render it with the real helm (`helm template`), pick
// objects out of the rendering, write them for `kubectl apply -f`, and mint
// service-account tokens with `kubectl create token`. Header-only; each call
// runs one process and waits for it (at most a minute).
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/apiserver/yaml_json.h"
#include "tests/support/command.h"
#include "tests/support/helm.h"
#include "tests/support/kubectl.h"

namespace tandem::testing {

struct RenderedChart {
  int exit_status = -1;
  std::string err;                      // helm's stderr
  std::vector<nlohmann::json> objects;  // the rendered documents, in order
};

// helm template RELEASE CHART --namespace NS EXTRA..., with helm's home,
// cache and config under `work_dir`.
inline RenderedChart helmTemplate(const std::filesystem::path& work_dir, const std::string& release,
                                  const std::filesystem::path& chart, const std::string& ns,
                                  const std::vector<std::string>& extra = {}) {
  std::filesystem::create_directories(work_dir);
  std::vector<std::string> args = {"template", release, chart.string(), "--namespace", ns};
  args.insert(args.end(), extra.begin(), extra.end());
  const CommandResult helm =
      runHelm(args, work_dir, work_dir / "helm-template.err", std::chrono::seconds(60));
  RenderedChart rendered;
  rendered.exit_status = helm.exit_status;
  rendered.err = helm.err;
  if (rendered.exit_status == 0) rendered.objects = yamlDocumentsToJson(helm.out);
  return rendered;
}

// The objects whose kind is one of `kinds`, in order.
inline std::vector<nlohmann::json> objectsOfKinds(const std::vector<nlohmann::json>& objects,
                                                  const std::vector<std::string>& kinds) {
  std::vector<nlohmann::json> found;
  for (const nlohmann::json& object : objects) {
    const std::string kind = object.value("kind", "");
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) found.push_back(object);
  }
  return found;
}

// `objects` as a multi-document YAML stream (each document JSON), which
// kubectl apply -f reads.
inline std::filesystem::path writeObjects(const std::filesystem::path& path,
                                          const std::vector<nlohmann::json>& objects) {
  std::ofstream file(path);
  for (const nlohmann::json& object : objects) file << "---\n" << object.dump(2) << "\n";
  return path;
}

// `kubectl create token NAME -n NS`: the new token, or "" when it failed
// (then `error` says why).
inline std::string createServiceAccountToken(Kubectl& kubectl, const std::string& ns,
                                             const std::string& name, std::string& error) {
  KubectlResult result = kubectl.run({"create", "token", name, "-n", ns});
  if (result.exit_status != 0) {
    error = result.err;
    return "";
  }
  std::string token = result.out;
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  return token;
}

}  // namespace tandem::testing
