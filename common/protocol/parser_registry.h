// The name registry the chat output parsers share (reasoning_parser.h,
// tool_call_parser.h): a table of each kind and its name, in the order error
// messages list them, read three ways. Header-only; the tables are constant.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem::protocol {

template <typename Kind, size_t N>
using ParserTable = std::pair<Kind, const char*>[N];

// The names, in the table's order.
template <typename Kind, size_t N>
std::vector<std::string> parserNames(const ParserTable<Kind, N>& table) {
  std::vector<std::string> names;
  for (const auto& [kind, name] : table) names.emplace_back(name);
  return names;
}

// The name of `kind` (the first entry's for a kind the table lacks).
template <typename Kind, size_t N>
const char* parserName(const ParserTable<Kind, N>& table, Kind kind) {
  for (const auto& [known, name] : table) {
    if (known == kind) return name;
  }
  return table[0].second;
}

// The kind named `name`, or InvalidArgument naming the accepted names:
// `unknown <what> "x" (<flag>); accepted: a, b, c`.
template <typename Kind, size_t N>
StatusOr<Kind> parserFromName(const ParserTable<Kind, N>& table, std::string_view name,
                              std::string_view what, std::string_view flag) {
  std::string accepted;
  for (const auto& [kind, known] : table) {
    if (name == known) return kind;
    accepted += (accepted.empty() ? "" : ", ") + std::string(known);
  }
  return invalidArgument("unknown " + std::string(what) + " \"" + std::string(name) + "\" (" +
                         std::string(flag) + "); accepted: " + accepted);
}

}  // namespace tandem::protocol
