#include "operator/controller/object_diff.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace tandem::controller {
namespace {

using nlohmann::json;

// The value of a Kubernetes resource quantity ("500m", "0.5", "64Gi", "1e3",
// 2), or nullopt when the text is not one.
std::optional<long double> quantityValue(const json& value) {
  if (value.is_number()) return value.get<long double>();
  if (!value.is_string()) return std::nullopt;
  const std::string text = value.get<std::string>();
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const long double number = std::strtold(text.c_str(), &end);
  if (end == text.c_str()) return std::nullopt;
  const std::string suffix(end);
  static const std::pair<const char*, long double> kSuffixes[] = {
      {"", 1},         {"n", 1e-9},     {"u", 1e-6},     {"m", 1e-3},
      {"k", 1e3},      {"M", 1e6},      {"G", 1e9},      {"T", 1e12},
      {"P", 1e15},     {"E", 1e18},     {"Ki", 0x1p10L}, {"Mi", 0x1p20L},
      {"Gi", 0x1p30L}, {"Ti", 0x1p40L}, {"Pi", 0x1p50L}, {"Ei", 0x1p60L}};
  for (const auto& [name, scale] : kSuffixes) {
    if (suffix == name) return number * scale;
  }
  return std::nullopt;
}

// Under a container's resources and an emptyDir's sizeLimit the API server
// stores quantities in canonical form ("0.5" comes back as "500m", 1 as
// "1", "1024Mi" as "1Gi"), so they compare by value there.
bool isQuantityPath(const std::string& path) {
  return path.find("resources.limits.") != std::string::npos ||
         path.find("resources.requests.") != std::string::npos ||
         path.ends_with("emptyDir.sizeLimit");
}

bool scalarEqual(const json& desired, const json& live, const std::string& path) {
  if (desired == live) return true;
  if (desired.is_number() && live.is_string()) return desired.dump() == live.get<std::string>();
  if (isQuantityPath(path)) {
    const auto a = quantityValue(desired);
    const auto b = quantityValue(live);
    if (a && b) return std::fabs(*a - *b) <= 1e-9L * std::max(std::fabs(*a), std::fabs(*b));
  }
  return false;
}

// Go's zero values: what the API server leaves out of an object it stores
// (fields tagged omitempty), so a desired `value: ""`, `hostNetwork: false`,
// `initialDelaySeconds: 0` or empty list comes back absent.
bool isZeroValue(const json& value) {
  if (value.is_null()) return true;
  if (value.is_boolean()) return !value.get<bool>();
  if (value.is_string()) return value.get<std::string>().empty();
  if (value.is_number()) return value == json(0);
  if (value.is_array() || value.is_object()) return value.empty();
  return false;
}

// "" when `desired` ⊆ `live`, else the path where they part.
std::string difference(const json& desired, const json& live, const std::string& path) {
  if (desired.is_object()) {
    if (!live.is_object()) return path.empty() ? "(root)" : path;
    for (const auto& [key, value] : desired.items()) {
      const std::string child = path.empty() ? key : path + "." + key;
      if (!live.contains(key)) {
        if (isZeroValue(value)) continue;
        return child;
      }
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
  return scalarEqual(desired, live, path) ? "" : path;
}

}  // namespace

bool isSubset(const json& desired, const json& live) {
  return difference(desired, live, "").empty();
}

std::string firstDifference(const json& desired, const json& live) {
  return difference(desired, live, "");
}

}  // namespace tandem::controller
