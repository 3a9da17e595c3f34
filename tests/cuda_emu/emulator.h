// What the CUDA emulator's device side (device.cpp) and its runtime API
// (runtime.cpp) share. Internal to tests/cuda_emu/.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tandem::cuda_emu {

// Runs `work` now, or appends it to the graph `stream` is capturing.
void enqueue(cudaStream_t stream, std::function<void()> work);

// What the emulated device has run so far, issued one by one or replayed
// from a graph alike: kernel grids, and stream operations (grids, copies,
// memsets), and the grids' dynamic shared memory. Tests count a decode
// step's launches with it, and tell which of a kernel's launches ran.
// And the 8 x 8 matrices ldmatrix read, with the shared-memory wavefronts
// their bank conflicts cost beyond one a matrix (device.cpp
// loadMatrixLanes): what Nsight Compute counts as shared-load bank
// conflicts on a GPU. And the bytes cudaMemcpy(Async) moved between the
// device and host memory that is not page-locked (neither cudaMallocHost's
// nor cudaHostRegister'ed), which a GPU copies through the driver's
// staging at a fraction of the link's rate.
struct DeviceCounts {
  int64_t kernels = 0;
  int64_t operations = 0;
  int64_t dynamic_shared_bytes = 0;  // summed over grids
  int64_t matrix_loads = 0;
  int64_t matrix_load_conflicts = 0;
  int64_t pageable_copy_bytes = 0;
};
DeviceCounts deviceCounts();
// A grid with `shared_bytes` of dynamic shared memory is about to run
// (device.cpp).
void countKernel(size_t shared_bytes);
// An ldmatrix read `matrices` matrices with `conflicts` extra wavefronts.
void countMatrixLoads(int64_t matrices, int64_t conflicts);
// A copy moved `bytes` to or from host memory that is not page-locked.
void countPageableCopy(size_t bytes);
// The sticky error cudaGetLastError returns (and clears).
void setLastError(cudaError_t error);
// Dynamic shared memory a kernel may use: 48 KiB, or what
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize)
// allowed.
size_t maxDynamicShared(const void* kernel);
// The emulated device's multiprocessors and opt-in shared memory per block.
constexpr int kMultiprocessors = 4;
constexpr size_t kSharedPerBlockOptin = 232448;
constexpr size_t kSharedPerBlockDefault = 48 * 1024;

// What the emulated cuTensorMapEncodeTiled (runtime.cpp) writes into a
// CUtensorMap's 128 opaque bytes and a tensor copy (device.cpp) reads: a
// two-dimensional map, elements `element_bytes` wide, dims[0] of them
// contiguous per row, rows `row_bytes` apart; boxes of box[0] x box[1];
// swizzle_bytes 0 (none) or 128.
struct TensorMapFields {
  uint64_t magic = 0;
  const unsigned char* address = nullptr;
  uint64_t dims[2] = {0, 0};
  uint64_t row_bytes = 0;
  uint32_t box[2] = {0, 0};
  uint32_t element_bytes = 0;
  uint32_t swizzle_bytes = 0;
};
inline constexpr uint64_t kTensorMapMagic = 0x54414e44454d4d41ull;

// fault (device.h): aborts the program with a message, where a GPU would
// report an illegal instruction or address, or hang.

}  // namespace tandem::cuda_emu
