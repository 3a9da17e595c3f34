#include "common/available_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/file_text.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string_view::npos) end = text.size();
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

bool listed(std::string_view list, std::string_view item) {
  for (std::string_view part : split(list, ',')) {
    if (part == item) return true;
  }
  return false;
}

// mountinfo writes a space, tab, newline or backslash in a path as \ooo.
std::string unescapeOctal(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {
      const std::string_view digits = text.substr(i + 1, 3);
      if (digits.find_first_not_of("01234567") == std::string_view::npos) {
        out.push_back(static_cast<char>(std::strtol(std::string(digits).c_str(), nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

struct Mount {
  std::string root;         // the path within the hierarchy mounted
  std::string mount_point;  // where
};

// The first mount of `fstype` (with `option` among its super options, when given).
std::optional<Mount> findMount(std::string_view mountinfo, std::string_view fstype,
                               std::string_view option) {
  for (std::string_view line : split(mountinfo, '\n')) {
    const std::vector<std::string_view> fields = split(line, ' ');
    size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (fields.size() < 10 || dash + 3 >= fields.size()) continue;
    if (fields[dash + 1] != fstype) continue;
    if (!option.empty() && !listed(fields[dash + 3], option)) continue;
    return Mount{unescapeOctal(fields[3]), unescapeOctal(fields[4])};
  }
  return std::nullopt;
}

// The path in /proc/self/cgroup of the hierarchy whose controllers include
// `controller` ("" with id 0: the v2 hierarchy).
std::optional<std::string> cgroupPath(std::string_view self_cgroup, std::string_view controller) {
  for (std::string_view line : split(self_cgroup, '\n')) {
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, first);
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string_view path = line.substr(second + 1);
    if (controller.empty() ? (id == "0" && controllers.empty()) : listed(controllers, controller))
      return std::string(path);
  }
  return std::nullopt;
}

// The cgroup's directory: the mount point and the cgroup's path below the
// mount's root (a container's namespace mounts its own cgroup as the root).
std::string cgroupDirectory(const Mount& mount, const std::string& path) {
  if (mount.root == "/") return mount.mount_point + (path == "/" ? "" : path);
  if (path == mount.root) return mount.mount_point;
  if (path.starts_with(mount.root + "/")) return mount.mount_point + path.substr(mount.root.size());
  return mount.mount_point;
}

std::optional<double> number(std::string_view text) {
  const std::string owned(text);
  char* end = nullptr;
  const double value = std::strtod(owned.c_str(), &end);
  if (end == owned.c_str()) return std::nullopt;
  return value;
}

// One directory's limit: v2 "cpu.max" is "QUOTA PERIOD" or "max PERIOD";
// v1 "cpu.cfs_quota_us" is -1 without a limit.
std::optional<double> directoryLimit(const fs::path& directory, bool v2) {
  std::optional<double> quota, period;
  if (v2) {
    const std::optional<std::string> text = readFileText(directory / "cpu.max");
    if (!text) return std::nullopt;
    const std::vector<std::string_view> fields = split(*text, ' ');
    if (fields.size() < 2 || fields[0] == "max") return std::nullopt;
    quota = number(fields[0]);
    period = number(fields[1]);
  } else {
    const std::optional<std::string> quota_text = readFileText(directory / "cpu.cfs_quota_us");
    const std::optional<std::string> period_text = readFileText(directory / "cpu.cfs_period_us");
    if (!quota_text || !period_text) return std::nullopt;
    quota = number(*quota_text);
    period = number(*period_text);
  }
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return *quota / *period;
}

}  // namespace

std::optional<double> cgroupCpuLimit(std::string_view mountinfo, std::string_view self_cgroup,
                                     const fs::path& root) {
  bool v2 = false;
  std::optional<Mount> mount = findMount(mountinfo, "cgroup", "cpu");
  std::optional<std::string> path = cgroupPath(self_cgroup, "cpu");
  if (!mount || !path) {
    v2 = true;
    mount = findMount(mountinfo, "cgroup2", "");
    path = cgroupPath(self_cgroup, "");
  }
  if (!mount || !path) return std::nullopt;
  // From the process's cgroup up to the mount's root, the least.
  const std::string top = mount->mount_point;
  std::string directory = cgroupDirectory(*mount, *path);
  std::optional<double> least;
  for (;;) {
    const std::optional<double> limit = directoryLimit(root / directory.substr(1), v2);
    if (limit && (!least || *limit < *least)) least = limit;
    if (directory.size() <= top.size()) break;
    const size_t slash = directory.rfind('/');
    if (slash == std::string::npos || slash < top.size()) break;
    directory.resize(std::max(slash, top.size()));
  }
  return least;
}

AvailableCpus availableCpusOf(int affinity, std::optional<double> cgroup_limit) {
  AvailableCpus available;
  available.affinity = std::max(affinity, 1);
  available.cgroup_limit = cgroup_limit;
  available.cpus = available.affinity;
  if (cgroup_limit) {
    const double whole = std::ceil(*cgroup_limit);
    if (whole < available.cpus) available.cpus = std::max(1, static_cast<int>(whole));
  }
  return available;
}

AvailableCpus availableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof set, &set) == 0
                           ? CPU_COUNT(&set)
                           : static_cast<int>(std::thread::hardware_concurrency());
  const std::optional<std::string> mountinfo = readFileText("/proc/self/mountinfo");
  const std::optional<std::string> self_cgroup = readFileText("/proc/self/cgroup");
  std::optional<double> limit;
  if (mountinfo && self_cgroup) limit = cgroupCpuLimit(*mountinfo, *self_cgroup);
  return availableCpusOf(affinity, limit);
}

}  // namespace tandem
