// Jinja's filters (see filters.h).
#include "common/jinja/filters.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/jinja/access.h"
#include "common/jinja/budget.h"
#include "common/jinja/evaluator.h"
#include "common/jinja/operators.h"
#include "common/jinja/python_format.h"
#include "common/jinja/tests.h"
#include "common/jinja/unicode.h"

namespace tandem::jinja {
namespace {

// A copy of what iterating `v` gives, to reorder.
ValueList toList(const Value& v, const std::string& filter) {
  return iterableItems(v, "filter " + filter);
}

// What iterating `v` gives, as a list value (a list itself, not copied);
// charges a step per item, for the filter's pass over them.
Value toListValue(const Value& v, const std::string& filter) {
  Value list = iterableList(v, "filter " + filter);
  chargeSteps(list.asList().size());
  return list;
}

// Widths, indents and padding a filter makes from an argument: no real
// template comes near, and the result's size is checked as well.
constexpr int64_t kMaxWidth = 4096;

// Throws (kind kLimit) when an argument sizing an allocation is too large.
void checkWidth(int64_t width, const char* filter, const char* argument) {
  if (width > kMaxWidth) {
    failLimit(std::string("filter ") + filter + ": " + argument + " must be at most " +
              std::to_string(kMaxWidth) + ", got " + std::to_string(width) +
              " (limit on filter widths)");
  }
}

// Throws "integer result out of range" unless `d` (finite) truncates into int64.
int64_t truncToInt(double d) {
  const double t = std::trunc(d);
  // -2^63 is exact as a double; 2^63 is the first value past the range.
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) {
    throw RenderFailure("integer result out of range");
  }
  return static_cast<int64_t>(t);
}

// jinja2's attribute getter: "a.b.0" walks items and attributes.
Value getPath(const Value& v, const Value& attribute) {
  if (!attribute.isString()) return getItem(v, attribute);
  Value cur = v;
  static const std::string kDot = ".";
  for (const auto& part : pySplit(attribute.asString(), &kDot, -1)) {
    if (cur.isUndefined()) return cur;
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(),
                                                [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric ? getItem(cur, Value(static_cast<int64_t>(std::stoll(part))))
                  : getItem(cur, Value(part));
  }
  return cur;
}

const Value* arg(const CallArgs& args, size_t index, const std::string& name) {
  return args.get(index, name);
}

bool boolArg(const CallArgs& args, size_t index, const std::string& name, bool dflt) {
  const Value* v = arg(args, index, name);
  return v == nullptr ? dflt : v->truthy();
}

// A dict's (key, value) tuples, as items() and dictsort see them.
Value dictItems(const ValueDict& dict) {
  // Each tuple: its Value and a payload holding two.
  reserveBytes(saturatingMul(dict.items.size(), 3 * sizeof(Value) + 64));
  ValueList out;
  out.reserve(dict.items.size());
  for (const auto& [k, v] : dict.items) out.push_back(Value::list({k, v}, true));
  return Value::list(std::move(out));
}

// Python's round(x, digits) of an int: an int, halves to even.
Value roundInt(int64_t x, int64_t digits) {
  if (digits >= 0) return Value(x);
  // |x| < 2^63 < 10^19 / 2: rounding to 10^20 or coarser gives 0.
  if (digits <= -20) return Value(int64_t{0});
  __int128 unit = 1;
  for (int64_t i = 0; i < -digits; ++i) unit *= 10;
  __int128 q = x / unit;
  __int128 r = x % unit;
  if (r < 0) {
    q -= 1;
    r += unit;
  }
  if (2 * r > unit || (2 * r == unit && (q & 1) != 0)) q += 1;
  const __int128 result = q * unit;
  if (result > std::numeric_limits<int64_t>::max() ||
      result < std::numeric_limits<int64_t>::min()) {
    throw RenderFailure("integer result out of range");
  }
  return Value(static_cast<int64_t>(result));
}

Value lowerForSort(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.isString()) return Value(asciiLower(v.asString()));
  return v;
}

}  // namespace

std::string htmlEscape(const std::string& s) {
  // Each of & < > " ' becomes five bytes: sized before building.
  size_t special = 0;
  for (char c : s) special += c == '&' || c == '<' || c == '>' || c == '"' || c == '\'';
  const size_t size = saturatingAdd(s.size(), saturatingMul(special, 4));
  reserveBytes(size);
  chargeTextWork(size);
  std::string out;
  out.reserve(size);
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

namespace {

std::string jinjaTitle(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    bool sep = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
               c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
      out.push_back(c);
      continue;
    }
    if (word_start) {
      out += asciiUpper(std::string(1, c));
    } else {
      out += asciiLower(std::string(1, c));
    }
    word_start = false;
  }
  return out;
}

std::string indentText(Evaluator& ev, const std::string& text, const Value* width, bool first,
                       bool blank) {
  std::string indention = "    ";
  if (width != nullptr) {
    if (width->isString()) {
      checkWidth(static_cast<int64_t>(width->asString().size()), "indent", "width");
      indention = width->asString();
    } else if (width->isNumber()) {
      checkWidth(width->asInt(), "indent", "width");
      indention = std::string(static_cast<size_t>(std::max<int64_t>(0, width->asInt())), ' ');
    }
  }
  ev.checkNewString(saturatingAdd(text.size(), 1));
  std::vector<std::string> lines = pySplitLines(text + "\n");
  // Every line gains at most the indention and a newline.
  ev.checkNewString(
      saturatingAdd(text.size() + 1, saturatingMul(lines.size() + 1, indention.size() + 1)));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

std::optional<int64_t> parseInt(const std::string& s) {
  std::string t = pyStrip(s, nullptr, true, true);
  std::string digits;
  for (char c : t) {
    if (c != '_') digits.push_back(c);
  }
  if (digits.empty()) return std::nullopt;
  size_t i = (digits[0] == '+' || digits[0] == '-') ? 1 : 0;
  if (i >= digits.size()) return std::nullopt;
  for (size_t k = i; k < digits.size(); ++k) {
    if (digits[k] < '0' || digits[k] > '9') return std::nullopt;
  }
  try {
    return std::stoll(digits);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> parseFloat(const std::string& s) {
  std::string t = pyStrip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  try {
    size_t used = 0;
    double d = std::stod(t, &used);
    if (used != t.size()) return std::nullopt;
    return d;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

Value selectOrReject(Evaluator& ev, const Value& input, const CallArgs& args, bool select,
                     bool by_attr, const std::string& filter) {
  ValueList out;
  // jinja2 yields nothing for a false-y sequence (None included).
  if (!input.truthy()) return Value::list({});
  size_t first_test_arg = by_attr ? 1 : 0;
  const Value* attribute = by_attr ? arg(args, 0, "attribute") : nullptr;
  if (by_attr && attribute == nullptr) throw RenderFailure(filter + " needs an attribute name");
  const Value* test =
      first_test_arg < args.positional.size() ? &args.positional[first_test_arg] : nullptr;
  CallArgs test_args;
  for (size_t i = first_test_arg + 1; i < args.positional.size(); ++i) {
    test_args.positional.push_back(args.positional[i]);
  }
  const Value sequence = toListValue(input, filter);
  for (const auto& item : sequence.asList()) {
    Value subject = by_attr ? getPath(item, *attribute) : item;
    bool ok;
    if (test == nullptr) {
      ok = subject.truthy();
    } else {
      if (!test->isString()) throw RenderFailure(filter + " test name must be a string");
      ok = applyTest(ev, test->asString(), subject, test_args);
    }
    if (ok == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value sortValues(const Value& input, const CallArgs& args) {
  bool reverse = boolArg(args, 0, "reverse", false);
  bool case_sensitive = boolArg(args, 1, "case_sensitive", false);
  const Value* attribute = arg(args, 2, "attribute");
  ValueList items = toList(input, "sort");
  auto key = [&](const Value& v) {
    return lowerForSort(attribute != nullptr ? getPath(v, *attribute) : v, case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? valueLess(key(b), key(a)) : valueLess(key(a), key(b));
  });
  return Value::list(std::move(items));
}

Value minMax(const Value& input, const CallArgs& args, bool want_max) {
  bool case_sensitive = boolArg(args, 0, "case_sensitive", false);
  const Value* attribute = arg(args, 1, "attribute");
  const Value sequence = toListValue(input, want_max ? "max" : "min");
  const ValueList& items = sequence.asList();
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& v) {
    return lowerForSort(attribute != nullptr ? getPath(v, *attribute) : v, case_sensitive);
  };
  Value best = items[0];
  for (const auto& item : items) {
    if (want_max ? valueLess(key(best), key(item)) : valueLess(key(item), key(best))) best = item;
  }
  return best;
}

Value jsonFilter(const Value& input, const CallArgs& args, size_t max_bytes) {
  JsonDumpOptions o;
  o.max_bytes = max_bytes;
  o.ensure_ascii = boolArg(args, 0, "ensure_ascii", false);
  const Value* indent = arg(args, 1, "indent");
  if (indent != nullptr && !indent->isNone()) {
    if (indent->isString()) {
      checkWidth(static_cast<int64_t>(indent->asString().size()), "tojson", "indent");
      o.indent = indent->asString();
    } else if (indent->isNumber()) {
      checkWidth(indent->asInt(), "tojson", "indent");
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent->asInt())), ' ');
    } else {
      throw RenderFailure("tojson indent must be an integer or a string");
    }
    o.item_separator = ",";
  }
  const Value* separators = arg(args, 2, "separators");
  if (separators != nullptr && !separators->isNone()) {
    if (!separators->isList() || separators->asList().size() != 2 ||
        !separators->asList()[0].isString() || !separators->asList()[1].isString()) {
      throw RenderFailure("tojson separators must be a pair of strings");
    }
    o.item_separator = separators->asList()[0].asString();
    o.key_separator = separators->asList()[1].asString();
  }
  o.sort_keys = boolArg(args, 3, "sort_keys", false);
  return Value(jsonDumps(input, o));
}

Value stringFilter(Evaluator& ev, const std::string& name, const std::string& s,
                   const CallArgs& args) {
  // Each reads `s` once; most build a string about its size.
  chargeTextWork(s.size());
  if (name == "trim" || name == "upper" || name == "lower" || name == "title" ||
      name == "capitalize" || name == "string") {
    reserveBytes(s.size());
  }
  if (name == "trim") {
    const Value* chars = arg(args, 0, "chars");
    const std::string* set = chars != nullptr && chars->isString() ? &chars->asString() : nullptr;
    return Value(pyStrip(s, set, true, true));
  }
  if (name == "upper") return Value(asciiUpper(s));
  if (name == "lower") return Value(asciiLower(s));
  if (name == "title") return Value(jinjaTitle(s));
  if (name == "capitalize") {
    std::string out = asciiLower(s);
    if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
    return Value(std::move(out));
  }
  if (name == "string") return Value(s);
  if (name == "e" || name == "escape") return Value::markup(htmlEscape(s));
  if (name == "indent") {
    return Value(indentText(ev, s, arg(args, 0, "width"), boolArg(args, 1, "first", false),
                            boolArg(args, 2, "blank", false)));
  }
  if (name == "wordcount") {
    int64_t words = 0;
    bool in_word = false;
    for (char c : s) {
      bool w = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || (static_cast<unsigned char>(c) & 0x80);
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value(words);
  }
  if (name == "center") {
    const Value* width = arg(args, 0, "width");
    int64_t w = width != nullptr && width->isNumber() ? width->asInt() : 80;
    checkWidth(w, "center", "width");
    int64_t len = static_cast<int64_t>(codePointCount(s));
    if (w <= len) return Value(s);
    int64_t pad = w - len;
    ev.checkNewString(s.size() + static_cast<size_t>(pad));
    int64_t left = pad / 2 + (pad & w & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s +
                 std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "replace") {
    return callMethod(Value(s), "replace", args);
  }
  throw RenderFailure("no filter named '" + name + "'");
}

}  // namespace

Value applyFilter(Evaluator& ev, const std::string& name, const Value& input,
                  const CallArgs& args) {
  ev.budget().step();
  if (name == "default" || name == "d") {
    const Value* fallback = arg(args, 0, "default_value");
    bool boolean = boolArg(args, 1, "boolean", false);
    bool use_fallback = input.isUndefined() || (boolean && !input.truthy());
    if (!use_fallback) return input;
    return fallback != nullptr ? *fallback : Value("");
  }
  if (name == "safe")
    return input.isString() ? Value::markup(input.asString()) : Value::markup(pyStr(input));
  if (name == "tojson") return jsonFilter(input, args, ev.options().limits.max_output_bytes);
  if (name == "length" || name == "count") {
    switch (input.kind()) {
      case ValueKind::kUndefined:
        return Value(int64_t{0});
      case ValueKind::kString:
        return Value(static_cast<int64_t>(codePointCount(input.asString())));
      case ValueKind::kList:
        return Value(static_cast<int64_t>(input.asList().size()));
      case ValueKind::kDict:
        return Value(static_cast<int64_t>(input.asDict().items.size()));
      default:
        throw RenderFailure("object of type '" + input.typeName() + "' has no len()");
    }
  }
  if (name == "list") return Value::list(toList(input, name));
  if (name == "first") {
    const Value sequence = toListValue(input, name);
    if (sequence.asList().empty()) return Value::undefined("No first item, sequence was empty.");
    return sequence.asList().front();
  }
  if (name == "last") {
    const Value sequence = toListValue(input, name);
    if (sequence.asList().empty()) return Value::undefined("No last item, sequence was empty.");
    return sequence.asList().back();
  }
  if (name == "reverse") {
    if (input.isString()) {
      reserveBytes(input.asString().size());
      std::u32string cps = decodeUtf8(input.asString());
      std::reverse(cps.begin(), cps.end());
      return Value(encodeUtf8(cps));
    }
    ValueList items = toList(input, name);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "join") {
    const size_t max_bytes = ev.options().limits.max_output_bytes;
    const Value* sep = arg(args, 0, "d");
    const Value* attribute = arg(args, 1, "attribute");
    std::string d = sep != nullptr ? pyStr(*sep, max_bytes) : "";
    std::string out;
    bool first = true;
    const Value sequence = toListValue(input, name);
    for (const auto& item : sequence.asList()) {
      const Value piece = attribute != nullptr ? getPath(item, *attribute) : item;
      std::string printed = piece.isString() ? std::string() : pyStr(piece, max_bytes);
      const std::string& text = piece.isString() ? piece.asString() : printed;
      // The joined string is checked before it grows.
      ev.checkNewString(saturatingAdd(out.size(), (first ? 0 : d.size()) + text.size()));
      chargeTextWork(d.size() + text.size());
      if (!first) out += d;
      first = false;
      out += text;
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    ValueList out;
    if (!input.truthy()) return Value::list({});
    const Value sequence = toListValue(input, name);
    reserveBytes(saturatingMul(sequence.asList().size(), sizeof(Value)));
    out.reserve(sequence.asList().size());
    const Value* attribute = nullptr;
    for (const auto& [k, v] : args.keyword) {
      if (k == "attribute") attribute = &v;
    }
    if (attribute != nullptr) {
      const Value* dflt = nullptr;
      for (const auto& [k, v] : args.keyword) {
        if (k == "default") dflt = &v;
      }
      for (const auto& item : sequence.asList()) {
        Value v = getPath(item, *attribute);
        out.push_back(v.isUndefined() && dflt != nullptr ? *dflt : v);
      }
      return Value::list(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].isString()) {
      throw RenderFailure("map needs a filter name or attribute=");
    }
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const auto& item : sequence.asList()) {
      out.push_back(applyFilter(ev, args.positional[0].asString(), item, rest));
    }
    return Value::list(std::move(out));
  }
  if (name == "select" || name == "reject") {
    return selectOrReject(ev, input, args, name == "select", false, name);
  }
  if (name == "selectattr" || name == "rejectattr") {
    return selectOrReject(ev, input, args, name == "selectattr", true, name);
  }
  if (name == "items") {
    if (input.isUndefined()) return Value::list({});
    if (!input.isDict()) throw RenderFailure("Can only get item pairs from a mapping.");
    return dictItems(input.asDict());
  }
  if (name == "dictsort") {
    if (!input.isDict()) throw RenderFailure("You can only sort by either a mapping.");
    bool case_sensitive = boolArg(args, 0, "case_sensitive", false);
    const Value* by = arg(args, 1, "by");
    bool by_value = by != nullptr && by->isString() && by->asString() == "value";
    bool reverse = boolArg(args, 2, "reverse", false);
    ValueList out = dictItems(input.asDict()).asList();
    std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
      Value ka = lowerForSort(a.asList()[by_value ? 1 : 0], case_sensitive);
      Value kb = lowerForSort(b.asList()[by_value ? 1 : 0], case_sensitive);
      return reverse ? valueLess(kb, ka) : valueLess(ka, kb);
    });
    return Value::list(std::move(out));
  }
  if (name == "sort") return sortValues(input, args);
  if (name == "unique") {
    bool case_sensitive = boolArg(args, 0, "case_sensitive", false);
    const Value* attribute = arg(args, 1, "attribute");
    ValueList out;
    ValueList seen;
    const Value sequence = toListValue(input, name);
    for (const auto& item : sequence.asList()) {
      Value key =
          lowerForSort(attribute != nullptr ? getPath(item, *attribute) : item, case_sensitive);
      if (std::none_of(seen.begin(), seen.end(),
                       [&](const Value& s) { return valuesEqual(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "min" || name == "max") return minMax(input, args, name == "max");
  if (name == "sum") {
    const Value* attribute = arg(args, 0, "attribute");
    const Value* start = arg(args, 1, "start");
    Value total = start != nullptr ? *start : Value(int64_t{0});
    const Value sequence = toListValue(input, name);
    for (const auto& item : sequence.asList()) {
      total = binaryOp("+", total, attribute != nullptr ? getPath(item, *attribute) : item,
                       ev.options().limits.max_output_bytes);
    }
    return total;
  }
  if (name == "abs") {
    if (input.isFloat()) return Value(std::fabs(input.asDouble()));
    if (input.isNumber()) {
      const int64_t x = input.asInt();
      if (x == std::numeric_limits<int64_t>::min()) {
        throw RenderFailure("integer result out of range");
      }
      return Value(x < 0 ? -x : x);
    }
    throw RenderFailure("bad operand type for abs(): '" + input.typeName() + "'");
  }
  if (name == "int") {
    const Value* dflt = arg(args, 0, "default");
    Value fallback = dflt != nullptr ? *dflt : Value(int64_t{0});
    // Python's int(): NaN is a ValueError (the default), infinity an
    // OverflowError, and a value past 64 bits is our overflow error.
    auto from_double = [&](double d) {
      if (std::isnan(d)) return fallback;
      if (std::isinf(d)) throw RenderFailure("cannot convert float infinity to integer");
      return Value(truncToInt(d));
    };
    if (input.isInt() || input.isBool()) return Value(input.asInt());
    if (input.isFloat()) return from_double(input.asDouble());
    if (input.isString()) {
      if (auto i = parseInt(input.asString())) return Value(*i);
      if (auto f = parseFloat(input.asString())) return from_double(*f);
    }
    return fallback;
  }
  if (name == "float") {
    const Value* dflt = arg(args, 0, "default");
    Value fallback = dflt != nullptr ? *dflt : Value(0.0);
    if (input.isNumber()) return Value(input.asDouble());
    if (input.isString()) {
      if (auto f = parseFloat(input.asString())) return Value(*f);
    }
    return fallback;
  }
  if (name == "round") {
    const Value* precision = arg(args, 0, "precision");
    const Value* method = arg(args, 1, "method");
    int64_t p = precision != nullptr && precision->isNumber() ? precision->asInt() : 0;
    std::string m = method != nullptr && method->isString() ? method->asString() : "common";
    if (m != "common" && m != "ceil" && m != "floor") {
      throw RenderFailure("method must be common, ceil or floor");
    }
    if (!input.isNumber()) throw RenderFailure("round needs a number, got " + input.typeName());
    // Python's round() of an int is an int.
    if (m == "common" && !input.isFloat()) return roundInt(input.asInt(), p);
    double scale = std::pow(10.0, static_cast<double>(p));
    double x = input.asDouble() * scale;
    // Digits past what a double holds leave it as it is; digits far above
    // it round it to zero.
    if (!std::isfinite(x) || scale == 0) {
      if (!std::isfinite(x) && std::isfinite(input.asDouble())) return Value(input.asDouble());
      if (scale == 0) return Value(std::copysign(0.0, input.asDouble()));
    }
    // "common" rounds half to even, as Python's round() does.
    double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);

    return Value(r / scale);
  }
  if (input.isUndefined() && name != "string" && name != "e" && name != "escape") {
    return stringFilter(ev, name, "", args);
  }
  if ((name == "e" || name == "escape") && input.isMarkup()) return input;
  if (input.isString()) return stringFilter(ev, name, input.asString(), args);
  return stringFilter(ev, name, pyStr(input, ev.options().limits.max_output_bytes), args);
}

}  // namespace tandem::jinja
