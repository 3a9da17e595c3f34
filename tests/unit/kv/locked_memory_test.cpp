// transport::lockedMemory: the soft RLIMIT_MEMLOCK, CAP_IPC_LOCK and the
// node's RDMA devices, as UCX's registration of the KV buffer meets them.
#include "agent/transport/locked_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/process_limits.h"
#include "tests/support/test_files.h"

namespace tandem::transport {
namespace {

namespace fs = std::filesystem;

using ::tandem::testing::SoftMemlock;

bool hasIpcLock() { return ::tandem::testing::hasEffectiveCapability(14); }

TEST(LockedMemoryTest, ReadsTheSoftLimitTheCapabilityAndTheRdmaDevices) {
  tandem::testing::TempDir sysfs("tandem-infiniband");
  fs::create_directories(sysfs.path() / "mlx5_1");
  fs::create_directories(sysfs.path() / "mlx5_0");
  SoftMemlock lowered(1 << 20);
  ASSERT_TRUE(lowered.ok());
  const LockedMemory locked = lockedMemory(sysfs.path());
  ASSERT_TRUE(locked.limit_bytes.has_value());
  EXPECT_EQ(*locked.limit_bytes, uint64_t{1} << 20);
  EXPECT_EQ(locked.ipc_lock, hasIpcLock());
  EXPECT_EQ(locked.rdma_devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(describe(locked), std::string("locked-memory limit 1048576 bytes, ") +
                                  (hasIpcLock() ? "CAP_IPC_LOCK" : "no CAP_IPC_LOCK") +
                                  ", RDMA devices: mlx5_0, mlx5_1");
  // Below the buffer, without the capability: RDMA cannot register it.
  EXPECT_EQ(locked.canRegister(2 << 20), hasIpcLock());
  EXPECT_TRUE(locked.canRegister(1 << 20));
  EXPECT_TRUE(lockedMemory(sysfs.path() / "absent").rdma_devices.empty());
}

TEST(LockedMemoryTest, NoRdmaDeviceOrAnUnlimitedLimitRegistersAnything) {
  LockedMemory locked;
  locked.limit_bytes = 4096;
  EXPECT_TRUE(locked.canRegister(uint64_t{1} << 40)) << "no RDMA device: nothing registers";
  locked.rdma_devices = {"mlx5_0"};
  EXPECT_FALSE(locked.canRegister(8192));
  locked.ipc_lock = true;
  EXPECT_TRUE(locked.canRegister(8192));
  locked.ipc_lock = false;
  locked.limit_bytes.reset();
  EXPECT_TRUE(locked.canRegister(uint64_t{1} << 40));
  EXPECT_EQ(describe(locked),
            "locked-memory limit unlimited, no CAP_IPC_LOCK, RDMA devices: mlx5_0");
}

}  // namespace
}  // namespace tandem::transport
