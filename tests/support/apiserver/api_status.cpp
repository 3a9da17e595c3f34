#include "tests/support/apiserver/api_status.h"

#include "tests/support/apiserver/kind_registry.h"

namespace tandem::testing {
namespace {

nlohmann::json detailsOf(const KindInfo& kind, const std::string& name) {
  nlohmann::json details = {{"name", name}, {"kind", kind.plural}};
  if (!kind.group.empty()) details["group"] = kind.group;
  return details;
}

ApiError make(int code, const std::string& reason, const std::string& message,
              nlohmann::json details = nlohmann::json::object()) {
  return ApiError{code, reason, message, std::move(details)};
}

}  // namespace

nlohmann::json statusObject(const ApiError& error) {
  nlohmann::json status = {
      {"kind", "Status"},    {"apiVersion", "v1"},       {"metadata", nlohmann::json::object()},
      {"status", "Failure"}, {"message", error.message}, {"reason", error.reason},
      {"code", error.code}};
  if (!error.details.empty()) status["details"] = error.details;
  return status;
}

nlohmann::json successStatus(const KindInfo& kind, const std::string& name,
                             const std::string& uid) {
  nlohmann::json details = detailsOf(kind, name);
  details["uid"] = uid;
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", nlohmann::json::object()},
          {"status", "Success"},
          {"details", details}};
}

ApiError notFound(const KindInfo& kind, const std::string& name) {
  return make(404, "NotFound", qualifiedResource(kind) + " \"" + name + "\" not found",
              detailsOf(kind, name));
}

ApiError alreadyExists(const KindInfo& kind, const std::string& name) {
  return make(409, "AlreadyExists", qualifiedResource(kind) + " \"" + name + "\" already exists",
              detailsOf(kind, name));
}

ApiError conflict(const KindInfo& kind, const std::string& name) {
  return conflictWithMessage(kind, name,
                             "the object has been modified; please apply your changes to the "
                             "latest version and try again");
}

ApiError conflictWithMessage(const KindInfo& kind, const std::string& name,
                             const std::string& detail) {
  return make(409, "Conflict",
              "Operation cannot be fulfilled on " + qualifiedResource(kind) + " \"" + name +
                  "\": " + detail,
              detailsOf(kind, name));
}

ApiError invalid(const KindInfo& kind, const std::string& name, const std::string& field,
                 const std::string& detail) {
  return invalidFields(kind, name, {{field, detail}});
}

ApiError invalidFields(const KindInfo& kind, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& causes) {
  std::string qualified_kind = kind.group.empty() ? kind.kind : kind.kind + "." + kind.group;
  nlohmann::json details = {{"name", name}, {"kind", kind.kind}};
  if (!kind.group.empty()) details["group"] = kind.group;
  details["causes"] = nlohmann::json::array();
  std::string text;
  for (const auto& [field, detail] : causes) {
    details["causes"].push_back(
        {{"reason", "FieldValueInvalid"}, {"message", detail}, {"field", field}});
    text += (text.empty() ? "" : ", ") + field + ": " + detail;
  }
  if (causes.size() > 1) text = "[" + text + "]";
  return make(422, "Invalid", qualified_kind + " \"" + name + "\" is invalid: " + text, details);
}

ApiError badRequest(const std::string& message) { return make(400, "BadRequest", message); }

ApiError methodNotAllowed(const std::string& message) {
  return make(405, "MethodNotAllowed", message);
}

ApiError expired(const std::string& message) { return make(410, "Expired", message); }

ApiError gone(const std::string& message) { return make(410, "Gone", message); }

ApiError tooLargeResourceVersion(uint64_t asked, uint64_t current) {
  return make(
      504, "Timeout",
      "Timeout: Too large resource version: " + std::to_string(asked) +
          ", current: " + std::to_string(current),
      {{"retryAfterSeconds", 1},
       {"causes",
        {{{"reason", "ResourceVersionTooLarge"}, {"message", "Too large resource version"}}}}});
}

ApiError unauthorized() { return make(401, "Unauthorized", "Unauthorized"); }

ApiError unsupportedMediaType(const std::string& content_type) {
  return make(415, "UnsupportedMediaType",
              "the body of the request was in an unknown format (" + content_type +
                  ") - accepted media types include: application/json-patch+json, "
                  "application/merge-patch+json, application/apply-patch+yaml");
}

ApiError notFoundPath(const std::string& path) {
  return make(404, "NotFound", "the server could not find the requested resource (" + path + ")",
              {{"causes", nlohmann::json::array({{{"reason", "UnexpectedServerResponse"},
                                                  {"message", "404 page not found"}}})}});
}

}  // namespace tandem::testing
