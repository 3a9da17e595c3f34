// Python's operators on template values (see operators.h).
#include "common/jinja/operators.h"

#include <cmath>
#include <limits>

#include "common/jinja/budget.h"
#include "common/jinja/filters.h"
#include "common/jinja/unicode.h"

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

[[noreturn]] void failStringSize(size_t max_bytes) {
  failLimit("string exceeds " + std::to_string(max_bytes) + " bytes (limit max_output_bytes)");
}

Value repeat(const Value& seq, int64_t times, size_t max_bytes) {
  // Nothing repeated any number of times is nothing: no loop over `times`.
  if (times <= 0 || (seq.isString() ? seq.asString().empty() : seq.asList().empty())) {
    return seq.isString() ? Value(std::string()) : Value::list({}, seq.isTuple());
  }
  const auto count = static_cast<uint64_t>(times);
  if (seq.isString()) {
    const std::string& s = seq.asString();
    if (count > max_bytes / s.size()) {
      failLimit("string repetition exceeds " + std::to_string(max_bytes) +
                " bytes (limit max_output_bytes)");
    }
    reserveBytes(s.size() * count);
    std::string out;
    out.reserve(s.size() * count);
    for (uint64_t i = 0; i < count; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.asList();
  if (count > max_bytes / items.size()) {
    failLimit("list repetition exceeds " + std::to_string(max_bytes) +
              " items (limit max_output_bytes)");
  }
  reserveBytes(saturatingMul(items.size() * count, sizeof(Value)));
  ValueList out;
  out.reserve(items.size() * count);
  for (uint64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.isTuple());
}

// Python's int ** int for a non-negative exponent; overflow is an error.
Value intPower(int64_t base, int64_t exponent) {
  const __int128 max = std::numeric_limits<int64_t>::max();
  const __int128 min = std::numeric_limits<int64_t>::min();
  auto in_range = [&](__int128 v) { return v >= min && v <= max; };
  // Squaring keeps the loop to 64 rounds whatever the exponent.
  __int128 result = 1;
  __int128 factor = base;
  uint64_t e = static_cast<uint64_t>(exponent);
  while (e != 0) {
    if (e & 1) {
      result *= factor;
      if (!in_range(result)) throw RenderFailure("integer result out of range");
    }
    e >>= 1;
    if (e == 0) break;
    // |factor| beyond 2^32 squares past int64: any further use overflows,
    // unless the result is already 0.
    if (factor > (__int128{1} << 32) || factor < -(__int128{1} << 32)) {
      if (result == 0) return Value(int64_t{0});
      throw RenderFailure("integer result out of range");
    }
    factor *= factor;
  }
  return Value(static_cast<int64_t>(result));
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
      if (left.size() + right.size() > max_bytes) failStringSize(max_bytes);
      reserveBytes(left.size() + right.size());
      return Value::markup(left + right);
    }
    if (a.isString() && b.isString()) {
      const size_t size = a.asString().size() + b.asString().size();
      if (size > max_bytes) failStringSize(max_bytes);
      reserveBytes(size);
      std::string joined;
      joined.reserve(size);
      joined += a.asString();
      joined += b.asString();
      return Value(std::move(joined));
    }
    if (a.isList() && b.isList() && a.isTuple() == b.isTuple()) {
      const size_t count = a.asList().size() + b.asList().size();
      reserveBytes(saturatingMul(count, sizeof(Value)));
      chargeSteps(count);
      ValueList out;
      out.reserve(count);
      out.insert(out.end(), a.asList().begin(), a.asList().end());
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
    if (!use_float && b.asInt() >= 0) return intPower(a.asInt(), b.asInt());
    if (a.asDouble() == 0 && b.asDouble() < 0) {
      throw RenderFailure("0.0 cannot be raised to a negative power");
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
      return findText(haystack.asString(), needle.asString()) != std::string::npos;
    case ValueKind::kList:
      chargeSteps(haystack.asList().size());
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
