// The weight layout of the CUDA backend's fast decode GEMV (gemv_fast.cu),
// and its index arithmetic, shared by the kernel and its host emulation in
// tests/unit/kernels/weight_layout_test.cpp (with the bf16 decode kernel's
// fragment layout and the wide bf16 GEMM's tile order, below). Plain C++: compiled into
// tandem_kernels with or without CUDA.
//
// The reference kernels (matmul.cu) give output y[i, j] one sum order, fixed
// by k alone: k is cut into chunks of kGemvChunk = 128; each chunk is one fma
// chain part = fma(x[i, kk], w[j, kk], part), from +0, over its kk in
// ascending order; the chunks' partials are added in chunk order (total =
// part_0, then total = total + part_c, rounded adds). The fast GEMV keeps
// that order and only changes where the weights lie, so that every warp load
// is 512 contiguous bytes.
//
// Layout. An n x k row-major matrix of 2- or 4-byte elements (bf16, f16,
// f32; opaque here) is cut into tiles of kGemvTileCols = 32 output columns
// (one per lane of a warp) by one 128-wide chunk of k. Tiles are stored
// column-group major, chunk minor: tile t = g * chunks + c holds columns
// 32g .. 32g + 31 and k from 128c. Inside a tile, V = 16 / element_bytes
// elements (one 16-byte vector) per (step, lane), steps of V consecutive k:
//
//   element (tile t, step s, lane l, e) = w[32g + l][128c + s * V + e]
//   at element offset t * 4096 + (s * 32 + l) * V + e
//
// so lane l of a warp reads, at each step, the next V weights of its own
// column's chain, and the warp's 32 lanes read 512 contiguous bytes. A
// warp's run of consecutive tiles is one contiguous stream.
//
// Padding. Columns past n (the last group) and k past the matrix (the last
// chunk) are zero. Padded k positions are never part of a real column's
// chain: the kernel stops each chunk's chain at k (chunkLength()), so it
// never computes fma(x, 0, part), which would turn a chain that is -0 into
// +0 (-0 + +0 = +0) and would need an x past the end of the row. Padded
// columns are computed (lanes stay in step) but never stored; their
// products may be NaN when x holds an inf, which is why they must not be.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::kernels::cuda {

constexpr int64_t kGemvTileCols = 32;     // one output column per lane
constexpr int64_t kGemvChunk = 128;       // matmul.cu's kChunk
constexpr int64_t kGemvVectorBytes = 16;  // one cp.async / 16-byte load per lane and step
constexpr int64_t kGemvTileElements = kGemvTileCols * kGemvChunk;
// Steps a warp moves per pipeline stage (cp.async group): 8 x 512 bytes.
constexpr int64_t kGemvSlabSteps = 8;

// Geometry of one re-laid n x k matrix of element_bytes-byte elements.
struct GemvTiling {
  int64_t n = 0;
  int64_t k = 0;
  int64_t element_bytes = 2;  // 2 (bf16, f16) or 4 (f32)

  TANDEM_HOST_DEVICE int64_t groups() const { return (n + kGemvTileCols - 1) / kGemvTileCols; }
  TANDEM_HOST_DEVICE int64_t chunks() const { return (k + kGemvChunk - 1) / kGemvChunk; }
  TANDEM_HOST_DEVICE int64_t tiles() const { return groups() * chunks(); }
  // Elements per 16-byte vector: 8 or 4.
  TANDEM_HOST_DEVICE int64_t vector() const { return kGemvVectorBytes / element_bytes; }
  // Steps per tile: 16 (2-byte elements) or 32 (4-byte).
  TANDEM_HOST_DEVICE int64_t steps() const { return kGemvChunk / vector(); }
  TANDEM_HOST_DEVICE int64_t slabsPerTile() const { return steps() / kGemvSlabSteps; }
  TANDEM_HOST_DEVICE int64_t elements() const { return tiles() * kGemvTileElements; }
  TANDEM_HOST_DEVICE int64_t bytes() const { return elements() * element_bytes; }

  TANDEM_HOST_DEVICE int64_t tileGroup(int64_t tile) const { return tile / chunks(); }
  TANDEM_HOST_DEVICE int64_t tileChunk(int64_t tile) const { return tile % chunks(); }
  // Real k positions of chunk c: 128, or fewer for the last.
  TANDEM_HOST_DEVICE int64_t chunkLength(int64_t chunk) const {
    const int64_t rest = k - chunk * kGemvChunk;
    return rest < kGemvChunk ? rest : kGemvChunk;
  }
  // Element offset of (tile, step, lane, e) in the re-laid matrix.
  TANDEM_HOST_DEVICE int64_t offset(int64_t tile, int64_t step, int64_t lane, int64_t e) const {
    return tile * kGemvTileElements + (step * kGemvTileCols + lane) * vector() + e;
  }
  // The output column and k of that element (either may be past n or k).
  TANDEM_HOST_DEVICE int64_t column(int64_t tile, int64_t lane) const {
    return tileGroup(tile) * kGemvTileCols + lane;
  }
  TANDEM_HOST_DEVICE int64_t kOf(int64_t tile, int64_t step, int64_t e) const {
    return tileChunk(tile) * kGemvChunk + step * vector() + e;
  }
};

// The tiles warp `warp` of `warps` computes: [first, last) of `tiles`
// consecutive tiles. Every tile goes to exactly one warp; how many warps
// there are changes no bit (each tile's partials are the same chains
// whoever computes them).
TANDEM_HOST_DEVICE inline int64_t gemvWarpFirstTile(int64_t tiles, int64_t warps, int64_t warp) {
  return tiles * warp / warps;
}

// Slab q of a warp whose tiles start at `first`: its tile and first step.
TANDEM_HOST_DEVICE inline int64_t gemvSlabTile(const GemvTiling& t, int64_t first, int64_t q) {
  return first + q / t.slabsPerTile();
}
TANDEM_HOST_DEVICE inline int64_t gemvSlabStep(const GemvTiling& t, int64_t q) {
  return (q % t.slabsPerTile()) * kGemvSlabSteps;
}

// Where the partial of (chunk, row, column) lies in the GEMV's scratch for
// `rows` rows and a slice of `slice_columns` columns (a multiple of 32)
// starting at column `slice_first`.
TANDEM_HOST_DEVICE inline int64_t gemvPartialIndex(int64_t chunk, int64_t row, int64_t column,
                                                   int64_t rows, int64_t slice_first,
                                                   int64_t slice_columns) {
  return (chunk * rows + row) * slice_columns + (column - slice_first);
}

// --- The launch plan (gemv_fast.cu), here so the emulation follows it ---
constexpr int kGemvWarpsPerBlock = 4;
constexpr int kGemvStages = 3;  // slabs per warp in shared memory: 4 x 3 x 4 KB = 48 KB a block
constexpr int kGemvMaxRows = 64;
// Warps per SM the partial kernel aims for: 4 blocks of 4 warps, each with
// up to 2 slabs (8 KB) in flight, about 128 KB of loads in flight per SM.
constexpr int64_t kGemvWarpsPerSm = 16;

// Floats of scratch one column group's partials take for `rows` rows.
inline int64_t gemvGroupScratchFloats(const GemvTiling& t, int64_t rows) {
  return rows * t.chunks() * kGemvTileCols;
}
// Column groups per launch: as many as `scratch_floats` holds (at least one).
inline int64_t gemvGroupsPerSlice(const GemvTiling& t, int64_t rows, int64_t scratch_floats) {
  const int64_t fit = scratch_floats / gemvGroupScratchFloats(t, rows);
  const int64_t groups = t.groups();
  return fit < 1 ? 1 : (fit < groups ? fit : groups);
}
// Scratch floats a call needs when at most `cap_floats` may be used.
inline int64_t gemvScratchFloats(const GemvTiling& t, int64_t rows, int64_t cap_floats) {
  return gemvGroupsPerSlice(t, rows, cap_floats) * gemvGroupScratchFloats(t, rows);
}
// Warps the partial kernel runs for `tiles` tiles on `sm_count` SMs.
inline int64_t gemvWarps(int64_t tiles, int64_t sm_count) {
  const int64_t target = (sm_count > 0 ? sm_count : 1) * kGemvWarpsPerSm;
  return tiles < target ? tiles : target;
}

// --- The bf16 tensor-core decode kernel's layout (matmul_bf16_mma.cu) ---
//
// An n x k bf16 matrix as the B fragments of mma.sync m16n8k16: tiles of 8
// output columns by 32 k (two 16-wide slices), tile (t, p) at element offset
// (t * pairs + p) * 256, stored tile column by tile column. Lane l = 4g + q
// of the warp that owns tile column t finds, as one 16-byte vector at
// ((t * pairs + p) * 32 + l) * 8, the 8 bf16 it passes as b0, b1 of slice 2p
// and b0, b1 of slice 2p + 1:
//
//   e = 0, 1: w[8t + g][32p +      2q + e]        (slice 2p, b0)
//   e = 2, 3: w[8t + g][32p +  8 + 2q + e - 2]    (slice 2p, b1)
//   e = 4, 5: w[8t + g][32p + 16 + 2q + e - 4]    (slice 2p + 1, b0)
//   e = 6, 7: w[8t + g][32p + 24 + 2q + e - 6]    (slice 2p + 1, b1)
//
// so a warp's load is 512 contiguous bytes and a tile column one contiguous
// stream. Columns past n and k past the matrix are zero, as the other bf16
// kernels pad their shared-memory tiles: the fragments an mma sees are the
// same, so its results are.
struct MmaFragmentTiling {
  int64_t n = 0;
  int64_t k = 0;

  TANDEM_HOST_DEVICE int64_t tileColumns() const { return (n + 7) / 8; }
  TANDEM_HOST_DEVICE int64_t pairs() const { return (k + 31) / 32; }
  TANDEM_HOST_DEVICE int64_t elements() const { return tileColumns() * pairs() * 256; }
  TANDEM_HOST_DEVICE int64_t bytes() const { return elements() * 2; }
  TANDEM_HOST_DEVICE int64_t offset(int64_t t, int64_t p, int64_t lane, int64_t e) const {
    return ((t * pairs() + p) * 32 + lane) * 8 + e;
  }
  // The output column and k of that element (either may be past n or k).
  TANDEM_HOST_DEVICE static int64_t column(int64_t t, int64_t lane) { return t * 8 + lane / 4; }
  TANDEM_HOST_DEVICE static int64_t kOf(int64_t p, int64_t lane, int64_t e) {
    return p * 32 + e / 2 * 8 + lane % 4 * 2 + e % 2;
  }
  // The inverse of column() and kOf(): the element offset of (column, kk),
  // both inside the matrix. kk and kk + 1 (kk even) are one 32-bit word.
  TANDEM_HOST_DEVICE int64_t elementOffset(int64_t column, int64_t kk) const {
    const int64_t r = kk % 32;
    const int64_t lane = column % 8 * 4 + r % 8 / 2;
    return offset(column / 8, kk / 32, lane, r / 8 * 2 + r % 2);
  }
};

// --- The order of the wide bf16 GEMM's output tiles (matmul_bf16_mma.cu) ---
//
// Block b of a one-dimensional grid of m_tiles x n_tiles blocks multiplies
// output tile (row tile, column tile) = gemmTileOf(b, ...): the row tiles
// are taken in groups of `group_rows` (the last group holds what is left),
// and inside a group the row tile runs fastest. Blocks in flight together
// then share their weight tiles and one group's rows of x, so the weights
// are read from memory about once per group rather than once for every few
// row tiles (where a column-fastest grid brings every weight tile back for
// each wave). A bijection from [0, m_tiles * n_tiles) onto the tiles (the
// unit test checks it); which tile a block takes never changes an output's
// bits.
struct GemmTile {
  int64_t row = 0;
  int64_t column = 0;
};
TANDEM_HOST_DEVICE inline GemmTile gemmTileOf(int64_t b, int64_t m_tiles, int64_t n_tiles,
                                              int64_t group_rows) {
  const int64_t per_group = group_rows * n_tiles;
  const int64_t first = b / per_group * group_rows;
  const int64_t rows = m_tiles - first < group_rows ? m_tiles - first : group_rows;
  const int64_t local = b % per_group;
  return {first + local % rows, local / rows};
}

// Re-lays row-major bf16 `src` (n x k) as above; MmaFragmentTiling{n,
// k}.bytes() bytes. Throws tandem::Error for a non-positive shape.
std::vector<uint8_t> relayoutForMma(const void* src, int64_t n, int64_t k);
// The exact inverse, into dst (n * k bf16), `bytes` checked.
void restoreFromMma(const void* relaid, size_t bytes, int64_t n, int64_t k, void* dst);

// Re-lays row-major `src` (n x k elements of element_bytes, 2 or 4) as
// above; the result has GemvTiling{n, k, element_bytes}.bytes() bytes.
// Throws tandem::Error for another element size or a non-positive shape.
std::vector<uint8_t> relayoutForGemv(const void* src, int64_t n, int64_t k, int64_t element_bytes);

// The exact inverse: the row-major n x k matrix back from a re-laid one
// (`bytes` long, checked against the geometry) into dst (n * k elements).
void restoreFromGemv(const void* relaid, size_t bytes, int64_t n, int64_t k, int64_t element_bytes,
                     void* dst);

}  // namespace tandem::kernels::cuda
