// `tandem-bench soak`: steady multi-turn load (cluster_load.h) for --duration
// seconds against a local cluster started through the real
// `tandem-operator local` (local_cluster.h), sampling the resident memory
// (VmRSS) of the operator and of every agent every --sample-interval
// seconds. Prints requests, failures by kind, latency percentiles, a
// least-squares RSS slope per process (KiB/min with the fit's r²) and the
// KV blocks left referenced once the load stopped; with --json, the same
// figures and every sample. Exit code 1 when a request hung, was truncated
// or failed uncleanly, an answer differed from the reference, or blocks
// leaked; the slopes are figures, never a verdict.
#pragma once

#include <cstdint>
#include <string>

#include "tools/bench/cluster_load.h"
#include "tools/bench/local_cluster.h"

namespace tandem::bench {

struct SoakBenchOptions {
  LocalClusterOptions cluster;
  LoadOptions load;
  double duration_s = 300.0;
  double sample_interval_s = 1.0;
  double settle_timeout_s = 60.0;
  int64_t exactness_checks = 200;  // answers compared with the reference; 0: all
  std::string work_dir;            // empty: a new directory under the system's temp dir
  std::string json_path;
};

// Runs the soak; returns 0 when every property held, 1 otherwise. Throws
// tandem::Error for bad options or a cluster that does not start.
int runSoakBench(const SoakBenchOptions& options);

}  // namespace tandem::bench
