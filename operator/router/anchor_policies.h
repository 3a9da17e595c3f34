// Other projects' published routing policies, written from their public
// documentation and run by this router for comparison with the kv policy
// (`--policy dynamo|llm_d|sglang`; `tandem-bench multiturn --policies`).
// docs/router.md cites each source and the defaults used. Pure functions of
// the DecisionInput (the ledger and polled load the kv policy sees) and a
// seeded generator for ties.
#pragma once

#include <random>

#include "operator/router/policy.h"

namespace tandem::router {

Decision chooseDynamo(const DecisionInput& input, const PolicyOptions& options,
                      std::mt19937_64& random);
Decision chooseLlmD(const DecisionInput& input, const PolicyOptions& options,
                    std::mt19937_64& random);
Decision chooseSglang(const DecisionInput& input, const PolicyOptions& options,
                      std::mt19937_64& random);

}  // namespace tandem::router
