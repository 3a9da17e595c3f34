// The tensor-core instruction the bf16 kernels are built on, and the packing
// of their operands: used by matmul_bf16_mma.cu and attention.cu's flash
// kernel. Fragment layouts are PTX's for mma.m16n8k16 (lane = 4 · group +
// quad): A holds (row group, k 2·quad..+1), (row group + 8, same k), (row
// group, k 2·quad + 8..+9), (row group + 8, same); B holds (k 2·quad..+1,
// column group), (k 2·quad + 8..+9, column group); C holds (row group,
// columns 2·quad..+1), (row group + 8, same).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_dtype.h"

namespace tandem::kernels::cuda {

// acc += a · b: one mma.sync.aligned.m16n8k16, bf16 × bf16 → fp32.
__device__ __forceinline__ void mmaBf16(float acc[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats rounded to bf16 (nearest even) in one register, `low` first.
__device__ __forceinline__ uint32_t packBf16(float low, float high) {
  return static_cast<uint32_t>(f32ToBf16Bits(low)) |
         (static_cast<uint32_t>(f32ToBf16Bits(high)) << 16);
}

}  // namespace tandem::kernels::cuda
