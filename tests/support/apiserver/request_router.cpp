#include "tests/support/apiserver/request_router.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>

#include "tests/support/apiserver/discovery.h"
#include "tests/support/apiserver/openapi.h"
#include "tests/support/apiserver/protobuf_body.h"
#include "tests/support/apiserver/table.h"
#include "tests/support/apiserver/yaml_json.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kWatchPoll = std::chrono::milliseconds(200);

struct ResourcePath {
  KindInfo kind;
  std::string ns;
  std::string name;
  std::string subresource;
  bool watch = false;  // under /watch/ (the old form of ?watch=true)
};

// Forwards to another writer, telling `on_status` the status first.
class RecordingWriter : public ResponseWriter {
 public:
  RecordingWriter(ResponseWriter& inner, std::function<void(int)> on_status)
      : inner_(inner), on_status_(std::move(on_status)) {}
  bool send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers) override {
    on_status_(status);
    return inner_.send(status, content_type, body, headers);
  }
  bool startChunked(int status, const std::string& content_type) override {
    on_status_(status);
    return inner_.startChunked(status, content_type);
  }
  bool writeChunk(const std::string& data) override { return inner_.writeChunk(data); }
  bool finishChunked() override { return inner_.finishChunked(); }
  bool peerClosed() override { return inner_.peerClosed(); }

 private:
  ResponseWriter& inner_;
  std::function<void(int)> on_status_;
};

std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> segments;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) segments.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return segments;
}

void sendJson(ResponseWriter& writer, int code, const Json& body,
              const std::vector<std::string>& warnings = {}) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const std::string& warning : warnings) {
    headers.emplace_back("Warning", "299 - " + Json(warning).dump());
  }
  headers.emplace_back("Audit-Id", newUid());
  writer.send(code, "application/json", body.dump(), headers);
}

void sendError(ResponseWriter& writer, const ApiError& error) {
  sendJson(writer, error.code, statusObject(error));
}

bool wantsTable(const HttpRequest& request) {
  return request.header("accept").find("as=Table") != std::string::npos;
}

std::string bearerToken(const HttpRequest& request) {
  const std::string authorization = request.header("authorization");
  const std::string prefix = "Bearer ";
  return authorization.rfind(prefix, 0) == 0 ? authorization.substr(prefix.size()) : "";
}

// Who sent the request, or nullopt when its credentials are not accepted:
// a client certificate's CN, a token this server issued to a ServiceAccount
// (while valid), a plain token (its own user name) when accepted, or
// anonymous when no tokens are required.
std::optional<UserInfo> authenticate(ServerState& state, const HttpRequest& request) {
  if (!request.client_certificate_cn.empty()) {
    return UserInfo{request.client_certificate_cn, {"system:authenticated"}, true, ""};
  }
  const std::string token = bearerToken(request);
  if (!token.empty() && state.service_account_tokens.issued(token)) {
    return state.service_account_tokens.authenticate(token);
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!token.empty()) {
    if (state.tokens.empty() ||
        std::find(state.tokens.begin(), state.tokens.end(), token) != state.tokens.end()) {
      return UserInfo{token, {"system:masters", "system:authenticated"}, true, token};
    }
    return std::nullopt;
  }
  if (state.tokens.empty()) return UserInfo{"anonymous", {"system:unauthenticated"}, true, ""};
  return std::nullopt;
}

// The user name requests are logged and counted under.
std::string userOf(ServerState& state, const HttpRequest& request) {
  if (!request.client_certificate_cn.empty()) return request.client_certificate_cn;
  const std::string token = bearerToken(request);
  if (token.empty()) return "anonymous";
  if (state.service_account_tokens.issued(token)) {
    std::optional<UserInfo> user = state.service_account_tokens.authenticate(token);
    return user ? user->name : "invalid-service-account-token";
  }
  return token;
}

// The object name a list or watch is narrowed to by fieldSelector
// metadata.name=NAME, which the real API authorizes like a request for it.
std::string fieldSelectedName(const HttpRequest& request) {
  const std::string selector = request.param("fieldSelector");
  size_t start = 0;
  while (start <= selector.size()) {
    size_t end = selector.find(',', start);
    if (end == std::string::npos) end = selector.size();
    const std::string term = selector.substr(start, end - start);
    for (const std::string prefix : {"metadata.name==", "metadata.name="}) {
      if (term.rfind(prefix, 0) == 0) return term.substr(prefix.size());
    }
    start = end + 1;
  }
  return "";
}

// Discovery, health and OpenAPI; false when `request` is not for one of them.
bool answerNonResource(ServerState& state, const HttpRequest& request, ResponseWriter& writer) {
  const std::string& path = request.path;
  std::vector<std::string> segments = splitPath(path);
  if (path == "/version" || path == "/version/") {
    sendJson(writer, 200, versionDocument());
    return true;
  }
  if (path == "/healthz" || path == "/livez" || path == "/readyz") {
    writer.send(200, "text/plain; charset=utf-8", "ok");
    return true;
  }
  if (path.rfind("/openapi/", 0) == 0) {
    std::optional<HttpAnswer> answer =
        openApiAnswer(path, request.header("accept"), state.registry.all());
    if (!answer) {
      sendError(writer, notFoundPath(path));
    } else {
      writer.send(answer->status, answer->content_type, answer->body);
    }
    return true;
  }
  if (request.method != "GET") return false;
  // Discovery documents are always the plain kind: clients asking for the
  // aggregated form see application/json and fall back to these.
  if (segments == std::vector<std::string>{"api"}) {
    sendJson(writer, 200, coreApiVersions());
    return true;
  }
  if (segments == std::vector<std::string>{"apis"}) {
    sendJson(writer, 200, apiGroupList(state.registry.all()));
    return true;
  }
  if (segments.size() == 2 && segments[0] == "api") {
    std::optional<Json> list = apiResourceList(state.registry.all(), "", segments[1]);
    list ? sendJson(writer, 200, *list) : sendError(writer, notFoundPath(path));
    return true;
  }
  if (segments.size() == 2 && segments[0] == "apis") {
    std::optional<Json> group = apiGroup(state.registry.all(), segments[1]);
    group ? sendJson(writer, 200, *group) : sendError(writer, notFoundPath(path));
    return true;
  }
  if (segments.size() == 3 && segments[0] == "apis") {
    std::optional<Json> list = apiResourceList(state.registry.all(), segments[1], segments[2]);
    list ? sendJson(writer, 200, *list) : sendError(writer, notFoundPath(path));
    return true;
  }
  return false;
}

std::optional<ResourcePath> parseResourcePath(ServerState& state, const std::string& path) {
  std::vector<std::string> segments = splitPath(path);
  std::string group;
  size_t at = 0;
  if (segments.size() >= 3 && segments[0] == "api") {
    at = 1;
  } else if (segments.size() >= 4 && segments[0] == "apis") {
    group = segments[1];
    at = 2;
  } else {
    return std::nullopt;
  }
  const std::string version = segments[at];
  std::vector<std::string> rest(segments.begin() + static_cast<long>(at) + 1, segments.end());
  ResourcePath resource;
  if (!rest.empty() && rest[0] == "watch") {
    resource.watch = true;
    rest.erase(rest.begin());
    if (rest.empty()) return std::nullopt;
  }
  std::optional<KindInfo> kind;
  if (rest.size() >= 3 && rest[0] == "namespaces") {
    kind = state.registry.byResource(group, version, rest[2]);
    if (kind && kind->namespaced) {
      if (rest.size() > 5) return std::nullopt;
      resource.ns = rest[1];
      rest.erase(rest.begin(), rest.begin() + 2);
    } else {
      kind.reset();
    }
  }
  if (!kind) {
    if (rest.size() > 3) return std::nullopt;
    kind = state.registry.byResource(group, version, rest[0]);
    if (!kind) return std::nullopt;
    // A namespaced object needs its namespace in the path.
    if (kind->namespaced && rest.size() > 1) return std::nullopt;
  }
  resource.kind = *kind;
  if (rest.size() > 1) resource.name = rest[1];
  if (rest.size() > 2) {
    resource.subresource = rest[2];
    bool known =
        (resource.subresource == "status" && kind->has_status) ||
        (resource.subresource == "scale" && !kind->scale.is_null()) ||
        (resource.subresource == "token" && kind->builtin && kind->kind == "ServiceAccount");
    if (!known) return std::nullopt;
  }
  return resource;
}

std::optional<ApiError> writeOptions(const HttpRequest& request, WriteOptions& options) {
  if (request.hasParam("fieldValidation")) {
    options.field_validation = request.param("fieldValidation");
    if (options.field_validation != "Strict" && options.field_validation != "Warn" &&
        options.field_validation != "Ignore") {
      return badRequest("fieldValidation: Unsupported value: \"" + options.field_validation +
                        "\": supported values: \"Ignore\", \"Warn\", \"Strict\"");
    }
  }
  options.field_manager = request.param("fieldManager");
  if (request.hasParam("dryRun")) {
    if (request.param("dryRun") != "All") {
      return badRequest("dryRun: Unsupported value: \"" + request.param("dryRun") +
                        "\": supported values: \"All\"");
    }
    options.dry_run = true;
  }
  return std::nullopt;
}

// The request body as JSON (YAML accepted when the Content-Type says so;
// protobuf, as client-go's typed clients send it, for the kinds
// protobuf_body.h decodes), or nullopt with the error to answer.
std::optional<Json> bodyJson(const HttpRequest& request, ApiError& error) {
  const std::string content_type = request.header("content-type");
  if (content_type.find("protobuf") != std::string::npos) {
    ProtobufBody decoded = decodeProtobufBody(request.body);
    if (!decoded.ok()) {
      error = *decoded.error;
      return std::nullopt;
    }
    return decoded.object;
  }
  try {
    if (content_type.find("yaml") != std::string::npos) return yamlToJson(request.body);
    return Json::parse(request.body);
  } catch (const std::exception& exception) {
    error = badRequest(std::string("the request body is not valid JSON: ") + exception.what());
    return std::nullopt;
  }
}

std::optional<ApiError> selectors(const HttpRequest& request, ListOptions& options) {
  std::string error;
  options.labels = Selector::parseLabels(request.param("labelSelector"), error);
  if (!options.labels) return badRequest("unable to parse labelSelector: " + error);
  options.fields = Selector::parseFields(request.param("fieldSelector"), error);
  if (!options.fields) return badRequest("unable to parse fieldSelector: " + error);
  return std::nullopt;
}

Json asTable(const HttpRequest& request, const Json& body, const KindInfo& kind) {
  Json table = toTable(body, kind, request.param("includeObject"));
  if (body.contains("metadata") && body["metadata"].contains("resourceVersion")) {
    table["metadata"]["resourceVersion"] = body["metadata"]["resourceVersion"];
    if (body["metadata"].contains("continue")) {
      table["metadata"]["continue"] = body["metadata"]["continue"];
    }
  }
  return table;
}

void serveWatch(ServerState& state, const HttpRequest& request, const ResourcePath& resource,
                ResponseWriter& writer) {
  ListOptions list_options;
  if (auto error = selectors(request, list_options)) return sendError(writer, *error);
  if (!resource.name.empty()) {
    std::string error;
    list_options.fields = Selector::parseFields("metadata.name=" + resource.name, error);
  }
  std::optional<uint64_t> from;
  std::string version = request.param("resourceVersion");
  if (!version.empty() && version != "0") {
    try {
      size_t used = 0;
      from = std::stoull(version, &used);
      if (used != version.size()) throw std::invalid_argument(version);
    } catch (const std::exception&) {
      return sendError(writer, badRequest("resourceVersion: Invalid value: \"" + version +
                                          "\": must be a number the server sent"));
    }
  }
  // A watch the server cannot serve from its version, answered as the real
  // one's watch cache answers it: 200 and one ERROR event with the Status.
  auto errorEvent = [&](const ApiError& error) {
    if (!writer.startChunked(200, "application/json")) return;
    writer.writeChunk(Json{{"type", "ERROR"}, {"object", statusObject(error)}}.dump() + "\n");
    writer.finishChunked();
  };
  for (int left = state.watches_gone.load(); left > 0;) {
    if (state.watches_gone.compare_exchange_weak(left, left - 1)) {
      return errorEvent(expired("too old resource version: " + version + " (injected)"));
    }
  }
  // A version this server has not reached (a client that watched a server
  // since restarted with a fresh history): the real one waits up to 3 s for
  // its cache to catch up, then answers this.
  if (from && *from > state.store.resourceVersion()) {
    return errorEvent(tooLargeResourceVersion(*from, state.store.resourceVersion()));
  }
  const std::string ns = resource.kind.namespaced ? resource.ns : "";
  auto matches = [ns, list_options](const Json& object) {
    if (!ns.empty() && object["metadata"].value("namespace", "") != ns) return false;
    return list_options.labels->matches(object) && list_options.fields->matches(object);
  };
  // A streaming list (KEP-3157, client-go's WatchListClient, on in kubectl
  // 1.35): the current state as ADDED events, then a bookmark marking their
  // end, then changes. It requires resourceVersionMatch=NotOlderThan and
  // bookmarks; the state sent is the newest, which is never older than asked.
  const bool send_initial_events = request.param("sendInitialEvents") == "true";
  if (send_initial_events) {
    if (request.param("resourceVersionMatch") != "NotOlderThan") {
      return sendError(writer, badRequest("resourceVersionMatch: Forbidden: sendInitialEvents "
                                          "requires setting resourceVersionMatch to NotOlderThan"));
    }
    from.reset();
  }
  std::shared_ptr<Watcher> watcher =
      state.store.watch(resourceKey(resource.kind), matches, from, send_initial_events);
  if (!watcher) {
    return sendError(writer, expired("too old resource version: " + version + " (" +
                                     std::to_string(state.store.compactedVersion()) + ")"));
  }
  const bool table = wantsTable(request);
  const bool bookmarks =
      request.param("allowWatchBookmarks") == "true" || request.param("allowWatchBookmarks") == "1";
  const auto bookmark_interval =
      std::chrono::milliseconds(std::max(1, state.options.bookmark_interval_ms));
  Clock::time_point end = Clock::time_point::max();
  if (request.hasParam("timeoutSeconds")) {
    try {
      end = Clock::now() + std::chrono::seconds(std::stoll(request.param("timeoutSeconds")));
    } catch (const std::exception&) {
      state.store.unwatch(watcher);
      return sendError(writer, badRequest("timeoutSeconds: must be a whole number of seconds"));
    }
  }
  Clock::time_point next_bookmark = Clock::now() + bookmark_interval;
  if (!writer.startChunked(200, "application/json")) {
    state.store.unwatch(watcher);
    return;
  }
  for (;;) {
    Json event;
    uint64_t store_version = 0;
    Clock::time_point wake = std::min(
        {end, Clock::now() + kWatchPoll, bookmarks ? next_bookmark : Clock::time_point::max()});
    Watcher::Next next = state.store.next(*watcher, wake, event, store_version);
    if (next == Watcher::Next::kEvent) {
      if (event["type"] == "BOOKMARK") {
        event["object"]["kind"] = resource.kind.kind;
        event["object"]["apiVersion"] = resource.kind.apiVersion();
      }
      if (table) event["object"] = asTable(request, event["object"], resource.kind);
      if (!writer.writeChunk(event.dump() + "\n")) break;
      continue;
    }
    if (next == Watcher::Next::kExpired) {
      Json error = {{"type", "ERROR"},
                    {"object", statusObject(expired("The resourceVersion for the provided watch "
                                                    "is too old."))}};
      writer.writeChunk(error.dump() + "\n");
      writer.finishChunked();
      break;
    }
    if (next == Watcher::Next::kClosed || state.stopping.load() || Clock::now() >= end) {
      writer.finishChunked();
      break;
    }
    if (writer.peerClosed()) break;
    if (bookmarks && Clock::now() >= next_bookmark) {
      Json bookmark = {{"type", "BOOKMARK"},
                       {"object",
                        {{"kind", resource.kind.kind},
                         {"apiVersion", resource.kind.apiVersion()},
                         {"metadata", {{"resourceVersion", std::to_string(store_version)}}}}}};
      if (!writer.writeChunk(bookmark.dump() + "\n")) break;
      next_bookmark = Clock::now() + bookmark_interval;
    }
  }
  state.store.unwatch(watcher);
}

void sendResult(ResponseWriter& writer, const ApiResult& result) {
  if (!result.ok()) return sendError(writer, *result.error);
  sendJson(writer, result.code, result.body, result.warnings);
}

// Answers a resource request; returns the HTTP code sent.
void serveResource(ServerState& state, const HttpRequest& request, const ResourcePath& resource,
                   const UserInfo& user, ResponseWriter& writer) {
  const KindInfo& kind = resource.kind;
  const std::string& method = request.method;
  const bool collection = resource.name.empty();
  // Successful writes are counted before the answer leaves, so a client
  // that saw the answer also sees the count.
  auto finish = [&](const ApiResult& result) {
    bool write = method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
    if (write && result.ok()) {
      std::lock_guard<std::mutex> lock(state.mutex);
      ++state.writes_by_user[user.name];
    }
    sendResult(writer, result);
  };
  auto fail = [&](const ApiError& error) { sendError(writer, error); };
  if (kind.namespaced && resource.ns.empty() && !collection) {
    return fail(notFoundPath(request.path));
  }
  const bool watch =
      resource.watch || request.param("watch") == "1" || request.param("watch") == "true";
  if (state.options.rbac) {
    RequestAttributes attributes;
    attributes.verb = requestVerb(method, !collection, watch);
    attributes.api_group = kind.group;
    attributes.resource = kind.plural;
    attributes.subresource = resource.subresource;
    attributes.ns = kind.namespaced ? resource.ns : "";
    attributes.name = resource.name;
    if (attributes.verb == "list" || attributes.verb == "watch") {
      attributes.name = fieldSelectedName(request);
    }
    if (auto denied = state.authorizer.check(user, attributes)) return fail(*denied);
  }
  if (resource.subresource == "token") {
    if (method != "POST") {
      return fail(methodNotAllowed(method + " is not supported on the token subresource; POST a "
                                            "TokenRequest to create a token"));
    }
    return finish(state.service_account_tokens.createToken(
        resource.ns, resource.name, request.header("content-type"), request.body));
  }
  if (method == "GET") {
    if (watch) {
      return serveWatch(state, request, resource, writer);
    }
    ApiResult result;
    if (collection) {
      ListOptions options;
      if (auto error = selectors(request, options)) return fail(*error);
      if (request.hasParam("limit")) {
        try {
          options.limit = std::stoll(request.param("limit"));
        } catch (const std::exception&) {
          return fail(
              badRequest("limit: must be a whole number, got \"" + request.param("limit") + "\""));
        }
      }
      options.continue_token = request.param("continue");
      // resourceVersion N (N > 0): a state not older than N, which a server
      // that has not reached N cannot give.
      const std::string version = request.param("resourceVersion");
      uint64_t asked = 0;
      if (!version.empty() &&
          std::from_chars(version.data(), version.data() + version.size(), asked).ec ==
              std::errc() &&
          asked > state.store.resourceVersion()) {
        return fail(tooLargeResourceVersion(asked, state.store.resourceVersion()));
      }
      result = state.service.list(kind, resource.ns, options);
    } else if (resource.subresource == "scale") {
      result = state.service.getScale(kind, resource.ns, resource.name);
    } else {
      result = state.service.get(kind, resource.ns, resource.name);
    }
    if (result.ok() && wantsTable(request) && resource.subresource != "scale") {
      result.body = asTable(request, result.body, kind);
    }
    return finish(result);
  }
  WriteOptions options;
  if (auto error = writeOptions(request, options)) return fail(*error);
  if (method == "POST") {
    if (!collection) {
      return fail(methodNotAllowed("POST is not supported on a single " + kind.kind +
                                   "; create it by POSTing to its collection"));
    }
    ApiError error;
    std::optional<Json> body = bodyJson(request, error);
    if (!body) return fail(error);
    return finish(state.service.create(kind, resource.ns, *body, options));
  }
  if (method == "PUT" || method == "PATCH") {
    if (collection) {
      return fail(methodNotAllowed(method + " is not supported on a collection of " + kind.plural +
                                   "; name one object"));
    }
    if (method == "PATCH") {
      return finish(state.service.patch(kind, resource.ns, resource.name, resource.subresource,
                                        request.header("content-type"), request.body, options));
    }
    ApiError error;
    std::optional<Json> body = bodyJson(request, error);
    if (!body) return fail(error);
    return finish(state.service.update(kind, resource.ns, resource.name, resource.subresource,
                                       *body, options));
  }
  if (method == "DELETE") {
    if (!resource.subresource.empty()) {
      return fail(methodNotAllowed("DELETE is not supported on the " + resource.subresource +
                                   " subresource"));
    }
    Json delete_options = nullptr;
    if (!request.body.empty()) {
      ApiError error;
      std::optional<Json> body = bodyJson(request, error);
      if (!body) return fail(error);
      delete_options = *body;
    }
    if (request.hasParam("propagationPolicy")) {
      if (!delete_options.is_object()) delete_options = Json::object();
      delete_options["propagationPolicy"] = request.param("propagationPolicy");
    }
    if (!collection) {
      return finish(
          state.service.remove(kind, resource.ns, resource.name, delete_options, options.dry_run));
    }
    ListOptions list_options;
    if (auto error = selectors(request, list_options)) return fail(*error);
    ApiResult listed = state.service.list(kind, resource.ns, list_options);
    Json deleted = Json::array();
    for (const Json& object : listed.body["items"]) {
      ApiResult removed = state.service.remove(kind, object["metadata"].value("namespace", ""),
                                               object["metadata"].value("name", ""), delete_options,
                                               options.dry_run);
      if (removed.ok()) deleted.push_back(removed.body);
    }
    listed.body["items"] = deleted;
    return finish(listed);
  }
  return fail(
      methodNotAllowed("the server does not allow this method on the requested "
                       "resource: " +
                       method));
}

}  // namespace

void logRequest(ServerState& state, const HttpRequest& request) {
  const std::string user = userOf(state, request);
  std::lock_guard<std::mutex> lock(state.mutex);
  state.request_log.push_back(request.method + " " + request.target + " " + user);
}

void handleRequest(ServerState& state, const HttpRequest& request, ResponseWriter& raw_writer) {
  RecordingWriter writer(raw_writer, [&state, &request](int status) {
    RequestRecord record{request.method, request.target, userOf(state, request),
                         bearerToken(request), status};
    std::lock_guard<std::mutex> lock(state.mutex);
    state.answered.push_back(std::move(record));
  });
  std::optional<UserInfo> user = authenticate(state, request);
  // As with the real server's public-info-viewer role, requests without
  // credentials may read the version and health; wrong credentials may not.
  const bool public_path = request.path == "/version" || request.path == "/healthz" ||
                           request.path == "/livez" || request.path == "/readyz";
  if (!user && !(public_path && request.header("authorization").empty())) {
    return sendError(writer, unauthorized());
  }
  if (!user) user = UserInfo{"anonymous", {"system:unauthenticated"}, false, ""};
  try {
    if (answerNonResource(state, request, writer)) return;
    std::optional<ResourcePath> resource = parseResourcePath(state, request.path);
    if (!resource) return sendError(writer, notFoundPath(request.path));
    serveResource(state, request, *resource, *user, writer);
  } catch (const std::exception& error) {
    // A bug in the stand-in, not the client's fault: answer 500 with the reason.
    sendError(writer, ApiError{500, "InternalError",
                               std::string("an error on the server (") + error.what() +
                                   ") has prevented the request from succeeding"});
  }
}

}  // namespace tandem::testing
