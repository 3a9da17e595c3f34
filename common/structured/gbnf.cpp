#include "common/structured/gbnf.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/structured/return_if_error.h"
#include "common/structured/utf8.h"

namespace tandem::structured {
namespace {

using internal::appendUtf8;
using internal::decodeUtf8;
using internal::describeCodePoint;
using internal::hexValue;

constexpr size_t kNowhere = static_cast<size_t>(-1);

bool nameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

bool quantifierChar(char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  StatusOr<Grammar> compile(const GrammarLimits& limits) {
    if (static_cast<int64_t>(text_.size()) > kMaxGbnfBytes) {
      return invalidArgument("grammar: the text is " + std::to_string(text_.size()) +
                             " bytes; at most " + std::to_string(kMaxGbnfBytes) + " are accepted");
    }
    for (size_t pos = 0; pos < text_.size();) {
      uint32_t code_point = 0;
      const size_t length = decodeUtf8(text_, pos, code_point);
      if (length == 0) return errorAt(pos, "invalid UTF-8; the grammar must be UTF-8 text");
      pos += length;
    }
    TANDEM_RETURN_IF_ERROR(parseRules());

    const auto root = ids_.find("root");
    if (root == ids_.end() || rules_[static_cast<size_t>(root->second)].defined_at == kNowhere) {
      return invalidArgument("grammar: no rule named root; the start rule must be called root");
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].defined_at == kNowhere) {
        return invalidArgument("grammar: rule \"" + builder_.name(static_cast<int32_t>(r)) +
                               "\" is used but never defined (first used at " +
                               location(rules_[r].first_use) + ")");
      }
    }
    for (size_t r = 0; r < bodies_.size(); ++r) {
      builder_.define(static_cast<int32_t>(r), std::move(bodies_[r]));
    }
    StatusOr<Grammar> grammar = builder_.build(root->second, limits);
    if (grammar.isOk() || grammar.status().message().starts_with("grammar: ")) return grammar;
    return Status(grammar.status().code(), "grammar: " + grammar.status().message());
  }

 private:
  struct RuleInfo {
    size_t first_use = kNowhere;
    size_t defined_at = kNowhere;
  };

  bool atEnd() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }

  // "line 3, column 7" (both from 1; columns count characters).
  std::string location(size_t offset) const {
    size_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    size_t column = 1;
    for (size_t i = line_start; i < offset && i < text_.size(); ++i) {
      if ((static_cast<uint8_t>(text_[i]) & 0xC0) != 0x80) ++column;
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  Status errorAt(size_t offset, const std::string& what) const {
    return invalidArgument("grammar: " + location(offset) + ": " + what);
  }

  // What stands at `offset`, for messages.
  std::string found(size_t offset) const {
    if (offset >= text_.size()) return "the end of the text";
    uint32_t code_point = 0;
    decodeUtf8(text_, offset, code_point);
    return describeCodePoint(code_point);
  }

  // The escape that starts at `offset` (a backslash and one character).
  std::string escapeText(size_t offset) const {
    uint32_t code_point = 0;
    const size_t length = decodeUtf8(text_, offset + 1, code_point);
    return std::string(text_.substr(offset, 1 + length));
  }

  // Past spaces, line breaks and comments from `offset`.
  size_t spaceEnd(size_t offset) const {
    while (offset < text_.size()) {
      const char c = text_[offset];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++offset;
      } else if (c == '#') {
        while (offset < text_.size() && text_[offset] != '\n') ++offset;
      } else {
        break;
      }
    }
    return offset;
  }
  void skipSpace() { pos_ = spaceEnd(pos_); }

  // Only blanks stand before `offset` on its line.
  bool startsLine(size_t offset) const {
    while (offset > 0 && (text_[offset - 1] == ' ' || text_[offset - 1] == '\t')) --offset;
    return offset == 0 || text_[offset - 1] == '\n';
  }

  std::string_view nameAt(size_t offset) const {
    size_t end = offset;
    while (end < text_.size() && nameChar(text_[end])) ++end;
    return text_.substr(offset, end - offset);
  }

  // A rule definition (name ::=) starts at `offset`.
  bool ruleStartsAt(size_t offset) const {
    const std::string_view name = nameAt(offset);
    if (name.empty()) return false;
    return text_.substr(spaceEnd(offset + name.size())).starts_with("::=");
  }

  int32_t ruleId(std::string_view name) {
    const auto [it, inserted] = ids_.try_emplace(std::string(name), 0);
    if (inserted) {
      it->second = builder_.declare(std::string(name));
      rules_.emplace_back();
      bodies_.emplace_back();
    }
    return it->second;
  }

  Status parseRules() {
    skipSpace();
    while (!atEnd()) {
      const size_t name_start = pos_;
      const std::string_view name = nameAt(pos_);
      if (name.empty()) {
        return errorAt(pos_,
                       "expected a rule name (letters, digits, - and _) but found " + found(pos_));
      }
      pos_ += name.size();
      skipSpace();
      if (!text_.substr(pos_).starts_with("::=")) {
        return errorAt(pos_, "expected ::= after rule name \"" + std::string(name) +
                                 "\" but found " + found(pos_));
      }
      pos_ += 3;
      const int32_t id = ruleId(name);
      RuleInfo& info = rules_[static_cast<size_t>(id)];
      if (info.defined_at != kNowhere) {
        return errorAt(name_start, "rule \"" + std::string(name) +
                                       "\" is defined twice (first at " +
                                       location(info.defined_at) +
                                       "); each rule has one "
                                       "definition, with its alternatives separated by |");
      }
      info.defined_at = name_start;
      StatusOr<Expr> body = parseAlternatives(0);
      if (!body.isOk()) return body.status();
      if (!atEnd() && peek() == ')') {
        return errorAt(pos_, "unmatched ); expected | or the end of the rule");
      }
      bodies_[static_cast<size_t>(id)] = std::move(*body);
      skipSpace();
    }
    return Status::ok();
  }

  StatusOr<Expr> parseAlternatives(int depth) {
    return alternativesOf([&] { return parseSequence(depth); },
                          [&] {
                            if (atEnd() || peek() != '|') return false;
                            ++pos_;
                            return true;
                          });
  }

  // Stops before |, ), the end, or the name of the next rule's definition.
  StatusOr<Expr> parseSequence(int depth) {
    std::vector<Expr> parts;
    while (true) {
      skipSpace();
      if (atEnd() || peek() == '|' || peek() == ')' || ruleStartsAt(pos_)) break;
      if (quantifierChar(peek())) {
        return errorAt(pos_,
                       "quantifier " + std::string(1, peek()) + " has nothing before it to repeat");
      }
      StatusOr<Expr> item = parseItem(depth);
      if (!item.isOk()) return item;
      skipSpace();
      if (!atEnd() && quantifierChar(peek())) {
        const size_t quantifier = pos_;
        int64_t min = 0;
        int64_t max = Expr::kUnbounded;
        TANDEM_RETURN_IF_ERROR(parseQuantifier(min, max));
        *item = repeat(std::move(*item), min, max);
        skipSpace();
        if (!atEnd() && quantifierChar(peek())) {
          return errorAt(pos_, "quantifier " + std::string(1, peek()) +
                                   " follows another quantifier (at " + location(quantifier) +
                                   "); put the repeated part in ( ) to repeat it again");
        }
      }
      parts.push_back(std::move(*item));
    }
    return parts.size() == 1 ? std::move(parts[0]) : seq(std::move(parts));
  }

  StatusOr<Expr> parseItem(int depth) {
    const size_t start = pos_;
    const char c = peek();
    if (c == '"') {
      StatusOr<std::string> text = parseString();
      if (!text.isOk()) return text.status();
      return literal(*text);
    }
    if (c == '[') return parseClass();
    if (c == '.') {
      ++pos_;
      return codePoints(complementRanges({}));
    }
    if (c == '(') {
      if (depth + 1 > kMaxGroupDepth) {
        return errorAt(start,
                       "groups nested deeper than " + std::to_string(kMaxGroupDepth) + " levels");
      }
      ++pos_;
      StatusOr<Expr> inner = parseAlternatives(depth + 1);
      if (!inner.isOk()) return inner;
      if (atEnd() || peek() != ')') {
        return errorAt(pos_, "expected ) to close the group opened at " + location(start) +
                                 " but found " + found(pos_));
      }
      ++pos_;
      return inner;
    }
    const std::string_view name = nameAt(pos_);
    if (name.empty()) {
      return errorAt(start,
                     "expected a rule name, a string \"...\", a character class [...], "
                     ". or ( but found " +
                         found(start));
    }
    pos_ += name.size();
    // "name = ..." or "name := ..." at the start of a line is a definition
    // with a mistyped ::=, not a reference followed by a stray character.
    if (startsLine(start)) {
      size_t next = pos_;
      while (next < text_.size() && (text_[next] == ' ' || text_[next] == '\t')) ++next;
      if (next < text_.size() && (text_[next] == ':' || text_[next] == '=')) {
        return errorAt(next, "expected ::= after rule name \"" + std::string(name) +
                                 "\" but found " + found(next));
      }
    }
    const int32_t id = ruleId(name);
    RuleInfo& info = rules_[static_cast<size_t>(id)];
    if (info.first_use == kNowhere) info.first_use = start;
    return ref(id);
  }

  // At * + ? or {.
  Status parseQuantifier(int64_t& min, int64_t& max) {
    const size_t start = pos_;
    const char c = peek();
    ++pos_;
    if (c != '{') {
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : Expr::kUnbounded;
      return Status::ok();
    }
    auto skipBlanks = [&] {
      while (peek() == ' ' || peek() == '\t') ++pos_;
    };
    auto readNumber = [&](int64_t& value) { return readCount(text_, &pos_, &value); };
    auto malformed = [&] {
      return errorAt(start, "malformed repetition; the accepted forms are {m}, {m,} and {m,n}");
    };
    skipBlanks();
    if (!readNumber(min)) return malformed();
    skipBlanks();
    max = min;
    if (peek() == ',') {
      ++pos_;
      skipBlanks();
      if (!readNumber(max)) max = Expr::kUnbounded;
      skipBlanks();
    }
    if (atEnd() || peek() != '}') return malformed();
    ++pos_;
    if (max != Expr::kUnbounded && min > max) {
      return errorAt(start, "repetition " + std::string(text_.substr(start, pos_ - start)) +
                                " has its minimum above its maximum");
    }
    return Status::ok();
  }

  // At '"'; its characters as UTF-8.
  StatusOr<std::string> parseString() {
    const size_t open = pos_;
    ++pos_;
    std::string out;
    while (true) {
      if (atEnd() || peek() == '\n' || peek() == '\r') {
        return errorAt(open, "unterminated string: no closing \" before the end of the line");
      }
      if (peek() == '"') {
        ++pos_;
        return out;
      }
      StatusOr<uint32_t> code_point = parseChar();
      if (!code_point.isOk()) return code_point.status();
      appendUtf8(*code_point, out);
    }
  }

  // At '['.
  StatusOr<Expr> parseClass() {
    const size_t open = pos_;
    ++pos_;
    const bool negated = peek() == '^' && !atEnd();
    if (negated) ++pos_;
    CodePointRanges ranges;
    bool any_item = false;
    while (true) {
      if (atEnd() || peek() == '\n' || peek() == '\r') {
        return errorAt(open,
                       "unterminated character class: no closing ] before the end of the line");
      }
      if (peek() == ']') {
        ++pos_;
        break;
      }
      any_item = true;
      const size_t item_start = pos_;
      StatusOr<uint32_t> low = parseChar();
      if (!low.isOk()) return low.status();
      uint32_t high = *low;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        StatusOr<uint32_t> end = parseChar();
        if (!end.isOk()) return end.status();
        high = *end;
        if (*low > high) {
          return errorAt(item_start, "range " +
                                         std::string(text_.substr(item_start, pos_ - item_start)) +
                                         " has its start above its end");
        }
      }
      ranges.emplace_back(*low, high);
    }
    if (!any_item && !negated) {
      return errorAt(open, "empty character class [] matches nothing; write \\] for a literal ]");
    }
    ranges = negated ? complementRanges(ranges) : normalizeRanges(std::move(ranges));
    if (ranges.empty()) return errorAt(open, "the character class matches no character");
    return codePoints(ranges);
  }

  // One character of a string or class, escapes decoded (\xHH, \uHHHH and
  // \UHHHHHHHH name code points).
  StatusOr<uint32_t> parseChar() {
    if (peek() != '\\') {
      uint32_t code_point = 0;
      pos_ += decodeUtf8(text_, pos_, code_point);
      return code_point;
    }
    const size_t start = pos_;
    ++pos_;
    if (atEnd()) return errorAt(start, "the text ends inside an escape");
    const char c = peek();
    ++pos_;
    size_t digits = 0;
    switch (c) {
      case 'n':
        return uint32_t{'\n'};
      case 'r':
        return uint32_t{'\r'};
      case 't':
        return uint32_t{'\t'};
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<uint32_t>(c);
      case 'x':
        digits = 2;
        break;
      case 'u':
        digits = 4;
        break;
      case 'U':
        digits = 8;
        break;
      default:
        pos_ = start;
        return errorAt(start, "unknown escape " + escapeText(start) +
                                  "; the accepted escapes are \\n \\r \\t \\\\ \\\" \\[ \\] \\- "
                                  "\\^ \\xHH \\uHHHH and \\UHHHHHHHH");
    }
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (atEnd() || hexValue(peek()) < 0) {
        return errorAt(start, "\\" + std::string(1, c) + " must be followed by " +
                                  std::to_string(digits) + " hex digits");
      }
      value = value * 16 + static_cast<uint32_t>(hexValue(peek()));
      ++pos_;
    }
    if (value > kMaxCodePoint || (value >= 0xD800 && value <= 0xDFFF)) {
      return errorAt(start, std::string(text_.substr(start, pos_ - start)) +
                                " is not a Unicode character (a surrogate, or past U+10FFFF)");
    }
    return value;
  }

  std::string_view text_;
  size_t pos_ = 0;
  GrammarBuilder builder_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<RuleInfo> rules_;  // by rule id
  std::vector<Expr> bodies_;     // by rule id
};

}  // namespace

StatusOr<Grammar> compileGbnf(std::string_view text, const GrammarLimits& limits) {
  return GbnfParser(text).compile(limits);
}

}  // namespace tandem::structured
