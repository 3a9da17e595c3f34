// One served version of a resource kind the test API server knows: a
// CustomResourceDefinition's version, or a built-in kind (Deployment, ...).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::testing {

struct KindInfo {
  std::string group;  // "" for core
  std::string version;
  std::string kind;
  std::string list_kind;
  std::string plural;
  std::string singular;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  bool namespaced = true;
  bool builtin = false;
  bool has_status = false;  // status subresource
  // scale subresource: {specReplicasPath, statusReplicasPath, labelSelectorPath}, or null.
  nlohmann::json scale = nullptr;
  nlohmann::json schema = nullptr;                           // openAPIV3Schema (CRDs)
  nlohmann::json printer_columns = nlohmann::json::array();  // additionalPrinterColumns (CRDs)

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
};

}  // namespace tandem::testing
