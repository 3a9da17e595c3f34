#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace tandem {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(DType, Bf16RoundTripIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16ToF32(f32ToBf16(f))));
      continue;
    }
    EXPECT_EQ(f32ToBf16(f), h);
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32ToBf16(1.0f + std::ldexp(1.0f, -8)), f32ToBf16(1.0f));
  // Slightly above halfway rounds up.
  EXPECT_EQ(f32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            static_cast<uint16_t>(f32ToBf16(1.0f) + 1));
}

TEST(DType, F16RoundTripIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32ToF16(f), h) << std::hex << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(f16ToF32(0xc000), -2.0f);
  EXPECT_EQ(f16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32ToF16(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(f32ToF16(1e6f), 0x7c00);                   // overflow to infinity
  EXPECT_EQ(f32ToF16(std::ldexp(1.0f, -26)), 0x0000);  // below half the quantum
  EXPECT_EQ(bitsOf(f16ToF32(0x8000)), 0x80000000u);    // negative zero
}

TEST(DType, Names) {
  EXPECT_EQ(dtypeFromSafetensorsName("BF16"), DType::kBF16);
  EXPECT_FALSE(dtypeFromSafetensorsName("I64").has_value());
  EXPECT_EQ(dtypeFromTorchName("float16"), DType::kF16);
  EXPECT_EQ(dtypeFromShortName("f32"), DType::kF32);
  EXPECT_STREQ(dtypeSafetensorsName(DType::kF16), "F16");
  EXPECT_EQ(dtypeSize(DType::kBF16), 2u);
}

}  // namespace
}  // namespace tandem
