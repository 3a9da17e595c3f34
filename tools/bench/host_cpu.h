// How busy the benchmark's own host was during a run: the busy fraction of
// all cores from /proc/stat between two reads, and the load average at the
// end. On a host that is saturated (other processes, or the cluster under
// test sharing its cores) latencies measure the host rather than the system
// benchmarked, and a report says so. Linux only; every read may come back
// empty elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::bench {

// Busy above this share of all cores: the host was overloaded.
inline constexpr double kHostOverloadedBusyFraction = 0.9;

// Aggregate jiffies of the "cpu" line of /proc/stat.
struct CpuTimes {
  uint64_t idle = 0;   // idle + iowait
  uint64_t total = 0;  // user + nice + system + idle + iowait + irq + softirq + steal
};

// The "cpu " line of a /proc/stat text; nullopt when missing or malformed.
std::optional<CpuTimes> parseProcStat(std::string_view text);
// 1 − Δidle ÷ Δtotal; nullopt when no time passed.
std::optional<double> busyFraction(const CpuTimes& before, const CpuTimes& after);
// The first (1-minute) field of a /proc/loadavg text.
std::optional<double> parseLoadAverage(std::string_view text);

struct HostCpuUse {
  std::optional<double> busy_fraction;    // over the run, all cores
  std::optional<double> load_average_1m;  // at the end
  unsigned cores = 0;                     // std::thread::hardware_concurrency()
  bool overloaded() const { return busy_fraction && *busy_fraction > kHostOverloadedBusyFraction; }
};

// Reads /proc/stat on construction; finish() reads it again and the load average.
class HostCpuMeter {
 public:
  HostCpuMeter();
  HostCpuUse finish() const;

 private:
  std::optional<CpuTimes> start_;
};

}  // namespace tandem::bench
