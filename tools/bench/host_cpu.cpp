#include "tools/bench/host_cpu.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tandem::bench {
namespace {

std::string readWhole(const char* path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

std::optional<CpuTimes> parseProcStat(std::string_view text) {
  // The aggregate line comes first: "cpu  user nice system idle iowait irq softirq steal ...".
  size_t line_start = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line.rfind("cpu ", 0) != 0) continue;
    std::vector<uint64_t> fields;
    size_t pos = 3;
    while (pos < line.size() && fields.size() < 8) {
      while (pos < line.size() && line[pos] == ' ') ++pos;
      if (pos >= line.size()) break;
      uint64_t value = 0;
      const auto [end, error] =
          std::from_chars(line.data() + pos, line.data() + line.size(), value);
      if (error != std::errc()) return std::nullopt;
      fields.push_back(value);
      pos = static_cast<size_t>(end - line.data());
    }
    if (fields.size() < 4) return std::nullopt;  // user nice system idle at least
    CpuTimes times;
    times.idle = fields[3] + (fields.size() > 4 ? fields[4] : 0);
    for (uint64_t value : fields) times.total += value;
    return times;
  }
  return std::nullopt;
}

std::optional<double> busyFraction(const CpuTimes& before, const CpuTimes& after) {
  if (after.total <= before.total || after.idle < before.idle) return std::nullopt;
  const double total = static_cast<double>(after.total - before.total);
  const double idle = static_cast<double>(after.idle - before.idle);
  return idle >= total ? 0.0 : 1.0 - idle / total;
}

std::optional<double> parseLoadAverage(std::string_view text) {
  const size_t end = text.find(' ');
  const std::string first(text.substr(0, end));
  try {
    size_t used = 0;
    const double value = std::stod(first, &used);
    if (used == first.size() && value >= 0.0) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

HostCpuMeter::HostCpuMeter() : start_(parseProcStat(readWhole("/proc/stat"))) {}

HostCpuUse HostCpuMeter::finish() const {
  HostCpuUse use;
  const std::optional<CpuTimes> end = parseProcStat(readWhole("/proc/stat"));
  if (start_ && end) use.busy_fraction = busyFraction(*start_, *end);
  use.load_average_1m = parseLoadAverage(readWhole("/proc/loadavg"));
  use.cores = std::thread::hardware_concurrency();
  return use;
}

}  // namespace tandem::bench
