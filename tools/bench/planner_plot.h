// The plot of `tandem-bench planner`: a whitespace-separated data file (one
// row per second of the ramp) and a gnuplot script that renders it to PNG in
// three panels sharing the time axis — ready replicas per pool, TTFT p90
// against its target, ITL p90 against its target — with the phases marked.
//
// gnuplot comes from the gnuplot-nox package (`make deps`); the script uses
// the pngcairo terminal when gnuplot has it and png otherwise.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tools/bench/planner_ramp.h"

namespace tandem::bench {

// The gnuplot on PATH, or throws tandem::Error naming the package to install.
std::string findGnuplot();

// Writes `data_path` and `script_path` and runs gnuplot to render `png_path`.
// Throws tandem::Error when a file cannot be written or gnuplot fails (with
// its output).
void renderRampPlot(const std::vector<RampPhase>& phases, const RampFigures& figures,
                    const RampTargets& targets, const std::filesystem::path& data_path,
                    const std::filesystem::path& script_path,
                    const std::filesystem::path& png_path);

}  // namespace tandem::bench
