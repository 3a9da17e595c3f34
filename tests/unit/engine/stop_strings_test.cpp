#include "agent/engine/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem::engine {
namespace {

// Feeds pieces; returns everything emitted and whether it stopped.
std::pair<std::string, bool> feed(StopStringMatcher& matcher,
                                  const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& piece : pieces) {
    auto update = matcher.push(piece);
    out += update.text;
    if (update.stopped) return {out, true};
  }
  return {out + matcher.finish(), false};
}

TEST(StopStrings, NoStopStringsPassesEverythingThrough) {
  StopStringMatcher matcher({});
  EXPECT_EQ(matcher.push("abc").text, "abc");
  EXPECT_EQ(matcher.finish(), "");
}

TEST(StopStrings, StopSpanningPiecesIsCutAndNeverEmitted) {
  StopStringMatcher matcher({"END"});
  std::string emitted;
  auto a = matcher.push("hello E");
  emitted += a.text;
  EXPECT_EQ(a.text, "hello ") << "the possible start of the stop string must be held back";
  auto b = matcher.push("N");
  emitted += b.text;
  EXPECT_EQ(b.text, "");
  auto c = matcher.push("D and more");
  emitted += c.text;
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(emitted, "hello ");
}

TEST(StopStrings, FalseStartIsReleased) {
  StopStringMatcher matcher({"END"});
  auto [out, stopped] = feed(matcher, {"E", "N", "X", "Y"});
  EXPECT_FALSE(stopped);
  EXPECT_EQ(out, "ENXY");
}

TEST(StopStrings, EarliestOfSeveralWins) {
  StopStringMatcher matcher({"world", "lo"});
  auto [out, stopped] = feed(matcher, {"hello world"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hel");
}

TEST(StopStrings, HeldTailIsReleasedAtFinish) {
  StopStringMatcher matcher({"stop"});
  auto update = matcher.push("non-st");
  EXPECT_EQ(update.text, "non-");
  EXPECT_EQ(matcher.finish(), "st");
}

TEST(StopStrings, NeverSplitsUtf8) {
  // "é" is 0xC3 0xA9; a stop string starting with 0xA9 must not split it.
  StopStringMatcher matcher({"\xA9x"});
  auto update = matcher.push("caf\xC3\xA9");
  for (size_t i = 0; i < update.text.size(); ++i) {
    if (static_cast<unsigned char>(update.text[i]) == 0xC3) {
      ASSERT_LT(i + 1, update.text.size()) << "released text ends inside a character";
    }
  }
  EXPECT_EQ(update.text + matcher.finish(), "caf\xC3\xA9");
}

}  // namespace
}  // namespace tandem::engine
