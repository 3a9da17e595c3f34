#include "tests/support/apiserver/selectors.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace tandem::testing {
namespace {

// The field labels the real API server supports for the kinds the tests use
// (every object: metadata.name and metadata.namespace; Events:
// involvedObject.*, reason, type, source, reportingComponent; Pods:
// spec.nodeName, status.phase). The stand-in accepts them for any kind.
const char* const kFieldLabels[] = {"metadata.name",
                                    "metadata.namespace",
                                    "involvedObject.kind",
                                    "involvedObject.namespace",
                                    "involvedObject.name",
                                    "involvedObject.uid",
                                    "involvedObject.apiVersion",
                                    "involvedObject.resourceVersion",
                                    "involvedObject.fieldPath",
                                    "reason",
                                    "type",
                                    "source",
                                    "reportingComponent",
                                    "spec.nodeName",
                                    "status.phase"};

std::string trim(const std::string& text) {
  size_t start = text.find_first_not_of(" \t");
  if (start == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t");
  return text.substr(start, end - start + 1);
}

// Splits at commas outside parentheses.
std::vector<std::string> splitTerms(const std::string& text) {
  std::vector<std::string> terms;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      terms.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  terms.push_back(current);
  return terms;
}

bool validKey(const std::string& key) {
  if (key.empty() || key.size() > 316) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '/';
  });
}

}  // namespace

std::optional<Selector> Selector::parseLabels(const std::string& text, std::string& error) {
  Selector selector;
  if (trim(text).empty()) return selector;
  for (const std::string& raw_term : splitTerms(text)) {
    std::string term = trim(raw_term);
    Requirement requirement;
    size_t space = term.find(' ');
    if (!term.empty() && term[0] == '!') {
      requirement.key = trim(term.substr(1));
      requirement.op = Op::kNotExists;
    } else if (space != std::string::npos && (term.find(" in ") != std::string::npos ||
                                              term.find(" notin ") != std::string::npos)) {
      requirement.key = trim(term.substr(0, space));
      std::string rest = trim(term.substr(space));
      bool notin = rest.rfind("notin", 0) == 0;
      requirement.op = notin ? Op::kNotIn : Op::kIn;
      rest = trim(rest.substr(notin ? 5 : 2));
      if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') {
        error =
            "unable to parse requirement \"" + term + "\": a set must be written (value1,value2)";
        return std::nullopt;
      }
      for (const std::string& value : splitTerms(rest.substr(1, rest.size() - 2))) {
        if (!trim(value).empty()) requirement.values.push_back(trim(value));
      }
    } else if (size_t at = term.find("!="); at != std::string::npos) {
      requirement.key = trim(term.substr(0, at));
      requirement.op = Op::kNotEquals;
      requirement.values.push_back(trim(term.substr(at + 2)));
    } else if (size_t at2 = term.find("=="); at2 != std::string::npos) {
      requirement.key = trim(term.substr(0, at2));
      requirement.op = Op::kEquals;
      requirement.values.push_back(trim(term.substr(at2 + 2)));
    } else if (size_t at3 = term.find('='); at3 != std::string::npos) {
      requirement.key = trim(term.substr(0, at3));
      requirement.op = Op::kEquals;
      requirement.values.push_back(trim(term.substr(at3 + 1)));
    } else {
      requirement.key = term;
      requirement.op = Op::kExists;
    }
    if (!validKey(requirement.key)) {
      error = "unable to parse requirement \"" + term +
              "\": expected key=value, key==value, key!=value, key in (v1,v2), key notin "
              "(v1,v2), key or !key";
      return std::nullopt;
    }
    selector.requirements_.push_back(std::move(requirement));
  }
  return selector;
}

std::optional<Selector> Selector::parseFields(const std::string& text, std::string& error) {
  Selector selector;
  selector.fields_ = true;
  if (trim(text).empty()) return selector;
  for (const std::string& raw_term : splitTerms(text)) {
    std::string term = trim(raw_term);
    Requirement requirement;
    size_t at = term.find("!=");
    size_t width = 2;
    requirement.op = Op::kNotEquals;
    if (at == std::string::npos) {
      requirement.op = Op::kEquals;
      at = term.find("==");
      if (at == std::string::npos) {
        at = term.find('=');
        width = 1;
      }
    }
    if (at == std::string::npos) {
      error = "invalid selector: '" + term + "'; can't understand '" + term +
              "' (expected field=value, field==value or field!=value)";
      return std::nullopt;
    }
    requirement.key = trim(term.substr(0, at));
    requirement.values.push_back(trim(term.substr(at + width)));
    if (std::find(std::begin(kFieldLabels), std::end(kFieldLabels), requirement.key) ==
        std::end(kFieldLabels)) {
      std::string supported;
      for (const char* label : kFieldLabels)
        supported += (supported.empty() ? "" : ", ") + std::string(label);
      error = "field label not supported: " + requirement.key + " (supported: " + supported + ")";
      return std::nullopt;
    }
    selector.requirements_.push_back(std::move(requirement));
  }
  return selector;
}

std::string Selector::textOfLabelSelector(const nlohmann::json& label_selector) {
  if (label_selector.is_string()) return label_selector.get<std::string>();
  if (!label_selector.is_object()) return "";
  std::vector<std::string> terms;
  if (label_selector.contains("matchLabels") && label_selector["matchLabels"].is_object()) {
    for (const auto& [key, value] : label_selector["matchLabels"].items()) {
      terms.push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
    }
  }
  if (label_selector.contains("matchExpressions") &&
      label_selector["matchExpressions"].is_array()) {
    for (const auto& expression : label_selector["matchExpressions"]) {
      std::string key = expression.value("key", "");
      std::string op = expression.value("operator", "");
      std::string values;
      for (const auto& value : expression.value("values", nlohmann::json::array())) {
        if (!values.empty()) values += ",";
        values += value.is_string() ? value.get<std::string>() : value.dump();
      }
      if (op == "In") terms.push_back(key + " in (" + values + ")");
      if (op == "NotIn") terms.push_back(key + " notin (" + values + ")");
      if (op == "Exists") terms.push_back(key);
      if (op == "DoesNotExist") terms.push_back("!" + key);
    }
  }
  std::string text;
  for (const std::string& term : terms) text += (text.empty() ? "" : ",") + term;
  return text;
}

std::optional<std::string> Selector::valueOf(const nlohmann::json& object,
                                             const std::string& key) const {
  const nlohmann::json metadata = object.value("metadata", nlohmann::json::object());
  if (fields_) {
    // A field label is a dotted path into the object; "source" is an Event's
    // source.component. Absent fields compare as "".
    const std::string path = key == "source" ? "source.component" : key;
    const nlohmann::json* node = &object;
    size_t start = 0;
    while (node != nullptr && start <= path.size()) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      node = node->is_object() && node->contains(part) ? &(*node)[part] : nullptr;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (node == nullptr || node->is_null()) return std::string();
    return node->is_string() ? node->get<std::string>() : node->dump();
  }
  const nlohmann::json labels = metadata.value("labels", nlohmann::json::object());
  if (!labels.is_object() || !labels.contains(key) || !labels[key].is_string()) {
    return std::nullopt;
  }
  return labels[key].get<std::string>();
}

bool Selector::matches(const nlohmann::json& object) const {
  for (const Requirement& requirement : requirements_) {
    std::optional<std::string> value = valueOf(object, requirement.key);
    auto in_values = [&] {
      return value && std::find(requirement.values.begin(), requirement.values.end(), *value) !=
                          requirement.values.end();
    };
    switch (requirement.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!in_values()) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        if (in_values()) return false;
        break;
      case Op::kExists:
        if (!value) return false;
        break;
      case Op::kNotExists:
        if (value) return false;
        break;
    }
  }
  return true;
}

std::optional<std::string> Selector::exactValue(const std::string& key) const {
  for (const Requirement& requirement : requirements_) {
    if (requirement.key == key && requirement.op == Op::kEquals) return requirement.values[0];
  }
  return std::nullopt;
}

}  // namespace tandem::testing
