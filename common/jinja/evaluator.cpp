// The Jinja evaluator (see evaluator.h).
#include "common/jinja/evaluator.h"

#include <algorithm>
#include <ctime>
#include <limits>

#include "common/jinja/access.h"
#include "common/jinja/filters.h"
#include "common/jinja/globals.h"
#include "common/jinja/operators.h"
#include "common/jinja/python_format.h"
#include "common/jinja/tests.h"
#include "common/jinja/unicode.h"

namespace tandem::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

struct Evaluator::DepthGuard {
  explicit DepthGuard(Evaluator& e) : ev(e) {
    if (++ev.depth_ > ev.options_.limits.max_call_depth) {
      --ev.depth_;
      failLimit("call depth exceeds " + std::to_string(ev.options_.limits.max_call_depth) +
                " (limit max_call_depth)");
    }
  }
  ~DepthGuard() { --ev.depth_; }
  Evaluator& ev;
};

namespace {

const char* const kLoopKeys[] = {"index0", "index", "revindex", "revindex0", "first",    "last",
                                 "length", "depth", "depth0",   "previtem",  "nextitem", "cycle"};
constexpr size_t kLoopAttrs = sizeof(kLoopKeys) / sizeof(kLoopKeys[0]);

}  // namespace

void Evaluator::Output::append(const std::string& text) {
  const size_t needed = text_.size() + text.size();
  if (needed > text_.capacity()) {
    // Charged before the string grows; it grows as std::string would.
    const size_t capacity = std::max(needed, 2 * text_.capacity());
    budget_.charge(capacity - charged_);
    charged_ = capacity;
    text_.reserve(capacity);
  }
  text_ += text;
  budget_.steps(text.size() / 64);
}

std::string Evaluator::Output::take() {
  budget_.release(charged_);
  charged_ = 0;
  return std::move(text_);
}

Evaluator::Evaluator(const RenderOptions& options, const nlohmann::ordered_json& variables)
    : budget_(options), options_(options) {
  // A render already cancelled does not start.
  budget_.checkCancelled();
  budget_.setReclaim([this] { sweepObjects(); });
  auto globals = std::make_shared<Scope>(nullptr);
  installGlobals(*globals);
  root_ = std::make_shared<Scope>(globals);
  for (const char* key : kLoopKeys) loop_keys_.emplace_back(key);
  no_previous_item_ = Value::undefined("there is no previous item");
  no_next_item_ = Value::undefined("there is no next item");
  if (variables.is_object()) {
    for (const auto& [k, v] : variables.items()) root_->set(k, Value::fromJson(v));
  }
}

Evaluator::~Evaluator() {
  // Namespaces can be made to hold themselves, and objects can hold chains
  // of other objects: emptying each while all are still held breaks cycles
  // and frees what they hold without recursing from one object to the next.
  for (const auto& obj : objects_) obj->attrs.items.clear();
  objects_.clear();
}

void Evaluator::track(const std::shared_ptr<AttrObject>& obj) {
  objects_.push_back(obj);
  if (objects_.size() >= sweep_at_) sweepObjects();
}

void Evaluator::sweepObjects() {
  budget_.steps(objects_.size());
  // Freeing an object only lowers the counts of the objects it holds (all
  // held here too), so no freeing recurses into another object. Newest
  // first: an object mostly holds older ones, which this pass then frees
  // as well.
  for (size_t i = objects_.size(); i-- > 0;) {
    if (objects_[i].use_count() == 1) objects_[i].reset();
  }
  std::erase_if(objects_, [](const std::shared_ptr<AttrObject>& obj) { return obj == nullptr; });
  sweep_at_ = std::max<size_t>(1024, 2 * objects_.size());
}

std::string Evaluator::render(const Body& body) {
  Output out(budget_);
  exec(body, root_, out);
  return out.take();
}

void Evaluator::countIteration() {
  budget_.step();
  if (++iterations_ > options_.limits.max_loop_iterations) {
    failLimit("loop iterations exceed " + std::to_string(options_.limits.max_loop_iterations) +
              " (limit max_loop_iterations)");
  }
}

void Evaluator::checkSize(size_t size) const {
  if (size > options_.limits.max_output_bytes) {
    failLimit("output exceeds " + std::to_string(options_.limits.max_output_bytes) +
              " bytes (limit max_output_bytes)");
  }
}

void Evaluator::checkNewString(size_t size) {
  checkSize(size);
  budget_.reserve(size);
}

void Evaluator::append(Output& out, const std::string& text) const {
  checkSize(saturatingAdd(out.size(), text.size()));
  out.append(text);
}

void Evaluator::print(Output& out, const Value& v) const {
  // A string is appended as it is, without a copy.
  if (v.isString()) {
    append(out, v.asString());
  } else {
    append(out, pyStr(v, options_.limits.max_output_bytes));
  }
}

std::tm Evaluator::now() const {
  // A naive time: broken down without a zone.
  const std::time_t t =
      std::chrono::system_clock::to_time_t(options_.now.value_or(localNaiveNow()));
  std::tm tm{};
  gmtime_r(&t, &tm);
  return tm;
}

Evaluator::Flow Evaluator::exec(const Body& body, const std::shared_ptr<Scope>& scope,
                                Output& out) {
  for (const auto& stmt : body) {
    const Stmt& s = *stmt;
    line_ = s.line;
    budget_.step();
    switch (s.kind) {
      case StmtKind::kText:
        append(out, s.text);
        break;
      case StmtKind::kPrint:
        print(out, eval(*s.expr, scope));
        break;
      case StmtKind::kIf: {
        bool done = false;
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i], scope).truthy()) {
            Flow f = exec(s.bodies[i], scope, out);
            if (f != Flow::kNormal) return f;
            done = true;
            break;
          }
        }
        if (!done) {
          Flow f = exec(s.else_body, scope, out);
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case StmtKind::kFor: {
        Flow f = execFor(s, scope, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kSet:
        execSet(s, scope, eval(*s.expr, scope));
        break;
      case StmtKind::kSetBlock: {
        Output text(budget_);
        exec(s.body, scope, text);
        Value v(text.take());
        for (const auto& f : s.filters) v = applyFilterExpr(*f, v, scope);
        execSet(s, scope, v);
        break;
      }
      case StmtKind::kMacro:
        scope->set(s.name, makeMacro(s, scope));
        break;
      case StmtKind::kCallBlock: {
        const Stmt* body_stmt = &s;
        std::weak_ptr<Scope> caller_scope = scope;
        Value caller = Value::callable(
            "caller", [this, body_stmt, caller_scope](Evaluator&, const CallArgs& args) {
              auto scope_ptr = caller_scope.lock();
              if (!scope_ptr) throw RenderFailure("caller() called out of scope");
              return callMacro(*body_stmt, scope_ptr, args);
            });
        const Expr& call_expr = *s.expr;
        Value callee = eval(*call_expr.object, scope);
        CallArgs args = evalArgs(call_expr, scope);
        args.keyword.emplace_back("caller", caller);
        print(out, call(callee, args));
        break;
      }
      case StmtKind::kFilterBlock: {
        Output text(budget_);
        exec(s.body, scope, text);
        Value v(text.take());
        for (const auto& f : s.filters) v = applyFilterExpr(*f, v, scope);
        print(out, v);
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kGeneration: {
        Flow f = exec(s.body, scope, out);
        if (f != Flow::kNormal) return f;
        break;
      }
    }
  }
  return Flow::kNormal;
}

namespace {

void bindTargets(Scope& scope, const std::vector<std::string>& targets, bool is_tuple,
                 const Value& value) {
  if (!is_tuple) {
    scope.set(targets[0], value);
    return;
  }
  ValueList items = iterableItems(value);
  if (items.size() != targets.size()) {
    throw RenderFailure(
        items.size() < targets.size()
            ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                  std::to_string(items.size()) + ")"
            : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
}

}  // namespace

Evaluator::Flow Evaluator::execFor(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                   Output& out) {
  // A list is iterated in place (values are immutable), not copied.
  Value sequence = iterableList(eval(*s.expr, scope));
  if (s.filter) {
    ValueList kept;
    for (const auto& item : sequence.asList()) {
      countIteration();
      auto filter_scope = std::make_shared<Scope>(scope);
      bindTargets(*filter_scope, s.targets, s.target_is_tuple, item);
      if (eval(*s.filter, filter_scope).truthy()) kept.push_back(item);
    }
    sequence = Value::list(std::move(kept));
  }
  const ValueList& items = sequence.asList();
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    countIteration();
    auto iter_scope = std::make_shared<Scope>(scope);
    bindTargets(*iter_scope, s.targets, s.target_is_tuple, items[static_cast<size_t>(i)]);
    auto loop = AttrObject::make("LoopContext", kLoopAttrs);
    auto& a = loop->attrs.items;
    a.reserve(kLoopAttrs);
    const Value* key = loop_keys_.data();
    a.emplace_back(*key++, Value(i));
    a.emplace_back(*key++, Value(i + 1));
    a.emplace_back(*key++, Value(length - i));
    a.emplace_back(*key++, Value(length - i - 1));
    a.emplace_back(*key++, Value(i == 0));
    a.emplace_back(*key++, Value(i == length - 1));
    a.emplace_back(*key++, Value(length));
    a.emplace_back(*key++, Value(int64_t{1}));
    a.emplace_back(*key++, Value(int64_t{0}));
    a.emplace_back(*key++, i > 0 ? items[static_cast<size_t>(i - 1)] : no_previous_item_);
    a.emplace_back(*key++, i + 1 < length ? items[static_cast<size_t>(i + 1)] : no_next_item_);
    int64_t index0 = i;
    a.emplace_back(*key++, Value::callable("cycle", [index0](Evaluator&, const CallArgs& args) {
      if (args.positional.empty()) throw RenderFailure("no items for cycling given");
      return args.positional[static_cast<size_t>(index0) % args.positional.size()];
    }));
    iter_scope->set("loop", Value::object(loop));
    Flow f = exec(s.body, iter_scope, out);
    // A loop object the body stored somewhere (a namespace) is kept like a
    // namespace; the others go now.
    iter_scope.reset();
    if (loop.use_count() > 1) track(loop);
    if (f == Flow::kBreak) break;
  }
  if (length == 0) exec(s.else_body, scope, out);
  return Flow::kNormal;
}

void Evaluator::execSet(const Stmt& s, const std::shared_ptr<Scope>& scope, Value value) {
  if (!s.attr.empty()) {
    const Value* ns = scope->find(s.name);
    if (ns == nullptr || !ns->isObject() || ns->asObject()->type_name != "Namespace") {
      throw RenderFailure("cannot assign attribute on non-namespace object");
    }
    ns->asObject()->attrs.set(Value(s.attr), std::move(value));
    return;
  }
  bindTargets(*scope, s.targets, s.target_is_tuple, value);
}

Value Evaluator::makeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  const Stmt* macro = &s;
  // The macro sees its defining scope by reference; holding it by weak
  // pointer keeps a macro stored in that same scope from forming a cycle.
  std::weak_ptr<Scope> defining = scope;
  return Value::callable(s.name, [this, macro, defining](Evaluator&, const CallArgs& args) {
    auto scope_ptr = defining.lock();
    if (!scope_ptr) throw RenderFailure("macro '" + macro->name + "' called out of scope");
    return callMacro(*macro, scope_ptr, args);
  });
}

Value Evaluator::callMacro(const Stmt& s, const std::shared_ptr<Scope>& defining,
                           const CallArgs& args) {
  DepthGuard guard(*this);
  budget_.step();
  int saved_line = line_;
  auto scope = std::make_shared<Scope>(defining);
  if (args.positional.size() > s.params.size()) {
    throw RenderFailure("macro '" + s.name + "' takes not more than " +
                        std::to_string(s.params.size()) + " argument(s)");
  }
  ValueList varargs;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Value* given = i < args.positional.size() ? &args.positional[i] : nullptr;
    if (given == nullptr) {
      for (const auto& [k, v] : args.keyword) {
        if (k == s.params[i]) given = &v;
      }
    }
    if (given != nullptr) {
      scope->set(s.params[i], *given);
    } else if (s.defaults[i]) {
      scope->set(s.params[i], eval(*s.defaults[i], scope));
    } else {
      scope->set(s.params[i], Value::undefined("'" + s.params[i] + "' is undefined"));
    }
  }
  // A macro's `caller` is its own: the call block that invoked it, or none.
  scope->set("caller", Value::undefined("No caller defined"));
  ValueDict extra;
  for (const auto& [k, v] : args.keyword) {
    if (k == "caller") {
      scope->set("caller", v);
      continue;
    }
    bool known = false;
    for (const auto& p : s.params) known = known || p == k;
    if (!known) extra.set(Value(k), v);
  }
  scope->set("kwargs", Value::dict(std::move(extra)));
  scope->set("varargs", Value::list({}, true));
  Output out(budget_);
  exec(s.body, scope, out);
  line_ = saved_line;
  return Value(out.take());
}

Value Evaluator::call(const Value& callee, const CallArgs& args) {
  budget_.step();
  if (callee.isUndefined()) failUndefined(callee);
  if (!callee.isCallable())
    throw RenderFailure("'" + callee.typeName() + "' object is not callable");
  return callee.asCallable().call(*this, args);
}

CallArgs Evaluator::evalArgs(const Expr& e, const std::shared_ptr<Scope>& scope) {
  CallArgs args;
  for (const auto& item : e.items) args.positional.push_back(eval(*item, scope));
  for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
  return args;
}

Value Evaluator::evalCall(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const Expr& callee = *e.object;
  if (callee.kind == ExprKind::kGetAttr) {
    Value obj = eval(*callee.object, scope);
    if (hasMethod(obj, callee.name)) {
      CallArgs args = evalArgs(e, scope);
      return callMethod(obj, callee.name, args);
    }
    Value fn = getAttr(obj, callee.name);
    CallArgs args = evalArgs(e, scope);
    return call(fn, args);
  }
  Value fn = eval(callee, scope);
  CallArgs args = evalArgs(e, scope);
  return call(fn, args);
}

Value Evaluator::applyFilterExpr(const Expr& filter, Value input,
                                 const std::shared_ptr<Scope>& scope) {
  CallArgs args = evalArgs(filter, scope);
  return applyFilter(*this, filter.name, input, args);
}

Value Evaluator::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  budget_.step();
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName: {
      const Value* v = scope->find(e.name);
      if (v == nullptr) return Value::undefined("'" + e.name + "' is undefined");
      return *v;
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      for (const auto& item : e.items) items.push_back(eval(*item, scope));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      ValueDict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = eval(*e.items[i], scope);
        d.set(key, eval(*e.items[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetAttr:
      return getAttr(eval(*e.object, scope), e.name);
    case ExprKind::kGetItem:
      return getItem(eval(*e.object, scope), eval(*e.second, scope));
    case ExprKind::kSlice: {
      Value obj = eval(*e.object, scope);
      Value start = e.second ? eval(*e.second, scope) : Value::none();
      Value stop = e.third ? eval(*e.third, scope) : Value::none();
      Value step = e.fourth ? eval(*e.fourth, scope) : Value::none();
      return sliceValue(obj, start, stop, step);
    }
    case ExprKind::kCall:
      return evalCall(e, scope);
    case ExprKind::kFilter:
      return applyFilterExpr(e, eval(*e.object, scope), scope);
    case ExprKind::kTest: {
      Value v = eval(*e.object, scope);
      CallArgs args = evalArgs(e, scope);
      bool result = applyTest(*this, e.name, v, args);
      return Value(e.negated ? !result : result);
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.object, scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.isUndefined()) failUndefined(v);
      if (!v.isNumber()) {
        throw RenderFailure("bad operand type for unary " + e.name + ": '" + v.typeName() + "'");
      }
      if (e.name == "+") return v.isBool() ? Value(v.asInt()) : v;
      if (v.isFloat()) return Value(-v.asDouble());
      if (v.asInt() == std::numeric_limits<int64_t>::min()) {
        throw RenderFailure("integer result out of range");
      }
      return Value(-v.asInt());
    }
    case ExprKind::kBinary:
      return evalBinary(e, scope);
    case ExprKind::kCompare:
      return evalCompare(e, scope);
    case ExprKind::kCondition:
      if (eval(*e.object, scope).truthy()) return eval(*e.second, scope);
      if (e.third) return eval(*e.third, scope);
      return Value::undefined(
          "the inline if-expression evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Evaluator::evalBinary(const Expr& e, const std::shared_ptr<Scope>& scope) {
  if (e.name == "and") {
    Value left = eval(*e.object, scope);
    return left.truthy() ? eval(*e.second, scope) : left;
  }
  if (e.name == "or") {
    Value left = eval(*e.object, scope);
    return left.truthy() ? left : eval(*e.second, scope);
  }
  Value left = eval(*e.object, scope);
  Value right = eval(*e.second, scope);
  if (e.name == "~") {
    const size_t max = options_.limits.max_output_bytes;
    // Strings are read in place; anything else is printed first.
    std::string left_text = left.isString() ? std::string() : pyStr(left, max);
    std::string right_text = right.isString() ? std::string() : pyStr(right, max);
    const std::string& a = left.isString() ? left.asString() : left_text;
    const std::string& b = right.isString() ? right.asString() : right_text;
    checkNewString(saturatingAdd(a.size(), b.size()));
    std::string joined;
    joined.reserve(a.size() + b.size());
    joined += a;
    joined += b;
    return Value(std::move(joined));
  }
  return binaryOp(e.name, left, right, options_.limits.max_output_bytes);
}

Value Evaluator::evalCompare(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Value left = eval(*e.object, scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], scope);
    if (!compareOp(e.ops[i], left, right)) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace tandem::jinja
