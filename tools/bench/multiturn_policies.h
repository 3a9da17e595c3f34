// `tandem-bench multiturn --cluster-file FILE --policies kv,round_robin
// --rounds R`: the same plan against a fresh local-mode cluster per routing
// policy and round, in one run. Round r runs every policy in turn, the order
// rotated by r (multiturn_summary.h's roundOrder), so that drift of the host
// over the run falls on every policy alike. For each run it starts
// `tandem-operator local -f FILE --policy P --port 0` (LocalCluster), waits
// for every agent, runs the plan against the router reading every agent's
// counters (multiturn_computed_tokens.h), and stops the cluster. At the end
// it prints a side-by-side table (per policy, one round: the figure; several:
// the median and range over rounds), kv ÷ the best other policy for TTFT
// mean, TTFT p90 and goodput, and with --json every run's report and the
// summary.
#pragma once

#include <string>
#include <vector>

#include "tools/bench/multiturn_bench.h"

namespace tandem::bench {

// Throws tandem::Error unless every entry is a policy the router's --policy
// takes (router::parsePolicy, whose message names them all) and none repeats
// (and there is at least one).
void validatePolicies(const std::vector<std::string>& policies);

// Returns 0 when every request of every run completed, else 1. Throws
// tandem::Error when a cluster cannot be started.
int runPolicyComparison(const MultiTurnBenchOptions& options);

}  // namespace tandem::bench
