// Python's operators on template values (see operators.h).
#include "common/jinja/operators.h"

#include <cmath>
#include <limits>

#include "common/jinja/filters.h"

namespace tandem::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  if (a.isUndefined()) failUndefined(a);
  if (b.isUndefined()) failUndefined(b);
  throw RenderFailure("unsupported operand type(s) for " + op + ": '" + a.typeName() + "' and '" +
                      b.typeName() + "'");
}

Value checkedInt(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    throw RenderFailure("integer result out of range");
  }
  return Value(static_cast<int64_t>(v));
}

Value repeat(const Value& seq, int64_t times, size_t max_bytes) {
  if (times < 0) times = 0;
  if (seq.isString()) {
    const std::string& s = seq.asString();
    if (!s.empty() && static_cast<uint64_t>(times) > max_bytes / s.size()) {
      throw RenderFailure("string repetition exceeds " + std::to_string(max_bytes) +
                          " bytes (limit max_output_bytes)");
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.asList();
  if (!items.empty() && static_cast<uint64_t>(times) > max_bytes / items.size()) {
    throw RenderFailure("list repetition exceeds " + std::to_string(max_bytes) +
                        " items (limit max_output_bytes)");
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.isTuple());
}

double floorMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

Value binaryOp(const std::string& op, const Value& a, const Value& b, size_t max_bytes) {
  if (op == "+") {
    if (a.isNumber() && b.isNumber()) {
      if (a.isFloat() || b.isFloat()) return Value(a.asDouble() + b.asDouble());
      return checkedInt(static_cast<__int128>(a.asInt()) + b.asInt());
    }
    if (a.isString() && b.isString() && (a.isMarkup() || b.isMarkup())) {
      std::string left = a.isMarkup() ? a.asString() : htmlEscape(a.asString());
      std::string right = b.isMarkup() ? b.asString() : htmlEscape(b.asString());
      if (left.size() + right.size() > max_bytes) {
        throw RenderFailure("string exceeds " + std::to_string(max_bytes) +
                            " bytes (limit max_output_bytes)");
      }
      return Value::markup(left + right);
    }
    if (a.isString() && b.isString()) {
      if (a.asString().size() + b.asString().size() > max_bytes) {
        throw RenderFailure("string exceeds " + std::to_string(max_bytes) +
                            " bytes (limit max_output_bytes)");
      }
      return Value(a.asString() + b.asString());
    }
    if (a.isList() && b.isList() && a.isTuple() == b.isTuple()) {
      ValueList out = a.asList();
      out.insert(out.end(), b.asList().begin(), b.asList().end());
      return Value::list(std::move(out), a.isTuple());
    }
    if (a.isUndefined()) failUndefined(a);
    if (b.isUndefined()) failUndefined(b);
    if (a.isString()) {
      throw RenderFailure("can only concatenate str (not \"" + b.typeName() + "\") to str");
    }
    if (a.isList()) {
      throw RenderFailure("can only concatenate " + a.typeName() + " (not \"" + b.typeName() +
                          "\") to " + a.typeName());
    }
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (a.isNumber() && b.isNumber()) {
      if (a.isFloat() || b.isFloat()) return Value(a.asDouble() * b.asDouble());
      return checkedInt(static_cast<__int128>(a.asInt()) * b.asInt());
    }
    if ((a.isString() || a.isList()) && (b.isInt() || b.isBool())) {
      return repeat(a, b.asInt(), max_bytes);
    }
    if ((b.isString() || b.isList()) && (a.isInt() || a.isBool())) {
      return repeat(b, a.asInt(), max_bytes);
    }
    unsupported(op, a, b);
  }
  if (!a.isNumber() || !b.isNumber()) unsupported(op, a, b);
  bool use_float = a.isFloat() || b.isFloat();
  if (op == "-") {
    if (use_float) return Value(a.asDouble() - b.asDouble());
    return checkedInt(static_cast<__int128>(a.asInt()) - b.asInt());
  }
  if (op == "/") {
    if (b.asDouble() == 0) throw RenderFailure("division by zero");
    return Value(a.asDouble() / b.asDouble());
  }
  if (op == "//" || op == "%") {
    if (b.asDouble() == 0) {
      throw RenderFailure(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    }
    if (use_float) {
      double x = a.asDouble();
      double y = b.asDouble();
      if (op == "%") return Value(floorMod(x, y));
      return Value(std::floor(x / y));
    }
    int64_t x = a.asInt();
    int64_t y = b.asInt();
    if (x == std::numeric_limits<int64_t>::min() && y == -1) {
      if (op == "%") return Value(int64_t{0});
      throw RenderFailure("integer result out of range");
    }
    int64_t q = x / y;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return Value(op == "//" ? q : r);
  }
  if (op == "**") {
    if (!use_float && b.asInt() >= 0) {
      __int128 result = 1;
      __int128 base = a.asInt();
      for (int64_t i = 0; i < b.asInt(); ++i) {
        result *= base;
        if (result > std::numeric_limits<int64_t>::max() ||
            result < std::numeric_limits<int64_t>::min()) {
          throw RenderFailure("integer result out of range");
        }
        if (result == 0 || result == 1) break;
      }
      return Value(static_cast<int64_t>(result));
    }
    return Value(std::pow(a.asDouble(), b.asDouble()));
  }
  unsupported(op, a, b);
}

bool containsValue(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case ValueKind::kUndefined:
      return false;
    case ValueKind::kString:
      if (needle.isUndefined()) failUndefined(needle);
      if (!needle.isString()) {
        throw RenderFailure("'in <string>' requires string as left operand, not " +
                            needle.typeName());
      }
      return haystack.asString().find(needle.asString()) != std::string::npos;
    case ValueKind::kList:
      for (const auto& item : haystack.asList()) {
        if (valuesEqual(item, needle)) return true;
      }
      return false;
    case ValueKind::kDict:
      return haystack.asDict().find(needle) != nullptr;
    case ValueKind::kObject:
      return haystack.asObject()->attrs.find(needle) != nullptr;
    default:
      throw RenderFailure("argument of type '" + haystack.typeName() + "' is not iterable");
  }
}

bool compareOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return valuesEqual(a, b);
  if (op == "!=") return !valuesEqual(a, b);
  if (op == "<") return valueLess(a, b);
  if (op == ">") return valueLess(b, a);
  if (op == "<=") return valueLess(a, b) || valuesEqual(a, b);
  if (op == ">=") return valueLess(b, a) || valuesEqual(a, b);
  if (op == "in") return containsValue(b, a);
  if (op == "notin") return !containsValue(b, a);
  throw RenderFailure("unknown comparison operator " + op);
}

}  // namespace tandem::jinja
