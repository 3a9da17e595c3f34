// What decides whether UCX can register memory for RDMA: registering pins
// the pages (the verbs' ibv_reg_mr), which counts against RLIMIT_MEMLOCK
// unless the process has CAP_IPC_LOCK in its effective set (a non-root
// process does not, even when the container adds the capability). Read at
// start-up so the agent can say, before the first transfer fails over to
// recomputing, that its KV buffer cannot be registered.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tandem::transport {

struct LockedMemory {
  // The soft RLIMIT_MEMLOCK in bytes; nullopt: unlimited.
  std::optional<uint64_t> limit_bytes;
  // CAP_IPC_LOCK is in the effective set: the limit does not apply.
  bool ipc_lock = false;
  // RDMA devices the node exposes (/sys/class/infiniband), e.g. "mlx5_0".
  std::vector<std::string> rdma_devices;

  // Whether `bytes` can be registered for RDMA as far as the limit says
  // (true with no RDMA device: nothing will register).
  bool canRegister(uint64_t bytes) const {
    return rdma_devices.empty() || ipc_lock || !limit_bytes || *limit_bytes >= bytes;
  }
};

// This process's, with RDMA devices listed under `sysfs_infiniband`.
LockedMemory lockedMemory(const std::filesystem::path& sysfs_infiniband = "/sys/class/infiniband");

// One line for the log: "locked-memory limit 8388608 bytes, no CAP_IPC_LOCK,
// RDMA devices: mlx5_0, mlx5_1" (or "unlimited", "none").
std::string describe(const LockedMemory& locked);

}  // namespace tandem::transport
