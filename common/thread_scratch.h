// Per-thread scratch vectors (thread_local, reused across calls so that the
// common call allocates nothing) keep their capacity, so one huge input
// would pin its peak for the thread's life: a worker thread of the agent or
// the router that once tokenized a million-byte prompt kept tens of MB.
// A ScratchTrim declared after them releases, when the call returns, each
// one that grew past kScratchKeepBytes.
#pragma once

#include <cstddef>
#include <tuple>
#include <vector>

namespace tandem {

inline constexpr size_t kScratchKeepBytes = size_t{1} << 20;

template <typename... Vectors>
class ScratchTrim {
 public:
  explicit ScratchTrim(Vectors&... vectors) : vectors_(vectors...) {}
  ScratchTrim(const ScratchTrim&) = delete;
  ScratchTrim& operator=(const ScratchTrim&) = delete;
  ~ScratchTrim() {
    std::apply([](auto&... v) { (release(v), ...); }, vectors_);
  }

 private:
  template <typename T>
  static void release(std::vector<T>& v) {
    if (v.capacity() * sizeof(T) > kScratchKeepBytes) std::vector<T>().swap(v);
  }

  std::tuple<Vectors&...> vectors_;
};

}  // namespace tandem
