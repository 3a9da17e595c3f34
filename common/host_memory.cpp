#include "common/host_memory.h"

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

void requireHostMemoryFor(uint64_t bytes, const std::string& what, bool committed) {
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
}

}  // namespace tandem
