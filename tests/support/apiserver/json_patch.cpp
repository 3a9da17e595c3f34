// Patch formats of the Kubernetes API. Strategic merge patch and server-side
// apply decide a list's merge key from the list's field name (and, for
// "ports", from the enclosing list), which is what the Kubernetes types
// declare for every field kubectl and the operator patch; lists not named
// here are atomic and replaced whole.
#include "tests/support/apiserver/json_patch.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

namespace tandem::testing {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------
// RFC 6901 JSON pointer

std::vector<std::string> parsePointer(const std::string& pointer, const std::string& what) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;
  if (pointer[0] != '/') {
    throw PatchError(what + " \"" + pointer +
                     "\" is not a JSON pointer: it must be empty or start with '/'");
  }
  std::string token;
  for (size_t i = 1; i <= pointer.size(); ++i) {
    if (i == pointer.size() || pointer[i] == '/') {
      tokens.push_back(token);
      token.clear();
      continue;
    }
    char c = pointer[i];
    if (c == '~') {
      char next = i + 1 < pointer.size() ? pointer[i + 1] : '\0';
      if (next == '0') {
        token += '~';
      } else if (next == '1') {
        token += '/';
      } else {
        throw PatchError(what + " \"" + pointer +
                         "\" has '~' not followed by 0 or 1 (the only escapes are ~0 and ~1)");
      }
      ++i;
      continue;
    }
    token += c;
  }
  return tokens;
}

std::string joinPointer(const std::vector<std::string>& tokens, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) out += "/" + tokens[i];
  return out;
}

// An array index: digits without a leading zero. nullopt for anything else.
std::optional<size_t> parseIndex(const std::string& token) {
  if (token.empty() || token.size() > 18) return std::nullopt;
  if (token.size() > 1 && token[0] == '0') return std::nullopt;
  size_t value = 0;
  for (char c : token) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<size_t>(c - '0');
  }
  return value;
}

// The value the pointer names; throws when any step does not exist.
json& resolve(json& document, const std::vector<std::string>& tokens, size_t count,
              const std::string& what) {
  json* current = &document;
  for (size_t i = 0; i < count; ++i) {
    const std::string& token = tokens[i];
    if (current->is_object()) {
      auto it = current->find(token);
      if (it == current->end()) {
        throw PatchError(what + ": " + joinPointer(tokens, i + 1) + " does not exist");
      }
      current = &*it;
    } else if (current->is_array()) {
      auto index = parseIndex(token);
      if (!index || *index >= current->size()) {
        throw PatchError(what + ": " + joinPointer(tokens, i + 1) + " is not an index of the " +
                         std::to_string(current->size()) + "-element array at " +
                         joinPointer(tokens, i));
      }
      current = &(*current)[*index];
    } else {
      throw PatchError(what + ": " + joinPointer(tokens, i) + " is a " + current->type_name() +
                       ", not an object or array, so " + joinPointer(tokens, i + 1) +
                       " does not exist");
    }
  }
  return *current;
}

void addAt(json& document, const std::vector<std::string>& tokens, json value,
           const std::string& what) {
  if (tokens.empty()) {
    document = std::move(value);
    return;
  }
  json& parent = resolve(document, tokens, tokens.size() - 1, what);
  const std::string& last = tokens.back();
  if (parent.is_object()) {
    parent[last] = std::move(value);
  } else if (parent.is_array()) {
    if (last == "-") {
      parent.push_back(std::move(value));
      return;
    }
    auto index = parseIndex(last);
    if (!index || *index > parent.size()) {
      throw PatchError(what + ": \"" + last + "\" is not a valid insertion index (0 to " +
                       std::to_string(parent.size()) + " or '-') for the array at " +
                       joinPointer(tokens, tokens.size() - 1));
    }
    parent.insert(parent.begin() + static_cast<std::ptrdiff_t>(*index), std::move(value));
  } else {
    throw PatchError(what + ": " + joinPointer(tokens, tokens.size() - 1) + " is a " +
                     parent.type_name() + ", not an object or array");
  }
}

json removeAt(json& document, const std::vector<std::string>& tokens, const std::string& what) {
  if (tokens.empty()) throw PatchError(what + ": cannot remove the whole document (path \"\")");
  json& parent = resolve(document, tokens, tokens.size() - 1, what);
  const std::string& last = tokens.back();
  if (parent.is_object()) {
    auto it = parent.find(last);
    if (it == parent.end()) {
      throw PatchError(what + ": " + joinPointer(tokens, tokens.size()) + " does not exist");
    }
    json removed = std::move(*it);
    parent.erase(it);
    return removed;
  }
  if (parent.is_array()) {
    auto index = parseIndex(last);
    if (!index || *index >= parent.size()) {
      throw PatchError(what + ": " + joinPointer(tokens, tokens.size()) +
                       " is not an index of the " + std::to_string(parent.size()) +
                       "-element array");
    }
    json removed = std::move(parent[*index]);
    parent.erase(parent.begin() + static_cast<std::ptrdiff_t>(*index));
    return removed;
  }
  throw PatchError(what + ": " + joinPointer(tokens, tokens.size() - 1) + " is a " +
                   parent.type_name() + ", not an object or array");
}

std::string stringMember(const json& operation, const char* name, const std::string& what) {
  auto it = operation.find(name);
  if (it == operation.end()) throw PatchError(what + " has no \"" + name + "\"");
  if (!it->is_string()) throw PatchError(what + "'s \"" + name + "\" must be a string");
  return it->get<std::string>();
}

// ---------------------------------------------------------------------------
// Merge keys (strategic merge patch and server-side apply)

enum class ListKind { kAtomic, kKeyed, kPrimitiveSet };

struct ListStrategy {
  ListKind kind = ListKind::kAtomic;
  std::string key;
};

// `field` is the list's field name; `context` the field name of the object
// that holds it (for an item of a list, that list's name; "" at the top).
ListStrategy listStrategy(const std::string& field, const std::string& context) {
  if (field == "containers" || field == "initContainers" || field == "ephemeralContainers" ||
      field == "env" || field == "volumes" || field == "imagePullSecrets" ||
      field == "resourceClaims" || field == "claims") {
    return {ListKind::kKeyed, "name"};
  }
  if (field == "ports") {
    bool in_container =
        context == "containers" || context == "initContainers" || context == "ephemeralContainers";
    if (in_container) return {ListKind::kKeyed, "containerPort"};
    // A Service's spec.ports; EndpointSlice ports (top level) are atomic.
    if (context == "spec") return {ListKind::kKeyed, "port"};
    return {};
  }
  if (field == "volumeMounts") return {ListKind::kKeyed, "mountPath"};
  if (field == "volumeDevices") return {ListKind::kKeyed, "devicePath"};
  if (field == "conditions") return {ListKind::kKeyed, "type"};
  if (field == "ownerReferences") return {ListKind::kKeyed, "uid"};
  if (field == "hostAliases") return {ListKind::kKeyed, "ip"};
  if (field == "topologySpreadConstraints") return {ListKind::kKeyed, "topologyKey"};
  if (field == "finalizers") return {ListKind::kPrimitiveSet, ""};
  return {};
}

// Index of the item of `list` whose `key` equals `value`, or nullopt.
std::optional<size_t> findByKey(const json& list, const std::string& key, const json& value) {
  for (size_t i = 0; i < list.size(); ++i) {
    const json& item = list[i];
    if (item.is_object()) {
      auto it = item.find(key);
      if (it != item.end() && *it == value) return i;
    }
  }
  return std::nullopt;
}

const json& keyOf(const json& item, const std::string& key, const std::string& field) {
  if (!item.is_object()) {
    throw PatchError("items of \"" + field + "\" must be objects (merged by \"" + key +
                     "\"), got a " + item.type_name());
  }
  auto it = item.find(key);
  if (it == item.end()) {
    throw PatchError("an item of \"" + field + "\" has no merge key \"" + key + "\"");
  }
  return *it;
}

// ---------------------------------------------------------------------------
// Strategic merge patch

constexpr std::string_view kPatchDirective = "$patch";
constexpr std::string_view kRetainKeys = "$retainKeys";
constexpr std::string_view kSetElementOrder = "$setElementOrder/";
constexpr std::string_view kDeleteFromPrimitiveList = "$deleteFromPrimitiveList/";

json stripDirectives(json value);

json stripDirectivesFromList(json list) {
  json out = json::array();
  for (auto& item : list) {
    if (item.is_object() && item.contains(kPatchDirective)) continue;
    out.push_back(stripDirectives(std::move(item)));
  }
  return out;
}

// A patch value stored as is (no target to merge into) loses its directives.
json stripDirectives(json value) {
  if (value.is_object()) {
    json out = json::object();
    for (auto& [key, member] : value.items()) {
      if (!key.empty() && key[0] == '$') continue;
      if (member.is_null()) continue;
      out[key] = stripDirectives(std::move(member));
    }
    return out;
  }
  if (value.is_array()) return stripDirectivesFromList(std::move(value));
  return value;
}

json mergeMap(json target, const json& patch, const std::string& context);

json mergeList(json target, const json& patch, const std::string& field,
               const std::string& context) {
  ListStrategy strategy = listStrategy(field, context);
  if (!target.is_array()) target = json::array();
  // {"$patch": "replace"} anywhere in the patch list replaces the whole list.
  for (const auto& item : patch) {
    if (item.is_object()) {
      auto it = item.find(kPatchDirective);
      if (it != item.end() && *it == "replace") return stripDirectivesFromList(patch);
    }
  }
  if (strategy.kind == ListKind::kAtomic) return stripDirectivesFromList(patch);
  if (strategy.kind == ListKind::kPrimitiveSet) {
    for (const auto& item : patch) {
      if (std::find(target.begin(), target.end(), item) == target.end()) target.push_back(item);
    }
    return target;
  }
  for (const auto& item : patch) {
    const json& key_value = keyOf(item, strategy.key, field);
    auto index = findByKey(target, strategy.key, key_value);
    auto directive = item.find(kPatchDirective);
    if (directive != item.end()) {
      if (*directive == "delete") {
        if (index) target.erase(target.begin() + static_cast<std::ptrdiff_t>(*index));
        continue;
      }
      if (*directive != "merge") {
        throw PatchError("$patch in an item of \"" + field + "\" must be delete, replace or " +
                         "merge, got " + directive->dump());
      }
    }
    if (index) {
      target[*index] = mergeMap(std::move(target[*index]), item, field);
    } else {
      target.push_back(mergeMap(json::object(), item, field));
    }
  }
  return target;
}

// Reorders `list` as `order` says: the items it names first, in its order,
// then the others in their current order.
json applyElementOrder(const json& list, const json& order, const std::string& field,
                       const std::string& context) {
  if (!list.is_array() || !order.is_array()) return list;
  ListStrategy strategy = listStrategy(field, context);
  json out = json::array();
  std::vector<bool> taken(list.size(), false);
  for (const auto& wanted : order) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (taken[i]) continue;
      bool same = strategy.kind == ListKind::kKeyed
                      ? (wanted.is_object() && list[i].is_object() &&
                         wanted.value(strategy.key, json()) == list[i].value(strategy.key, json()))
                      : wanted == list[i];
      if (same) {
        taken[i] = true;
        out.push_back(list[i]);
        break;
      }
    }
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (!taken[i]) out.push_back(list[i]);
  }
  return out;
}

json mergeMap(json target, const json& patch, const std::string& context) {
  if (!patch.is_object()) return patch;
  if (!target.is_object()) target = json::object();
  auto directive = patch.find(kPatchDirective);
  if (directive != patch.end()) {
    if (*directive == "replace") return stripDirectives(patch);
    if (*directive == "delete") return json();  // the caller drops the field
    if (*directive != "merge") {
      throw PatchError("$patch must be delete, replace or merge, got " + directive->dump());
    }
  }
  for (const auto& [key, value] : patch.items()) {
    if (!key.empty() && key[0] == '$') continue;
    if (value.is_null()) {
      target.erase(key);
      continue;
    }
    auto existing = target.find(key);
    json current = existing != target.end() ? std::move(*existing) : json();
    json merged;
    if (value.is_object()) {
      auto nested = value.find(kPatchDirective);
      if (nested != value.end() && *nested == "delete") {
        target.erase(key);
        continue;
      }
      merged = mergeMap(std::move(current), value, key);
    } else if (value.is_array()) {
      merged = mergeList(std::move(current), value, key, context);
    } else {
      merged = value;
    }
    target[key] = std::move(merged);
  }
  // Directives that act on the merged result.
  for (const auto& [key, value] : patch.items()) {
    std::string_view name = key;
    if (name.substr(0, kDeleteFromPrimitiveList.size()) == kDeleteFromPrimitiveList) {
      std::string field(name.substr(kDeleteFromPrimitiveList.size()));
      auto it = target.find(field);
      if (it == target.end() || !it->is_array()) continue;
      if (!value.is_array()) throw PatchError(key + " must be a list of values to delete");
      json kept = json::array();
      for (const auto& item : *it) {
        if (std::find(value.begin(), value.end(), item) == value.end()) kept.push_back(item);
      }
      *it = std::move(kept);
    } else if (name.substr(0, kSetElementOrder.size()) == kSetElementOrder) {
      std::string field(name.substr(kSetElementOrder.size()));
      auto it = target.find(field);
      if (it != target.end()) *it = applyElementOrder(*it, value, field, context);
    }
  }
  auto retain = patch.find(kRetainKeys);
  if (retain != patch.end()) {
    if (!retain->is_array()) throw PatchError("$retainKeys must be a list of field names");
    for (auto it = target.begin(); it != target.end();) {
      if (std::find(retain->begin(), retain->end(), it.key()) == retain->end()) {
        it = target.erase(it);
      } else {
        ++it;
      }
    }
  }
  return target;
}

// ---------------------------------------------------------------------------
// Server-side apply

json applyMergeObject(json live, const json& applied, const std::string& context);

json applyMergeList(json live, const json& applied, const std::string& field,
                    const std::string& context) {
  ListStrategy strategy = listStrategy(field, context);
  if (strategy.kind == ListKind::kAtomic || !live.is_array()) return applied;
  if (strategy.kind == ListKind::kPrimitiveSet) {
    for (const auto& item : applied) {
      if (std::find(live.begin(), live.end(), item) == live.end()) live.push_back(item);
    }
    return live;
  }
  for (const auto& item : applied) {
    const json& key_value = keyOf(item, strategy.key, field);
    auto index = findByKey(live, strategy.key, key_value);
    if (index) {
      live[*index] = applyMergeObject(std::move(live[*index]), item, field);
    } else {
      live.push_back(item);
    }
  }
  return live;
}

json applyMergeObject(json live, const json& applied, const std::string& context) {
  if (!applied.is_object()) return applied;
  if (!live.is_object()) live = json::object();
  for (const auto& [key, value] : applied.items()) {
    if (value.is_null()) {
      live.erase(key);
      continue;
    }
    auto existing = live.find(key);
    json current = existing != live.end() ? std::move(*existing) : json();
    if (value.is_array()) {
      live[key] = applyMergeList(std::move(current), value, key, context);
    } else if (value.is_object()) {
      live[key] = applyMergeObject(std::move(current), value, key);
    } else {
      live[key] = value;
    }
  }
  return live;
}

// Removes from `live` what `previous` applied and `applied` no longer names.
void pruneUnapplied(json& live, const json& previous, const json& applied,
                    const std::string& context) {
  if (!live.is_object() || !previous.is_object()) return;
  for (const auto& [key, before] : previous.items()) {
    auto now = applied.is_object() ? applied.find(key) : applied.end();
    bool still_applied = applied.is_object() && now != applied.end();
    if (!still_applied) {
      live.erase(key);
      continue;
    }
    auto it = live.find(key);
    if (it == live.end()) continue;
    if (before.is_object() && now->is_object()) {
      pruneUnapplied(*it, before, *now, key);
      continue;
    }
    if (!before.is_array() || !now->is_array() || !it->is_array()) continue;
    ListStrategy strategy = listStrategy(key, context);
    if (strategy.kind == ListKind::kPrimitiveSet) {
      json kept = json::array();
      for (const auto& item : *it) {
        bool dropped = std::find(before.begin(), before.end(), item) != before.end() &&
                       std::find(now->begin(), now->end(), item) == now->end();
        if (!dropped) kept.push_back(item);
      }
      *it = std::move(kept);
    } else if (strategy.kind == ListKind::kKeyed) {
      for (const auto& old_item : before) {
        if (!old_item.is_object() || !old_item.contains(strategy.key)) continue;
        const json& key_value = old_item[strategy.key];
        auto live_index = findByKey(*it, strategy.key, key_value);
        if (!live_index) continue;
        auto new_index = findByKey(*now, strategy.key, key_value);
        if (!new_index) {
          it->erase(it->begin() + static_cast<std::ptrdiff_t>(*live_index));
        } else {
          pruneUnapplied((*it)[*live_index], old_item, (*now)[*new_index], key);
        }
      }
    }
  }
}

}  // namespace

json jsonMergePatch(json target, const json& patch) {
  if (!patch.is_object()) return patch;
  if (!target.is_object()) target = json::object();
  for (const auto& [key, value] : patch.items()) {
    if (value.is_null()) {
      target.erase(key);
      continue;
    }
    auto existing = target.find(key);
    json current = existing != target.end() ? std::move(*existing) : json();
    target[key] = jsonMergePatch(std::move(current), value);
  }
  return target;
}

json jsonPatch(json target, const json& operations) {
  if (!operations.is_array()) {
    throw PatchError(std::string("a JSON patch must be a list of operations, got a ") +
                     operations.type_name());
  }
  for (size_t i = 0; i < operations.size(); ++i) {
    const json& operation = operations[i];
    std::string what = "operation " + std::to_string(i);
    if (!operation.is_object()) {
      throw PatchError(what + " must be an object with \"op\" and \"path\", got a " +
                       operation.type_name());
    }
    std::string op = stringMember(operation, "op", what);
    what += " (" + op + ")";
    auto path = parsePointer(stringMember(operation, "path", what), what + " path");
    auto value = [&]() -> const json& {
      auto it = operation.find("value");
      if (it == operation.end()) throw PatchError(what + " has no \"value\"");
      return *it;
    };
    if (op == "add") {
      addAt(target, path, value(), what);
    } else if (op == "remove") {
      removeAt(target, path, what);
    } else if (op == "replace") {
      json& existing = resolve(target, path, path.size(), what);
      existing = value();
    } else if (op == "move" || op == "copy") {
      std::string from_text = stringMember(operation, "from", what);
      auto from = parsePointer(from_text, what + " from");
      if (op == "move") {
        bool into_itself =
            from.size() < path.size() && std::equal(from.begin(), from.end(), path.begin());
        if (into_itself) {
          throw PatchError(what + ": cannot move " + from_text + " into its own child");
        }
        json moved = removeAt(target, from, what);
        addAt(target, path, std::move(moved), what);
      } else {
        json copied = resolve(target, from, from.size(), what);
        addAt(target, path, std::move(copied), what);
      }
    } else if (op == "test") {
      const json& actual = resolve(target, path, path.size(), what);
      if (actual != value()) {
        throw PatchError(what + " failed: " + joinPointer(path, path.size()) + " is " +
                         actual.dump() + ", not " + value().dump());
      }
    } else {
      throw PatchError(what + ": unknown op; accepted: add, remove, replace, move, copy, test");
    }
  }
  return target;
}

json strategicMergePatch(json target, const json& patch) {
  if (!patch.is_object()) {
    throw PatchError(std::string("a strategic merge patch must be an object, got a ") +
                     patch.type_name());
  }
  json result = mergeMap(std::move(target), patch, "");
  if (result.is_null()) throw PatchError("$patch: delete cannot delete the whole object");
  return result;
}

json serverSideApply(json live, const json& applied, json& previously_applied) {
  if (!applied.is_object()) {
    throw PatchError(std::string("an apply configuration must be an object, got a ") +
                     applied.type_name());
  }
  if (previously_applied.is_object()) pruneUnapplied(live, previously_applied, applied, "");
  json result = applyMergeObject(std::move(live), applied, "");
  previously_applied = applied;
  return result;
}

}  // namespace tandem::testing
