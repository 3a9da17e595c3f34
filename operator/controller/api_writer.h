// The controller's only way to write to the API: every write is refused
// (ApiError reason "NotLeader") while the writer is closed, checked right
// before the call; successful writes are counted (the
// tandem_operator_api_writes_total metric).
//
// A fence, for leader election: close() refuses new writes at once, and
// each write begun before it makes no new try (a k8s::RetryGate on its
// thread: neither a transient failure's retry nor a conflict's); close()
// then waits for the tries already sent to be answered (one request
// timeout each at most, or the end of a retry's backoff sleep under way). A
// write that failed once the writer closed fails as NotLeader. A replica
// that lost its Lease says so (the leader gauge, the log) only once close()
// has returned, so none of its writes lands after it says it stopped. The
// API server takes no fencing token, so a try sent just before the renew
// deadline can still land after another replica has begun leading, when it
// takes longer than the margin between the renew deadline and the lease
// duration (5 s by default); as with client-go, keeping that margin above a
// write's answer time is the guard.
//
// Thread-safe as ApiClient is.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "operator/k8s/api_client.h"

namespace tandem::controller {

class ApiWriter {
 public:
  // Open (writing) or closed from the start.
  ApiWriter(k8s::ApiClient& client, bool open, std::function<void()> on_write);

  k8s::ApiClient& client() { return client_; }
  bool mayWrite() const;
  void open();
  // Refuses new writes, then returns once no write is in flight.
  void close();
  // Writes begun and not yet answered.
  int writesInFlight() const;

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
  // A write in flight while it lives; false when the writer is closed.
  class InFlight {
   public:
    explicit InFlight(ApiWriter& writer);
    ~InFlight();
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    explicit operator bool() const { return entered_; }

   private:
    ApiWriter& writer_;
    bool entered_;
  };

  k8s::ApiError notLeader() const;
  // `call()` (a k8s::Result) if the writer is open, counted when it
  // succeeds and `wrote()` says it wrote something.
  template <typename Call, typename Wrote = bool (*)()>
  auto guarded(
      const Call& call, const Wrote& wrote = [] { return true; }) -> decltype(call()) {
    InFlight in_flight(*this);
    if (!in_flight) return notLeader();
    // No retry once close() began: a try already sent is waited for, no
    // new one is made.
    k8s::RetryGate gate([this] { return mayWrite(); });
    auto result = call();
    if (result.isOk() && wrote()) on_write_();
    // A failure the closed gate did not retry is the lost Lease's doing.
    if (!result.isOk() && !mayWrite()) return notLeader();
    return result;
  }

  k8s::ApiClient& client_;
  std::function<void()> on_write_;
  mutable std::mutex mutex_;
  std::condition_variable drained_;
  bool open_;
  int in_flight_ = 0;
};

}  // namespace tandem::controller
