// Python-like values for the Jinja engine: None, bool, int, float, str, list
// (and tuple), dict with insertion order, Undefined, callables (globals,
// macros, bound methods) and attribute objects (namespace(), loop).
//
// Values are cheap to copy (32 bytes): containers are shared by pointer, as
// Python shares objects. Templates run in an immutable sandbox, so lists and
// dicts are never changed after they are built; only namespace objects
// change.
//
// During a render (budget.h) every string, list, dict, callable and object a
// value allocates is charged to the render's memory budget until freed, and
// lists, dicts and bound methods record their nesting depth, refused past
// Limits::max_value_depth: comparing, printing and freeing values recurse at
// most that deep. Attribute objects are where nesting can continue without a
// depth (a namespace can even hold itself): nothing recurses into them but
// printing, which bounds its own depth, and the evaluator keeps each one
// alive until it is unreachable or the render ends, so freeing never walks
// a chain of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/template.h"

namespace tandem::jinja {

class Value;
class Evaluator;
class RenderBudget;

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
  // Made during a render, it is charged to its budget for itself and room
  // for `attrs` attributes.
  static std::shared_ptr<AttrObject> make(std::string type_name, size_t attrs);
  AttrObject() = default;
  AttrObject(const AttrObject&) = delete;
  AttrObject& operator=(const AttrObject&) = delete;
  ~AttrObject();

  std::string type_name;  // "Namespace" or "LoopContext"
  ValueDict attrs;

 private:
  RenderBudget* budget_ = nullptr;
  size_t charged_ = 0;
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
  // `holds`: a value the function keeps (a bound method's object), whose
  // depth the callable's adds to.
  static Value callable(std::string name, std::function<Value(Evaluator&, const CallArgs&)> fn,
                        const Value* holds = nullptr);
  static Value object(std::shared_ptr<AttrObject> obj);
  // A string marked safe (jinja2's Markup, from the `safe` and `escape`
  // filters): `+` with a plain string HTML-escapes the plain one.
  static Value markup(std::string s);
  // Refuses (limit max_value_depth) JSON nested deeper than values may be,
  // without recursing further.
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
  const std::string& asString() const { return *static_cast<const std::string*>(ptr_.get()); }
  const ValueList& asList() const { return *static_cast<const ValueList*>(ptr_.get()); }
  const ValueDict& asDict() const { return *static_cast<const ValueDict*>(ptr_.get()); }
  const Callable& asCallable() const { return *static_cast<const Callable*>(ptr_.get()); }
  AttrObject* asObject() const {
    return const_cast<AttrObject*>(static_cast<const AttrObject*>(ptr_.get()));
  }
  // For Undefined: what was missing ("'x' is undefined").
  const std::string& undefinedHint() const { return asString(); }
  // Levels of lists, dicts and bound methods in this value (0 for others).
  uint32_t depth() const { return depth_; }
  // True when both share one string, list, dict, callable or object.
  bool sameObject(const Value& other) const {
    return ptr_ != nullptr && ptr_ == other.ptr_ && kind_ == other.kind_;
  }

  // Python truthiness.
  bool truthy() const;
  // Python's type name as jinja2 names it in messages ("NoneType", "str", ...).
  std::string typeName() const;

 private:
  ValueKind kind_ = ValueKind::kUndefined;
  bool is_tuple_ = false;
  bool is_markup_ = false;
  uint32_t depth_ = 0;
  union {
    bool b_;
    int64_t i_ = 0;
    double d_;
  };
  // The string (also Undefined's hint), ValueList, ValueDict, Callable or
  // AttrObject.
  std::shared_ptr<const void> ptr_;
};

// A failure while rendering; caught by Template::render and turned into a
// TemplateError. Never leaves the engine.
struct RenderFailure : std::runtime_error {
  RenderFailure(std::string message, bool raised = false)
      : std::runtime_error(std::move(message)), raised_by_template(raised) {}
  RenderFailure(std::string message, TemplateError::Kind error_kind)
      : std::runtime_error(std::move(message)), raised_by_template(false), kind(error_kind) {}
  bool raised_by_template;
  TemplateError::Kind kind = TemplateError::Kind::kEvaluation;
};

// Throws a RenderFailure of kind kLimit: `message` names the bound.
[[noreturn]] void failLimit(std::string message);

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
// The same as a list value: `v` itself when it is a list (nothing copied).
Value iterableList(const Value& v, const std::string& context = "");

}  // namespace tandem::jinja
