// How many CPUs this process can keep busy: the CPUs its affinity mask
// allows, capped by the CPU time its cgroup grants (a Kubernetes pod's CPU
// limit becomes the container cgroup's quota: cgroup v2 `cpu.max`, v1
// `cpu.cfs_quota_us` over `cpu.cfs_period_us`). std::thread::
// hardware_concurrency() counts the node's cores instead: in a pod limited
// to 4 CPUs on a 64-core node, 64 spinning kernel threads would share 4
// CPUs' time and be throttled by the kernel for most of each period.
//
// A fractional limit is rounded up (as the JVM counts a container's CPUs),
// and the limit is the least along the cgroup's path to the mount's root (a
// parent's quota binds its children too). Linux only; elsewhere, or when
// nothing can be read, the affinity (or the cores) alone counts.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

namespace tandem {

// The CPU limit, in CPUs (quota ÷ period), of the cgroup named in
// `self_cgroup` (/proc/self/cgroup's text) as mounted per `mountinfo`
// (/proc/self/mountinfo's text), its files read under `root` ("/" but in
// tests). The cpu controller's v1 hierarchy is used when one is listed, the
// v2 hierarchy otherwise. nullopt: no limit, or none readable.
std::optional<double> cgroupCpuLimit(std::string_view mountinfo, std::string_view self_cgroup,
                                     const std::filesystem::path& root = "/");

struct AvailableCpus {
  int cpus = 1;                        // min(affinity, ⌈cgroup_limit⌉), at least 1
  int affinity = 1;                    // CPUs in the affinity mask
  std::optional<double> cgroup_limit;  // nullopt: none
};

// The count from an affinity and a limit: ⌈limit⌉ where it is below the
// affinity, at least 1.
AvailableCpus availableCpusOf(int affinity, std::optional<double> cgroup_limit);

// This process's, read now.
AvailableCpus availableCpus();

}  // namespace tandem
