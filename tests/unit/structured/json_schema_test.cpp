#include "common/structured/json_schema.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/structured/matcher.h"

namespace tandem::structured {
namespace {

using Json = nlohmann::ordered_json;

std::string numbered(std::string_view prefix, int64_t n) {
  std::string out(prefix);
  out += std::to_string(n);
  return out;
}

StatusOr<Grammar> compileText(const std::string& schema, const JsonSchemaLimits& limits = {}) {
  return compileJsonSchema(Json::parse(schema), limits);
}

// Every text in `accepted` is derived by the grammar of `schema` and is
// valid JSON; none in `refused` is derived.
void expectLanguage(const std::string& schema, const std::vector<std::string>& accepted,
                    const std::vector<std::string>& refused) {
  SCOPED_TRACE(schema);
  StatusOr<Grammar> grammar = compileText(schema);
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  for (const std::string& text : accepted) {
    EXPECT_TRUE(Json::accept(text)) << "test bug, not JSON: " << text;
    EXPECT_TRUE(grammarAccepts(*grammar, text)) << "should accept: " << text;
  }
  for (const std::string& text : refused) {
    EXPECT_FALSE(grammarAccepts(*grammar, text)) << "should refuse: " << text;
  }
}

// The schema is refused with `code`, and the message holds every one of
// `parts`.
void expectError(const std::string& schema, StatusCode code, const std::vector<std::string>& parts,
                 const JsonSchemaLimits& limits = {}) {
  SCOPED_TRACE(schema);
  StatusOr<Grammar> grammar = compileText(schema, limits);
  ASSERT_FALSE(grammar.isOk());
  EXPECT_EQ(grammar.status().code(), code) << grammar.status().message();
  for (const std::string& part : parts) {
    EXPECT_NE(grammar.status().message().find(part), std::string::npos)
        << "missing " << part << " in: " << grammar.status().message();
  }
}

TEST(JsonSchema, ToolCallSchema) {
  expectLanguage(
      R"({"type":"object","properties":{"location":{"type":"string"},
          "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]})",
      {R"({"location":"Paris"})", R"({"location":"Paris","unit":"celsius"})",
       R"({"location":"","unit":"fahrenheit"})", R"({"location":"a\"b\\c\n\u00e9\/é😀"})"},
      {R"({})", R"({"unit":"celsius"})", R"({"unit":"celsius","location":"Paris"})",
       R"({"location":"Paris","unit":"kelvin"})", R"({ "location":"Paris"})",
       R"({"location": "Paris"})", R"({"location":"Paris",})", R"({"location":"Paris"} )",
       R"({"location":"Paris"}
)",
       R"({"location":"Paris","extra":1})", R"({"location":1})", R"({"location":"a"b"})",
       R"({"location":"\x"})", "{\"location\":\"tab\there\"}", R"({"location":"Paris")",
       R"({"location":"Paris","location":"Rome"})"});
}

TEST(JsonSchema, EverySubsetOfOptionalPropertiesInOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
          "c":{"type":"integer"}}})";
  std::vector<std::string> accepted;
  for (int mask = 0; mask < 8; ++mask) {
    std::string text = "{";
    for (int i = 0; i < 3; ++i) {
      if (!(mask & (1 << i))) continue;
      if (text.size() > 1) text += ",";
      text += '"';
      text += static_cast<char>('a' + i);
      text += "\":";
      text += std::to_string(i);
    }
    accepted.push_back(text + "}");
  }
  expectLanguage(schema, accepted,
                 {R"({,"a":1})", R"({"a":1,})", R"({"a":1,,"b":2})", R"({,})", R"({"a":1,"a":1})",
                  R"({"b":1,"a":1})", R"({"c":1,"b":1})", R"({"a":1"b":2})",
                  R"({"a":1,"b":2,"c":3,"a":4})", R"({"d":1})"});
}

TEST(JsonSchema, OptionalAroundRequiredProperties) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"},
          "c":{"type":"null"},"d":{"type":"null"}},"required":["b","d"]})";
  expectLanguage(schema,
                 {R"({"b":null,"d":null})", R"({"a":null,"b":null,"d":null})",
                  R"({"b":null,"c":null,"d":null})", R"({"a":null,"b":null,"c":null,"d":null})"},
                 {R"({"a":null,"d":null})", R"({"b":null})", R"({"a":null,"b":null})",
                  R"({,"b":null,"d":null})", R"({"b":null,,"d":null})", R"({})",
                  R"({"b":null,"d":null,"c":null})"});
}

// The comma logic is linear: twice the optional properties, about twice the
// grammar.
TEST(JsonSchema, OptionalPropertiesGrowTheGrammarLinearly) {
  const auto size = [](int n) {
    Json properties = Json::object();
    for (int i = 0; i < n; ++i) properties[numbered("p", i)] = {{"type", "integer"}};
    StatusOr<Grammar> grammar =
        compileJsonSchema(Json{{"type", "object"}, {"properties", properties}});
    EXPECT_TRUE(grammar.isOk()) << grammar.status().message();
    return grammar.isOk() ? grammar->elements.size() : 0;
  };
  const size_t forty = size(40);
  const size_t eighty = size(80);
  ASSERT_GT(forty, 0u);
  EXPECT_LT(eighty, forty * 5 / 2) << forty << " elements for 40, " << eighty << " for 80";
  // Every third property present, the others passed over.
  Json properties = Json::object();
  std::string text = "{";
  for (int i = 0; i < 40; ++i) {
    properties[numbered("p", i)] = {{"type", "integer"}};
    if (i % 3 != 0) continue;
    if (text.size() > 1) text += ",";
    text += numbered("\"p", i) + numbered("\":", i);
  }
  StatusOr<Grammar> grammar =
      compileJsonSchema(Json{{"type", "object"}, {"properties", properties}});
  ASSERT_TRUE(grammar.isOk());
  EXPECT_TRUE(grammarAccepts(*grammar, text + "}"));
  EXPECT_FALSE(grammarAccepts(*grammar, text + ",}"));
}

TEST(JsonSchema, NestedObjectsAndArrays) {
  expectLanguage(
      R"({"type":"object","properties":{
          "user":{"type":"object","properties":{"name":{"type":"string"},
                  "tags":{"type":"array","items":{"type":"string"}}},"required":["name","tags"]},
          "scores":{"type":"array","items":{"type":"number"}}},
          "required":["user","scores"]})",
      {R"({"user":{"name":"ann","tags":[]},"scores":[]})",
       R"({"user":{"name":"ann","tags":["x","y"]},"scores":[1,-2.5,3e10]})"},
      {R"({"user":{"name":"ann"},"scores":[]})",
       R"({"user":{"name":"ann","tags":[1]},"scores":[]})",
       R"({"user":{"name":"ann","tags":[]},"scores":["1"]})",
       R"({"user":{"name":"ann","tags":[ ]},"scores":[]})",
       R"({"user":{"name":"ann","tags":[]},"scores":[1,]})"});
}

TEST(JsonSchema, ArrayLengthBounds) {
  expectLanguage(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4})",
                 {"[1,2]", "[1,2,3]", "[1,2,3,4]"},
                 {"[]", "[1]", "[1,2,3,4,5]", "[1,,2]", "[1,2,]", "[,1,2]", "[1, 2]"});
  expectLanguage(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]", "[null]"});
  expectLanguage(R"({"type":"array","maxItems":1})", {"[]", "[1]", R"([{"a":[]}])"},
                 {"[1,2]", "[,]"});
  expectLanguage(R"({"type":"array","minItems":3})", {"[1,2,3]", R"([1,"x",null,true,[]])"},
                 {"[1,2]", "[]"});
  expectLanguage(R"({"type":"array","items":false})", {"[]"}, {"[1]"});
}

TEST(JsonSchema, PrefixItems) {
  expectLanguage(
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
      {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", "[1]", R"([1,"a"])", R"(["a",])"});
  expectLanguage(
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
          "items":{"type":"boolean"},"minItems":2,"maxItems":4})",
      {R"(["a",1])", R"(["a",1,true])", R"(["a",1,true,false])"},
      {R"(["a"])", R"(["a",1,true,false,true])", R"(["a",1,2])"});
  // Without items: anything after the tuple.
  expectLanguage(R"({"type":"array","prefixItems":[{"const":1}],"minItems":1})",
                 {"[1]", R"([1,"x",[2]])"}, {"[]", "[2]"});
  // The older tuple form: items as an array, additionalItems for the rest.
  expectLanguage(
      R"({"type":"array","items":[{"type":"null"},{"type":"boolean"}],"additionalItems":false})",
      {"[]", "[null]", "[null,true]"}, {"[null,true,null]", "[true]"});
  // A long tuple (its tail is split into rules) with a minimum in the middle.
  Json prefix = Json::array();
  for (int i = 0; i < 40; ++i) prefix.push_back({{"const", i}});
  StatusOr<Grammar> grammar = compileJsonSchema(
      Json{{"type", "array"}, {"prefixItems", prefix}, {"items", false}, {"minItems", 20}});
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  for (int n = 0; n <= 41; ++n) {
    std::string text = "[";
    for (int i = 0; i < n; ++i) text += numbered(i ? "," : "", i);
    EXPECT_EQ(grammarAccepts(*grammar, text + "]"), n >= 20 && n <= 40) << n;
  }
}

TEST(JsonSchema, StringLengthCountsCharacters) {
  expectLanguage(R"({"type":"string","minLength":2,"maxLength":3})",
                 {R"("ab")", R"("abc")", R"("a\n")", R"("\"\\")", R"("é😀")", R"("\u00e9x")",
                  R"("日本語")", R"("\/\/\/")"},
                 {R"("a")", R"("abcd")", R"("\n")", R"("")", R"("é")", R"("日本語x")", R"("\u12")",
                  R"("\ud83d\ude00")", "\"a\x01\"", R"("\q1")", R"("a\u00e9\u00e9\u00e9")"});
  expectLanguage(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
}

TEST(JsonSchema, StringCharacters) {
  expectLanguage(R"({"type":"string"})",
                 {R"("")", R"("plain")", R"("\"\\\/\b\f\n\r\t")", R"("\u0000\uFFFF\uabcd\uE000")",
                  "\"\x7F\"", R"("😀")"},
                 {R"(")", R"("a"")", R"("\u00")", R"("\uD800")", R"("\udfff")", "\"\n\"",
                  "\"\x1F\"", "\"\xC3\"", "\"\xED\xA0\x80\"", R"('a')"});
}

TEST(JsonSchema, Numbers) {
  expectLanguage(R"({"type":"number"})",
                 {"0", "-0", "3", "1.5", "-12.25e+10", "1E5", "0.001", "2e-3"},
                 {"01", "1.", ".5", "+1", "1e", "NaN", "--1", "1.5.2", "0x1", "\"1\""});
  expectLanguage(R"({"type":"integer"})", {"0", "-0", "42", "-9007199254740993"},
                 {"01", "1.0", "1e3", "-", "+3"});
}

// Integer bounds against a reference: every value in a window.
TEST(JsonSchema, IntegerRangesMatchTheirBoundsExactly) {
  struct Range {
    std::optional<int64_t> lo;
    std::optional<int64_t> hi;
  };
  const std::vector<Range> ranges = {{0, 0},     {1, 100},    {-5, 12},   {-100, -7},
                                     {37, 4321}, {-999, 999}, {5, {}},    {{}, -3},
                                     {{}, 250},  {-17, {}},   {0, {}},    {1, {}},
                                     {-1, 0},    {99, 100},   {100, 999}, {-1000, -1000}};
  for (const Range& range : ranges) {
    Json schema = {{"type", "integer"}};
    if (range.lo) schema["minimum"] = *range.lo;
    if (range.hi) schema["maximum"] = *range.hi;
    SCOPED_TRACE(schema.dump());
    StatusOr<Grammar> grammar = compileJsonSchema(schema);
    ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
    for (int64_t v = -1200; v <= 5000; ++v) {
      const bool inside = (!range.lo || v >= *range.lo) && (!range.hi || v <= *range.hi);
      ASSERT_EQ(grammarAccepts(*grammar, std::to_string(v)), inside) << v;
    }
    for (const char* text : {"00", "007", "-0", "-00", "1.0", "+1", "0100"}) {
      EXPECT_FALSE(grammarAccepts(*grammar, text)) << text;
    }
  }
}

TEST(JsonSchema, IntegerBoundForms) {
  expectLanguage(R"({"type":"integer","minimum":1,"maximum":100})", {"1", "9", "10", "99", "100"},
                 {"0", "101", "007", "-1", "1000", "1.0", "01"});
  expectLanguage(R"({"type":"integer","minimum":0})", {"0", "7", "123456789012345678901234"},
                 {"-1", "-0", "01"});
  expectLanguage(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"},
                 {"0", "10"});
  // Draft 4: booleans beside minimum and maximum.
  expectLanguage(
      R"({"type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":3,"exclusiveMaximum":false})",
      {"1", "3"}, {"0", "4"});
  // Fractional bounds round inwards.
  expectLanguage(R"({"type":"integer","minimum":0.5,"maximum":2.5})", {"1", "2"}, {"0", "3"});
  expectLanguage(
      R"({"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807})",
      {"9223372036854775807", "-9223372036854775808", "0"},
      {"9223372036854775808", "-9223372036854775809"});
  expectError(R"({"type":"integer","minimum":5,"maximum":3})", StatusCode::kInvalidArgument,
              {"(root)", "5", "3"});
  expectError(R"({"type":"integer","minimum":"1"})", StatusCode::kInvalidArgument,
              {"\"minimum\"", "(root)"});
  expectError(R"({"type":"integer","maximum":1e30})", StatusCode::kInvalidArgument,
              {"\"maximum\"", "(root)"});
  // Integer bounds do not apply to other types.
  expectLanguage(R"({"type":["integer","string"],"minimum":3})", {"3", R"("1")"}, {"2"});
}

// Number bounds against a reference: every text of a grid, compared in
// ten-thousandths (the bounds have at most three decimals, the texts four).
TEST(JsonSchema, NumberRangesMatchTheirBoundsExactly) {
  struct Range {
    std::optional<double> lo;
    std::optional<double> hi;
    bool lo_exclusive = false;
    bool hi_exclusive = false;
  };
  const std::vector<Range> ranges = {{0, 1},
                                     {0, 1, true, true},
                                     {0.5, 2.25},
                                     {-2.25, 0.5, true, false},
                                     {-1, -0.25, false, true},
                                     {-0.001, 0.001},
                                     {1.1, 1.1},
                                     {12.5, {}},
                                     {{}, -3.75, false, true},
                                     {0, {}, true},
                                     {{}, 0},
                                     {{}, 0, false, true},
                                     {0.05, 0.75},
                                     {99.9, 101.01},
                                     {-10, 10},
                                     {-0.5, {}, true},
                                     {2.5, 3, true, true},
                                     {0.999, 1.001, true, true}};
  const std::vector<uint64_t> wholes = {0, 1, 2, 3, 9, 10, 11, 12, 13, 99, 100, 101, 102, 1000};
  const std::vector<std::string> fractions = {
      "",     "0",  "00",   "001", "0010", "0009", "05", "1",  "10",  "25",   "2499", "2501", "5",
      "4999", "50", "5001", "7",   "75",   "7501", "9",  "99", "999", "9989", "9999", "0011", "01"};
  const auto scaled = [](double x) { return static_cast<int64_t>(std::llround(x * 10000)); };
  for (const Range& range : ranges) {
    Json schema = {{"type", "number"}};
    if (range.lo) schema[range.lo_exclusive ? "exclusiveMinimum" : "minimum"] = *range.lo;
    if (range.hi) schema[range.hi_exclusive ? "exclusiveMaximum" : "maximum"] = *range.hi;
    SCOPED_TRACE(schema.dump());
    StatusOr<Grammar> grammar = compileJsonSchema(schema);
    ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
    for (bool negative : {false, true}) {
      for (uint64_t whole : wholes) {
        for (const std::string& fraction : fractions) {
          std::string text = (negative ? "-" : "") + std::to_string(whole);
          if (!fraction.empty()) text += "." + fraction;
          std::string padded = fraction;
          padded.resize(4, '0');
          int64_t value = static_cast<int64_t>(whole) * 10000 + std::stoll(padded);
          if (negative) value = -value;
          bool inside = !(negative && value == 0);  // -0 is written 0
          if (range.lo) {
            inside = inside &&
                     (range.lo_exclusive ? value > scaled(*range.lo) : value >= scaled(*range.lo));
          }
          if (range.hi) {
            inside = inside &&
                     (range.hi_exclusive ? value < scaled(*range.hi) : value <= scaled(*range.hi));
          }
          ASSERT_EQ(grammarAccepts(*grammar, text), inside) << text;
        }
      }
    }
    for (const char* text : {"01", "1.", ".5", "-", "+1", "1e0", "1E0", "00.5", "--1", "0x1"}) {
      EXPECT_FALSE(grammarAccepts(*grammar, text)) << text;
    }
  }
}

TEST(JsonSchema, NumberBoundForms) {
  // Pydantic's confloat(ge=0, le=1).
  expectLanguage(R"({"type":"number","minimum":0,"maximum":1})",
                 {"0", "0.5", "1", "1.0", "0.123456789"}, {"1.01", "-0.1", "2", "1e-3", "-0"});
  // Draft 4 booleans; a bound given as an integer or as 1e-2.
  expectLanguage(
      R"({"type":"number","minimum":0,"exclusiveMinimum":true,"maximum":1e-2,"exclusiveMaximum":false})",
      {"0.01", "0.001", "0.0099"}, {"0", "0.0", "0.011"});
  // 0.1 is the decimal 0.1, not the double's binary value.
  expectLanguage(R"({"type":"number","maximum":0.1})", {"0.1", "0.1000", "-5"}, {"0.1001"});
  // Of several lower bounds the greatest holds; at a tie the exclusive one.
  expectLanguage(R"({"type":"number","minimum":2,"exclusiveMinimum":2})", {"2.001"}, {"2"});
  // Without `type`, bounds make the value a number; with another type beside,
  // they bound the number only.
  expectLanguage(R"({"minimum":-1.5})", {"-1.5", "7.25"}, {"-1.51", R"("x")"});
  expectLanguage(R"({"type":["number","string"],"maximum":3})", {"3", "2.5", R"("9")"}, {"3.5"});
  expectError(R"({"type":"number","minimum":2,"exclusiveMaximum":2})", StatusCode::kInvalidArgument,
              {"(root)", "leave no value"});
  expectError(R"({"type":"number","maximum":1e30})", StatusCode::kInvalidArgument,
              {"\"maximum\"", "(root)", "1e18"});
  expectError(R"({"type":"number","minimum":1e-45})", StatusCode::kInvalidArgument,
              {"\"minimum\"", "40 decimals"});
  expectError(R"({"type":"number","minimum":"0"})", StatusCode::kInvalidArgument,
              {"\"minimum\"", "(root)"});
}

TEST(JsonSchema, EnumAndConst) {
  expectLanguage(
      R"({"enum":["a\"b","back\\slash","new\nline","é",1,2.5,null,true,{"k":[1,2]},[]]})",
      {R"("a\"b")", R"("back\\slash")", R"("new\nline")", R"("é")", "1", "2.5", "null", "true",
       R"({"k":[1,2]})", "[]"},
      {R"("a"b")", R"("back\slash")", "\"new\nline\"", R"("\u00e9")", "2", R"({"k": [1,2]})",
       "false", R"("c")"});
  expectLanguage(R"({"const":"x"})", {R"("x")"}, {R"("y")", "x"});
  expectLanguage(R"({"const":{"b":1,"a":[null]}})", {R"({"b":1,"a":[null]})"},
                 {R"({"a":[null],"b":1})"});
  // `type` filters the values.
  expectLanguage(R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"});
  expectLanguage(R"({"type":"integer","enum":[1,1.0,1.5,"1"]})", {"1", "1.0"}, {"1.5", R"("1")"});
  expectLanguage(R"({"enum":["a","b"],"const":"b"})", {R"("b")"}, {R"("a")"});
  expectError(R"({"type":"string","enum":[1,2]})", StatusCode::kInvalidArgument,
              {"\"enum\"", "(root)"});
  expectError(R"({"enum":[]})", StatusCode::kInvalidArgument, {"\"enum\"", "(root)"});
  // String and number keywords beside the values keep those they allow;
  // each applies to its own type only.
  expectLanguage(R"({"enum":["a","bb","ccc",7,null],"maxLength":2,"pattern":"^[ab]+$"})",
                 {R"("a")", R"("bb")", "7", "null"}, {R"("ccc")"});
  expectLanguage(R"({"enum":[0.5,1,2.5,"x"],"minimum":1,"exclusiveMaximum":2.5})", {"1", R"("x")"},
                 {"0.5", "2.5"});
  expectLanguage(R"({"const":"2024-01-31","format":"date"})", {R"("2024-01-31")"}, {});
  expectError(R"({"enum":["abc","defg"],"maxLength":2})", StatusCode::kInvalidArgument,
              {"\"enum\" at (root)", "keywords beside it"});
  expectError(R"({"const":"2024-02-30","format":"date"})", StatusCode::kInvalidArgument,
              {"\"const\" at (root)", "keywords beside it"});
  expectError(R"({"properties":{"p":{"enum":["a"],"format":"color"}}})",
              StatusCode::kInvalidArgument, {"\"color\"", "beside \"enum\" at /properties/p"});
  expectError(R"({"enum":[1],"maximum":"3"})", StatusCode::kInvalidArgument,
              {"\"maximum\" at (root)", "must be a number"});
  // Digit by digit, as the number grammar: 2^53 + 1 is past 2^53 although
  // both are the same double.
  expectLanguage(R"({"enum":[9007199254740993,9007199254740992],"maximum":9007199254740992})",
                 {"9007199254740992"}, {"9007199254740993"});
}

TEST(JsonSchema, UnionsAndBranches) {
  expectLanguage(R"({"type":["integer","null"]})", {"5", "null", "-3"}, {R"("5")", "1.5", "true"});
  expectLanguage(R"({"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"x"})",
                 {R"("s")", "null"}, {"1", "{}"});
  expectLanguage(R"({"oneOf":[{"type":"boolean"},{"type":"array","items":{"type":"boolean"}}]})",
                 {"true", "[false,true]"}, {"[1]", "1"});
  expectLanguage(R"({"allOf":[{"type":"integer","minimum":3}]})", {"3"}, {"2"});
  expectLanguage(R"({"anyOf":[false,{"type":"null"}]})", {"null"}, {"1"});
  expectLanguage(R"({"type":["number","integer"]})", {"1", "1.5"}, {"null"});
}

TEST(JsonSchema, AnyValue) {
  const std::vector<std::string> values = {"null",
                                           "true",
                                           "false",
                                           "0",
                                           "-1.5e3",
                                           R"("s")",
                                           "[]",
                                           "{}",
                                           R"({"a":[1,{"b":null}]})",
                                           R"([[],[[{}]]])"};
  const std::vector<std::string> refused = {"", " 1", "nul", "[1,]", R"({"a"})", "{1:2}", "[1 ]"};
  expectLanguage("true", values, refused);
  expectLanguage("{}", values, refused);
  expectLanguage(R"({"description":"anything","x-vendor":{"type":"integer"},"$comment":"c"})",
                 values, refused);
}

TEST(JsonSchema, TypeFromKeywordsWhenTypeIsMissing) {
  expectLanguage(R"({"properties":{"a":{"type":"integer"}},"required":["a"]})", {R"({"a":1})"},
                 {"1", R"("a")", "{}"});
  expectLanguage(R"({"items":{"type":"integer"}})", {"[1,2]"}, {"{}", "1"});
  expectLanguage(R"({"maxLength":1})", {R"("a")"}, {R"("ab")", "1"});
  // format too: a string in the format (JSON-Schema-Test-Suite format.json).
  expectLanguage(R"({"format":"ipv4"})", {R"("10.0.0.1")"}, {R"("ind de ")", R"("1.2.3")", "1"});
  expectLanguage(R"({"format":"date"})", {R"("2024-02-29")"}, {R"("soon")", "null"});
  // Type-specific keywords of other types are ignored.
  expectLanguage(R"({"type":"integer","minLength":5,"properties":{"a":false}})", {"1"}, {"\"a\""});
}

TEST(JsonSchema, RecursiveRefs) {
  const std::string tree =
      R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
          "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
          "required":["value","children"]}},"$ref":"#/$defs/node"})";
  expectLanguage(
      tree,
      {R"({"value":1,"children":[]})",
       R"({"value":1,"children":[{"value":2,"children":[]},{"value":3,"children":[{"value":4,"children":[]}]}]})"},
      {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})",
       R"({"value":1,"children":[1]})"});
  expectLanguage(R"({"type":"object","properties":{"next":{"$ref":"#"},"v":{"type":"integer"}}})",
                 {R"({})", R"({"next":{"next":{"v":1}},"v":2})"}, {R"({"next":1})"});
  // Older `definitions`, escaped pointer tokens, %-escapes, and a ref into
  // properties.
  expectLanguage(
      R"({"definitions":{"a/b":{"type":"integer"},"c~d":{"type":"boolean"},"e f":{"type":"null"}},
          "type":"object","properties":{
            "x":{"$ref":"#/definitions/a~1b"},"y":{"$ref":"#/definitions/c~0d"},
            "z":{"$ref":"#/definitions/e%20f"},"w":{"$ref":"#/properties/x"}},
          "required":["x","y","z","w"]})",
      {R"({"x":1,"y":true,"z":null,"w":2})"}, {R"({"x":true,"y":true,"z":null,"w":2})"});
  // Annotations beside $ref are fine.
  expectLanguage(R"({"$defs":{"i":{"type":"integer"}},"$ref":"#/$defs/i","description":"d"})",
                 {"1"}, {"true"});
}

TEST(JsonSchema, Formats) {
  const auto check = [](const std::string& format, const std::vector<std::string>& good,
                        const std::vector<std::string>& bad) {
    std::vector<std::string> accepted;
    std::vector<std::string> refused;
    for (const std::string& text : good) accepted.push_back("\"" + text + "\"");
    for (const std::string& text : bad) refused.push_back("\"" + text + "\"");
    expectLanguage(R"({"type":"string","format":")" + format + R"("})", accepted, refused);
  };
  check("date",
        {"2024-02-29", "0001-01-01", "9999-12-31", "2024-10-30", "2000-02-29", "0400-02-29",
         "0004-02-29", "0010-05-06", "1996-02-29", "2023-02-28", "2024-04-30", "2024-07-31",
         "2024-08-31"},
        // No year 0 (Python's date, and so pydantic and jsonschema, has none).
        {"0000-02-29", "0000-05-06", "2024-13-01", "2024-00-10", "2024-01-32", "2024-01-00",
         "24-01-01", "2024-1-01", "2024/01/01", "", "2023-02-29", "1900-02-29", "2100-02-29",
         "2024-02-30", "2024-04-31", "2024-06-31", "2024-09-31", "2024-11-31"});
  check("time", {"12:34:56Z", "23:59:59.123+05:30", "00:00:00-12:00", "08:00:00.5Z"},
        {"24:00:00Z", "12:60:00Z", "12:34:56", "12:34Z", "12:34:56+5:30", "12:34:56.Z"});
  check("date-time", {"2024-01-31T08:00:00Z", "1999-12-31T23:59:59.999+01:00"},
        {"2024-01-31 08:00:00Z", "2024-01-31T08:00:00", "2024-01-31"});
  check("uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
        {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
         "g23e4567-e89b-12d3-a456-426614174000"});
  check("email", {"john.doe@example.com", "a+b@mail.example.org", "x_y@a-b.io"},
        {"a@b", "@example.com", "a..b@example.com", ".a@example.com", "a@-x.com", "a b@x.com",
         "a@@x.com"});
  check("ipv4", {"0.0.0.0", "255.255.255.255", "192.168.1.10", "10.0.99.249"},
        {"256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-4", "300.0.0.0"});
  const std::string label63(63, 'a');
  const std::string label30(30, 'b');
  const std::string host8 = label30 + "." + label30 + "." + label30 + "." + label30 + "." +
                            label30 + "." + label30 + "." + label30 + "." + label30;
  check("hostname",
        {"example.com", "a-b.c", "localhost", "x1", label63 + ".com",
         label63 + "." + label63 + "." + label63, "s3.dualstack.us-east-1.amazonaws.com", host8},
        {"-a.com", "a-.com", "a..b", ".a", "a.", label63 + "a.com", "a_b.com",
         // Past 253 characters; and what the subset leaves out: a fourth
         // label beside one longer than 30 characters, a ninth label.
         host8 + "." + label30, label63 + ".a.b.c", "a.b.c.d.e.f.g.h.i"});
  check("uri",
        {"https://example.com/path?q=1&r=%20#frag", "mailto:ann@example.com", "urn:isbn:0451",
         "x:/", "file:///etc/hosts", "http://user:pw@host:8080/a/b?c=d/e?#f/g?", "tel:+1-555",
         "http://", "a:b//c"},
        {"no-scheme", "http://a b", "1http://x", "http://x/%zz", "://x",
         // Brackets outside an IP literal, a second #, a port not of digits,
         // an empty path without authority.
         "http://x/[y]", "a:b]", "a:b#c#d", "http://x:8a/", "x:", "x:?q", "x:#f"});
  expectError(R"({"type":"object","properties":{"ip":{"type":"string","format":"ipv6"}}})",
              StatusCode::kInvalidArgument,
              {"\"format\"", "\"ipv6\"", "/properties/ip", "date, time, date-time"});
  // format applies to strings only.
  expectLanguage(R"({"type":"integer","format":"int32"})", {"1"}, {});
}

TEST(JsonSchema, Pattern) {
  expectLanguage(R"({"type":"string","pattern":"^[a-z]+\\d{2}$"})", {R"("abc12")", R"("z00")"},
                 {R"("abc1")", R"("ABC12")", R"("abc123")", R"("12")"});
  // The text stands unescaped in the JSON string: classes never produce a
  // quote or a backslash.
  expectLanguage(R"({"type":"string","pattern":"[^x]+"})", {R"("abc")"},
                 {R"("a"b")", R"("a\b")", R"("x")"});
  expectError(R"({"type":"object","properties":{"p":{"type":"string","pattern":"(a)\\1"}}})",
              StatusCode::kInvalidArgument, {"pattern at /properties/p: "});
}

TEST(JsonSchema, AdditionalProperties) {
  const std::string open =
      R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"null"}},
          "additionalProperties":true})";
  expectLanguage(
      open,
      {R"({})", R"({"a":1})", R"({"a":1,"x":{"y":[1]}})", R"({"x":1,"y":"z"})",
       R"({"a":1,"ab":null,"abc":1,"":2,"b\"c":3,"é":4,"a\n":5})", R"({"A":1})"},
      {R"({"a":1,"a":2})", R"({"x":1,"a":1})", R"({"a":1,"ab":1})", R"({"a":1,"\u0061":2})",
       R"({"x":1,"ab":null})", R"({"a":1,"x":})", R"({"a":1,,"x":2})"});
  expectLanguage(
      R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"],
          "additionalProperties":{"type":"integer"}})",
      {R"({"a":"s"})", R"({"a":"s","x":1,"y":2})"},
      {R"({"a":"s","x":"t"})", R"({"x":1})", R"({"a":"s","a":1})"});
  // Default: closed when properties are declared, open when none are.
  expectLanguage(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})", "{}"},
                 {R"({"a":1,"b":2})", R"({"b":2})"});
  expectLanguage(R"({"type":"object","properties":{}})", {"{}"}, {R"({"b":2})"});
  expectLanguage(R"({"type":"object"})", {"{}", R"({"b":[2,{"c":null}]})"}, {"[]"});
  expectLanguage(R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"b":2})"});
  expectLanguage(R"({"type":"object","additionalProperties":{"type":"boolean"}})",
                 {"{}", R"({"x":true,"y":false})"}, {R"({"x":1})"});
  // A required name missing from properties takes any value, or what
  // additionalProperties allows; with additionalProperties false no object
  // matches: refused.
  expectLanguage(R"({"type":"object","required":["x"]})", {R"({"x":1})", R"({"x":{"y":[]}})"},
                 {"{}", R"({"x":1,"y":2})"});
  expectLanguage(R"({"type":"object","required":["zz"],"additionalProperties":{"type":"integer"}})",
                 {R"({"zz":3})", R"({"zz":3,"b":4})"},
                 {R"({"zz":1.5})", R"({"zz":null})", R"({"zz":false})", "{}"});
  expectError(
      R"({"properties":{"a":{"type":"integer"}},"required":["a","zz"],"additionalProperties":false})",
      StatusCode::kInvalidArgument,
      {"property \"zz\" is required at", "additionalProperties is false", "no object can match"});
  // A false property can never appear, not even as an extra member.
  expectLanguage(
      R"({"type":"object","properties":{"a":false,"b":{"type":"null"}},"additionalProperties":true})",
      {R"({"b":null})", R"({"c":1})"}, {R"({"a":1})", R"({"b":null,"a":1})"});
}

TEST(JsonSchema, AnyJsonObject) {
  const Grammar grammar = anyJsonObjectGrammar();
  for (const char* text : {"{}", R"({"a":[1,{"b":null}],"c":"d"})", R"({"a":1,"a":2})",
                           R"({"x":{"y":{"z":[true,false,-0.5e1]}}})"}) {
    EXPECT_TRUE(grammarAccepts(grammar, text)) << text;
  }
  for (const char* text : {"[]", "1", R"({"a"})", "{ }", R"({"a": 1})", R"({a:1})", "", "{}{}"}) {
    EXPECT_FALSE(grammarAccepts(grammar, text)) << text;
  }
}

TEST(JsonSchema, RefusedKeywordsNameKeywordAndPointer) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"multipleOf", "2"},
      {"minProperties", "1"},
      {"maxProperties", "1"},
      {"patternProperties", R"({"^a":{}})"},
      {"propertyNames", "{}"},
      {"dependentRequired", "{}"},
      {"dependentSchemas", "{}"},
      {"dependencies", "{}"},
      {"if", "{}"},
      {"then", "{}"},
      {"else", "{}"},
      {"not", "{}"},
      {"uniqueItems", "true"},
      {"contains", "{}"},
      {"minContains", "1"},
      {"maxContains", "1"},
      {"unevaluatedProperties", "false"},
      {"unevaluatedItems", "false"},
      {"$dynamicRef", R"("#x")"},
      {"$recursiveRef", R"("#")"}};
  for (const auto& [keyword, value] : refused) {
    expectError(R"({"type":"object","properties":{"p~/q":{"type":"string",")" + keyword + R"(":)" +
                    value + "}}}",
                StatusCode::kInvalidArgument,
                {"unsupported JSON Schema keyword \"" + keyword + "\" at /properties/p~0~1q",
                 "supported: type,"});
    expectError(R"({")" + keyword + R"(":)" + value + "}", StatusCode::kInvalidArgument,
                {"\"" + keyword + "\" at (root)"});
  }
  // uniqueItems false constrains nothing.
  expectLanguage(R"({"type":"array","uniqueItems":false})", {"[1,1]"}, {});
}

TEST(JsonSchema, OtherErrorsNameKeywordAndPointer) {
  expectError(R"({"type":"object","properties":{"age":{"type":"number","minimum":[0]}}})",
              StatusCode::kInvalidArgument, {"\"minimum\"", "/properties/age"});
  expectError(R"({"allOf":[{"type":"string"},{"minLength":1}]})", StatusCode::kInvalidArgument,
              {"\"allOf\"", "(root)", "2 subschemas", "exactly one"});
  expectError(R"({"type":"object","properties":{"x":{"$ref":"#/$defs/missing"}}})",
              StatusCode::kInvalidArgument, {"$ref \"#/$defs/missing\"", "/properties/x"});
  expectError(R"({"$ref":"other.json#/x"})", StatusCode::kInvalidArgument,
              {"$ref \"other.json#/x\"", "(root)"});
  expectError(R"({"$ref":"#anchor"})", StatusCode::kInvalidArgument, {"$ref \"#anchor\""});
  expectError(R"({"$defs":{"a":[1]},"$ref":"#/$defs/a/5"})", StatusCode::kInvalidArgument,
              {"$ref \"#/$defs/a/5\"", "no element \"5\""});
  expectError(R"({"$defs":{"i":{"type":"integer"}},"$ref":"#/$defs/i","type":"string"})",
              StatusCode::kInvalidArgument, {"\"type\" beside \"$ref\" at (root)"});
  expectError(R"({"anyOf":[{"type":"string"}],"minLength":2})", StatusCode::kInvalidArgument,
              {"\"minLength\" beside \"anyOf\" at (root)"});
  expectError(R"({"anyOf":[{"type":"string"}],"oneOf":[{"type":"null"}]})",
              StatusCode::kInvalidArgument, {"\"anyOf\"", "\"oneOf\"", "(root)"});
  expectError("false", StatusCode::kInvalidArgument, {"(root)", "false"});
  expectError(R"({"type":"object","properties":{"a":false},"required":["a"]})",
              StatusCode::kInvalidArgument, {"/properties/a", "required"});
  expectError(R"({"type":"array","items":{"anyOf":[false]}})", StatusCode::kInvalidArgument,
              {"\"anyOf\" at /items"});
  expectError(R"({"type":"strin"})", StatusCode::kInvalidArgument,
              {"\"type\" at (root)", "\"strin\"", "\"integer\""});
  expectError(R"({"type":[]})", StatusCode::kInvalidArgument, {"\"type\" at (root)"});
  expectError(R"({"type":"array","items":{"type":"array","minItems":-1}})",
              StatusCode::kInvalidArgument, {"\"minItems\" at /items", "non-negative integer"});
  expectError(R"({"type":"array","minItems":3,"maxItems":2})", StatusCode::kInvalidArgument,
              {"\"minItems\" at (root)", "maxItems 2"});
  expectError(R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})",
              StatusCode::kInvalidArgument, {"\"minItems\" at (root)"});
  expectError(R"({"type":"string","minLength":3,"maxLength":2})", StatusCode::kInvalidArgument,
              {"\"minLength\" at (root)"});
  expectError(R"({"type":"string","pattern":"a+","maxLength":2})", StatusCode::kInvalidArgument,
              {"\"maxLength\"", "\"pattern\"", "(root)"});
  expectError(
      R"({"type":"object","properties":{"p":{"type":"string","format":"date","pattern":"a"}}})",
      StatusCode::kInvalidArgument, {"\"pattern\"", "\"format\"", "/properties/p"});
  expectError(R"({"type":"object","properties":3})", StatusCode::kInvalidArgument,
              {"\"properties\" at (root)"});
  expectError(R"({"type":"object","required":"a"})", StatusCode::kInvalidArgument,
              {"\"required\" at (root)"});
  expectError(R"({"type":"object","properties":{"a":3}})", StatusCode::kInvalidArgument,
              {"/properties/a", "object or a boolean"});
  // Schemas no finite value satisfies.
  expectError(R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
              StatusCode::kInvalidArgument, {"at /$defs/a allows no finite value"});
  expectError(R"({"type":"object","properties":{"a":{"anyOf":[{"$ref":"#/properties/a"}]}}})",
              StatusCode::kInvalidArgument, {"at /properties/a allows no finite value"});
  expectError(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})",
              StatusCode::kInvalidArgument, {"at (root) allows no finite value"});
  expectError(R"({"type":"array","items":{"$ref":"#"},"minItems":1})", StatusCode::kInvalidArgument,
              {"at (root) allows no finite value"});
}

TEST(JsonSchema, BoundsGiveResourceExhausted) {
  // Nesting: 40 levels of properties.
  std::string deep = R"({"type":"integer"})";
  for (int i = 0; i < 40; ++i) deep = R"({"type":"object","properties":{"a":)" + deep + "}}";
  expectError(deep, StatusCode::kResourceExhausted, {"max_depth 32", "/properties/a"});
  JsonSchemaLimits shallow;
  shallow.max_depth = 3;
  expectError(R"({"type":"array","items":{"type":"array","items":{"type":"array","items":{}}}})",
              StatusCode::kResourceExhausted, {"max_depth 3", "/items/items/items"}, shallow);
  EXPECT_TRUE(
      compileText(R"({"type":"array","items":{"type":"array","items":{}}})", shallow).isOk());

  JsonSchemaLimits few;
  few.max_nodes = 5;
  expectError(R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{},"e":{}}})",
              StatusCode::kResourceExhausted, {"max_nodes 5"}, few);
  EXPECT_TRUE(
      compileText(R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}}})", few).isOk());

  JsonSchemaLimits small_enum;
  small_enum.max_enum_values = 3;
  expectError(R"({"type":"object","properties":{"e":{"enum":[1,2,3,4]}}})",
              StatusCode::kResourceExhausted, {"max_enum_values 3", "\"enum\" at /properties/e"},
              small_enum);
  EXPECT_TRUE(compileText(R"({"enum":[1,2,3]})", small_enum).isOk());

  expectError(R"({"type":"string","maxLength":100000000})", StatusCode::kResourceExhausted,
              {"\"maxLength\" at (root)", "max_rules"});
  expectError(R"({"type":"array","maxItems":100000000})", StatusCode::kResourceExhausted,
              {"\"maxItems\" at (root)", "max_rules"});
  JsonSchemaLimits tiny_grammar;
  tiny_grammar.grammar.max_elements = 50;
  expectError(R"({"type":"object","properties":{"a":{"type":"string","format":"date-time"}}})",
              StatusCode::kResourceExhausted, {"at most 50 elements"}, tiny_grammar);
}

}  // namespace
}  // namespace tandem::structured
