// The OpenAPI documents, shaped as kubectl reads them:
//  - /openapi/v3 lists one document per group-version, each at
//    /openapi/v3/<api/v1 | apis/G/V>?hash=H (H: a hash of the document).
//  - A group-version document has the kinds' schemas (a CRD's own
//    openAPIV3Schema, which makes `kubectl explain` work; built-in kinds a
//    permissive schema) and every operation. PATCH and POST name the
//    fieldValidation query parameter: kubectl takes that as the server
//    validating fields and leaves its own validation out. PATCH of built-in
//    kinds does not offer strategic merge patch in its request body, so
//    kubectl apply computes strategic patches from its compiled-in types
//    rather than from these (incomplete) schemas.
//  - /openapi/v2 is JSON when the request accepts JSON; kubectl asks for
//    protobuf only, and gets 406 (it then does without the document).
#include "tests/support/apiserver/openapi.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

namespace tandem::testing {
namespace {

using nlohmann::json;

constexpr const char* kObjectMeta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
constexpr const char* kListMeta = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
constexpr const char* kStatus = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
constexpr const char* kPatch = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
constexpr const char* kDeleteOptions = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
constexpr const char* kScale = "io.k8s.api.autoscaling.v1.Scale";

// Documents are written once with "#/components/schemas/" references (v3)
// and once with "#/definitions/" (v2).
struct Flavor {
  bool v3 = true;
  std::string ref(const std::string& schema) const {
    return (v3 ? "#/components/schemas/" : "#/definitions/") + schema;
  }
};

std::string hexHash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

// "api/v1" or "apis/G/V": the name a group-version has in the v3 index.
std::string groupVersionPath(const std::string& group, const std::string& version) {
  return group.empty() ? "api/" + version : "apis/" + group + "/" + version;
}

// The schema name the API server gives a kind: io.k8s.api.apps.v1.Deployment
// for built-in groups, the reversed group for custom ones (dev.tandem.v1alpha1.PrefillPool).
std::string schemaName(const KindInfo& kind) {
  if (kind.builtin) {
    if (kind.group == "apiextensions.k8s.io") {
      return "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions." + kind.version + "." +
             kind.kind;
    }
    std::string group = kind.group.empty() ? "core" : kind.group;
    auto dot = group.find('.');
    if (dot != std::string::npos) group = group.substr(0, dot);
    return "io.k8s.api." + group + "." + kind.version + "." + kind.kind;
  }
  std::string reversed;
  std::string rest = kind.group;
  while (!rest.empty()) {
    auto dot = rest.rfind('.');
    std::string label = dot == std::string::npos ? rest : rest.substr(dot + 1);
    reversed += (reversed.empty() ? "" : ".") + label;
    rest = dot == std::string::npos ? "" : rest.substr(0, dot);
  }
  return reversed + "." + kind.version + "." + kind.kind;
}

json gvkExtension(const std::string& group, const std::string& version, const std::string& kind) {
  return {{"group", group}, {"version", version}, {"kind", kind}};
}

json refTo(const Flavor& flavor, const std::string& schema, const std::string& description = "") {
  json out = {{"allOf", json::array({{{"$ref", flavor.ref(schema)}}})}};
  if (!description.empty()) out["description"] = description;
  return out;
}

json stringProperty(const std::string& description) {
  return {{"type", "string"}, {"description", description}};
}

json described(json schema, const std::string& description) {
  schema["description"] = description;
  return schema;
}

// Schemas every document refers to.
json sharedSchemas(const Flavor& flavor) {
  json string_map = {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}};
  json owner_reference = {{"type", "object"},
                          {"required", {"apiVersion", "kind", "name", "uid"}},
                          {"properties",
                           {{"apiVersion", stringProperty("API version of the referent.")},
                            {"kind", stringProperty("Kind of the referent.")},
                            {"name", stringProperty("Name of the referent.")},
                            {"uid", stringProperty("UID of the referent.")},
                            {"controller",
                             {{"type", "boolean"},
                              {"description",
                               "If true, this reference points to "
                               "the managing controller."}}},
                            {"blockOwnerDeletion", {{"type", "boolean"}}}}},
                          {"x-kubernetes-map-type", "atomic"}};
  json object_meta = {
      {"type", "object"},
      {"description", "ObjectMeta is metadata that all persisted resources must have."},
      {"properties",
       {{"name", stringProperty("Name must be unique within a namespace.")},
        {"generateName", stringProperty("Prefix of a name the server generates.")},
        {"namespace", stringProperty("Namespace defines the space within which each name must "
                                     "be unique.")},
        {"uid", stringProperty("UID is the unique in time and space value for this object.")},
        {"resourceVersion", stringProperty("An opaque value that represents the internal version "
                                           "of this object.")},
        {"generation",
         {{"type", "integer"},
          {"format", "int64"},
          {"description",
           "A sequence number representing a specific generation "
           "of the desired state."}}},
        {"creationTimestamp",
         {{"type", "string"},
          {"format", "date-time"},
          {"description", "The server time when this object was created."}}},
        {"deletionTimestamp",
         {{"type", "string"},
          {"format", "date-time"},
          {"description",
           "The time after which this object will be "
           "deleted."}}},
        {"labels", described(string_map,
                             "Map of string keys and values to organize and select "
                             "objects.")},
        {"annotations", described(string_map, "Unstructured key value map set by tools.")},
        {"finalizers",
         {{"type", "array"},
          {"items", {{"type", "string"}}},
          {"x-kubernetes-list-type", "set"},
          {"x-kubernetes-patch-strategy", "merge"}}},
        {"ownerReferences",
         {{"type", "array"},
          {"items", owner_reference},
          {"x-kubernetes-list-type", "map"},
          {"x-kubernetes-list-map-keys", {"uid"}},
          {"x-kubernetes-patch-merge-key", "uid"},
          {"x-kubernetes-patch-strategy", "merge"}}},
        {"managedFields",
         {{"type", "array"},
          {"items", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
          {"x-kubernetes-list-type", "atomic"}}}}}};
  json list_meta = {{"type", "object"},
                    {"properties",
                     {{"resourceVersion", {{"type", "string"}}},
                      {"continue", {{"type", "string"}}},
                      {"remainingItemCount", {{"type", "integer"}, {"format", "int64"}}}}}};
  json status = {
      {"type", "object"},
      {"properties",
       {{"apiVersion", {{"type", "string"}}},
        {"kind", {{"type", "string"}}},
        {"code", {{"type", "integer"}, {"format", "int32"}}},
        {"message", {{"type", "string"}}},
        {"reason", {{"type", "string"}}},
        {"status", {{"type", "string"}}},
        {"details", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
        {"metadata", refTo(flavor, kListMeta)}}},
      {"x-kubernetes-group-version-kind", json::array({gvkExtension("", "v1", "Status")})}};
  json scale = {{"type", "object"},
                {"description", "Scale represents a scaling request for a resource."},
                {"properties",
                 {{"apiVersion", {{"type", "string"}}},
                  {"kind", {{"type", "string"}}},
                  {"metadata", refTo(flavor, kObjectMeta)},
                  {"spec",
                   {{"type", "object"},
                    {"properties", {{"replicas", {{"type", "integer"}, {"format", "int32"}}}}}}},
                  {"status",
                   {{"type", "object"},
                    {"properties",
                     {{"replicas", {{"type", "integer"}, {"format", "int32"}}},
                      {"selector", {{"type", "string"}}}}}}}}},
                {"x-kubernetes-group-version-kind",
                 json::array({gvkExtension("autoscaling", "v1", "Scale")})}};
  return {{kObjectMeta, object_meta},
          {kListMeta, list_meta},
          {kStatus, status},
          {kPatch, {{"type", "object"}, {"description", "The body of a PATCH request."}}},
          {kDeleteOptions,
           {{"type", "object"},
            {"x-kubernetes-preserve-unknown-fields", true},
            {"x-kubernetes-group-version-kind",
             json::array({gvkExtension("", "v1", "DeleteOptions")})}}},
          {kScale, scale}};
}

// The kind's schema as the API server publishes it: metadata refers to
// ObjectMeta, and the group-version-kind extension names the kind.
json kindSchema(const KindInfo& kind, const Flavor& flavor) {
  json schema;
  if (!kind.builtin && kind.schema.is_object()) {
    schema = kind.schema;
  } else {
    schema = {{"type", "object"},
              {"description", kind.kind + " (a built-in kind; this server does not describe its "
                                          "fields)."},
              {"x-kubernetes-preserve-unknown-fields", true}};
  }
  if (!schema.contains("properties") || !schema["properties"].is_object()) {
    schema["properties"] = json::object();
  }
  json& properties = schema["properties"];
  properties["apiVersion"] = stringProperty(
      "APIVersion defines the versioned schema of this representation of an object.");
  properties["kind"] = stringProperty(
      "Kind is a string value representing the REST resource this object "
      "represents.");
  properties["metadata"] = refTo(flavor, kObjectMeta, "Standard object's metadata.");
  schema["x-kubernetes-group-version-kind"] =
      json::array({gvkExtension(kind.group, kind.version, kind.kind)});
  return schema;
}

json listSchema(const KindInfo& kind, const Flavor& flavor) {
  return {{"type", "object"},
          {"description", kind.list_kind + " is a list of " + kind.kind},
          {"required", {"items"}},
          {"properties",
           {{"apiVersion", {{"type", "string"}}},
            {"kind", {{"type", "string"}}},
            {"metadata", refTo(flavor, kListMeta)},
            {"items", {{"type", "array"}, {"items", {{"$ref", flavor.ref(schemaName(kind))}}}}}}},
          {"x-kubernetes-group-version-kind",
           json::array({gvkExtension(kind.group, kind.version, kind.list_kind)})}};
}

json queryParameter(const Flavor& flavor, const std::string& name, const std::string& type,
                    const std::string& description) {
  json parameter = {{"name", name}, {"in", "query"}, {"description", description}};
  if (flavor.v3) {
    parameter["schema"] = {{"type", type}, {"uniqueItems", true}};
  } else {
    parameter["type"] = type;
    parameter["uniqueItems"] = true;
  }
  return parameter;
}

json pathParameter(const Flavor& flavor, const std::string& name, const std::string& description) {
  json parameter = {
      {"name", name}, {"in", "path"}, {"required", true}, {"description", description}};
  if (flavor.v3) {
    parameter["schema"] = {{"type", "string"}, {"uniqueItems", true}};
  } else {
    parameter["type"] = "string";
    parameter["uniqueItems"] = true;
  }
  return parameter;
}

json writeParameters(const Flavor& flavor, bool patch) {
  json parameters = json::array(
      {queryParameter(flavor, "dryRun", "string",
                      "When present, indicates that modifications should not be persisted."),
       queryParameter(flavor, "fieldManager", "string",
                      "A name associated with the actor or entity that is making these changes."),
       queryParameter(flavor, "fieldValidation", "string",
                      "How the server handles unknown or duplicate fields in the request: "
                      "Ignore, Warn or Strict.")});
  if (patch) {
    parameters.push_back(
        queryParameter(flavor, "force", "boolean", "Force is going to \"force\" Apply requests."));
  }
  return parameters;
}

json response(const Flavor& flavor, const std::string& schema) {
  json out = {{"description", "OK"}};
  if (flavor.v3) {
    json content = {{"schema", {{"$ref", flavor.ref(schema)}}}};
    out["content"] = {{"application/json", content}, {"application/yaml", content}};
  } else {
    out["schema"] = {{"$ref", flavor.ref(schema)}};
  }
  return out;
}

// One operation; `schema` is the body/answer type, `gvk` the kind it acts on.
json operation(const Flavor& flavor, const std::string& id, const std::string& action,
               const json& gvk, const std::string& schema, json parameters,
               const std::vector<std::string>& body_types) {
  json op = {{"operationId", id},
             {"parameters", std::move(parameters)},
             {"responses", {{"200", response(flavor, schema)}}},
             {"x-kubernetes-action", action},
             {"x-kubernetes-group-version-kind", gvk}};
  if (action == "post") op["responses"]["201"] = response(flavor, schema);
  if (!body_types.empty()) {
    std::string body_schema = action == "patch" ? kPatch : schema;
    if (flavor.v3) {
      json content = json::object();
      for (const auto& type : body_types) {
        content[type] = {{"schema", {{"$ref", flavor.ref(body_schema)}}}};
      }
      op["requestBody"] = {{"content", content}, {"required", true}};
    } else {
      op["parameters"].push_back({{"name", "body"},
                                  {"in", "body"},
                                  {"required", true},
                                  {"schema", {{"$ref", flavor.ref(body_schema)}}}});
      op["consumes"] = body_types;
    }
  }
  if (!flavor.v3) op["produces"] = {"application/json", "application/yaml"};
  return op;
}

void addKindPaths(json& paths, const KindInfo& kind, const Flavor& flavor) {
  // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "/" + std::string.
  std::string prefix = "/";
  prefix += groupVersionPath(kind.group, kind.version);
  std::string collection = prefix;
  collection += kind.namespaced ? "/namespaces/{namespace}/" : "/";
  collection += kind.plural;
  std::string item = collection + "/{name}";
  std::string schema = schemaName(kind);
  json gvk = gvkExtension(kind.group, kind.version, kind.kind);
  std::string id_kind = (kind.namespaced ? "Namespaced" : "") + kind.kind;
  std::vector<std::string> json_body = {"application/json", "application/yaml"};
  std::vector<std::string> patch_body = {"application/json-patch+json",
                                         "application/merge-patch+json",
                                         "application/apply-patch+yaml"};
  json path_parameters = json::array({pathParameter(flavor, "name", "name of the " + kind.kind)});
  json namespace_parameter = pathParameter(flavor, "namespace", "object name and auth scope");
  if (kind.namespaced) path_parameters.push_back(namespace_parameter);

  json list_path = {
      {"get", operation(flavor, "list" + id_kind, "list", gvk, schema + "List", json::array(), {})},
      {"post", operation(flavor, "create" + id_kind, "post", gvk, schema,
                         writeParameters(flavor, false), json_body)},
      {"delete", operation(flavor, "deletecollection" + id_kind, "deletecollection", gvk, kStatus,
                           json::array(), {})}};
  if (kind.namespaced) list_path["parameters"] = json::array({namespace_parameter});
  paths[collection] = list_path;

  json item_path = {
      {"get", operation(flavor, "read" + id_kind, "get", gvk, schema, json::array(), {})},
      {"put", operation(flavor, "replace" + id_kind, "put", gvk, schema,
                        writeParameters(flavor, false), json_body)},
      {"patch", operation(flavor, "patch" + id_kind, "patch", gvk, schema,
                          writeParameters(flavor, true), patch_body)},
      {"delete", operation(flavor, "delete" + id_kind, "delete", gvk, kStatus, json::array(), {})},
      {"parameters", path_parameters}};
  paths[item] = item_path;

  if (kind.has_status) {
    paths[item + "/status"] = {
        {"get",
         operation(flavor, "read" + id_kind + "Status", "get", gvk, schema, json::array(), {})},
        {"put", operation(flavor, "replace" + id_kind + "Status", "put", gvk, schema,
                          writeParameters(flavor, false), json_body)},
        {"patch", operation(flavor, "patch" + id_kind + "Status", "patch", gvk, schema,
                            writeParameters(flavor, true), patch_body)},
        {"parameters", path_parameters}};
  }
  if (!kind.scale.is_null()) {
    json scale_gvk = gvkExtension("autoscaling", "v1", "Scale");
    paths[item + "/scale"] = {
        {"get", operation(flavor, "read" + id_kind + "Scale", "get", scale_gvk, kScale,
                          json::array(), {})},
        {"put", operation(flavor, "replace" + id_kind + "Scale", "put", scale_gvk, kScale,
                          writeParameters(flavor, false), json_body)},
        {"patch", operation(flavor, "patch" + id_kind + "Scale", "patch", scale_gvk, kScale,
                            writeParameters(flavor, true), patch_body)},
        {"parameters", path_parameters}};
  }
  if (kind.namespaced) {
    paths[prefix + "/" + kind.plural] = {
        {"get", operation(flavor, "list" + kind.kind + "ForAllNamespaces", "list", gvk,
                          schema + "List", json::array(), {})}};
  }
}

// The document for the kinds `selected` (one group-version for v3, all for v2).
json document(const std::vector<const KindInfo*>& selected, const Flavor& flavor) {
  json paths = json::object();
  json schemas = sharedSchemas(flavor);
  for (const KindInfo* kind : selected) {
    std::string name = schemaName(*kind);
    schemas[name] = kindSchema(*kind, flavor);
    schemas[name + "List"] = listSchema(*kind, flavor);
    addKindPaths(paths, *kind, flavor);
  }
  json info = {{"title", "Kubernetes"}, {"version", "v1.32.0"}};
  if (flavor.v3) {
    return {{"openapi", "3.0.0"},
            {"info", info},
            {"paths", paths},
            {"components", {{"schemas", schemas}}}};
  }
  return {{"swagger", "2.0"}, {"info", info}, {"paths", paths}, {"definitions", schemas}};
}

// Group-versions in a stable order, with their kinds.
std::map<std::string, std::vector<const KindInfo*>> byGroupVersion(
    const std::vector<KindInfo>& kinds) {
  std::map<std::string, std::vector<const KindInfo*>> out;
  for (const auto& kind : kinds) out[groupVersionPath(kind.group, kind.version)].push_back(&kind);
  return out;
}

HttpAnswer jsonAnswer(const json& body) { return {200, "application/json", body.dump()}; }

HttpAnswer notFound(const std::string& path, const std::string& what) {
  json status = {{"kind", "Status"},
                 {"apiVersion", "v1"},
                 {"metadata", json::object()},
                 {"status", "Failure"},
                 {"message", what + " " + path + " not found"},
                 {"reason", "NotFound"},
                 {"code", 404}};
  return {404, "application/json", status.dump()};
}

bool acceptsJson(const std::string& accept) {
  return accept.empty() || accept.find("application/json") != std::string::npos ||
         accept.find("*/*") != std::string::npos;
}

}  // namespace

std::optional<HttpAnswer> openApiAnswer(const std::string& path, const std::string& accept,
                                        const std::vector<KindInfo>& kinds) {
  if (path == "/openapi/v2" || path == "/swagger-2.0.0.pb-v1") {
    if (path == "/openapi/v2" && acceptsJson(accept)) {
      std::vector<const KindInfo*> all;
      for (const auto& kind : kinds) all.push_back(&kind);
      return jsonAnswer(document(all, Flavor{false}));
    }
    if (path != "/openapi/v2") return notFound(path, "path");
    json status = {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", json::object()},
                   {"status", "Failure"},
                   {"message", "/openapi/v2 is served as application/json only, not " + accept},
                   {"reason", "NotAcceptable"},
                   {"code", 406}};
    return HttpAnswer{406, "application/json", status.dump()};
  }
  const std::string v3 = "/openapi/v3";
  if (path.compare(0, v3.size(), v3) != 0) return std::nullopt;
  if (path.size() > v3.size() && path[v3.size()] != '/') return std::nullopt;
  std::string rest = path.size() > v3.size() + 1 ? path.substr(v3.size() + 1) : "";
  auto groups = byGroupVersion(kinds);
  if (rest.empty()) {
    json index = json::object();
    for (const auto& [group_version, members] : groups) {
      std::string hash = hexHash(document(members, Flavor{true}).dump());
      index[group_version] = {
          {"serverRelativeURL", "/openapi/v3/" + group_version + "?hash=" + hash}};
    }
    return jsonAnswer({{"paths", index}});
  }
  auto it = groups.find(rest);
  if (it == groups.end()) return notFound(path, "OpenAPI document");
  return jsonAnswer(document(it->second, Flavor{true}));
}

}  // namespace tandem::testing
