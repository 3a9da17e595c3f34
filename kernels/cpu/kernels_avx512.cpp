// AVX-512 kernels (16 fp32 lanes). See isa_kernels.h.
//
// The fixed per-element operation sequences everything here keeps:
//  - dot products (matmul, attention scores, sums of squares) accumulate in
//    one 16-lane vector per output, k in steps of 16 with a zero-masked tail,
//    then reduce the lanes with one fixed tree (i + i+8, + i+4, + i+2, + i+1);
//  - several outputs computed together (a register tile) reduce with the same
//    tree, only packed, so a tile of any size gives each output the bits a
//    lone output would get.

// GCC 12's AVX-512 intrinsics initialise their "undefined" pass-through
// operands from themselves, which -Wuninitialized flags at every use (GCC bug
// 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "kernels/cpu/isa_kernels.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kLanes = 16;
// Matmul register tile: kTileRows rows of x by kTileCols rows of w, 24 zmm
// accumulators plus 4 weight vectors and one x vector.
constexpr int kTileRows = 6;
constexpr int kTileCols = 4;
// How many register tiles ahead the first pass over weight rows prefetches.
constexpr int64_t kPrefetchTiles = 2;
constexpr int64_t kCacheLine = 64;

__mmask16 laneMask(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// Weight loaders: 16 consecutive elements as fp32 (exact conversions).
struct F32Loader {
  using Element = float;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 loadMasked(const float* p, __mmask16 mask) {
    return _mm512_maskz_loadu_ps(mask, p);
  }
};

struct Bf16Loader {
  using Element = uint16_t;
  static __m512 widen(__m256i h) {
    // bf16 is the top half of an fp32: zero-extend and shift into place.
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 loadMasked(const uint16_t* p, __mmask16 mask) {
    return widen(_mm256_maskz_loadu_epi16(mask, p));
  }
};

struct F16Loader {
  using Element = uint16_t;
  static __m512 load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 loadMasked(const uint16_t* p, __mmask16 mask) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
  }
};

// f8e4m3 weights widened to their values times 2^-8 (the caller scales the
// sums back): each byte sign-extended to 16 bits and shifted left 7 is the
// f16 of that value but for a copy of the sign in bit 14, which the mask
// clears (common/dtype.h, f8e4m3ToScaledF16); the f16 conversion is exact,
// subnormals included.
struct F8Loader {
  using Element = uint8_t;
  static __m512 widen(__m128i bytes) {
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                       _mm256_set1_epi16(static_cast<int16_t>(0xbf80)));
    return _mm512_cvtph_ps(h);
  }
  static __m512 load(const uint8_t* p) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m512 loadMasked(const uint8_t* p, __mmask16 mask) {
    return widen(_mm_maskz_loadu_epi8(mask, p));
  }
};

// Lane sum of one vector: ((v_i + v_i+8) + (.. + i+4)) + (.. + i+2)) + (.. + i+1).
float reduceSum(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ps(s2, _mm_shuffle_ps(s2, s2, _MM_SHUFFLE(1, 1, 1, 1)));
  return _mm_cvtss_f32(s1);
}

// Lane sums of four vectors, {sum(a), sum(b), sum(c), sum(d)}, by exactly the
// tree of reduceSum (each addition pairs the same two lanes of one input).
__m128 reduceSum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // i + i+8: 256-bit halves of a|b and c|d side by side.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // i + i+4: 128-bit lane q of the result holds input q's four partials.
  const __m512 quads = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  // i + i+2, then i + i+1, within each 128-bit lane.
  const __m512 pairs =
      _mm512_add_ps(quads, _mm512_shuffle_ps(quads, quads, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 sums =
      _mm512_add_ps(pairs, _mm512_shuffle_ps(pairs, pairs, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, sums));
}

// e^x: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor
// polynomial for e^r (truncation error below 1e-8 relative), then scalef
// multiplies by 2^n with correct overflow to inf and gradual underflow.
__m512 expPs(__m512 x) {
  // Clamping keeps n in scalef's useful range; min/max take the NaN operand
  // second so a NaN input stays NaN.
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606820309417232e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// ---------------------------------------------------------------- matmul --

// How the matmul reads a weight matrix: a handle to a row, 16 of its
// elements from column kk (a multiple of 16) widened to fp32 exactly, and
// what to prefetch. Row-major matrices of a Loader's element:
template <typename Loader>
struct RowMajorMatrix : RowMajorRows<typename Loader::Element> {
  using Row = const typename Loader::Element*;
  // Prefetch once per this many columns (a weight row's cache line or less).
  static constexpr int64_t kPrefetchColumns = kLanes;
  // Vectors one loadGroup() gives (the tile loop's step is kGroup x 16).
  static constexpr int kGroup = 1;
  using RowMajorRows<typename Loader::Element>::RowMajorRows;
  static __m512 load(Row row, int64_t kk) { return Loader::load(row + kk); }
  static void loadGroup(Row row, int64_t kk, __m512* out) { out[0] = load(row, kk); }
  static __m512 loadMasked(Row row, int64_t kk, __mmask16 mask) {
    return Loader::loadMasked(row + kk, mask);
  }
  // The bytes rows [first, end) span.
  const char* begin(int64_t first) const { return reinterpret_cast<const char*>(this->row(first)); }
  const char* end(int64_t end_row) const {
    return reinterpret_cast<const char*>(this->row(end_row));
  }
};

// MXFP4 (kernels.h, WeightLayout::kMxfp4): 16 values are 8 bytes of nibbles,
// each nibble looked up in a 16-lane table of the E2M1 values (vpermps reads
// an index's low 4 bits, so neither nibble needs masking), then times the
// block's power of two: exact, as bf16's widening is.
struct Mxfp4Matrix : Mxfp4Rows {
  using Mxfp4Rows::Mxfp4Rows;
  static __m512 table() {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                          -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  }
  static __m512 decode(__m128i bytes, uint8_t exponent) {
    const __m512i nibbles =
        _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)));
    return _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, table()),
                         _mm512_set1_ps(kE8m0Powers[exponent]));
  }
  // A whole block (kk a multiple of 32) at once: 16 bytes, the table
  // scaled once by the block's power of two (each entry the product the
  // lookup-then-multiply gives: the same bits).
  static constexpr int kGroup = 2;
  static void loadGroup(Row row, int64_t kk, __m512* out) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.values + kk / 2));
    const __m128i high = _mm_srli_epi16(bytes, 4);
    const __m512 scaled =
        _mm512_mul_ps(table(), _mm512_set1_ps(kE8m0Powers[row.exponents[kk / 32]]));
    out[0] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, high)), scaled);
    out[1] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(bytes, high)), scaled);
  }
  static __m512 load(Row row, int64_t kk) {
    return decode(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.values + kk / 2)),
                  row.exponents[kk / 32]);
  }
  static __m512 loadMasked(Row row, int64_t kk, __mmask16 mask) {
    // (Rows are whole 32-value blocks: dispatch never leaves a tail.)
    const auto byte_mask = static_cast<__mmask16>((1u << ((std::popcount(mask) + 1) / 2)) - 1u);
    return _mm512_maskz_mov_ps(
        mask, decode(_mm_maskz_loadu_epi8(byte_mask, row.values + kk / 2), row.exponents[kk / 32]));
  }
  const char* begin(int64_t first) const {
    return reinterpret_cast<const char*>(values + first * value_pitch);
  }
  const char* end(int64_t end_row) const {
    return reinterpret_cast<const char*>(values + (end_row - 1) * value_pitch + k / 2);
  }
};

// One register tile: rows x[0..Rows) against four weight rows (edge tiles
// repeat a row and drop its outputs through store_mask). Prefetch: this pass
// is the first over these weight rows, which come from memory.
template <int Rows, typename Matrix, bool Prefetch>
inline void matmulTile(const float* x, int64_t k, const Matrix& matrix,
                       const typename Matrix::Row* w, float* y, int64_t ldy, __mmask8 store_mask) {
  __m512 acc[Rows][kTileCols];
  for (int i = 0; i < Rows; ++i) {
    for (int j = 0; j < kTileCols; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  // Steps of kGroup vectors (up to four rows: more would not leave the
  // weights their registers), then of one; each accumulator takes its
  // products in column order either way.
  constexpr int kGroup = Rows <= 4 ? Matrix::kGroup : 1;
  int64_t kk = 0;
  for (; kk + kGroup * kLanes <= k; kk += kGroup * kLanes) {
    if constexpr (Prefetch) {
      // Fetch the weight rows kPrefetchTiles tiles ahead into L2 while this
      // one computes. Into L2, not L1: L1 prefetches compete for the few L1
      // miss buffers, and on a Zen 4 host they held a decode stream at about
      // 10 GB/s per core where L2 prefetches reach the memory read rate.
      // Prefetches past the end are harmless.
      if (kk % Matrix::kPrefetchColumns == 0) {
        for (int j = 0; j < kTileCols; ++j) {
          _mm_prefetch(
              reinterpret_cast<const char*>(matrix.ahead(w[j], kPrefetchTiles * kTileCols, kk)),
              _MM_HINT_T1);
        }
      }
    }
    __m512 wv[kTileCols][kGroup];
    for (int j = 0; j < kTileCols; ++j) {
      if constexpr (kGroup == 1) {
        wv[j][0] = Matrix::load(w[j], kk);
      } else {
        Matrix::loadGroup(w[j], kk, wv[j]);
      }
    }
    for (int g = 0; g < kGroup; ++g) {
      for (int i = 0; i < Rows; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * k + kk + g * kLanes);
        for (int j = 0; j < kTileCols; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j][g], acc[i][j]);
      }
    }
  }
  if constexpr (kGroup > 1) {
    for (; kk + kLanes <= k; kk += kLanes) {
      __m512 wv[kTileCols];
      for (int j = 0; j < kTileCols; ++j) wv[j] = Matrix::load(w[j], kk);
      for (int i = 0; i < Rows; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * k + kk);
        for (int j = 0; j < kTileCols; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  if (kk < k) {
    const __mmask16 mask = laneMask(k - kk);
    __m512 wv[kTileCols];
    for (int j = 0; j < kTileCols; ++j) wv[j] = Matrix::loadMasked(w[j], kk, mask);
    for (int i = 0; i < Rows; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * k + kk);
      for (int j = 0; j < kTileCols; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < Rows; ++i) {
    _mm_mask_storeu_ps(y + i * ldy, store_mask,
                       reduceSum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
  }
}

// Rows x[0..Rows) against weight rows [n_begin, n_end): x stays in L1 while
// the weight block streams from L2 (from memory on the first row tile).
template <int Rows, typename Matrix, bool Prefetch>
void matmulRowTile(const float* x, int64_t k, const Matrix& matrix, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  if constexpr (Prefetch) {
    // The tiles the loop below will not have prefetched: all their lines at
    // once, so they arrive in parallel rather than one demand miss at a time.
    const char* begin = matrix.begin(n_begin);
    const char* end = matrix.end(std::min<int64_t>(n_end, n_begin + kPrefetchTiles * kTileCols));
    for (const char* line = begin; line < end; line += kCacheLine) {
      _mm_prefetch(line, _MM_HINT_T1);
    }
  }
  for (int64_t j = n_begin; j < n_end; j += kTileCols) {
    const int64_t valid = std::min<int64_t>(kTileCols, n_end - j);
    typename Matrix::Row rows[kTileCols];
    for (int c = 0; c < kTileCols; ++c) rows[c] = matrix.row(j + std::min<int64_t>(c, valid - 1));
    matmulTile<Rows, Matrix, Prefetch>(x, k, matrix, rows, y + j, ldy,
                                       static_cast<__mmask8>((1u << valid) - 1u));
  }
}

template <int Rows, typename Matrix>
void matmulRows(const float* x, int64_t k, const Matrix& matrix, int64_t n_begin, int64_t n_end,
                float* y, int64_t ldy, bool first) {
  if (first) {
    matmulRowTile<Rows, Matrix, true>(x, k, matrix, n_begin, n_end, y, ldy);
  } else {
    matmulRowTile<Rows, Matrix, false>(x, k, matrix, n_begin, n_end, y, ldy);
  }
}

template <typename Matrix>
void matmulTyped(const float* x, int64_t m, int64_t k, const WeightView& w, int64_t n_begin,
                 int64_t n_end, float* y, int64_t ldy) {
  const Matrix matrix(w);
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows) {
    matmulRows<kTileRows>(x + i * k, k, matrix, n_begin, n_end, y + i * ldy, ldy, i == 0);
  }
  const float* xr = x + i * k;
  float* yr = y + i * ldy;
  const bool first = i == 0;
  switch (m - i) {
    case 0:
      break;
    case 1:
      matmulRows<1>(xr, k, matrix, n_begin, n_end, yr, ldy, first);
      break;
    case 2:
      matmulRows<2>(xr, k, matrix, n_begin, n_end, yr, ldy, first);
      break;
    case 3:
      matmulRows<3>(xr, k, matrix, n_begin, n_end, yr, ldy, first);
      break;
    case 4:
      matmulRows<4>(xr, k, matrix, n_begin, n_end, yr, ldy, first);
      break;
    case 5:
      matmulRows<5>(xr, k, matrix, n_begin, n_end, yr, ldy, first);
      break;
  }
}

// The values' top halves: exact, bf16 holding every MXFP4 value.
void mxfp4ToBf16(const WeightView& w, int64_t n_begin, int64_t n_end, uint16_t* out) {
  const Mxfp4Matrix matrix(w);
  for (int64_t r = n_begin; r < n_end; ++r) {
    const Mxfp4Matrix::Row row = matrix.row(r);
    for (int64_t kk = 0; kk < w.cols; kk += kLanes) {
      const __m512i bits = _mm512_castps_si512(Mxfp4Matrix::load(row, kk));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kk),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    }
    out += w.cols;
  }
}
void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, int64_t n_begin,
            int64_t n_end, float* y, int64_t ldy) {
  if (w.layout == WeightLayout::kMxfp4) {
    return matmulTyped<Mxfp4Matrix>(x, m, k, w, n_begin, n_end, y, ldy);
  }
  switch (w.dtype) {
    case DType::kF32:
      return matmulTyped<RowMajorMatrix<F32Loader>>(x, m, k, w, n_begin, n_end, y, ldy);
    case DType::kBF16:
      return matmulTyped<RowMajorMatrix<Bf16Loader>>(x, m, k, w, n_begin, n_end, y, ldy);
    case DType::kF16:
      return matmulTyped<RowMajorMatrix<F16Loader>>(x, m, k, w, n_begin, n_end, y, ldy);
    case DType::kF8E4M3:
      return matmulTyped<RowMajorMatrix<F8Loader>>(x, m, k, w, n_begin, n_end, y, ldy);
    case DType::kU8:
      TANDEM_CHECK(false, "u8 bytes reached a matmul outside an MXFP4 view");
      return;
  }
}

// ------------------------------------------- matmul, bf16 pair panels --

// Weights packed by packBf16Pairs (kernels.h): panel p holds output rows
// 16p .. 16p + 15, and its pair step t is 32 bf16, (w[r][2t], w[r][2t + 1])
// for each of its 16 rows. Activations are bf16 rows of 2 * kp elements.
// A register tile is Rows rows by Panels panels: per pair step, one load per
// panel, one broadcast of each row's activation pair and one vdpbf16ps per
// accumulator, which adds both (exact) products into that output's lane. So
// an output is one lane's chain over t = 0 .. kp - 1, fixed by k alone, and
// no horizontal sums are needed.
constexpr int kPairTileRows = 8;
constexpr int kPairTilePanels = 2;
constexpr int64_t kPanelRows = kBf16PanelRows;
constexpr int64_t kPanelPairElements = 2 * kPanelRows;

template <int Rows, int Panels, bool Prefetch>
inline void pairTile(const uint16_t* x, int64_t kp, const uint16_t* panel, float* y, int64_t ldy,
                     __mmask16 last_mask) {
  const int64_t panel_elements = kp * kPanelPairElements;
  __m512 acc[Rows][Panels];
  for (int i = 0; i < Rows; ++i) {
    for (int c = 0; c < Panels; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < kp; ++t) {
    const uint16_t* step = panel + t * kPanelPairElements;
    if constexpr (Prefetch) {
      // The next tile's panels, into L2 (see matmulTile).
      for (int c = 0; c < Panels; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(step + (Panels + c) * panel_elements),
                     _MM_HINT_T1);
      }
    }
    __m512bh wv[Panels];
    for (int c = 0; c < Panels; ++c) {
      wv[c] = (__m512bh)_mm512_loadu_si512(step + c * panel_elements);
    }
    for (int i = 0; i < Rows; ++i) {
      uint32_t pair;
      std::memcpy(&pair, x + i * 2 * kp + 2 * t, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < Panels; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], xv, wv[c]);
    }
  }
  for (int i = 0; i < Rows; ++i) {
    for (int c = 0; c + 1 < Panels; ++c) _mm512_storeu_ps(y + i * ldy + c * kPanelRows, acc[i][c]);
    _mm512_mask_storeu_ps(y + i * ldy + (Panels - 1) * kPanelRows, last_mask, acc[i][Panels - 1]);
  }
}

// Rows x[0..Rows) against output rows [n_begin, n_end), n_begin a multiple
// of 16; the first row tile brings the panels in from memory.
template <int Rows>
void pairRows(const uint16_t* x, int64_t kp, const uint16_t* w, int64_t n_begin, int64_t n_end,
              float* y, int64_t ldy, bool first) {
  const int64_t panel_elements = kp * kPanelPairElements;
  for (int64_t j = n_begin; j < n_end; j += kPairTilePanels * kPanelRows) {
    const int64_t cols = std::min<int64_t>(kPairTilePanels * kPanelRows, n_end - j);
    const uint16_t* panel = w + j / kPanelRows * panel_elements;
    const __mmask16 last_mask = laneMask(cols - (cols > kPanelRows ? kPanelRows : 0));
    if (cols > kPanelRows) {
      if (first) {
        pairTile<Rows, 2, true>(x, kp, panel, y + j, ldy, last_mask);
      } else {
        pairTile<Rows, 2, false>(x, kp, panel, y + j, ldy, last_mask);
      }
    } else if (first) {
      pairTile<Rows, 1, true>(x, kp, panel, y + j, ldy, last_mask);
    } else {
      pairTile<Rows, 1, false>(x, kp, panel, y + j, ldy, last_mask);
    }
  }
}

template <size_t... Rows>
constexpr auto pairRowsTable(std::index_sequence<Rows...>) {
  return std::array{&pairRows<static_cast<int>(Rows) + 1>...};
}

void matmulBf16Pairs(const uint16_t* x, int64_t m, int64_t kp, const uint16_t* w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy) {
  static constexpr auto kRowsFor = pairRowsTable(std::make_index_sequence<kPairTileRows>{});
  for (int64_t i = 0; i < m; i += kPairTileRows) {
    const int64_t rows = std::min<int64_t>(kPairTileRows, m - i);
    kRowsFor[rows - 1](x + i * 2 * kp, kp, w, n_begin, n_end, y + i * ldy, ldy, i == 0);
  }
}

// Rounds to bf16, nearest even (input and output denormals become zero).
void toBf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 mask = laneMask(n - i);
    _mm256_mask_storeu_epi16(out + i, mask,
                             (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// ------------------------------------------------------------ peak probes --

// Twelve independent accumulators cover the FMA latency times the issue rate.
constexpr int kProbeChains = 12;

int64_t fmaProbe(int64_t steps, float* sink) {
  __m512 acc[kProbeChains];
  for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999f);
  const __m512 b = _mm512_set1_ps(1e-3f);
  for (int64_t s = 0; s < steps; ++s) {
    for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 total = acc[0];
  for (int c = 1; c < kProbeChains; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink += reduceSum(total);
  return steps * kProbeChains * kLanes * 2;
}

int64_t bf16DotProbe(int64_t steps, float* sink) {
  __m512 acc[kProbeChains];
  for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  for (int64_t s = 0; s < steps; ++s) {
    for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 total = acc[0];
  for (int c = 1; c < kProbeChains; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink += reduceSum(total);
  return steps * kProbeChains * 2 * kLanes * 2;
}

// ------------------------------------------------------------ elementwise --

void rmsNormRow(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, dim - d));
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + d);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float mean = reduceSum(acc) / static_cast<float>(dim);
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(mean + eps));
  for (int64_t d = 0; d < dim; d += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, dim - d));
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + d);
    const __m512 g = _mm512_maskz_loadu_ps(mask, weight + d);
    _mm512_mask_storeu_ps(y + d, mask, _mm512_mul_ps(_mm512_mul_ps(v, inv), g));
  }
}

void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit) {
  const __m512 one = _mm512_set1_ps(1.0f), a = _mm512_set1_ps(alpha);
  const __m512 high = _mm512_set1_ps(limit), low = _mm512_set1_ps(-limit);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, n - i));
    // min/max return their second operand when either is NaN: a NaN
    // passes.
    const __m512 g = _mm512_min_ps(high, _mm512_maskz_loadu_ps(mask, gate + i));
    const __m512 u = _mm512_max_ps(low, _mm512_min_ps(high, _mm512_maskz_loadu_ps(mask, up + i)));
    const __m512 e = expPs(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(g, a)));
    const __m512 glu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(_mm512_add_ps(u, one), glu));
  }
}

void siluMul(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(mask, up + i);
    const __m512 e = expPs(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(silu, u));
  }
}

float maxOf(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, n - i));
    best = _mm512_mask_max_ps(best, mask, best, _mm512_maskz_loadu_ps(mask, x + i));
  }
  return _mm512_reduce_max_ps(best);
}

// x[i] = e^(x[i] - max) in place; returns their sum (16-lane accumulation in
// index order, then reduceSum).
float expShiftAndSum(float* x, int64_t n, float max) {
  const __m512 shift = _mm512_set1_ps(max);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, n - i));
    const __m512 e = expPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), shift));
    _mm512_mask_storeu_ps(x + i, mask, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(mask, e));
  }
  return reduceSum(acc);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float sum = expShiftAndSum(x, n, maxOf(x, n));
  const __m512 divisor = _mm512_set1_ps(sum);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = laneMask(std::min(kLanes, n - i));
    _mm512_mask_storeu_ps(x + i, mask, _mm512_div_ps(_mm512_maskz_loadu_ps(mask, x + i), divisor));
  }
}

// -------------------------------------------------------------- attention --

constexpr int64_t kMaxHeadChunks = 256 / kLanes;
// Rows ahead the attention prefetches. In decode the KV rows come from
// memory (the weight stream has evicted them) while a row costs a few
// nanoseconds to use: 64 rows cover the memory latency, 16 did not (decode
// after a 512-token context was about 12% slower on a Zen 4 host).
constexpr int64_t kPrefetchRows = 64;

// Heads query heads of Rows consecutive rows of `a` at once (Heads * Rows
// query vectors, query vector i * Heads + g being row i's head g); its
// scores live at scores + (i * Heads + g) * span, indexed by position -
// first_position, span covering the first row's first position to the last
// row's position. Each query vector's operations are exactly those of a
// lone head of a lone row: its dot products (each reduced on its own),
// its softmax over its own positions and its value sums in position order
// from its own first position; sharing only saves loading and widening K/V
// rows per query vector. The score loop computes a few dot products no row
// keeps (keys before a row's window or past its position); they are
// written to slots that row's softmax and sums never read.
template <typename Loader, int Heads, int Rows>
void attendRows(const AttentionQuery& a, float* scores) {
  using Element = typename Loader::Element;
  constexpr int kQueries = Heads * Rows;
  static_assert(kQueries <= kMaxAttentionQueries);
  constexpr int kKeysPerStep = 4;
  constexpr int kValueChunksPerPass = 4;
  const int64_t head_dim = a.head_dim;
  const int64_t span = a.position + Rows - a.first_position;
  const int64_t chunks = (head_dim + kLanes - 1) / kLanes;
  // Chunks past head_dim get an empty mask: their loads read nothing and
  // their stores write nothing, so the value pass below can always run a
  // fixed number of chunks.
  __mmask16 masks[kMaxHeadChunks + kValueChunksPerPass] = {};
  for (int64_t c = 0; c < chunks; ++c) masks[c] = laneMask(std::min(kLanes, head_dim - c * kLanes));

  // Row i's positions as offsets into the span: [lo[i], hi[i]], both
  // non-decreasing in i.
  int64_t lo[Rows], hi[Rows];
  const float* q[kQueries];
  for (int i = 0; i < Rows; ++i) {
    lo[i] = a.rowFirstPosition(i) - a.first_position;
    hi[i] = a.position + i - a.first_position;
    for (int g = 0; g < Heads; ++g) q[i * Heads + g] = a.q + i * a.row_stride + g * head_dim;
  }

  // Cache rows are strided (one slot holds every kv head) and defeat the
  // hardware prefetcher; fetch them kPrefetchRows ahead, into L2 for the
  // reason given in matmulTile.
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(Element));
  int64_t prefetched = 0;
  auto prefetchUpTo = [&](CacheRowCursor& cursor, int64_t end) {
    for (end = std::min(end, span); prefetched < end; ++prefetched) {
      const char* row = static_cast<const char*>(cursor.next());
      for (int64_t offset = 0; offset < row_bytes; offset += 64) {
        _mm_prefetch(row + offset, _MM_HINT_T1);
      }
    }
  };

  // Scores, kKeysPerStep keys at a time; the last step repeats its final key.
  const __m128 scale = _mm_set1_ps(a.scale);
  CacheRowCursor keys(a, 0);
  CacheRowCursor key_prefetch(a, 0);
  for (int64_t t = 0; t < span; t += kKeysPerStep) {
    prefetchUpTo(key_prefetch, t + kKeysPerStep + kPrefetchRows);
    const int64_t valid = std::min<int64_t>(kKeysPerStep, span - t);
    const Element* key[kKeysPerStep];
    key[0] = static_cast<const Element*>(keys.next());
    for (int j = 1; j < kKeysPerStep; ++j) {
      key[j] = j < valid ? static_cast<const Element*>(keys.next()) : key[j - 1];
    }
    __m512 acc[kQueries][kKeysPerStep];
    for (int v = 0; v < kQueries; ++v) {
      for (int j = 0; j < kKeysPerStep; ++j) acc[v][j] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < chunks; ++c) {
      __m512 kv[kKeysPerStep];
      for (int j = 0; j < kKeysPerStep; ++j) {
        kv[j] = Loader::loadMasked(key[j] + c * kLanes, masks[c]);
      }
      for (int v = 0; v < kQueries; ++v) {
        const __m512 qv = _mm512_maskz_loadu_ps(masks[c], q[v] + c * kLanes);
        for (int j = 0; j < kKeysPerStep; ++j) acc[v][j] = _mm512_fmadd_ps(qv, kv[j], acc[v][j]);
      }
    }
    for (int v = 0; v < kQueries; ++v) {
      const __m128 dots = reduceSum4(acc[v][0], acc[v][1], acc[v][2], acc[v][3]);
      _mm_mask_storeu_ps(scores + v * span + t, static_cast<__mmask8>((1u << valid) - 1u),
                         _mm_mul_ps(dots, scale));
    }
  }

  __m512 divisor[kQueries];
  for (int i = 0; i < Rows; ++i) {
    for (int g = 0; g < Heads; ++g) {
      const int v = i * Heads + g;
      float* own = scores + v * span + lo[i];
      const int64_t count = hi[i] + 1 - lo[i];
      softcapScores(own, count, a.softcap);
      const float* sink = a.sinks == nullptr ? nullptr : a.sinks + g;
      divisor[v] = _mm512_set1_ps(softmaxSum(own, count, maxOf(own, count), sink, expShiftAndSum) /
                                  a.value_scale);
    }
  }

  // out = sum_t p_t v_t in t order, kValueChunksPerPass * 16 dims per pass
  // to keep the accumulators in registers; then one division by the sum.
  // A position adds only to the rows that attend it.
  for (int64_t c0 = 0; c0 < chunks; c0 += kValueChunksPerPass) {
    __m512 acc[kQueries][kValueChunksPerPass];
    for (int v = 0; v < kQueries; ++v) {
      for (int c = 0; c < kValueChunksPerPass; ++c) acc[v][c] = _mm512_setzero_ps();
    }
    CacheRowCursor values(a, 1);
    CacheRowCursor value_prefetch(a, 1);
    prefetched = 0;
    for (int64_t t = 0; t < span; ++t) {
      // Later passes find the rows in cache.
      if (c0 == 0) prefetchUpTo(value_prefetch, t + kPrefetchRows);
      const auto* value = static_cast<const Element*>(values.next()) + c0 * kLanes;
      __m512 vv[kValueChunksPerPass];
      for (int c = 0; c < kValueChunksPerPass; ++c) {
        vv[c] = Loader::loadMasked(value + c * kLanes, masks[c0 + c]);
      }
      for (int i = 0; i < Rows; ++i) {
        if (Rows > 1 && (t < lo[i] || t > hi[i])) continue;
        for (int g = 0; g < Heads; ++g) {
          const int v = i * Heads + g;
          const __m512 p = _mm512_set1_ps(scores[v * span + t]);
          for (int c = 0; c < kValueChunksPerPass; ++c)
            acc[v][c] = _mm512_fmadd_ps(p, vv[c], acc[v][c]);
        }
      }
    }
    for (int v = 0; v < kQueries; ++v) {
      float* out = a.out + v / Heads * a.row_stride + v % Heads * head_dim;
      for (int c = 0; c < kValueChunksPerPass; ++c) {
        _mm512_mask_storeu_ps(out + (c0 + c) * kLanes, masks[c0 + c],
                              _mm512_div_ps(acc[v][c], divisor[v]));
      }
    }
  }
}

template <typename Loader, int Heads>
void attendHeads(const AttentionQuery& a, float* scores) {
  if constexpr (Heads == 1) {
    switch (a.num_rows) {
      case 1:
        return attendRows<Loader, 1, 1>(a, scores);
      case 2:
        return attendRows<Loader, 1, 2>(a, scores);
      case 3:
        return attendRows<Loader, 1, 3>(a, scores);
      default:
        return attendRows<Loader, 1, 4>(a, scores);
    }
  } else if constexpr (Heads == 2) {
    if (a.num_rows == 1) return attendRows<Loader, 2, 1>(a, scores);
    return attendRows<Loader, 2, 2>(a, scores);
  } else {
    return attendRows<Loader, Heads, 1>(a, scores);
  }
}

template <typename Loader>
void attendTyped(const AttentionQuery& a, float* scores) {
  switch (a.num_heads) {
    case 1:
      return attendHeads<Loader, 1>(a, scores);
    case 2:
      return attendHeads<Loader, 2>(a, scores);
    case 3:
      return attendHeads<Loader, 3>(a, scores);
    default:
      return attendHeads<Loader, 4>(a, scores);
  }
}

void attendQuery(const AttentionQuery& query, float* scores) {
  if (query.cache_dtype == DType::kBF16) {
    attendTyped<Bf16Loader>(query, scores);
  } else if (query.cache_dtype == DType::kF8E4M3) {
    attendTyped<F8Loader>(query, scores);
  } else {
    attendTyped<F32Loader>(query, scores);
  }
}

}  // namespace

const IsaKernels& avx512Kernels() {
  static const IsaKernels kernels{
      .name = "avx512",
      .matmul = matmul,
      .matmul_tile_rows = kTileRows,
      .mxfp4_to_bf16 = mxfp4ToBf16,
      .matmul_bf16_pairs = matmulBf16Pairs,
      .bf16_pairs_tile_rows = kPairTileRows,
      .to_bf16 = toBf16,
      .fma_probe = fmaProbe,
      .bf16_dot_probe = bf16DotProbe,
      .rmsNormRow = rmsNormRow,
      .siluMul = siluMul,
      .clampedSwiglu = clampedSwiglu,
      .softmax = softmax,
      .attendQuery = attendQuery,
  };
  return kernels;
}

}  // namespace tandem::kernels::cpu
