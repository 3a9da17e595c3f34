// Device-side element conversions of the CUDA kernels, bit-for-bit the same
// as common/dtype.h's host ones: bf16/f16 -> f32 is exact; f32 -> bf16 rounds
// to nearest, ties to even, and keeps NaN a (quiet) NaN.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels::cuda {

__device__ __forceinline__ float bf16BitsToF32(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ float f16BitsToF32(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// The same integer steps as tandem::f32ToBf16.
__device__ __forceinline__ uint16_t f32ToBf16Bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Element types a kernel is instantiated for, read as fp32.
struct F32Elements {
  using Storage = float;
  __device__ __forceinline__ static float load(const float* p, int64_t i) { return p[i]; }
};
struct Bf16Elements {
  using Storage = uint16_t;
  __device__ __forceinline__ static float load(const uint16_t* p, int64_t i) {
    return bf16BitsToF32(p[i]);
  }
};
struct F16Elements {
  using Storage = uint16_t;
  __device__ __forceinline__ static float load(const uint16_t* p, int64_t i) {
    return f16BitsToF32(p[i]);
  }
};

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
__device__ __forceinline__ int64_t ceilDivDevice(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace tandem::kernels::cuda
