// Python-like values for the Jinja engine (see value.h).
#include "common/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "common/jinja/budget.h"
#include "common/jinja/unicode.h"

namespace tandem::jinja {
namespace {

// What make_shared adds to a payload: the control block (two counts and a
// vtable pointer).
constexpr size_t kControlBlockBytes = 24;

// A value's payload, charged to the budget that was current when it was
// made and released to it when freed.
template <typename T>
struct Counted {
  template <typename... Args>
  explicit Counted(Args&&... args) : value(std::forward<Args>(args)...) {}
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  ~Counted() {
    if (budget != nullptr) budget->release(charged);
  }
  T value;
  RenderBudget* budget = nullptr;
  size_t charged = 0;
};

// Shares `value` in a payload charged `heap_bytes` (what it owns beyond
// itself) plus its own size, with one step per 64 bytes.
template <typename T>
std::shared_ptr<const void> makeCounted(T&& value, size_t heap_bytes) {
  using Payload = Counted<std::decay_t<T>>;
  RenderBudget* budget = RenderBudget::current();
  const size_t bytes = saturatingAdd(sizeof(Payload) + kControlBlockBytes, heap_bytes);
  if (budget != nullptr) {
    budget->steps(1 + bytes / 64);
    budget->charge(bytes);
  }
  std::shared_ptr<Payload> payload;
  try {
    payload = std::make_shared<Payload>(std::forward<T>(value));
  } catch (...) {
    if (budget != nullptr) budget->release(bytes);
    throw;
  }
  payload->budget = budget;
  payload->charged = bytes;
  return std::shared_ptr<const void>(payload, &payload->value);
}

size_t stringHeapBytes(const std::string& s) {
  // Short strings live inside the std::string itself.
  return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

uint32_t childDepth(const Value& v) { return v.depth(); }

uint32_t checkedDepth(size_t depth) {
  checkValueDepth(depth);
  return static_cast<uint32_t>(depth);
}

}  // namespace

const Value* ValueDict::find(const Value& key) const {
  if (key.isString()) return findString(key.asString());
  chargeSteps(1 + items.size());
  for (const auto& [k, v] : items) {
    if (valuesEqual(k, key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::findString(const std::string& key) const {
  chargeSteps(1 + items.size());
  for (const auto& [k, v] : items) {
    if (k.isString() && k.asString() == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(const Value& key, const Value& value) {
  chargeSteps(1 + items.size());
  for (auto& [k, v] : items) {
    if (valuesEqual(k, key)) {
      v = value;
      return;
    }
  }
  items.emplace_back(key, value);
}

std::shared_ptr<AttrObject> AttrObject::make(std::string type_name, size_t attrs) {
  RenderBudget* budget = RenderBudget::current();
  const size_t bytes = saturatingAdd(sizeof(AttrObject) + kControlBlockBytes,
                                     saturatingMul(attrs, sizeof(std::pair<Value, Value>)));
  if (budget != nullptr) {
    budget->step();
    budget->charge(bytes);
  }
  std::shared_ptr<AttrObject> obj;
  try {
    obj = std::make_shared<AttrObject>();
  } catch (...) {
    if (budget != nullptr) budget->release(bytes);
    throw;
  }
  obj->budget_ = budget;
  obj->charged_ = bytes;
  obj->type_name = std::move(type_name);
  return obj;
}

AttrObject::~AttrObject() {
  if (budget_ != nullptr) budget_->release(charged_);
}

void failLimit(std::string message) {
  throw RenderFailure(std::move(message), TemplateError::Kind::kLimit);
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
  const size_t heap = stringHeapBytes(hint);
  v.ptr_ = makeCounted(std::move(hint), heap);
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

Value::Value(bool b) : kind_(ValueKind::kBool) { b_ = b; }
Value::Value(int64_t i) : kind_(ValueKind::kInt) { i_ = i; }
Value::Value(double d) : kind_(ValueKind::kFloat) { d_ = d; }
Value::Value(std::string s) : kind_(ValueKind::kString) {
  const size_t heap = stringHeapBytes(s);
  ptr_ = makeCounted(std::move(s), heap);
}

Value Value::list(ValueList items, bool is_tuple) {
  uint32_t below = 0;
  for (const auto& item : items) below = std::max(below, childDepth(item));
  Value v;
  v.kind_ = ValueKind::kList;
  v.is_tuple_ = is_tuple;
  v.depth_ = checkedDepth(size_t{below} + 1);
  const size_t heap = items.capacity() * sizeof(Value);
  v.ptr_ = makeCounted(std::move(items), heap);
  return v;
}

Value Value::dict(ValueDict dict) {
  uint32_t below = 0;
  for (const auto& [k, item] : dict.items) {
    below = std::max({below, childDepth(k), childDepth(item)});
  }
  Value v;
  v.kind_ = ValueKind::kDict;
  v.depth_ = checkedDepth(size_t{below} + 1);
  const size_t heap = dict.items.capacity() * sizeof(std::pair<Value, Value>);
  v.ptr_ = makeCounted(std::move(dict), heap);
  return v;
}

Value Value::callable(std::string name, std::function<Value(Evaluator&, const CallArgs&)> fn,
                      const Value* holds) {
  Value v;
  v.kind_ = ValueKind::kCallable;
  if (holds != nullptr) v.depth_ = checkedDepth(size_t{holds->depth()} + 1);
  // What the function keeps is charged where it was made; the closure itself
  // is small.
  const size_t heap = stringHeapBytes(name) + 64;
  v.ptr_ = makeCounted(Callable{std::move(name), std::move(fn)}, heap);
  return v;
}

Value Value::object(std::shared_ptr<AttrObject> obj) {
  Value v;
  v.kind_ = ValueKind::kObject;
  v.ptr_ = std::move(obj);
  return v;
}

namespace {

Value fromJsonAt(const nlohmann::ordered_json& json, size_t level, size_t max_level);

}  // namespace

Value Value::fromJson(const nlohmann::ordered_json& json) {
  return fromJsonAt(json, 1, maxValueDepth());
}

namespace {

Value fromJsonAt(const nlohmann::ordered_json& json, size_t level, size_t max_level) {
  if (json.is_structured() && level > max_level) checkValueDepth(level);
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
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
      reserveBytes(saturatingMul(json.size(), sizeof(Value)));
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(fromJsonAt(item, level + 1, max_level));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      reserveBytes(saturatingMul(json.size(), sizeof(std::pair<Value, Value>)));
      ValueDict d;
      d.items.reserve(json.size());
      for (const auto& [k, item] : json.items()) {
        d.items.emplace_back(Value(k), fromJsonAt(item, level + 1, max_level));
      }
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace

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
      return !asString().empty();
    case ValueKind::kList:
      return !asList().empty();
    case ValueKind::kDict:
      return !asDict().items.empty();
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
      return asObject()->type_name;
  }
  return "object";
}

bool valuesEqual(const Value& a, const Value& b) {
  chargeSteps(1);
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
      if (a.sameObject(b)) return true;
      if (a.asString().size() != b.asString().size()) return false;
      chargeTextWork(a.asString().size());
      return a.asString() == b.asString();
    case ValueKind::kList: {
      if (a.isTuple() != b.isTuple()) return false;
      // Python compares a list with itself item by item, but identical items
      // compare equal (even NaN), so the answer is the same.
      if (a.sameObject(b)) return true;
      const auto& x = a.asList();
      const auto& y = b.asList();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!valuesEqual(x[i], y[i])) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      if (a.sameObject(b)) return true;
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
  chargeSteps(1);
  if (a.isNumber() && b.isNumber()) {
    if (a.isFloat() || b.isFloat()) return a.asDouble() < b.asDouble();
    return a.asInt() < b.asInt();
  }
  if (a.isString() && b.isString()) {
    chargeTextWork(std::min(a.asString().size(), b.asString().size()));
    return a.asString() < b.asString();
  }
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

// What one character of a string costs as a list item: the Value and its
// string's payload.
constexpr size_t kCharItemBytes = sizeof(Value) + 96;

ValueList iterableItems(const Value& v, const std::string& context) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return {};
    case ValueKind::kList:
      reserveBytes(saturatingMul(v.asList().size(), sizeof(Value)));
      chargeSteps(1 + v.asList().size());
      return v.asList();
    case ValueKind::kDict: {
      reserveBytes(saturatingMul(v.asDict().items.size(), sizeof(Value)));
      chargeSteps(1 + v.asDict().items.size());
      ValueList keys;
      keys.reserve(v.asDict().items.size());
      for (const auto& kv : v.asDict().items) keys.push_back(kv.first);
      return keys;
    }
    case ValueKind::kString: {
      const std::string& text = v.asString();
      reserveBytes(saturatingMul(text.size(), kCharItemBytes));
      ValueList chars;
      chars.reserve(codePointCount(text));
      for (char32_t c : decodeUtf8(text)) {
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

namespace tandem::jinja {

Value iterableList(const Value& v, const std::string& context) {
  if (v.isList()) return v;
  return Value::list(iterableItems(v, context));
}

}  // namespace tandem::jinja
