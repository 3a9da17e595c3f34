// The controller's only way to write to the API: every write is refused
// (ApiError reason "NotLeader") unless `may_write()` says this process leads,
// checked right before the call, so a replica that lost its Lease stops
// writing at once; successful writes are counted (the
// tandem_operator_api_writes_total metric).
//
// Thread-safe as ApiClient is.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "operator/k8s/api_client.h"

namespace tandem::controller {

class ApiWriter {
 public:
  ApiWriter(k8s::ApiClient& client, std::function<bool()> may_write,
            std::function<void()> on_write);

  k8s::ApiClient& client() { return client_; }
  bool mayWrite() const { return may_write_(); }

  k8s::Result<nlohmann::json> create(const k8s::ResourceType& type, const std::string& ns,
                                     const nlohmann::json& object);
  // Server-side apply with force (fieldManager tandem-operator).
  k8s::Result<nlohmann::json> apply(const k8s::ResourceType& type, const std::string& ns,
                                    const nlohmann::json& object);
  k8s::Result<k8s::Done> remove(const k8s::ResourceType& type, const std::string& ns,
                                const std::string& name);
  // PATCH application/merge-patch+json.
  k8s::Result<nlohmann::json> mergePatch(const k8s::ResourceType& type, const std::string& ns,
                                         const std::string& name, const nlohmann::json& patch);
  // ApiClient::readModifyWrite; `mutate` is not called once leadership is lost.
  k8s::Result<nlohmann::json> readModifyWrite(const k8s::ResourceType& type, const std::string& ns,
                                              const std::string& name,
                                              const std::function<bool(nlohmann::json&)>& mutate,
                                              const std::string& subresource = "");

 private:
  k8s::ApiError notLeader() const;
  // `call()` (a k8s::Result) if this process leads, counted when it succeeds.
  template <typename Call>
  auto guarded(const Call& call) -> decltype(call()) {
    if (!may_write_()) return notLeader();
    auto result = call();
    if (result.isOk()) on_write_();
    return result;
  }

  k8s::ApiClient& client_;
  std::function<bool()> may_write_;
  std::function<void()> on_write_;
};

}  // namespace tandem::controller
