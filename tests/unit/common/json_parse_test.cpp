// parseJson's bounds: nesting past max_depth and more values than max_values
// are refused before anything is built, with the path where the bound was
// crossed; text within them parses as nlohmann parses it.
#include "common/json_parse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

std::string nested(int depth, const std::string& open = "[", const std::string& close = "]") {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

TEST(JsonParse, NestingUpToTheBoundParses) {
  JsonParseError error;
  auto value = parseJson(nested(kMaxJsonDepth), error);
  ASSERT_TRUE(value.has_value()) << error.detail;
  EXPECT_TRUE(value->is_array());
  EXPECT_FALSE(error.tooDeep());
}

TEST(JsonParse, NestingPastTheBoundIsRefusedWithItsPath) {
  JsonParseError error;
  EXPECT_FALSE(parseJson(nested(kMaxJsonDepth + 1), error).has_value());
  EXPECT_TRUE(error.tooDeep());
  EXPECT_EQ(error.depth_limit, kMaxJsonDepth);
  EXPECT_EQ(error.byte, static_cast<size_t>(kMaxJsonDepth));  // the bracket that crossed it
  EXPECT_EQ(error.path, "[0][0][0][0][0][0]…");
  EXPECT_EQ(error.top_key, "");

  // The crash input: 15,000 levels inside a named field.
  std::string deep = R"({"model":"m","tools":[{"type":"function","function":{"parameters":)" +
                     nested(15000, R"({"a":)", "}") + "}}]}";
  EXPECT_FALSE(parseOrderedJson(deep, error).has_value());
  EXPECT_TRUE(error.tooDeep());
  EXPECT_EQ(error.top_key, "tools");
  EXPECT_EQ(error.path, "tools[0].function.parameters.a.a…");
  EXPECT_NE(error.detail.find("nesting deeper than 128 levels at tools[0].function"),
            std::string::npos)
      << error.detail;
}

TEST(JsonParse, ArrayIndexesAndKeysAreTracked) {
  JsonParseError error;
  const std::string text = R"({"a":1,"b":[0,1,{"c":[[[[[[[]]]]]]]}]})";
  EXPECT_FALSE(parseJson(text, error, JsonBounds{4, 0}).has_value());
  EXPECT_EQ(error.path, "b[2].c[0]");
  EXPECT_EQ(error.top_key, "b");
}

TEST(JsonParse, BracketsInsideStringsDoNotCount) {
  JsonParseError error;
  const std::string text = R"({"k\"[[[[": "[[[[[[[[{{{{{{\\", "x": ["]]]]"]})";
  auto value = parseJson(text, error, JsonBounds{2, 0});
  ASSERT_TRUE(value.has_value()) << error.detail;
  EXPECT_EQ((*value)["k\"[[[["], "[[[[[[[[{{{{{{\\");
}

TEST(JsonParse, UnbalancedTextIsASyntaxErrorNotABoundError) {
  JsonParseError error;
  EXPECT_FALSE(parseJson("]]]]}}}{[", error).has_value());
  EXPECT_FALSE(error.tooDeep());
  EXPECT_FALSE(error.detail.empty());
  EXPECT_FALSE(parseJson(R"({"a":"unterminated)", error).has_value());
  EXPECT_FALSE(error.tooDeep());
}

TEST(JsonParse, MoreValuesThanTheBoundAreRefused) {
  JsonParseError error;
  std::string ids = "[";
  for (int i = 0; i < 100; ++i) ids += std::to_string(i) + (i + 1 < 100 ? "," : "]");
  ASSERT_TRUE(parseJson(ids, error, JsonBounds{kMaxJsonDepth, 100}).has_value());
  EXPECT_FALSE(parseJson(ids, error, JsonBounds{kMaxJsonDepth, 99}).has_value());
  EXPECT_TRUE(error.tooManyValues());
  EXPECT_EQ(error.value_limit, 99u);
  // Commas inside strings are not values.
  ASSERT_TRUE(parseJson(R"(["a,b,c,d,e,f"])", error, JsonBounds{kMaxJsonDepth, 2}).has_value());
}

// parseOrderedJson builds, in linear time, exactly what nlohmann's own
// ordered parser builds: keys in the text's order, a repeated key at its
// first place with its last value (in small objects and in indexed ones,
// past 16 members), every kind of value, nesting; and for text that is not
// JSON, the same byte and message as parseJson.
TEST(JsonParse, OrderedParseIsNlohmannsOrderedParse) {
  std::string wide = "{";
  for (int i = 0; i < 300; ++i) {
    wide += "\"k" + std::to_string(299 - i) + "\":" + std::to_string(i) + ",";
  }
  wide += R"("k7":"again","k250":{"in":[1,2,{"k":null}]}})";
  const std::vector<std::string> texts = {
      R"({"b":1,"a":2,"c":{"z":[true,false,null],"y":-1.5e3,"x":"\u00e9\ud83d\ude00"}})",
      R"({"a":1,"b":2,"a":3})",
      R"([{"q":1},{"p":[[],{}]},18446744073709551615,-9223372036854775808,0.1])",
      R"("just a string")",
      R"(42)",
      R"({})",
      R"([])",
      R"({"x":{"x":{"x":{"x":1,"x":2}}}})",
      wide,
  };
  for (const std::string& text : texts) {
    SCOPED_TRACE(text.substr(0, 80));
    JsonParseError error;
    const auto ours = parseOrderedJson(text, error);
    ASSERT_TRUE(ours.has_value()) << error.detail;
    const auto theirs = nlohmann::ordered_json::parse(text);
    EXPECT_EQ(ours->dump(), theirs.dump());
  }
  for (const std::string& bad : {std::string(R"({"a":1,})"), std::string(R"({"a" 1})"),
                                 std::string(R"([1,2)"), std::string("{\"a\":1} x")}) {
    SCOPED_TRACE(bad);
    JsonParseError ordered_error;
    JsonParseError sorted_error;
    EXPECT_FALSE(parseOrderedJson(bad, ordered_error).has_value());
    EXPECT_FALSE(parseJson(bad, sorted_error).has_value());
    EXPECT_EQ(ordered_error.byte, sorted_error.byte);
    EXPECT_EQ(ordered_error.detail, sorted_error.detail);
  }
}

}  // namespace
}  // namespace tandem
