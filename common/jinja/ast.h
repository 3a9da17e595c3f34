// The Jinja syntax tree: expressions and statements as the parser builds
// them and the evaluator walks them. Nodes are immutable once parsed.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/value.h"

namespace tandem::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,    // value
  kName,       // name
  kList,       // items
  kTuple,      // items
  kDict,       // items as key, value pairs
  kGetAttr,    // object, name
  kGetItem,    // object, index
  kSlice,      // object, start, stop, step (each may be null)
  kCall,       // callee, args, kwargs
  kFilter,     // object (null in filter blocks), name, args, kwargs
  kTest,       // object, name, args, negated
  kUnary,      // op ("-", "+", "not"), operand
  kBinary,     // op, left, right (arithmetic, "~", "and", "or")
  kCompare,    // left, ops, operands (chained)
  kCondition,  // test, then, otherwise (may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                 // kLiteral
  std::string name;            // kName, kGetAttr, kFilter, kTest, op for unary/binary
  ExprPtr object;              // kGetAttr, kGetItem, kSlice, kCall callee, kFilter, kTest,
                               // kUnary operand, kBinary left, kCompare left, kCondition test
  ExprPtr second;              // kGetItem index, kBinary right, kCondition then, kSlice start
  ExprPtr third;               // kCondition otherwise, kSlice stop
  ExprPtr fourth;              // kSlice step
  std::vector<ExprPtr> items;  // list/tuple/dict items (dict: key, value, key, value...),
                               // call/filter/test positional args, compare operands
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare operators
  bool negated = false;          // kTest
};

enum class StmtKind {
  kText,         // text
  kPrint,        // expr
  kIf,           // conditions[i] -> bodies[i]; else_body
  kFor,          // targets, expr (iterable), filter, body, else_body
  kSet,          // targets (or ns_name + attr), expr
  kSetBlock,     // targets[0], body, filters
  kMacro,        // name, params, defaults, body
  kCallBlock,    // expr (the call), params, defaults, body
  kFilterBlock,  // filters, body
  kBreak,
  kContinue,
  kGeneration,  // body
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // kText
  std::string name;  // kMacro name; kSet namespace attribute target "ns" with attr
  std::string attr;  // kSet: attribute of a namespace (`set ns.x = ...`)
  ExprPtr expr;
  ExprPtr filter;  // kFor: `if` condition
  std::vector<std::string> targets;
  bool target_is_tuple = false;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
  std::vector<ExprPtr> filters;   // kFilter exprs with null object, applied in order
};

}  // namespace tandem::jinja
