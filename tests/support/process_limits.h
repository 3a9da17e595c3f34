// This test process's locked-memory limit and capabilities, read and set
// here independently of the code under test (agent/transport/locked_memory.h).
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>

namespace tandem::testing {

// Whether capability `bit` (linux/capability.h: CAP_IPC_LOCK is 14) is in
// this process's effective set, from the "CapEff:" line of /proc/self/status.
inline bool hasEffectiveCapability(int bit) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> bit) & 1;
  }
  return false;
}

// Lowers the soft RLIMIT_MEMLOCK to `bytes` (at most the hard limit) while it
// lives, so that processes started meanwhile inherit it; the hard limit stays.
class SoftMemlock {
 public:
  explicit SoftMemlock(rlim_t bytes) {
    getrlimit(RLIMIT_MEMLOCK, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min<rlim_t>(bytes, saved_.rlim_max);
    ok_ = setrlimit(RLIMIT_MEMLOCK, &lowered) == 0;
    bytes_ = lowered.rlim_cur;
  }
  ~SoftMemlock() { setrlimit(RLIMIT_MEMLOCK, &saved_); }
  SoftMemlock(const SoftMemlock&) = delete;
  SoftMemlock& operator=(const SoftMemlock&) = delete;
  bool ok() const { return ok_; }
  rlim_t bytes() const { return bytes_; }  // the soft limit set

 private:
  rlimit saved_{};
  rlim_t bytes_ = 0;
  bool ok_ = false;
};

}  // namespace tandem::testing
