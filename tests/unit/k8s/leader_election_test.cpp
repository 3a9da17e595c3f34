// LeaderElector against the in-process API server: steps driven by a fake
// clock (acquire, expiry, take-over, renew deadline, release), and the real
// loop with short durations.
#include "operator/k8s/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "tests/support/apiserver/api_server.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kNamespace[] = "election";
constexpr char kLeaseName[] = "tandem-operator";

bool waitUntil(const std::function<bool()>& condition, seconds timeout = seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// A clock that moves only when told to.
class FakeClock {
 public:
  std::chrono::steady_clock::time_point now() const {
    return start_ + milliseconds(offset_ms_.load());
  }
  void advance(milliseconds by) { offset_ms_ += by.count(); }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> offset_ms_{0};
};

// One candidate and what its callbacks saw.
struct Candidate {
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::unique_ptr<LeaderElector> elector;
};

class LeaderElectionTest : public ::testing::Test {
 protected:
  LeaderElectionTest() : client_(clusterConfig(server_)) {
    server_.put(
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNamespace}}}});
  }

  static ClusterConfig clusterConfig(const testing::ApiServer& server) {
    ClusterConfig config;
    config.server = server.url();
    config.source = "leader election test";
    return config;
  }

  LeaderElectionConfig config(const std::string& identity) {
    LeaderElectionConfig config;
    config.ns = kNamespace;
    config.name = kLeaseName;
    config.identity = identity;
    config.lease_duration = seconds(15);
    config.renew_deadline = seconds(10);
    config.retry_period = seconds(2);
    config.now = [this] { return clock_.now(); };
    return config;
  }

  void makeElector(Candidate& candidate, LeaderElectionConfig config) {
    candidate.elector = std::make_unique<LeaderElector>(
        client_, std::move(config), [&candidate] { candidate.started++; },
        [&candidate] { candidate.stopped++; });
  }

  nlohmann::json leaseSpec() const {
    auto lease = server_.get("coordination.k8s.io/v1", "Lease", kNamespace, kLeaseName);
    return lease.has_value() ? (*lease)["spec"] : nlohmann::json();
  }

  testing::ApiServer server_;
  ApiClient client_;
  FakeClock clock_;
};

bool isMicroTime(const nlohmann::json& value) {
  static const std::regex kMicroTime(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z)");
  return value.is_string() && std::regex_match(value.get<std::string>(), kMicroTime);
}

TEST_F(LeaderElectionTest, FirstCandidateAcquiresAndTheLeaseHasTheRightShape) {
  Candidate a;
  Candidate b;
  makeElector(a, config("a"));
  makeElector(b, config("b"));

  EXPECT_TRUE(a.elector->tryAcquireOrRenew());
  EXPECT_TRUE(a.elector->isLeader());
  EXPECT_EQ(a.started.load(), 1);
  EXPECT_FALSE(b.elector->tryAcquireOrRenew());
  EXPECT_FALSE(b.elector->isLeader());
  EXPECT_EQ(b.started.load(), 0);

  auto lease = server_.get("coordination.k8s.io/v1", "Lease", kNamespace, kLeaseName);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ((*lease)["apiVersion"], "coordination.k8s.io/v1");
  EXPECT_EQ((*lease)["kind"], "Lease");
  const nlohmann::json& spec = (*lease)["spec"];
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseDurationSeconds"], 15);
  EXPECT_EQ(spec["leaseTransitions"], 0);
  EXPECT_TRUE(isMicroTime(spec["acquireTime"])) << spec.dump();
  EXPECT_TRUE(isMicroTime(spec["renewTime"])) << spec.dump();

  // Renewing keeps the holder and acquireTime, and is not a transition.
  clock_.advance(seconds(2));
  EXPECT_TRUE(a.elector->tryAcquireOrRenew());
  EXPECT_EQ(leaseSpec()["holderIdentity"], "a");
  EXPECT_EQ(leaseSpec()["acquireTime"], spec["acquireTime"]);
  EXPECT_EQ(leaseSpec()["leaseTransitions"], 0);
  EXPECT_EQ(a.started.load(), 1);
}

TEST_F(LeaderElectionTest, ExpiredLeaseIsTakenOverAndTheOldLeaderStepsDown) {
  Candidate a;
  Candidate b;
  makeElector(a, config("a"));
  makeElector(b, config("b"));
  ASSERT_TRUE(a.elector->tryAcquireOrRenew());
  ASSERT_FALSE(b.elector->tryAcquireOrRenew());

  // a renews at 10 s: b, seeing the record change at 20 s, waits a full
  // lease from then.
  clock_.advance(seconds(10));
  ASSERT_TRUE(a.elector->tryAcquireOrRenew());
  clock_.advance(seconds(10));
  EXPECT_FALSE(b.elector->tryAcquireOrRenew());
  clock_.advance(seconds(14));
  EXPECT_FALSE(b.elector->tryAcquireOrRenew());

  // a stops renewing; once lease_duration has passed since b last saw a
  // change, b takes over.
  clock_.advance(seconds(2));
  EXPECT_TRUE(b.elector->tryAcquireOrRenew());
  EXPECT_TRUE(b.elector->isLeader());
  EXPECT_EQ(b.started.load(), 1);
  nlohmann::json spec = leaseSpec();
  EXPECT_EQ(spec["holderIdentity"], "b");
  EXPECT_EQ(spec["leaseTransitions"], 1);
  EXPECT_TRUE(isMicroTime(spec["acquireTime"]));

  // a's next step sees the other holder: it stops leading at once.
  EXPECT_TRUE(a.elector->isLeader());
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  EXPECT_FALSE(a.elector->isLeader());
  EXPECT_EQ(a.stopped.load(), 1);
  EXPECT_EQ(leaseSpec()["holderIdentity"], "b");
}

// Expiry follows the holder's leaseDurationSeconds (as client-go reads it),
// not the candidate's own setting.
TEST_F(LeaderElectionTest, ExpiryFollowsTheHoldersLeaseDuration) {
  Candidate a;
  makeElector(a, config("a"));
  nlohmann::json lease = {
      {"apiVersion", "coordination.k8s.io/v1"},
      {"kind", "Lease"},
      {"metadata", {{"name", kLeaseName}, {"namespace", kNamespace}}},
      {"spec", {{"holderIdentity", "someone-else"}, {"leaseDurationSeconds", 3600}}}};
  server_.put(lease);
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  clock_.advance(seconds(60));  // four of a's own lease durations
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  EXPECT_EQ(leaseSpec()["holderIdentity"], "someone-else");
  clock_.advance(seconds(3541));
  EXPECT_TRUE(a.elector->tryAcquireOrRenew());
  EXPECT_EQ(leaseSpec()["holderIdentity"], "a");
}

TEST_F(LeaderElectionTest, ReleaseOnStopLetsTheOtherAcquireAtOnce) {
  Candidate a;
  Candidate b;
  makeElector(a, config("a"));
  makeElector(b, config("b"));
  ASSERT_TRUE(a.elector->tryAcquireOrRenew());
  ASSERT_FALSE(b.elector->tryAcquireOrRenew());

  a.elector->stop();
  EXPECT_FALSE(a.elector->isLeader());
  EXPECT_EQ(a.stopped.load(), 1);
  nlohmann::json released = leaseSpec();
  EXPECT_EQ(released["holderIdentity"], "");
  EXPECT_EQ(released["leaseDurationSeconds"], 1);

  // No time has passed on b's clock.
  EXPECT_TRUE(b.elector->tryAcquireOrRenew());
  EXPECT_EQ(leaseSpec()["holderIdentity"], "b");
  EXPECT_EQ(leaseSpec()["leaseTransitions"], 1);
  EXPECT_EQ(leaseSpec()["leaseDurationSeconds"], 15);

  // Stopping twice, or a candidate that does not lead, changes nothing.
  a.elector->stop();
  EXPECT_EQ(a.stopped.load(), 1);
  EXPECT_EQ(leaseSpec()["holderIdentity"], "b");
}

// On stop, on_stopped_leading runs while the Lease is still held (the
// controller waits there for its writes in flight), then it is released.
TEST_F(LeaderElectionTest, OnStopTheLeaseIsReleasedAfterTheStoppedLeadingCallback) {
  std::string holder_when_stopped = "(not called)";
  LeaderElector elector(
      client_, config("a"), [] {}, [&] { holder_when_stopped = leaseSpec()["holderIdentity"]; });
  ASSERT_TRUE(elector.tryAcquireOrRenew());
  elector.stop();
  EXPECT_EQ(holder_when_stopped, "a");
  EXPECT_EQ(leaseSpec()["holderIdentity"], "");
}

TEST_F(LeaderElectionTest, LeaderThatCannotRenewWithinTheDeadlineStopsLeading) {
  Candidate a;
  makeElector(a, config("a"));
  ASSERT_TRUE(a.elector->tryAcquireOrRenew());

  // A failed renewal inside renew_deadline keeps the leadership.
  server_.injectConflicts(1, "Lease");
  clock_.advance(seconds(5));
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  EXPECT_TRUE(a.elector->isLeader());

  // Past renew_deadline since the last successful renewal: no longer leader.
  server_.injectConflicts(1, "Lease");
  clock_.advance(seconds(6));
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  EXPECT_FALSE(a.elector->isLeader());
  EXPECT_EQ(a.stopped.load(), 1);

  // The Lease is still ours: the next step takes it again.
  EXPECT_TRUE(a.elector->tryAcquireOrRenew());
  EXPECT_TRUE(a.elector->isLeader());
  EXPECT_EQ(a.started.load(), 2);
}

// The renew deadline is judged on the clock after the calls, which may take
// seconds each (an API server slow to answer): a leader whose failing step
// began 5 s after its last renewal and ended 10 s after it stops leading,
// before another candidate may take the Lease (it was judged on the clock
// read before the calls, and led on).
TEST_F(LeaderElectionTest, TheRenewDeadlineIsJudgedOnTheClockAfterTheCalls) {
  Candidate a;
  std::atomic<int64_t> per_read_ms{0};
  LeaderElectionConfig slow = config("a");
  slow.now = [this, &per_read_ms] {
    clock_.advance(milliseconds(per_read_ms.load()));
    return clock_.now();
  };
  makeElector(a, std::move(slow));
  ASSERT_TRUE(a.elector->tryAcquireOrRenew());
  per_read_ms = 5000;  // each reading of the clock: 5 s later than the last
  server_.injectConflicts(1, "Lease");
  EXPECT_FALSE(a.elector->tryAcquireOrRenew());
  EXPECT_FALSE(a.elector->isLeader());
  EXPECT_EQ(a.stopped.load(), 1);
}

TEST_F(LeaderElectionTest, RealLoopElectsOneLeaderAndFailsOverOnStop) {
  auto real_config = [](const std::string& identity) {
    LeaderElectionConfig config;
    config.ns = kNamespace;
    config.name = kLeaseName;
    config.identity = identity;
    config.lease_duration = milliseconds(1000);
    config.renew_deadline = milliseconds(700);
    config.retry_period = milliseconds(200);
    return config;
  };
  Candidate a;
  Candidate b;
  makeElector(a, real_config("a"));
  makeElector(b, real_config("b"));
  a.elector->start();
  b.elector->start();

  // on_started_leading runs right after isLeader() turns true: wait for both.
  ASSERT_TRUE(waitUntil([&] { return a.started.load() + b.started.load() >= 1; }));
  EXPECT_NE(a.elector->isLeader(), b.elector->isLeader());
  EXPECT_EQ(a.started.load() + b.started.load(), 1);
  Candidate& leader = a.elector->isLeader() ? a : b;
  Candidate& other = a.elector->isLeader() ? b : a;
  const std::string other_identity = &other == &a ? "a" : "b";

  leader.elector->stop();
  EXPECT_FALSE(leader.elector->isLeader());
  EXPECT_EQ(leader.stopped.load(), 1);
  ASSERT_TRUE(waitUntil([&] { return other.started.load() >= 1; }));
  EXPECT_TRUE(other.elector->isLeader());
  EXPECT_EQ(other.started.load(), 1);
  EXPECT_EQ(leaseSpec()["holderIdentity"], other_identity);
  other.elector->stop();
  EXPECT_EQ(other.stopped.load(), 1);
  EXPECT_EQ(leaseSpec()["holderIdentity"], "");
}

}  // namespace
}  // namespace tandem::k8s
