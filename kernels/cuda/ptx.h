// The PTX instructions the fast kernels are built on, each behind one
// function: the tensor-core mma, ldmatrix, cp.async and a streaming load.
// Used by gemv_fast.cu, matmul_bf16_mma.cu and attention.cu. Under the CUDA
// emulator (tests/cuda_emu/, docs/cuda.md#the-emulator) the same functions
// are defined by tests/cuda_emu/instructions.h.
//
// Fragment layouts are PTX's for mma.m16n8k16 (lane = 4 · group + quad): A
// holds (row group, k 2·quad..+1), (row group + 8, same k), (row group,
// k 2·quad + 8..+9), (row group + 8, same); B holds (k 2·quad..+1, column
// group), (k 2·quad + 8..+9, column group); C holds (row group, columns
// 2·quad..+1), (row group + 8, same).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_dtype.h"

namespace tandem::kernels::cuda {

// Two floats rounded to bf16 (nearest even) in one register, `low` first.
__device__ __forceinline__ uint32_t packBf16(float low, float high) {
  return static_cast<uint32_t>(f32ToBf16Bits(low)) |
         (static_cast<uint32_t>(f32ToBf16Bits(high)) << 16);
}

#if !defined(TANDEM_CUDA_EMULATION)

// acc += a · b: one mma.sync.aligned.m16n8k16, bf16 × bf16 → fp32.
__device__ __forceinline__ void mmaBf16(float acc[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t sharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without waiting (cp.async.cg), or 16 zero bytes
// where !valid (nothing read). Lands once a waitCopies covers its group.
__device__ __forceinline__ void copyAsync16(void* shared, const void* global, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(shared)),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}

// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void commitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are in
// flight. Other threads' copies are seen after a barrier that follows
// their own wait.
template <int kPending>
__device__ __forceinline__ void waitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ldmatrix .x4: four 8 x 8 bf16 matrices, lanes 8i..8i+7 giving the row
// addresses of matrix i; r[i] is this lane's (row lane / 4, columns
// 2 · (lane % 4)..+1) of matrix i.
__device__ __forceinline__ void loadMatrices(uint32_t r[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}

// ldmatrix .x4 .trans: the same four matrices, each transposed: r[i] is
// this lane's (rows 2 · (lane % 4)..+1, column lane / 4) of matrix i, the
// lower row in the low half. What an mma's B fragment needs from a tile
// stored k-row by k-row (e.g. V, position by position).
__device__ __forceinline__ void loadMatricesTransposed(uint32_t r[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}

// 16 bytes of a stream read once, not kept in L1.
__device__ __forceinline__ uint4 loadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

#endif  // !TANDEM_CUDA_EMULATION

}  // namespace tandem::kernels::cuda
