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
  // fp8: read from checkpoints only, never a flag or config dtype.
  EXPECT_EQ(dtypeFromSafetensorsName("F8_E4M3"), DType::kF8E4M3);
  EXPECT_STREQ(dtypeSafetensorsName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(dtypeSize(DType::kF8E4M3), 1u);
  EXPECT_FALSE(dtypeFromShortName("f8e4m3").has_value());
  EXPECT_FALSE(dtypeFromTorchName("float8_e4m3fn").has_value());
  // u8: MXFP4's bytes, read from checkpoints only; converted, a byte is its
  // unsigned value (rounded and clamped back).
  EXPECT_EQ(dtypeFromSafetensorsName("U8"), DType::kU8);
  EXPECT_STREQ(dtypeSafetensorsName(DType::kU8), "U8");
  EXPECT_EQ(dtypeSize(DType::kU8), 1u);
  EXPECT_FALSE(dtypeFromShortName("u8").has_value());
  EXPECT_FALSE(dtypeFromTorchName("uint8").has_value());
  const uint8_t bytes[3] = {0, 127, 255};
  float values[3];
  convertToF32(DType::kU8, bytes, values, 3);
  EXPECT_EQ(values[0], 0.0f);
  EXPECT_EQ(values[1], 127.0f);
  EXPECT_EQ(values[2], 255.0f);
  const float back[4] = {-3.0f, 1.6f, 300.0f, std::nanf("")};
  uint8_t rounded[4];
  convertFromF32(DType::kU8, back, rounded, 4);
  EXPECT_EQ(rounded[0], 0);
  EXPECT_EQ(rounded[1], 2);
  EXPECT_EQ(rounded[2], 255);
  EXPECT_EQ(rounded[3], 0);
}

// The value of an f8e4m3 byte from the format's definition: sign, exponent
// bias 7, subnormals at exponent 0, NaN at S.1111.111, no infinities.
double f8Reference(int b) {
  const int sign = b >> 7, exponent = (b >> 3) & 0xf, mantissa = b & 7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(DType, F8E4M3ReadsEveryPatternAndItsScaledF16Exactly) {
  for (int b = 0; b < 256; ++b) {
    SCOPED_TRACE(b);
    const auto byte = static_cast<uint8_t>(b);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f8e4m3ToF32(byte)));
      continue;
    }
    EXPECT_EQ(double{f8e4m3ToF32(byte)}, f8Reference(b));
    // What the kernels widen: the value times 2^-8, exactly, as an f16.
    EXPECT_EQ(double{f16ToF32(f8e4m3ToScaledF16(byte))}, std::ldexp(f8Reference(b), -8));
    // Every finite pattern comes back from its value (-0 included).
    EXPECT_EQ(f32ToF8e4m3(f8e4m3ToF32(byte)), byte);
  }
  EXPECT_EQ(f8Reference(0x7e), 448.0);
  EXPECT_EQ(f8Reference(0x01), std::ldexp(1.0, -9));
}

TEST(DType, F8E4M3RoundsToNearestEvenAndSaturates) {
  // Between two neighbours: below the midpoint down, above it up, at it to
  // the even mantissa.
  for (int b = 0; b < 0x7e; ++b) {
    SCOPED_TRACE(b);
    const double low = f8Reference(b), high = f8Reference(b + 1);
    const double mid = (low + high) / 2;
    EXPECT_EQ(f32ToF8e4m3(static_cast<float>(mid + (high - low) / 8)), b + 1);
    EXPECT_EQ(f32ToF8e4m3(static_cast<float>(mid - (high - low) / 8)), b);
    EXPECT_EQ(f32ToF8e4m3(static_cast<float>(mid)), b % 2 == 0 ? b : b + 1);
    EXPECT_EQ(f32ToF8e4m3(static_cast<float>(-mid)), 0x80 | (b % 2 == 0 ? b : b + 1));
  }
  EXPECT_EQ(f32ToF8e4m3(464.0f), 0x7e);  // the midpoint to 480, even: 448
  EXPECT_EQ(f32ToF8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32ToF8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32ToF8e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter quantum
  EXPECT_EQ(f32ToF8e4m3(std::nanf("")) & 0x7f, 0x7f);
}

}  // namespace
}  // namespace tandem
