#include "agent/transport/locked_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

namespace tandem::transport {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

// Bit CAP_IPC_LOCK of the "CapEff:" line of /proc/self/status (hex).
bool effectiveIpcLock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("CapEff:")) continue;
    try {
      const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> kCapIpcLock) & 1U;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

}  // namespace

LockedMemory lockedMemory(const std::filesystem::path& sysfs_infiniband) {
  LockedMemory locked;
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    locked.limit_bytes = static_cast<uint64_t>(limit.rlim_cur);
  }
  locked.ipc_lock = effectiveIpcLock();
  std::error_code error;
  for (std::filesystem::directory_iterator it(sysfs_infiniband, error), end; !error && it != end;
       it.increment(error)) {
    locked.rdma_devices.push_back(it->path().filename().string());
  }
  std::sort(locked.rdma_devices.begin(), locked.rdma_devices.end());
  return locked;
}

std::string describe(const LockedMemory& locked) {
  std::ostringstream out;
  out << "locked-memory limit "
      << (locked.limit_bytes ? std::to_string(*locked.limit_bytes) + " bytes" : "unlimited")
      << (locked.ipc_lock ? ", CAP_IPC_LOCK" : ", no CAP_IPC_LOCK") << ", RDMA devices: ";
  if (locked.rdma_devices.empty()) out << "none";
  for (size_t i = 0; i < locked.rdma_devices.size(); ++i) {
    out << (i == 0 ? "" : ", ") << locked.rdma_devices[i];
  }
  return out.str();
}

}  // namespace tandem::transport
