// The Jinja evaluator: walks the syntax tree with Jinja's scoping rules
// (a `set` in a loop body or macro stays there; namespace objects carry
// values out), enforcing the render limits (loop iterations, call depth,
// output size). One Evaluator serves one render call.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/ast.h"
#include "common/jinja/template.h"
#include "common/jinja/value.h"

namespace tandem::jinja {

struct Scope {
  explicit Scope(std::shared_ptr<Scope> parent_scope) : parent(std::move(parent_scope)) {}
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);

  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
};

class Evaluator {
 public:
  Evaluator(const RenderOptions& options, const nlohmann::ordered_json& variables);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Registers an attribute object made during this render (emptied at the end).
  void track(const std::shared_ptr<AttrObject>& obj);

  // Renders `body`; throws RenderFailure (caught by Template::render).
  std::string render(const Body& body);

  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value call(const Value& callee, const CallArgs& args);

  // Counts one loop iteration against Limits::max_loop_iterations.
  void countIteration();
  // Throws when a string of `size` bytes would exceed Limits::max_output_bytes.
  void checkSize(size_t size) const;
  const RenderOptions& options() const { return options_; }
  // What strftime_now formats: the fixed time or the clock, as broken-down time.
  std::tm now() const;
  int currentLine() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard;

  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow execFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void execSet(const Stmt& s, const std::shared_ptr<Scope>& scope, Value value);
  Value makeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value callMacro(const Stmt& s, const std::shared_ptr<Scope>& defining, const CallArgs& args);
  CallArgs evalArgs(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value evalCall(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value applyFilterExpr(const Expr& filter, Value input, const std::shared_ptr<Scope>& scope);
  Value evalBinary(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value evalCompare(const Expr& e, const std::shared_ptr<Scope>& scope);
  void append(std::string& out, const std::string& text) const;

  const RenderOptions& options_;
  std::shared_ptr<Scope> root_;
  std::vector<std::weak_ptr<AttrObject>> objects_;
  size_t iterations_ = 0;
  size_t depth_ = 0;
  int line_ = 0;
};

}  // namespace tandem::jinja
