// The fast decode GEMV's and the bf16 decode kernel's weight layouts
// (kernels/cuda/weight_layout.h), on the CPU: each re-layout is undone byte
// for byte, padding is zero, the mma layout puts every element where the
// PTX fragment definition says a lane takes it from, and a host
// emulation of the GEMV kernels (gemv_fast.cu) over the re-laid weights,
// written as plain loops in the kernels' own order (warps, pipeline stages,
// slabs, steps, rows, then the fold), gives every output the same bits as
// the reference kernels' sum order (matmul.cu), computed here from the
// row-major weights. Both sides use std::fma explicitly and this file is
// built with -ffp-contract=off, so no other contraction can creep in.
#include "kernels/cuda/weight_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "tests/support/same_bits.h"

namespace tandem::kernels::cuda {
namespace {

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

using ::tandem::testing::sameBits;

struct Shape {
  int64_t n;
  int64_t k;
};

const Shape kShapes[] = {{1, 1}, {7, 129}, {1024, 4096}, {4100, 300}, {33, 128}, {32, 256}};

TEST(GemvWeightLayout, InverseRestoresEveryByteAndPaddingIsZero) {
  for (const Shape& shape : kShapes) {
    for (const int64_t element_bytes : {int64_t{2}, int64_t{4}}) {
      SCOPED_TRACE(std::to_string(shape.n) + " x " + std::to_string(shape.k) + ", " +
                   std::to_string(element_bytes) + "-byte elements");
      const size_t bytes = static_cast<size_t>(shape.n * shape.k * element_bytes);
      const auto original = randomBytes(bytes, static_cast<uint32_t>(shape.n * 31 + shape.k));
      const auto relaid = relayoutForGemv(original.data(), shape.n, shape.k, element_bytes);
      const GemvTiling t{shape.n, shape.k, element_bytes};
      ASSERT_EQ(static_cast<int64_t>(relaid.size()), t.bytes());
      EXPECT_EQ(t.bytes() % kGemvVectorBytes, 0);

      std::vector<uint8_t> restored(bytes, 0xAB);
      restoreFromGemv(relaid.data(), relaid.size(), shape.n, shape.k, element_bytes,
                      restored.data());
      EXPECT_TRUE(sameBits(original.data(), restored.data(), bytes));

      // Every element sits where offset() says, and every padded one is 0.
      int64_t real = 0;
      for (int64_t tile = 0; tile < t.tiles(); ++tile) {
        for (int64_t step = 0; step < t.steps(); ++step) {
          for (int64_t lane = 0; lane < kGemvTileCols; ++lane) {
            for (int64_t e = 0; e < t.vector(); ++e) {
              const uint8_t* at = relaid.data() + t.offset(tile, step, lane, e) * element_bytes;
              const int64_t column = t.column(tile, lane);
              const int64_t kk = t.kOf(tile, step, e);
              if (column < shape.n && kk < shape.k) {
                ++real;
                ASSERT_EQ(0,
                          std::memcmp(at, original.data() + (column * shape.k + kk) * element_bytes,
                                      element_bytes));
              } else {
                for (int64_t b = 0; b < element_bytes; ++b) ASSERT_EQ(at[b], 0);
              }
            }
          }
        }
      }
      EXPECT_EQ(real, shape.n * shape.k);
    }
  }
}

TEST(GemvWeightLayout, RefusesOtherElementSizesAndShapes) {
  const uint8_t byte = 0;
  EXPECT_THROW(relayoutForGemv(&byte, 1, 1, 1), Error);
  EXPECT_THROW(relayoutForGemv(&byte, 0, 4, 2), Error);
  std::vector<uint8_t> relaid = relayoutForGemv(&byte, 1, 1, 2);
  uint8_t out[2];
  EXPECT_THROW(restoreFromGemv(relaid.data(), relaid.size() - 16, 1, 1, 2, out), Error);
}

// --- The bf16 tensor-core decode kernel's fragment layout ---

// Undone exactly; padding (columns past n, k past the matrix) is zero; and
// every element sits where lane l of an m16n8k16 mma takes B from, as the
// PTX ISA defines the bf16 B fragment: b0 holds B[k = 2(l % 4) + i][n = l / 4]
// for i = 0, 1 and b1 the same 8 rows further in k (written out here apart
// from MmaFragmentTiling::kOf).
TEST(MmaWeightLayout, FragmentsHoldWhatEachLanePassesAndTheInverseRestoresAll) {
  for (const Shape shape : kShapes) {
    SCOPED_TRACE(std::to_string(shape.n) + " x " + std::to_string(shape.k));
    std::vector<uint16_t> w(static_cast<size_t>(shape.n * shape.k));
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(1 + i % 65000);
    const std::vector<uint8_t> relaid = relayoutForMma(w.data(), shape.n, shape.k);
    const MmaFragmentTiling t{shape.n, shape.k};
    ASSERT_EQ(static_cast<int64_t>(relaid.size()), t.bytes());
    const auto* elements = reinterpret_cast<const uint16_t*>(relaid.data());
    int64_t real = 0;
    for (int64_t tile = 0; tile < t.tileColumns(); ++tile) {
      for (int64_t p = 0; p < t.pairs(); ++p) {
        for (int64_t lane = 0; lane < 32; ++lane) {
          for (int64_t e = 0; e < 8; ++e) {
            // Slice 2p + e / 4, register b(e / 2 % 2), element e % 2.
            const int64_t slice = 2 * p + e / 4;
            const int64_t kk = slice * 16 + (e / 2 % 2) * 8 + 2 * (lane % 4) + e % 2;
            const int64_t column = tile * 8 + lane / 4;
            const uint16_t got = elements[((tile * t.pairs() + p) * 32 + lane) * 8 + e];
            if (column < shape.n && kk < shape.k) {
              ASSERT_EQ(got, w[column * shape.k + kk])
                  << tile << " " << p << " " << lane << " " << e;
              ++real;
            } else {
              ASSERT_EQ(got, 0) << "padding";
            }
          }
        }
      }
    }
    EXPECT_EQ(real, shape.n * shape.k) << "every element placed once";
    // elementOffset, where a producer of x stores an element of the next
    // matmul's fragments: the inverse, with each even kk's word whole.
    for (int64_t column = 0; column < shape.n; ++column) {
      for (int64_t kk = 0; kk < shape.k; ++kk) {
        const int64_t at = t.elementOffset(column, kk);
        ASSERT_EQ(elements[at], w[column * shape.k + kk]) << column << " " << kk;
        if (kk % 2 == 0 && kk + 1 < shape.k) {
          ASSERT_EQ(t.elementOffset(column, kk + 1), at + 1);
        }
      }
    }
    std::vector<uint16_t> back(w.size(), 0);
    restoreFromMma(relaid.data(), relaid.size(), shape.n, shape.k, back.data());
    EXPECT_EQ(back, w);
  }
  const uint16_t one = 1;
  EXPECT_THROW(relayoutForMma(&one, 0, 1), Error);
  std::vector<uint8_t> relaid = relayoutForMma(&one, 1, 1);
  uint16_t out = 0;
  EXPECT_THROW(restoreFromMma(relaid.data(), relaid.size() - 2, 1, 1, &out), Error);
}

// --- The wide bf16 GEMM's tile order ---

// Every block takes one tile and every tile is taken once, for row counts
// below, at and past a group (the last group short or whole); inside a
// group the row tile runs fastest, and no block of a later group takes a
// row tile of an earlier one.
TEST(GemmTileOrder, EveryTileOnceRowTilesFastestInsideAGroup) {
  for (const int64_t group : {int64_t{1}, int64_t{4}, int64_t{16}}) {
    for (const int64_t m_tiles : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{17}, int64_t{35}}) {
      for (const int64_t n_tiles : {int64_t{1}, int64_t{5}, int64_t{224}}) {
        SCOPED_TRACE(std::to_string(group) + " " + std::to_string(m_tiles) + " " +
                     std::to_string(n_tiles));
        std::vector<int> taken(static_cast<size_t>(m_tiles * n_tiles), 0);
        int64_t group_of_last = 0;
        for (int64_t b = 0; b < m_tiles * n_tiles; ++b) {
          const GemmTile t = gemmTileOf(b, m_tiles, n_tiles, group);
          ASSERT_GE(t.row, 0);
          ASSERT_LT(t.row, m_tiles);
          ASSERT_GE(t.column, 0);
          ASSERT_LT(t.column, n_tiles);
          ++taken[static_cast<size_t>(t.row * n_tiles + t.column)];
          ASSERT_GE(t.row / group, group_of_last) << "block " << b;
          group_of_last = t.row / group;
          if (b > 0) {
            const GemmTile before = gemmTileOf(b - 1, m_tiles, n_tiles, group);
            if (before.row / group == t.row / group && before.column == t.column) {
              ASSERT_EQ(t.row, before.row + 1) << "block " << b;
            }
          }
        }
        EXPECT_TRUE(std::all_of(taken.begin(), taken.end(), [](int c) { return c == 1; }));
      }
    }
  }
  // 2,048 rows and gate/up's 28,672 columns in 128 x 128 tiles, groups of
  // 16: the first 264 blocks (two per SM of an H200) take 17 weight tiles
  // between them, where a column-fastest grid takes 224.
  int64_t last_column = 0;
  for (int64_t b = 0; b < 264; ++b) last_column = gemmTileOf(b, 16, 224, 16).column;
  EXPECT_EQ(last_column, 16);
}

// --- The kernels' order, emulated ---

// A weight as the kernel widens it to fp32.
float widen(DType dtype, const uint8_t* p) {
  uint32_t bits = 0;
  switch (dtype) {
    case DType::kF32: {
      float value;
      std::memcpy(&value, p, 4);
      return value;
    }
    case DType::kBF16:
      std::memcpy(&bits, p, 2);
      return bf16ToF32(static_cast<uint16_t>(bits));
    case DType::kF16:
      std::memcpy(&bits, p, 2);
      return f16ToF32(static_cast<uint16_t>(bits));
    case DType::kF8E4M3:
    case DType::kU8:
      break;  // no CUDA kernel reads fp8 weights or bytes (docs/quantization.md)
  }
  return 0.0f;
}

// The reference order (matmul.cu): chunks of 128, each one fma chain from +0
// in ascending k, partials added in chunk order.
std::vector<float> referenceMatmul(const std::vector<float>& x, int64_t m, int64_t k,
                                   const std::vector<uint8_t>& w, DType dtype, int64_t n) {
  const auto size = static_cast<int64_t>(dtypeSize(dtype));
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int64_t begin = 0; begin < k; begin += kGemvChunk) {
        float part = 0.0f;
        for (int64_t kk = begin; kk < k && kk < begin + kGemvChunk; ++kk) {
          part = std::fma(x[i * k + kk], widen(dtype, w.data() + (j * k + kk) * size), part);
        }
        total = begin == 0 ? part : total + part;
      }
      y[i * n + j] = total;
    }
  }
  return y;
}

// gemv_fast.cu's partial kernel for one warp, one lane at a time (lanes
// share nothing: each reads back only the bytes its own cp.async brought),
// then the fold kernel. `ring` stands for the lane's slice of the shared
// memory stages; a slab is copied into it when the kernel issues it and read
// from it when the kernel consumes it, with the kernel's stage arithmetic.
void emulatePartialWarp(const GemvTiling& t, const std::vector<uint8_t>& relaid, DType dtype,
                        const std::vector<float>& x, int64_t m, int64_t tile_begin,
                        int64_t tile_count, int64_t warps, int64_t warp, int64_t slice_first,
                        int64_t slice_columns, std::vector<float>& partials) {
  const int64_t first = tile_begin + gemvWarpFirstTile(tile_count, warps, warp);
  const int64_t last = tile_begin + gemvWarpFirstTile(tile_count, warps, warp + 1);
  const int64_t slabs = (last - first) * t.slabsPerTile();
  const int64_t vector = t.vector();
  const int64_t size = t.element_bytes;
  for (int64_t lane = 0; lane < kGemvTileCols; ++lane) {
    uint8_t ring[kGemvStages][kGemvSlabSteps][kGemvVectorBytes];
    std::memset(ring, 0xEE, sizeof ring);
    auto issue = [&](int64_t q) {
      const int64_t tile = gemvSlabTile(t, first, q);
      const int64_t step0 = gemvSlabStep(t, q);
      for (int64_t j = 0; j < kGemvSlabSteps; ++j) {
        std::memcpy(ring[q % kGemvStages][j],
                    relaid.data() + t.offset(tile, step0 + j, lane, 0) * size, kGemvVectorBytes);
      }
    };
    for (int64_t q = 0; q < kGemvStages - 1; ++q) {
      if (q < slabs) issue(q);
    }
    std::vector<float> part(static_cast<size_t>(m), 0.0f);
    for (int64_t q = 0; q < slabs; ++q) {
      if (q + kGemvStages - 1 < slabs) issue(q + kGemvStages - 1);
      const int64_t tile = gemvSlabTile(t, first, q);
      const int64_t step0 = gemvSlabStep(t, q);
      const int64_t chunk = t.tileChunk(tile);
      const int64_t length = t.chunkLength(chunk);
      if (step0 == 0) std::fill(part.begin(), part.end(), 0.0f);
      for (int64_t j = 0; j < kGemvSlabSteps; ++j) {
        const int64_t base = (step0 + j) * vector;
        if (base >= length) break;
        const int64_t count = base + vector <= length ? vector : length - base;
        float wv[8];
        for (int64_t e = 0; e < vector; ++e) {
          wv[e] = widen(dtype, ring[q % kGemvStages][j] + e * size);
        }
        const int64_t kk = chunk * kGemvChunk + base;
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t e = 0; e < count; ++e) {
            part[r] = std::fma(x[r * t.k + kk + e], wv[e], part[r]);
          }
        }
      }
      if (step0 + kGemvSlabSteps == t.steps()) {
        const int64_t column = t.column(tile, lane);
        if (column < t.n) {
          for (int64_t r = 0; r < m; ++r) {
            partials[gemvPartialIndex(chunk, r, column, m, slice_first, slice_columns)] = part[r];
          }
        }
      }
    }
  }
}

// The whole launch sequence of launchGemvFast: slices of column groups as
// the scratch allows, the partial kernel's warps, then the fold.
std::vector<float> emulateFastGemv(const std::vector<float>& x, int64_t m, int64_t k,
                                   const std::vector<uint8_t>& relaid, DType dtype, int64_t n,
                                   int64_t sm_count, int64_t scratch_cap_floats) {
  const GemvTiling t{n, k, static_cast<int64_t>(dtypeSize(dtype))};
  const int64_t scratch_floats = gemvScratchFloats(t, m, scratch_cap_floats);
  std::vector<float> scratch(static_cast<size_t>(scratch_floats),
                             std::numeric_limits<float>::quiet_NaN());
  std::vector<float> y(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
  const int64_t per_slice = gemvGroupsPerSlice(t, m, scratch_floats);
  for (int64_t g0 = 0; g0 < t.groups(); g0 += per_slice) {
    const int64_t g1 = std::min(t.groups(), g0 + per_slice);
    const int64_t tile_begin = g0 * t.chunks();
    const int64_t tile_count = (g1 - g0) * t.chunks();
    const int64_t warps = gemvWarps(tile_count, sm_count);
    const int64_t slice_first = g0 * kGemvTileCols;
    const int64_t slice_columns = (g1 - g0) * kGemvTileCols;
    for (int64_t warp = 0; warp < warps; ++warp) {
      emulatePartialWarp(t, relaid, dtype, x, m, tile_begin, tile_count, warps, warp, slice_first,
                         slice_columns, scratch);
    }
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t column = slice_first; column < slice_first + slice_columns; ++column) {
        if (column >= n) continue;
        float total = scratch[gemvPartialIndex(0, r, column, m, slice_first, slice_columns)];
        for (int64_t c = 1; c < t.chunks(); ++c) {
          total = total + scratch[gemvPartialIndex(c, r, column, m, slice_first, slice_columns)];
        }
        y[r * n + column] = total;
      }
    }
  }
  return y;
}

std::vector<uint8_t> randomWeights(DType dtype, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n * k));
  for (float& v : values) v = dist(rng);
  // One column of tiny weights: with the tiny negative row of x below, its
  // every product underflows to -0, so the chain and the output are -0,
  // which a zero-padded fma would turn into +0.
  if (n > 3 && dtype != DType::kF16) {
    for (int64_t kk = 0; kk < k; ++kk) values[3 * k + kk] = 1e-20f;
  }
  std::vector<uint8_t> out(values.size() * dtypeSize(dtype));
  convertFromF32(dtype, values.data(), out.data(), values.size());
  return out;
}

std::vector<float> randomActivations(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(rng);
  if (m > 2) {
    for (int64_t kk = 0; kk < k; ++kk) x[1 * k + kk] = -1e-30f;
    x[2 * k + k / 2] = std::numeric_limits<float>::infinity();
  }
  return x;
}

TEST(GemvWeightLayout, EmulatedKernelEqualsTheReferenceOrderBitwise) {
  const Shape shapes[] = {{1, 1}, {7, 129}, {70, 1024}, {33, 300}, {130, 333}, {4100, 300}};
  for (const Shape& shape : shapes) {
    for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const auto w = randomWeights(dtype, shape.n, shape.k, static_cast<uint32_t>(shape.k));
      const auto relaid =
          relayoutForGemv(w.data(), shape.n, shape.k, static_cast<int64_t>(dtypeSize(dtype)));
      for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{64}}) {
        if (shape.n * shape.k * m > int64_t{40} << 20) continue;  // keep the test quick
        SCOPED_TRACE(std::to_string(shape.n) + " x " + std::to_string(shape.k) + " " +
                     dtypeShortName(dtype) + ", m " + std::to_string(m));
        const auto x = randomActivations(m, shape.k, static_cast<uint32_t>(m + shape.n));
        const auto expected = referenceMatmul(x, m, shape.k, w, dtype, shape.n);
        // The SM count (so the warps' tile ranges) and the scratch (so the
        // column slices) vary; no bit may move.
        for (const auto& [sm_count, cap] :
             {std::pair<int64_t, int64_t>{132, int64_t{8} << 20}, {1, 1}, {7, 3 * 32 * 64 * 3}}) {
          SCOPED_TRACE("sm_count " + std::to_string(sm_count) + ", scratch cap " +
                       std::to_string(cap));
          const auto actual = emulateFastGemv(x, m, shape.k, relaid, dtype, shape.n, sm_count, cap);
          ASSERT_TRUE(sameBits(expected.data(), actual.data(), expected.size() * sizeof(float)));
        }
        if (m > 2 && shape.n > 3 && dtype != DType::kF16) {
          EXPECT_TRUE(std::signbit(expected[1 * shape.n + 3]) && expected[1 * shape.n + 3] == 0.0f)
              << "the tiny row and column make a -0 output";
        }
      }
    }
  }
}

// The emulation must notice a changed order: adding a chunk's partials the
// other way round, or folding padded positions into a chain, moves bits.
TEST(GemvWeightLayout, EmulationComparisonDetectsAnotherOrder) {
  const int64_t n = 40, k = 300, m = 3;
  const auto w = randomWeights(DType::kBF16, n, k, 5);
  const auto x = randomActivations(m, k, 6);
  const auto expected = referenceMatmul(x, m, k, w, DType::kBF16, n);
  std::vector<float> reversed(expected.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int64_t begin = (k - 1) / kGemvChunk * kGemvChunk; begin >= 0; begin -= kGemvChunk) {
        float part = 0.0f;
        for (int64_t kk = begin; kk < k && kk < begin + kGemvChunk; ++kk) {
          part = std::fma(x[i * k + kk], widen(DType::kBF16, w.data() + (j * k + kk) * 2), part);
        }
        total = total + part;
      }
      reversed[i * n + j] = total;
    }
  }
  EXPECT_FALSE(sameBits(expected.data(), reversed.data(), expected.size() * sizeof(float)));
  // Padded positions in the chain: fma(0, 0, -0) is +0.
  EXPECT_FALSE(std::signbit(std::fma(0.0f, 0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(expected[1 * n + 3]));
}

}  // namespace
}  // namespace tandem::kernels::cuda
