#include "tests/support/apiserver/schema.h"

#include <map>
#include <mutex>
#include <optional>
#include <regex>

namespace tandem::testing {
namespace {

using Json = nlohmann::json;
using Causes = std::vector<std::pair<std::string, std::string>>;

bool preservesUnknown(const Json& schema) {
  return schema.is_object() && schema.value("x-kubernetes-preserve-unknown-fields", false);
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

bool isRootMeta(const std::string& path, const std::string& name) {
  return path.empty() && (name == "apiVersion" || name == "kind" || name == "metadata");
}

void defaults(Json& value, const Json& schema) {
  if (!schema.is_object()) return;
  if (value.is_object()) {
    if (schema.contains("properties") && schema["properties"].is_object()) {
      for (const auto& [name, property] : schema["properties"].items()) {
        if (!value.contains(name) && property.is_object() && property.contains("default")) {
          value[name] = property["default"];
        }
        if (value.contains(name)) defaults(value[name], property);
      }
    } else if (schema.contains("additionalProperties") &&
               schema["additionalProperties"].is_object()) {
      for (auto& [name, item] : value.items()) defaults(item, schema["additionalProperties"]);
    }
  } else if (value.is_array() && schema.contains("items")) {
    for (Json& item : value) defaults(item, schema["items"]);
  }
}

void unknown(Json& value, const Json& schema, const std::string& path, bool prune,
             std::vector<std::string>& found) {
  if (!schema.is_object() || preservesUnknown(schema)) return;
  if (value.is_object()) {
    if (schema.contains("properties") && schema["properties"].is_object()) {
      const Json& properties = schema["properties"];
      std::vector<std::string> remove;
      for (auto& [name, item] : value.items()) {
        if (isRootMeta(path, name)) continue;
        if (!properties.contains(name)) {
          found.push_back(join(path, name));
          remove.push_back(name);
        } else {
          unknown(item, properties[name], join(path, name), prune, found);
        }
      }
      if (prune) {
        for (const std::string& name : remove) value.erase(name);
      }
    } else if (schema.contains("additionalProperties") &&
               schema["additionalProperties"].is_object()) {
      for (auto& [name, item] : value.items()) {
        unknown(item, schema["additionalProperties"], join(path, name), prune, found);
      }
    }
  } else if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) {
      unknown(value[i], schema["items"], path + "[" + std::to_string(i) + "]", prune, found);
    }
  }
}

// A schema's `pattern`, compiled once per text (nullopt: not a regular
// expression). The real server compiles it with Go's RE2; ECMAScript, which
// this uses, reads the classes, anchors, groups and repetitions that CRD
// patterns use the same way (RE2 has no backreferences or lookaround, so a
// pattern with them is refused there and may be accepted here).
const std::optional<std::regex>& compiledPattern(const std::string& text) {
  static std::mutex mutex;
  static std::map<std::string, std::optional<std::regex>> compiled;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = compiled.find(text);
  if (it == compiled.end()) {
    std::optional<std::regex> regex;
    try {
      regex.emplace(text, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
    }
    it = compiled.emplace(text, std::move(regex)).first;
  }
  return it->second;
}

// A string against the schema's pattern: unanchored, as the server's
// MatchString (a pattern anchors itself with ^ and $).
constexpr size_t kMaxPatternInput = 16 * 1024;

void checkPattern(const Json& value, const Json& schema, const std::string& path, Causes& causes) {
  if (!value.is_string() || !schema.contains("pattern") || !schema["pattern"].is_string()) return;
  if (value.get<std::string>().size() > kMaxPatternInput) return;
  const std::string pattern = schema["pattern"].get<std::string>();
  const std::optional<std::regex>& regex = compiledPattern(pattern);
  if (regex && !std::regex_search(value.get<std::string>(), *regex)) {
    causes.emplace_back(path, "Invalid value: \"" + value.get<std::string>() + "\": " + path +
                                  " in body should match '" + pattern + "'");
  }
}

void findBadPatterns(const Json& schema, const std::string& path, Causes& causes) {
  if (!schema.is_object()) return;
  if (schema.contains("pattern")) {
    const Json& pattern = schema["pattern"];
    if (!pattern.is_string() || !compiledPattern(pattern.get<std::string>())) {
      causes.emplace_back(path + ".pattern", "Invalid value: " + pattern.dump() +
                                                 ": must be a valid regular expression");
    }
  }
  for (const char* list : {"properties", "patternProperties"}) {
    if (!schema.contains(list) || !schema[list].is_object()) continue;
    for (const auto& [name, item] : schema[list].items()) {
      findBadPatterns(item, path + "." + list + "[" + name + "]", causes);
    }
  }
  for (const char* single : {"items", "additionalProperties", "not"}) {
    if (schema.contains(single)) findBadPatterns(schema[single], path + "." + single, causes);
  }
  for (const char* list : {"anyOf", "allOf", "oneOf"}) {
    if (!schema.contains(list) || !schema[list].is_array()) continue;
    for (size_t i = 0; i < schema[list].size(); ++i) {
      findBadPatterns(schema[list][i], path + "." + list + "[" + std::to_string(i) + "]", causes);
    }
  }
}

std::string shown(const Json& value) {
  if (!value.is_string()) return value.dump();
  std::string text = "\"";
  text += value.get<std::string>();
  text += '"';
  return text;
}

bool hasType(const Json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "integer") return value.is_number_integer();
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  return true;
}

void validate(const Json& value, const Json& schema, const std::string& path, Causes& causes) {
  if (!schema.is_object()) return;
  if (value.is_null()) {
    if (!schema.value("nullable", false)) {
      causes.emplace_back(path, "Invalid value: \"null\": " + path + " in body must be of type " +
                                    schema.value("type", "object") + ": \"null\"");
    }
    return;
  }
  bool int_or_string = schema.value("x-kubernetes-int-or-string", false);
  std::string type = schema.value("type", "");
  if (int_or_string) {
    if (!value.is_number_integer() && !value.is_string()) {
      causes.emplace_back(path, "Invalid value: " + shown(value) + ": " + path +
                                    " in body must be of type integer-or-string");
    }
    checkPattern(value, schema, path, causes);
    return;
  }
  if (!type.empty() && !hasType(value, type)) {
    causes.emplace_back(path, "Invalid value: \"" + std::string(value.type_name()) + "\": " + path +
                                  " in body must be of type " + type + ": \"" + value.type_name() +
                                  "\"");
    return;
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool listed = false;
    std::string supported;
    for (const Json& option : schema["enum"]) {
      listed = listed || option == value;
      supported += (supported.empty() ? "" : ", ") + shown(option);
    }
    if (!listed) {
      causes.emplace_back(
          path, "Unsupported value: " + shown(value) + ": supported values: " + supported);
    }
  }
  if (value.is_number()) {
    double number = value.get<double>();
    if (schema.contains("minimum") && number < schema["minimum"].get<double>()) {
      causes.emplace_back(path, "Invalid value: " + value.dump() + ": " + path +
                                    " in body should be greater than or equal to " +
                                    schema["minimum"].dump());
    }
    if (schema.contains("maximum") && number > schema["maximum"].get<double>()) {
      causes.emplace_back(path, "Invalid value: " + value.dump() + ": " + path +
                                    " in body should be less than or equal to " +
                                    schema["maximum"].dump());
    }
  }
  if (value.is_string()) {
    size_t length = value.get<std::string>().size();
    if (schema.contains("minLength") && length < schema["minLength"].get<size_t>()) {
      causes.emplace_back(path, "Invalid value: " + shown(value) + ": " + path +
                                    " in body should be at least " + schema["minLength"].dump() +
                                    " chars long");
    }
    const bool too_long =
        schema.contains("maxLength") && length > schema["maxLength"].get<size_t>();
    if (too_long) {
      causes.emplace_back(path, "Too long: may not be longer than " + schema["maxLength"].dump());
    }
    // libstdc++'s matcher recurses per character: a string past the length
    // bound, or of more than kMaxPatternInput bytes, is not matched here.
    if (!too_long) checkPattern(value, schema, path, causes);
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) {
      causes.emplace_back(path, "Invalid value: " + std::to_string(value.size()) + ": " + path +
                                    " in body should have at least " + schema["minItems"].dump() +
                                    " items");
    }
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) {
      causes.emplace_back(path, "Too many: " + std::to_string(value.size()) +
                                    ": must have at most " + schema["maxItems"].dump() + " items");
    }
    if (schema.contains("items")) {
      for (size_t i = 0; i < value.size(); ++i) {
        validate(value[i], schema["items"], path + "[" + std::to_string(i) + "]", causes);
      }
    }
  }
  if (value.is_object()) {
    if (schema.contains("required") && schema["required"].is_array()) {
      for (const Json& name : schema["required"]) {
        if (name.is_string() && !value.contains(name.get<std::string>())) {
          causes.emplace_back(join(path, name.get<std::string>()), "Required value");
        }
      }
    }
    if (schema.contains("properties") && schema["properties"].is_object()) {
      for (const auto& [name, item] : value.items()) {
        if (isRootMeta(path, name)) continue;
        if (schema["properties"].contains(name)) {
          validate(item, schema["properties"][name], join(path, name), causes);
        }
      }
    } else if (schema.contains("additionalProperties") &&
               schema["additionalProperties"].is_object()) {
      for (const auto& [name, item] : value.items()) {
        validate(item, schema["additionalProperties"], join(path, name), causes);
      }
    }
  }
}

}  // namespace

void applySchemaDefaults(nlohmann::json& object, const nlohmann::json& schema) {
  defaults(object, schema);
}

std::vector<std::string> unknownSchemaFields(nlohmann::json& object, const nlohmann::json& schema,
                                             bool prune) {
  std::vector<std::string> found;
  unknown(object, schema, "", prune, found);
  return found;
}

std::vector<std::pair<std::string, std::string>> validateAgainstSchema(
    const nlohmann::json& object, const nlohmann::json& schema) {
  Causes causes;
  validate(object, schema, "", causes);
  return causes;
}

std::vector<std::pair<std::string, std::string>> invalidSchemaPatterns(const nlohmann::json& schema,
                                                                       const std::string& path) {
  Causes causes;
  findBadPatterns(schema, path, causes);
  return causes;
}

}  // namespace tandem::testing
