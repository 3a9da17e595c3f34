// Persistent worker threads for the CPU kernels.
//
// parallelFor(num_tasks, fn) runs fn(task, worker) for every task in
// [0, num_tasks) and returns when all have finished. Tasks are claimed one at
// a time from a shared counter, so which worker runs a task is arbitrary:
// callers must make a task's result independent of the worker (the worker
// index only selects scratch memory). The calling thread takes part as worker
// 0 and never waits for a worker that has not claimed a task, so a worker
// that is asleep or preempted (the machine may be shared) costs nothing.
// Idle workers spin briefly before sleeping, because decode issues dozens of
// small kernels back to back and waking a sleeping thread costs tens of
// microseconds.
//
// Thread-safety: calls from several threads are serialized (one job runs at a
// time). Not reentrant: fn must not call parallelFor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem::kernels::cpu {

class ThreadPool {
 public:
  // num_threads counts the caller; values below 1 mean hardware concurrency.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void setNumThreads(int num_threads);
  int numThreads() const;

  template <typename Fn>
  void parallelFor(int64_t num_tasks, Fn&& fn) {
    run(
        num_tasks,
        [](void* context, int64_t task, int worker) {
          (*static_cast<std::remove_reference_t<Fn>*>(context))(task, worker);
        },
        &fn);
  }

 private:
  using TaskFn = void (*)(void* context, int64_t task, int worker);

  void run(int64_t num_tasks, TaskFn fn, void* context);
  void startWorkers(int num_threads);
  void stopWorkers();
  void workerLoop(int worker, uint64_t seen);
  // Claims and runs units of the current job until none is left.
  void runUnits(int worker);

  std::mutex call_mutex_;  // serializes run() and setNumThreads()
  std::vector<std::thread> workers_;
  std::atomic<int> num_threads_{1};

  // The current job, written by run() before it publishes job_. Tasks are
  // grouped into at most kMaxUnits units of tasks_per_unit_ tasks.
  TaskFn fn_ = nullptr;
  void* context_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t tasks_per_unit_ = 1;
  // job_ packs the job's sequence number, the next unclaimed unit and the
  // unit count into one word, so claiming a unit is one compare-exchange
  // that cannot succeed on a job other than the one it read.
  static constexpr int kUnitBits = 20;
  static constexpr uint64_t kUnitMask = (uint64_t{1} << kUnitBits) - 1;
  static constexpr int64_t kMaxUnits = static_cast<int64_t>(kUnitMask);
  std::atomic<uint64_t> job_{0};
  uint64_t job_sequence_ = 0;
  std::atomic<int64_t> units_done_{0};

  // Wake-up: bumped once per job; idle workers watch it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

// The process-wide pool the kernels run on.
ThreadPool& globalThreadPool();

}  // namespace tandem::kernels::cpu
