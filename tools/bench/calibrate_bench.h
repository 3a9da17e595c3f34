// `tandem-bench calibrate`: fits a step-time profile (the model of
// agent/engine/simulation/step_profile.h) to real forward passes.
//
// Runs the ModelRunner on a grid of step shapes — prefill chunks of several
// sizes after several cached lengths, decode batches of several sizes at
// several context lengths, and mixed steps holding both — timing each shape
// `samples` times (rounds over the whole grid, so drift and other load spread
// over every shape; the median is kept). Each shape's features come from
// engine::stepShapeOf, the same function a simulated engine uses. The
// coefficients are fitted by non-negative least squares on relative error.
// Prints observed vs predicted per shape and the fit's mean and max relative
// error and R^2; writes the profile YAML (the model shape from the model's
// config) and optionally JSON. Asserts nothing about speed.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct CalibrateBenchOptions {
  std::string model_dir;
  std::string device = "cpu";  // cpu, cuda or auto
  std::string out_path;        // profile YAML; empty: printed to stdout only
  std::string name;            // profile name; empty: "<device>-<model directory name>"
  int samples = 3;             // timed runs per shape (median kept), >= 1
  int threads = 0;             // kernel threads (0: every CPU it may use)
  std::string kv_dtype = "bf16";
  int block_size = 16;
  // Positions the grid spans (prefill starts, decode contexts); 0: the
  // model's context, at most 4096. Capped by the model's context.
  int64_t context = 0;
  std::string json_path;  // empty: no JSON file
};

int runCalibrateBench(const CalibrateBenchOptions& options);

}  // namespace tandem::bench
