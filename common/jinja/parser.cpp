// The Jinja parser (see parser.h): recursive descent with Jinja's operator
// precedence.
#include "common/jinja/parser.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace tandem::jinja {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, size_t max_depth)
      : tokens_(tokens), max_depth_(max_depth), max_height_(max_depth * 4) {}

  Body parseAll() {
    std::string found;
    return parseBody({}, &found);
  }

 private:
  struct DepthGuard {
    DepthGuard(Parser& p, int line) : parser(p) {
      if (++parser.depth_ > parser.max_depth_) {
        throw SyntaxFailure("template nesting deeper than " + std::to_string(parser.max_depth_) +
                                " levels (limit max_call_depth)",
                            line, true);
      }
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool isOp(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kOperator && peek(ahead).text == op;
  }
  bool isName(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kName && peek(ahead).text == name;
  }
  bool skipOp(const char* op) {
    if (!isOp(op)) return false;
    next();
    return true;
  }
  bool skipName(const char* name) {
    if (!isName(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEnd:
        return "end of template";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kText:
        return "template text";
      case TokenType::kString:
        return "string";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const std::string& message) const {
    throw SyntaxFailure(message, peek().line);
  }
  void expectOp(const char* op) {
    if (!skipOp(op)) fail(std::string("expected '") + op + "', got " + describe(peek()));
  }
  std::string expectName() {
    if (peek().type != TokenType::kName) fail("expected a name, got " + describe(peek()));
    return next().text;
  }
  void expectBlockEnd() {
    if (peek().type != TokenType::kBlockEnd) {
      fail("expected end of statement block, got " + describe(peek()));
    }
    next();
  }

  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // Bounds the tree height so evaluation and destruction stay shallow.
  ExprPtr checkHeight(ExprPtr e) {
    size_t h = 0;
    for (const ExprPtr* child : {&e->object, &e->second, &e->third, &e->fourth}) {
      if (*child) h = std::max(h, heights_[child->get()]);
    }
    for (const auto& item : e->items) h = std::max(h, heights_[item.get()]);
    for (const auto& kw : e->kwargs) h = std::max(h, heights_[kw.second.get()]);
    if (h + 1 > max_height_) {
      throw SyntaxFailure("expression nested deeper than " + std::to_string(max_height_) +
                              " levels (limit max_call_depth)",
                          e->line, true);
    }
    heights_[e.get()] = h + 1;
    return e;
  }

  // ---- statements ----

  Body parseBody(const std::vector<std::string>& end_tags, std::string* found) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == TokenType::kEnd) {
        if (end_tags.empty()) return body;
        std::string names;
        for (const auto& tag : end_tags) names += (names.empty() ? "'" : " or '") + tag + "'";
        fail("unexpected end of template; looking for the tag " + names);
      }
      if (t.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (t.type == TokenType::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        s->expr = parseExpression();
        if (peek().type != TokenType::kVarEnd) {
          fail("expected end of print statement, got " + describe(peek()));
        }
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != TokenType::kBlockBegin) fail("unexpected " + describe(t));
      next();
      if (peek().type != TokenType::kName)
        fail("expected a statement name, got " + describe(peek()));
      const std::string& tag = peek().text;
      if (std::find(end_tags.begin(), end_tags.end(), tag) != end_tags.end()) {
        *found = tag;
        next();
        return body;
      }
      body.push_back(parseStatement());
    }
  }

  StmtPtr parseStatement() {
    const Token& t = next();
    DepthGuard guard(*this, t.line);
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    const std::string& tag = t.text;
    std::string found;
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      s->conditions.push_back(parseExpression());
      expectBlockEnd();
      while (true) {
        s->bodies.push_back(parseBody({"elif", "else", "endif"}, &found));
        if (found == "elif") {
          s->conditions.push_back(parseExpression());
          expectBlockEnd();
          continue;
        }
        if (found == "else") {
          expectBlockEnd();
          s->else_body = parseBody({"endif"}, &found);
        }
        expectBlockEnd();
        return s;
      }
    }
    if (tag == "for") {
      s->kind = StmtKind::kFor;
      parseTargets(*s);
      if (!skipName("in")) fail("expected 'in' in for loop, got " + describe(peek()));
      s->expr = parseOr();
      if (isOp(",")) {
        auto tuple = make(ExprKind::kTuple, s->line);
        tuple->items.push_back(std::move(s->expr));
        while (skipOp(",")) tuple->items.push_back(parseOr());
        s->expr = checkHeight(std::move(tuple));
      }
      if (skipName("if")) s->filter = parseExpression();
      if (isName("recursive")) fail("recursive for loops are not supported");
      expectBlockEnd();
      ++loop_depth_;
      s->body = parseBody({"else", "endfor"}, &found);
      --loop_depth_;
      if (found == "else") {
        expectBlockEnd();
        s->else_body = parseBody({"endfor"}, &found);
      }
      expectBlockEnd();
      return s;
    }
    if (tag == "set") {
      parseTargets(*s);
      if (s->targets.size() == 1 && !s->target_is_tuple && skipOp(".")) {
        s->name = s->targets[0];
        s->attr = expectName();
      }
      if (skipOp("=")) {
        s->kind = StmtKind::kSet;
        s->expr = parseTupleExpression();
        expectBlockEnd();
        return s;
      }
      if (s->target_is_tuple || !s->attr.empty()) fail("expected '=' in set statement");
      s->kind = StmtKind::kSetBlock;
      while (skipOp("|")) s->filters.push_back(parseFilterCall(nullptr));
      expectBlockEnd();
      s->body = parseBody({"endset"}, &found);
      expectBlockEnd();
      return s;
    }
    if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      s->name = expectName();
      parseParams(*s);
      expectBlockEnd();
      int saved_loops = loop_depth_;
      loop_depth_ = 0;
      s->body = parseBody({"endmacro"}, &found);
      loop_depth_ = saved_loops;
      if (peek().type == TokenType::kName) next();
      expectBlockEnd();
      return s;
    }
    if (tag == "call") {
      s->kind = StmtKind::kCallBlock;
      if (isOp("(")) parseParams(*s);
      s->expr = parseExpression();
      if (s->expr->kind != ExprKind::kCall) fail("expected a call in the call statement");
      expectBlockEnd();
      int saved_loops = loop_depth_;
      loop_depth_ = 0;
      s->body = parseBody({"endcall"}, &found);
      loop_depth_ = saved_loops;
      expectBlockEnd();
      return s;
    }
    if (tag == "filter") {
      s->kind = StmtKind::kFilterBlock;
      do {
        s->filters.push_back(parseFilterCall(nullptr));
      } while (skipOp("|"));
      expectBlockEnd();
      s->body = parseBody({"endfilter"}, &found);
      expectBlockEnd();
      return s;
    }
    if (tag == "generation") {
      s->kind = StmtKind::kGeneration;
      expectBlockEnd();
      s->body = parseBody({"endgeneration"}, &found);
      expectBlockEnd();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) throw SyntaxFailure("'" + tag + "' outside of a for loop", t.line);
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      expectBlockEnd();
      return s;
    }
    if (tag == "include" || tag == "import" || tag == "extends" || tag == "from" ||
        tag == "block") {
      throw SyntaxFailure("the '" + tag +
                              "' statement is not supported: chat templates cannot load or "
                              "define other templates",
                          t.line);
    }
    throw SyntaxFailure("unknown tag '" + tag + "'", t.line);
  }

  void parseTargets(Stmt& s) {
    bool parens = skipOp("(");
    s.targets.push_back(expectName());
    while (skipOp(",")) {
      s.target_is_tuple = true;
      if (peek().type != TokenType::kName) break;
      s.targets.push_back(expectName());
    }
    if (parens) {
      s.target_is_tuple = true;
      expectOp(")");
    }
  }

  void parseParams(Stmt& s) {
    expectOp("(");
    while (!isOp(")")) {
      if (!s.params.empty()) expectOp(",");
      if (isOp(")")) break;
      s.params.push_back(expectName());
      s.defaults.push_back(skipOp("=") ? parseExpression() : nullptr);
    }
    expectOp(")");
  }

  // ---- expressions ----

  ExprPtr parseTupleExpression() {
    int line = peek().line;
    ExprPtr first = parseExpression();
    if (!isOp(",")) return first;
    auto tuple = make(ExprKind::kTuple, line);
    tuple->items.push_back(std::move(first));
    while (skipOp(",")) {
      if (peek().type == TokenType::kBlockEnd) break;
      tuple->items.push_back(parseExpression());
    }
    return checkHeight(std::move(tuple));
  }

  ExprPtr parseExpression() {
    DepthGuard guard(*this, peek().line);
    int line = peek().line;
    ExprPtr value = parseOr();
    while (isName("if")) {
      next();
      auto cond = make(ExprKind::kCondition, line);
      cond->object = parseOr();
      cond->second = std::move(value);
      if (skipName("else")) cond->third = parseExpression();
      value = checkHeight(std::move(cond));
    }
    return value;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto e = make(ExprKind::kBinary, line);
    e->name = op;
    e->object = std::move(left);
    e->second = std::move(right);
    return checkHeight(std::move(e));
  }

  ExprPtr parseOr() {
    ExprPtr left = parseAnd();
    while (isName("or")) {
      int line = next().line;
      left = binary("or", std::move(left), parseAnd(), line);
    }
    return left;
  }

  ExprPtr parseAnd() {
    ExprPtr left = parseNot();
    while (isName("and")) {
      int line = next().line;
      left = binary("and", std::move(left), parseNot(), line);
    }
    return left;
  }

  ExprPtr parseNot() {
    if (isName("not")) {
      DepthGuard guard(*this, peek().line);
      int line = next().line;
      auto e = make(ExprKind::kUnary, line);
      e->name = "not";
      e->object = parseNot();
      return checkHeight(std::move(e));
    }
    return parseCompare();
  }

  ExprPtr parseCompare() {
    int line = peek().line;
    ExprPtr left = parseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().type == TokenType::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (isName("in")) {
        next();
        op = "in";
      } else if (isName("not") && isName("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, line);
        cmp->object = std::move(left);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parseMath1());
    }
    return cmp ? checkHeight(std::move(cmp)) : std::move(left);
  }

  ExprPtr parseMath1() {
    ExprPtr left = parseConcat();
    while (isOp("+") || isOp("-")) {
      const Token& t = next();
      std::string op = t.text;
      left = binary(op, std::move(left), parseConcat(), t.line);
    }
    return left;
  }

  ExprPtr parseConcat() {
    ExprPtr left = parseMath2();
    while (isOp("~")) {
      int line = next().line;
      left = binary("~", std::move(left), parseMath2(), line);
    }
    return left;
  }

  ExprPtr parseMath2() {
    ExprPtr left = parsePow();
    while (isOp("*") || isOp("/") || isOp("//") || isOp("%")) {
      const Token& t = next();
      std::string op = t.text;
      left = binary(op, std::move(left), parsePow(), t.line);
    }
    return left;
  }

  ExprPtr parsePow() {
    ExprPtr left = parseUnary(true);
    while (isOp("**")) {
      int line = next().line;
      left = binary("**", std::move(left), parseUnary(true), line);
    }
    return left;
  }

  ExprPtr parseUnary(bool with_filter) {
    ExprPtr node;
    if (isOp("-") || isOp("+")) {
      DepthGuard guard(*this, peek().line);
      const Token& t = next();
      auto e = make(ExprKind::kUnary, t.line);
      e->name = t.text;
      e->object = parseUnary(false);
      node = checkHeight(std::move(e));
    } else {
      node = parsePrimary();
    }
    node = parsePostfix(std::move(node));
    if (with_filter) node = parseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr parsePrimary() {
    const Token& t = peek();
    int line = t.line;
    if (t.type == TokenType::kName) {
      next();
      if (t.text == "true" || t.text == "True") return literal(Value(true), line);
      if (t.text == "false" || t.text == "False") return literal(Value(false), line);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), line);
      auto e = make(ExprKind::kName, line);
      e->name = t.text;
      return checkHeight(std::move(e));
    }
    if (t.type == TokenType::kString) {
      std::string s = next().text;
      while (peek().type == TokenType::kString) s += next().text;
      return literal(Value(std::move(s)), line);
    }
    if (t.type == TokenType::kInt) return literal(Value(next().int_value), line);
    if (t.type == TokenType::kFloat) return literal(Value(next().float_value), line);
    if (isOp("(")) {
      next();
      DepthGuard guard(*this, line);
      if (skipOp(")")) return checkHeight(make(ExprKind::kTuple, line));
      ExprPtr first = parseExpression();
      if (skipOp(")")) return first;
      auto tuple = make(ExprKind::kTuple, line);
      tuple->items.push_back(std::move(first));
      while (skipOp(",")) {
        if (isOp(")")) break;
        tuple->items.push_back(parseExpression());
      }
      expectOp(")");
      return checkHeight(std::move(tuple));
    }
    if (isOp("[")) {
      next();
      DepthGuard guard(*this, line);
      auto list = make(ExprKind::kList, line);
      while (!isOp("]")) {
        if (!list->items.empty()) expectOp(",");
        if (isOp("]")) break;
        list->items.push_back(parseExpression());
      }
      expectOp("]");
      return checkHeight(std::move(list));
    }
    if (isOp("{")) {
      next();
      DepthGuard guard(*this, line);
      auto dict = make(ExprKind::kDict, line);
      while (!isOp("}")) {
        if (!dict->items.empty()) expectOp(",");
        if (isOp("}")) break;
        dict->items.push_back(parseExpression());
        expectOp(":");
        dict->items.push_back(parseExpression());
      }
      expectOp("}");
      return checkHeight(std::move(dict));
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(ExprKind::kLiteral, line);
    e->value = std::move(v);
    return checkHeight(std::move(e));
  }

  ExprPtr parsePostfix(ExprPtr node) {
    while (true) {
      int line = peek().line;
      if (isOp(".")) {
        next();
        auto e = make(ExprKind::kGetAttr, line);
        if (peek().type == TokenType::kInt) {
          e->kind = ExprKind::kGetItem;
          e->second = literal(Value(next().int_value), line);
        } else {
          e->name = expectName();
        }
        e->object = std::move(node);
        node = checkHeight(std::move(e));
      } else if (isOp("[")) {
        next();
        DepthGuard guard(*this, line);
        node = parseSubscript(std::move(node), line);
      } else if (isOp("(")) {
        DepthGuard guard(*this, line);
        auto e = make(ExprKind::kCall, line);
        e->object = std::move(node);
        parseCallArgs(*e);
        node = checkHeight(std::move(e));
      } else {
        return node;
      }
    }
  }

  ExprPtr parseSubscript(ExprPtr node, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    int part = 0;
    while (!isOp("]")) {
      if (isOp(":")) {
        next();
        is_slice = true;
        if (++part > 2) fail("too many ':' in slice");
        continue;
      }
      if (parts[part]) fail("expected ':' or ']' in subscript, got " + describe(peek()));
      parts[part] = parseExpression();
    }
    expectOp("]");
    if (!is_slice) {
      if (!parts[0]) fail("empty subscript");
      auto e = make(ExprKind::kGetItem, line);
      e->object = std::move(node);
      e->second = std::move(parts[0]);
      return checkHeight(std::move(e));
    }
    auto e = make(ExprKind::kSlice, line);
    e->object = std::move(node);
    e->second = std::move(parts[0]);
    e->third = std::move(parts[1]);
    e->fourth = std::move(parts[2]);
    return checkHeight(std::move(e));
  }

  void parseCallArgs(Expr& e) {
    expectOp("(");
    bool first = true;
    while (!isOp(")")) {
      if (!first) expectOp(",");
      first = false;
      if (isOp(")")) break;
      if (peek().type == TokenType::kName && isOp("=", 1)) {
        std::string name = next().text;
        next();
        e.kwargs.emplace_back(name, parseExpression());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.items.push_back(parseExpression());
      }
    }
    expectOp(")");
  }

  // A filter name with optional arguments; `object` is the filtered value
  // (null in filter blocks and set blocks, where the body is the value).
  ExprPtr parseFilterCall(ExprPtr object) {
    int line = peek().line;
    auto e = make(ExprKind::kFilter, line);
    e->name = expectName();
    while (isOp(".") && peek(1).type == TokenType::kName) {
      next();
      e->name += "." + next().text;
    }
    if (isOp("(")) parseCallArgs(*e);
    e->object = std::move(object);
    return checkHeight(std::move(e));
  }

  ExprPtr parseFilterExpr(ExprPtr node) {
    while (true) {
      if (isOp("|")) {
        next();
        node = parseFilterCall(std::move(node));
      } else if (isName("is")) {
        int line = next().line;
        auto e = make(ExprKind::kTest, line);
        e->negated = skipName("not");
        e->name = expectName();
        while (isOp(".") && peek(1).type == TokenType::kName) {
          next();
          e->name += "." + next().text;
        }
        const Token& t = peek();
        if (isOp("(")) {
          parseCallArgs(*e);
        } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                    t.type == TokenType::kInt || t.type == TokenType::kFloat || isOp("[") ||
                    isOp("{") || isOp("-")) &&
                   !(t.type == TokenType::kName &&
                     (t.text == "else" || t.text == "or" || t.text == "and" || t.text == "if" ||
                      t.text == "in" || t.text == "not" || t.text == "is"))) {
          if (isOp("-")) {
            e->items.push_back(parseUnary(false));
          } else {
            e->items.push_back(parsePostfix(parsePrimary()));
          }
        }
        e->object = std::move(node);
        node = checkHeight(std::move(e));
      } else if (isOp("(") || isOp("[") || isOp(".")) {
        node = parsePostfix(std::move(node));
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  size_t max_depth_;
  size_t max_height_;
  int loop_depth_ = 0;
  std::unordered_map<const Expr*, size_t> heights_;
};

}  // namespace

Body parseTemplate(const std::vector<Token>& tokens, size_t max_depth) {
  return Parser(tokens, max_depth).parseAll();
}

}  // namespace tandem::jinja
