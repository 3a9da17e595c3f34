// Probes of the instructions kernels/cuda/ptx.h wraps, and of how CUDA
// threads meet, run by instructions_test.cpp on a GPU (gpu_instructions_test)
// and on the CUDA emulator (emu_instructions_test), so the emulator's model
// of each instruction is checked against the hardware. Every function runs
// its kernel on device 0 and returns what it wrote.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::cuda_probe {

int deviceCount();

// D = A · B + C by one warp through mmaBf16, the fragments loaded as
// ptx.h describes: A 16 x 16 and B 16 x 8 (k-major: b[k * 8 + n]) as bf16
// bits, C and D 16 x 8 row-major.
std::vector<float> mma(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                       const std::vector<float>& c);

// Whether warpgroupMma can run: the build holds its sm_90a kernel and device
// 0 has compute capability 9.0 (the emulator's has).
bool wgmmaAvailable();
// D = A · B + C by one warpgroup through wgmmaBf16M64N128 (kernels/cuda/
// wgmma.h), the operands stored as core matrices as wgmma.h describes: A
// 64 x 16 and B 128 x 16 (k-major: b[n * 16 + k]) as bf16 bits, C and D
// 64 x 128 row-major, each thread's registers mapped as wgmma.h says.
std::vector<float> warpgroupMma(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                const std::vector<float>& c);

// The two 16 x 64 boxes at (row, column) and (row, column + 64) of a rows x k
// bf16 matrix (bits, row-major), copied by kernels/cuda/tma.h's tensor
// copies through bf16RowsTensorMap (128-byte swizzle) on one mbarrier's
// phases 0 and 1 (wgmmaAvailable() must hold): the 4,096 bytes of shared
// memory they landed in, as they lie.
std::vector<uint8_t> tensorCopy(const std::vector<uint16_t>& matrix, int64_t rows, int64_t k,
                                int32_t column, int32_t row);

// loadMatrices (loadMatricesTransposed where `transposed`) over a 32 x 8
// bf16 tile in shared memory (matrix i is rows 8i..8i + 7): out[4 · lane +
// i] is lane's r[i].
std::vector<uint32_t> loadMatrices(const std::vector<uint16_t>& tile, bool transposed);

// out[lane] = __shfl_xor_sync of each lane's own id with `lane_mask`.
std::vector<int> shuffleXor(int lane_mask);

// 16-byte vectors copied global -> shared by copyAsync16 (vector i valid or
// zero-filled), waited for, then shared -> global.
std::vector<uint8_t> copyThroughShared(const std::vector<uint8_t>& bytes,
                                       const std::vector<uint8_t>& valid);

// Two blocks of `threads` threads: thread t stores 1000 · block + t in
// shared memory, then, with no barrier, reads thread t + 1's slot (the last
// thread its own). A race: what it reads is out[block · threads + t].
std::vector<int> neighbourWithoutBarrier(int threads);

// Two blocks of two warps: warp 1 stores 1000 · block + t, then, with no
// barrier but two __syncwarp in each warp, warp 0 reads warp 1's slots.
// out[block · 32 + t] is what thread t of warp 0 read.
std::vector<int> crossWarpWithoutBarrier();

// Three blocks of 32 threads reading a static __shared__ array before any
// thread writes it, then writing it: out[block · 32 + t] is the first read.
std::vector<uint32_t> sharedBeforeWrite();

// Stream capture with a cudaMalloc in the middle (global capture mode):
// {the cudaMalloc's error, cudaStreamEndCapture's error}.
std::vector<int> mallocDuringCapture();

// The error of a launch asking for `shared_bytes` of dynamic shared memory
// without raising the kernel's limit (cudaGetLastError after the launch).
int launchErrorForSharedBytes(int shared_bytes);

// A warp whose lanes 0-15 shuffle while lanes 16-31 wait at __syncwarp,
// all with full masks (undefined on a GPU; the emulator stops).
void divergentWarp();

}  // namespace tandem::cuda_probe
