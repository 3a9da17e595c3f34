#include "common/structured/regex_grammar.h"

#include <algorithm>
#include <string>
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

CodePointRanges digitRanges() { return {{'0', '9'}}; }
CodePointRanges wordRanges() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodePointRanges spaceRanges() { return {{'\t', '\r'}, {' ', ' '}}; }  // \t \n \v \f \r and space
// JavaScript's WhiteSpace and LineTerminator, what ECMAScript's \s matches.
CodePointRanges ecmascriptSpaceRanges() {
  return {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
CodePointRanges jsonUnsafeRanges() { return {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}}; }

bool jsonUnsafe(uint32_t code_point) {
  return code_point < 0x20 || code_point == '"' || code_point == '\\';
}

// `ranges` without `removed`.
CodePointRanges subtractRanges(const CodePointRanges& ranges, const CodePointRanges& removed) {
  CodePointRanges outside = complementRanges(ranges);
  outside.insert(outside.end(), removed.begin(), removed.end());
  return complementRanges(outside);
}

// One element of a character class: a class escape or one character.
struct ClassItem {
  bool is_set = false;
  CodePointRanges set;
  uint32_t code_point = 0;
};

// One piece of a sequence before its quantifier.
struct Atom {
  Expr expr;
  bool is_char = false;  // a single literal character, `code_point`
  uint32_t code_point = 0;
};

class RegexParser {
 public:
  RegexParser(std::string_view pattern, const RegexOptions& options)
      : pattern_(pattern), options_(options) {}

  StatusOr<Expr> parse() {
    if (static_cast<int64_t>(pattern_.size()) > options_.max_pattern_bytes) {
      return invalidArgument("regex: the pattern is " + std::to_string(pattern_.size()) +
                             " bytes; at most " + std::to_string(options_.max_pattern_bytes) +
                             " are accepted");
    }
    for (size_t pos = 0; pos < pattern_.size();) {
      uint32_t code_point = 0;
      const size_t length = decodeUtf8(pattern_, pos, code_point);
      if (length == 0) {
        return invalidArgument("regex: invalid UTF-8 at offset " + std::to_string(pos) +
                               "; the pattern must be UTF-8 text");
      }
      pos += length;
    }
    StatusOr<Expr> body = parseAlternation(0);
    if (!body.isOk()) return body;
    if (pos_ < pattern_.size()) {
      // parseAlternation stops only at the end or at a ')' it did not open.
      return error("unmatched ) at offset " + std::to_string(pos_) +
                   "; escape it as \\) for a literal )");
    }
    return body;
  }

 private:
  bool atEnd() const { return pos_ >= pattern_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < pattern_.size() ? pattern_[pos_ + ahead] : '\0';
  }

  static Status error(std::string what) { return invalidArgument("regex: " + std::move(what)); }
  static Status unsupported(std::string_view construct, size_t offset, std::string_view hint = {}) {
    std::string message = "regex: " + std::string(construct) + " at offset " +
                          std::to_string(offset) + " is not supported";
    if (!hint.empty()) message += "; " + std::string(hint);
    return invalidArgument(std::move(message));
  }

  StatusOr<Expr> parseAlternation(int depth) {
    return alternativesOf([&] { return parseSequence(depth); },
                          [&] {
                            if (atEnd() || peek() != '|') return false;
                            ++pos_;
                            return true;
                          });
  }

  StatusOr<Expr> parseSequence(int depth) {
    std::vector<Expr> parts;
    std::string pending;  // consecutive unquantified characters, as one literal
    auto flush = [&] {
      if (!pending.empty()) parts.push_back(literal(pending));
      pending.clear();
    };
    while (!atEnd() && peek() != '|' && peek() != ')') {
      const size_t start = pos_;
      const char c = peek();
      if (c == '^') {
        if (depth == 0 && parts.empty() && pending.empty()) {
          ++pos_;
          continue;
        }
        return unsupported("anchor ^", start,
                           "^ is only accepted at the start of the pattern, which always "
                           "matches the whole text; write \\^ for a literal ^");
      }
      if (c == '$') {
        if (depth == 0 && (start + 1 == pattern_.size() || pattern_[start + 1] == '|')) {
          ++pos_;
          continue;
        }
        return unsupported("anchor $", start,
                           "$ is only accepted at the end of the pattern, which always "
                           "matches the whole text; write \\$ for a literal $");
      }
      if (quantifierAt(start)) {
        return error("quantifier " + std::string(1, c) + " at offset " + std::to_string(start) +
                     " has nothing before it to repeat; write \\" + std::string(1, c) +
                     " for a literal " + std::string(1, c));
      }
      StatusOr<Atom> atom = parseAtom(depth);
      if (!atom.isOk()) return atom.status();
      int64_t min = 1;
      int64_t max = 1;
      bool quantified = false;
      TANDEM_RETURN_IF_ERROR(parseQuantifier(min, max, quantified));
      if (atom->is_char && !quantified) {
        appendUtf8(atom->code_point, pending);
        continue;
      }
      flush();
      parts.push_back(quantified ? repeat(std::move(atom->expr), min, max) : std::move(atom->expr));
    }
    flush();
    return parts.size() == 1 ? std::move(parts[0]) : seq(std::move(parts));
  }

  // A quantifier starts at `offset`: * + ? or a { that opens a count.
  bool quantifierAt(size_t offset) const {
    if (offset >= pattern_.size()) return false;
    const char c = pattern_[offset];
    if (c == '*' || c == '+' || c == '?') return true;
    if (c != '{' || offset + 1 >= pattern_.size()) return false;
    const char next = pattern_[offset + 1];
    return (next >= '0' && next <= '9') || next == ',';
  }

  Status parseQuantifier(int64_t& min, int64_t& max, bool& quantified) {
    quantified = quantifierAt(pos_);
    if (!quantified) return Status::ok();
    const size_t start = pos_;
    switch (peek()) {
      case '*':
        min = 0;
        max = Expr::kUnbounded;
        ++pos_;
        break;
      case '+':
        min = 1;
        max = Expr::kUnbounded;
        ++pos_;
        break;
      case '?':
        min = 0;
        max = 1;
        ++pos_;
        break;
      default:
        TANDEM_RETURN_IF_ERROR(parseCount(min, max));
        break;
    }
    // Lazy and possessive forms: the same text, matched as a whole.
    if (peek() == '?' || peek() == '+') ++pos_;
    if (quantifierAt(pos_)) {
      return error("quantifier " + std::string(1, peek()) + " at offset " + std::to_string(pos_) +
                   " follows another quantifier (at offset " + std::to_string(start) +
                   "); put the repeated part in a group (...) to repeat it again");
    }
    return Status::ok();
  }

  // {n} {n,} {n,m} {,m}, at the '{'.
  Status parseCount(int64_t& min, int64_t& max) {
    const size_t start = pos_;
    ++pos_;
    auto readNumber = [&](int64_t& value) { return readCount(pattern_, &pos_, &value); };
    int64_t low = 0;
    int64_t high = 0;
    const bool has_low = readNumber(low);
    bool has_comma = false;
    bool has_high = false;
    if (peek() == ',' && !atEnd()) {
      has_comma = true;
      ++pos_;
      has_high = readNumber(high);
    }
    if (peek() != '}' || atEnd() || (!has_low && !has_high)) {
      return error("malformed repeat count at offset " + std::to_string(start) +
                   "; the accepted forms are {n}, {n,}, {n,m} and {,m}");
    }
    ++pos_;
    const std::string text(pattern_.substr(start, pos_ - start));
    min = low;
    max = has_comma ? (has_high ? high : Expr::kUnbounded) : low;
    for (int64_t count : {min, max}) {
      if (count > options_.max_repeat) {
        return error("repeat count " +
                     (count >= kCountCeiling ? std::string("past ") + std::to_string(kCountCeiling)
                                             : std::to_string(count)) +
                     " in " + text + " at offset " + std::to_string(start) +
                     " is above the limit of " + std::to_string(options_.max_repeat));
      }
    }
    if (max != Expr::kUnbounded && min > max) {
      return error("repeat " + text + " at offset " + std::to_string(start) +
                   " has its minimum above its maximum");
    }
    return Status::ok();
  }

  StatusOr<Atom> parseAtom(int depth) {
    const size_t start = pos_;
    Atom atom;
    switch (peek()) {
      case '(': {
        StatusOr<Expr> group = parseGroup(depth);
        if (!group.isOk()) return group.status();
        atom.expr = std::move(*group);
        return atom;
      }
      case '[': {
        StatusOr<Expr> set = parseClass();
        if (!set.isOk()) return set.status();
        atom.expr = std::move(*set);
        return atom;
      }
      case '.':
        ++pos_;
        // ECMAScript's `.` also leaves out the other line terminators.
        atom.expr = classExpr(complementRanges(
            options_.ecmascript ? CodePointRanges{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}
                                : CodePointRanges{{'\n', '\n'}}));
        return atom;
      case ']':
        return error("unmatched ] at offset " + std::to_string(start) +
                     "; escape it as \\] for a literal ]");
      case '\\': {
        StatusOr<ClassItem> item = parseEscape(/*in_class=*/false);
        if (!item.isOk()) return item.status();
        if (item->is_set) {
          StatusOr<Expr> set = setExpr(normalizeRanges(std::move(item->set)), start);
          if (!set.isOk()) return set.status();
          atom.expr = std::move(*set);
          return atom;
        }
        TANDEM_RETURN_IF_ERROR(checkLiteral(item->code_point, start));
        atom.is_char = true;
        atom.code_point = item->code_point;
        atom.expr = charExpr(item->code_point);
        return atom;
      }
      default: {
        uint32_t code_point = 0;
        pos_ += decodeUtf8(pattern_, pos_, code_point);
        TANDEM_RETURN_IF_ERROR(checkLiteral(code_point, start));
        atom.is_char = true;
        atom.code_point = code_point;
        atom.expr = charExpr(code_point);
        return atom;
      }
    }
  }

  static Expr charExpr(uint32_t code_point) {
    std::string text;
    appendUtf8(code_point, text);
    return literal(text);
  }

  Status checkLiteral(uint32_t code_point, size_t offset) const {
    if (!options_.json_string_safe || !jsonUnsafe(code_point)) return Status::ok();
    return error("the character " + describeCodePoint(code_point) + " at offset " +
                 std::to_string(offset) +
                 " cannot stand unescaped in a JSON string; the pattern may not require '\"', "
                 "'\\' or control characters (U+0000-U+001F)");
  }

  // A class of characters (normalized), less what a JSON string cannot hold
  // when that is asked for. Offset: where the class starts, for messages.
  StatusOr<Expr> setExpr(CodePointRanges ranges, size_t offset) const {
    const bool removed = options_.json_string_safe;
    if (removed) ranges = subtractRanges(ranges, jsonUnsafeRanges());
    if (ranges.empty()) {
      return error("the character class at offset " + std::to_string(offset) +
                   " matches no character" +
                   (removed ? " that can stand unescaped in a JSON string" : ""));
    }
    return codePoints(ranges);
  }

  Expr classExpr(CodePointRanges ranges) const {
    if (options_.json_string_safe) ranges = subtractRanges(ranges, jsonUnsafeRanges());
    return codePoints(ranges);
  }

  // At '('.
  StatusOr<Expr> parseGroup(int depth) {
    const size_t open = pos_;
    if (depth + 1 > kMaxGroupDepth) {
      return error("groups nested deeper than " + std::to_string(kMaxGroupDepth) +
                   " levels at offset " + std::to_string(open));
    }
    ++pos_;
    if (peek() == '?' && !atEnd()) TANDEM_RETURN_IF_ERROR(parseGroupPrefix(open));
    StatusOr<Expr> inner = parseAlternation(depth + 1);
    if (!inner.isOk()) return inner;
    if (atEnd() || peek() != ')') {
      return error("the group opened at offset " + std::to_string(open) +
                   " is never closed; add a ) or write \\( for a literal (");
    }
    ++pos_;
    return inner;
  }

  // After "(", at '?': accepts (?: (?<name> (?P<name> and refuses the rest.
  Status parseGroupPrefix(size_t open) {
    const std::string_view rest = pattern_.substr(pos_);
    auto starts = [&](std::string_view prefix) { return rest.substr(0, prefix.size()) == prefix; };
    if (starts("?:")) {
      pos_ += 2;
      return Status::ok();
    }
    if (starts("?<=")) return unsupported("lookbehind (?<=", open);
    if (starts("?<!")) return unsupported("negative lookbehind (?<!", open);
    if (starts("?<")) return parseGroupName(open, 2);
    if (starts("?P<")) return parseGroupName(open, 3);
    if (starts("?P=")) return unsupported("named backreference (?P=", open);
    if (starts("?P>")) return unsupported("recursion (?P>", open);
    if (starts("?=")) return unsupported("lookahead (?=", open);
    if (starts("?!")) return unsupported("negative lookahead (?!", open);
    if (starts("?>")) return unsupported("atomic group (?>", open);
    if (starts("?#")) return unsupported("comment group (?#", open);
    if (starts("?|")) return unsupported("branch reset group (?|", open);
    const char after = rest.size() > 1 ? rest[1] : '\0';
    if (after == 'R' || after == '&' || after == '+' || (after >= '0' && after <= '9')) {
      return unsupported("recursion (?" + std::string(1, after), open);
    }
    if ((after >= 'a' && after <= 'z') || (after >= 'A' && after <= 'Z') || after == '-' ||
        after == '^') {
      size_t end = 1;
      while (end < rest.size() && rest[end] != ')' && rest[end] != ':' && end < 12) ++end;
      return unsupported("inline flags (" + std::string(rest.substr(0, end)), open,
                         "the pattern is always case-sensitive");
    }
    return unsupported("group syntax (?" + std::string(after == '\0' ? "" : std::string(1, after)),
                       open,
                       "the accepted groups are (...), (?:...), (?<name>...) and (?P<name>...)");
  }

  // Skips "?<name>" or "?P<name>" (`prefix` bytes before the name).
  Status parseGroupName(size_t open, size_t prefix) {
    size_t end = pos_ + prefix;
    auto nameChar = [&](size_t at, bool first) {
      if (at >= pattern_.size()) return false;
      const char c = pattern_[at];
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
             (!first && c >= '0' && c <= '9');
    };
    if (!nameChar(end, true)) {
      return error("malformed group name at offset " + std::to_string(open) +
                   "; a name is a letter or _ followed by letters, digits and _, then >");
    }
    while (nameChar(end, false)) ++end;
    if (end >= pattern_.size() || pattern_[end] != '>') {
      return error("malformed group name at offset " + std::to_string(open) +
                   "; a name is a letter or _ followed by letters, digits and _, then >");
    }
    pos_ = end + 1;
    return Status::ok();
  }

  // At '['.
  StatusOr<Expr> parseClass() {
    const size_t open = pos_;
    ++pos_;
    bool negated = false;
    if (peek() == '^' && !atEnd()) {
      negated = true;
      ++pos_;
    }
    if (peek() == ']' && !atEnd()) {
      if (!negated) {
        return error("empty character class [] at offset " + std::to_string(open) +
                     " matches nothing; write \\] for a literal ]");
      }
      ++pos_;  // [^]: any character
      return setExpr(complementRanges({}), open);
    }
    CodePointRanges ranges;
    while (true) {
      if (atEnd()) {
        return error("the character class opened at offset " + std::to_string(open) +
                     " is never closed; add a ] or write \\[ for a literal [");
      }
      if (peek() == ']') {
        ++pos_;
        break;
      }
      const size_t item_start = pos_;
      StatusOr<ClassItem> low = parseClassItem();
      if (!low.isOk()) return low.status();
      const bool range = peek() == '-' && pos_ + 1 < pattern_.size() && pattern_[pos_ + 1] != ']';
      if (range && low->is_set) {
        return error("a range at offset " + std::to_string(item_start) +
                     " starts with a class escape; write \\- for a literal -");
      }
      if (!range) {
        if (low->is_set) {
          ranges.insert(ranges.end(), low->set.begin(), low->set.end());
        } else {
          ranges.emplace_back(low->code_point, low->code_point);
        }
        continue;
      }
      ++pos_;  // '-'
      const size_t high_start = pos_;
      StatusOr<ClassItem> high = parseClassItem();
      if (!high.isOk()) return high.status();
      if (high->is_set) {
        return error("a range at offset " + std::to_string(item_start) +
                     " ends with a class escape (at offset " + std::to_string(high_start) +
                     "); write \\- for a literal -");
      }
      if (low->code_point > high->code_point) {
        return error("range " + std::string(pattern_.substr(item_start, pos_ - item_start)) +
                     " at offset " + std::to_string(item_start) + " has its start above its end");
      }
      ranges.emplace_back(low->code_point, high->code_point);
    }
    ranges = normalizeRanges(std::move(ranges));
    if (negated) ranges = complementRanges(ranges);
    return setExpr(std::move(ranges), open);
  }

  StatusOr<ClassItem> parseClassItem() {
    if (peek() == '\\') return parseEscape(/*in_class=*/true);
    const size_t start = pos_;
    if (peek() == '[' && (peek(1) == ':' || peek(1) == '=' || peek(1) == '.')) {
      const char kind = peek(1);
      size_t end = start + 2;
      while (end < pattern_.size() && pattern_[end] >= 'a' && pattern_[end] <= 'z') ++end;
      if (end + 1 < pattern_.size() && pattern_[end] == kind && pattern_[end + 1] == ']') {
        return unsupported("POSIX class " + std::string(pattern_.substr(start, end + 2 - start)),
                           start, "use a range such as [a-zA-Z] or an escape such as \\d");
      }
    }
    ClassItem item;
    pos_ += decodeUtf8(pattern_, pos_, item.code_point);
    return item;
  }

  // At '\\'.
  StatusOr<ClassItem> parseEscape(bool in_class) {
    const size_t start = pos_;
    ++pos_;
    if (atEnd()) return error("the pattern ends inside an escape (a lone \\ at its end)");
    ClassItem item;
    const char c = peek();
    if (static_cast<uint8_t>(c) >= 0x80) {
      pos_ += decodeUtf8(pattern_, pos_, item.code_point);
      return item;
    }
    ++pos_;
    auto set = [&](CodePointRanges ranges, bool negate) {
      item.is_set = true;
      item.set = negate ? complementRanges(ranges) : std::move(ranges);
      return item;
    };
    auto character = [&](uint32_t code_point) {
      item.code_point = code_point;
      return item;
    };
    switch (c) {
      case 'd':
        return set(digitRanges(), false);
      case 'D':
        return set(digitRanges(), true);
      case 'w':
        return set(wordRanges(), false);
      case 'W':
        return set(wordRanges(), true);
      case 's':
        return set(options_.ecmascript ? ecmascriptSpaceRanges() : spaceRanges(), false);
      case 'S':
        return set(options_.ecmascript ? ecmascriptSpaceRanges() : spaceRanges(), true);
      case 'n':
        return character('\n');
      case 'r':
        return character('\r');
      case 't':
        return character('\t');
      case 'f':
        return character('\f');
      case 'v':
        return character('\v');
      case '0':
        if (peek() >= '0' && peek() <= '9' && !atEnd()) {
          return unsupported("octal escape \\0" + std::string(1, peek()), start,
                             "write \\xHH instead");
        }
        return character(0);
      case 'x':
      case 'u':
        return parseHexEscape(c, start);
      case 'b':
        if (in_class) return character('\b');
        return unsupported("word boundary \\b", start);
      case 'B':
        return unsupported("word boundary \\B", start);
      case 'p':
      case 'P': {
        size_t end = pos_;
        if (peek() == '{') {
          while (end < pattern_.size() && pattern_[end] != '}' && end - pos_ < 40) ++end;
          if (end < pattern_.size() && pattern_[end] == '}') ++end;
        } else if (!atEnd()) {
          end = pos_ + 1;
        }
        return unsupported(
            "unicode property class " + std::string(pattern_.substr(start, end - start)), start,
            "use explicit ranges such as [\\u0400-\\u04FF]");
      }
      case 'k':
      case 'g':
        return unsupported("backreference \\" + std::string(1, c), start);
      case 'A':
      case 'z':
      case 'Z':
      case 'G':
        return unsupported("anchor \\" + std::string(1, c), start,
                           "the pattern always matches the whole text");
      case 'c':
        return unsupported("control escape \\c", start, "write \\xHH instead");
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      size_t end = pos_;
      while (end < pattern_.size() && pattern_[end] >= '0' && pattern_[end] <= '9') ++end;
      return unsupported("backreference " + std::string(pattern_.substr(start, end - start)),
                         start);
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return error("unknown escape \\" + std::string(1, c) + " at offset " + std::to_string(start) +
                   "; the accepted escapes are \\d \\D \\w \\W \\s \\S \\n \\r \\t \\f \\v \\0 "
                   "\\xHH \\x{H...} \\uHHHH \\u{H...} and \\ before punctuation");
    }
    return character(static_cast<uint8_t>(c));  // escaped punctuation stands for itself
  }

  // After \x or \u: HH (x), HHHH (u, a surrogate pair as two escapes) or {H...}.
  StatusOr<ClassItem> parseHexEscape(char kind, size_t start) {
    const std::string escape = std::string("\\") + kind;
    auto bad = [&] {
      return error(escape + " at offset " + std::to_string(start) + " must be followed by " +
                   (kind == 'x' ? "two" : "four") + " hex digits or {hex digits}");
    };
    uint32_t value = 0;
    if (peek() == '{' && !atEnd()) {
      size_t end = pos_ + 1;
      while (end < pattern_.size() && hexValue(pattern_[end]) >= 0 && end - pos_ <= 8) {
        value = value * 16 + static_cast<uint32_t>(hexValue(pattern_[end]));
        ++end;
      }
      if (end == pos_ + 1 || end >= pattern_.size() || pattern_[end] != '}') return bad();
      pos_ = end + 1;
    } else {
      const size_t digits = kind == 'x' ? 2 : 4;
      for (size_t i = 0; i < digits; ++i) {
        if (atEnd() || hexValue(peek()) < 0) return bad();
        value = value * 16 + static_cast<uint32_t>(hexValue(peek()));
        ++pos_;
      }
      // \uD83D\uDE00: one character written as its UTF-16 surrogate pair.
      if (kind == 'u' && value >= 0xD800 && value <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
        uint32_t low = 0;
        bool ok = pos_ + 6 <= pattern_.size();
        for (size_t i = 2; ok && i < 6; ++i) {
          const int digit = hexValue(pattern_[pos_ + i]);
          ok = digit >= 0;
          low = low * 16 + static_cast<uint32_t>(digit < 0 ? 0 : digit);
        }
        if (ok && low >= 0xDC00 && low <= 0xDFFF) {
          value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00);
          pos_ += 6;
        }
      }
    }
    const std::string text(pattern_.substr(start, pos_ - start));
    if (value > kMaxCodePoint) {
      return error(text + " at offset " + std::to_string(start) + " is past U+10FFFF");
    }
    if (value >= 0xD800 && value <= 0xDFFF) {
      return error(text + " at offset " + std::to_string(start) +
                   " is a lone UTF-16 surrogate, not a character");
    }
    ClassItem item;
    item.code_point = value;
    return item;
  }

  std::string_view pattern_;
  const RegexOptions& options_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<int32_t> addRegexRule(GrammarBuilder& builder, std::string_view pattern,
                               const std::string& name, const RegexOptions& options) {
  StatusOr<Expr> body = RegexParser(pattern, options).parse();
  if (!body.isOk()) return body.status();
  return builder.add(name, std::move(*body));
}

StatusOr<Grammar> compileRegex(std::string_view pattern, const RegexOptions& options,
                               const GrammarLimits& limits) {
  GrammarBuilder builder;
  StatusOr<int32_t> root = addRegexRule(builder, pattern, "root", options);
  if (!root.isOk()) return root.status();
  StatusOr<Grammar> grammar = builder.build(*root, limits);
  if (grammar.isOk()) return grammar;
  std::string message = grammar.status().message();
  constexpr std::string_view kBuilderPrefix = "grammar: ";
  if (message.starts_with(kBuilderPrefix)) message.erase(0, kBuilderPrefix.size());
  return Status(grammar.status().code(), "regex: " + message);
}

}  // namespace tandem::structured
