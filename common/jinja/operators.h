// Python's operators on template values: arithmetic (+ - * / // % **),
// concatenation (~), comparisons and `in`, with Python's type errors
// ("can only concatenate str (not \"list\") to str").
#pragma once

#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

// `max_bytes` bounds strings and lists that `+` and `*` build.
Value binaryOp(const std::string& op, const Value& a, const Value& b, size_t max_bytes);
// op: == != < > <= >= in notin.
bool compareOp(const std::string& op, const Value& a, const Value& b);
// Python's `needle in haystack`.
bool containsValue(const Value& haystack, const Value& needle);

}  // namespace tandem::jinja
