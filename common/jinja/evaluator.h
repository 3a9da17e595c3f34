// The Jinja evaluator: walks the syntax tree with Jinja's scoping rules
// (a `set` in a loop body or macro stays there; namespace objects carry
// values out), enforcing the render limits (work steps, time, cancellation
// and memory through its RenderBudget; loop iterations, call depth, output
// size). One Evaluator serves one render call, on one thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/ast.h"
#include "common/jinja/budget.h"
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

  // Keeps an attribute object made during this render alive until nothing
  // else holds it (or the render ends, when it is emptied first), so that
  // freeing one never frees a chain of others.
  void track(const std::shared_ptr<AttrObject>& obj);

  // Renders `body`; throws RenderFailure (caught by Template::render).
  std::string render(const Body& body);

  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value call(const Value& callee, const CallArgs& args);

  // Counts one loop iteration against Limits::max_loop_iterations.
  void countIteration();
  // Throws when a string of `size` bytes would exceed Limits::max_output_bytes.
  void checkSize(size_t size) const;
  // checkSize, and throws when `size` more bytes would exceed the memory budget.
  void checkNewString(size_t size);
  RenderBudget& budget() { return budget_; }
  const RenderOptions& options() const { return options_; }
  // What strftime_now formats: the fixed time or the clock, as broken-down time.
  std::tm now() const;
  int currentLine() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard;
  // Text being rendered, charged to the budget as it grows.
  class Output {
   public:
    explicit Output(RenderBudget& budget) : budget_(budget) {}
    ~Output() { budget_.release(charged_); }
    Output(const Output&) = delete;
    Output& operator=(const Output&) = delete;
    void append(const std::string& text);
    size_t size() const { return text_.size(); }
    // The text, no longer charged here.
    std::string take();

   private:
    RenderBudget& budget_;
    std::string text_;
    size_t charged_ = 0;
  };

  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope, Output& out);
  Flow execFor(const Stmt& s, const std::shared_ptr<Scope>& scope, Output& out);
  void execSet(const Stmt& s, const std::shared_ptr<Scope>& scope, Value value);
  Value makeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value callMacro(const Stmt& s, const std::shared_ptr<Scope>& defining, const CallArgs& args);
  CallArgs evalArgs(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value evalCall(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value applyFilterExpr(const Expr& filter, Value input, const std::shared_ptr<Scope>& scope);
  Value evalBinary(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value evalCompare(const Expr& e, const std::shared_ptr<Scope>& scope);
  void append(Output& out, const std::string& text) const;
  // Appends str(v).
  void print(Output& out, const Value& v) const;
  // Frees the tracked objects nothing else holds.
  void sweepObjects();

  // First: the values below release their bytes to it when freed.
  RenderBudget budget_;
  const RenderOptions& options_;
  std::shared_ptr<Scope> root_;
  std::vector<std::shared_ptr<AttrObject>> objects_;
  size_t sweep_at_ = 1024;
  // The loop object's attribute names and missing neighbours, made once.
  std::vector<Value> loop_keys_;
  Value no_previous_item_;
  Value no_next_item_;
  size_t iterations_ = 0;
  size_t depth_ = 0;
  int line_ = 0;
};

}  // namespace tandem::jinja
