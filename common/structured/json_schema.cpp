#include "common/structured/json_schema.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/structured/matcher.h"
#include "common/structured/regex_grammar.h"
#include "common/structured/return_if_error.h"
#include "common/structured/utf8.h"

namespace tandem::structured {
namespace {

using Json = nlohmann::ordered_json;

// ---- Keywords ------------------------------------------------------------------

// Validation keywords this compiler applies.
constexpr std::string_view kAppliedKeywords[] = {"type",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "items",
                                                 "prefixItems",
                                                 "additionalItems",
                                                 "minItems",
                                                 "maxItems",
                                                 "minLength",
                                                 "maxLength",
                                                 "pattern",
                                                 "format",
                                                 "minimum",
                                                 "maximum",
                                                 "exclusiveMinimum",
                                                 "exclusiveMaximum"};

// Keywords of JSON Schema that constrain values and that this compiler does
// not apply: refused rather than silently ignored.
constexpr std::string_view kRefusedKeywords[] = {"multipleOf",
                                                 "minProperties",
                                                 "maxProperties",
                                                 "patternProperties",
                                                 "propertyNames",
                                                 "dependentRequired",
                                                 "dependentSchemas",
                                                 "dependencies",
                                                 "if",
                                                 "then",
                                                 "else",
                                                 "not",
                                                 "uniqueItems",
                                                 "contains",
                                                 "minContains",
                                                 "maxContains",
                                                 "unevaluatedProperties",
                                                 "unevaluatedItems",
                                                 "$dynamicRef",
                                                 "$recursiveRef"};

constexpr std::string_view kSupportedList =
    "type, enum, const, anyOf, oneOf, allOf (one subschema), $ref, properties, required, "
    "additionalProperties, items, prefixItems, additionalItems, minItems, maxItems, minLength, "
    "maxLength, pattern, format, minimum, maximum, exclusiveMinimum, exclusiveMaximum, "
    "and annotations";

constexpr std::string_view kSupportedFormats =
    "date, time, date-time, uuid, email, ipv4, hostname, uri";

// Keywords that imply a type when `type` is absent.
constexpr std::string_view kObjectKeywords[] = {"properties", "required", "additionalProperties"};
constexpr std::string_view kArrayKeywords[] = {"items", "prefixItems", "additionalItems",
                                               "minItems", "maxItems"};
constexpr std::string_view kStringKeywords[] = {"minLength", "maxLength", "pattern", "format"};
constexpr std::string_view kBoundKeywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                               "exclusiveMaximum"};

bool among(std::span<const std::string_view> list, std::string_view key) {
  return std::find(list.begin(), list.end(), key) != list.end();
}

bool hasAny(const Json& schema, std::span<const std::string_view> keys) {
  for (std::string_view key : keys) {
    if (schema.contains(key)) return true;
  }
  return false;
}

// ---- Types ---------------------------------------------------------------------

enum TypeBit : uint8_t {
  kNullType = 1,
  kBooleanType = 2,
  kObjectType = 4,
  kArrayType = 8,
  kStringType = 16,
  kNumberType = 32,
  kIntegerType = 64,
};
constexpr uint8_t kAllTypes = 127;

constexpr std::array<std::pair<std::string_view, TypeBit>, 7> kTypeNames = {{
    {"null", kNullType},
    {"boolean", kBooleanType},
    {"object", kObjectType},
    {"array", kArrayType},
    {"string", kStringType},
    {"number", kNumberType},
    {"integer", kIntegerType},
}};

bool isIntegral(const Json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double x = value.get<double>();
  return std::isfinite(x) && std::floor(x) == x;
}

bool hasType(const Json& value, uint8_t types) {
  switch (value.type()) {
    case Json::value_t::null:
      return types & kNullType;
    case Json::value_t::boolean:
      return types & kBooleanType;
    case Json::value_t::object:
      return types & kObjectType;
    case Json::value_t::array:
      return types & kArrayType;
    case Json::value_t::string:
      return types & kStringType;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return (types & kNumberType) || ((types & kIntegerType) && isIntegral(value));
    default:
      return false;
  }
}

// ---- Messages ------------------------------------------------------------------

std::string inQuotes(std::string_view text) {
  std::string out = "\"";
  out += text;
  out += '"';
  return out;
}

std::string shown(const std::string& pointer) { return pointer.empty() ? "(root)" : pointer; }

// A value for a message: its compact text, shortened.
std::string brief(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string keywordAt(std::string_view keyword, const std::string& pointer) {
  return "JSON Schema keyword " + inQuotes(keyword) + " at " + shown(pointer);
}

Status unsupportedKeyword(std::string_view keyword, const std::string& pointer) {
  return invalidArgument("unsupported JSON Schema keyword " + inQuotes(keyword) + " at " +
                         shown(pointer) + "; supported: " + std::string(kSupportedList));
}

// ---- JSON pointers (RFC 6901) ------------------------------------------------------

std::string escapeToken(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string child(const std::string& pointer, std::string_view keyword) {
  return pointer + "/" + escapeToken(keyword);
}

std::string child(const std::string& pointer, std::string_view keyword, std::string_view token) {
  return child(child(pointer, keyword), token);
}

std::string child(const std::string& pointer, std::string_view keyword, size_t index) {
  return child(pointer, keyword) + "/" + std::to_string(index);
}

// ---- Expression helpers ------------------------------------------------------------

Expr byteRange(char lo, char hi) {
  return bytes(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
}

Expr oneOfBytes(std::string_view chars) {
  ByteSet set;
  for (char c : chars) set.add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
  return bytes(set);
}

Expr digit() { return byteRange('0', '9'); }

Expr hexDigit() { return oneOfBytes("0123456789abcdefABCDEF"); }

Expr exactly(Expr item, int64_t count) { return repeat(std::move(item), count, count); }

// Options of an alternative, flattening nested alternatives.
void appendOption(std::vector<Expr>& options, Expr option) {
  if (option.kind == Expr::Kind::kAlt) {
    for (Expr& inner : option.children) options.push_back(std::move(inner));
  } else {
    options.push_back(std::move(option));
  }
}

Expr either(std::vector<Expr> options) {
  if (options.size() == 1) return std::move(options[0]);
  return alt(std::move(options));
}

// ---- Integer ranges ----------------------------------------------------------------

// Digit strings of lo.size() characters between lo and hi (equal lengths,
// lo <= hi), leading zeros allowed: a digit class per position, splitting
// where the bounds differ.
Expr sameLengthRange(std::string_view lo, std::string_view hi) {
  if (lo.empty()) return seq({});
  const std::string_view lo_rest = lo.substr(1);
  const std::string_view hi_rest = hi.substr(1);
  if (lo[0] == hi[0]) return seq({literal(lo.substr(0, 1)), sameLengthRange(lo_rest, hi_rest)});
  const size_t n = lo_rest.size();
  const bool low_full = lo_rest.find_first_not_of('0') == std::string_view::npos;
  const bool high_full = hi_rest.find_first_not_of('9') == std::string_view::npos;
  const std::string nines(n, '9');
  const std::string zeros(n, '0');
  std::vector<Expr> options;
  if (!low_full)
    options.push_back(seq({literal(lo.substr(0, 1)), sameLengthRange(lo_rest, nines)}));
  const char mid_lo = low_full ? lo[0] : static_cast<char>(lo[0] + 1);
  const char mid_hi = high_full ? hi[0] : static_cast<char>(hi[0] - 1);
  if (mid_lo <= mid_hi) {
    options.push_back(seq({byteRange(mid_lo, mid_hi), exactly(digit(), static_cast<int64_t>(n))}));
  }
  if (!high_full)
    options.push_back(seq({literal(hi.substr(0, 1)), sameLengthRange(zeros, hi_rest)}));
  return either(std::move(options));
}

// Decimal numerals without leading zeros for the values in [lo, hi].
Expr magnitudeRange(uint64_t lo, uint64_t hi) {
  const std::string low = std::to_string(lo);
  const std::string high = std::to_string(hi);
  std::vector<Expr> options;
  for (size_t length = low.size(); length <= high.size(); ++length) {
    std::string from = low;
    if (length > low.size()) {
      from.assign(length, '0');
      from[0] = '1';
    }
    const std::string to = length == high.size() ? high : std::string(length, '9');
    appendOption(options, sameLengthRange(from, to));
  }
  return either(std::move(options));
}

// Decimal numerals without leading zeros for the values >= lo.
Expr magnitudeAtLeast(uint64_t lo) {
  const std::string low = std::to_string(lo);
  std::vector<Expr> options;
  appendOption(options, sameLengthRange(low, std::string(low.size(), '9')));
  options.push_back(seq({byteRange('1', '9'), repeat(digit(), static_cast<int64_t>(low.size()))}));
  return either(std::move(options));
}

uint64_t magnitude(int64_t negative) { return static_cast<uint64_t>(-(negative + 1)) + 1; }

// Integers in [lo, hi]; a missing bound is open.
Expr integerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> options;
  if (!lo || *lo < 0) {
    const uint64_t least = hi && *hi < 0 ? magnitude(*hi) : 1;
    options.push_back(
        seq({literal("-"), lo ? magnitudeRange(least, magnitude(*lo)) : magnitudeAtLeast(least)}));
  }
  if (!hi || *hi >= 0) {
    const uint64_t least = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    appendOption(options,
                 hi ? magnitudeRange(least, static_cast<uint64_t>(*hi)) : magnitudeAtLeast(least));
  }
  return either(std::move(options));
}

// ---- Number ranges -----------------------------------------------------------------
//
// Bounded numbers are written without an exponent: -?(0|[1-9][0-9]*)(.[0-9]+)?
// with a value inside the bounds, compared digit by digit.

// A decimal as written: sign, whole part and fraction digits without
// trailing zeros (zero is never negative).
struct Decimal {
  bool negative = false;
  uint64_t whole = 0;
  std::string fraction;

  bool isZero() const { return whole == 0 && fraction.empty(); }
};

int compareMagnitudes(const Decimal& a, const Decimal& b) {
  if (a.whole != b.whole) return a.whole < b.whole ? -1 : 1;
  // Without trailing zeros, fractions compare as strings.
  return a.fraction.compare(b.fraction) < 0 ? -1 : a.fraction == b.fraction ? 0 : 1;
}

int compareDecimals(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int magnitude = compareMagnitudes(a, b);
  return a.negative ? -magnitude : magnitude;
}

struct NumberBound {
  Decimal value;
  bool exclusive = false;
};

// Fraction digits D (the text after the point; "" when there is none) whose
// value 0.D lies between 0.lo and 0.hi; no `hi` is 1, exclusive. `empty`
// says whether D may be "", `nonempty` holds the rest (none: no such D).
struct FractionLanguage {
  bool empty = false;
  std::optional<Expr> nonempty;
};

// The language's texts, each non-empty one after `lead` (the point after a
// whole part; "" within a fraction); none when it holds no text.
std::optional<Expr> fractionTexts(const FractionLanguage& language, std::string_view lead) {
  std::vector<Expr> options;
  if (language.empty) options.push_back(seq({}));
  if (language.nonempty) {
    options.push_back(lead.empty() ? *language.nonempty
                                   : seq({literal(std::string(lead)), *language.nonempty}));
  }
  if (options.empty()) return std::nullopt;
  return either(std::move(options));
}

FractionLanguage fractionRange(std::string_view lo, bool lo_exclusive,
                               std::optional<std::string_view> hi, bool hi_exclusive) {
  FractionLanguage out;
  out.empty = lo.empty() && !lo_exclusive && !(hi && hi->empty() && hi_exclusive);
  if (hi && hi->empty()) {
    // Only zeros are at most 0.
    if (out.empty) out.nonempty = plus(literal("0"));
    return out;
  }
  if (lo.empty() && !hi) {
    out.nonempty =
        lo_exclusive ? seq({star(digit()), byteRange('1', '9'), star(digit())}) : plus(digit());
    return out;
  }
  const int low = lo.empty() ? 0 : lo[0] - '0';
  const int high = hi ? (*hi)[0] - '0' : 10;
  const std::string_view lo_rest = lo.empty() ? lo : lo.substr(1);
  std::vector<Expr> options;
  const auto prefixed = [&](int first, const FractionLanguage& rest) {
    std::optional<Expr> texts = fractionTexts(rest, "");
    if (!texts) return;
    options.push_back(seq({literal(std::string(1, static_cast<char>('0' + first))), *texts}));
  };
  if (low + 1 <= high - 1) {
    options.push_back(
        seq({byteRange(static_cast<char>('0' + low + 1), static_cast<char>('0' + high - 1)),
             star(digit())}));
  }
  if (low == high) {
    prefixed(low, fractionRange(lo_rest, lo_exclusive, hi->substr(1), hi_exclusive));
  } else {
    prefixed(low, fractionRange(lo_rest, lo_exclusive, std::nullopt, false));
    if (hi) prefixed(high, fractionRange("", false, hi->substr(1), hi_exclusive));
  }
  if (!options.empty()) out.nonempty = either(std::move(options));
  return out;
}

// The point and fraction digits after a whole part, or nothing.
std::optional<Expr> fractionPart(const FractionLanguage& language) {
  return fractionTexts(language, ".");
}

// Unsigned decimal texts between `lo` and `hi` (no `hi`: unbounded), both
// non-negative.
Expr magnitudeBetween(const NumberBound& lo, const std::optional<NumberBound>& hi) {
  std::vector<Expr> options;
  const auto add = [&](Expr whole, std::optional<Expr> fraction) {
    if (fraction) options.push_back(seq({std::move(whole), std::move(*fraction)}));
  };
  const uint64_t a = lo.value.whole;
  const Expr any_fraction = optional(seq({literal("."), plus(digit())}));
  const std::string a_text = std::to_string(a);
  if (!hi) {
    add(literal(a_text),
        fractionPart(fractionRange(lo.value.fraction, lo.exclusive, std::nullopt, false)));
    options.push_back(seq({magnitudeAtLeast(a + 1), any_fraction}));
    return either(std::move(options));
  }
  const uint64_t b = hi->value.whole;
  if (a == b) {
    add(literal(a_text), fractionPart(fractionRange(lo.value.fraction, lo.exclusive,
                                                    hi->value.fraction, hi->exclusive)));
    return either(std::move(options));
  }
  add(literal(a_text),
      fractionPart(fractionRange(lo.value.fraction, lo.exclusive, std::nullopt, false)));
  if (a + 1 <= b - 1) options.push_back(seq({magnitudeRange(a + 1, b - 1), any_fraction}));
  add(literal(std::to_string(b)),
      fractionPart(fractionRange("", false, hi->value.fraction, hi->exclusive)));
  return either(std::move(options));
}

Decimal magnitudeOf(const Decimal& value) {
  Decimal out = value;
  out.negative = false;
  return out;
}

// Numbers between lo and hi (either may be open; they leave some value).
Expr numberRange(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
  std::vector<Expr> options;
  if (!lo || lo->value.negative) {
    // "-" and a magnitude above 0 (or above -hi): -0 is written as 0.
    NumberBound least{Decimal{}, true};
    if (hi && hi->value.negative) least = {magnitudeOf(hi->value), hi->exclusive};
    std::optional<NumberBound> most;
    if (lo) most = NumberBound{magnitudeOf(lo->value), lo->exclusive};
    options.push_back(seq({literal("-"), magnitudeBetween(least, most)}));
  }
  if (!hi || !hi->value.negative) {
    if (!(hi && hi->value.isZero() && hi->exclusive)) {
      NumberBound least{Decimal{}, false};
      if (lo && !lo->value.negative) least = *lo;
      appendOption(options, magnitudeBetween(least, hi));
    }
  }
  return either(std::move(options));
}

// ---- Shared rules ------------------------------------------------------------------

// The text of one character in a JSON string as nlohmann writes it, for the
// characters that need an escape: '"', '\\' and U+0000-U+001F.
std::string canonicalEscape(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      break;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("\\u00") + kHex[(cp >> 4) & 15] + kHex[cp & 15];
}

bool needsEscape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

// The rules every JSON grammar shares, each added to the builder on first
// use.
class JsonRules {
 public:
  explicit JsonRules(GrammarBuilder& builder) : builder_(builder) {}

  // One character inside a JSON string: any code point but '"', '\\' and
  // controls, or an escape. \u escapes never name a surrogate, so a string
  // is always valid Unicode and counts its characters one per escape.
  int32_t character() {
    if (character_ < 0) {
      const Expr not_surrogate =
          alt({seq({oneOfBytes("0123456789abcABCeEfF"), exactly(hexDigit(), 3)}),
               seq({oneOfBytes("dD"), byteRange('0', '7'), exactly(hexDigit(), 2)})});
      std::vector<Expr> options;
      appendOption(options, codePoints(rawRanges()));
      options.push_back(seq({literal("\\"), oneOfBytes("\"\\/bfnrt")}));
      options.push_back(seq({literal("\\u"), not_surrogate}));
      character_ = builder_.add("char", alt(std::move(options)));
    }
    return character_;
  }

  int32_t string() {
    if (string_ < 0) {
      string_ = builder_.add("string", seq({literal("\""), star(ref(character())), literal("\"")}));
    }
    return string_;
  }

  int32_t number() {
    if (number_ < 0) {
      number_ = builder_.add(
          "number",
          seq({optional(literal("-")), integerPart(), optional(seq({literal("."), plus(digit())})),
               optional(seq({oneOfBytes("eE"), optional(oneOfBytes("+-")), plus(digit())}))}));
    }
    return number_;
  }

  int32_t integer() {
    if (integer_ < 0)
      integer_ = builder_.add("integer", seq({optional(literal("-")), integerPart()}));
    return integer_;
  }

  int32_t value() {
    if (value_ < 0) {
      value_ = builder_.declare("value");
      builder_.define(value_, alt({ref(object()), ref(array()), ref(string()), ref(number()),
                                   literal("true"), literal("false"), literal("null")}));
    }
    return value_;
  }

  bool isValue(int32_t rule) const { return value_ >= 0 && rule == value_; }

  int32_t object() {
    if (object_ < 0) {
      object_ = builder_.declare("object");
      const int32_t member =
          builder_.add("member", seq({ref(string()), literal(":"), ref(value())}));
      builder_.define(
          object_,
          seq({literal("{"), optional(seq({ref(member), star(seq({literal(","), ref(member)}))})),
               literal("}")}));
    }
    return object_;
  }

  int32_t array() {
    if (array_ < 0) {
      array_ = builder_.declare("array");
      builder_.define(
          array_,
          seq({literal("["), optional(seq({ref(value()), star(seq({literal(","), ref(value())}))})),
               literal("]")}));
    }
    return array_;
  }

  // A character of an object key written the way nlohmann writes it: raw
  // unless it needs an escape, then the shortest escape.
  int32_t keyCharacter() {
    if (key_character_ < 0) {
      std::vector<Expr> options;
      appendOption(options, codePoints(rawRanges()));
      options.push_back(ref(keyEscape()));
      key_character_ = builder_.add("key_char", alt(std::move(options)));
    }
    return key_character_;
  }

  // Every escaped character, in that form.
  int32_t keyEscape() {
    if (key_escape_ < 0) {
      std::vector<Expr> options;
      for (uint32_t cp : escapedCodePoints()) options.push_back(literal(canonicalEscape(cp)));
      key_escape_ = builder_.add("key_escape", alt(std::move(options)));
    }
    return key_escape_;
  }

  // The rest of a key, its closing quote included.
  int32_t keyRest() {
    if (key_rest_ < 0) {
      key_rest_ = builder_.add("key_rest", seq({star(ref(keyCharacter())), literal("\"")}));
    }
    return key_rest_;
  }

  // The rule for a `format` value; -1 for a format not supported.
  int32_t format(std::string_view name) {
    if (auto it = formats_.find(std::string(name)); it != formats_.end()) return it->second;
    std::optional<Expr> body;
    if (name == "date") {
      // RFC 3339 full-date: the days each month has, February 29th in leap
      // years only (divisible by 4, and by 400 when by 100).
      const auto two = [](std::string_view first, std::string_view second) {
        return seq({oneOfBytes(first), oneOfBytes(second)});
      };
      const Expr day_from_1 = seq({literal("0"), byteRange('1', '9')});
      const Expr days_31 = alt({day_from_1, seq({byteRange('1', '2'), digit()}), two("3", "01")});
      const Expr days_30 = alt({day_from_1, seq({byteRange('1', '2'), digit()}), literal("30")});
      const Expr days_28 = alt({day_from_1, seq({literal("1"), digit()}), two("2", "012345678")});
      // Years 0001 to 9999: Python's date (and so pydantic and jsonschema)
      // has no year 0.
      const Expr year = alt({seq({byteRange('1', '9'), exactly(digit(), 3)}),
                             seq({literal("0"), byteRange('1', '9'), exactly(digit(), 2)}),
                             seq({literal("00"), byteRange('1', '9'), digit()}),
                             seq({literal("000"), byteRange('1', '9')})});
      // Multiples of 4 from 04 (the century years 0400, 0800, ...).
      const Expr multiple_of_4 = alt({two("2468", "048"), two("0", "48"), two("13579", "26")});
      const Expr leap_year = alt(
          {seq({digit(), digit(), alt({two("02468", "48"), two("13579", "26"), two("2468", "0")})}),
           seq({multiple_of_4, literal("00")})});
      body = alt({seq({year, literal("-"),
                       alt({seq({alt({two("0", "13578"), two("1", "02")}), literal("-"), days_31}),
                            seq({alt({two("0", "469"), literal("11")}), literal("-"), days_30}),
                            seq({literal("02-"), days_28})})}),
                  seq({leap_year, literal("-02-29")})});
    } else if (name == "time") {
      const Expr hour =
          alt({seq({byteRange('0', '1'), digit()}), seq({literal("2"), byteRange('0', '3')})});
      const Expr minute = seq({byteRange('0', '5'), digit()});
      body = seq({hour, literal(":"), minute, literal(":"), minute,
                  optional(seq({literal("."), plus(digit())})),
                  alt({literal("Z"), seq({oneOfBytes("+-"), hour, literal(":"), minute})})});
    } else if (name == "date-time") {
      const int32_t date = format("date");
      const int32_t time = format("time");
      body = seq({ref(date), literal("T"), ref(time)});
    } else if (name == "uuid") {
      body = seq({exactly(hexDigit(), 8), literal("-"), exactly(hexDigit(), 4), literal("-"),
                  exactly(hexDigit(), 4), literal("-"), exactly(hexDigit(), 4), literal("-"),
                  exactly(hexDigit(), 12)});
    } else if (name == "hostname") {
      // At most 253 characters in all (RFC 1123, as validators check): up
      // to three labels of up to 63 characters, or four to eight of up to
      // 30 (a subset; an exact bound would take a rule per length).
      const int32_t label = hostnameLabel();
      const int32_t short_label = builder_.add("hostname_short_label", hostnameLabelOf(30));
      body = alt({seq({ref(label), repeat(seq({literal("."), ref(label)}), 0, 2)}),
                  seq({ref(short_label), repeat(seq({literal("."), ref(short_label)}), 3, 7)})});
    } else if (name == "email") {
      // RFC 5322 dot-atom local part; a domain of two or more host labels.
      const Expr atom = plus(oneOfBytes(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-"));
      const int32_t label = hostnameLabel();
      body = seq({atom, star(seq({literal("."), atom})), literal("@"), ref(label),
                  plus(seq({literal("."), ref(label)}))});
    } else if (name == "ipv4") {
      const int32_t octet =
          builder_.add("ipv4_octet", alt({seq({literal("25"), byteRange('0', '5')}),
                                          seq({literal("2"), byteRange('0', '4'), digit()}),
                                          seq({literal("1"), digit(), digit()}),
                                          seq({byteRange('1', '9'), digit()}), digit()}));
      body = seq({ref(octet), literal("."), ref(octet), literal("."), ref(octet), literal("."),
                  ref(octet)});
    } else if (name == "uri") {
      // RFC 3986's URI without IP literals: scheme ":" hier-part, then an
      // optional "?" query and "#" fragment. hier-part is "//" authority
      // path-abempty, path-absolute or path-rootless (not path-empty, which
      // validators such as Ajv refuse).
      const Expr scheme =
          seq({alt({byteRange('a', 'z'), byteRange('A', 'Z')}),
               star(oneOfBytes("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789+.-"))});
      const auto chars = [&](std::string_view extra) {
        return alt({oneOfBytes("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                               "-._~!$&'()*+,;=" +
                               std::string(extra)),
                    seq({literal("%"), hexDigit(), hexDigit()})});
      };
      const int32_t pchar = builder_.add("uri_pchar", chars(":@"));
      const Expr segments = star(seq({literal("/"), star(ref(pchar))}));
      const Expr rootless = seq({plus(ref(pchar)), segments});
      const Expr authority = seq({optional(seq({star(chars(":")), literal("@")})), star(chars("")),
                                  optional(seq({literal(":"), star(digit())}))});
      const Expr hier_part = alt({seq({literal("//"), authority, segments}),
                                  seq({literal("/"), optional(rootless)}), rootless});
      const Expr query_char = alt({ref(pchar), oneOfBytes("/?")});
      body = seq({scheme, literal(":"), hier_part, optional(seq({literal("?"), star(query_char)})),
                  optional(seq({literal("#"), star(query_char)}))});
    } else {
      return -1;
    }
    const int32_t rule = builder_.add("format_" + std::string(name), std::move(*body));
    formats_.emplace(std::string(name), rule);
    return rule;
  }

  // Code points written raw inside a string.
  static CodePointRanges rawRanges() { return {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}}; }

  // Code points written as escapes.
  static std::vector<uint32_t> escapedCodePoints() {
    std::vector<uint32_t> out;
    for (uint32_t cp = 0; cp < 0x20; ++cp) out.push_back(cp);
    out.push_back('"');
    out.push_back('\\');
    return out;
  }

 private:
  static Expr integerPart() {
    return alt({literal("0"), seq({byteRange('1', '9'), star(digit())})});
  }

  // 1 to `most` letters, digits and hyphens, not starting or ending with a
  // hyphen: a hostname label.
  static Expr hostnameLabelOf(int64_t most) {
    const Expr alnum = oneOfBytes("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");
    const Expr inner =
        oneOfBytes("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-");
    return seq({alnum, optional(seq({repeat(inner, 0, most - 2), alnum}))});
  }

  // A label of 1 to 63 characters.
  int32_t hostnameLabel() {
    if (hostname_label_ < 0) hostname_label_ = builder_.add("hostname_label", hostnameLabelOf(63));
    return hostname_label_;
  }

  GrammarBuilder& builder_;
  int32_t character_ = -1;
  int32_t string_ = -1;
  int32_t number_ = -1;
  int32_t integer_ = -1;
  int32_t value_ = -1;
  int32_t object_ = -1;
  int32_t array_ = -1;
  int32_t key_character_ = -1;
  int32_t key_escape_ = -1;
  int32_t key_rest_ = -1;
  int32_t hostname_label_ = -1;
  std::map<std::string, int32_t> formats_;
};

// ---- The compiler ------------------------------------------------------------------

// Walks a schema once, adding one rule per subschema (a subschema whose
// body is a single rule is that rule) and one per $ref target, compiled
// from a worklist so references may form cycles.
class SchemaCompiler {
 public:
  // Rules go to `builder`, named `prefix` + the subschema's JSON pointer.
  SchemaCompiler(GrammarBuilder& builder, const Json& root, const JsonSchemaLimits& limits,
                 std::string prefix = "schema")
      : root_(root),
        limits_(limits),
        prefix_(std::move(prefix)),
        builder_(builder),
        rules_(builder_) {}

  StatusOr<Grammar> compile() {
    StatusOr<int32_t> root = addRules();
    if (!root.isOk()) return root.status();
    GrammarLimits limits = limits_.grammar;
    limits.require_finite = false;  // checkFinite names the subschema
    StatusOr<Grammar> grammar = builder_.build(*root, limits);
    if (!grammar.isOk()) return grammar.status();
    TANDEM_RETURN_IF_ERROR(checkFinite(*grammar));
    return grammar;
  }

  // The schema's rules, every $ref target defined; the root's rule.
  StatusOr<int32_t> addRules() {
    StatusOr<int32_t> root = compileRule(root_, "", 1);
    if (!root.isOk()) return root.status();
    while (!pending_.empty()) {
      const Pending next = std::move(pending_.back());
      pending_.pop_back();
      const int32_t rule = by_pointer_.at(next.pointer);
      if (builder_.defined(rule)) continue;
      StatusOr<Expr> body = compileBody(*next.schema, next.pointer, 1);
      if (!body.isOk()) return body.status();
      builder_.define(rule, std::move(body).value());
    }
    return root;
  }

 private:
  struct Pending {
    const Json* schema;
    std::string pointer;
  };

  struct Property {
    std::string name;
    Expr value;
    bool required = false;
  };

  std::string ruleName(const std::string& pointer) const { return prefix_ + pointer; }

  // A count in [least, most] becomes `least` copies (elements) and
  // `optional` optional links (rules, one each): both within the limits.
  Status countFits(const std::string& pointer, const char* min_keyword, int64_t least,
                   const char* max_keyword, int64_t most, int64_t optional) const {
    if (optional > limits_.grammar.max_rules) {
      return resourceExhausted(keywordAt(max_keyword, pointer) + " is " + std::to_string(most) +
                               ", more than a grammar of max_rules " +
                               std::to_string(limits_.grammar.max_rules) + " can count");
    }
    if (least > limits_.grammar.max_elements) {
      return resourceExhausted(keywordAt(min_keyword, pointer) + " is " + std::to_string(least) +
                               ", more than a grammar of max_elements " +
                               std::to_string(limits_.grammar.max_elements) + " can hold");
    }
    return Status::ok();
  }

  // Every rule the root reaches must derive some text: one that cannot (a
  // $ref cycle with no type in between, a required property whose schema
  // contains itself) would let generation enter a value it can never
  // finish.
  Status checkFinite(const Grammar& grammar) const {
    const std::vector<bool> finite = finishingRules(grammar);
    const std::vector<bool> reached = reachableRules(grammar);
    bool all_finite = true;
    for (size_t r = 0; r < finite.size(); ++r)
      all_finite = all_finite && (!reached[r] || finite[r]);
    if (all_finite) return Status::ok();
    // Name the subschema: the shortest pointer among those with a rule of
    // their own.
    std::optional<std::string> culprit;
    for (const auto& [pointer, rule] : by_pointer_) {
      const auto r = static_cast<size_t>(rule);
      if (!reached[r] || finite[r] || grammar.rule_names[r] != ruleName(pointer)) continue;
      if (!culprit || pointer.size() < culprit->size() ||
          (pointer.size() == culprit->size() && pointer < *culprit)) {
        culprit = pointer;
      }
    }
    return invalidArgument("JSON Schema at " + shown(culprit.value_or("")) +
                           " allows no finite value: every value of it would contain itself "
                           "(a $ref cycle with no type in between, or a required property or "
                           "minItems leading back to it); supported: recursion through optional "
                           "properties or array items");
  }

  StatusOr<int32_t> compileRule(const Json& schema, const std::string& pointer, int64_t depth) {
    if (auto it = by_pointer_.find(pointer); it != by_pointer_.end()) return it->second;
    StatusOr<Expr> body = compileBody(schema, pointer, depth);
    if (!body.isOk()) return body.status();
    // A $ref inside the body may have asked for this very subschema.
    if (auto it = by_pointer_.find(pointer); it != by_pointer_.end()) {
      if (!builder_.defined(it->second)) builder_.define(it->second, std::move(body).value());
      return it->second;
    }
    if (body->kind == Expr::Kind::kRule) {
      by_pointer_.emplace(pointer, body->rule);
      return body->rule;
    }
    const int32_t rule = builder_.add(ruleName(pointer), std::move(body).value());
    by_pointer_.emplace(pointer, rule);
    return rule;
  }

  StatusOr<Expr> compileBody(const Json& schema, const std::string& pointer, int64_t depth) {
    if (depth > limits_.max_depth) {
      return resourceExhausted("JSON schema nests subschemas deeper than max_depth " +
                               std::to_string(limits_.max_depth) + " at " + shown(pointer));
    }
    if (++nodes_ > limits_.max_nodes) {
      return resourceExhausted("JSON schema has more than max_nodes " +
                               std::to_string(limits_.max_nodes) + " subschemas (the last at " +
                               shown(pointer) + ")");
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return ref(rules_.value());
      return falseSchema(pointer);
    }
    if (!schema.is_object()) {
      return invalidArgument("JSON Schema at " + shown(pointer) +
                             " must be an object or a boolean, got " + brief(schema));
    }
    for (const auto& [key, value] : schema.items()) {
      if (key == "uniqueItems" && value == Json(false)) continue;  // no constraint
      if (among(kRefusedKeywords, key)) return unsupportedKeyword(key, pointer);
    }

    std::vector<std::string_view> combinators;
    for (std::string_view key : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (schema.contains(key)) combinators.push_back(key);
    }
    if (combinators.size() > 1) {
      return invalidArgument("unsupported JSON Schema keywords " + inQuotes(combinators[0]) +
                             " and " + inQuotes(combinators[1]) + " together at " + shown(pointer) +
                             "; supported: one of $ref, anyOf, oneOf and allOf per schema");
    }
    if (combinators.size() == 1) {
      const std::string_view combinator = combinators[0];
      for (const auto& [key, value] : schema.items()) {
        if (key != combinator && among(kAppliedKeywords, key)) {
          return invalidArgument("unsupported JSON Schema keyword " + inQuotes(key) + " beside " +
                                 inQuotes(combinator) + " at " + shown(pointer) +
                                 "; supported beside $ref, anyOf, oneOf and allOf: annotations "
                                 "(title, description, default, ...) and $defs");
        }
      }
      if (combinator == "$ref") return compileRef(schema["$ref"], pointer);
      if (combinator == "allOf") return compileAllOf(schema["allOf"], pointer, depth);
      return compileAnyOf(schema[std::string(combinator)], std::string(combinator), pointer, depth);
    }

    if (schema.contains("enum") || schema.contains("const")) return compileEnum(schema, pointer);

    StatusOr<uint8_t> types = readTypes(schema, pointer);
    if (!types.isOk()) return types.status();
    // No type and no keyword of one: any value.
    if (*types == kAllTypes && !schema.contains("type")) return ref(rules_.value());
    std::vector<Expr> options;
    if (*types & kNullType) options.push_back(literal("null"));
    if (*types & kBooleanType) {
      options.push_back(literal("true"));
      options.push_back(literal("false"));
    }
    if (*types & kObjectType) {
      StatusOr<Expr> object = compileObject(schema, pointer, depth);
      if (!object.isOk()) return object.status();
      options.push_back(std::move(object).value());
    }
    if (*types & kArrayType) {
      StatusOr<Expr> array = compileArray(schema, pointer, depth);
      if (!array.isOk()) return array.status();
      options.push_back(std::move(array).value());
    }
    if (*types & kStringType) {
      StatusOr<Expr> string = compileString(schema, pointer);
      if (!string.isOk()) return string.status();
      options.push_back(std::move(string).value());
    }
    if (*types & kNumberType) {
      StatusOr<Expr> number = compileNumber(schema, pointer);
      if (!number.isOk()) return number.status();
      options.push_back(std::move(number).value());
    } else if (*types & kIntegerType) {
      StatusOr<Expr> integer = compileInteger(schema, pointer);
      if (!integer.isOk()) return integer.status();
      options.push_back(std::move(integer).value());
    }
    return either(std::move(options));
  }

  Status falseSchema(const std::string& pointer) const {
    return invalidArgument("JSON Schema at " + shown(pointer) +
                           " is false: no value is valid there; supported: false only as "
                           "additionalProperties, items, or an optional property");
  }

  // The `type` keyword's types; without it, those whose keywords appear, or
  // all of them.
  StatusOr<uint8_t> readTypes(const Json& schema, const std::string& pointer) const {
    if (!schema.contains("type")) {
      uint8_t types = 0;
      if (hasAny(schema, kObjectKeywords)) types |= kObjectType;
      if (hasAny(schema, kArrayKeywords)) types |= kArrayType;
      if (hasAny(schema, kStringKeywords)) types |= kStringType;
      if (hasAny(schema, kBoundKeywords)) types |= kNumberType;
      return types == 0 ? kAllTypes : types;
    }
    const Json& type = schema["type"];
    const auto bad = [&] {
      return invalidArgument(keywordAt("type", pointer) +
                             " must be one of \"null\", \"boolean\", \"object\", \"array\", "
                             "\"string\", \"number\", \"integer\", or a non-empty array of them; "
                             "got " +
                             brief(type));
    };
    const auto bit = [](const Json& name) -> uint8_t {
      if (!name.is_string()) return 0;
      for (const auto& [text, value] : kTypeNames) {
        if (name.get_ref<const std::string&>() == text) return value;
      }
      return 0;
    };
    if (type.is_string()) {
      const uint8_t value = bit(type);
      if (value == 0) return bad();
      return value;
    }
    if (!type.is_array() || type.empty()) return bad();
    uint8_t types = 0;
    for (const Json& name : type) {
      const uint8_t value = bit(name);
      if (value == 0) return bad();
      types |= value;
    }
    return types;
  }

  // ---- $ref ----

  StatusOr<Expr> compileRef(const Json& target, const std::string& pointer) {
    if (!target.is_string()) {
      return invalidArgument(keywordAt("$ref", pointer) + " must be a string, got " +
                             brief(target));
    }
    const std::string& text = target.get_ref<const std::string&>();
    const auto unresolved = [&](const std::string& why) {
      return invalidArgument("$ref " + inQuotes(text) + " at " + shown(pointer) +
                             " does not resolve: " + why +
                             "; supported: \"#\" and JSON pointers into this document such as "
                             "\"#/$defs/Name\"");
    };
    if (text.empty() || text[0] != '#') return unresolved("only references within this document");
    std::string fragment;
    for (size_t i = 1; i < text.size(); ++i) {
      if (text[i] != '%') {
        fragment += text[i];
        continue;
      }
      if (i + 2 >= text.size() || internal::hexValue(text[i + 1]) < 0 ||
          internal::hexValue(text[i + 2]) < 0) {
        return unresolved("a '%' not followed by two hexadecimal digits");
      }
      fragment +=
          static_cast<char>(internal::hexValue(text[i + 1]) * 16 + internal::hexValue(text[i + 2]));
      i += 2;
    }
    if (!fragment.empty() && fragment[0] != '/') {
      return unresolved("anchors are not supported, only JSON pointers");
    }
    const Json* node = &root_;
    std::string canonical;
    size_t start = 1;
    while (start <= fragment.size() && !fragment.empty()) {
      size_t end = fragment.find('/', start);
      if (end == std::string::npos) end = fragment.size();
      std::string token;
      for (size_t i = start; i < end; ++i) {
        if (fragment[i] != '~') {
          token += fragment[i];
        } else if (i + 1 < end && (fragment[i + 1] == '0' || fragment[i + 1] == '1')) {
          token += fragment[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          return unresolved("'~' must be followed by 0 or 1");
        }
      }
      const std::string where = shown(canonical);
      if (node->is_object()) {
        auto it = node->find(token);
        if (it == node->end()) return unresolved("no member " + inQuotes(token) + " at " + where);
        node = &*it;
      } else if (node->is_array()) {
        const bool numeral = !token.empty() && token.size() <= 9 &&
                             token.find_first_not_of("0123456789") == std::string::npos &&
                             (token == "0" || token[0] != '0');
        if (!numeral || std::stoul(token) >= node->size()) {
          return unresolved("no element " + inQuotes(token) + " at " + where);
        }
        node = &(*node)[std::stoul(token)];
      } else {
        return unresolved("nothing inside the " + std::string(node->type_name()) + " at " + where);
      }
      canonical += "/" + escapeToken(token);
      start = end + 1;
    }
    if (auto it = by_pointer_.find(canonical); it != by_pointer_.end()) return ref(it->second);
    const int32_t rule = builder_.declare(ruleName(canonical));
    by_pointer_.emplace(canonical, rule);
    pending_.push_back(Pending{node, canonical});
    return ref(rule);
  }

  // ---- anyOf, oneOf, allOf ----

  StatusOr<Expr> compileAnyOf(const Json& branches, const std::string& keyword,
                              const std::string& pointer, int64_t depth) {
    if (!branches.is_array() || branches.empty()) {
      return invalidArgument(keywordAt(keyword, pointer) +
                             " must be a non-empty array of schemas, got " + brief(branches));
    }
    std::vector<Expr> options;
    for (size_t i = 0; i < branches.size(); ++i) {
      if (branches[i] == Json(false)) continue;
      StatusOr<int32_t> rule = compileRule(branches[i], child(pointer, keyword, i), depth + 1);
      if (!rule.isOk()) return rule.status();
      options.push_back(ref(*rule));
    }
    if (options.empty()) {
      return invalidArgument(keywordAt(keyword, pointer) +
                             " has only false branches: no value is valid there");
    }
    return either(std::move(options));
  }

  StatusOr<Expr> compileAllOf(const Json& parts, const std::string& pointer, int64_t depth) {
    if (!parts.is_array() || parts.size() != 1) {
      return invalidArgument("unsupported JSON Schema keyword \"allOf\" at " + shown(pointer) +
                             " with " +
                             (parts.is_array() ? std::to_string(parts.size()) + " subschemas"
                                               : "a value that is not an array") +
                             "; supported: allOf with exactly one subschema");
    }
    StatusOr<int32_t> rule = compileRule(parts[0], child(pointer, "allOf", 0), depth + 1);
    if (!rule.isOk()) return rule.status();
    return ref(*rule);
  }

  // ---- enum, const ----

  StatusOr<Expr> compileEnum(const Json& schema, const std::string& pointer) {
    std::vector<const Json*> values;
    if (schema.contains("enum")) {
      const Json& list = schema["enum"];
      if (!list.is_array() || list.empty()) {
        return invalidArgument(keywordAt("enum", pointer) + " must be a non-empty array, got " +
                               brief(list));
      }
      if (static_cast<int64_t>(list.size()) > limits_.max_enum_values) {
        return resourceExhausted(keywordAt("enum", pointer) + " has " +
                                 std::to_string(list.size()) + " values; at most max_enum_values " +
                                 std::to_string(limits_.max_enum_values) + " are accepted");
      }
      for (const Json& value : list) {
        if (!schema.contains("const") || value == schema["const"]) values.push_back(&value);
      }
      if (values.empty()) {
        return invalidArgument(keywordAt("const", pointer) + " is none of the values of \"enum\"");
      }
    } else {
      values.push_back(&schema["const"]);
    }
    const std::string keyword = schema.contains("enum") ? "enum" : "const";
    uint8_t types = kAllTypes;
    if (schema.contains("type")) {
      StatusOr<uint8_t> declared = readTypes(schema, pointer);
      if (!declared.isOk()) return declared.status();
      types = *declared;
    }
    // String and number keywords beside the values keep those they allow:
    // the lengths, the pattern and the format each checked on their own.
    std::vector<Grammar> string_checks;
    for (const std::vector<std::string_view>& group :
         {std::vector<std::string_view>{"minLength", "maxLength"},
          std::vector<std::string_view>{"pattern"}, std::vector<std::string_view>{"format"}}) {
      Json check = Json::object();
      for (std::string_view key : group) {
        if (schema.contains(key)) check[std::string(key)] = schema[key];
      }
      if (check.empty()) continue;
      check["type"] = "string";
      StatusOr<Grammar> grammar = compileJsonSchema(check, limits_);
      if (!grammar.isOk()) {
        return Status(grammar.status().code(), grammar.status().message() + " (beside " +
                                                   inQuotes(keyword) + " at " + shown(pointer) +
                                                   ")");
      }
      string_checks.push_back(std::move(grammar).value());
    }
    const auto string_allowed = [&](const std::string& text) {
      for (const Grammar& check : string_checks) {
        if (!grammarAccepts(check, text)) return false;
      }
      return true;
    };
    // Bounds compare as the number grammar does: digit by digit.
    struct Bound {
      BoundKeyword keyword;
      Decimal value;
    };
    std::vector<Bound> bounds;
    for (const BoundKeyword& keyword : boundKeywords(schema)) {
      StatusOr<Decimal> value = numberBound(schema[keyword.key], keyword.key, pointer);
      if (!value.isOk()) return value.status();
      bounds.push_back({keyword, std::move(value).value()});
    }
    const auto within_bounds = [&](const Json& value) {
      if (!value.is_number()) return true;
      // A listed number past what a bound may be (|x| >= 1e18, more than
      // 40 decimals) compares as a double.
      StatusOr<Decimal> exact = numberBound(value, "enum", pointer);
      for (const Bound& bound : bounds) {
        int order = 0;
        if (exact.isOk()) {
          order = compareDecimals(*exact, bound.value);
        } else {
          const double x = value.get<double>();
          const double b = schema[bound.keyword.key].get<double>();
          order = x < b ? -1 : x > b ? 1 : 0;
        }
        const bool ok = bound.keyword.lower ? (bound.keyword.exclusive ? order > 0 : order >= 0)
                                            : (bound.keyword.exclusive ? order < 0 : order <= 0);
        if (!ok) return false;
      }
      return true;
    };
    std::vector<Expr> options;
    std::set<std::string> seen;
    bool any_typed = false;
    for (const Json* value : values) {
      if (!hasType(*value, types)) continue;
      any_typed = true;
      std::string text;
      try {
        text = value->dump();
      } catch (const nlohmann::json::exception&) {
        return invalidArgument(keywordAt(keyword, pointer) +
                               " holds a string that is not valid UTF-8");
      }
      if (value->is_string() && !string_allowed(text)) continue;
      if (!within_bounds(*value)) continue;
      if (seen.insert(text).second) options.push_back(literal(text));
    }
    if (!any_typed) {
      return invalidArgument(keywordAt(keyword, pointer) + " has no value of the schema's type " +
                             brief(schema["type"]));
    }
    if (options.empty()) {
      return invalidArgument(keywordAt(keyword, pointer) +
                             " has no value that the keywords beside it allow (minLength, "
                             "maxLength, pattern, format, minimum, maximum and the exclusive "
                             "bounds are applied to the values)");
    }
    return either(std::move(options));
  }

  // ---- Objects ----

  StatusOr<Expr> compileObject(const Json& schema, const std::string& pointer, int64_t depth) {
    std::vector<Property> properties;
    std::vector<std::string> names;  // every declared name, false schemas included
    std::set<std::string> named;     // the same, for lookups
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& list = schema["required"];
      const auto bad = [&] {
        return invalidArgument(keywordAt("required", pointer) +
                               " must be an array of property names (strings), got " + brief(list));
      };
      if (!list.is_array()) return bad();
      for (const Json& name : list) {
        if (!name.is_string()) return bad();
        required.insert(name.get<std::string>());
      }
    }
    if (schema.contains("properties")) {
      const Json& declared = schema["properties"];
      if (!declared.is_object()) {
        return invalidArgument(keywordAt("properties", pointer) +
                               " must be an object of property schemas, got " + brief(declared));
      }
      for (const auto& [name, subschema] : declared.items()) {
        names.push_back(name);
        named.insert(name);
        const bool is_required = required.count(name) > 0;
        const std::string at = child(pointer, "properties", name);
        if (subschema == Json(false)) {
          if (is_required) {
            return invalidArgument("JSON Schema at " + at + " is false but property " +
                                   inQuotes(name) + " is required at " + shown(pointer));
          }
          continue;  // never present
        }
        StatusOr<int32_t> rule = compileRule(subschema, at, depth + 1);
        if (!rule.isOk()) return rule.status();
        properties.push_back(Property{name, ref(*rule), is_required});
      }
    }
    // What additionalProperties says of names other than the declared ones
    // (its rule; nullopt when absent; -1 when false).
    std::optional<int32_t> additional_rule;
    if (schema.contains("additionalProperties")) {
      const Json& additional = schema["additionalProperties"];
      if (additional == Json(false)) {
        additional_rule = -1;
      } else {
        StatusOr<int32_t> rule =
            compileRule(additional, child(pointer, "additionalProperties"), depth + 1);
        if (!rule.isOk()) return rule.status();
        additional_rule = *rule;
      }
    }
    if (schema.contains("required")) {
      for (const Json& name : schema["required"]) {
        const std::string& text = name.get_ref<const std::string&>();
        if (!named.insert(text).second) continue;
        // Required but not declared: an additional property, whose value
        // additionalProperties governs (any value when it is absent).
        if (additional_rule == -1) {
          return invalidArgument("property " + inQuotes(text) + " is required at " +
                                 shown(pointer) +
                                 " but additionalProperties is false and properties does not "
                                 "declare it: no object can match");
        }
        names.push_back(text);
        properties.push_back(
            Property{text, ref(additional_rule ? *additional_rule : rules_.value()), true});
      }
    }

    // Extra members: what additionalProperties allows, keyed by names other
    // than the declared ones.
    std::optional<Expr> extra_value;
    const bool closed_by_default = schema.contains("properties") || schema.contains("required");
    if (additional_rule) {
      if (*additional_rule >= 0) extra_value = ref(*additional_rule);
    } else if (!closed_by_default) {
      extra_value = ref(rules_.value());
    }
    if (names.empty() && extra_value && extra_value->kind == Expr::Kind::kRule &&
        rules_.isValue(extra_value->rule)) {
      return ref(rules_.object());
    }

    std::optional<int32_t> extra;
    if (extra_value) {
      StatusOr<Expr> key = extraKey(names, pointer);
      if (!key.isOk()) return key.status();
      extra = builder_.add(ruleName(pointer) + "_extra",
                           seq({std::move(key).value(), literal(":"), std::move(*extra_value)}));
    }

    std::vector<Expr> keyed;  // "name":value
    for (Property& property : properties) {
      std::string key;
      try {
        key = Json(property.name).dump();
      } catch (const nlohmann::json::exception&) {
        return invalidArgument("property name at " + shown(pointer) + " is not valid UTF-8");
      }
      keyed.push_back(seq({literal(key + ":"), std::move(property.value)}));
    }

    // F = the members when none is written yet; A[j] = those from property
    // j on when one is, each with its leading comma. F is one alternative
    // per choice of the first property present (only optional ones may be
    // passed over); A[j] becomes a rule where two places use it, which
    // keeps the grammar linear in the number of properties.
    const size_t n = properties.size();
    size_t first_required = n;
    for (size_t i = 0; i < n; ++i) {
      if (properties[i].required) {
        first_required = i;
        break;
      }
    }
    std::vector<Expr> tail_reversed;  // A[j]'s parts, last first
    if (extra) tail_reversed.push_back(star(seq({literal(","), ref(*extra)})));
    std::vector<Expr> after(n + 1);  // A[j] for j <= first_required + 1
    for (size_t j = n; j >= 1; --j) {
      if (j >= 2 && j <= first_required + 1) {
        const int32_t rule =
            builder_.add(ruleName(pointer) + "_after_" + std::to_string(j),
                         seq(std::vector<Expr>(tail_reversed.rbegin(), tail_reversed.rend())));
        tail_reversed.clear();
        tail_reversed.push_back(ref(rule));
      }
      if (j <= first_required + 1) {
        after[j] = seq(std::vector<Expr>(tail_reversed.rbegin(), tail_reversed.rend()));
      }
      Expr member = seq({literal(","), keyed[j - 1]});
      tail_reversed.push_back(properties[j - 1].required ? std::move(member)
                                                         : optional(std::move(member)));
    }
    std::vector<Expr> first_options;
    for (size_t i = 0; i < n && i <= first_required; ++i) {
      first_options.push_back(seq({std::move(keyed[i]), std::move(after[i + 1])}));
    }
    if (first_required == n) {
      first_options.push_back(
          extra ? optional(seq({ref(*extra), star(seq({literal(","), ref(*extra)}))})) : seq({}));
    }
    return seq({literal("{"), either(std::move(first_options)), literal("}")});
  }

  // A key (quotes included) that is none of `names`: a walk down the trie
  // of the names, one rule per node, leaving it at the first character that
  // no name continues with. Characters are written as nlohmann writes them,
  // so one decoded key has one spelling and the comparison is exact.
  StatusOr<Expr> extraKey(const std::vector<std::string>& names, const std::string& pointer) {
    if (names.empty()) return ref(rules_.string());
    struct Node {
      std::map<uint32_t, size_t> children;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t node = 0;
      for (size_t pos = 0; pos < name.size();) {
        uint32_t cp = 0;
        const size_t length = internal::decodeUtf8(name, pos, cp);
        if (length == 0) {
          return invalidArgument("property name " + brief(Json(name)) + " at " + shown(pointer) +
                                 " is not valid UTF-8");
        }
        pos += length;
        auto it = trie[node].children.find(cp);
        if (it == trie[node].children.end()) {
          trie.push_back(Node{});
          it = trie[node].children.emplace(cp, trie.size() - 1).first;
        }
        node = it->second;
      }
      trie[node].terminal = true;
    }
    std::vector<int32_t> rules(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) {
      rules[i] = builder_.declare(ruleName(pointer) + "_key_" + std::to_string(i));
    }
    for (size_t i = 0; i < trie.size(); ++i) {
      const Node& node = trie[i];
      std::vector<Expr> options;
      if (!node.terminal) options.push_back(literal("\""));
      CodePointRanges taken;
      bool escape_taken = false;
      for (const auto& [cp, next] : node.children) {
        std::string text;
        if (needsEscape(cp)) {
          text = canonicalEscape(cp);
        } else {
          internal::appendUtf8(cp, text);
        }
        options.push_back(seq({literal(text), ref(rules[next])}));
        taken.emplace_back(cp, cp);
        escape_taken = escape_taken || needsEscape(cp);
      }
      // Any other character, then anything.
      std::vector<Expr> others;
      CodePointRanges raw_excluded = taken;
      raw_excluded.emplace_back(0, 0x1F);
      raw_excluded.emplace_back('"', '"');
      raw_excluded.emplace_back('\\', '\\');
      appendOption(others, codePoints(complementRanges(raw_excluded)));
      if (!escape_taken) {
        others.push_back(ref(rules_.keyEscape()));
      } else {
        for (uint32_t cp : JsonRules::escapedCodePoints()) {
          if (!node.children.count(cp)) others.push_back(literal(canonicalEscape(cp)));
        }
      }
      options.push_back(seq({either(std::move(others)), ref(rules_.keyRest())}));
      builder_.define(rules[i], alt(std::move(options)));
    }
    return seq({literal("\""), ref(rules[0])});
  }

  // ---- Arrays ----

  StatusOr<Expr> compileArray(const Json& schema, const std::string& pointer, int64_t depth) {
    StatusOr<std::optional<int64_t>> min_items = readCount(schema, "minItems", pointer);
    if (!min_items.isOk()) return min_items.status();
    StatusOr<std::optional<int64_t>> max_items = readCount(schema, "maxItems", pointer);
    if (!max_items.isOk()) return max_items.status();
    const int64_t least = min_items->value_or(0);
    int64_t most = max_items->value_or(Expr::kUnbounded);
    if (most != Expr::kUnbounded && least > most) {
      return invalidArgument(keywordAt("minItems", pointer) + " is " + std::to_string(least) +
                             ", more than maxItems " + std::to_string(most));
    }

    // The tuple part and the schema of the elements after it.
    const Json* tuple = nullptr;
    std::string tuple_keyword;
    const Json* rest = nullptr;
    std::string rest_keyword;
    if (schema.contains("prefixItems")) {
      tuple = &schema["prefixItems"];
      tuple_keyword = "prefixItems";
      if (schema.contains("items")) {
        rest = &schema["items"];
        rest_keyword = "items";
        if (rest->is_array()) {
          return invalidArgument(keywordAt("items", pointer) +
                                 " must be a schema when prefixItems is present, got an array");
        }
      }
    } else if (schema.contains("items") && schema["items"].is_array()) {
      tuple = &schema["items"];
      tuple_keyword = "items";
      if (schema.contains("additionalItems")) {
        rest = &schema["additionalItems"];
        rest_keyword = "additionalItems";
      }
    } else if (schema.contains("items")) {
      rest = &schema["items"];
      rest_keyword = "items";
    }
    if (tuple && !tuple->is_array()) {
      return invalidArgument(keywordAt(tuple_keyword, pointer) +
                             " must be an array of schemas, got " + brief(*tuple));
    }

    std::vector<Expr> elements;
    if (tuple) {
      for (size_t i = 0; i < tuple->size(); ++i) {
        if ((*tuple)[i] == Json(false)) {
          // No array reaches this index.
          most = most == Expr::kUnbounded ? static_cast<int64_t>(i)
                                          : std::min(most, static_cast<int64_t>(i));
          break;
        }
        StatusOr<int32_t> rule =
            compileRule((*tuple)[i], child(pointer, tuple_keyword, i), depth + 1);
        if (!rule.isOk()) return rule.status();
        elements.push_back(ref(*rule));
      }
    }
    std::optional<Expr> rest_element;
    if (!rest) {
      rest_element = ref(rules_.value());
    } else if (*rest != Json(false)) {
      StatusOr<int32_t> rule = compileRule(*rest, child(pointer, rest_keyword), depth + 1);
      if (!rule.isOk()) return rule.status();
      rest_element = ref(*rule);
    }
    const auto k = static_cast<int64_t>(elements.size());
    if (!rest_element) most = most == Expr::kUnbounded ? k : std::min(most, k);
    if (most != Expr::kUnbounded && least > most) {
      return invalidArgument(keywordAt("minItems", pointer) + " is " + std::to_string(least) +
                             " but no array longer than " + std::to_string(most) +
                             " is valid there (" + tuple_keyword + " and " +
                             (rest_keyword.empty() ? "items" : rest_keyword) + ")");
    }
    TANDEM_RETURN_IF_ERROR(countFits(pointer, "minItems", least, "maxItems", most,
                                     most == Expr::kUnbounded ? 0 : most - std::min(most, k)));

    // After j elements (j >= 1): element j + 1 on, each with its comma.
    // Built from the end; every 16 tuple elements the tail becomes a rule,
    // which bounds how deeply expressions nest.
    const auto bounded_minus = [&](int64_t j) {
      return most == Expr::kUnbounded ? most : most - j;
    };
    Expr tail = seq({});
    if (rest_element && (most == Expr::kUnbounded || most > k)) {
      tail = repeat(seq({literal(","), *rest_element}),
                    std::max<int64_t>(0, least - std::max<int64_t>(k, 1)),
                    bounded_minus(std::max<int64_t>(k, 1)));
    }
    for (int64_t j = k - 1; j >= 1; --j) {
      if (most != Expr::kUnbounded && j + 1 > most) {
        tail = seq({});
        continue;
      }
      Expr next = seq({literal(","), elements[static_cast<size_t>(j)], std::move(tail)});
      tail = j >= least ? optional(std::move(next)) : std::move(next);
      if ((k - j) % 16 == 0) {
        tail = ref(builder_.add(ruleName(pointer) + "_tail_" + std::to_string(j), std::move(tail)));
      }
    }
    Expr content = seq({});
    if (most == Expr::kUnbounded || most >= 1) {
      Expr first = k > 0 ? elements[0] : *rest_element;
      content = seq({std::move(first), std::move(tail)});
      if (least == 0) content = optional(std::move(content));
    }
    return seq({literal("["), std::move(content), literal("]")});
  }

  // ---- Strings ----

  StatusOr<Expr> compileString(const Json& schema, const std::string& pointer) {
    const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
    const bool has_pattern = schema.contains("pattern");
    const bool has_format = schema.contains("format");
    if (has_length + has_pattern + has_format > 1) {
      const std::string first =
          has_length ? (schema.contains("minLength") ? "minLength" : "maxLength") : "pattern";
      const std::string second = has_format ? "format" : "pattern";
      return invalidArgument("unsupported JSON Schema keywords " + inQuotes(first) + " and " +
                             inQuotes(second) + " together at " + shown(pointer) +
                             "; supported: one of minLength/maxLength, pattern and format per "
                             "string schema");
    }
    if (has_format) {
      const Json& format = schema["format"];
      const int32_t rule =
          format.is_string() ? rules_.format(format.get_ref<const std::string&>()) : -1;
      if (rule < 0) {
        return invalidArgument("unsupported JSON Schema keyword \"format\" value " + brief(format) +
                               " at " + shown(pointer) +
                               "; supported formats: " + std::string(kSupportedFormats));
      }
      return seq({literal("\""), ref(rule), literal("\"")});
    }
    if (has_pattern) {
      const Json& pattern = schema["pattern"];
      if (!pattern.is_string()) {
        return invalidArgument(keywordAt("pattern", pointer) +
                               " must be a regular expression (a string), got " + brief(pattern));
      }
      const std::string& text = pattern.get_ref<const std::string&>();
      auto it = patterns_.find(text);
      if (it == patterns_.end()) {
        RegexOptions options;
        options.json_string_safe = true;
        options.ecmascript = true;  // JSON Schema's patterns are ECMAScript's
        StatusOr<int32_t> rule =
            addRegexRule(builder_, text, ruleName(pointer) + "_pattern", options);
        if (!rule.isOk()) {
          return Status(rule.status().code(),
                        "pattern at " + shown(pointer) + ": " + rule.status().message());
        }
        it = patterns_.emplace(text, *rule).first;
      }
      return seq({literal("\""), ref(it->second), literal("\"")});
    }
    if (has_length) {
      StatusOr<std::optional<int64_t>> min_length = readCount(schema, "minLength", pointer);
      if (!min_length.isOk()) return min_length.status();
      StatusOr<std::optional<int64_t>> max_length = readCount(schema, "maxLength", pointer);
      if (!max_length.isOk()) return max_length.status();
      const int64_t least = min_length->value_or(0);
      const int64_t most = max_length->value_or(Expr::kUnbounded);
      if (most != Expr::kUnbounded && least > most) {
        return invalidArgument(keywordAt("minLength", pointer) + " is " + std::to_string(least) +
                               ", more than maxLength " + std::to_string(most));
      }
      TANDEM_RETURN_IF_ERROR(countFits(pointer, "minLength", least, "maxLength", most,
                                       most == Expr::kUnbounded ? 0 : most - least));
      return seq({literal("\""), repeat(ref(rules_.character()), least, most), literal("\"")});
    }
    return ref(rules_.string());
  }

  // ---- Integers ----

  // The bound keywords present: minimum, maximum, exclusiveMinimum and
  // exclusiveMaximum (draft 4 spells exclusive bounds as booleans beside
  // minimum and maximum).
  struct BoundKeyword {
    const char* key;
    bool lower;
    bool exclusive;
  };
  static std::vector<BoundKeyword> boundKeywords(const Json& schema) {
    const auto flag = [&](const char* key) {
      return schema.contains(key) && schema[key] == Json(true);
    };
    const BoundKeyword all[] = {{"minimum", true, flag("exclusiveMinimum")},
                                {"maximum", false, flag("exclusiveMaximum")},
                                {"exclusiveMinimum", true, true},
                                {"exclusiveMaximum", false, true}};
    std::vector<BoundKeyword> present;
    for (const BoundKeyword& keyword : all) {
      if (!schema.contains(keyword.key)) continue;
      if (schema[keyword.key].is_boolean() &&
          std::string_view(keyword.key).starts_with("exclusive")) {
        continue;
      }
      present.push_back(keyword);
    }
    return present;
  }

  StatusOr<Expr> compileInteger(const Json& schema, const std::string& pointer) {
    std::optional<int64_t> lo;
    std::optional<int64_t> hi;
    for (const BoundKeyword& keyword : boundKeywords(schema)) {
      StatusOr<int64_t> bound =
          integerBound(schema[keyword.key], keyword.key, pointer, keyword.lower, keyword.exclusive);
      if (!bound.isOk()) return bound.status();
      if (keyword.lower) {
        lo = lo ? std::max(*lo, *bound) : *bound;
      } else {
        hi = hi ? std::min(*hi, *bound) : *bound;
      }
    }
    if (!lo && !hi) return ref(rules_.integer());
    if (lo && hi && *lo > *hi) {
      return invalidArgument("JSON Schema integer bounds at " + shown(pointer) +
                             " leave no value: the least integer allowed is " +
                             std::to_string(*lo) + " and the greatest " + std::to_string(*hi));
    }
    return integerRange(lo, hi);
  }

  // ---- Numbers ----

  StatusOr<Expr> compileNumber(const Json& schema, const std::string& pointer) {
    std::optional<NumberBound> lo;
    std::optional<NumberBound> hi;
    for (const BoundKeyword& keyword : boundKeywords(schema)) {
      StatusOr<Decimal> value = numberBound(schema[keyword.key], keyword.key, pointer);
      if (!value.isOk()) return value.status();
      NumberBound bound{std::move(value).value(), keyword.exclusive};
      std::optional<NumberBound>& kept = keyword.lower ? lo : hi;
      const int order = kept ? compareDecimals(bound.value, kept->value) : 0;
      if (!kept || (keyword.lower ? order > 0 : order < 0)) {
        kept = std::move(bound);
      } else if (order == 0) {
        kept->exclusive = kept->exclusive || bound.exclusive;
      }
    }
    if (!lo && !hi) return ref(rules_.number());
    if (lo && hi) {
      const int order = compareDecimals(lo->value, hi->value);
      if (order > 0 || (order == 0 && (lo->exclusive || hi->exclusive))) {
        return invalidArgument("JSON Schema number bounds at " + shown(pointer) +
                               " leave no value between them");
      }
    }
    return numberRange(lo, hi);
  }

  // A bound of a number, as the decimal its shortest text spells.
  static StatusOr<Decimal> numberBound(const Json& value, const char* key,
                                       const std::string& pointer) {
    constexpr uint64_t kLimit = 1000000000000000000ULL;  // 1e18
    constexpr size_t kMostDecimals = 40;
    const auto out_of_range = [&] {
      return invalidArgument(
          keywordAt(key, pointer) + " must be a number above -1e18 and below 1e18 with at most " +
          std::to_string(kMostDecimals) + " decimals for a number, got " + brief(value));
    };
    Decimal out;
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() >= kLimit) return out_of_range();
      out.whole = value.get<uint64_t>();
      return out;
    }
    if (value.is_number_integer()) {
      const int64_t x = value.get<int64_t>();
      if (x <= -static_cast<int64_t>(kLimit) || x >= static_cast<int64_t>(kLimit)) {
        return out_of_range();
      }
      out.negative = x < 0;
      out.whole = x < 0 ? static_cast<uint64_t>(-x) : static_cast<uint64_t>(x);
      return out;
    }
    if (!value.is_number_float()) return out_of_range();
    const double x = value.get<double>();
    if (!std::isfinite(x) || std::fabs(x) >= 1e18) return out_of_range();
    // The shortest fixed-point text that reads back as x: 0.1 is "0.1", not
    // the double's exact binary value.
    char text[400];
    const std::to_chars_result written =
        std::to_chars(text, text + sizeof text, std::fabs(x), std::chars_format::fixed);
    if (written.ec != std::errc()) return out_of_range();
    const std::string_view digits(text, static_cast<size_t>(written.ptr - text));
    const size_t point = digits.find('.');
    const std::string_view whole = digits.substr(0, point);
    std::from_chars(whole.data(), whole.data() + whole.size(), out.whole);
    if (point != std::string_view::npos) out.fraction = std::string(digits.substr(point + 1));
    while (!out.fraction.empty() && out.fraction.back() == '0') out.fraction.pop_back();
    if (out.fraction.size() > kMostDecimals) return out_of_range();
    out.negative = x < 0 && !out.isZero();
    return out;
  }

  // The least (lower) or greatest (upper) integer a bound allows.
  static StatusOr<int64_t> integerBound(const Json& value, const char* key,
                                        const std::string& pointer, bool lower, bool exclusive) {
    constexpr int64_t kLeast = std::numeric_limits<int64_t>::min();
    constexpr int64_t kGreatest = std::numeric_limits<int64_t>::max();
    const auto out_of_range = [&] {
      return invalidArgument(keywordAt(key, pointer) + " must be a number from " +
                             std::to_string(kLeast) + " to " + std::to_string(kGreatest) +
                             " for an integer, got " + brief(value));
    };
    if (!value.is_number()) return out_of_range();
    if (value.is_number_integer()) {
      if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kGreatest)) {
        return out_of_range();
      }
      const int64_t x = value.get<int64_t>();
      if (!exclusive) return x;
      if ((lower && x == kGreatest) || (!lower && x == kLeast)) return out_of_range();
      return lower ? x + 1 : x - 1;
    }
    const double x = value.get<double>();
    // Doubles of this size are integers; the margin keeps +-1 in range.
    if (!std::isfinite(x) || std::fabs(x) >= 9.2e18) return out_of_range();
    if (lower) return static_cast<int64_t>(exclusive ? std::floor(x) + 1 : std::ceil(x));
    return static_cast<int64_t>(exclusive ? std::ceil(x) - 1 : std::floor(x));
  }

  // A non-negative integer keyword (minItems, maxLength, ...).
  static StatusOr<std::optional<int64_t>> readCount(const Json& schema, const char* key,
                                                    const std::string& pointer) {
    if (!schema.contains(key)) return std::optional<int64_t>();
    const Json& value = schema[key];
    if (value.is_number_unsigned()) {
      return std::optional<int64_t>(static_cast<int64_t>(
          std::min<uint64_t>(value.get<uint64_t>(), std::numeric_limits<int64_t>::max())));
    }
    if (value.is_number_integer() && value.get<int64_t>() >= 0) {
      return std::optional<int64_t>(value.get<int64_t>());
    }
    if (value.is_number_float() && isIntegral(value) && value.get<double>() >= 0 &&
        value.get<double>() < 9.2e18) {
      return std::optional<int64_t>(static_cast<int64_t>(value.get<double>()));
    }
    return invalidArgument(keywordAt(key, pointer) + " must be a non-negative integer, got " +
                           brief(value));
  }

  const Json& root_;
  const JsonSchemaLimits& limits_;
  std::string prefix_;
  GrammarBuilder& builder_;
  JsonRules rules_;
  std::unordered_map<std::string, int32_t> by_pointer_;  // subschema -> its rule
  std::vector<Pending> pending_;                         // $ref targets declared, not compiled
  std::map<std::string, int32_t> patterns_;              // pattern -> its rule
  int64_t nodes_ = 0;
};

}  // namespace

StatusOr<Grammar> compileJsonSchema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaLimits& limits) {
  GrammarBuilder builder;
  SchemaCompiler compiler(builder, schema, limits);
  return compiler.compile();
}

StatusOr<int32_t> addJsonSchemaRule(GrammarBuilder& builder, const nlohmann::ordered_json& schema,
                                    const std::string& name, const JsonSchemaLimits& limits) {
  SchemaCompiler compiler(builder, schema, limits, name);
  return compiler.addRules();
}

int32_t addAnyJsonObjectRule(GrammarBuilder& builder) { return JsonRules(builder).object(); }

Grammar anyJsonObjectGrammar() {
  GrammarBuilder builder;
  const int32_t root = addAnyJsonObjectRule(builder);
  StatusOr<Grammar> grammar = builder.build(root);
  TANDEM_CHECK(grammar.isOk(), grammar.status().message());
  return std::move(grammar).value();
}

}  // namespace tandem::structured
