// Jinja's tests (see tests.h).
#include "common/jinja/tests.h"

#include <set>

#include "common/jinja/budget.h"
#include "common/jinja/operators.h"

namespace tandem::jinja {
namespace {

const Value& needArg(const CallArgs& args, const std::string& test) {
  const Value* v = args.get(0, "value");
  if (v == nullptr) throw RenderFailure("test '" + test + "' needs an argument");
  return *v;
}

bool hasCased(const std::string& s, bool upper) {
  chargeTextWork(s.size());
  bool any = false;
  for (char c : s) {
    if (c >= 'a' && c <= 'z') {
      if (upper) return false;
      any = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (!upper) return false;
      any = true;
    }
  }
  return any;
}

}  // namespace

bool hasTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "defined", "undefined",   "none",     "string",  "number",      "integer", "float",
      "mapping", "iterable",    "sequence", "boolean", "true",        "false",   "odd",
      "even",    "divisibleby", "eq",       "equalto", "==",          "ne",      "!=",
      "lt",      "lessthan",    "<",        "gt",      "greaterthan", ">",       "le",
      "<=",      "ge",          ">=",       "in",      "callable",    "lower",   "upper",
      "sameas",  "escaped",     "filter",   "test"};
  return kTests.count(name) > 0;
}

bool applyTest(Evaluator&, const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.isUndefined();
  if (name == "undefined") return v.isUndefined();
  if (name == "none") return v.isNone();
  if (name == "string") return v.isString();
  if (name == "number") return v.isNumber();
  if (name == "integer") return v.isInt();
  if (name == "float") return v.isFloat();
  if (name == "boolean") return v.isBool();
  if (name == "true") return v.isBool() && v.asBool();
  if (name == "false") return v.isBool() && !v.asBool();
  if (name == "mapping") return v.isDict();
  if (name == "iterable") return v.isString() || v.isList() || v.isDict() || v.isUndefined();
  if (name == "sequence") return v.isString() || v.isList() || v.isDict() || v.isUndefined();
  if (name == "callable") return v.isCallable();
  if (name == "escaped") return false;
  if (name == "lower") return v.isString() && hasCased(v.asString(), false);
  if (name == "upper") return v.isString() && hasCased(v.asString(), true);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.isUndefined()) failUndefined(v);
    if (!v.isInt() && !v.isBool()) {
      throw RenderFailure("test '" + name + "' needs an integer, got " + v.typeName());
    }
    int64_t x = v.asInt();
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    const Value& d = needArg(args, name);
    if (!d.isInt() || d.asInt() == 0) throw RenderFailure("divisibleby needs a non-zero integer");
    // INT64_MIN % -1 overflows; every integer is divisible by -1.
    if (d.asInt() == -1) return true;
    return x % d.asInt() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==")
    return compareOp("==", v, needArg(args, name));
  if (name == "ne" || name == "!=") return compareOp("!=", v, needArg(args, name));
  if (name == "lt" || name == "lessthan" || name == "<")
    return compareOp("<", v, needArg(args, name));
  if (name == "gt" || name == "greaterthan" || name == ">")
    return compareOp(">", v, needArg(args, name));
  if (name == "le" || name == "<=") return compareOp("<=", v, needArg(args, name));
  if (name == "ge" || name == ">=") return compareOp(">=", v, needArg(args, name));
  if (name == "in") return containsValue(needArg(args, name), v);
  if (name == "sameas") {
    const Value& other = needArg(args, name);
    if (v.isNone() || other.isNone() || v.isBool() || other.isBool()) {
      return v.kind() == other.kind() && valuesEqual(v, other);
    }
    return valuesEqual(v, other) && v.kind() == other.kind();
  }
  throw RenderFailure("no test named '" + name + "'");
}

}  // namespace tandem::jinja
