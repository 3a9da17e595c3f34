// The admission gate: slots up to the limit, then a queue in arrival order;
// a leaving request hands its slot to the first waiter and wakes it; a
// cancelled waiter leaves the queue (or keeps a slot granted meanwhile);
// closing the gate wakes every waiter ungranted.
#include "operator/router/admission_gate.h"

#include <gtest/gtest.h>

namespace tandem::router {
namespace {

AdmissionGate::WaiterPtr waiter(int* woken) {
  auto w = std::make_shared<AdmissionGate::Waiter>();
  w->wake = [woken] { *woken += 1; };
  return w;
}

TEST(AdmissionGate, AdmitsUpToTheLimitQueuesThenRefuses) {
  AdmissionGate gate(2, 1);
  int woken = 0;
  EXPECT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kAdmitted);
  EXPECT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kAdmitted);
  EXPECT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kQueued);
  EXPECT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kRefused);
  EXPECT_EQ(gate.inflight(), 2);
  EXPECT_EQ(gate.queued(), 1);
  EXPECT_EQ(woken, 0);
}

TEST(AdmissionGate, ALeavingRequestHandsItsSlotToTheFirstWaiter) {
  AdmissionGate gate(1, 2);
  int first_woken = 0, second_woken = 0;
  auto first = waiter(&first_woken), second = waiter(&second_woken);
  ASSERT_EQ(gate.enter(waiter(&first_woken)), AdmissionGate::Entry::kAdmitted);
  ASSERT_EQ(gate.enter(first), AdmissionGate::Entry::kQueued);
  ASSERT_EQ(gate.enter(second), AdmissionGate::Entry::kQueued);
  gate.leave();
  EXPECT_EQ(first_woken, 1);
  EXPECT_TRUE(gate.granted(first));
  EXPECT_EQ(second_woken, 0);
  EXPECT_FALSE(gate.granted(second));
  EXPECT_EQ(gate.inflight(), 1);
  EXPECT_EQ(gate.queued(), 1);
  EXPECT_FALSE(gate.cancel(first)) << "granted: the caller holds the slot";
  gate.leave();
  EXPECT_TRUE(gate.granted(second));
  gate.leave();
  EXPECT_EQ(gate.inflight(), 0);
  EXPECT_EQ(gate.queued(), 0);
}

TEST(AdmissionGate, ACancelledWaiterLeavesTheQueueAndGetsNoSlot) {
  AdmissionGate gate(1, 2);
  int woken = 0;
  auto gone = waiter(&woken), next = waiter(&woken);
  ASSERT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kAdmitted);
  ASSERT_EQ(gate.enter(gone), AdmissionGate::Entry::kQueued);
  ASSERT_EQ(gate.enter(next), AdmissionGate::Entry::kQueued);
  EXPECT_TRUE(gate.cancel(gone));
  EXPECT_EQ(gate.queued(), 1);
  gate.leave();
  EXPECT_FALSE(gate.granted(gone));
  EXPECT_TRUE(gate.granted(next));
  EXPECT_EQ(woken, 1);
  gate.leave();
  EXPECT_EQ(gate.inflight(), 0);
}

TEST(AdmissionGate, ClosingWakesEveryWaiterUngrantedAndRefusesNewOnes) {
  AdmissionGate gate(1, 2);
  int woken = 0;
  auto a = waiter(&woken), b = waiter(&woken);
  ASSERT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kAdmitted);
  ASSERT_EQ(gate.enter(a), AdmissionGate::Entry::kQueued);
  ASSERT_EQ(gate.enter(b), AdmissionGate::Entry::kQueued);
  gate.close();
  EXPECT_EQ(woken, 2);
  EXPECT_TRUE(gate.cancel(a));
  EXPECT_TRUE(gate.cancel(b));
  EXPECT_EQ(gate.enter(waiter(&woken)), AdmissionGate::Entry::kRefused);
  gate.leave();
  EXPECT_EQ(gate.inflight(), 0);
}

}  // namespace
}  // namespace tandem::router
