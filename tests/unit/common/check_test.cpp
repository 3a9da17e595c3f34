// TANDEM_CHECK aborts with the file, the condition and the message, whether
// the message is a literal or a std::string built at the call (which the
// printf-style macro once passed to %s as is).
#include "common/check.h"

#include <gtest/gtest.h>

#include <string>

namespace {

TEST(CheckDeathTest, AbortsWithTheConditionAndAStringMessage) {
  const std::string detail = "profile.json: no field base_s";
  EXPECT_DEATH(TANDEM_CHECK(detail.empty(), "the routing profile: " + detail),
               "check failed: detail.empty\\(\\): the routing profile: profile.json: no field "
               "base_s");
  EXPECT_DEATH(TANDEM_CHECK(1 + 1 == 3, "arithmetic"), "check failed: 1 \\+ 1 == 3: arithmetic");
}

TEST(CheckDeathTest, ATrueConditionNeitherAbortsNorBuildsTheMessage) {
  int built = 0;
  auto message = [&] {
    ++built;
    return std::string("never");
  };
  TANDEM_CHECK(true, message());
  EXPECT_EQ(built, 0);
}

}  // namespace
