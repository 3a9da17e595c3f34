// hex64: 16 lower-case digits, zero-padded, most significant first.
#include "common/hex.h"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <random>

namespace tandem {
namespace {

TEST(Hex64Test, SixteenLowerCaseDigitsZeroPadded) {
  EXPECT_EQ(hex64(0), "0000000000000000");
  EXPECT_EQ(hex64(0xf), "000000000000000f");
  EXPECT_EQ(hex64(0x0123456789abcdefull), "0123456789abcdef");
  EXPECT_EQ(hex64(~0ull), "ffffffffffffffff");
  std::mt19937_64 generator(7);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t value = generator();
    char expected[17];
    std::snprintf(expected, sizeof expected, "%016" PRIx64, value);
    EXPECT_EQ(hex64(value), expected);
  }
}

}  // namespace
}  // namespace tandem
