#include "operator/controller/object_meta.h"

#include <chrono>
#include <ctime>

#include "common/hex.h"

namespace tandem::controller {

using nlohmann::json;

Owner ownerOf(const json& object) {
  Owner owner;
  owner.api_version = object.value("apiVersion", "");
  owner.kind = object.value("kind", "");
  const json& metadata = object.contains("metadata") ? object["metadata"] : json::object();
  owner.ns = metadata.value("namespace", "");
  owner.name = metadata.value("name", "");
  owner.uid = metadata.value("uid", "");
  owner.generation = metadata.value("generation", int64_t{0});
  return owner;
}

json ownerReferences(const Owner& owner) {
  return json::array({{{"apiVersion", owner.api_version},
                       {"kind", owner.kind},
                       {"name", owner.name},
                       {"uid", owner.uid},
                       {"controller", true},
                       {"blockOwnerDeletion", true}}});
}

bool isControlledBy(const json& child, const std::string& uid) {
  const json* refs = nullptr;
  if (child.contains("metadata") && child["metadata"].contains("ownerReferences")) {
    refs = &child["metadata"]["ownerReferences"];
  }
  if (refs == nullptr || !refs->is_array()) return false;
  for (const json& ref : *refs) {
    if (ref.value("controller", false) && ref.value("uid", "") == uid) return true;
  }
  return false;
}

std::string selectorString(const json& match_labels) {
  std::string text;
  for (const auto& [key, value] : match_labels.items()) {
    if (!text.empty()) text += ",";
    text += key + "=" + value.get<std::string>();
  }
  return text;
}

bool matchesLabels(const json& object, const json& match_labels) {
  if (!object.contains("metadata") || !object["metadata"].contains("labels")) return false;
  const json& labels = object["metadata"]["labels"];
  for (const auto& [key, value] : match_labels.items()) {
    if (!labels.contains(key) || labels[key] != value) return false;
  }
  return true;
}

void stampDesiredHash(json& object) {
  json copy = object;
  if (copy["metadata"].contains("annotations")) {
    copy["metadata"]["annotations"].erase(kSpecHashAnnotation);
  }
  // FNV-1a: stable across builds and runs, unlike std::hash.
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : copy.dump()) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  object["metadata"]["annotations"][kSpecHashAnnotation] = hex64(hash);
}

std::string nowRfc3339() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace tandem::controller
