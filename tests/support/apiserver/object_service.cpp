#include "tests/support/apiserver/object_service.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>
#include <regex>
#include <stdexcept>

#include "tests/support/apiserver/json_patch.h"
#include "tests/support/apiserver/pod_security.h"
#include "tests/support/apiserver/schema.h"
#include "tests/support/apiserver/yaml_json.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const Json& metadataOf(const Json& object) {
  static const Json kEmpty = Json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string metaString(const Json& object, const std::string& field) {
  const Json& metadata = metadataOf(object);
  auto it = metadata.find(field);
  return it != metadata.end() && it->is_string() ? it->get<std::string>() : "";
}

// What generation tracks: everything but metadata (and status when it is a subresource).
Json generationView(Json object, bool has_status) {
  object.erase("metadata");
  if (has_status) object.erase("status");
  return object;
}

// Equal except for the resourceVersion (a no-op update).
bool sameObject(Json a, Json b) {
  a["metadata"].erase("resourceVersion");
  b["metadata"].erase("resourceVersion");
  return a == b;
}

std::string pointerOf(const std::string& dotted_path) {
  std::string pointer = dotted_path;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return pointer;
}

bool validName(const std::string& name) {
  static const std::regex kSubdomain(
      "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return !name.empty() && name.size() <= 253 && std::regex_match(name, kSubdomain);
}

bool validServiceName(const std::string& name) {
  static const std::regex kLabel("[a-z]([-a-z0-9]*[a-z0-9])?");
  return name.size() <= 63 && std::regex_match(name, kLabel);
}

std::string mediaType(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  type.erase(std::remove(type.begin(), type.end(), ' '), type.end());
  return type;
}

// CRD objects: the checks the API server's CRD validation makes that matter
// here, and the status it reports once the names are accepted.
std::optional<ApiError> prepareCrd(const KindInfo& kind, Json& crd) {
  const std::string name = metaString(crd, "name");
  const Json spec = crd.value("spec", Json::object());
  const Json names = spec.value("names", Json::object());
  std::string group = spec.value("group", "");
  std::string plural = names.value("plural", "");
  if (group.empty()) return invalid(kind, name, "spec.group", "Required value");
  if (plural.empty()) return invalid(kind, name, "spec.names.plural", "Required value");
  if (names.value("kind", "").empty())
    return invalid(kind, name, "spec.names.kind", "Required value");
  if (name != plural + "." + group) {
    return invalid(kind, name, "metadata.name",
                   "Invalid value: \"" + name + "\": must be spec.names.plural+\".\"+spec.group");
  }
  if (!spec.contains("versions") || !spec["versions"].is_array() || spec["versions"].empty()) {
    return invalid(kind, name, "spec.versions",
                   "Invalid value: null: must have exactly one version marked as storage version");
  }
  for (size_t i = 0; i < spec["versions"].size(); ++i) {
    const Json& version = spec["versions"][i];
    if (!version.is_object() || !version.contains("schema")) continue;
    auto causes =
        invalidSchemaPatterns(version["schema"].value("openAPIV3Schema", Json()),
                              "spec.versions[" + std::to_string(i) + "].schema.openAPIV3Schema");
    if (!causes.empty()) return invalidFields(kind, name, causes);
  }
  Json accepted = names;
  if (!accepted.contains("singular")) {
    std::string singular = names.value("kind", "");
    for (char& c : singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    accepted["singular"] = singular;
  }
  if (!accepted.contains("listKind")) accepted["listKind"] = names.value("kind", "") + "List";
  std::string storage;
  for (const Json& version : spec["versions"]) {
    if (version.value("storage", false)) storage = version.value("name", "");
  }
  std::string now = nowTimestamp();
  auto condition = [&](const char* type, const char* reason, const char* message) {
    return Json{{"type", type},
                {"status", "True"},
                {"lastTransitionTime", now},
                {"reason", reason},
                {"message", message}};
  };
  crd["status"] = {
      {"acceptedNames", accepted},
      {"conditions", Json::array({condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                                  condition("Established", "InitialNamesAccepted",
                                            "the initial names have been accepted")})},
      {"storedVersions", Json::array({storage})}};
  return std::nullopt;
}

// Defaults the built-in kinds get from the real server that clients read back.
void builtinDefaults(const KindInfo& kind, Json& object, bool creating) {
  if (kind.kind == "Deployment") {
    Json& spec = object["spec"];
    if (!spec.is_object()) spec = Json::object();
    if (!spec.contains("replicas")) spec["replicas"] = 1;
    if (!spec.contains("revisionHistoryLimit")) spec["revisionHistoryLimit"] = 10;
    if (!spec.contains("progressDeadlineSeconds")) spec["progressDeadlineSeconds"] = 600;
    if (!spec.contains("strategy")) {
      spec["strategy"] = {{"type", "RollingUpdate"},
                          {"rollingUpdate", {{"maxUnavailable", "25%"}, {"maxSurge", "25%"}}}};
    }
  } else if (kind.kind == "Namespace" && creating) {
    object["spec"] = {{"finalizers", Json::array({"kubernetes"})}};
    object["status"] = {{"phase", "Active"}};
  } else if (kind.kind == "Service" && creating) {
    Json& spec = object["spec"];
    if (!spec.is_object()) spec = Json::object();
    if (!spec.contains("type")) spec["type"] = "ClusterIP";
    if (!spec.contains("clusterIP")) {
      static std::atomic<int> next_ip{10};
      int n = next_ip++;
      spec["clusterIP"] =
          "10.96." + std::to_string((n / 250) % 250) + "." + std::to_string(n % 250 + 1);
      spec["clusterIPs"] = Json::array({spec["clusterIP"]});
    }
    if (spec.contains("ports") && spec["ports"].is_array()) {
      for (Json& port : spec["ports"]) {
        if (!port.contains("protocol")) port["protocol"] = "TCP";
        if (!port.contains("targetPort") && port.contains("port"))
          port["targetPort"] = port["port"];
      }
    }
  }
}

// Pod Security Admission (pod_security.h) of a create (`old` null) or an
// update of the main resource: an error refusing it, or nothing (its
// warnings appended). Pods are checked against their namespace's enforce
// level (an update only when it changes an image or adds a container, as
// the plugin); Deployments only get the warn level's warnings about their
// template; Namespaces' pod-security labels must be valid, and tightening
// the enforce level warns about the pods already there.
std::optional<ApiError> admitPodSecurity(const Store& store, const KindRegistry& registry,
                                         const KindInfo& kind, const Json& object, const Json* old,
                                         std::vector<std::string>& warnings) {
  if (!kind.builtin) return std::nullopt;
  std::optional<KindInfo> namespace_kind = registry.byKind("v1", "Namespace");
  auto namespaceOf = [&](const Json& namespaced) {
    return store.get(resourceKey(*namespace_kind), "", metaString(namespaced, "namespace"));
  };
  if (kind.kind == "Pod" && kind.group.empty()) {
    if (old != nullptr && !isSignificantPodUpdate(object, *old)) return std::nullopt;
    PodSecurityDecision decision = admitPod(object, namespaceOf(object));
    if (decision.error) return decision.error;
    warnings.insert(warnings.end(), decision.warnings.begin(), decision.warnings.end());
  } else if (kind.kind == "Deployment" && kind.group == "apps") {
    auto spec = object.find("spec");
    Json pod_template =
        spec != object.end() && spec->is_object() ? spec->value("template", Json()) : Json();
    std::vector<std::string> found = podTemplateWarnings(pod_template, namespaceOf(object));
    warnings.insert(warnings.end(), found.begin(), found.end());
  } else if (kind.kind == "Namespace" && kind.group.empty()) {
    auto errors = podSecurityLabelErrors(object);
    // An update may keep labels that were already invalid, as they were.
    if (!errors.empty() && (old == nullptr || podSecurityLabelErrors(*old) != errors)) {
      return invalidFields(kind, metaString(object, "name"), errors);
    }
    if (old != nullptr) {
      std::optional<KindInfo> pod_kind = registry.byKind("v1", "Pod");
      std::vector<Json> pods = store.list(resourceKey(*pod_kind), metaString(object, "name")).items;
      std::vector<std::string> found = namespaceUpdateWarnings(object, *old, pods);
      warnings.insert(warnings.end(), found.begin(), found.end());
    }
  }
  return std::nullopt;
}

// The one rule of ValidateSecurityContext a pod template meets here: a
// container may not both forbid privilege escalation and be privileged (or
// add CAP_SYS_ADMIN, spelled so; the server compares that string). For a
// Pod (spec) or a Deployment (spec.template.spec); nothing for others.
std::optional<ApiError> checkSecurityContexts(const KindInfo& kind, const Json& object) {
  std::string prefix;
  const Json* pod_spec = nullptr;
  const Json spec = object.value("spec", Json::object());
  if (kind.kind == "Pod" && kind.group.empty()) {
    prefix = "spec";
    pod_spec = &spec;
  } else if (kind.kind == "Deployment" && kind.group == "apps") {
    prefix = "spec.template.spec";
    if (spec.contains("template") && spec["template"].contains("spec")) {
      pod_spec = &spec["template"]["spec"];
    }
  }
  if (pod_spec == nullptr || !pod_spec->is_object()) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> causes;
  for (const char* list : {"initContainers", "containers"}) {
    const Json containers = pod_spec->value(list, Json::array());
    if (!containers.is_array()) continue;
    for (size_t i = 0; i < containers.size(); ++i) {
      if (!containers[i].is_object()) continue;
      const Json context = containers[i].value("securityContext", Json::object());
      if (!context.is_object() || !context.contains("allowPrivilegeEscalation") ||
          context["allowPrivilegeEscalation"] != false) {
        continue;
      }
      const std::string field = prefix + "." + list + "[" + std::to_string(i) + "].securityContext";
      if (context.contains("privileged") && context["privileged"] == true) {
        causes.emplace_back(field, "Invalid value: " + context.dump() +
                                       ": cannot set `allowPrivilegeEscalation` to false and "
                                       "`privileged` to true");
      }
      const Json capabilities = context.value("capabilities", Json::object());
      const Json added =
          capabilities.is_object() ? capabilities.value("add", Json::array()) : Json::array();
      for (const Json& cap : added.is_array() ? added : Json::array()) {
        if (cap == "CAP_SYS_ADMIN") {
          causes.emplace_back(field, "Invalid value: " + context.dump() +
                                         ": cannot set `allowPrivilegeEscalation` to false and "
                                         "`capabilities.Add` CAP_SYS_ADMIN");
        }
      }
    }
  }
  if (causes.empty()) return std::nullopt;
  return invalidFields(kind, metaString(object, "name"), causes);
}

std::string continueToken(uint64_t version, const std::string& key) {
  return base64Encode(Json{{"rv", version}, {"start", key}}.dump());
}

}  // namespace

std::string newUid() {
  std::string hex = randomText("0123456789abcdef", 32);
  hex[12] = '4';
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20, 12);
}

std::string randomText(const std::string& alphabet, size_t length) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string text;
  for (size_t i = 0; i < length; ++i) text.push_back(alphabet[pick(generator)]);
  return text;
}

std::string timestampOf(std::chrono::system_clock::time_point when) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string nowTimestamp() { return timestampOf(std::chrono::system_clock::now()); }

Json scaleOf(const KindInfo& kind, const Json& object) {
  Json replicas = object.value(
      Json::json_pointer(pointerOf(kind.scale.value("specReplicasPath", ".spec.replicas"))),
      Json(0));
  Json status_replicas = 0;
  std::string status_path = kind.scale.value("statusReplicasPath", "");
  if (!status_path.empty())
    status_replicas = object.value(Json::json_pointer(pointerOf(status_path)), Json(0));
  Json scale = {{"kind", "Scale"},
                {"apiVersion", "autoscaling/v1"},
                {"metadata",
                 {{"name", metaString(object, "name")},
                  {"uid", metaString(object, "uid")},
                  {"resourceVersion", metaString(object, "resourceVersion")},
                  {"creationTimestamp", metaString(object, "creationTimestamp")}}},
                {"spec", {{"replicas", replicas}}},
                {"status", {{"replicas", status_replicas}}}};
  if (kind.namespaced) scale["metadata"]["namespace"] = metaString(object, "namespace");
  std::string selector_path = kind.scale.value("labelSelectorPath", "");
  if (!selector_path.empty()) {
    Json selector = object.value(Json::json_pointer(pointerOf(selector_path)), Json(nullptr));
    std::string text = Selector::textOfLabelSelector(selector);
    if (!text.empty()) scale["status"]["selector"] = text;
  }
  return scale;
}

ObjectService::ObjectService(Store& store, KindRegistry& registry)
    : store_(store), registry_(registry) {}

void ObjectService::injectConflicts(int count, const std::string& kind) {
  std::lock_guard<std::mutex> lock(conflicts_mutex_);
  injected_conflicts_ = count;
  injected_conflict_kind_ = kind;
}

bool ObjectService::takeInjectedConflict(const KindInfo& kind) {
  std::lock_guard<std::mutex> lock(conflicts_mutex_);
  if (injected_conflicts_ <= 0) return false;
  if (!injected_conflict_kind_.empty() && injected_conflict_kind_ != kind.kind) return false;
  --injected_conflicts_;
  return true;
}

void ObjectService::setDeploymentHook(std::function<void(const Json&)> hook) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  deployment_hook_ = std::move(hook);
}

std::optional<KindInfo> ObjectService::kindOfResource(const std::string& resource) const {
  for (const KindInfo& kind : registry_.all()) {
    if (resourceKey(kind) == resource) return kind;
  }
  return std::nullopt;
}

ApiResult ObjectService::get(const KindInfo& kind, const std::string& ns,
                             const std::string& name) const {
  std::optional<Json> object = store_.get(resourceKey(kind), kind.namespaced ? ns : "", name);
  if (!object) return ApiResult::failure(notFound(kind, name));
  return ApiResult{200, *object, std::nullopt, {}};
}

ApiResult ObjectService::getScale(const KindInfo& kind, const std::string& ns,
                                  const std::string& name) const {
  ApiResult result = get(kind, ns, name);
  if (result.ok()) result.body = scaleOf(kind, result.body);
  return result;
}

ApiResult ObjectService::list(const KindInfo& kind, const std::string& ns,
                              const ListOptions& options) const {
  std::string after_key;
  if (!options.continue_token.empty()) {
    bool ok = false;
    std::string decoded = base64Decode(options.continue_token, ok);
    Json token = ok ? Json::parse(decoded, nullptr, false) : Json();
    if (!token.is_object() || !token.contains("start") || !token.contains("rv")) {
      return ApiResult::failure(badRequest(
          "invalid continue token: it must be the metadata.continue of an earlier list"));
    }
    if (token["rv"].get<uint64_t>() < store_.compactedVersion()) {
      return ApiResult::failure(
          expired("The provided continue parameter is too old to display a consistent list result. "
                  "You can start a new list without the continue parameter."));
    }
    after_key = token["start"].get<std::string>();
  }
  Store::Snapshot snapshot = store_.list(resourceKey(kind), kind.namespaced ? ns : "", after_key);
  Json items = Json::array();
  std::string last_key;
  int64_t remaining = 0;
  for (const Json& object : snapshot.items) {
    if (options.labels && !options.labels->matches(object)) continue;
    if (options.fields && !options.fields->matches(object)) continue;
    if (options.limit > 0 && static_cast<int64_t>(items.size()) >= options.limit) {
      ++remaining;
      continue;
    }
    items.push_back(object);
    last_key = objectKey(object);
  }
  Json metadata = {{"resourceVersion", std::to_string(snapshot.resource_version)}};
  if (remaining > 0) {
    metadata["continue"] = continueToken(snapshot.resource_version, last_key);
    metadata["remainingItemCount"] = remaining;
  }
  Json body = {{"kind", kind.list_kind},
               {"apiVersion", kind.apiVersion()},
               {"metadata", metadata},
               {"items", items}};
  return ApiResult{200, body, std::nullopt, {}};
}

std::optional<ApiError> ObjectService::checkCustomObject(const KindInfo& kind, Json& object,
                                                         const WriteOptions& options,
                                                         std::vector<std::string>& warnings) const {
  if (kind.builtin || !kind.schema.is_object()) return std::nullopt;
  const std::string name = metaString(object, "name");
  std::vector<std::string> unknown =
      unknownSchemaFields(object, kind.schema, options.field_validation != "Strict");
  if (!unknown.empty() && options.field_validation == "Strict") {
    std::string text;
    for (const std::string& field : unknown) {
      text += (text.empty() ? "" : ", ") + std::string("unknown field \"") + field + "\"";
    }
    return badRequest(kind.kind + " in version \"" + kind.version + "\" cannot be handled as a " +
                      kind.kind + ": strict decoding error: " + text);
  }
  if (options.field_validation == "Warn") {
    for (const std::string& field : unknown) warnings.push_back("unknown field \"" + field + "\"");
  }
  applySchemaDefaults(object, kind.schema);
  auto causes = validateAgainstSchema(object, kind.schema);
  if (!causes.empty()) return invalidFields(kind, name, causes);
  return std::nullopt;
}

ApiResult ObjectService::create(const KindInfo& kind, const std::string& ns, Json body,
                                const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  return createLocked(kind, ns, std::move(body), options);
}

ApiResult ObjectService::createLocked(const KindInfo& kind, const std::string& ns, Json body,
                                      const WriteOptions& options) {
  if (!body.is_object()) {
    return ApiResult::failure(
        badRequest("the body of a create must be a " + kind.kind + " object"));
  }
  if (body.contains("apiVersion") && body["apiVersion"] != kind.apiVersion()) {
    return ApiResult::failure(
        badRequest("the API version in the data (" + body["apiVersion"].dump() +
                   ") does not match the expected API version (" + kind.apiVersion() + ")"));
  }
  if (body.contains("kind") && body["kind"] != kind.kind) {
    return ApiResult::failure(badRequest("the kind in the data (" + body["kind"].dump() +
                                         ") does not match the expected kind (" + kind.kind + ")"));
  }
  body["apiVersion"] = kind.apiVersion();
  body["kind"] = kind.kind;
  if (!body.contains("metadata") || !body["metadata"].is_object())
    body["metadata"] = Json::object();
  Json& metadata = body["metadata"];
  if (kind.namespaced) {
    std::string given = metaString(body, "namespace");
    if (!given.empty() && !ns.empty() && given != ns) {
      return ApiResult::failure(badRequest(
          "the namespace of the provided object does not match the namespace sent on the request"));
    }
    metadata["namespace"] = ns.empty() ? (given.empty() ? "default" : given) : ns;
  } else {
    metadata.erase("namespace");
  }
  std::string name = metaString(body, "name");
  if (name.empty()) {
    std::string prefix = metaString(body, "generateName");
    if (prefix.empty()) {
      return ApiResult::failure(
          invalid(kind, "", "metadata.name", "Required value: name or generateName is required"));
    }
    name = prefix + randomText("bcdfghjklmnpqrstvwxz2456789", 5);
    metadata["name"] = name;
  }
  if (!validName(name)) {
    return ApiResult::failure(invalid(
        kind, name, "metadata.name",
        "Invalid value: \"" + name +
            "\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
            "characters, '-' or '.', and must start and end with an alphanumeric character"));
  }
  // Services are named by DNS-1035 labels (ValidateServiceName): a letter
  // first, no dots, at most 63 characters.
  if (kind.kind == "Service" && !validServiceName(name)) {
    return ApiResult::failure(invalid(
        kind, name, "metadata.name",
        "Invalid value: \"" + name +
            "\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character"));
  }
  std::vector<std::string> warnings;
  if (!options.admin) {
    if (auto error = checkCustomObject(kind, body, options, warnings)) {
      return ApiResult::failure(*error);
    }
    if (kind.has_status) body.erase("status");
  } else if (!kind.builtin && kind.schema.is_object()) {
    applySchemaDefaults(body, kind.schema);
  }
  builtinDefaults(kind, body, true);
  if (auto error = checkSecurityContexts(kind, body)) return ApiResult::failure(*error);
  if (kind.kind == "CustomResourceDefinition" && kind.group == "apiextensions.k8s.io") {
    if (auto error = prepareCrd(kind, body)) return ApiResult::failure(*error);
  }
  // Validating admission: after validation, before the object is stored
  // (dry runs included); administrators' writes skip it.
  if (!options.admin) {
    if (auto error = admitPodSecurity(store_, registry_, kind, body, nullptr, warnings)) {
      return ApiResult::failure(*error);
    }
  }
  const std::string object_ns = kind.namespaced ? metaString(body, "namespace") : "";
  if (store_.get(resourceKey(kind), object_ns, name)) {
    return ApiResult::failure(alreadyExists(kind, name));
  }
  metadata["uid"] = newUid();
  metadata["creationTimestamp"] = nowTimestamp();
  metadata["generation"] = 1;
  metadata.erase("resourceVersion");
  metadata.erase("deletionTimestamp");
  if (options.dry_run) return ApiResult{201, body, std::nullopt, warnings};
  Json stored = store_.create(resourceKey(kind), body);
  if (kind.kind == "CustomResourceDefinition" && kind.group == "apiextensions.k8s.io") {
    registry_.registerCrd(stored);
  }
  if (kind.kind == "Deployment" && kind.group == "apps" && deployment_hook_) {
    deployment_hook_(stored);
    stored = store_.get(resourceKey(kind), object_ns, name).value_or(stored);
  }
  return ApiResult{201, stored, std::nullopt, warnings};
}

ApiResult ObjectService::update(const KindInfo& kind, const std::string& ns,
                                const std::string& name, const std::string& subresource, Json body,
                                const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  if (!body.is_object()) {
    return ApiResult::failure(badRequest("the body of an update must be an object"));
  }
  std::string body_name = metaString(body, "name");
  if (!body_name.empty() && body_name != name) {
    return ApiResult::failure(badRequest("the name of the object (" + body_name +
                                         ") does not match the name on the URL (" + name + ")"));
  }
  std::optional<Json> old = store_.get(resourceKey(kind), kind.namespaced ? ns : "", name);
  if (!old) return ApiResult::failure(notFound(kind, name));
  if (subresource == "scale") {
    if (kind.scale.is_null()) return ApiResult::failure(notFoundPath(kind.plural + "/scale"));
    std::string version = metaString(body, "resourceVersion");
    if (!version.empty() && version != metaString(*old, "resourceVersion")) {
      return ApiResult::failure(conflict(kind, name));
    }
    Json replicas = body.value("spec", Json::object()).value("replicas", Json(0));
    if (!replicas.is_number_integer() || replicas.get<int64_t>() < 0) {
      KindInfo scale_kind;
      scale_kind.group = "autoscaling";
      scale_kind.version = "v1";
      scale_kind.kind = "Scale";
      return ApiResult::failure(
          invalid(scale_kind, name, "spec.replicas",
                  "Invalid value: " + replicas.dump() + ": must be greater than or equal to 0"));
    }
    Json candidate = *old;
    candidate[Json::json_pointer(
        pointerOf(kind.scale.value("specReplicasPath", ".spec.replicas")))] = replicas;
    ApiResult result = updateLocked(kind, *old, "scale", candidate, options);
    if (result.ok()) result.body = scaleOf(kind, result.body);
    return result;
  }
  if (!body.contains("metadata") || !body["metadata"].is_object())
    body["metadata"] = Json::object();
  return updateLocked(kind, *old, subresource, std::move(body), options);
}

ApiResult ObjectService::updateLocked(const KindInfo& kind, const Json& old,
                                      const std::string& subresource, Json candidate,
                                      const WriteOptions& options) {
  const std::string name = metaString(old, "name");
  if (!options.admin) {
    std::string version = metaString(candidate, "resourceVersion");
    if (!version.empty() && version != metaString(old, "resourceVersion")) {
      return ApiResult::failure(conflict(kind, name));
    }
    if (takeInjectedConflict(kind)) return ApiResult::failure(conflict(kind, name));
  }
  Json updated;
  if (subresource == "status") {
    updated = old;
    if (candidate.contains("status")) {
      updated["status"] = candidate["status"];
    } else {
      updated.erase("status");
    }
  } else {
    updated = std::move(candidate);
    updated["apiVersion"] = kind.apiVersion();
    updated["kind"] = kind.kind;
    if (kind.has_status && !options.admin && subresource.empty()) {
      if (old.contains("status")) {
        updated["status"] = old["status"];
      } else {
        updated.erase("status");
      }
    }
    Json& metadata = updated["metadata"];
    const Json& old_metadata = old["metadata"];
    for (const char* field :
         {"uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp"}) {
      if (old_metadata.contains(field)) {
        metadata[field] = old_metadata[field];
      } else {
        metadata.erase(field);
      }
    }
  }
  std::vector<std::string> warnings;
  if (!options.admin) {
    if (auto error = checkCustomObject(kind, updated, options, warnings)) {
      return ApiResult::failure(*error);
    }
  }
  builtinDefaults(kind, updated, false);
  if (auto error = checkSecurityContexts(kind, updated)) return ApiResult::failure(*error);
  if (kind.kind == "CustomResourceDefinition" && kind.group == "apiextensions.k8s.io") {
    if (auto error = prepareCrd(kind, updated)) return ApiResult::failure(*error);
  }
  // Pod Security Admission looks at writes of the main resource only.
  if (!options.admin && subresource.empty()) {
    if (auto error = admitPodSecurity(store_, registry_, kind, updated, &old, warnings)) {
      return ApiResult::failure(*error);
    }
  }
  bool spec_changed =
      generationView(old, kind.has_status) != generationView(updated, kind.has_status);
  if (spec_changed) {
    updated["metadata"]["generation"] = old["metadata"].value("generation", 1) + 1;
  }
  updated["metadata"]["resourceVersion"] = metaString(old, "resourceVersion");
  if (sameObject(old, updated) || options.dry_run) {
    return ApiResult{200, options.dry_run ? updated : old, std::nullopt, warnings};
  }
  Json stored = store_.update(resourceKey(kind), updated);
  const Json& metadata = metadataOf(stored);
  if (metadata.contains("deletionTimestamp") &&
      metadata.value("finalizers", Json::array()).empty()) {
    // Its last finalizer went: the deletion it waited for happens now.
    return removeLocked(kind, metaString(stored, "namespace"), name, "Background");
  }
  if (kind.kind == "CustomResourceDefinition" && kind.group == "apiextensions.k8s.io") {
    registry_.registerCrd(stored);
  }
  if (kind.kind == "Deployment" && kind.group == "apps" && spec_changed && deployment_hook_) {
    deployment_hook_(stored);
    stored = store_.get(resourceKey(kind), metaString(stored, "namespace"), name).value_or(stored);
  }
  return ApiResult{200, stored, std::nullopt, warnings};
}

ApiResult ObjectService::patch(const KindInfo& kind, const std::string& ns, const std::string& name,
                               const std::string& subresource, const std::string& content_type,
                               const std::string& body, const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  const std::string type = mediaType(content_type);
  const bool apply = type == "application/apply-patch+yaml";
  if (type != "application/merge-patch+json" && type != "application/json-patch+json" &&
      type != "application/strategic-merge-patch+json" && !apply) {
    return ApiResult::failure(unsupportedMediaType(content_type));
  }
  if (type == "application/strategic-merge-patch+json" && !kind.builtin && subresource != "scale") {
    return ApiResult::failure(unsupportedMediaType(content_type));
  }
  Json patch_body;
  try {
    patch_body = apply ? yamlToJson(body) : Json::parse(body);
  } catch (const std::exception& error) {
    return ApiResult::failure(badRequest(std::string("error decoding patch: ") + error.what()));
  }
  const std::string object_ns = kind.namespaced ? ns : "";
  std::optional<Json> live = store_.get(resourceKey(kind), object_ns, name);
  const std::string intent_key = resourceKey(kind) + "/" + object_ns + "/" + name;
  if (apply) {
    if (options.field_manager.empty()) {
      return ApiResult::failure(
          ApiError{422, "Invalid",
                   "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is "
                   "required for apply patch"});
    }
    if (!patch_body.is_object()) {
      return ApiResult::failure(badRequest("an apply patch must be a " + kind.kind + " object"));
    }
    if (!live) {
      if (!subresource.empty()) return ApiResult::failure(notFound(kind, name));
      Json object = patch_body;
      object["metadata"]["name"] = name;
      ApiResult created = createLocked(kind, ns, object, options);
      if (created.ok() && !options.dry_run)
        applied_[intent_key][options.field_manager] = patch_body;
      return created;
    }
  }
  if (!live) return ApiResult::failure(notFound(kind, name));
  Json target = subresource == "scale" ? scaleOf(kind, *live) : *live;
  Json patched;
  try {
    if (type == "application/merge-patch+json") {
      patched = jsonMergePatch(target, patch_body);
    } else if (type == "application/json-patch+json") {
      patched = jsonPatch(target, patch_body);
    } else if (type == "application/strategic-merge-patch+json") {
      patched = strategicMergePatch(target, patch_body);
    } else {
      Json previous = applied_[intent_key].count(options.field_manager) > 0
                          ? applied_[intent_key][options.field_manager]
                          : Json(nullptr);
      patched = serverSideApply(target, patch_body, previous);
      if (!options.dry_run) applied_[intent_key][options.field_manager] = previous;
    }
  } catch (const PatchError& error) {
    return ApiResult::failure(ApiError{422, "Invalid", error.what()});
  } catch (const std::exception& error) {
    return ApiResult::failure(badRequest(std::string("error applying patch: ") + error.what()));
  }
  if (!patched.is_object()) {
    return ApiResult::failure(badRequest("the patched object is not a JSON object"));
  }
  if (subresource == "scale") return update(kind, ns, name, "scale", patched, options);
  if (!patched.contains("metadata") || !patched["metadata"].is_object()) {
    patched["metadata"] = Json::object();
  }
  if (metaString(patched, "name") != name) {
    return ApiResult::failure(badRequest("the name of the object (" + metaString(patched, "name") +
                                         ") does not match the name on the URL (" + name + ")"));
  }
  return updateLocked(kind, *live, subresource, std::move(patched), options);
}

ApiResult ObjectService::remove(const KindInfo& kind, const std::string& ns,
                                const std::string& name, const Json& delete_options, bool dry_run) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  std::optional<Json> live = store_.get(resourceKey(kind), kind.namespaced ? ns : "", name);
  if (!live) return ApiResult::failure(notFound(kind, name));
  std::string propagation = "Background";
  if (delete_options.is_object()) {
    propagation = delete_options.value("propagationPolicy", propagation);
    if (delete_options.value("orphanDependents", false)) propagation = "Orphan";
    Json preconditions = delete_options.value("preconditions", Json::object());
    if (preconditions.is_object()) {
      std::string uid = preconditions.value("uid", "");
      if (!uid.empty() && uid != metaString(*live, "uid")) {
        return ApiResult::failure(
            conflictWithMessage(kind, name,
                                "Precondition failed: UID in precondition: " + uid +
                                    ", UID in object meta: " + metaString(*live, "uid")));
      }
      std::string version = preconditions.value("resourceVersion", "");
      if (!version.empty() && version != metaString(*live, "resourceVersion")) {
        return ApiResult::failure(conflictWithMessage(
            kind, name,
            "Precondition failed: ResourceVersion in precondition: " + version +
                ", ResourceVersion in object meta: " + metaString(*live, "resourceVersion")));
      }
    }
  }
  if (propagation != "Background" && propagation != "Foreground" && propagation != "Orphan") {
    return ApiResult::failure(badRequest("propagationPolicy: Unsupported value: \"" + propagation +
                                         "\": supported values: \"Foreground\", \"Background\", "
                                         "\"Orphan\""));
  }
  if (dry_run) return ApiResult{200, *live, std::nullopt, {}};
  const Json& finalizers = metadataOf(*live).value("finalizers", Json::array());
  if (finalizers.is_array() && !finalizers.empty()) {
    // As the API server: an object with finalizers is only marked
    // (deletionTimestamp) and goes when an update empties its finalizers.
    if (metadataOf(*live).contains("deletionTimestamp"))
      return ApiResult{200, *live, std::nullopt, {}};
    Json marked = *live;
    marked["metadata"]["deletionTimestamp"] = nowTimestamp();
    marked["metadata"]["deletionGracePeriodSeconds"] = 0;
    return ApiResult{200, store_.update(resourceKey(kind), marked), std::nullopt, {}};
  }
  return removeLocked(kind, ns, name, propagation);
}

ApiResult ObjectService::removeLocked(const KindInfo& kind, const std::string& ns,
                                      const std::string& name, const std::string& propagation) {
  const std::string object_ns = kind.namespaced ? ns : "";
  std::optional<Json> deleted = store_.remove(resourceKey(kind), object_ns, name);
  if (!deleted) return ApiResult::failure(notFound(kind, name));
  const std::string prefix = resourceKey(kind) + "/" + object_ns + "/" + name;
  applied_.erase(prefix);
  if (kind.kind == "CustomResourceDefinition" && kind.group == "apiextensions.k8s.io") {
    // Its custom objects go with it.
    std::vector<KindInfo> kinds = kindsOfCrd(*deleted);
    for (const KindInfo& custom : kinds) {
      for (const Json& object : store_.list(resourceKey(custom), "").items) {
        removeLocked(custom, metaString(object, "namespace"), metaString(object, "name"),
                     "Background");
      }
    }
    registry_.unregisterCrd(name);
  }
  if (kind.kind == "Namespace" && kind.group.empty()) {
    for (const auto& [resource, object] : store_.all()) {
      if (metaString(object, "namespace") != name) continue;
      if (std::optional<KindInfo> owner_kind = kindOfResource(resource)) {
        removeLocked(*owner_kind, name, metaString(object, "name"), "Background");
      }
    }
  }
  collectGarbage(metaString(*deleted, "uid"), propagation);
  return ApiResult{200, *deleted, std::nullopt, {}};
}

// Dependents of a deleted owner: deleted once none of their owners exists
// (Background and Foreground alike, at once), or released (Orphan).
void ObjectService::collectGarbage(const std::string& owner_uid, const std::string& propagation) {
  if (owner_uid.empty()) return;
  std::vector<std::string> live_uids;
  auto all = store_.all();
  for (const auto& [resource, object] : all) live_uids.push_back(metaString(object, "uid"));
  for (const auto& [resource, object] : all) {
    const Json& metadata = metadataOf(object);
    if (!metadata.contains("ownerReferences") || !metadata["ownerReferences"].is_array()) continue;
    const Json& owners = metadata["ownerReferences"];
    bool owned = std::any_of(owners.begin(), owners.end(),
                             [&](const Json& ref) { return ref.value("uid", "") == owner_uid; });
    if (!owned) continue;
    std::optional<KindInfo> kind = kindOfResource(resource);
    if (!kind) continue;
    if (propagation == "Orphan") {
      Json released = object;
      Json kept = Json::array();
      for (const Json& ref : owners) {
        if (ref.value("uid", "") != owner_uid) kept.push_back(ref);
      }
      if (kept.empty()) {
        released["metadata"].erase("ownerReferences");
      } else {
        released["metadata"]["ownerReferences"] = kept;
      }
      store_.update(resource, released);
      continue;
    }
    bool other_owner_alive = std::any_of(owners.begin(), owners.end(), [&](const Json& ref) {
      std::string uid = ref.value("uid", "");
      return uid != owner_uid &&
             std::find(live_uids.begin(), live_uids.end(), uid) != live_uids.end();
    });
    if (other_owner_alive) continue;
    if (store_.get(resource, metaString(object, "namespace"), metaString(object, "name"))) {
      removeLocked(*kind, metaString(object, "namespace"), metaString(object, "name"),
                   "Background");
    }
  }
}

Json ObjectService::put(const Json& object) {
  std::lock_guard<std::recursive_mutex> lock(write_mutex_);
  std::optional<KindInfo> kind =
      registry_.byKind(object.value("apiVersion", ""), object.value("kind", ""));
  if (!kind) {
    throw std::invalid_argument("put: unknown kind " + object.value("apiVersion", "") + " " +
                                object.value("kind", "") + " (register its CRD first)");
  }
  const std::string name = metaString(object, "name");
  if (name.empty()) throw std::invalid_argument("put: the object has no metadata.name");
  std::string ns = kind->namespaced ? metaString(object, "namespace") : "";
  if (kind->namespaced && ns.empty()) ns = "default";
  WriteOptions options;
  options.admin = true;
  options.field_validation = "Ignore";
  std::optional<Json> old = store_.get(resourceKey(*kind), ns, name);
  ApiResult result;
  if (old) {
    Json candidate = object;
    if (!candidate.contains("metadata") || !candidate["metadata"].is_object()) {
      candidate["metadata"] = Json::object();
    }
    result = updateLocked(*kind, *old, "", candidate, options);
  } else {
    result = createLocked(*kind, ns, object, options);
  }
  if (!result.ok()) throw std::invalid_argument("put: " + result.error->message);
  return result.body;
}

}  // namespace tandem::testing
