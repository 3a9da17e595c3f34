#include "operator/controller/object_diff.h"

namespace tandem::controller {
namespace {

using nlohmann::json;

bool scalarEqual(const json& desired, const json& live) {
  if (desired == live) return true;
  if (desired.is_number() && live.is_string()) return desired.dump() == live.get<std::string>();
  return false;
}

// "" when `desired` ⊆ `live`, else the path where they part.
std::string difference(const json& desired, const json& live, const std::string& path) {
  if (desired.is_object()) {
    if (!live.is_object()) return path.empty() ? "(root)" : path;
    for (const auto& [key, value] : desired.items()) {
      const std::string child = path.empty() ? key : path + "." + key;
      if (!live.contains(key)) return child;
      std::string found = difference(value, live[key], child);
      if (!found.empty()) return found;
    }
    return "";
  }
  if (desired.is_array()) {
    if (!live.is_array() || live.size() != desired.size()) return path;
    for (size_t i = 0; i < desired.size(); ++i) {
      std::string found = difference(desired[i], live[i], path + "[" + std::to_string(i) + "]");
      if (!found.empty()) return found;
    }
    return "";
  }
  return scalarEqual(desired, live) ? "" : path;
}

}  // namespace

bool isSubset(const json& desired, const json& live) {
  return difference(desired, live, "").empty();
}

std::string firstDifference(const json& desired, const json& live) {
  return difference(desired, live, "");
}

}  // namespace tandem::controller
