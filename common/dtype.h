// Element types of weights and KV caches, and scalar conversions between them.
//
// bf16 and f16 are stored as raw 16-bit patterns. Conversions to f32 are
// exact; conversions from f32 round to nearest, ties to even (NaN stays NaN).
//
// f8e4m3 (safetensors F8_E4M3, torch float8_e4m3fn) is the 8-bit float of
// fp8 checkpoints: sign, 4 exponent bits (bias 7), 3 mantissa bits, no
// infinities, largest finite 448, NaN 0x7f/0xff. It holds quantized weight
// matrices only (with their scales, docs/quantization.md); it has no flag or
// config spelling, and KV caches never use it.
//
// u8 (safetensors U8) holds bytes that are not numbers of their own: the
// packed MXFP4 blocks and E8M0 scales of GPT-OSS's experts, which the
// kernels read as they lie (kernels.h, WeightLayout::kMxfp4;
// docs/quantization.md#mxfp4). No KV cache has it; converted to f32, a byte
// is its unsigned value.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kU8 };

size_t dtypeSize(DType dtype);
// Safetensors spelling: "F32", "BF16", "F16", "F8_E4M3".
const char* dtypeSafetensorsName(DType dtype);
std::optional<DType> dtypeFromSafetensorsName(std::string_view name);
// Hugging Face config spelling: "float32", "bfloat16", "float16".
const char* dtypeTorchName(DType dtype);
std::optional<DType> dtypeFromTorchName(std::string_view name);
// Flag spelling: "f32", "bf16", "f16".
const char* dtypeShortName(DType dtype);
std::optional<DType> dtypeFromShortName(std::string_view name);

inline float bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16ToF32(uint16_t h);
uint16_t f32ToF16(float f);

// The f16 whose value is an f8e4m3's times 2^-8, exactly (every f8e4m3
// value, subnormals included, is an f16 value once scaled so): the sign
// moved to bit 15, exponent and mantissa below it. The CPU kernels widen fp8
// weights this way, as a vector shift and mask; NaN reads as 480 * 2^-8.
inline uint16_t f8e4m3ToScaledF16(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
}
// Exact; NaN stays NaN.
float f8e4m3ToF32(uint8_t b);
// Round to nearest, ties to even; beyond 448 (after rounding) saturates to
// +-448, as torch's float8_e4m3fn conversion of a quantizer's clamped values
// never needs to; NaN gives 0x7f with the sign.
uint8_t f32ToF8e4m3(float f);

// MXFP4 (OCP Microscaling FP4): the value of an FP4 E2M1 nibble (sign, 2
// exponent bits, 1 mantissa bit: +-0, 0.5, 1, 1.5, 2, 3, 4, 6), and the power
// of two 2^(e - 127) of an E8M0 block exponent (e < 255; 2^-127 is an f32
// subnormal). Both exact; their product is the element's value, exact too
// where it is below 2^128 (beyond, it rounds to infinity).
inline float fp4E2m1ToF32(uint8_t nibble) {
  constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kMagnitudes[nibble & 7u];
  return (nibble & 8u) != 0 ? -magnitude : magnitude;
}
inline float e8m0ToF32(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Converts n elements of `dtype` at `src` to f32.
void convertToF32(DType dtype, const void* src, float* dst, size_t n);
// Converts n f32 values to `dtype` at `dst`.
void convertFromF32(DType dtype, const float* src, void* dst, size_t n);

}  // namespace tandem
