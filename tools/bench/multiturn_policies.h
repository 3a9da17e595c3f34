// `tandem-bench multiturn --cluster-file FILE --policies kv,round_robin`:
// the same plan against a fresh local-mode cluster per routing policy, in
// one run. For each policy in turn it starts `tandem-operator local -f FILE
// --policy P --port 0` (LocalCluster), waits for every agent, runs the plan
// against the router reading every agent's counters
// (multiturn_computed_tokens.h), stops the cluster, and at the end prints a
// side-by-side table and, with --json, {"policies": [report per policy],
// "ratios": first policy / second}.
#pragma once

#include <string>
#include <vector>

#include "tools/bench/multiturn_bench.h"

namespace tandem::bench {

// Throws tandem::Error unless every entry is kv, round_robin or random and
// none repeats (and there is at least one).
void validatePolicies(const std::vector<std::string>& policies);

// Returns 0 when every request of every policy completed, else 1. Throws
// tandem::Error when a cluster cannot be started.
int runPolicyComparison(const MultiTurnBenchOptions& options);

}  // namespace tandem::bench
