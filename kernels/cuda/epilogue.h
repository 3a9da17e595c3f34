// What a matmul kernel of the CUDA backend does with each output y[row,
// column] of its m x n result as it stores it: the step after the matmul
// in the model (Backend::matmulAdd, matmulSplit, matmulSiluMul,
// matmulQkvRope), done in the kernel's epilogue instead of by kernels of
// their own.
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
//    at 2j + 1, Backend::StackedLayout::kPairs): y[row, j] = siluTimes(gate,
//    up), row stride inter (siluMul); and where `next` is set, that value
//    rounded to bf16 into the down projection's x fragments as well;
//  - kQkvRope: the stacked q/k/v of Backend::matmulQkvRope in
//    StackedLayout::kPairs order (in q and k, column h * head_dim + 2i is
//    row i of head h and 2i + 1 its row i + head_dim / 2): the biases added
//    (addBias), the pair rotated at the row's position (applyRope's
//    ropeCosSin and ropeRotate), q stored to y (row stride q_width), k and
//    v of active rows into the cache (writeKv's storeKv).
// A kernel stores the pair kinds' outputs in pairs only (storePair with an
// even column), so both halves meet in one thread.
// The reference matmul, which has no epilogue, stores its plain output
// and launchMatmulEpilogue applies the step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/weight_layout.h"

namespace tandem::kernels::cuda {

// The x of a bf16 decode matmul (matmul_bf16_mma.cu's skinny kernel), in the
// fragment order that kernel reads (weight_layout.h MmaFragmentTiling, x's
// rows in the place of the weights' columns), written by the kernel that
// computes x as it stores each value (rmsNorm, attention's combine, the
// SiLU·up epilogue), so the matmul needs no launch of its own to round x.
// Each element is f32ToBf16Bits of the stored value, as the matmul's own
// rounding makes it, so the fragments' bits are the same. Only real
// elements are written; the buffer's padding (k past the row) was zeroed
// when it was made and no row of another k ever lands there (the buffer
// belongs to one k). Rows past the batch are never written and reach only
// the matmul's rows past the batch, which it never stores.
struct NextFragments {
  uint16_t* data = nullptr;  // nullptr: no fragments to write
  int64_t k = 0;             // x's row length

  __device__ __forceinline__ void store(int64_t row, int64_t kk, float value) const {
    data[MmaFragmentTiling{0, k}.elementOffset(row, kk)] = f32ToBf16Bits(value);
  }
};

// out = g / (1 + e^-g) * up, in the CPU's order of operations: siluMul's
// one definition on the device.
__device__ __forceinline__ float siluTimes(float g, float up) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up);
}

// RoPE of one pair (first = element i, second = element i + head_dim / 2)
// at `position` with inv_freq[i]: the angle in fp32, its cos/sin evaluated
// in double and rounded to fp32 (as kernels/cpu/dispatch.cpp does), the
// rotation in unfused multiplies and adds (the CPU's -ffp-contract=off).
__device__ __forceinline__ void ropeCosSin(int32_t position, float inv_freq, float& c, float& s) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq);
  c = static_cast<float>(cos(static_cast<double>(angle)));
  s = static_cast<float>(sin(static_cast<double>(angle)));
}

__device__ __forceinline__ void ropeRotate(float& first, float& second, float c, float s) {
  const float a = first;
  const float b = second;
  first = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  second = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// What kQkvRope needs beyond y (q).
struct QkvRopeEpilogue {
  int64_t q_width = 0;
  int64_t kv_width = 0;
  int64_t head_dim = 0;
  const float* q_bias = nullptr;  // nullptr: none
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* inv_freq = nullptr;
  const int32_t* positions = nullptr;  // the batch's, per row
  const RowKv* row_kv = nullptr;
  const int32_t* block_tables = nullptr;
  CacheGeometry cache;
};

struct MatmulEpilogue {
  enum Kind : int32_t { kStore, kAdd, kSplit, kSiluPairs, kQkvRope };
  static constexpr int kMaxParts = 3;

  Kind kind = kStore;
  float* y = nullptr;  // kStore, kAdd, kSiluPairs
  float* parts[kMaxParts] = {};
  int64_t widths[kMaxParts] = {};
  QkvRopeEpilogue qkv;
  NextFragments next;  // kSiluPairs: the down projection's x fragments

  static MatmulEpilogue store(float* y) {
    MatmulEpilogue e;
    e.y = y;
    return e;
  }
  // Stored in column pairs only (storePair).
  __host__ __device__ bool inPairs() const { return kind == kSiluPairs || kind == kQkvRope; }

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
      case kQkvRope:
        return;  // stored in pairs only
    }
  }

  // Outputs `column` (even) and column + 1 of one row, both inside n.
  __device__ __forceinline__ void storePair(int64_t row, int64_t column, int64_t n, float first,
                                            float second) const {
    if (kind == kSiluPairs) {
      const float value = siluTimes(first, second);
      y[row * (n / 2) + column / 2] = value;
      if (next.data != nullptr) next.store(row, column / 2, value);
      return;
    }
    if (kind == kQkvRope) {
      storeQkvPair(row, column, first, second);
      return;
    }
    storeOne(row, column, n, first);
    storeOne(row, column + 1, n, second);
  }

  // Outputs `column` (even) and column + 1 of a kQkvRope row.
  __device__ __forceinline__ void storeQkvPair(int64_t row, int64_t column, float first,
                                               float second) const {
    const QkvRopeEpilogue& e = qkv;
    if (column < e.q_width + e.kv_width) {
      const bool is_k = column >= e.q_width;
      const int64_t c = is_k ? column - e.q_width : column;
      const int64_t i = c % e.head_dim / 2;
      const int64_t at = c / e.head_dim * e.head_dim + i;  // element i of the head
      const int64_t half = e.head_dim / 2;
      const float* bias = is_k ? e.k_bias : e.q_bias;
      if (bias != nullptr) {
        first = __fadd_rn(first, bias[at]);
        second = __fadd_rn(second, bias[at + half]);
      }
      float cos_value;
      float sin_value;
      ropeCosSin(e.positions[row], e.inv_freq[i], cos_value, sin_value);
      ropeRotate(first, second, cos_value, sin_value);
      if (!is_k) {
        y[row * e.q_width + at] = first;
        y[row * e.q_width + at + half] = second;
        return;
      }
      const RowKv info = e.row_kv[row];
      if (info.active == 0) return;
      storeKv(e.cache, e.block_tables, info, e.cache.k_offset, at, first);
      storeKv(e.cache, e.block_tables, info, e.cache.k_offset, at + half, second);
      return;
    }
    const int64_t c = column - e.q_width - e.kv_width;
    if (e.v_bias != nullptr) {
      first = __fadd_rn(first, e.v_bias[c]);
      second = __fadd_rn(second, e.v_bias[c + 1]);
    }
    const RowKv info = e.row_kv[row];
    if (info.active == 0) return;
    storeKv(e.cache, e.block_tables, info, e.cache.v_offset, c, first);
    storeKv(e.cache, e.block_tables, info, e.cache.v_offset, c + 1, second);
  }
};

// A warp's m16n8 accumulator tiles, each output +0: where every output's
// mma chain starts.
template <int kTilesM, int kTilesN>
__device__ __forceinline__ void zeroTiles(float (&acc)[kTilesM][kTilesN][4]) {
#pragma unroll
  for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }
}

// A warp's tensor-core accumulators through an epilogue: mma tile (i, j)
// (an m16n8 C fragment, or 16 x 8 of a wgmma accumulator) covers rows
// row0 + 16i (+ 8) and columns column0 + 8j (+ 1), as the m16n8 C fragment
// lays them out for this lane (row0 and column0, even, already hold its
// group and quad), so a lane holds each pair of outputs the epilogue may
// combine; nothing past m or n is stored.
template <int kTilesM, int kTilesN>
__device__ __forceinline__ void storeTiles(const float (&acc)[kTilesM][kTilesN][4], int64_t row0,
                                           int64_t column0, int64_t m, int64_t n,
                                           const MatmulEpilogue& out) {
#pragma unroll
  for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const int64_t column = column0 + j * 8;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = row0 + i * 16 + half * 8;
        if (row >= m) continue;
        if (column + 1 < n) {
          out.storePair(row, column, n, acc[i][j][half * 2], acc[i][j][half * 2 + 1]);
        } else if (column < n) {
          out.storeOne(row, column, n, acc[i][j][half * 2]);
        }
      }
    }
  }
}

// The epilogue of a kernel that stored its plain m x n result in `t`:
// e's step applied to every output (pairs for kSiluPairs). One launch.
void launchMatmulEpilogue(cudaStream_t stream, const float* t, int64_t m, int64_t n,
                          const MatmulEpilogue& e);

}  // namespace tandem::kernels::cuda
