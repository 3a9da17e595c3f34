// Hopper's warpgroup matrix multiply (wgmma, PTX ISA "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate"), sm_90a only: used by
// matmul_bf16_wgmma.cu, which is compiled for sm_90a alone. Under the CUDA
// emulator the same functions are defined by tests/cuda_emu/instructions.h.
//
// The operands come from shared memory through 64-bit descriptors, in the
// no-swizzle ("interleave") canonical layout: a core matrix is 8 rows of 16
// bytes (8 bf16 of k), stored as 128 contiguous bytes (row r at 16 r); the
// descriptor gives the address of the first, the byte distance between
// core matrices adjacent in k (leading) and between core matrices adjacent
// in m or n (stride). Both operands are k-major (a row of A, a column of B
// is contiguous in k), so no transpose.
//
// The accumulator of m64nNk16 (f32): warp w of the warpgroup holds rows
// 16w..16w + 15, and within a warp register 4j + e is the m16n8 C
// fragment's element e of the 8 columns 8j..8j + 7 (ptx.h): rows
// lane / 4 (+ 8 for e >= 2), columns 8j + 2 (lane % 4) + e % 2.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ptx.h"

namespace tandem::kernels::cuda {

// Core matrices' geometry in bytes.
constexpr uint32_t kCoreMatrixBytes = 128;

// The descriptor of a no-swizzle k-major operand whose first core matrix is
// at `shared` (16-byte aligned): address, leading and stride byte offsets,
// each in 16-byte units, in bits 0-13, 16-29 and 32-45; base offset and
// swizzle mode (bits 49-51, 62-63) zero.
__device__ __forceinline__ uint64_t wgmmaDescriptor(const void* shared, uint32_t leading,
                                                    uint32_t stride) {
  return (static_cast<uint64_t>(sharedAddress(shared) >> 4) & 0x3fff) |
         (static_cast<uint64_t>((leading >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((stride >> 4) & 0x3fff) << 32);
}

// The descriptor of a k-major operand stored with the 128-byte swizzle
// (tma.h): rows of 128 bytes (64 bf16 of k), 8-row atoms of 1024 bytes one
// after another from a 1024-byte aligned address. `shared` is the first
// atom plus 32 bytes per 16-wide slice of k before the one multiplied (the
// swizzle applies to the address bits, so the slice's chunks are found
// where the copy put them). Stride 1024 bytes between 8-row groups; the
// leading offset is unused with this swizzle (1 by convention); swizzle
// mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t wgmmaSwizzledDescriptor(const void* shared) {
  return (static_cast<uint64_t>(sharedAddress(shared) >> 4) & 0x3fff) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

#if !defined(TANDEM_CUDA_EMULATION)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.h: compile for sm_90a (arch=compute_90a): wgmma exists there only"
#endif

// Before the first wgmma of a batch: orders this thread's earlier register
// and shared-memory accesses before the asynchronous multiplies.
__device__ __forceinline__ void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Makes this thread's generic-proxy writes to shared memory (stores and
// cp.async, once waited for) visible to the async proxy wgmma reads with;
// a barrier after it extends that to the block's other threads.
__device__ __forceinline__ void fenceSharedForAsyncProxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d += a · b for the warpgroup: m64n128k16, bf16 x bf16 -> f32, A (64 x 16)
// and B (16 x 128, k-major) from shared memory. Asynchronous: d may be
// neither read nor written until a wgmmaWait covers its group.
__device__ __forceinline__ void wgmmaBf16M64N128(float (&d)[16][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(a), "l"(b), "r"(1));
}

// d += a · b for the warpgroup: m64n256k16, bf16 x bf16 -> f32, A (64 x 16)
// and B (16 x 256, k-major) from shared memory. Asynchronous: d may be
// neither read nor written until a wgmmaWait covers its group.
__device__ __forceinline__ void wgmmaBf16M64N256(float (&d)[32][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]),
        "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),
        "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]),
        "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]),
        "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]),
        "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]),
        "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]),
        "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]),
        "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]),
        "+f"(d[31][3])
      : "l"(a), "l"(b), "r"(1));
}

// The warpgroup's registers per thread from here on: raised to or lowered
// to kRegisters (setmaxnreg; every warp of the warpgroup executes it, in a
// kernel with a register cap at entry, __launch_bounds__(threads, 1)).
template <uint32_t kRegisters>
__device__ __forceinline__ void raiseRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <uint32_t kRegisters>
__device__ __forceinline__ void lowerRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Closes the group of this thread's wgmma issued since the last commit.
__device__ __forceinline__ void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending of the committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of d across the wait
// before it (the asm of a wgmma names d; a wait does not).
template <int kBlocks>
__device__ __forceinline__ void wgmmaFenceRegisters(float (&d)[kBlocks][4]) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

#endif  // !TANDEM_CUDA_EMULATION

}  // namespace tandem::kernels::cuda
