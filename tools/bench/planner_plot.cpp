#include "tools/bench/planner_plot.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/status.h"
#include "common/subprocess.h"
#include "tools/bench/bench_options.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;

// A gnuplot single-quoted string: no escapes inside, '' stands for '.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string cell(const std::optional<double>& value, double scale) {
  if (!value) return "NaN";
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", *value * scale);
  return text;
}

void writeFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error("cannot write " + path.string());
}

}  // namespace

std::string findGnuplot() {
  const char* path = std::getenv("PATH");
  std::string_view dirs(path == nullptr ? "" : path);
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) {
      return candidate.string();
    }
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  throw Error(
      "--plot needs gnuplot, which is not on PATH: install the gnuplot-nox package "
      "(make deps, or apt-get install gnuplot-nox)");
}

void renderRampPlot(const std::vector<RampPhase>& phases, const RampFigures& figures,
                    const RampTargets& targets, const fs::path& data_path,
                    const fs::path& script_path, const fs::path& png_path) {
  const std::string gnuplot = findGnuplot();
  std::ostringstream data;
  data << "# time_s prefill_replicas decode_replicas ttft_window_q_s itl_window_q_ms "
          "ttft_second_q_s itl_second_q_ms (q = "
       << numberText(targets.quantile) << ", window " << numberText(targets.window_s) << " s)\n";
  for (const SecondFigures& s : figures.seconds) {
    data << numberText(s.time_s) << ' ' << s.prefill_replicas << ' ' << s.decode_replicas << ' '
         << cell(s.ttft_window_q, 1.0) << ' ' << cell(s.itl_window_q, 1e3) << ' '
         << cell(s.ttft_bucket_q, 1.0) << ' ' << cell(s.itl_bucket_q, 1e3) << '\n';
  }
  writeFile(data_path, data.str());

  std::string q = "p";
  q += numberText(targets.quantile * 100);
  std::ostringstream script;
  script << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "  set terminal pngcairo size 1000,900 font ',10'\n"
            "} else {\n"
            "  set terminal png size 1000,900\n"
            "}\n"
         << "set output " << quoted(png_path.string()) << "\n"
         << "data = " << quoted(data_path.string()) << "\n"
         << "set datafile missing 'NaN'\n"
            "set multiplot layout 3,1 title 'SLA planner on a load ramp' noenhanced\n"
            "set grid\nset key outside right top noenhanced\n"
            "set lmargin at screen 0.08\nset rmargin at screen 0.78\nset tmargin 2\n"
            "set offsets 0, 0, graph 0.1, 0\n";
  // Phase boundaries as vertical lines, phase names at the top of the first panel.
  double start = 0.0;
  int arrow = 1;
  for (const RampPhase& phase : phases) {
    if (start > 0) {
      script << "set arrow " << arrow++ << " from " << numberText(start) << ", graph 0 to "
             << numberText(start) << ", graph 1 nohead dt 2 lc rgb 'gray40'\n";
    }
    script << "set label " << arrow << " " << quoted(phase.text) << " at "
           << numberText(start + phase.duration_s / 2) << ", graph 1.06 center noenhanced\n";
    ++arrow;
    start += phase.duration_s;
  }
  const double end = figures.seconds.empty() ? start : figures.seconds.back().time_s;
  script << "set xrange [0:" << numberText(std::max(start, end)) << "]\n";
  script << "set ylabel 'ready replicas'\nset yrange [0:*]\nset ytics 1\n"
            "plot data using 1:2 with steps lw 2 lc rgb '#1f77b4' title 'prefill pool', \\\n"
            "     data using 1:3 with steps lw 2 lc rgb '#d62728' title 'decode pool'\n"
            "set ytics autofreq\n"
         << "set ylabel 'TTFT " << q << " (s)'\n"
         << "plot data using 1:4 with lines lw 2 lc rgb '#1f77b4' title 'TTFT " << q << " over "
         << numberText(targets.window_s) << " s', \\\n"
         << "     " << numberText(targets.ttft_s)
         << " with lines dt 4 lw 2 lc rgb 'black' title 'target " << numberText(targets.ttft_s)
         << " s'\n"
         << "set xlabel 'seconds since the start of the ramp'\n"
         << "set ylabel 'ITL " << q << " (ms)'\n"
         << "plot data using 1:5 with lines lw 2 lc rgb '#d62728' title 'ITL " << q << " over "
         << numberText(targets.window_s) << " s', \\\n"
         << "     " << numberText(targets.itl_s * 1e3)
         << " with lines dt 4 lw 2 lc rgb 'black' title 'target " << numberText(targets.itl_s * 1e3)
         << " ms'\n"
         << "unset multiplot\n";
  writeFile(script_path, script.str());

  const fs::path log = script_path.string() + ".log";
  Subprocess process({gnuplot, script_path.string()}, log);
  const int status = process.wait(std::chrono::seconds(60));
  if (status != 0) {
    if (status < 0) process.signal(SIGKILL);
    throw Error("gnuplot " + script_path.string() + " failed (status " + std::to_string(status) +
                "): " + process.stderrText());
  }
}

}  // namespace tandem::bench
