// What a matmul kernel of the CUDA backend does with each output y[row,
// column] of its m x n result as it stores it: the step after the matmul
// in the model (Backend::matmulAdd, matmulSplit, matmulSiluMul), done in the
// kernel's epilogue instead of by kernels of their own.
//
// Bits: each kind computes exactly what the unfused step computes from the
// stored output, with the same device functions, so a fused matmul gives
// every value the bits of the matmul followed by that step:
//  - kStore: y[row, column] = v (plain matmul);
//  - kAdd: y[row, column] = __fadd_rn(y[row, column], v) (addInPlace);
//  - kSplit: column c of the first parts[0] columns to parts[0][row, c],
//    the next widths[1] to parts[1], the rest to parts[2], each part its
//    own row-major matrix (copyColumns);
//  - kSiluPairs: n = 2 * inter outputs in pairs (gate j at column 2j, up j
//    at 2j + 1, Backend::GateUpLayout::kPairs): y[row, j] = siluTimes(gate,
//    up), row stride inter (siluMul). A kernel stores such outputs in pairs
//    only (storePair with an even column), so both halves meet in one
//    thread.
// A kernel that cannot store pairs runs kSiluPairs through its plain
// output and launchMatmulEpilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels::cuda {

// out = g / (1 + e^-g) * up, in the CPU's order of operations: siluMul's
// one definition on the device.
__device__ __forceinline__ float siluTimes(float g, float up) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up);
}

struct MatmulEpilogue {
  enum Kind : int32_t { kStore, kAdd, kSplit, kSiluPairs };
  static constexpr int kMaxParts = 3;

  Kind kind = kStore;
  float* y = nullptr;  // kStore, kAdd, kSiluPairs
  float* parts[kMaxParts] = {};
  int64_t widths[kMaxParts] = {};

  static MatmulEpilogue store(float* y) { return {kStore, y}; }

  // One output, of a matmul with n columns (kStore, kAdd, kSplit).
  __device__ __forceinline__ void storeOne(int64_t row, int64_t column, int64_t n,
                                           float value) const {
    switch (kind) {
      case kStore:
        y[row * n + column] = value;
        return;
      case kAdd: {
        float* out = y + row * n + column;
        *out = __fadd_rn(*out, value);
        return;
      }
      case kSplit: {
        // Constant indices only: a run-time index into the parameter's
        // arrays would copy them to local memory in every thread.
        static_assert(kMaxParts == 3, "one branch per part");
        if (column < widths[0]) {
          parts[0][row * widths[0] + column] = value;
        } else if (column < widths[0] + widths[1]) {
          parts[1][row * widths[1] + column - widths[0]] = value;
        } else {
          parts[2][row * widths[2] + column - widths[0] - widths[1]] = value;
        }
        return;
      }
      case kSiluPairs:
        return;  // stored in pairs only
    }
  }

  // Outputs `column` (even) and column + 1 of one row, both inside n.
  __device__ __forceinline__ void storePair(int64_t row, int64_t column, int64_t n, float first,
                                            float second) const {
    if (kind == kSiluPairs) {
      y[row * (n / 2) + column / 2] = siluTimes(first, second);
      return;
    }
    storeOne(row, column, n, first);
    storeOne(row, column + 1, n, second);
  }
};

// The epilogue of a kernel that stored its plain m x n result in `t`:
// e's step applied to every output (pairs for kSiluPairs). One launch.
void launchMatmulEpilogue(cudaStream_t stream, const float* t, int64_t m, int64_t n,
                          const MatmulEpilogue& e);

}  // namespace tandem::kernels::cuda
