// The patch formats of the Kubernetes API, applied to stored objects: JSON
// merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch (for
// built-in kinds, with the merge keys of the lists kubectl and controllers
// touch) and server-side apply (simplified: see docs/testing.md).
// A malformed patch throws PatchError with a message naming what is wrong.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tandem::testing {

class PatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json jsonMergePatch(nlohmann::json target, const nlohmann::json& patch);
nlohmann::json jsonPatch(nlohmann::json target, const nlohmann::json& operations);
nlohmann::json strategicMergePatch(nlohmann::json target, const nlohmann::json& patch);
// Server-side apply by one field manager: `applied` is the manager's whole
// intent; fields it applied before (`previously_applied`, null the first
// time) and no longer names are removed; lists with merge keys are merged by
// key. Returns the new object; `previously_applied` becomes `applied`.
nlohmann::json serverSideApply(nlohmann::json live, const nlohmann::json& applied,
                               nlohmann::json& previously_applied);

}  // namespace tandem::testing
