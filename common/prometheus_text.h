// Reading sample values out of the Prometheus text exposition format (what
// GET /metrics returns), for clients that look at an agent's metrics:
// tandem-bench and the integration tests.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

// The value of the first sample line "name{labels} value" or "name value"
// whose metric name is exactly `name` and, when label_filter is not empty,
// whose line contains label_filter (e.g. `source="ucx"`). nullopt when no
// line matches or its value is not a number. Comment lines (# HELP, # TYPE)
// are skipped; a trailing timestamp is ignored.
std::optional<double> prometheusSample(std::string_view text, std::string_view name,
                                       std::string_view label_filter = {});
// The sum of every such sample line's value (e.g. a counter over all values
// of a label); nullopt when no line matches with a number.
std::optional<double> prometheusSum(std::string_view text, std::string_view name,
                                    std::string_view label_filter = {});

// One sample line of the text format: `name{k="v",...} value [timestamp]`,
// label values unescaped (\\, \", \n).
struct PrometheusSampleLine {
  std::string_view name;
  std::vector<std::pair<std::string, std::string>> labels;  // in line order
  double value = 0;

  // The value of label `key`; nullopt when the line has no such label.
  std::optional<std::string> label(std::string_view key) const;
};

// Parses one line that is not a comment; nullopt when it is malformed. The
// name is a view into `line`.
std::optional<PrometheusSampleLine> parsePrometheusSampleLine(std::string_view line);

// A sample line's value field as a number ("NaN", "+Inf" and "-Inf"
// included); nullopt when it is not one (or out of a double's range).
std::optional<double> prometheusValue(std::string_view field);

}  // namespace tandem
