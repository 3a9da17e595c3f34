#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* dtypeSafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

std::optional<DType> dtypeFromSafetensorsName(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

const char* dtypeTorchName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kU8:
      return "uint8";
  }
  return "?";
}

std::optional<DType> dtypeFromTorchName(std::string_view name) {
  if (name == "float32" || name == "float") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16" || name == "half") return DType::kF16;
  return std::nullopt;
}

const char* dtypeShortName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

std::optional<DType> dtypeFromShortName(std::string_view name) {
  if (name == "f32" || name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16" || name == "fp16") return DType::kF16;
  return std::nullopt;
}

float f16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof magnitude);
    // Scale so the subnormal quantum (2^-24) becomes 1, then round to even.
    float scaled = magnitude * 16777216.0f;
    auto q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t mantissa_rounding = 0xfffu + ((abs >> 13) & 1u);
  abs += mantissa_rounding;
  uint32_t exponent = (abs >> 23) - 127 + 15;
  uint32_t mantissa = (abs >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

float f8e4m3ToF32(uint8_t b) {
  if ((b & 0x7fu) == 0x7fu) return (b & 0x80u) ? -std::nanf("") : std::nanf("");
  return f16ToF32(f8e4m3ToScaledF16(b)) * 256.0f;
}

uint8_t f32ToF8e4m3(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  uint32_t code = 0;
  if (abs < 0x3c800000u) {
    // Below 2^-6 the quantum is 2^-9: the magnitude x 2^9 (exact) rounded to
    // an integer 0..8, which is the code (8 is 2^-6, the smallest normal).
    // Adding 2^23 rounds ties to even, as the default rounding mode does.
    const float shifted = std::fabs(f) * 512.0f + 8388608.0f;
    std::memcpy(&code, &shifted, sizeof code);
    code -= 0x4b000000u;
  } else {
    // Keep the exponent and the top 3 mantissa bits, rounding the 20 below
    // to nearest even (a carry moves into the exponent), then rebias the
    // exponent from 127 to 7.
    code = ((abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  }
  // Whatever rounds past 448 (0x7e), infinity included, saturates.
  return static_cast<uint8_t>(sign | std::min<uint32_t>(code, 0x7eu));
}

void convertToF32(DType dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16ToF32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3ToF32(s[i]);
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

void convertFromF32(DType dtype, const float* src, void* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32ToF16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32ToF8e4m3(src[i]);
      return;
    }
    case DType::kU8: {
      // Rounded to the nearest byte value, clamped to 0..255; NaN is 0.
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        const float v = std::isnan(src[i]) ? 0.0f : std::clamp(src[i], 0.0f, 255.0f);
        d[i] = static_cast<uint8_t>(std::nearbyint(v));
      }
      return;
    }
  }
}

}  // namespace tandem
