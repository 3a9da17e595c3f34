#include "agent/engine/stop_strings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
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

// Before the answer is longer than min_tokens (may_stop false) a whole stop
// string is text; one that is still being completed when stopping is
// allowed ends the answer (vLLM looks for stop strings ending in the text of
// tokens past min_tokens).
TEST(StopStrings, NothingStopsBeforeMinTokensButAStringCompletedAfterDoes) {
  StopStringMatcher matcher({"END"});
  auto a = matcher.push("one END two E", /*may_stop=*/false);
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(a.text, "one END two ") << "the tail E may start a stop string: held back";
  auto b = matcher.push("N", /*may_stop=*/false);
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.text, "");
  auto c = matcher.push("D more", /*may_stop=*/true);
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, "");

  StopStringMatcher late({"END"});
  EXPECT_EQ(late.push("END", false).text, "END");
  auto d = late.push(" x END y", true);
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, " x ");
}

// A stop string completed before stopping was allowed stays text even while
// it is held back as the start of a longer one ("\n" of "\n\n"): adding a
// stop string that never occurs changes nothing. Only a string ending in
// the new piece stops, and the matcher says which.
TEST(StopStrings, AStringCompletedBeforeMinTokensNeverStopsLater) {
  StopStringMatcher matcher({"\n", "\n\n"});
  auto a = matcher.push("x;\r\n", /*may_stop=*/false);
  EXPECT_EQ(a.text, "x;\r") << "\n may start \n\n: held back";
  auto b = matcher.push("yur", /*may_stop=*/true);
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.text, "\nyur");
  EXPECT_EQ(matcher.matched(), "");
  auto c = matcher.push(";\r\n", /*may_stop=*/true);
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, ";\r");
  EXPECT_EQ(matcher.matched(), "\n");
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

// include_stop_str_in_output: the output ends with the stop string that
// ended it (the earliest; spanning pieces too), and nothing after it.
TEST(StopStrings, IncludedStopEndsTheOutput) {
  StopStringMatcher spanning({"END"}, /*include_stop=*/true);
  auto [out, stopped] = feed(spanning, {"hello E", "N", "D and more"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hello END");
  StopStringMatcher several({"world", "lo", "l"}, /*include_stop=*/true);
  std::tie(out, stopped) = feed(several, {"hello world"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hel") << "\"l\" starts first";
  StopStringMatcher tie({"lo w", "lo"}, /*include_stop=*/true);
  std::tie(out, stopped) = feed(tie, {"hello world"});
  EXPECT_EQ(out, "hello w") << "of two starting at one byte, the one listed first";
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
// What the matcher must do, written the plain way: after each piece, the
// earliest-starting occurrence ending in it stops (when it may); otherwise
// the longest tail that is a proper prefix of a stop string is held.
struct ReferenceMatcher {
  std::vector<std::string> stops;
  std::string pending;
  bool stopped = false;

  std::pair<std::string, bool> push(const std::string& piece, bool may_stop) {
    const size_t before = pending.size();
    pending += piece;
    size_t first = std::string::npos;
    if (may_stop && !piece.empty()) {
      for (const std::string& stop : stops) {
        const size_t from = before + 1 >= stop.size() ? before + 1 - stop.size() : 0;
        first = std::min(first, pending.find(stop, from));
      }
    }
    if (first != std::string::npos) {
      stopped = true;
      return {pending.substr(0, first), true};
    }
    size_t hold = 0;
    for (size_t length = 1; length <= pending.size(); ++length) {
      const std::string tail = pending.substr(pending.size() - length);
      for (const std::string& stop : stops) {
        if (stop.size() > length && stop.compare(0, length, tail) == 0) hold = length;
      }
    }
    std::string out = pending.substr(0, pending.size() - hold);
    pending.erase(0, pending.size() - hold);
    return {out, false};
  }
};

// Random stop strings and pieces over a two-letter alphabet (many borders
// and overlaps) against the reference.
TEST(StopStrings, AgreesWithThePlainAlgorithmOnRandomText) {
  std::mt19937 random(7);
  const auto text = [&](size_t most) {
    std::string out(1 + random() % most, 'a');
    for (char& c : out) c = random() % 3 == 0 ? 'b' : 'a';
    return out;
  };
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::string> stops;
    for (size_t i = 0, n = 1 + random() % 3; i < n; ++i) stops.push_back(text(6));
    StopStringMatcher matcher(stops);
    ReferenceMatcher reference;
    reference.stops = stops;
    std::string emitted, expected;
    for (int step = 0; step < 12 && !reference.stopped; ++step) {
      const std::string piece = random() % 5 == 0 ? "" : text(4);
      const bool may_stop = random() % 4 != 0;
      const StopStringMatcher::Update update = matcher.push(piece, may_stop);
      const auto [want, want_stopped] = reference.push(piece, may_stop);
      ASSERT_EQ(update.text, want) << "round " << round << " step " << step;
      ASSERT_EQ(update.stopped, want_stopped) << "round " << round << " step " << step;
    }
  }
}

// A stop string as long as a request body may hold, against text that keeps
// almost matching it: each byte is examined a bounded number of times.
TEST(StopStrings, AMegabyteStopStringIsMatchedAcrossPieces) {
  const std::string stop = std::string(1 << 20, 'a') + "b";
  StopStringMatcher matcher({stop});
  std::string emitted;
  for (int i = 0; i < (1 << 20) / 64 + 1; ++i) {
    const StopStringMatcher::Update update = matcher.push(std::string(64, 'a'));
    emitted += update.text;
    ASSERT_FALSE(update.stopped);
  }
  EXPECT_EQ(emitted, std::string(64, 'a'));  // all but the stop string's possible start is held
  const StopStringMatcher::Update update = matcher.push("b!");
  EXPECT_TRUE(update.stopped);
  EXPECT_EQ(emitted + update.text, std::string(64, 'a'));
  EXPECT_EQ(matcher.matched(), stop);
}

}  // namespace tandem::engine
