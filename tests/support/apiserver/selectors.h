// Label selectors (=, ==, !=, in (...), notin (...), key, !key) and field
// selectors (metadata.name, metadata.namespace with =, ==, !=) as list and
// watch requests carry them, parsed once and matched against objects.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::testing {

class Selector {
 public:
  // `text` as in ?labelSelector= / ?fieldSelector=; std::nullopt with `error`
  // set when it does not parse (the message names the part and what is accepted).
  static std::optional<Selector> parseLabels(const std::string& text, std::string& error);
  static std::optional<Selector> parseFields(const std::string& text, std::string& error);
  // metav1.LabelSelector (matchLabels, matchExpressions) as selector text.
  static std::string textOfLabelSelector(const nlohmann::json& label_selector);

  bool matches(const nlohmann::json& object) const;
  bool empty() const { return requirements_.empty(); }
  // The value a requirement `key=value` pins, if any (metadata.name for watches of one object).
  std::optional<std::string> exactValue(const std::string& key) const;

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::optional<std::string> valueOf(const nlohmann::json& object, const std::string& key) const;

  bool fields_ = false;
  std::vector<Requirement> requirements_;
};

}  // namespace tandem::testing
