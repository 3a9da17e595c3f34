// Python's str()/repr()/json.dumps of values (see python_format.h).
#include "common/jinja/python_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/jinja/budget.h"
#include "common/jinja/unicode.h"

namespace tandem::jinja {
namespace {

// Text printed in one go between checks of the output's size: escaping can
// make it up to 12 times longer, so a check passes by at most 48 KiB.
constexpr size_t kCheckEvery = 4096;

// Throws `what` (limit max_output_bytes) when `out` grown by `extra` bytes
// would pass `max_bytes`, or the memory budget; charges steps for `extra`.
void checkGrowth(const std::string& out, size_t extra, size_t max_bytes, const char* what) {
  const size_t size = saturatingAdd(out.size(), extra);
  if (size > max_bytes) {
    failLimit(std::string(what) + " exceeds " + std::to_string(max_bytes) +
              " bytes (limit max_output_bytes)");
  }
  reserveBytes(size);
  chargeTextWork(extra);
}

void reprString(std::string& out, const std::string& s, size_t max_bytes) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i % kCheckEvery == 0) {
      checkGrowth(out, std::min(kCheckEvery, s.size() - i), max_bytes, "printed value");
    }
    const char c = s[i];
    unsigned char u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
}

void jsonString(std::string& out, std::string_view s, bool ensure_ascii, size_t max_bytes) {
  out.push_back('"');
  auto escape_u = [&](unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", v);
    out += buf;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (i % kCheckEvery == 0) {
      checkGrowth(out, std::min(kCheckEvery, s.size() - i), max_bytes, "tojson output");
    }
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      escape_u(c);
    } else if (c >= 0x80 && ensure_ascii) {
      size_t start = i;
      size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      std::u32string cps = decodeUtf8(std::string_view(s).substr(start, len));
      i = start + len - 1;
      for (char32_t cp : cps) {
        if (cp >= 0x10000) {
          cp -= 0x10000;
          escape_u(0xD800 + (cp >> 10));
          escape_u(0xDC00 + (cp & 0x3FF));
        } else {
          escape_u(cp);
        }
      }
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

std::string jsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return pyFloatRepr(d);
}

std::string jsonKey(const Value& k) {
  if (k.isString()) return k.asString();
  if (k.isBool()) return k.asBool() ? "true" : "false";
  if (k.isInt()) return std::to_string(k.asInt());
  if (k.isFloat()) return jsonFloat(k.asDouble());
  if (k.isNone()) return "null";
  throw RenderFailure("keys must be str, int, float, bool or None, not " + k.typeName());
}

void dumpValue(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  switch (v.kind()) {
    case ValueKind::kNone:
      out += "null";
      return;
    case ValueKind::kBool:
      out += v.asBool() ? "true" : "false";
      return;
    case ValueKind::kInt:
      out += std::to_string(v.asInt());
      return;
    case ValueKind::kFloat:
      out += jsonFloat(v.asDouble());
      return;
    case ValueKind::kString:
      jsonString(out, v.asString(), o.ensure_ascii, o.max_bytes);
      return;
    default:
      break;
  }
  // Values are at most max_value_depth deep; this guards the recursion
  // whatever they are.
  if (static_cast<size_t>(level) >= maxValueDepth()) {
    failLimit("tojson of a value nested more than " + std::to_string(maxValueDepth()) +
              " levels (limit max_value_depth)");
  }
  checkGrowth(out, 1, o.max_bytes, "tojson output");
  auto newline = [&](int depth) {
    if (!o.indent) return;
    checkGrowth(out, saturatingAdd(1, saturatingMul(depth, o.indent->size())), o.max_bytes,
                "tojson output");
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += *o.indent;
  };
  if (v.isList()) {
    const auto& items = v.asList();
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += o.item_separator;
      newline(level + 1);
      dumpValue(out, items[i], o, level + 1);
    }
    newline(level);
    out.push_back(']');
    return;
  }
  if (v.isDict()) {
    // String keys are read in place; others are printed into `printed`.
    const auto& items = v.asDict().items;
    std::vector<std::string> printed;
    printed.reserve(items.size());
    std::vector<std::pair<std::string_view, const Value*>> entries;
    entries.reserve(items.size());
    for (const auto& [k, item] : items) {
      if (k.isString()) {
        entries.emplace_back(k.asString(), &item);
      } else {
        printed.push_back(jsonKey(k));
        entries.emplace_back(printed.back(), &item);
      }
    }
    if (entries.empty()) {
      out += "{}";
      return;
    }
    if (o.sort_keys) {
      chargeSteps(entries.size());
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out += o.item_separator;
      newline(level + 1);
      jsonString(out, entries[i].first, o.ensure_ascii, o.max_bytes);
      out += o.key_separator;
      dumpValue(out, *entries[i].second, o, level + 1);
    }
    newline(level);
    out.push_back('}');
    return;
  }
  std::string type = v.isUndefined() ? "Undefined" : v.typeName();
  throw RenderFailure("Object of type " + type + " is not JSON serializable");
}

}  // namespace

std::string pyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out += std::string(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits;
      out += std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1);
      out += ".";
      out += digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += ".";
    out += digits.substr(1);
  }
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += exp_buf;
  return out;
}

namespace {

// Appends str(v) (repr when `repr`) to `out`; containers can share parts, so
// the size is checked as it grows rather than after.
void printInto(std::string& out, const Value& v, bool repr, size_t depth, size_t max_bytes) {
  // Lists and dicts are at most max_value_depth deep, but objects can hold
  // values that hold objects, without end.
  if (depth > maxValueDepth()) {
    failLimit("printing a value nested more than " + std::to_string(maxValueDepth()) +
              " levels (limit max_value_depth)");
  }
  checkGrowth(out, 1, max_bytes, "printed value");
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return;
    case ValueKind::kNone:
      out += "None";
      return;
    case ValueKind::kBool:
      out += v.asBool() ? "True" : "False";
      return;
    case ValueKind::kInt:
      out += std::to_string(v.asInt());
      return;
    case ValueKind::kFloat:
      out += pyFloatRepr(v.asDouble());
      return;
    case ValueKind::kString:
      if (repr) {
        reprString(out, v.asString(), max_bytes);
      } else {
        checkGrowth(out, v.asString().size(), max_bytes, "printed value");
        out += v.asString();
      }
      return;
    case ValueKind::kList: {
      const auto& items = v.asList();
      out += v.isTuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        printInto(out, items[i], true, depth + 1, max_bytes);
      }
      if (v.isTuple() && items.size() == 1) out += ",";
      out += v.isTuple() ? ")" : "]";
      return;
    }
    case ValueKind::kDict: {
      out += "{";
      bool first = true;
      for (const auto& [k, item] : v.asDict().items) {
        if (!first) out += ", ";
        first = false;
        printInto(out, k, true, depth + 1, max_bytes);
        out += ": ";
        printInto(out, item, true, depth + 1, max_bytes);
      }
      out += "}";
      return;
    }
    case ValueKind::kCallable:
      out += "<function " + v.asCallable().name + ">";
      return;
    case ValueKind::kObject: {
      out += "<" + v.asObject()->type_name + " {";
      bool first = true;
      for (const auto& [k, item] : v.asObject()->attrs.items) {
        if (!first) out += ", ";
        first = false;
        printInto(out, k, true, depth + 1, max_bytes);
        out += ": ";
        printInto(out, item, true, depth + 1, max_bytes);
      }
      out += "}>";
      return;
    }
  }
}

}  // namespace

std::string pyRepr(const Value& v, size_t max_bytes) {
  std::string out;
  printInto(out, v, true, 0, max_bytes);
  return out;
}

std::string pyStr(const Value& v, size_t max_bytes) {
  if (v.isString()) {
    reserveBytes(v.asString().size());
    chargeTextWork(v.asString().size());
    return v.asString();
  }
  std::string out;
  printInto(out, v, false, 0, max_bytes);
  return out;
}

std::string jsonDumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dumpValue(out, v, options, 0);
  return out;
}

}  // namespace tandem::jinja
