#include "common/structured/grammar.h"

#include <algorithm>
#include <sstream>

#include "common/structured/return_if_error.h"
#include "common/structured/utf8.h"

namespace tandem::structured {

void ByteSet::add(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) words[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet set;
  set.add(lo, hi);
  return set;
}

void ByteSet::addAll(const ByteSet& other) {
  for (size_t i = 0; i < words.size(); ++i) words[i] |= other.words[i];
}

ByteSet ByteSet::complement() const {
  ByteSet out;
  for (size_t i = 0; i < words.size(); ++i) out.words[i] = ~words[i];
  return out;
}

Expr bytes(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = set;
  return e;
}

Expr literal(std::string_view text) {
  std::vector<Expr> parts;
  parts.reserve(text.size());
  for (char c : text) parts.push_back(bytes(ByteSet::of(static_cast<uint8_t>(c))));
  return seq(std::move(parts));
}

Expr ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::kRule;
  e.rule = rule;
  return e;
}

Expr seq(std::vector<Expr> parts) {
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.children = std::move(parts);
  return e;
}

Expr alt(std::vector<Expr> options) {
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.children = std::move(options);
  return e;
}

Expr repeat(Expr item, int64_t min, int64_t max) {
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.children.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

// ---- Code points -------------------------------------------------------------

CodePointRanges normalizeRanges(CodePointRanges ranges) {
  CodePointRanges split;
  for (auto [lo, hi] : ranges) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    // Surrogates are not scalar values.
    if (lo < 0xD800 && hi >= 0xD800) {
      split.emplace_back(lo, std::min<uint32_t>(hi, 0xD7FF));
      if (hi > 0xDFFF) split.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) split.emplace_back(0xE000, hi);
    } else {
      split.emplace_back(lo, hi);
    }
  }
  std::sort(split.begin(), split.end());
  CodePointRanges merged;
  for (const auto& range : split) {
    if (!merged.empty() && range.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

CodePointRanges complementRanges(const CodePointRanges& ranges) {
  CodePointRanges result;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalizeRanges(ranges)) {
    if (lo > next) result.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) result.emplace_back(next, kMaxCodePoint);
  return normalizeRanges(std::move(result));
}

namespace {

int utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Appends byte-set sequences for [lo, hi], all of UTF-8 length n, split
// until every byte position is an independent range (the continuation
// bytes of lo and hi are 0x80 and 0xBF wherever the lead bytes differ).
void encodeRange(uint32_t lo, uint32_t hi, int n, std::vector<Expr>& out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t low_bits = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~low_bits) != (hi & ~low_bits)) {
      if ((lo & low_bits) != 0) {
        encodeRange(lo, lo | low_bits, n, out);
        encodeRange((lo | low_bits) + 1, hi, n, out);
        return;
      }
      if ((hi & low_bits) != low_bits) {
        encodeRange(lo, (hi & ~low_bits) - 1, n, out);
        encodeRange(hi & ~low_bits, hi, n, out);
        return;
      }
    }
  }
  std::string a, b;  // both n bytes long
  internal::appendUtf8(lo, a);
  internal::appendUtf8(hi, b);
  std::vector<Expr> parts;
  for (size_t i = 0; i < a.size(); ++i) {
    parts.push_back(bytes(ByteSet::range(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]))));
  }
  out.push_back(n == 1 ? std::move(parts[0]) : seq(std::move(parts)));
}

}  // namespace

Expr codePoints(const CodePointRanges& ranges) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  std::vector<Expr> options;
  // Single bytes first, as one set.
  ByteSet ascii;
  for (auto [lo, hi] : normalizeRanges(ranges)) {
    while (lo <= hi) {
      const int n = utf8Length(lo);
      const uint32_t end = std::min(hi, kLengthEnds[n - 1]);
      if (n == 1) {
        ascii.add(static_cast<uint8_t>(lo), static_cast<uint8_t>(end));
      } else {
        encodeRange(lo, end, n, options);
      }
      if (end == kMaxCodePoint) break;
      lo = end + 1;
    }
  }
  if (!ascii.empty()) options.insert(options.begin(), bytes(ascii));
  return options.size() == 1 ? std::move(options[0]) : alt(std::move(options));
}

// ---- Lowering ----------------------------------------------------------------

int32_t GrammarBuilder::declare(std::string name) {
  names_.push_back(std::move(name));
  bodies_.emplace_back();
  defined_.push_back(false);
  return static_cast<int32_t>(names_.size() - 1);
}

void GrammarBuilder::define(int32_t rule, Expr body) {
  bodies_[static_cast<size_t>(rule)] = std::move(body);
  defined_[static_cast<size_t>(rule)] = true;
}

int32_t GrammarBuilder::add(std::string name, Expr body) {
  const int32_t rule = declare(std::move(name));
  define(rule, std::move(body));
  return rule;
}

namespace {

class Lowering {
 public:
  Lowering(const std::vector<std::string>& names, const GrammarLimits& limits) : limits_(limits) {
    grammar_.rule_names = names;
    grammar_.rule_alternatives.resize(names.size());
  }

  Status lowerRule(int32_t rule, const Expr& body) {
    if (body.kind == Expr::Kind::kAlt) {
      for (const Expr& option : body.children)
        TANDEM_RETURN_IF_ERROR(lowerAlternative(rule, option));
      return Status::ok();
    }
    return lowerAlternative(rule, body);
  }

  Grammar take() { return std::move(grammar_); }

 private:
  Status lowerAlternative(int32_t rule, const Expr& body) {
    std::vector<Element> elements;
    TANDEM_RETURN_IF_ERROR(lowerSequence(rule, body, elements));
    return appendAlternative(rule, std::move(elements));
  }

  Status lowerSequence(int32_t rule, const Expr& e, std::vector<Element>& out) {
    if (static_cast<int64_t>(out.size()) > limits_.max_elements) return tooLarge();
    switch (e.kind) {
      case Expr::Kind::kBytes:
        out.push_back(Element{Element::Kind::kBytes, byteSet(e.bytes)});
        return Status::ok();
      case Expr::Kind::kRule:
        out.push_back(Element{Element::Kind::kRule, e.rule});
        return Status::ok();
      case Expr::Kind::kSeq:
        for (const Expr& part : e.children) TANDEM_RETURN_IF_ERROR(lowerSequence(rule, part, out));
        return Status::ok();
      case Expr::Kind::kAlt: {
        if (e.children.size() == 1) return lowerSequence(rule, e.children[0], out);
        StatusOr<int32_t> helper = helperRule(rule, e);
        if (!helper.isOk()) return helper.status();
        out.push_back(Element{Element::Kind::kRule, *helper});
        return Status::ok();
      }
      case Expr::Kind::kRepeat:
        return lowerRepeat(rule, e, out);
    }
    return Status::ok();
  }

  // item{min,max}: min copies of one element (the item, or a rule holding
  // it), then a right-recursive loop or a chain of max - min optional ones.
  Status lowerRepeat(int32_t rule, const Expr& e, std::vector<Element>& out) {
    if (e.min < 0 || (e.max != Expr::kUnbounded && e.max < e.min)) {
      return invalidArgument("grammar: repetition {" + std::to_string(e.min) + "," +
                             std::to_string(e.max) + "} in rule \"" + name(rule) +
                             "\" is empty; the bounds must satisfy 0 <= min <= max");
    }
    const Expr& item = e.children.at(0);
    Element unit;
    if (item.kind == Expr::Kind::kBytes || item.kind == Expr::Kind::kRule) {
      std::vector<Element> one;
      TANDEM_RETURN_IF_ERROR(lowerSequence(rule, item, one));
      unit = one[0];
    } else {
      StatusOr<int32_t> helper = helperRule(rule, item);
      if (!helper.isOk()) return helper.status();
      unit = Element{Element::Kind::kRule, *helper};
    }
    if (e.min > limits_.max_elements - static_cast<int64_t>(out.size())) return tooLarge();
    out.insert(out.end(), static_cast<size_t>(e.min), unit);
    if (e.max == Expr::kUnbounded) {
      const int32_t loop = newRule(rule);
      if (loop < 0) return tooLarge();
      TANDEM_RETURN_IF_ERROR(appendAlternative(loop, {unit, Element{Element::Kind::kRule, loop}}));
      TANDEM_RETURN_IF_ERROR(appendAlternative(loop, {}));
      out.push_back(Element{Element::Kind::kRule, loop});
      return Status::ok();
    }
    const int64_t optional = e.max - e.min;
    if (optional > limits_.max_rules) return tooLarge();
    int32_t previous = -1;
    for (int64_t k = 0; k < optional; ++k) {
      const int32_t link = newRule(rule);
      if (link < 0) return tooLarge();
      std::vector<Element> body{unit};
      if (previous >= 0) body.push_back(Element{Element::Kind::kRule, previous});
      TANDEM_RETURN_IF_ERROR(appendAlternative(link, body));
      TANDEM_RETURN_IF_ERROR(appendAlternative(link, {}));
      previous = link;
    }
    if (previous >= 0) out.push_back(Element{Element::Kind::kRule, previous});
    return Status::ok();
  }

  StatusOr<int32_t> helperRule(int32_t parent, const Expr& body) {
    const int32_t helper = newRule(parent);
    if (helper < 0) return tooLarge();
    TANDEM_RETURN_IF_ERROR(lowerRule(helper, body));
    return helper;
  }

  Status appendAlternative(int32_t rule, std::vector<Element> elements) {
    elements.push_back(Element{Element::Kind::kEnd, 0});
    if (static_cast<int64_t>(grammar_.elements.size() + elements.size()) > limits_.max_elements) {
      return tooLarge();
    }
    grammar_.rule_alternatives[static_cast<size_t>(rule)].push_back(
        static_cast<int32_t>(grammar_.elements.size()));
    grammar_.elements.insert(grammar_.elements.end(), elements.begin(), elements.end());
    return Status::ok();
  }

  int32_t newRule(int32_t parent) {
    if (static_cast<int64_t>(grammar_.rule_names.size()) >= limits_.max_rules) return -1;
    grammar_.rule_names.push_back(name(parent) + "_" + std::to_string(grammar_.rule_names.size()));
    grammar_.rule_alternatives.emplace_back();
    return static_cast<int32_t>(grammar_.rule_names.size() - 1);
  }

  int32_t byteSet(const ByteSet& set) {
    auto& sets = grammar_.byte_sets;
    for (size_t i = sets.size(); i > 0 && i + 64 > sets.size(); --i) {
      if (sets[i - 1] == set) return static_cast<int32_t>(i - 1);
    }
    sets.push_back(set);
    return static_cast<int32_t>(sets.size() - 1);
  }

  const std::string& name(int32_t rule) const {
    return grammar_.rule_names[static_cast<size_t>(rule)];
  }

  Status tooLarge() const {
    return resourceExhausted("grammar: too large: at most " + std::to_string(limits_.max_elements) +
                             " elements and " + std::to_string(limits_.max_rules) + " rules");
  }

  const GrammarLimits& limits_;
  Grammar grammar_;
};

// The least fixpoint: a rule holds when one of its alternatives has only
// byte-set elements for which `bytes_hold` is true and rules that hold.
template <class BytesHold>
std::vector<bool> rulesWhere(const Grammar& g, BytesHold bytes_hold) {
  const size_t n = g.rule_alternatives.size();
  std::vector<bool> holds(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (holds[r]) continue;
      for (int32_t start : g.rule_alternatives[r]) {
        bool all = true;
        for (size_t p = static_cast<size_t>(start);
             all && g.elements[p].kind != Element::Kind::kEnd; ++p) {
          const Element& e = g.elements[p];
          all =
              e.kind == Element::Kind::kBytes ? bytes_hold(e) : holds[static_cast<size_t>(e.value)];
        }
        if (all) {
          holds[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return holds;
}

// A rule that can reach itself before consuming a byte, through a
// reference with something after it, would make the matcher push a new
// continuation forever (left recursion: expr ::= expr "+" term). A cycle
// of references in tail position is harmless: the matcher returns to the
// same parent and its dedup ends the expansion (the loop of a repeated
// item that can match "": ("a"?)*).
Status checkLeftRecursion(const Grammar& g) {
  const size_t n = g.rule_alternatives.size();
  // Rules that can match "": a byte never can.
  const std::vector<bool> nullable = rulesWhere(g, [](const Element&) { return false; });
  // Edges to the rules reachable before a byte; `pushes`: not in tail position.
  struct Edge {
    size_t to;
    bool pushes;
  };
  std::vector<std::vector<Edge>> edges(n);
  std::vector<std::vector<size_t>> reverse(n);
  for (size_t r = 0; r < n; ++r) {
    for (int32_t start : g.rule_alternatives[r]) {
      for (size_t p = static_cast<size_t>(start); g.elements[p].kind == Element::Kind::kRule; ++p) {
        const auto to = static_cast<size_t>(g.elements[p].value);
        edges[r].push_back(Edge{to, g.elements[p + 1].kind != Element::Kind::kEnd});
        reverse[to].push_back(r);
        if (!nullable[to]) break;
      }
    }
  }
  // Strongly connected components (Kosaraju, iteratively): a pushing edge
  // inside one is a harmful cycle.
  std::vector<size_t> order;
  std::vector<bool> seen(n, false);
  for (size_t root = 0; root < n; ++root) {
    if (seen[root]) continue;
    std::vector<std::pair<size_t, size_t>> stack{{root, 0}};
    seen[root] = true;
    while (!stack.empty()) {
      auto& [rule, next] = stack.back();
      if (next == edges[rule].size()) {
        order.push_back(rule);
        stack.pop_back();
        continue;
      }
      const size_t to = edges[rule][next++].to;
      if (!seen[to]) {
        seen[to] = true;
        stack.emplace_back(to, 0);
      }
    }
  }
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> component(n, kNone);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (component[*it] != kNone) continue;
    std::vector<size_t> stack{*it};
    component[*it] = *it;
    while (!stack.empty()) {
      const size_t rule = stack.back();
      stack.pop_back();
      for (size_t from : reverse[rule]) {
        if (component[from] == kNone) {
          component[from] = *it;
          stack.push_back(from);
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (e.pushes && component[e.to] == component[r]) {
        return invalidArgument("grammar: rule \"" + g.rule_names[e.to] +
                               "\" is left-recursive: it can reach itself before consuming any "
                               "input; rewrite it right-recursively (e.g. expr ::= term (\"+\" "
                               "term)*)");
      }
    }
  }
  return Status::ok();
}

// Every rule the root reaches must derive some finite text, or an output
// entering it could never end.
Status checkFinite(const Grammar& g) {
  const std::vector<bool> finishes = finishingRules(g);
  const std::vector<bool> reached = reachableRules(g);
  for (size_t r = 0; r < finishes.size(); ++r) {
    if (reached[r] && !finishes[r]) {
      return invalidArgument("grammar: rule \"" + g.rule_names[r] +
                             "\" matches no finite text, so an output could never end");
    }
  }
  return Status::ok();
}

}  // namespace

StatusOr<Grammar> GrammarBuilder::build(int32_t root, const GrammarLimits& limits) const {
  for (size_t r = 0; r < names_.size(); ++r) {
    if (!defined_[r]) {
      return invalidArgument("grammar: rule \"" + names_[r] + "\" is used but never defined");
    }
  }
  if (root < 0 || static_cast<size_t>(root) >= names_.size()) {
    return invalidArgument("grammar: no root rule");
  }
  if (static_cast<int64_t>(names_.size()) > limits.max_rules) {
    return resourceExhausted("grammar: too large: at most " + std::to_string(limits.max_rules) +
                             " rules");
  }
  Lowering lowering(names_, limits);
  for (size_t r = 0; r < names_.size(); ++r) {
    TANDEM_RETURN_IF_ERROR(lowering.lowerRule(static_cast<int32_t>(r), bodies_[r]));
  }
  Grammar grammar = lowering.take();
  grammar.root = root;
  TANDEM_RETURN_IF_ERROR(checkLeftRecursion(grammar));
  if (limits.require_finite) TANDEM_RETURN_IF_ERROR(checkFinite(grammar));
  return grammar;
}

std::vector<bool> finishingRules(const Grammar& g) {
  return rulesWhere(g, [&g](const Element& bytes) {
    return !g.byte_sets[static_cast<size_t>(bytes.value)].empty();
  });
}

std::vector<bool> reachableRules(const Grammar& g) {
  std::vector<bool> reached(g.rule_alternatives.size(), false);
  std::vector<size_t> stack{static_cast<size_t>(g.root)};
  reached[stack.back()] = true;
  while (!stack.empty()) {
    const size_t r = stack.back();
    stack.pop_back();
    for (int32_t start : g.rule_alternatives[r]) {
      for (size_t p = static_cast<size_t>(start); g.elements[p].kind != Element::Kind::kEnd; ++p) {
        const Element& e = g.elements[p];
        if (e.kind == Element::Kind::kRule && !reached[static_cast<size_t>(e.value)]) {
          reached[static_cast<size_t>(e.value)] = true;
          stack.push_back(static_cast<size_t>(e.value));
        }
      }
    }
  }
  return reached;
}

// ---- Listing -------------------------------------------------------------------

namespace {

std::string describeByteSet(const ByteSet& set) {
  auto show = [](int b) {
    if (b >= 0x21 && b < 0x7F && b != ']' && b != '\\' && b != '-' && b != '^') {
      return std::string(1, static_cast<char>(b));
    }
    static const char* kHex = "0123456789ABCDEF";
    std::string escaped = "\\x";
    escaped.push_back(kHex[b >> 4]);
    escaped.push_back(kHex[b & 15]);
    return escaped;
  };
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!set.contains(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int end = b;
    while (end + 1 < 256 && set.contains(static_cast<uint8_t>(end + 1))) ++end;
    out += show(b);
    if (end > b) {
      out.push_back('-');
      out += show(end);
    }
    b = end + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::describe() const {
  std::ostringstream out;
  for (size_t r = 0; r < rule_alternatives.size(); ++r) {
    out << rule_names[r] << " ::=";
    const auto& alternatives = rule_alternatives[r];
    for (size_t a = 0; a < alternatives.size(); ++a) {
      if (a > 0) out << " |";
      size_t p = static_cast<size_t>(alternatives[a]);
      if (elements[p].kind == Element::Kind::kEnd) out << " \"\"";
      for (; elements[p].kind != Element::Kind::kEnd; ++p) {
        const Element& e = elements[p];
        out << ' '
            << (e.kind == Element::Kind::kRule
                    ? rule_names[static_cast<size_t>(e.value)]
                    : describeByteSet(byte_sets[static_cast<size_t>(e.value)]));
      }
    }
    out << '\n';
  }
  return out.str();
}

// A matcher over the trigger's prefixes, as Knuth-Morris-Pratt's: rule j
// has read j of its bytes.
Expr textUntil(GrammarBuilder& builder, const std::string& name, const std::string& trigger,
               Expr then) {
  const size_t k = trigger.size();
  // The longest prefix of the trigger that is a suffix of trigger[0, j) + b.
  auto next = [&](size_t j, uint8_t b) {
    std::string read = trigger.substr(0, j);
    read.push_back(static_cast<char>(b));
    for (size_t length = std::min(read.size(), k); length > 0; --length) {
      if (read.compare(read.size() - length, length, trigger, 0, length) == 0) return length;
    }
    return size_t{0};
  };
  std::vector<int32_t> rules;
  for (size_t j = 0; j < k; ++j) rules.push_back(builder.declare(name + "_" + std::to_string(j)));
  for (size_t j = 0; j < k; ++j) {
    std::vector<ByteSet> to(k);
    std::vector<Expr> options = {literal("")};
    for (int b = 0; b < 256; ++b) {
      const size_t target = next(j, static_cast<uint8_t>(b));
      if (target < k) to[target].add(static_cast<uint8_t>(b), static_cast<uint8_t>(b));
    }
    for (size_t target = 0; target < k; ++target) {
      if (!to[target].empty()) options.push_back(seq({bytes(to[target]), ref(rules[target])}));
    }
    if (j + 1 == k) {
      options.push_back(seq({literal(trigger.substr(k - 1)), then}));
    }
    builder.define(rules[j], alt(std::move(options)));
  }
  return ref(rules[0]);
}

Grammar afterText(const Grammar& inner, const std::string& trigger) {
  GrammarBuilder builder;
  // Stands for `inner`'s root until the two are joined below.
  const int32_t joined = builder.add("constrained", literal(""));
  ByteSet space;
  for (uint8_t c : {' ', '\t', '\n', '\r'}) space.add(c, c);
  std::vector<Expr> then;
  for (int i = 0; i < 4; ++i) then.push_back(optional(bytes(space)));
  then.push_back(ref(joined));
  const int32_t root = builder.add("after_reasoning",
                                   textUntil(builder, "reasoning", trigger, seq(std::move(then))));
  StatusOr<Grammar> built = builder.build(root);
  TANDEM_CHECK(built.isOk(), "the reasoning prefix grammar is valid");
  Grammar out = std::move(built).value();
  const auto rule_offset = static_cast<int32_t>(out.rule_alternatives.size());
  const auto element_offset = static_cast<int32_t>(out.elements.size());
  const auto set_offset = static_cast<int32_t>(out.byte_sets.size());
  for (Element element : inner.elements) {
    if (element.kind == Element::Kind::kBytes) element.value += set_offset;
    if (element.kind == Element::Kind::kRule) element.value += rule_offset;
    out.elements.push_back(element);
  }
  for (std::vector<int32_t> starts : inner.rule_alternatives) {
    for (int32_t& start : starts) start += element_offset;
    out.rule_alternatives.push_back(std::move(starts));
  }
  out.byte_sets.insert(out.byte_sets.end(), inner.byte_sets.begin(), inner.byte_sets.end());
  out.rule_names.insert(out.rule_names.end(), inner.rule_names.begin(), inner.rule_names.end());
  // The stand-in's one alternative becomes inner's root.
  const auto start = static_cast<int32_t>(out.elements.size());
  out.elements.push_back({Element::Kind::kRule, inner.root + rule_offset});
  out.elements.push_back({Element::Kind::kEnd, 0});
  out.rule_alternatives[static_cast<size_t>(joined)] = {start};
  return out;
}

}  // namespace tandem::structured
