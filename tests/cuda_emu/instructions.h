// The CUDA emulator's versions of kernels/cuda/ptx.h's instructions, with
// the same signatures, written from the PTX ISA's description of each
// (mma.m16n8k16 fragment layouts, ldmatrix, cp.async groups, wgmma's
// descriptors and accumulator layout).
// Force-included after device.h.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

namespace tandem::cuda_emu {

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 over the 32 lanes'
// fragments. Each product of two bf16 is exact in double; the 16 products
// and the accumulator are added in double in ascending k and rounded once.
void mmaM16N8K16Bf16(float acc[4], const uint32_t a[4], const uint32_t b[2]);
// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16.
void loadMatrixX4(uint32_t r[4], const uint16_t* row_address, bool transposed);

}  // namespace tandem::cuda_emu

namespace tandem::kernels::cuda {

inline void mmaBf16(float acc[4], const uint32_t a[4], const uint32_t b[2]) {
  ::tandem::cuda_emu::mmaM16N8K16Bf16(acc, a, b);
}

inline void copyAsync16(void* shared, const void* global, bool valid = true) {
  ::tandem::cuda_emu::asyncCopy(shared, global, 16, valid ? 16 : 0);
}

inline void commitCopies() { ::tandem::cuda_emu::asyncCommit(); }

template <int kPending>
void waitCopies() {
  ::tandem::cuda_emu::asyncWait(kPending);
}

inline void loadMatrices(uint32_t r[4], const uint16_t* p) {
  ::tandem::cuda_emu::loadMatrixX4(r, p, /*transposed=*/false);
}

inline void loadMatricesTransposed(uint32_t r[4], const uint16_t* p) {
  ::tandem::cuda_emu::loadMatrixX4(r, p, /*transposed=*/true);
}

inline uint32_t sharedAddress(const void* p) { return ::tandem::cuda_emu::sharedOffset(p); }

// wgmma.h's instructions: the fences order nothing here (memory is
// sequentially consistent and d is plain memory).
inline void wgmmaFence() {}
inline void fenceSharedForAsyncProxy() {}
inline void wgmmaBf16M64N128(float (&d)[16][4], uint64_t a, uint64_t b) {
  ::tandem::cuda_emu::warpgroupMma(&d[0][0], 128, a, b);
}
inline void wgmmaBf16M64N256(float (&d)[32][4], uint64_t a, uint64_t b) {
  ::tandem::cuda_emu::warpgroupMma(&d[0][0], 256, a, b);
}
inline void wgmmaCommit() { ::tandem::cuda_emu::warpgroupCommit(); }
template <int kPending>
void wgmmaWait() {
  ::tandem::cuda_emu::warpgroupWait(kPending);
}
template <int kBlocks>
void wgmmaFenceRegisters(float (&)[kBlocks][4]) {}
// Register budgets mean nothing here.
template <uint32_t kRegisters>
void raiseRegisters() {}
template <uint32_t kRegisters>
void lowerRegisters() {}

// tma.h's instructions.
inline void initBarrier(uint64_t* barrier, uint32_t arrivals) {
  ::tandem::cuda_emu::barrierInit(barrier, arrivals);
}
inline void fenceBarrierInit() {}
inline void arriveExpectingBytes(uint64_t* barrier, uint32_t bytes) {
  ::tandem::cuda_emu::barrierArrive(barrier, bytes);
}
inline void arriveAtBarrier(uint64_t* barrier) { ::tandem::cuda_emu::barrierArrive(barrier, 0); }
inline void waitBarrier(uint64_t* barrier, uint32_t parity) {
  ::tandem::cuda_emu::barrierWait(barrier, parity);
}
inline void copyTileAsync(void* shared, const CUtensorMap* map, int32_t column, int32_t row,
                          uint64_t* barrier) {
  ::tandem::cuda_emu::tensorCopy(shared, map, column, row, barrier);
}

inline uint4 loadStreaming(const uint4* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    ::tandem::cuda_emu::fault("ld.global.nc.v4 at %p: not 16-byte aligned",
                              static_cast<const void*>(p));
  }
  uint4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace tandem::kernels::cuda
