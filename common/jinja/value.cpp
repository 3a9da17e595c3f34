// Python-like values for the Jinja engine (see value.h).
#include "common/jinja/value.h"

#include <cmath>

#include "common/jinja/unicode.h"

namespace tandem::jinja {

const Value* ValueDict::find(const Value& key) const {
  if (key.isString()) return findString(key.asString());
  for (const auto& [k, v] : items) {
    if (valuesEqual(k, key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::findString(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k.isString() && k.asString() == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(const Value& key, const Value& value) {
  for (auto& [k, v] : items) {
    if (valuesEqual(k, key)) {
      v = value;
      return;
    }
  }
  items.emplace_back(key, value);
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.is_markup_ = true;
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = ValueKind::kNone;
  return v;
}

Value::Value(bool b) : kind_(ValueKind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(ValueKind::kInt), i_(i) {}
Value::Value(double d) : kind_(ValueKind::kFloat), d_(d) {}
Value::Value(std::string s)
    : kind_(ValueKind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::list(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = ValueKind::kList;
  v.is_tuple_ = is_tuple;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::dict(ValueDict dict) {
  Value v;
  v.kind_ = ValueKind::kDict;
  v.dict_ = std::make_shared<const ValueDict>(std::move(dict));
  return v;
}

Value Value::callable(std::string name, std::function<Value(Evaluator&, const CallArgs&)> fn) {
  Value v;
  v.kind_ = ValueKind::kCallable;
  v.callable_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::object(std::shared_ptr<AttrObject> obj) {
  Value v;
  v.kind_ = ValueKind::kObject;
  v.object_ = std::move(obj);
  return v;
}

Value Value::fromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(fromJson(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      d.items.reserve(json.size());
      for (const auto& [k, item] : json.items()) d.items.emplace_back(Value(k), fromJson(item));
      return dict(std::move(d));
    }
    default:
      return none();
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool:
      return b_;
    case ValueKind::kInt:
      return i_ != 0;
    case ValueKind::kFloat:
      return d_ != 0.0;
    case ValueKind::kString:
      return !s_->empty();
    case ValueKind::kList:
      return !list_->empty();
    case ValueKind::kDict:
      return !dict_->items.empty();
    default:
      return true;
  }
}

std::string Value::typeName() const {
  switch (kind_) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNone:
      return "NoneType";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "str";
    case ValueKind::kList:
      return is_tuple_ ? "tuple" : "list";
    case ValueKind::kDict:
      return "dict";
    case ValueKind::kCallable:
      return "function";
    case ValueKind::kObject:
      return object_->type_name;
  }
  return "object";
}

bool valuesEqual(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.isFloat() || b.isFloat()) return a.asDouble() == b.asDouble();
    return a.asInt() == b.asInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kString:
      return a.asString() == b.asString();
    case ValueKind::kList: {
      if (a.isTuple() != b.isTuple()) return false;
      const auto& x = a.asList();
      const auto& y = b.asList();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!valuesEqual(x[i], y[i])) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      const auto& x = a.asDict().items;
      const auto& y = b.asDict();
      if (x.size() != y.items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = y.find(k);
        if (other == nullptr || !valuesEqual(v, *other)) return false;
      }
      return true;
    }
    case ValueKind::kCallable:
      return &a.asCallable() == &b.asCallable();
    case ValueKind::kObject:
      return a.asObject() == b.asObject();
    default:
      return false;
  }
}

bool valueLess(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.isFloat() || b.isFloat()) return a.asDouble() < b.asDouble();
    return a.asInt() < b.asInt();
  }
  if (a.isString() && b.isString()) return a.asString() < b.asString();
  if (a.isList() && b.isList() && a.isTuple() == b.isTuple()) {
    const auto& x = a.asList();
    const auto& y = b.asList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!valuesEqual(x[i], y[i])) return valueLess(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.isUndefined()) failUndefined(a);
  if (b.isUndefined()) failUndefined(b);
  throw RenderFailure("'<' not supported between instances of '" + a.typeName() + "' and '" +
                      b.typeName() + "'");
}

void failUndefined(const Value& undefined) { throw RenderFailure(undefined.undefinedHint()); }

ValueList iterableItems(const Value& v, const std::string& context) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return {};
    case ValueKind::kList:
      return v.asList();
    case ValueKind::kDict: {
      ValueList keys;
      for (const auto& kv : v.asDict().items) keys.push_back(kv.first);
      return keys;
    }
    case ValueKind::kString: {
      ValueList chars;
      for (char32_t c : decodeUtf8(v.asString())) {
        std::string s;
        appendUtf8(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      throw RenderFailure("'" + v.typeName() + "' object is not iterable" +
                          (context.empty() ? std::string() : " (" + context + ")"));
  }
}

}  // namespace tandem::jinja
