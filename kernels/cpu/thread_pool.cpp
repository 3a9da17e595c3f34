#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "common/available_cpus.h"

namespace tandem::kernels::cpu {
namespace {

// How long an idle worker spins before sleeping: long enough to bridge the
// gaps between the kernels of one decode step, short enough not to burn a
// core while the engine is idle.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// 0: the CPUs this process can keep busy (its affinity, capped by its
// cgroup's CPU limit): spinning workers beyond a pod's CPU limit would be
// throttled for most of each scheduling period.
int resolveThreadCount(int num_threads) {
  if (num_threads >= 1) return num_threads;
  return availableCpus().cpus;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) { startWorkers(resolveThreadCount(num_threads)); }

ThreadPool::~ThreadPool() { stopWorkers(); }

void ThreadPool::setNumThreads(int num_threads) {
  std::lock_guard<std::mutex> lock(call_mutex_);
  const int resolved = resolveThreadCount(num_threads);
  if (resolved == num_threads_.load()) return;
  stopWorkers();
  startWorkers(resolved);
}

int ThreadPool::numThreads() const { return num_threads_.load(); }

void ThreadPool::startWorkers(int num_threads) {
  stop_.store(false);
  num_threads_.store(num_threads);
  workers_.reserve(num_threads - 1);
  // Workers start from the generation of now: reading it in the new thread
  // could already see the first job's bump and miss that job.
  const uint64_t generation = generation_.load();
  for (int worker = 1; worker < num_threads; ++worker) {
    workers_.emplace_back([this, worker, generation] { workerLoop(worker, generation); });
  }
}

void ThreadPool::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& thread : workers_) thread.join();
  workers_.clear();
}

void ThreadPool::runUnits(int worker) {
  uint64_t word = job_.load(std::memory_order_acquire);
  for (;;) {
    const int64_t next = static_cast<int64_t>((word >> kUnitBits) & kUnitMask);
    const int64_t count = static_cast<int64_t>(word & kUnitMask);
    if (next >= count) return;
    // Success means the job read in `word` is still the current one: its
    // fields stay valid until this unit is reported done.
    if (!job_.compare_exchange_weak(word, word + (uint64_t{1} << kUnitBits),
                                    std::memory_order_acq_rel, std::memory_order_acquire)) {
      continue;
    }
    const int64_t begin = next * tasks_per_unit_;
    const int64_t end = std::min(num_tasks_, begin + tasks_per_unit_);
    for (int64_t task = begin; task < end; ++task) fn_(context_, task, worker);
    units_done_.fetch_add(1, std::memory_order_release);
    word = job_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run(int64_t num_tasks, TaskFn fn, void* context) {
  if (num_tasks <= 0) return;
  std::lock_guard<std::mutex> lock(call_mutex_);
  if (num_threads_.load() == 1 || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(context, task, 0);
    return;
  }
  fn_ = fn;
  context_ = context;
  num_tasks_ = num_tasks;
  tasks_per_unit_ = (num_tasks + kMaxUnits - 1) / kMaxUnits;
  const int64_t units = (num_tasks + tasks_per_unit_ - 1) / tasks_per_unit_;
  units_done_.store(0, std::memory_order_relaxed);
  ++job_sequence_;
  job_.store((job_sequence_ << (2 * kUnitBits)) | static_cast<uint64_t>(units),
             std::memory_order_release);
  // seq_cst pairs with the sleeper count below: a worker either sees the new
  // generation before sleeping or is counted and gets notified.
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> sleep_lock(sleep_mutex_);
    wake_.notify_all();
  }
  runUnits(0);
  // Every unit is claimed; wait for those other workers are still running
  // (fn and context live on the caller's stack).
  int spins = 0;
  while (units_done_.load(std::memory_order_acquire) != units) {
    if (++spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::workerLoop(int worker, uint64_t seen) {
  for (;;) {
    const auto spin_start = std::chrono::steady_clock::now();
    bool woke = false;
    for (int spins = 0;; ++spins) {
      if (generation_.load(std::memory_order_acquire) != seen || stop_.load()) {
        woke = true;
        break;
      }
      _mm_pause();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() - spin_start > kSpinTime) break;
    }
    if (!woke) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1);
      wake_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    runUnits(worker);
  }
}

ThreadPool& globalThreadPool() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace tandem::kernels::cpu
