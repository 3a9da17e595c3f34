// The TTFT CDF that `tandem-bench multiturn --plot` draws: one step line per
// series, with gnuplot from PATH (optional: without it a notice on stdout
// says the plot was skipped).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tandem::bench {

struct CdfSeries {
  std::string name;              // its key in the legend
  std::vector<double> values_s;  // seconds, any order
};

// Draws `series` into `png` (the last one bold and on top, e.g. all turns)
// with gnuplot. Returns false, with a notice on stdout, when it could not:
// no gnuplot, nothing in the last series, or gnuplot failed.
bool plotTtftCdf(const std::filesystem::path& png, const std::vector<CdfSeries>& series,
                 const std::string& title);

}  // namespace tandem::bench
