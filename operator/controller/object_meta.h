// What every object the controller owns carries: the labels that select it,
// the owner reference that ties it to its PrefillPool, DecodePool or Router
// (so Kubernetes deletes it with its owner), and the hash of the desired
// object that tells a later reconcile whether anything it wrote has changed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::controller {

inline constexpr const char* kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr const char* kManagedBy = "tandem-operator";
inline constexpr const char* kPoolLabel = "tandem.dev/pool";
inline constexpr const char* kRoleLabel = "tandem.dev/role";
inline constexpr const char* kRouterLabel = "tandem.dev/router";
// On owned objects: a hash of the desired object as last written, so that a
// field removed from the spec (which a subset comparison cannot see) is
// noticed as a change.
inline constexpr const char* kSpecHashAnnotation = "tandem.dev/desired-hash";

// The owner of an object: a PrefillPool, DecodePool or Router as read from the API.
struct Owner {
  std::string api_version;  // "tandem.dev/v1alpha1"
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
  int64_t generation = 0;
};
Owner ownerOf(const nlohmann::json& object);

// [{apiVersion, kind, name, uid, controller: true, blockOwnerDeletion: true}].
nlohmann::json ownerReferences(const Owner& owner);
// True when `child` has a controller ownerReference with `uid`.
bool isControlledBy(const nlohmann::json& child, const std::string& uid);

// matchLabels as a selector string: "tandem.dev/pool=x,tandem.dev/role=prefill"
// (keys in order).
std::string selectorString(const nlohmann::json& match_labels);
// True when every label of `match_labels` is on `object` with that value.
bool matchesLabels(const nlohmann::json& object, const nlohmann::json& match_labels);

// Sets metadata.annotations[kSpecHashAnnotation] to a stable hash of
// `object` (without that annotation).
void stampDesiredHash(nlohmann::json& object);

// An RFC 3339 UTC timestamp ("2025-01-02T03:04:05Z") of the system clock.
std::string nowRfc3339();

}  // namespace tandem::controller
