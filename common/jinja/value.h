// Python-like values for the Jinja engine: None, bool, int, float, str, list
// (and tuple), dict with insertion order, Undefined, callables (globals,
// macros, bound methods) and attribute objects (namespace(), loop).
//
// Values are cheap to copy: containers are shared by pointer, as Python
// shares objects. Templates run in an immutable sandbox, so lists and dicts
// are never changed after they are built; only namespace objects change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::jinja {

class Value;
class Evaluator;

using ValueList = std::vector<Value>;

// An ordered dict (insertion order, as Python's).
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;

  const Value* find(const Value& key) const;
  const Value* findString(const std::string& key) const;
  void set(const Value& key, const Value& value);
};

// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Positional `index`, else keyword `name`, else nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

struct Callable {
  std::string name;
  std::function<Value(Evaluator&, const CallArgs&)> call;
};

// An object with attributes (namespace() results and loop objects).
struct AttrObject {
  std::string type_name;  // "Namespace" or "LoopContext"
  ValueDict attrs;
};

enum class ValueKind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kCallable,
  kObject
};

class Value {
 public:
  Value() = default;  // Undefined
  static Value undefined(std::string hint);
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(ValueList items, bool is_tuple = false);
  static Value dict(ValueDict dict);
  static Value callable(std::string name, std::function<Value(Evaluator&, const CallArgs&)> fn);
  static Value object(std::shared_ptr<AttrObject> obj);
  // A string marked safe (jinja2's Markup, from the `safe` and `escape`
  // filters): `+` with a plain string HTML-escapes the plain one.
  static Value markup(std::string s);
  static Value fromJson(const nlohmann::ordered_json& json);

  ValueKind kind() const { return kind_; }
  bool isUndefined() const { return kind_ == ValueKind::kUndefined; }
  bool isNone() const { return kind_ == ValueKind::kNone; }
  bool isBool() const { return kind_ == ValueKind::kBool; }
  bool isInt() const { return kind_ == ValueKind::kInt; }
  bool isFloat() const { return kind_ == ValueKind::kFloat; }
  bool isNumber() const { return isInt() || isFloat() || isBool(); }
  bool isString() const { return kind_ == ValueKind::kString; }
  bool isList() const { return kind_ == ValueKind::kList; }
  bool isTuple() const { return kind_ == ValueKind::kList && is_tuple_; }
  bool isDict() const { return kind_ == ValueKind::kDict; }
  bool isCallable() const { return kind_ == ValueKind::kCallable; }
  bool isObject() const { return kind_ == ValueKind::kObject; }
  bool isMarkup() const { return kind_ == ValueKind::kString && is_markup_; }

  bool asBool() const { return b_; }
  int64_t asInt() const { return isBool() ? (b_ ? 1 : 0) : i_; }
  double asDouble() const { return isFloat() ? d_ : static_cast<double>(asInt()); }
  const std::string& asString() const { return *s_; }
  const ValueList& asList() const { return *list_; }
  const ValueDict& asDict() const { return *dict_; }
  const Callable& asCallable() const { return *callable_; }
  const std::shared_ptr<AttrObject>& asObject() const { return object_; }
  // For Undefined: what was missing ("'x' is undefined").
  const std::string& undefinedHint() const { return *s_; }

  // Python truthiness.
  bool truthy() const;
  // Python's type name as jinja2 names it in messages ("NoneType", "str", ...).
  std::string typeName() const;

 private:
  ValueKind kind_ = ValueKind::kUndefined;
  bool b_ = false;
  bool is_tuple_ = false;
  bool is_markup_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const ValueDict> dict_;
  std::shared_ptr<const Callable> callable_;
  std::shared_ptr<AttrObject> object_;
};

// A failure while rendering; caught by Template::render and turned into a
// TemplateError. Never leaves the engine.
struct RenderFailure : std::runtime_error {
  RenderFailure(std::string message, bool raised = false)
      : std::runtime_error(std::move(message)), raised_by_template(raised) {}
  bool raised_by_template;
};

// Python equality (1 == 1.0 == True, lists and dicts by content).
bool valuesEqual(const Value& a, const Value& b);
// Python `<` for numbers, strings and lists; throws RenderFailure otherwise.
bool valueLess(const Value& a, const Value& b);
// Throws the error an Undefined carries when it is used.
[[noreturn]] void failUndefined(const Value& undefined);
// What iterating a value gives, as Python: a list's items, a dict's keys, a
// string's characters (code points), nothing for Undefined. Anything else
// throws RenderFailure "'<type>' object is not iterable", followed by
// " (<context>)" when a context (e.g. "filter sort") is given.
ValueList iterableItems(const Value& v, const std::string& context = "");

}  // namespace tandem::jinja
