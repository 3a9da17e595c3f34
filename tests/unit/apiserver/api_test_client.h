// A JSON client of the test API server for its unit tests (cpp-httplib),
// and a watch stream reader that collects events on a thread of its own.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/apiserver/api_server.h"

namespace tandem::testing {

struct JsonAnswer {
  int status = 0;  // 0: no answer
  nlohmann::json body;
  std::string text;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  httplib::Headers headers;
};

class ApiTestClient {
 public:
  explicit ApiTestClient(const ApiServer& server, std::string token = "")
      : client_("127.0.0.1", server.port()), token_(std::move(token)) {
    client_.set_read_timeout(std::chrono::seconds(20));
  }

  JsonAnswer get(const std::string& path, const std::string& accept = "application/json") {
    return answer(client_.Get(path.c_str(), headers(accept)));
  }
  JsonAnswer post(const std::string& path, const nlohmann::json& body) {
    return answer(client_.Post(path.c_str(), headers(), body.dump(), "application/json"));
  }
  JsonAnswer put(const std::string& path, const nlohmann::json& body) {
    return answer(client_.Put(path.c_str(), headers(), body.dump(), "application/json"));
  }
  JsonAnswer patch(const std::string& path, const std::string& body,
                   const std::string& content_type) {
    return answer(client_.Patch(path.c_str(), headers(), body, content_type.c_str()));
  }
  JsonAnswer del(const std::string& path) {
    return answer(client_.Delete(path.c_str(), headers()));
  }
  httplib::Client& raw() { return client_; }

 private:
  httplib::Headers headers(const std::string& accept = "application/json") const {
    httplib::Headers out{{"Accept", accept}};
    if (!token_.empty()) out.emplace("Authorization", "Bearer " + token_);
    return out;
  }
  static JsonAnswer answer(const httplib::Result& result) {
    JsonAnswer out;
    if (!result) return out;
    out.status = result->status;
    out.text = result->body;
    out.headers = result->headers;
    out.body = nlohmann::json::parse(result->body, nullptr, false);
    return out;
  }

  httplib::Client client_;
  std::string token_;
};

// Reads a watch stream (GET path) on its own thread; events are the JSON lines.
class WatchReader {
 public:
  WatchReader(const ApiServer& server, const std::string& path)
      : client_("127.0.0.1", server.port()) {
    client_.set_read_timeout(std::chrono::seconds(60));
    thread_ = std::thread([this, path] {
      auto result = client_.Get(
          path.c_str(), httplib::Headers{{"Accept", "application/json"}},
          [this](const httplib::Response& response) {
            std::lock_guard<std::mutex> lock(mutex_);
            status_ = response.status;
            return true;
          },
          [this](const char* data, size_t length) {
            std::lock_guard<std::mutex> lock(mutex_);
            buffer_.append(data, length);
            for (size_t end; (end = buffer_.find('\n')) != std::string::npos;) {
              events_.push_back(nlohmann::json::parse(buffer_.substr(0, end), nullptr, false));
              buffer_.erase(0, end + 1);
            }
            changed_.notify_all();
            return !stop_;
          });
      std::lock_guard<std::mutex> lock(mutex_);
      if (result && status_ == 0) status_ = result->status;
      if (result && result->status != 200) error_body_ = result->body;
      ended_ = true;
      changed_.notify_all();
    });
  }
  ~WatchReader() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    client_.stop();
    thread_.join();
  }

  // The events so far once there are at least `count` (or the deadline passed, or the stream
  // ended).
  std::vector<nlohmann::json> waitForEvents(
      size_t count, std::chrono::seconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, timeout, [&] { return events_.size() >= count || ended_; });
    return events_;
  }
  // True once the stream ended within the timeout.
  bool waitForEnd(std::chrono::seconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return ended_; });
  }
  int status() {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }

 private:
  httplib::Client client_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string buffer_;
  std::vector<nlohmann::json> events_;
  std::string error_body_;
  int status_ = 0;
  bool ended_ = false;
  bool stop_ = false;
};

inline nlohmann::json configMap(const std::string& name,
                                nlohmann::json labels = nlohmann::json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"data", {{"key", "value"}}}};
}

inline nlohmann::json prefillPool(const std::string& name) {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", "PrefillPool"},
          {"metadata", {{"name", name}}},
          {"spec", {{"model", {{"path", "/models/llama"}}}}}};
}

// A Deployment "agent" of `replicas` pods labelled app=agent running `pod_spec`.
inline nlohmann::json agentDeployment(const nlohmann::json& pod_spec, int64_t replicas = 2) {
  return {{"apiVersion", "apps/v1"},
          {"kind", "Deployment"},
          {"metadata", {{"name", "agent"}}},
          {"spec",
           {{"replicas", replicas},
            {"selector", {{"matchLabels", {{"app", "agent"}}}}},
            {"template", {{"metadata", {{"labels", {{"app", "agent"}}}}}, {"spec", pod_spec}}}}}};
}

inline std::string crdDirectory() { return std::string(TANDEM_SOURCE_DIR) + "/crds"; }

}  // namespace tandem::testing
