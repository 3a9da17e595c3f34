// Attribute/item access and str/list/dict methods (see access.h).
#include "common/jinja/access.h"

#include <algorithm>
#include <optional>
#include <set>

#include "common/jinja/budget.h"
#include "common/jinja/python_format.h"
#include "common/jinja/unicode.h"

namespace tandem::jinja {
namespace {

const std::set<std::string> kStringMethods = {
    "strip",   "lstrip",  "rstrip",  "split",      "startswith", "endswith",
    "replace", "upper",   "lower",   "title",      "capitalize", "count",
    "find",    "rfind",   "join",    "splitlines", "isdigit",    "isalpha",
    "isspace", "isupper", "islower", "isalnum"};
const std::set<std::string> kListMethods = {"index", "count"};
const std::set<std::string> kListUnsafe = {"append", "pop",     "insert", "extend",
                                           "remove", "reverse", "sort",   "clear"};
const std::set<std::string> kDictMethods = {"items", "keys", "values", "get"};
const std::set<std::string> kDictUnsafe = {"update", "pop", "popitem", "setdefault", "clear"};

std::string typeRepr(const Value& obj) {
  if (obj.isNone()) return "None";
  return obj.typeName() + " object";
}

Value missingAttr(const Value& obj, const std::string& name) {
  return Value::undefined(pyRepr(Value(typeRepr(obj))) + " has no attribute " +
                          pyRepr(Value(name)));
}

Value missingItem(const Value& obj, const Value& key) {
  if (key.isString()) return missingAttr(obj, key.asString());
  return Value::undefined(typeRepr(obj) + " has no element " + pyRepr(key));
}

bool normalizeIndex(int64_t& index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  return index >= 0 && index < static_cast<int64_t>(size);
}

std::string argString(const CallArgs& args, size_t index, const std::string& name,
                      const std::string& method) {
  const Value* v = args.get(index, name);
  if (v == nullptr) throw RenderFailure(method + "() missing argument '" + name + "'");
  if (!v->isString()) {
    throw RenderFailure(method + "() argument must be str, not " + v->typeName());
  }
  return v->asString();
}

// Byte offset -> code point offset.
int64_t codePointIndex(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(codePointCount(std::string_view(s).substr(0, byte_offset)));
}

bool matchesAffix(const std::string& s, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& v) {
    if (!v.isString()) {
      throw RenderFailure(std::string(method) + " first arg must be str or a tuple of str, not " +
                          v.typeName());
    }
    const std::string& a = v.asString();
    if (a.size() > s.size()) return false;
    chargeTextWork(a.size());
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.isList()) {
    return std::any_of(affix.asList().begin(), affix.asList().end(), one);
  }
  return one(affix);
}

std::string pyTitle(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    bool upper = c >= 'A' && c <= 'Z';
    bool lower = c >= 'a' && c <= 'z';
    if (upper || lower) {
      if (!prev_cased && lower) c = static_cast<char>(c - 'a' + 'A');
      if (prev_cased && upper) c = static_cast<char>(c - 'A' + 'a');
      prev_cased = true;
    } else {
      prev_cased = (static_cast<unsigned char>(c) & 0x80) != 0 && prev_cased;
    }
  }
  return out;
}

Value stringMethod(const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.get(0, "chars");
    const std::string* set = nullptr;
    if (chars != nullptr && chars->isString()) set = &chars->asString();
    return Value(pyStrip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    const Value* sep = args.get(0, "sep");
    const Value* maxsplit = args.get(1, "maxsplit");
    const std::string* sep_str = nullptr;
    if (sep != nullptr && sep->isString()) {
      if (sep->asString().empty()) throw RenderFailure("empty separator");
      sep_str = &sep->asString();
    }
    long max =
        maxsplit != nullptr && maxsplit->isNumber() ? static_cast<long>(maxsplit->asInt()) : -1;
    ValueList out;
    for (auto& part : pySplit(s, sep_str, max)) out.emplace_back(std::move(part));
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    ValueList out;
    for (auto& part : pySplitLines(s)) out.emplace_back(std::move(part));
    return Value::list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* affix = args.get(0, "prefix");
    if (affix == nullptr) throw RenderFailure(name + "() takes at least 1 argument (0 given)");
    return Value(matchesAffix(s, *affix, name == "startswith", name.c_str()));
  }
  if (name == "replace") {
    reserveBytes(saturatingAdd(args.get(0, "old") != nullptr && args.get(0, "old")->isString()
                                   ? args.get(0, "old")->asString().size()
                                   : 0,
                               args.get(1, "new") != nullptr && args.get(1, "new")->isString()
                                   ? args.get(1, "new")->asString().size()
                                   : 0));
    std::string old_text = argString(args, 0, "old", name);
    std::string new_text = argString(args, 1, "new", name);
    const Value* count_arg = args.get(2, "count");
    int64_t count = count_arg != nullptr && count_arg->isNumber() ? count_arg->asInt() : -1;
    std::string out;
    if (old_text.empty()) {
      // Python inserts the replacement between every code point.
      std::u32string cps = decodeUtf8(s);
      const size_t inserts = count < 0
                                 ? cps.size() + 1
                                 : std::min<size_t>(cps.size() + 1, static_cast<uint64_t>(count));
      reserveString(saturatingAdd(s.size(), saturatingMul(inserts, new_text.size())));
      int64_t done = 0;
      for (char32_t c : cps) {
        if (count < 0 || done < count) {
          out += new_text;
          ++done;
        }
        appendUtf8(out, c);
      }
      if (count < 0 || done < count) out += new_text;
      return Value(std::move(out));
    }
    // Sized first: the matches are counted, then the result is checked.
    int64_t matches = 0;
    for (size_t at = findText(s, old_text);
         at != std::string::npos && (count < 0 || matches < count);
         at = findText(s, old_text, at + old_text.size())) {
      ++matches;
    }
    const auto replaced = static_cast<size_t>(matches);
    reserveString(saturatingAdd(s.size() - replaced * old_text.size(),
                                saturatingMul(replaced, new_text.size())));
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      size_t found = findText(s, old_text, pos);
      if (found == std::string::npos) break;
      out.append(s, pos, found - pos);
      out += new_text;
      pos = found + old_text.size();
      ++done;
    }
    out.append(s, pos, std::string::npos);
    return Value(std::move(out));
  }
  // The rest read `s` once; these four build a copy of it.
  chargeTextWork(s.size());
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    reserveBytes(s.size());
  }
  if (name == "upper") return Value(asciiUpper(s));
  if (name == "lower") return Value(asciiLower(s));
  if (name == "title") return Value(pyTitle(s));
  if (name == "capitalize") {
    std::string out = asciiLower(s);
    if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
    return Value(std::move(out));
  }
  if (name == "count" || name == "find" || name == "rfind") {
    std::string sub = argString(args, 0, "sub", name);
    // `sub` is copied: checked like any string built.
    reserveBytes(sub.size());
    if (name == "find") {
      size_t p = findText(s, sub);
      return Value(p == std::string::npos ? int64_t{-1} : codePointIndex(s, p));
    }
    if (name == "rfind") {
      size_t p = rfindText(s, sub);
      return Value(p == std::string::npos ? int64_t{-1} : codePointIndex(s, p));
    }
    if (sub.empty()) return Value(static_cast<int64_t>(codePointCount(s) + 1));
    int64_t n = 0;
    for (size_t p = findText(s, sub); p != std::string::npos;
         p = findText(s, sub, p + sub.size())) {
      ++n;
    }
    return Value(n);
  }
  if (name == "join") {
    const Value* items = args.get(0, "iterable");
    if (items == nullptr || !items->isList()) throw RenderFailure("join() argument must be a list");
    // Sized first, as Python's str.join does.
    size_t size = 0;
    for (const auto& item : items->asList()) {
      if (!item.isString()) {
        throw RenderFailure("sequence item: expected str instance, " + item.typeName() + " found");
      }
      size = saturatingAdd(size, saturatingAdd(item.asString().size(), s.size()));
    }
    reserveString(size);
    std::string out;
    out.reserve(size);
    bool first = true;
    for (const auto& item : items->asList()) {
      if (!first) out += s;
      first = false;
      out += item.asString();
    }
    return Value(std::move(out));
  }
  auto all = [&](auto pred) { return Value(!s.empty() && std::all_of(s.begin(), s.end(), pred)); };
  if (name == "isdigit") return all([](char c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") {
    return all([](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); });
  }
  if (name == "isalnum") {
    return all([](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    });
  }
  if (name == "isspace")
    return all([](char c) { return isPythonSpace(static_cast<unsigned char>(c)); });
  if (name == "isupper") return Value(asciiUpper(s) == s && asciiLower(s) != s);
  if (name == "islower") return Value(asciiLower(s) == s && asciiUpper(s) != s);
  throw RenderFailure("'str' object has no attribute '" + name + "'");
}

}  // namespace

bool hasMethod(const Value& obj, const std::string& name) {
  if (obj.isString()) return kStringMethods.count(name) > 0;
  if (obj.isList()) return kListMethods.count(name) > 0 || kListUnsafe.count(name) > 0;
  if (obj.isDict()) return kDictMethods.count(name) > 0 || kDictUnsafe.count(name) > 0;
  return false;
}

Value callMethod(const Value& obj, const std::string& name, const CallArgs& args) {
  if ((obj.isList() && kListUnsafe.count(name) > 0) ||
      (obj.isDict() && kDictUnsafe.count(name) > 0)) {
    throw RenderFailure("access to attribute '" + name + "' of '" + obj.typeName() +
                        "' object is unsafe.");
  }
  if (obj.isString()) return stringMethod(obj.asString(), name, args);
  if (obj.isList()) {
    const Value* x = args.get(0, "value");
    if (x == nullptr) throw RenderFailure(name + "() takes exactly one argument (0 given)");
    const auto& items = obj.asList();
    if (name == "count") {
      return Value(static_cast<int64_t>(std::count_if(
          items.begin(), items.end(), [&](const Value& v) { return valuesEqual(v, *x); })));
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (valuesEqual(items[i], *x)) return Value(static_cast<int64_t>(i));
    }
    throw RenderFailure(pyRepr(*x) + " is not in list");
  }
  if (obj.isDict()) {
    const auto& d = obj.asDict();
    if (name == "get") {
      const Value* key = args.get(0, "key");
      if (key == nullptr) throw RenderFailure("get expected at least 1 argument, got 0");
      const Value* found = d.find(*key);
      if (found != nullptr) return *found;
      const Value* fallback = args.get(1, "default");
      return fallback != nullptr ? *fallback : Value::none();
    }
    // items(): each tuple is a Value and a payload holding two.
    reserveBytes(
        saturatingMul(d.items.size(), name == "items" ? 3 * sizeof(Value) + 64 : sizeof(Value)));
    ValueList out;
    out.reserve(d.items.size());
    for (const auto& [k, v] : d.items) {
      if (name == "items") out.push_back(Value::list({k, v}, true));
      if (name == "keys") out.push_back(k);
      if (name == "values") out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  throw RenderFailure("'" + obj.typeName() + "' object has no attribute '" + name + "'");
}

Value getAttr(const Value& obj, const std::string& name) {
  if (obj.isUndefined()) failUndefined(obj);
  if (obj.isObject()) {
    const Value* v = obj.asObject()->attrs.findString(name);
    if (v != nullptr) return *v;
    return missingAttr(obj, name);
  }
  if (hasMethod(obj, name)) {
    Value bound = obj;
    return Value::callable(
        name,
        [bound, name](Evaluator&, const CallArgs& args) { return callMethod(bound, name, args); },
        &obj);
  }
  if (obj.isDict()) {
    const Value* v = obj.asDict().findString(name);
    if (v != nullptr) return *v;
  }
  return missingAttr(obj, name);
}

Value getItem(const Value& obj, const Value& key) {
  if (obj.isUndefined()) failUndefined(obj);
  if (obj.isDict()) {
    const Value* v = obj.asDict().find(key);
    if (v != nullptr) return *v;
  } else if ((obj.isList() || obj.isString()) && (key.isInt() || key.isBool())) {
    int64_t index = key.asInt();
    if (obj.isList()) {
      if (normalizeIndex(index, obj.asList().size()))
        return obj.asList()[static_cast<size_t>(index)];
    } else {
      std::u32string cps = decodeUtf8(obj.asString());
      if (normalizeIndex(index, cps.size())) {
        std::string out;
        appendUtf8(out, cps[static_cast<size_t>(index)]);
        return Value(std::move(out));
      }
    }
    return missingItem(obj, key);
  } else if (obj.isObject() && key.isString()) {
    return getAttr(obj, key.asString());
  }
  if (key.isString()) {
    if (hasMethod(obj, key.asString())) return getAttr(obj, key.asString());
  }
  return missingItem(obj, key);
}

Value sliceValue(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.isUndefined()) failUndefined(obj);
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.isNone()) return std::nullopt;
    if (v.isInt() || v.isBool()) return v.asInt();
    throw RenderFailure(std::string("slice ") + what + " indices must be integers or None, not " +
                        v.typeName());
  };
  std::optional<int64_t> start = as_index(start_v, "start");
  std::optional<int64_t> stop = as_index(stop_v, "stop");
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) throw RenderFailure("slice step cannot be zero");
  std::u32string cps;
  size_t size = 0;
  if (obj.isList()) {
    size = obj.asList().size();
  } else if (obj.isString()) {
    cps = decodeUtf8(obj.asString());
    size = cps.size();
  } else {
    throw RenderFailure("'" + obj.typeName() + "' object is not subscriptable");
  }
  const int64_t n = static_cast<int64_t>(size);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  int64_t e = clamp(stop, step > 0 ? n : -1);
  // 128-bit, as a step near 2^63 would overflow the index.
  const __int128 span = step > 0 ? static_cast<__int128>(e) - b : static_cast<__int128>(b) - e;
  const __int128 abs_step = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
  const size_t count = span <= 0 ? 0 : static_cast<size_t>((span + abs_step - 1) / abs_step);
  chargeSteps(count);
  if (obj.isList()) {
    reserveBytes(saturatingMul(count, sizeof(Value)));
    ValueList out;
    out.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      out.push_back(obj.asList()[static_cast<size_t>(b + static_cast<__int128>(k) * step)]);
    }
    return Value::list(std::move(out), obj.isTuple());
  }
  reserveBytes(saturatingMul(count, 4));
  std::string out;
  for (size_t k = 0; k < count; ++k) {
    appendUtf8(out, cps[static_cast<size_t>(b + static_cast<__int128>(k) * step)]);
  }
  return Value(std::move(out));
}

}  // namespace tandem::jinja
