// What a router's metrics must show after a decode agent drained while
// streams ran on it (docs/operations.md, "Draining"): shared by the router
// test and the local-mode scale-down test.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "common/prometheus_text.h"

namespace tandem::testing {

// At least `min_moved` streams were resumed after a drain; each took its KV
// from the drained agent's hand-over, or (a stream handed over while its
// prompt was still loading, which has no block to hand over) from the
// prefill agent or by recomputing; some tokens were transferred; one pause
// was observed per move, each within the `streams_s` seconds the streams
// ran (a pause is a span of some stream's life). Returns the number of
// streams moved.
inline double expectDrainMigrations(std::string_view router_metrics, double min_moved,
                                    double streams_s) {
  auto sample = [&](std::string_view name, std::string_view filter = {}) {
    return prometheusSample(router_metrics, name, filter).value_or(0);
  };
  const double moved =
      sample("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"drain\"");
  EXPECT_GE(moved, min_moved);
  EXPECT_EQ(sample("tandem_router_migrations_total", "outcome=\"resumed\",reason=\"failure\""), 0);
  const double handed_over =
      sample("tandem_router_migration_prefixes_total", "source=\"handed_over\"");
  EXPECT_GE(handed_over, 1);
  EXPECT_EQ(handed_over + sample("tandem_router_migration_prefixes_total", "source=\"pulled\"") +
                sample("tandem_router_migration_prefixes_total", "source=\"recomputed\""),
            moved);
  EXPECT_GT(sample("tandem_router_migration_tokens_total", "kv=\"transferred\""), 0);
  EXPECT_EQ(sample("tandem_router_migration_pause_seconds_count", "reason=\"drain\""), moved);
  EXPECT_LE(sample("tandem_router_migration_pause_seconds_sum", "reason=\"drain\""),
            moved * streams_s);
  return moved;
}

}  // namespace tandem::testing
