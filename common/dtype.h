// Element types of weights and KV caches, and scalar conversions between them.
//
// bf16 and f16 are stored as raw 16-bit patterns. Conversions to f32 are
// exact; conversions from f32 round to nearest, ties to even (NaN stays NaN).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kBF16, kF16 };

size_t dtypeSize(DType dtype);
// Safetensors spelling: "F32", "BF16", "F16".
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

// Converts n elements of `dtype` at `src` to f32.
void convertToF32(DType dtype, const void* src, float* dst, size_t n);
// Converts n f32 values to `dtype` at `dst`.
void convertFromF32(DType dtype, const float* src, void* dst, size_t n);

}  // namespace tandem
