#include "common/dtype.h"

#include <cmath>

namespace tandem {

size_t dtypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* dtypeSafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

std::optional<DType> dtypeFromSafetensorsName(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
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
  }
}

}  // namespace tandem
