// The CPU limit read from cgroup files laid out as the kernel mounts them
// (v1 and v2, with and without a cgroup namespace), and this process's
// available CPUs.
#include "common/available_cpus.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/test_files.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// mountinfo lines as the kernel writes them: a v1 cpu hierarchy (with cpuacct)
// and the v2 one.
constexpr char kV1Mounts[] =
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "32 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
constexpr char kV2Mounts[] =
    "25 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

class CgroupTree : public ::testing::Test {
 protected:
  // Writes `text` to the file at absolute `path` under the tree's root.
  void write(const std::string& path, const std::string& text) {
    const fs::path file = root_.path() / path.substr(1);
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  std::optional<double> limit(const std::string& mounts, const std::string& self) {
    return cgroupCpuLimit(mounts, self, root_.path());
  }

  testing::TempDir root_{"cgroups"};
};

TEST_F(CgroupTree, V1TheLeastQuotaAlongThePathCounts) {
  const std::string self = "4:memory:/kubepods/pod1/c1\n3:cpu,cpuacct:/kubepods/pod1/c1\n";
  const std::string base = "/sys/fs/cgroup/cpu,cpuacct";
  write(base + "/cpu.cfs_quota_us", "-1\n");
  write(base + "/cpu.cfs_period_us", "100000\n");
  write(base + "/kubepods/cpu.cfs_quota_us", "-1\n");
  write(base + "/kubepods/cpu.cfs_period_us", "100000\n");
  write(base + "/kubepods/pod1/cpu.cfs_quota_us", "400000\n");
  write(base + "/kubepods/pod1/cpu.cfs_period_us", "100000\n");
  write(base + "/kubepods/pod1/c1/cpu.cfs_quota_us", "250000\n");
  write(base + "/kubepods/pod1/c1/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit(kV1Mounts, self), 2.5);

  // The pod's limit below the container's binds it.
  write(base + "/kubepods/pod1/c1/cpu.cfs_quota_us", "-1\n");
  write(base + "/kubepods/pod1/cpu.cfs_quota_us", "150000\n");
  EXPECT_EQ(limit(kV1Mounts, self), 1.5);

  // No quota anywhere: no limit.
  write(base + "/kubepods/pod1/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(limit(kV1Mounts, self), std::nullopt);
}

TEST_F(CgroupTree, V1AContainersOwnCgroupMountedAsTheRoot) {
  // Docker without a cgroup namespace: the container's cgroup is the mount's root.
  const std::string mounts =
      "31 30 0:28 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
  write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "50000\n");
  write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit(mounts, "2:cpu:/docker/abc\n"), 0.5);
  EXPECT_EQ(limit(mounts, "2:cpu:/docker/abc/inner\n"), 0.5) << "a child of the root";
}

TEST_F(CgroupTree, V2CpuMaxAlongThePathAndMaxMeansNone) {
  const std::string self = "0::/kubepods.slice/pod.slice/cri.scope\n";
  write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  write("/sys/fs/cgroup/kubepods.slice/cpu.max", "max 100000\n");
  write("/sys/fs/cgroup/kubepods.slice/pod.slice/cpu.max", "300000 100000\n");
  write("/sys/fs/cgroup/kubepods.slice/pod.slice/cri.scope/cpu.max", "max 100000\n");
  EXPECT_EQ(limit(kV2Mounts, self), 3.0);
  write("/sys/fs/cgroup/kubepods.slice/pod.slice/cpu.max", "max 100000\n");
  EXPECT_EQ(limit(kV2Mounts, self), std::nullopt);
  // A period other than the default.
  write("/sys/fs/cgroup/kubepods.slice/pod.slice/cri.scope/cpu.max", "150000 50000\n");
  EXPECT_EQ(limit(kV2Mounts, self), 3.0);
}

TEST_F(CgroupTree, V2InACgroupNamespaceTheMountPointIsTheProcesssCgroup) {
  write("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  EXPECT_EQ(limit(kV2Mounts, "0::/\n"), 1.5);
}

TEST_F(CgroupTree, AHybridHostWithoutAV1CpuHierarchyUsesV2) {
  // v1 hierarchies for other controllers, the cpu controller on v2.
  const std::string mounts =
      std::string("32 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") +
      "33 30 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  write("/sys/fs/cgroup/unified/app/cpu.max", "200000 100000\n");
  EXPECT_EQ(limit(mounts, "4:memory:/app\n0::/app\n"), 2.0);
}

TEST_F(CgroupTree, AnEscapedMountPointIsUnescaped) {
  const std::string mounts = "25 22 0:26 / /cg\\040root rw - cgroup2 cgroup2 rw\n";
  write("/cg root/cpu.max", "100000 100000\n");
  EXPECT_EQ(limit(mounts, "0::/\n"), 1.0);
}

TEST_F(CgroupTree, NothingReadableOrMalformedIsNoLimit) {
  EXPECT_EQ(limit("", ""), std::nullopt);
  EXPECT_EQ(limit(kV2Mounts, "0::/\n"), std::nullopt) << "no cpu.max file";
  EXPECT_EQ(limit(kV2Mounts, "garbage\n"), std::nullopt);
  EXPECT_EQ(limit("a b c\n", "0::/\n"), std::nullopt);
  write("/sys/fs/cgroup/cpu.max", "lots 100000\n");
  EXPECT_EQ(limit(kV2Mounts, "0::/\n"), std::nullopt);
  write("/sys/fs/cgroup/cpu.max", "100000 0\n");
  EXPECT_EQ(limit(kV2Mounts, "0::/\n"), std::nullopt);
  write("/sys/fs/cgroup/cpu.max", "100000\n");
  EXPECT_EQ(limit(kV2Mounts, "0::/\n"), std::nullopt) << "no period";
}

TEST(AvailableCpusTest, TheAffinityCappedByTheLimitRoundedUp) {
  EXPECT_EQ(availableCpusOf(64, std::nullopt).cpus, 64);
  EXPECT_EQ(availableCpusOf(64, 4.0).cpus, 4);
  EXPECT_EQ(availableCpusOf(64, 2.5).cpus, 3);
  EXPECT_EQ(availableCpusOf(64, 0.5).cpus, 1);
  EXPECT_EQ(availableCpusOf(64, 0.001).cpus, 1);
  EXPECT_EQ(availableCpusOf(2, 8.0).cpus, 2) << "a limit above the affinity does not raise it";
  EXPECT_EQ(availableCpusOf(0, std::nullopt).cpus, 1);
  const AvailableCpus capped = availableCpusOf(16, 1.5);
  EXPECT_EQ(capped.affinity, 16);
  EXPECT_EQ(capped.cgroup_limit, 1.5);
}

TEST(AvailableCpusTest, ThisProcesssAffinityIsRead) {
  const AvailableCpus available = availableCpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ(available.affinity, CPU_COUNT(&set));
  EXPECT_GE(available.cpus, 1);
  EXPECT_LE(available.cpus, available.affinity);
}

}  // namespace
}  // namespace tandem
