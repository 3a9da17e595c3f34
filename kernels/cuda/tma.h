// Hopper's tensor copies (the tensor memory accelerator, PTX ISA
// "cp.async.bulk.tensor") and the shared-memory barriers they complete on
// (PTX ISA "mbarrier"), sm_90: used by matmul_bf16_wgmma.cu's
// configuration 6. Under the CUDA emulator the same functions are defined
// by tests/cuda_emu/instructions.h.
//
// A tensor map (CUtensorMap, 128 bytes, made on the host by the driver's
// cuTensorMapEncodeTiled; bf16RowsTensorMap below) describes a matrix in
// global memory and the box one copy moves. One thread issues a copy; it reads the box, writes
// elements outside the matrix as zeros, and counts its bytes off the
// barrier's transaction count. With the 128-byte swizzle, a box row of 128
// bytes lands at row · 128 and its 16-byte chunk c at chunk c ^ (bits 7-9
// of the address), so with the box at a 1024-byte aligned address chunk c
// of row r is at r · 128 + 16 · (c ^ r % 8): the layout wgmma reads through
// a 128B-swizzle descriptor (wgmma.h).
//
// A barrier counts arrivals and transaction bytes; its phase completes when
// the expected arrivals have come and the bytes announced by them
// (arriveExpectingBytes) have landed; then it starts the next phase with the
// same count. waitBarrier(barrier, parity) returns once the phase of that
// parity has completed: the current phase if its parity is `parity`, else
// the one before it (so a fresh barrier's wait for parity 1 returns at
// once).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/check.h"
#include "kernels/cuda/ptx.h"

namespace tandem::kernels::cuda {

// The map of a rows x k bf16 row-major matrix (rows k · 2 bytes apart, the
// address 16-byte aligned, k a multiple of 8) in boxes of `box_rows` rows
// of 64 elements, swizzled 128B, zeros outside: made by the driver's
// cuTensorMapEncodeTiled, found through the runtime (the binaries link no
// driver library). Host code; throws tandem::Error when the driver refuses.
inline CUtensorMap bf16RowsTensorMap(const void* data, int64_t rows, int64_t k, uint32_t box_rows) {
  using EncodeTiled =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const EncodeTiled encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t error = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function,
                                                               12000, cudaEnableDefault, &found);
    TANDEM_CHECK(
        error == cudaSuccess && found == cudaDriverEntryPointSuccess && function != nullptr,
        "tensor map: the driver has no cuTensorMapEncodeTiled (CUDA 12 or later)");
    return reinterpret_cast<EncodeTiled>(function);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TANDEM_CHECK(result == CUDA_SUCCESS, "tensor map: cuTensorMapEncodeTiled refused a " +
                                           std::to_string(rows) + " x " + std::to_string(k) +
                                           " bf16 matrix (error " +
                                           std::to_string(static_cast<int>(result)) + ")");
  return map;
}

// Bytes in one period of the 128-byte swizzle: a swizzled box and the
// wgmma descriptors that read it start at a multiple.
constexpr uint32_t kSwizzleAtomBytes = 1024;

// The first kSwizzleAtomBytes-aligned shared address at or after `shared`
// (give a kernel's dynamic shared memory that much more).
__device__ __forceinline__ uint8_t* swizzleAligned(uint8_t* shared) {
  return shared +
         (kSwizzleAtomBytes - sharedAddress(shared) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
}

#if !defined(TANDEM_CUDA_EMULATION)

// A barrier in shared memory expecting `arrivals` arrivals per phase.
__device__ __forceinline__ void initBarrier(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sharedAddress(barrier)),
               "r"(arrivals)
               : "memory");
}

// Makes this thread's barrier initializations visible to the copy engine
// and, after a __syncthreads, to the block.
__device__ __forceinline__ void fenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more transaction bytes to land
// before the phase completes.
__device__ __forceinline__ void arriveExpectingBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sharedAddress(barrier)),
      "r"(bytes)
      : "memory");
}

// One arrival.
__device__ __forceinline__ void arriveAtBarrier(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sharedAddress(barrier))
               : "memory");
}

// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void waitBarrier(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra again;\n"
      "}\n" ::"r"(sharedAddress(barrier)),
      "r"(parity)
      : "memory");
}

// The box of `map` whose first element is (row, column) (column: the
// contiguous dimension) into shared memory at `shared`, completing on
// `barrier`. `map` must be a kernel parameter (__grid_constant__).
__device__ __forceinline__ void copyTileAsync(void* shared, const CUtensorMap* map, int32_t column,
                                              int32_t row, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(sharedAddress(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(sharedAddress(barrier))
      : "memory");
}

#endif  // !TANDEM_CUDA_EMULATION

}  // namespace tandem::kernels::cuda
