// The fast decode GEMV of the CUDA backend (--cuda-kernels fast; off by
// default): y[m, n] = x[m, k] · w[n, k]^T for m <= 64 over weights re-laid by
// weight_layout.h (f32, bf16 or f16, widened to fp32), fp32 accumulation.
//
// Same bits as the reference kernels (matmul.cu). Every output y[i, j] is
// computed in the reference order, fixed by k alone:
//  - k is cut into chunks of 128. The partial of chunk c is one fma chain
//    part = fmaf(x[i, kk], w[j, kk], part), from +0.0f, over kk = 128c,
//    128c + 1, ..., min(k, 128c + 128) - 1 in that order, computed whole by
//    one thread: lane l of the warp that owns tile (column group g, chunk c)
//    owns column 32g + l and walks its 16-byte vectors step by step, the
//    elements of a vector in order. A chain stops at k: padded positions
//    of the last chunk are never multiplied (a padded fma(x, 0, -0) would
//    give +0), and x is never read past a row.
//  - The partials are added in chunk order, total = part_0, then
//    total = __fadd_rn(total, part_c), by one thread per output in the fold
//    kernel.
// Which warp computes which tile, how many warps there are (they follow the
// SM count), how many columns one launch covers (they follow the scratch),
// and m change who computes a chain, never the chain: a row's bits do not
// depend on the batch, and equal the reference kernels'.
//
// Speed (decode is a stream of the weights):
//  - the layout gives each warp load 512 contiguous bytes (16 per lane),
//    and each warp's run of consecutive tiles is one contiguous stream;
//  - loads are cp.async into shared memory, kGemvStages slabs (4 KB per warp
//    each) deep, so two slabs per warp are in flight while one is
//    multiplied; each lane reads back only the 16-byte pieces it copied
//    itself, so no barrier is needed, only cp.async.wait_group;
//  - the tiles are spread evenly over 16 warps per SM whatever n is (split
//    over k as well as n), so small matrices keep every SM busy too;
//  - each weight is read once for all m rows (up to 64 partials per lane in
//    registers); x comes through the L1 cache, one broadcast load per lane.
// The fold stores through an epilogue (epilogue.h), after the last add, so
// the fused steps see the reference's bits. It is a kernel of its own, or,
// with fused launches (CudaBackendOptions::fused_launches), done inside the
// partial kernel by the warp that writes a column group's last chunk
// partial: each warp, after a tile's partials, fences and counts the tile
// in the group's arrival counter; the warp that counts the group's last
// chunk folds its 32 columns (foldPartials, the same adds in the same
// order, the partials read through L2) and sets the counter back to zero
// for the next launch. One launch per matmul instead of two.
// The chunk partials (m x chunks x columns floats) go through a scratch
// buffer the backend owns; when it cannot hold every column group, the
// columns are done in slices, one launch pair per slice.
#include <cuda_runtime.h>

#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ptx.h"
#include "kernels/cuda/weight_layout.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kFoldThreads = 256;

// One 16-byte vector of weights as fp32: 8 bf16/f16 or 4 f32.
template <typename Elements>
__device__ __forceinline__ void widen(const uint4& bits, float out[8]) {
  if constexpr (sizeof(typename Elements::Storage) == 4) {
    out[0] = __uint_as_float(bits.x);
    out[1] = __uint_as_float(bits.y);
    out[2] = __uint_as_float(bits.z);
    out[3] = __uint_as_float(bits.w);
  } else {
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const auto low = static_cast<uint16_t>(words[e] & 0xffffu);
      const auto high = static_cast<uint16_t>(words[e] >> 16);
      out[2 * e] = Elements::load(&low, 0);
      out[2 * e + 1] = Elements::load(&high, 0);
    }
  }
}

// Output (r, column): the column's chunk partials added in chunk order.
// kFromL2: read through L2 only (partials other SMs wrote in this launch).
template <bool kFromL2 = false>
__device__ __forceinline__ float foldPartials(const float* __restrict__ partials, int m,
                                              int64_t chunks, int64_t r, int64_t column,
                                              int64_t slice_first, int64_t slice_columns) {
  auto at = [&](int64_t c) {
    const float* p = partials + gemvPartialIndex(c, r, column, m, slice_first, slice_columns);
    if constexpr (kFromL2) return __ldcg(p);
    return *p;
  };
  float total = at(0);
  for (int64_t c = 1; c < chunks; ++c) total = __fadd_rn(total, at(c));
  return total;
}

// The fused fold (header): column group `group`'s outputs, by one warp.
// Pair kinds: lane l takes the pair (2j, 2j + 1), j = l % 16, of rows l /
// 16, l / 16 + 2, ...; others: lane l column 32 * group + l of every row.
__device__ __forceinline__ void foldGroup(const float* __restrict__ partials, int m,
                                          const GemvTiling& t, int64_t group, int64_t slice_first,
                                          int64_t slice_columns, const MatmulEpilogue& out,
                                          int lane) {
  const int64_t chunks = t.chunks();
  if (out.inPairs()) {
    const int64_t column = group * kGemvTileCols + lane % 16 * 2;
    if (column >= t.n) return;
    for (int r = lane / 16; r < m; r += 2) {
      const float first =
          foldPartials<true>(partials, m, chunks, r, column, slice_first, slice_columns);
      const float second =
          foldPartials<true>(partials, m, chunks, r, column + 1, slice_first, slice_columns);
      out.storePair(r, column, t.n, first, second);
    }
    return;
  }
  const int64_t column = group * kGemvTileCols + lane;
  if (column >= t.n) return;
  for (int r = 0; r < m; ++r) {
    out.storeOne(r, column, t.n,
                 foldPartials<true>(partials, m, chunks, r, column, slice_first, slice_columns));
  }
}

// The partials of tiles [tile_begin, tile_begin + tile_count) (one slice of
// column groups) for rows 0..m-1 into `partials` (gemvPartialIndex).
// `vector_x`: x is 16-byte aligned and k a multiple of 4, so full steps read
// x with 16-byte loads; the chain is the same either way. kFold: the fused
// fold (header), through `out`, counting arrivals in `arrivals` (one per
// column group of the matrix, zero at the launch, zero again at its end).
template <typename Elements, int kRows, bool kFold>
__global__ void __launch_bounds__(kGemvWarpsPerBlock* kWarp)
    gemvPartialKernel(const float* __restrict__ x, int m, GemvTiling t,
                      const uint8_t* __restrict__ w, int64_t tile_begin, int64_t tile_count,
                      int64_t warps, float* __restrict__ partials, int64_t slice_first,
                      int64_t slice_columns, bool vector_x, MatmulEpilogue out,
                      unsigned int* arrivals) {
  constexpr int kVector = 16 / static_cast<int>(sizeof(typename Elements::Storage));
  __shared__ uint4 ring[kGemvWarpsPerBlock][kGemvStages][kGemvSlabSteps][kWarp];
  const int warp_in_block = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kGemvWarpsPerBlock + warp_in_block;
  if (warp >= warps) return;  // whole warps leave; no block-wide barrier follows
  const int64_t first = tile_begin + gemvWarpFirstTile(tile_count, warps, warp);
  const int64_t last = tile_begin + gemvWarpFirstTile(tile_count, warps, warp + 1);
  const int64_t slabs = (last - first) * t.slabsPerTile();
  auto& stages = ring[warp_in_block];

  auto issue = [&](int64_t q) {
    const int64_t tile = gemvSlabTile(t, first, q);
    const int64_t step0 = gemvSlabStep(t, q);
    const uint8_t* from = w + t.offset(tile, step0, lane, 0) * t.element_bytes;
    auto& stage = stages[q % kGemvStages];
#pragma unroll
    for (int j = 0; j < kGemvSlabSteps; ++j) {
      copyAsync16(&stage[j][lane], from + j * kGemvTileCols * kGemvVectorBytes);
    }
  };

  // Every iteration commits one group (empty ones too), so group q is slab q.
#pragma unroll
  for (int q = 0; q < kGemvStages - 1; ++q) {
    if (q < slabs) issue(q);
    commitCopies();
  }

  float part[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) part[r] = 0.0f;

  for (int64_t q = 0; q < slabs; ++q) {
    // The stage slab q + kGemvStages - 1 goes to held slab q - 1, whose
    // every weight this lane has already multiplied.
    if (q + kGemvStages - 1 < slabs) issue(q + kGemvStages - 1);
    commitCopies();
    waitCopies<kGemvStages - 1>();  // slab q has landed

    const int64_t tile = gemvSlabTile(t, first, q);
    const int64_t step0 = gemvSlabStep(t, q);
    const int64_t chunk = t.tileChunk(tile);
    const int length = static_cast<int>(t.chunkLength(chunk));
    if (step0 == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) part[r] = 0.0f;
    }
    const auto& stage = stages[q % kGemvStages];
#pragma unroll 1
    for (int j = 0; j < kGemvSlabSteps; ++j) {
      const int base = static_cast<int>(step0 + j) * kVector;
      if (base >= length) break;
      float wv[8];
      widen<Elements>(stage[j][lane], wv);
      const int64_t kk = chunk * kGemvChunk + base;
      if (base + kVector <= length) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r >= m) break;
          const float* xr = x + static_cast<int64_t>(r) * t.k + kk;
          float xv[kVector];
          if (vector_x) {
#pragma unroll
            for (int v = 0; v < kVector / 4; ++v) {
              const float4 four = __ldg(reinterpret_cast<const float4*>(xr) + v);
              xv[4 * v] = four.x, xv[4 * v + 1] = four.y, xv[4 * v + 2] = four.z,
                     xv[4 * v + 3] = four.w;
            }
          } else {
#pragma unroll
            for (int e = 0; e < kVector; ++e) xv[e] = __ldg(xr + e);
          }
#pragma unroll
          for (int e = 0; e < kVector; ++e) part[r] = fmaf(xv[e], wv[e], part[r]);
        }
      } else {
        // The last, short step of the last chunk: the chain stops at k.
        const int count = length - base;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r >= m) break;
          const float* xr = x + static_cast<int64_t>(r) * t.k + kk;
#pragma unroll
          for (int e = 0; e < kVector; ++e) {
            if (e < count) part[r] = fmaf(__ldg(xr + e), wv[e], part[r]);
          }
        }
      }
    }
    if (step0 + kGemvSlabSteps == t.steps()) {  // the tile's last slab: its chains are done
      const int64_t column = t.column(tile, lane);
      if (column < t.n) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r >= m) break;
          partials[gemvPartialIndex(chunk, r, column, m, slice_first, slice_columns)] = part[r];
        }
      }
      if constexpr (kFold) {
        // Every lane's partials are out (device-wide) before lane 0 counts
        // the tile; the warp that counts the group's last chunk folds it.
        __threadfence();
        __syncwarp();
        const int64_t group = t.tileGroup(tile);
        unsigned int* arrived = arrivals + group;
        unsigned int before = 0;
        if (lane == 0) before = atomicAdd(arrived, 1u);
        before = __shfl_sync(0xffffffffu, before, 0);
        if (before + 1 == static_cast<unsigned int>(t.chunks())) {
          // A shuffle orders no memory: every lane meets lane 0 (whose
          // atomic came first) at a warp barrier before its own fence.
          __syncwarp();
          __threadfence();
          foldGroup(partials, m, t, group, slice_first, slice_columns, out, lane);
          if (lane == 0) *arrived = 0;
        }
      }
    }
  }
  waitCopies<0>();  // leave no copy in flight into shared memory
}

// Each output folded and stored through the epilogue: one per thread, or
// (kPairs, for the pair kinds) columns 2j and 2j + 1 by one thread; a slice
// starts at a multiple of kGemvTileCols, so pairs never straddle slices.
template <bool kPairs>
__global__ void __launch_bounds__(kFoldThreads)
    gemvFoldKernel(const float* __restrict__ partials, int m, int64_t chunks, int64_t n,
                   int64_t slice_first, int64_t slice_columns, MatmulEpilogue out) {
  constexpr int kWidth = kPairs ? 2 : 1;
  const int64_t per_row = slice_columns / kWidth;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kFoldThreads + threadIdx.x;
  if (index >= m * per_row) return;
  const int64_t r = index / per_row;
  const int64_t column = slice_first + index % per_row * kWidth;
  if (column >= n) return;
  const float first = foldPartials(partials, m, chunks, r, column, slice_first, slice_columns);
  if constexpr (kPairs) {
    const float second =
        foldPartials(partials, m, chunks, r, column + 1, slice_first, slice_columns);
    out.storePair(r, column, n, first, second);
  } else {
    out.storeOne(r, column, n, first);
  }
}

template <typename Elements>
void launchFor(cudaStream_t stream, const float* x, int64_t m, const GemvTiling& t,
               const uint8_t* w, const MatmulEpilogue& out, float* scratch, int64_t scratch_floats,
               int sm_count, unsigned int* arrivals) {
  const bool vector_x = t.k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t per_slice = gemvGroupsPerSlice(t, m, scratch_floats);
  for (int64_t g0 = 0; g0 < t.groups(); g0 += per_slice) {
    const int64_t g1 = g0 + per_slice < t.groups() ? g0 + per_slice : t.groups();
    const int64_t tile_begin = g0 * t.chunks();
    const int64_t tile_count = (g1 - g0) * t.chunks();
    const int64_t warps = gemvWarps(tile_count, sm_count);
    const int64_t slice_first = g0 * kGemvTileCols;
    const int64_t slice_columns = (g1 - g0) * kGemvTileCols;
    const auto blocks = static_cast<unsigned int>(ceilDiv(warps, kGemvWarpsPerBlock));
    constexpr unsigned int kThreads = kGemvWarpsPerBlock * kWarp;
    auto partials = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream>>>(x, static_cast<int>(m), t, w, tile_begin, tile_count,
                                              warps, scratch, slice_first, slice_columns, vector_x,
                                              out, arrivals);
    };
    if (arrivals != nullptr) {
      if (m <= 8) {
        partials(gemvPartialKernel<Elements, 8, true>);
      } else {
        partials(gemvPartialKernel<Elements, kGemvMaxRows, true>);
      }
      continue;  // folded by the partial kernel
    }
    if (m <= 8) {
      partials(gemvPartialKernel<Elements, 8, false>);
    } else {
      partials(gemvPartialKernel<Elements, kGemvMaxRows, false>);
    }
    if (out.inPairs()) {
      const auto fold_blocks =
          static_cast<unsigned int>(ceilDiv(m * slice_columns / 2, kFoldThreads));
      gemvFoldKernel<true><<<fold_blocks, kFoldThreads, 0, stream>>>(
          scratch, static_cast<int>(m), t.chunks(), t.n, slice_first, slice_columns, out);
    } else {
      const auto fold_blocks = static_cast<unsigned int>(ceilDiv(m * slice_columns, kFoldThreads));
      gemvFoldKernel<false><<<fold_blocks, kFoldThreads, 0, stream>>>(
          scratch, static_cast<int>(m), t.chunks(), t.n, slice_first, slice_columns, out);
    }
  }
}

}  // namespace

int64_t fastGemvScratchFloats(int64_t m, int64_t k, const WeightView& w, int64_t cap_floats) {
  const GemvTiling t{w.rows, k, static_cast<int64_t>(dtypeSize(w.dtype))};
  return gemvScratchFloats(t, m, cap_floats);
}

int64_t fastGemvGroups(int64_t k, const WeightView& w) {
  return GemvTiling{w.rows, k, static_cast<int64_t>(dtypeSize(w.dtype))}.groups();
}

void launchFastGemv(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                    const WeightView& relaid, const MatmulEpilogue& out, float* scratch,
                    int64_t scratch_floats, int sm_count, unsigned int* arrivals) {
  TANDEM_CHECK(relaid.cols == k, "fast GEMV: weight columns must equal k");
  TANDEM_CHECK(m <= kGemvMaxRows, "fast GEMV: more rows than it takes");
  const int64_t n = relaid.rows;
  if (m <= 0 || n <= 0 || k <= 0) return;
  const GemvTiling t{n, k, static_cast<int64_t>(dtypeSize(relaid.dtype))};
  TANDEM_CHECK(scratch_floats >= gemvGroupScratchFloats(t, m), "fast GEMV: scratch too small");
  TANDEM_CHECK(reinterpret_cast<uintptr_t>(relaid.data) % 16 == 0,
               "fast GEMV: re-laid weights must be 16-byte aligned");
  const auto* w = static_cast<const uint8_t*>(relaid.data);
  switch (relaid.dtype) {
    case DType::kF32:
      launchFor<F32Elements>(stream, x, m, t, w, out, scratch, scratch_floats, sm_count, arrivals);
      return;
    case DType::kBF16:
      launchFor<Bf16Elements>(stream, x, m, t, w, out, scratch, scratch_floats, sm_count, arrivals);
      return;
    case DType::kF16:
      launchFor<F16Elements>(stream, x, m, t, w, out, scratch, scratch_floats, sm_count, arrivals);
      return;
    case DType::kF8E4M3:
      // The model runner refuses fp8 weights on this backend before any launch.
      TANDEM_CHECK(false, "fp8 weights reached a CUDA kernel");
      return;
    case DType::kU8:
      TANDEM_CHECK(false, "u8 bytes reached a CUDA kernel (MXFP4 runs on the CPU backend only)");
      return;
  }
}

}  // namespace tandem::kernels::cuda
