// WorkQueue: de-duplication, re-queue on done(), one worker per key, delayed
// and rate-limited adds, shutdown.
#include "operator/k8s/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;

TEST(WorkQueueTest, KeyAddedManyTimesIsProcessedOnce) {
  WorkQueue queue;
  queue.add("ns/a");
  queue.add("ns/b");
  queue.add("ns/a");
  queue.add("ns/a");
  EXPECT_EQ(queue.depth(), 2u);
  EXPECT_EQ(queue.get(), "ns/a");
  EXPECT_EQ(queue.get(), "ns/b");
  EXPECT_EQ(queue.depth(), 0u);
  queue.done("ns/a");
  queue.done("ns/b");
  EXPECT_EQ(queue.depth(), 0u);
}

TEST(WorkQueueTest, KeyAddedWhileProcessingIsProcessedOnceMoreAfterDone) {
  WorkQueue queue;
  queue.add("a");
  ASSERT_EQ(queue.get(), "a");
  queue.add("a");
  queue.add("a");
  queue.add("b");
  EXPECT_EQ(queue.depth(), 2u);
  // "a" is held: the next key is "b" even though "a" was added first.
  EXPECT_EQ(queue.get(), "b");
  queue.done("b");
  EXPECT_EQ(queue.depth(), 1u);
  queue.done("a");
  EXPECT_EQ(queue.get(), "a");
  queue.done("a");
  EXPECT_EQ(queue.depth(), 0u);
}

TEST(WorkQueueTest, KeyNotAddedAgainIsNotRequeuedAtDone) {
  WorkQueue queue;
  queue.add("a");
  ASSERT_EQ(queue.get(), "a");
  queue.done("a");
  EXPECT_EQ(queue.depth(), 0u);
  queue.add("b");
  EXPECT_EQ(queue.get(), "b");
}

TEST(WorkQueueTest, TwoWorkersNeverHoldTheSameKey) {
  WorkQueue queue;
  constexpr int kKeys = 8;
  constexpr int kAddsPerKey = 300;
  std::mutex mutex;
  std::set<std::string> held;
  std::map<std::string, int> processed;
  std::atomic<int> overlaps{0};

  auto worker = [&] {
    while (auto key = queue.get()) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!held.insert(*key).second) overlaps++;
      }
      std::this_thread::yield();
      {
        std::lock_guard<std::mutex> lock(mutex);
        held.erase(*key);
        processed[*key]++;
      }
      queue.done(*key);
    }
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) workers.emplace_back(worker);
  for (int round = 0; round < kAddsPerKey; ++round) {
    for (int k = 0; k < kKeys; ++k) queue.add("key-" + std::to_string(k));
  }
  // Every key is processed at least once after its last add.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (queue.depth() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  queue.shutDown();
  for (auto& thread : workers) thread.join();

  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(queue.depth(), 0u);
  ASSERT_EQ(processed.size(), static_cast<size_t>(kKeys));
  for (const auto& [key, count] : processed) {
    EXPECT_GE(count, 1) << key;
    EXPECT_LE(count, kAddsPerKey) << key;
  }
}

TEST(WorkQueueTest, AddAfterIsNotReadyBeforeItsTime) {
  WorkQueue queue;
  auto added_at = std::chrono::steady_clock::now();
  queue.addAfter("late", milliseconds(60));
  queue.add("now");
  EXPECT_EQ(queue.depth(), 2u);
  EXPECT_EQ(queue.get(), "now");
  queue.done("now");
  EXPECT_EQ(queue.get(), "late");
  EXPECT_GE(std::chrono::steady_clock::now() - added_at, milliseconds(60));
  queue.done("late");
  EXPECT_EQ(queue.depth(), 0u);
}

TEST(WorkQueueTest, DelayedTwiceKeepsTheEarlierTime) {
  WorkQueue queue;
  queue.addAfter("a", std::chrono::hours(1));
  queue.addAfter("a", milliseconds(10));
  queue.addAfter("a", std::chrono::hours(2));
  EXPECT_EQ(queue.depth(), 1u);
  EXPECT_EQ(queue.get(), "a");
  EXPECT_EQ(queue.depth(), 0u);
}

TEST(WorkQueueTest, RateLimitedRetriesGrowAndForgetResets) {
  constexpr milliseconds kInitial(8);
  WorkQueue queue(kInitial, std::chrono::seconds(10));
  EXPECT_EQ(queue.retries("a"), 0);
  std::vector<std::chrono::steady_clock::duration> waits;
  for (int failure = 0; failure < 5; ++failure) {
    auto added_at = std::chrono::steady_clock::now();
    queue.addRateLimited("a");
    EXPECT_EQ(queue.retries("a"), failure + 1);
    ASSERT_EQ(queue.get(), "a");
    waits.push_back(std::chrono::steady_clock::now() - added_at);
    queue.done("a");
  }
  // The delay of failure n is at least half of initial * 2^n (the jitter's floor).
  for (size_t n = 0; n < waits.size(); ++n) {
    EXPECT_GE(waits[n], kInitial * (1 << n) / 2) << "failure " << n;
  }
  EXPECT_EQ(queue.retries("b"), 0);
  queue.forget("a");
  EXPECT_EQ(queue.retries("a"), 0);
  queue.addRateLimited("a");
  EXPECT_EQ(queue.retries("a"), 1);
}

TEST(WorkQueueTest, ShutDownUnblocksGet) {
  WorkQueue queue;
  std::atomic<int> returned{0};
  std::atomic<int> got_key{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      if (queue.get().has_value()) got_key++;
      returned++;
    });
  }
  queue.addAfter("never", std::chrono::hours(1));
  queue.shutDown();
  for (auto& thread : waiters) thread.join();
  EXPECT_EQ(returned.load(), 3);
  EXPECT_EQ(got_key.load(), 0);
  EXPECT_TRUE(queue.isShuttingDown());
  queue.add("after");
  EXPECT_EQ(queue.get(), std::nullopt);
}

}  // namespace
}  // namespace tandem::k8s
