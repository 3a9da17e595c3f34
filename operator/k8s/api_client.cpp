#include "operator/k8s/api_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "common/json_parse.h"
#include "operator/k8s/http_transport.h"
#include "operator/k8s/watch_stream.h"

namespace tandem::k8s {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";
constexpr char kMergePatch[] = "application/merge-patch+json";
constexpr char kApplyPatch[] = "application/apply-patch+yaml";
// How much of a non-JSON error body a message quotes.
constexpr size_t kQuotedBodyBytes = 512;
// The most of a watch's error answer that is read.
constexpr size_t kMaxErrorBodyBytes = size_t{1} << 20;
// A watch's read deadline is its timeoutSeconds plus this, so that the
// server, not the client, normally ends it.
constexpr double kWatchDeadlineMarginS = 30;

std::string stringField(const json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string metadataField(const json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto metadata = object.find("metadata");
  return metadata == object.end() ? std::string() : stringField(*metadata, key);
}

std::string withoutSpaces(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
  return text;
}

// The ApiError a non-2xx answer stands for: its Status object when it has
// one, else the status line and the start of the body.
ApiError errorFromAnswer(const HttpResponse& response, const std::string& description) {
  JsonParseError parse_error;
  auto body = parseJson(response.body, parse_error);
  if (body && body->is_object() &&
      (stringField(*body, "kind") == "Status" || body->contains("reason") ||
       body->contains("message"))) {
    std::string reason = stringField(*body, "reason");
    if (reason.empty()) reason = withoutSpaces(response.reason);
    std::string message = stringField(*body, "message");
    if (message.empty()) message = description + " answered " + std::to_string(response.status);
    return ApiError{response.status, reason, message};
  }
  std::string message = response.body.substr(0, kQuotedBodyBytes);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) {
    message.pop_back();
  }
  if (message.empty()) message = description + " answered " + std::to_string(response.status);
  return ApiError{response.status, withoutSpaces(response.reason), message};
}

// Retry-After in seconds (the HTTP-date form is not used by the API server).
std::optional<std::chrono::milliseconds> parseRetryAfter(const std::string& value) {
  if (value.empty() || value.size() > 6 ||
      value.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::chrono::seconds(std::stoi(value));
}

std::string queryString(const std::vector<std::pair<std::string, std::string>>& parameters) {
  std::string query;
  for (const auto& [key, value] : parameters) {
    query += query.empty() ? "?" : "&";
    query += key + "=" + urlEncode(value);
  }
  return query;
}

// The namespace a call on `object` uses: the one given, else the object's own.
std::string namespaceFor(const ResourceType& type, const std::string& ns, const json& object) {
  if (!type.namespaced) return "";
  return ns.empty() ? metadataField(object, "namespace") : ns;
}

ApiError callerError(const std::string& message) { return ApiError{400, "BadRequest", message}; }

}  // namespace

std::chrono::milliseconds backoffDelay(int attempt, std::chrono::milliseconds initial,
                                       std::chrono::milliseconds max) {
  thread_local std::mt19937_64 random_engine{std::random_device{}()};
  int64_t base = std::max<int64_t>(initial.count(), 1);
  for (int i = 0; i < attempt && base < max.count(); ++i) base *= 2;
  base = std::min<int64_t>(base, std::max<int64_t>(max.count(), 1));
  std::uniform_int_distribution<int64_t> jitter(base / 2, base);
  return std::chrono::milliseconds(jitter(random_engine));
}

namespace {
thread_local const RetryGate* innermost_gate = nullptr;
}  // namespace

RetryGate::RetryGate(std::function<bool()> keep_trying)
    : keep_trying_(std::move(keep_trying)), outer_(innermost_gate) {
  innermost_gate = this;
}

RetryGate::~RetryGate() { innermost_gate = outer_; }

bool RetryGate::open() {
  for (const RetryGate* gate = innermost_gate; gate != nullptr; gate = gate->outer_) {
    if (!gate->keep_trying_()) return false;
  }
  return true;
}

class ApiClient::Impl {
 public:
  Impl(const ClusterConfig& config, const RetryPolicy& retry, std::atomic<uint64_t>& request_count)
      : config_(config), retry_(retry), request_count_(request_count), transport_(config) {}

  // One exchange with retries: `send(token)` makes one attempt and returns the
  // answer (any status) or a transport error. Returns a 2xx answer or the error.
  Result<HttpResponse> withRetries(
      const std::string& description,
      const std::function<Result<HttpResponse>(const std::string&)>& send) {
    bool token_reread = false;
    const int attempts = std::max(retry_.attempts, 1);
    for (int attempt = 0;; ++attempt) {
      auto token = currentToken(false);
      if (!token.isOk()) return token.error();
      auto answer = send(token.value());
      if (!answer.isOk() && answer.error().reason == "ConfigError") return answer.error();
      ++request_count_;
      ApiError error;
      std::optional<std::chrono::milliseconds> retry_after;
      if (!answer.isOk()) {
        error = answer.error();
      } else if (answer->status >= 200 && answer->status < 300) {
        return answer;
      } else {
        if (answer->status == 401 && !config_.token_file.empty() && !token_reread &&
            RetryGate::open()) {
          // The token may have been rotated since it was read: read it again, once.
          token_reread = true;
          auto reread = currentToken(true);
          if (!reread.isOk()) return reread.error();
          --attempt;
          continue;
        }
        error = errorFromAnswer(answer.value(), description);
        if (answer->status == 429) retry_after = parseRetryAfter(answer->retry_after);
      }
      if (!error.isTransient() || attempt + 1 >= attempts || !RetryGate::open()) return error;
      auto delay = backoffDelay(attempt, retry_.initial_backoff, retry_.max_backoff);
      if (retry_after) delay = std::min(*retry_after, retry_.max_backoff);
      std::this_thread::sleep_for(delay);
      if (!RetryGate::open()) return error;
    }
  }

  // A request whose answer is one JSON document.
  Result<json> callJson(const std::string& method, const std::string& target,
                        const std::string& content_type = "", const std::string& body = "") {
    HttpRequest request{method, target, content_type, body, ""};
    const std::string description = transport_.describe(request);
    auto answer = withRetries(description, [&](const std::string& token) {
      request.bearer_token = token;
      return transport_.roundTrip(request);
    });
    if (!answer.isOk()) return answer.error();
    if (answer->body.empty()) return json::object();
    JsonParseError parse_error;
    auto parsed = parseJson(answer->body, parse_error);
    if (!parsed) {
      return ApiError{0, "BadResponse",
                      description + ": the answer is not JSON: " + parse_error.detail};
    }
    return std::move(*parsed);
  }

  Result<std::unique_ptr<WatchStream>> openWatch(const std::string& target, double deadline_s) {
    HttpRequest request{"GET", target, "", "", ""};
    const std::string description = transport_.describe(request);
    std::unique_ptr<HttpStream> opened;
    auto answer = withRetries(description, [&](const std::string& token) -> Result<HttpResponse> {
      request.bearer_token = token;
      auto stream = transport_.openStream(request, deadline_s);
      if (!stream.isOk()) return stream.error();
      HttpResponse response;
      response.status = stream.value()->status();
      response.reason = stream.value()->reason();
      if (response.status >= 200 && response.status < 300) {
        opened = std::move(stream).value();
        return response;
      }
      // An error answer: its Status object is the whole body.
      while (response.body.size() < kMaxErrorBodyBytes) {
        auto more = stream.value()->readSome(response.body);
        if (!more.isOk() || !more.value()) break;
      }
      return response;
    });
    if (!answer.isOk()) return answer.error();
    return std::unique_ptr<WatchStream>(
        std::make_unique<HttpWatchStream>(std::move(opened), description));
  }

 private:
  // The bearer token: the configured one, or the token file's content, read
  // again when its modification time or size changed (or `force`).
  Result<std::string> currentToken(bool force) {
    if (config_.token_file.empty()) return config_.token;
    std::lock_guard lock(token_mutex_);
    struct stat info {};
    if (::stat(config_.token_file.c_str(), &info) != 0) {
      return ApiError{0, "ConfigError",
                      config_.source + ": token file " + config_.token_file.string() +
                          " cannot be read: " + std::strerror(errno)};
    }
    const bool changed = !token_loaded_ || info.st_mtim.tv_sec != token_mtime_.tv_sec ||
                         info.st_mtim.tv_nsec != token_mtime_.tv_nsec ||
                         info.st_size != token_size_;
    if (changed || force) {
      std::ifstream in(config_.token_file, std::ios::binary);
      std::ostringstream text;
      if (in) text << in.rdbuf();
      if (!in || in.bad()) {
        return ApiError{
            0, "ConfigError",
            config_.source + ": token file " + config_.token_file.string() + " cannot be read"};
      }
      std::string token = text.str();
      while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
        token.pop_back();
      }
      if (token.empty()) {
        return ApiError{
            0, "ConfigError",
            config_.source + ": token file " + config_.token_file.string() + " is empty"};
      }
      file_token_ = std::move(token);
      token_mtime_ = info.st_mtim;
      token_size_ = info.st_size;
      token_loaded_ = true;
    }
    return file_token_;
  }

  const ClusterConfig& config_;
  const RetryPolicy& retry_;
  std::atomic<uint64_t>& request_count_;
  HttpTransport transport_;

  std::mutex token_mutex_;
  std::string file_token_;
  bool token_loaded_ = false;
  timespec token_mtime_{};
  off_t token_size_ = 0;
};

ApiClient::ApiClient(ClusterConfig config, RetryPolicy retry)
    : config_(std::move(config)), retry_(retry) {
  impl_ = std::make_unique<Impl>(config_, retry_, request_count_);
}

ApiClient::~ApiClient() = default;

Result<json> ApiClient::get(const ResourceType& type, const std::string& ns,
                            const std::string& name, const std::string& subresource) {
  if (name.empty()) return callerError("get of " + type.kind + ": no name given");
  return impl_->callJson("GET", type.objectPath(type.namespaced ? ns : "", name, subresource));
}

Result<json> ApiClient::listPage(const ResourceType& type, const std::string& ns,
                                 const ListOptions& options, const std::string& continue_token) {
  std::vector<std::pair<std::string, std::string>> query;
  if (!options.label_selector.empty()) query.emplace_back("labelSelector", options.label_selector);
  if (!options.field_selector.empty()) query.emplace_back("fieldSelector", options.field_selector);
  if (options.limit > 0) query.emplace_back("limit", std::to_string(options.limit));
  if (!continue_token.empty()) {
    query.emplace_back("continue", continue_token);
  } else if (!options.resource_version.empty()) {
    // The API refuses resourceVersion together with continue.
    query.emplace_back("resourceVersion", options.resource_version);
  }
  return impl_->callJson("GET",
                         type.collectionPath(type.namespaced ? ns : "") + queryString(query));
}

Result<json> ApiClient::list(const ResourceType& type, const std::string& ns,
                             const ListOptions& options) {
  bool restarted = false;
  while (true) {
    auto first = listPage(type, ns, options, "");
    if (!first.isOk()) return first.error();
    json result = std::move(first).value();
    if (!result.contains("items") || !result["items"].is_array()) result["items"] = json::array();
    std::string continue_token = metadataField(result, "continue");
    bool expired = false;
    while (!continue_token.empty()) {
      auto page = listPage(type, ns, options, continue_token);
      if (!page.isOk()) {
        if (page.error().isGone() && !restarted) {
          expired = true;
          break;
        }
        return page.error();
      }
      if (page->contains("items") && (*page)["items"].is_array()) {
        for (auto& item : (*page)["items"]) result["items"].push_back(std::move(item));
      }
      continue_token = metadataField(page.value(), "continue");
    }
    if (expired) {
      // The continue token outlived the server's history: start again, once.
      restarted = true;
      continue;
    }
    if (result.contains("metadata") && result["metadata"].is_object()) {
      result["metadata"].erase("continue");
      result["metadata"].erase("remainingItemCount");
    }
    return result;
  }
}

Result<json> ApiClient::create(const ResourceType& type, const std::string& ns,
                               const json& object) {
  return impl_->callJson("POST", type.collectionPath(namespaceFor(type, ns, object)), kJson,
                         object.dump());
}

Result<json> ApiClient::update(const ResourceType& type, const std::string& ns, const json& object,
                               const std::string& subresource) {
  const std::string name = metadataField(object, "name");
  if (name.empty())
    return callerError("update of " + type.kind + ": the object has no metadata.name");
  return impl_->callJson("PUT", type.objectPath(namespaceFor(type, ns, object), name, subresource),
                         kJson, object.dump());
}

Result<json> ApiClient::readModifyWrite(const ResourceType& type, const std::string& ns,
                                        const std::string& name,
                                        const std::function<bool(json&)>& mutate,
                                        const std::string& subresource) {
  const int attempts = std::max(retry_.attempts, 1);
  for (int attempt = 0;; ++attempt) {
    auto current = get(type, ns, name, subresource);
    if (!current.isOk()) return current.error();
    json changed = current.value();
    if (!mutate(changed)) return current;
    auto written = update(type, ns, changed, subresource);
    if (written.isOk() || !written.error().isConflict() || attempt + 1 >= attempts ||
        !RetryGate::open()) {
      return written;
    }
    std::this_thread::sleep_for(backoffDelay(attempt, retry_.initial_backoff, retry_.max_backoff));
    if (!RetryGate::open()) return written;
  }
}

Result<json> ApiClient::mergePatch(const ResourceType& type, const std::string& ns,
                                   const std::string& name, const json& patch,
                                   const std::string& subresource) {
  if (name.empty()) return callerError("merge patch of " + type.kind + ": no name given");
  return impl_->callJson("PATCH", type.objectPath(type.namespaced ? ns : "", name, subresource),
                         kMergePatch, patch.dump());
}

Result<json> ApiClient::apply(const ResourceType& type, const std::string& ns, const json& object,
                              const std::string& subresource, const std::string& field_manager) {
  const std::string name = metadataField(object, "name");
  if (name.empty())
    return callerError("apply of " + type.kind + ": the object has no metadata.name");
  const std::string query = queryString({{"fieldManager", field_manager}, {"force", "true"}});
  return impl_->callJson("PATCH",
                         type.objectPath(namespaceFor(type, ns, object), name, subresource) + query,
                         kApplyPatch, object.dump());
}

Result<Done> ApiClient::remove(const ResourceType& type, const std::string& ns,
                               const std::string& name) {
  if (name.empty()) return callerError("delete of " + type.kind + ": no name given");
  static const std::string kBody =
      json{{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Background"}}
          .dump();
  auto answer =
      impl_->callJson("DELETE", type.objectPath(type.namespaced ? ns : "", name), kJson, kBody);
  if (!answer.isOk() && !answer.error().isNotFound()) return answer.error();
  return Done{};
}

Result<std::unique_ptr<WatchStream>> ApiClient::watch(const ResourceType& type,
                                                      const std::string& ns,
                                                      const WatchOptions& options) {
  std::vector<std::pair<std::string, std::string>> query{{"watch", "1"}};
  if (!options.resource_version.empty()) {
    query.emplace_back("resourceVersion", options.resource_version);
  }
  if (options.allow_bookmarks) query.emplace_back("allowWatchBookmarks", "true");
  if (options.timeout_seconds > 0) {
    query.emplace_back("timeoutSeconds", std::to_string(options.timeout_seconds));
  }
  if (!options.label_selector.empty()) query.emplace_back("labelSelector", options.label_selector);
  if (!options.field_selector.empty()) query.emplace_back("fieldSelector", options.field_selector);
  // Without timeoutSeconds the server keeps the watch open as long as it likes.
  const double deadline_s =
      options.timeout_seconds > 0 ? options.timeout_seconds + kWatchDeadlineMarginS : 24 * 3600.0;
  return impl_->openWatch(type.collectionPath(type.namespaced ? ns : "") + queryString(query),
                          deadline_s);
}

Result<json> ApiClient::getPath(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return callerError("getPath: the path must start with '/', got \"" + path + "\"");
  }
  return impl_->callJson("GET", path);
}

}  // namespace tandem::k8s
