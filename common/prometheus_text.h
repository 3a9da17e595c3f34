// Reading sample values out of the Prometheus text exposition format (what
// GET /metrics returns), for clients that look at an agent's metrics:
// tandem-bench and the integration tests.
#pragma once

#include <optional>
#include <string_view>

namespace tandem {

// The value of the first sample line "name{labels} value" or "name value"
// whose metric name is exactly `name` and, when label_filter is not empty,
// whose line contains label_filter (e.g. `source="ucx"`). nullopt when no
// line matches or its value is not a number. Comment lines (# HELP, # TYPE)
// are skipped; a trailing timestamp is ignored.
std::optional<double> prometheusSample(std::string_view text, std::string_view name,
                                       std::string_view label_filter = {});

// A sample line's value field as a number ("NaN", "+Inf" and "-Inf"
// included); nullopt when it is not one (or out of a double's range).
std::optional<double> prometheusValue(std::string_view field);

}  // namespace tandem
