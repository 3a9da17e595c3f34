// Leader election on a coordination.k8s.io/v1 Lease, with client-go's
// semantics: a candidate takes the Lease when it is unheld or expired, the
// holder renews it every `retry_period`; expiry is judged on the candidate's
// own clock, the record's leaseDurationSeconds (written by the holder; ours,
// `lease_duration`, when absent) after it last saw the record change (never
// from the timestamps in the record, which come from another machine's
// clock); a leader that has not renewed within `renew_deadline` stops
// leading (on_stopped_leading) and must stop writing; release() on shutdown
// clears holderIdentity so another candidate takes over at once.
//
// The clock is injected so tests can run leases without sleeping: every
// expiry and deadline decision uses config.now; the loop sleeps real time
// between steps. The timestamps written to the Lease (acquireTime,
// renewTime) are the wall clock, RFC 3339 with microseconds.
//
// Callbacks run on the thread that changed the state (the loop's, or the
// caller of tryAcquireOrRenew()/stop()) and must not call stop() or
// tryAcquireOrRenew(). on_stopped_leading may wait for the caller's writes
// in flight (the controller's write fence): the election waits with it, and
// on stop() the Lease is released only after it returns.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "operator/k8s/api_client.h"

namespace tandem::k8s {

struct LeaderElectionConfig {
  std::string ns;
  std::string name = "tandem-operator";
  std::string identity;  // unique per process: "<hostname>_<random>"
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
};

class LeaderElector {
 public:
  LeaderElector(ApiClient& client, LeaderElectionConfig config,
                std::function<void()> on_started_leading, std::function<void()> on_stopped_leading);
  ~LeaderElector();  // stops and releases

  // Starts the election loop on its own thread.
  void start();
  // Stops the loop; when leading, calls on_stopped_leading, then releases
  // the Lease (holderIdentity cleared).
  void stop();
  // True only while this candidate holds a Lease it renewed within renew_deadline.
  bool isLeader() const { return leader_.load(); }
  // One acquire-or-renew attempt (the loop's step), for tests with an injected clock.
  bool tryAcquireOrRenew();

 private:
  class Loop;
  using TimePoint = std::chrono::steady_clock::time_point;
  // Requires step_mutex_. Become leader / stop leading, calling the callbacks.
  void startLeadingLocked(TimePoint now);
  void stopLeadingLocked();
  // After a failed step: stops leading once renew_deadline has passed since
  // the last renewal, on the clock as it is now.
  void stopLeadingPastDeadlineLocked();
  // Requires step_mutex_. Writes `lease` with us as holder; false on any error.
  bool writeLeaseLocked(nlohmann::json lease, bool create, TimePoint now);
  // Requires step_mutex_. Clears holderIdentity when we hold the Lease.
  void releaseLocked();

  ApiClient& client_;
  LeaderElectionConfig config_;
  std::function<void()> on_started_leading_;
  std::function<void()> on_stopped_leading_;
  std::atomic<bool> leader_{false};
  std::mutex step_mutex_;  // serializes steps, release and the fields below
  // The Lease as we last saw it (resourceVersion and spec), and when, on config.now.
  std::string observed_version_;
  nlohmann::json observed_spec_;
  TimePoint observed_time_{};
  TimePoint last_renew_{};  // our last successful write as holder
  std::unique_ptr<Loop> loop_;
};

}  // namespace tandem::k8s
