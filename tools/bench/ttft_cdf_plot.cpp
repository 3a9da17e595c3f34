#include "tools/bench/ttft_cdf_plot.h"

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <system_error>

extern char** environ;

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;

// The first executable called `name` in a directory of $PATH.
std::optional<fs::path> findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string_view dirs(path);
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

// A gnuplot single-quoted string: no escapes inside, '' stands for '.
std::string gnuplotQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

bool plotTtftCdf(const fs::path& png, const std::vector<CdfSeries>& series,
                 const std::string& title) {
  const std::optional<fs::path> gnuplot = findOnPath("gnuplot");
  if (!gnuplot) {
    std::printf(
        "note: --plot skipped: gnuplot is not on PATH (install it, e.g. apt-get install "
        "gnuplot-nox, to draw the TTFT CDF)\n");
    return false;
  }
  if (series.empty() || series.back().values_s.empty()) {
    std::printf("note: --plot skipped: no request completed\n");
    return false;
  }
  std::string script =
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
      "  set terminal pngcairo size 960,600\n"
      "} else {\n"
      "  set terminal png size 960,600\n"
      "}\n";
  script += "set output " + gnuplotQuoted(png.string()) + "\n";
  script += "set title " + gnuplotQuoted(title) + " noenhanced\n";
  script +=
      "set xlabel 'time to first token (ms)'\n"
      "set ylabel 'fraction of requests'\n"
      "set logscale x\n"
      "set yrange [0:1]\n"
      "set grid\n"
      "set key bottom right\n";
  std::string plot = "plot ";
  for (size_t i = 0; i < series.size(); ++i) {
    std::vector<double> values = series[i].values_s;
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());
    script += "$s" + std::to_string(i) + " << EOD\n";
    char line[64];
    std::snprintf(line, sizeof(line), "%.6f 0\n", values.front() * 1e3);
    script += line;
    for (size_t v = 0; v < values.size(); ++v) {
      std::snprintf(line, sizeof(line), "%.6f %.6f\n", values[v] * 1e3,
                    static_cast<double>(v + 1) / static_cast<double>(values.size()));
      script += line;
    }
    script += "EOD\n";
    if (plot != "plot ") plot += ", ";
    const bool last = i + 1 == series.size();
    plot += "$s" + std::to_string(i) + " using 1:2 with steps " +
            (last ? "lw 3 lc rgb 'black'" : "lw 1.5") + " title " + gnuplotQuoted(series[i].name);
  }
  script += plot + "\n";

  std::string script_path = (fs::temp_directory_path() / "tandem-bench-plot-XXXXXX").string();
  const int fd = ::mkstemp(script_path.data());
  if (fd < 0) {
    std::printf("note: --plot skipped: cannot create a temporary file for the gnuplot script\n");
    return false;
  }
  const bool written =
      ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  int status = -1;
  if (written) {
    std::fflush(stdout);
    const std::string program = gnuplot->string();
    char* argv[] = {const_cast<char*>(program.c_str()), script_path.data(), nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv, environ) == 0) {
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  std::error_code ignored;
  fs::remove(script_path, ignored);
  if (!written || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("note: --plot failed: %s did not draw %s (its messages are above)\n",
                gnuplot->c_str(), png.c_str());
    return false;
  }
  std::printf("TTFT CDF plotted to %s\n", png.c_str());
  return true;
}

}  // namespace tandem::bench
