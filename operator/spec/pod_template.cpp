#include "operator/spec/pod_template.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace tandem::spec {
namespace {

using nlohmann::json;

// Objects merge key by key; anything else (a leaf, a list) is replaced by the
// user's. A null in the user's means "not set".
void deepMerge(json& target, const json& user) {
  if (!user.is_object()) {
    target = user;
    return;
  }
  if (!target.is_object()) target = json::object();
  for (const auto& [key, value] : user.items()) {
    if (!value.is_null()) deepMerge(target[key], value);
  }
}

std::string keyedPath(const std::string& list_path, const std::string& key) {
  return list_path + "[" + key + "]";
}

// Merges one field of the fragment into `target`, the generated value (null
// when the generated template lacks it); `path` names the user's field.
using FieldMerge = std::function<void(json& target, const json& user, const std::string& path)>;

struct FieldRule {
  std::optional<json::value_t> type;  // the type the user's value must have, if any
  FieldMerge merge;
};
using FieldRules = std::map<std::string, FieldRule, std::less<>>;

class TemplateMerger {
 public:
  TemplateMerger(std::string main_container, const std::vector<std::string>& owned_pod_fields)
      : main_container_(std::move(main_container)) {
    const json::value_t kObject = json::value_t::object;
    const json::value_t kArray = json::value_t::array;
    const FieldRule map_union{kObject,
                              [this](json& target, const json& user, const std::string& path) {
                                mergeMapKeepingGenerated(target, user, path);
                              }};
    const FieldRule deep{kObject, [](json& target, const json& user, const std::string&) {
                           deepMerge(target, user);
                         }};
    const FieldRule atomic_list{kArray, as_written_.merge};

    template_rules_ = {
        {"metadata", {kObject, mergeObjectWith(metadata_rules_, refused_)}},
        {"spec", {kObject, mergeObjectWith(spec_rules_, as_written_)}},
    };
    metadata_rules_ = {{"labels", map_union}, {"annotations", map_union}};
    spec_rules_ = {
        {"nodeSelector", map_union},
        {"affinity", deep},
        {"securityContext", deep},
        {"tolerations", atomic_list},
        {"topologySpreadConstraints", atomic_list},
        {"volumes", {kArray, mergeByKeyWith("name", owned_.merge)}},
        {"imagePullSecrets", {kArray, mergeByKeyWith("name", owned_.merge)}},
        // Dynamic Resource Allocation: what spec.resources.claims names.
        {"resourceClaims", {kArray, mergeByKeyWith("name", deep.merge)}},
        {"initContainers", {kArray, mergeByKeyWith("name", deep.merge)}},
        {"containers",
         {kArray, mergeByKeyWith("name",
                                 [this](json& target, const json& user, const std::string& path) {
                                   mergeContainer(target, user, path);
                                 })}},
    };
    for (const std::string& field : owned_pod_fields) spec_rules_[field] = owned_;
    for (const char* field : {"name", "image", "command", "args", "ports", "readinessProbe",
                              "livenessProbe", "startupProbe"}) {
      main_container_rules_[field] = owned_;
    }
    main_container_rules_["env"] = {kArray, mergeByKeyWith("name", owned_.merge)};
    main_container_rules_["envFrom"] = {kArray,
                                        [](json& target, const json& user, const std::string&) {
                                          for (const json& item : user) target.push_back(item);
                                        }};
    main_container_rules_["volumeMounts"] = {kArray, mergeByKeyWith("mountPath", owned_.merge)};
    main_container_rules_["securityContext"] = deep;
    main_container_rules_["resources"] = deep;
  }
  TemplateMerger(const TemplateMerger&) = delete;
  TemplateMerger& operator=(const TemplateMerger&) = delete;

  TemplateMergeResult merge(const json& generated, const json& fragment) {
    TemplateMergeResult result{generated, {}};
    if (fragment.is_null()) return result;
    if (!fragment.is_object()) {
      ignored_.push_back("template");
    } else {
      mergeObject(result.pod_template, fragment, "template", template_rules_, refused_);
    }
    result.ignored = std::move(ignored_);
    return result;
  }

 private:
  // Each field of `user` by its rule (`other` for a key without one).
  void mergeObject(json& target, const json& user, const std::string& path, const FieldRules& rules,
                   const FieldRule& other) {
    for (const auto& [key, value] : user.items()) {
      if (value.is_null()) continue;
      const auto found_rule = rules.find(key);
      const FieldRule& rule = found_rule != rules.end() ? found_rule->second : other;
      const std::string field_path = path + "." + key;
      if (rule.type && value.type() != *rule.type) {
        ignored_.push_back(field_path);
        continue;
      }
      // A field the generated template lacks is written only when the rule
      // gives it a value, so a refused field leaves no null behind.
      const auto found = target.find(key);
      json merged = found != target.end() ? *found : json();
      rule.merge(merged, value, field_path);
      if (merged.is_null()) continue;
      if ((merged.is_array() || merged.is_object()) && merged.empty()) {
        // The API server keeps no empty list or map (`tolerations: []`): a
        // desired one would never be found on the live object, and every
        // reconcile would apply it again.
        target.erase(key);
        continue;
      }
      target[key] = std::move(merged);
    }
  }

  FieldMerge mergeObjectWith(const FieldRules& rules, FieldRule other) {
    return [this, &rules, other = std::move(other)](json& target, const json& user,
                                                    const std::string& path) {
      mergeObject(target, user, path, rules, other);
    };
  }

  // Entries of `user` matched by `key` against the generated entries: a match
  // is merged by `merge_match`, any other entry appended as written. A second
  // user entry of one key is ignored (and reported): server-side apply
  // refuses a keyed list with two entries of one key, and a second merge
  // into a generated entry would silently overwrite the first.
  void mergeByKey(json& target, const json& user, const std::string& key, const std::string& path,
                  const FieldMerge& merge_match) {
    const size_t generated_count = target.is_array() ? target.size() : 0;
    std::set<std::string> seen;  // the user's keys so far
    for (size_t index = 0; index < user.size(); ++index) {
      const json& item = user[index];
      const auto id = item.is_object() ? item.find(key) : item.end();
      if (!item.is_object() || id == item.end() || !id->is_string()) {
        ignored_.push_back(keyedPath(path, std::to_string(index)));
        continue;
      }
      json* match = nullptr;
      for (size_t existing = 0; existing < generated_count && !match; ++existing) {
        json& entry = target[existing];
        if (entry.is_object() && entry.value(key, json()) == *id) match = &entry;
      }
      if (!seen.insert(id->get<std::string>()).second) {
        ignored_.push_back(keyedPath(path, std::to_string(index)));
      } else if (match) {
        merge_match(*match, item, keyedPath(path, id->get<std::string>()));
      } else {
        target.push_back(item);
      }
    }
  }

  FieldMerge mergeByKeyWith(std::string key, FieldMerge merge_match) {
    return [this, key = std::move(key), merge_match = std::move(merge_match)](
               json& target, const json& user, const std::string& path) {
      mergeByKey(target, user, key, path, merge_match);
    };
  }

  // The user's keys the generated map lacks are added; the others keep the
  // generated value.
  void mergeMapKeepingGenerated(json& target, const json& user, const std::string& path) {
    for (const auto& [key, value] : user.items()) {
      if (value.is_null()) continue;
      if (target.contains(key)) {
        keepGenerated(target[key], value, path + "." + key);
      } else {
        target[key] = value;
      }
    }
  }

  void mergeContainer(json& target, const json& user, const std::string& path) {
    if (target.value("name", json()) == main_container_) {
      mergeObject(target, user, path, main_container_rules_, as_written_);
    } else {
      keepGenerated(target, user, path);
    }
  }

  // The generated value stays; a different user value is listed.
  void keepGenerated(const json& target, const json& user, const std::string& path) {
    if (target != user) ignored_.push_back(path);
  }

  // The user's value as written; the controller's; refused.
  const FieldRule as_written_{
      std::nullopt, [](json& target, const json& user, const std::string&) { target = user; }};
  const FieldRule owned_{std::nullopt,
                         [this](json& target, const json& user, const std::string& path) {
                           keepGenerated(target, user, path);
                         }};
  const FieldRule refused_{std::nullopt, [this](json&, const json&, const std::string& path) {
                             ignored_.push_back(path);
                           }};
  const std::string main_container_;
  FieldRules template_rules_;
  FieldRules metadata_rules_;
  FieldRules spec_rules_;
  FieldRules main_container_rules_;
  std::vector<std::string> ignored_;
};

}  // namespace

TemplateMergeResult mergePodTemplate(const json& generated, const json& fragment,
                                     const std::string& main_container,
                                     const std::vector<std::string>& owned_pod_fields) {
  return TemplateMerger(main_container, owned_pod_fields).merge(generated, fragment);
}

}  // namespace tandem::spec
