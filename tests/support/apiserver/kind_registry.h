// The resource kinds the test API server serves: the built-in ones (fixed)
// and those of the CustomResourceDefinitions stored so far. Thread-safe.
//
// A resource is named in the store by "<group>/<plural>" (resourceKey), the
// same for every version of it.
#pragma once

#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/crd_info.h"

namespace tandem::testing {

std::string resourceKey(const KindInfo& kind);
// "deployments.apps", "pods", "prefillpools.tandem.dev": how messages name a resource.
std::string qualifiedResource(const KindInfo& kind);

class KindRegistry {
 public:
  KindRegistry();  // the built-in kinds

  std::vector<KindInfo> all() const;
  std::optional<KindInfo> byResource(const std::string& group, const std::string& version,
                                     const std::string& plural) const;
  // `api_version` as in objects: "v1", "apps/v1".
  std::optional<KindInfo> byKind(const std::string& api_version, const std::string& kind) const;

  // The served versions of a CustomResourceDefinition object, replacing what
  // an earlier version of the same CRD registered.
  void registerCrd(const nlohmann::json& crd);
  void unregisterCrd(const std::string& crd_name);

 private:
  mutable std::mutex mutex_;
  std::vector<KindInfo> builtin_;
  std::vector<std::pair<std::string, KindInfo>> custom_;  // CRD name, one served version
};

// The KindInfo of each served version of a CRD object (no validation).
std::vector<KindInfo> kindsOfCrd(const nlohmann::json& crd);

}  // namespace tandem::testing
