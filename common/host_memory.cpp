#include "common/host_memory.h"

#include <sys/statvfs.h>

#include <fstream>
#include <sstream>

#include "common/status.h"

namespace tandem {

std::optional<uint64_t> memInfoBytes(const std::string& field) {
  std::ifstream file("/proc/meminfo");
  std::string line;
  const std::string prefix = field + ":";
  while (std::getline(file, line)) {
    if (!line.starts_with(prefix)) continue;
    std::istringstream fields(line.substr(prefix.size()));
    uint64_t value = 0;
    std::string unit;
    if (!(fields >> value)) return std::nullopt;
    fields >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

std::optional<uint64_t> freeBytesOn(const std::string& path) {
  struct statvfs stats {};
  if (::statvfs(path.c_str(), &stats) != 0) return std::nullopt;
  return static_cast<uint64_t>(stats.f_bavail) * stats.f_frsize;
}

void requireHostMemoryFor(uint64_t bytes, const std::string& what, bool committed,
                          const std::string& shared_memory_dir) {
  auto refuse = [&](uint64_t limit, const std::string& of) {
    throw Error(what + " needs " + std::to_string(bytes) + " bytes, more than the " +
                std::to_string(limit) + " bytes " + of + "; it cannot fit");
  };
  if (const auto total = memInfoBytes("MemTotal"); total && bytes > *total) {
    refuse(*total, "of this host's memory (MemTotal)");
  }
  if (!committed) return;
  if (const auto available = memInfoBytes("MemAvailable"); available && bytes > *available) {
    refuse(*available, "of memory available now (MemAvailable)");
  }
  if (!shared_memory_dir.empty()) {
    if (const auto free = freeBytesOn(shared_memory_dir); free && bytes > *free) {
      refuse(*free, "free in " + shared_memory_dir + ", where shared memory is made");
    }
  }
}

}  // namespace tandem
