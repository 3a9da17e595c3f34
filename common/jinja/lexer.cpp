// The Jinja lexer (see lexer.h).
#include "common/jinja/lexer.h"

#include <cstring>

#include "common/jinja/unicode.h"

namespace tandem::jinja {
namespace {

bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isNameChar(char c) { return isNameStart(c) || isDigit(c); }
bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string normalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int countLines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = findTagStart(pos_);
      std::string text = src_.substr(pos_, (tag == std::string::npos ? src_.size() : tag) - pos_);
      if (tag == std::string::npos) {
        emitText(text);
        pos_ = src_.size();
        break;
      }
      char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = pyStrip(text, nullptr, false, true);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting_) {
          bool all_space = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && isSpace(text[i]);
          if (all_space) text.resize(l_pos);
        }
      }
      int text_line = line_;
      line_ += countLines(src_.substr(pos_, tag - pos_));
      emitText(text, text_line);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        lexComment();
      } else if (kind == '%' && tryRaw()) {
        continue;
      } else {
        lexTag(kind == '{');
      }
    }
    tokens_.push_back(Token{TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t findTagStart(size_t from) const {
    while (true) {
      size_t p = src_.find('{', from);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char next = src_[p + 1];
      if (next == '{' || next == '%' || next == '#') return p;
      from = p + 1;
    }
  }

  void emitText(const std::string& text, int line = -1) {
    if (text.empty()) return;
    tokens_.push_back(Token{TokenType::kText, text, line < 0 ? line_ : line});
  }

  // After a tag's closing marker: `-` strips all following whitespace,
  // trim_blocks drops one newline after block and comment tags.
  void afterClose(char sign, bool is_block) {
    if (sign == '-') {
      size_t start = pos_;
      while (pos_ < src_.size() && isSpace(src_[pos_])) ++pos_;
      line_ += countLines(std::string_view(src_).substr(start, pos_ - start));
      line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
      return;
    }
    line_starting_ = false;
    if (sign != '+' && is_block && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      line_starting_ = true;
    }
  }

  void lexComment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw SyntaxFailure("missing end of comment tag", line_);
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    line_ += countLines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    afterClose(sign, true);
  }

  // `{% raw %}...{% endraw %}`: the body is text, tags inside are not parsed.
  bool tryRaw() {
    size_t p = pos_;
    while (p < src_.size() && isSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && isNameChar(src_[p])) return false;
    while (p < src_.size() && isSpace(src_[p])) ++p;
    bool strip_after = false;
    if (src_.compare(p, 3, "-%}") == 0) {
      strip_after = true;
      p += 3;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    if (strip_after) {
      while (p < src_.size() && isSpace(src_[p])) ++p;
    }
    int start_line = line_ + countLines(std::string_view(src_).substr(pos_, p - pos_));
    size_t search = p;
    while (true) {
      size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) throw SyntaxFailure("missing end of raw directive", line_);
      size_t q = tag + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && isSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && isSpace(src_[q])) ++q;
      char close_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) close_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) {
        search = tag + 2;
        continue;
      }
      std::string body = src_.substr(p, tag - p);
      if (sign == '-') body = pyStrip(body, nullptr, false, true);
      emitText(body, start_line);
      line_ += countLines(std::string_view(src_).substr(pos_, q + 2 - pos_));
      pos_ = q + 2;
      afterClose(close_sign, true);
      return true;
    }
  }

  void lexTag(bool is_var) {
    tokens_.push_back(Token{is_var ? TokenType::kVarBegin : TokenType::kBlockBegin, "", line_});
    int balance = 0;
    const char close = is_var ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && isSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        throw SyntaxFailure(is_var ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'",
                            line_);
      }
      char c = src_[pos_];
      if (balance == 0) {
        char sign = 0;
        size_t p = pos_;
        if ((c == '-' || c == '+') && p + 2 < src_.size() + 1) {
          sign = c;
          ++p;
        }
        if (src_.compare(p, 2, is_var ? "}}" : "%}") == 0 && (sign != '+' || !is_var)) {
          pos_ = p + 2;
          tokens_.push_back(Token{is_var ? TokenType::kVarEnd : TokenType::kBlockEnd, "", line_});
          afterClose(sign, !is_var);
          return;
        }
      }
      (void)close;
      if (isNameStart(c)) {
        size_t start = pos_;
        while (pos_ < src_.size() && isNameChar(src_[pos_])) ++pos_;
        tokens_.push_back(Token{TokenType::kName, src_.substr(start, pos_ - start), line_});
      } else if (isDigit(c)) {
        lexNumber();
      } else if (c == '\'' || c == '"') {
        lexString(c);
      } else {
        lexOperator(balance);
      }
    }
  }

  void lexNumber() {
    size_t start = pos_;
    while (pos_ < src_.size() && (isDigit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && isDigit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && (isDigit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && isDigit(src_[p])) {
        is_float = true;
        pos_ = p;
        while (pos_ < src_.size() && isDigit(src_[pos_])) ++pos_;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token token{is_float ? TokenType::kFloat : TokenType::kInt, text, line_};
    try {
      if (is_float) {
        token.float_value = std::stod(text);
      } else {
        token.int_value = std::stoll(text);
      }
    } catch (const std::exception&) {
      throw SyntaxFailure("number literal out of range: " + text, line_);
    }
    tokens_.push_back(token);
  }

  void lexString(char quote) {
    int start_line = line_;
    std::string out;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) throw SyntaxFailure("unterminated string literal", start_line);
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= src_.size()) throw SyntaxFailure("unterminated string literal", start_line);
      char e = src_[pos_++];
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case '\n':
          ++line_;
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          // Up to three octal digits, as Python reads them.
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
               ++k) {
            cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
          }
          appendUtf8(out, cp);
          break;
        }
        case 'x':
        case 'u':
        case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + len > src_.size())
            throw SyntaxFailure("truncated \\" + std::string(1, e) + " escape", line_);
          std::string hex = src_.substr(pos_, len);
          char32_t cp = 0;
          for (char h : hex) {
            int d = isDigit(h)               ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
            if (d < 0) throw SyntaxFailure("invalid \\" + std::string(1, e) + " escape", line_);
            cp = cp * 16 + static_cast<char32_t>(d);
          }
          pos_ += len;
          appendUtf8(out, cp);
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    tokens_.push_back(Token{TokenType::kString, out, start_line});
  }

  void lexOperator(int& balance) {
    static const char* kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back(Token{TokenType::kOperator, op, line_});
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) == nullptr) {
      throw SyntaxFailure(std::string("unexpected char '") + c + "'", line_);
    }
    if (c == '(' || c == '[' || c == '{') ++balance;
    if (c == ')' || c == ']' || c == '}') {
      if (balance == 0) throw SyntaxFailure(std::string("unexpected '") + c + "'", line_);
      --balance;
    }
    tokens_.push_back(Token{TokenType::kOperator, std::string(1, c), line_});
    ++pos_;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(normalizeNewlines(source)).run();
}

}  // namespace tandem::jinja
