// AVX2 + FMA kernels (8 fp32 lanes). See isa_kernels.h.
//
// Same fixed per-element sequences as the AVX-512 file, with 8 lanes: dot
// products accumulate in one 8-lane vector per output (zero-filled tail),
// then reduce with the tree (i + i+4, + i+2, + i+1); tiles reduce several
// outputs with that same tree, packed.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/isa_kernels.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kLanes = 8;
// Register tile: Rows x rows by tileCols<Rows> weight rows. Sixteen ymm
// registers hold the accumulators, one vector per weight row and the x
// vector: 4 x 3 = 12 + 3 + 1 in prefill. (A 3 x 4 tile needs 17, and the
// spills halved its rate.) One or two rows take four weight rows, for
// more streams in flight in decode.
constexpr int kTileRows = 4;
template <int Rows>
constexpr int tileCols = Rows >= 3 ? 3 : 4;

__m256i laneMask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__m256 loadPartial(const float* p, int64_t count) { return _mm256_maskload_ps(p, laneMask(count)); }

void storePartial(float* p, __m256 v, int64_t count) { _mm256_maskstore_ps(p, laneMask(count), v); }

struct F32Loader {
  using Element = float;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 loadPartial(const float* p, int64_t count) { return cpu::loadPartial(p, count); }
};

// AVX2 has no 16-bit masked load: a partial vector goes through a
// zero-filled buffer.
struct Bf16Loader {
  using Element = uint16_t;
  static __m256 widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256 load(const uint16_t* p) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 loadPartial(const uint16_t* p, int64_t count) {
    uint16_t buffer[kLanes] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(uint16_t));
    return load(buffer);
  }
};

struct F16Loader {
  using Element = uint16_t;
  static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 loadPartial(const uint16_t* p, int64_t count) {
    uint16_t buffer[kLanes] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(uint16_t));
    return load(buffer);
  }
};

// f8e4m3 weights widened to their values times 2^-8 (see the AVX-512
// file's F8Loader).
struct F8Loader {
  using Element = uint8_t;
  static __m256 widen(__m128i bytes) {
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7),
                                    _mm_set1_epi16(static_cast<int16_t>(0xbf80)));
    return _mm256_cvtph_ps(h);
  }
  static __m256 load(const uint8_t* p) {
    return widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 loadPartial(const uint8_t* p, int64_t count) {
    uint8_t buffer[kLanes] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count));
    return load(buffer);
  }
};

// Lane sum: ((v_i + v_i+4) + (.. + i+2)) + (.. + i+1).
float reduceSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ps(s2, _mm_shuffle_ps(s2, s2, _MM_SHUFFLE(1, 1, 1, 1)));
  return _mm_cvtss_f32(s1);
}

// {sum(a), sum(b), sum(c), sum(d)} by exactly the tree of reduceSum.
__m128 reduceSum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // i + i+4: [a' | b'] and [c' | d'].
  const __m256 ab =
      _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd =
      _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // i + i+2: [a''0 a''1 c''0 c''1 | b''0 b''1 d''0 d''1].
  const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // i + i+1: [a c a c | b d b d].
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(s, s, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(s, s, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm_unpacklo_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// e^x as in the AVX-512 file (same reduction and polynomial); 2^n is applied
// as two exact power-of-two factors so overflow gives inf and small results
// underflow gradually, like scalef.
__m256 expPs(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417232e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 scale_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale_a), scale_b);
}

// ---------------------------------------------------------------- matmul --

// How the matmul reads a weight matrix (see the AVX-512 file): row-major
// rows of a Loader's element, or MXFP4.
template <typename Loader>
struct RowMajorMatrix : RowMajorRows<typename Loader::Element> {
  using Row = const typename Loader::Element*;
  static constexpr int64_t kPrefetchColumns = kLanes;
  using RowMajorRows<typename Loader::Element>::RowMajorRows;
  static __m256 load(Row row, int64_t kk) { return Loader::load(row + kk); }
  static __m256 loadPartial(Row row, int64_t kk, int64_t count) {
    return Loader::loadPartial(row + kk, count);
  }
};

// 8 MXFP4 values are 4 bytes of nibbles: each nibble's magnitude looked up
// in an 8-lane table (vpermps reads an index's low 3 bits), its bit 3 made
// the sign, times the block's power of two: exact.
struct Mxfp4Matrix : Mxfp4Rows {
  using Mxfp4Rows::Mxfp4Rows;
  static __m256 decode(const uint8_t* bytes, uint8_t exponent) {
    int32_t word;
    std::memcpy(&word, bytes, sizeof word);
    const __m128i packed = _mm_cvtsi32_si128(word);
    const __m128i low_bits = _mm_set1_epi8(0x0f);
    const __m256i nibbles = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(
        _mm_and_si128(packed, low_bits), _mm_and_si128(_mm_srli_epi16(packed, 4), low_bits)));
    const __m256 magnitudes = _mm256_permutevar8x32_ps(
        _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), nibbles);
    const __m256i signs = _mm256_slli_epi32(_mm256_srli_epi32(nibbles, 3), 31);
    return _mm256_mul_ps(_mm256_or_ps(magnitudes, _mm256_castsi256_ps(signs)),
                         _mm256_set1_ps(kE8m0Powers[exponent]));
  }
  static __m256 load(Row row, int64_t kk) {
    return decode(row.values + kk / 2, row.exponents[kk / 32]);
  }
  static __m256 loadPartial(Row row, int64_t kk, int64_t count) {
    // (Rows are whole 32-value blocks: dispatch never leaves a tail.)
    uint8_t bytes[kLanes / 2] = {};
    std::memcpy(bytes, row.values + kk / 2, static_cast<size_t>((count + 1) / 2));
    return _mm256_and_ps(decode(bytes, row.exponents[kk / 32]),
                         _mm256_castsi256_ps(laneMask(count)));
  }
};

template <int Rows, int kCols, typename Matrix>
inline void matmulTile(const float* x, int64_t k, const Matrix& matrix,
                       const typename Matrix::Row* w, float* y, int64_t ldy, int64_t valid_cols) {
  __m256 acc[Rows][kCols];
  for (int i = 0; i < Rows; ++i) {
    for (int j = 0; j < kCols; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + kLanes <= k; kk += kLanes) {
    if constexpr (Rows <= 2) {
      // Decode: keep the weight rows two tiles ahead in flight, into L2
      // (see the AVX-512 file for why not L1).
      if (kk % Matrix::kPrefetchColumns == 0) {
        for (int j = 0; j < kCols; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(matrix.ahead(w[j], 2 * kCols, kk)),
                       _MM_HINT_T1);
        }
      }
    }
    __m256 wv[kCols];
    for (int j = 0; j < kCols; ++j) wv[j] = Matrix::load(w[j], kk);
    for (int i = 0; i < Rows; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * k + kk);
      for (int j = 0; j < kCols; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {
    const int64_t rest = k - kk;
    __m256 wv[kCols];
    for (int j = 0; j < kCols; ++j) wv[j] = Matrix::loadPartial(w[j], kk, rest);
    for (int i = 0; i < Rows; ++i) {
      const __m256 xv = loadPartial(x + i * k + kk, rest);
      for (int j = 0; j < kCols; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  // Fewer than four columns reduce as four with the last repeated: each
  // lane's tree is its own, so the repeat changes nothing and is not stored.
  const __m128i store_mask =
      _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(valid_cols)), _mm_setr_epi32(0, 1, 2, 3));
  for (int i = 0; i < Rows; ++i) {
    const __m128 sums = reduceSum4(acc[i][0], acc[i][std::min(1, kCols - 1)],
                                   acc[i][std::min(2, kCols - 1)], acc[i][kCols - 1]);
    _mm_maskstore_ps(y + i * ldy, store_mask, sums);
  }
}

template <int Rows, typename Matrix>
void matmulRowTile(const float* x, int64_t k, const Matrix& matrix, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  constexpr int kCols = tileCols<Rows>;
  int64_t j = n_begin;
  for (; j + kCols <= n_end; j += kCols) {
    typename Matrix::Row rows[kCols];
    for (int c = 0; c < kCols; ++c) rows[c] = matrix.row(j + c);
    matmulTile<Rows, kCols>(x, k, matrix, rows, y + j, ldy, kCols);
  }
  const int64_t rest = n_end - j;
  if (rest == 0) return;
  typename Matrix::Row rows[kCols];
  for (int c = 0; c < kCols; ++c) rows[c] = matrix.row(j + std::min<int64_t>(c, rest - 1));
  if constexpr (kCols == 3) {
    // The last one or two columns of a block (blocks are multiples of 16)
    // as a narrower tile, not a whole one repeating a row.
    if (rest == 1) return matmulTile<Rows, 1>(x, k, matrix, rows, y + j, ldy, 1);
    return matmulTile<Rows, 2>(x, k, matrix, rows, y + j, ldy, 2);
  } else {
    matmulTile<Rows, kCols>(x, k, matrix, rows, y + j, ldy, rest);
  }
}

template <typename Matrix>
void matmulTyped(const float* x, int64_t m, int64_t k, const WeightView& w, int64_t n_begin,
                 int64_t n_end, float* y, int64_t ldy) {
  const Matrix matrix(w);
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows) {
    matmulRowTile<kTileRows>(x + i * k, k, matrix, n_begin, n_end, y + i * ldy, ldy);
  }
  switch (m - i) {
    case 1:
      matmulRowTile<1>(x + i * k, k, matrix, n_begin, n_end, y + i * ldy, ldy);
      break;
    case 2:
      matmulRowTile<2>(x + i * k, k, matrix, n_begin, n_end, y + i * ldy, ldy);
      break;
    case 3:
      matmulRowTile<3>(x + i * k, k, matrix, n_begin, n_end, y + i * ldy, ldy);
      break;
    default:
      break;
  }
}

// The values' top halves: exact, bf16 holding every MXFP4 value.
void mxfp4ToBf16(const WeightView& w, int64_t n_begin, int64_t n_end, uint16_t* out) {
  const Mxfp4Matrix matrix(w);
  for (int64_t r = n_begin; r < n_end; ++r) {
    const Mxfp4Matrix::Row row = matrix.row(r);
    for (int64_t kk = 0; kk < w.cols; kk += kLanes) {
      const __m256i halves = _mm256_srli_epi32(_mm256_castps_si256(Mxfp4Matrix::load(row, kk)), 16);
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(out + kk),
          _mm_packus_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256(halves, 1)));
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

// ------------------------------------------------------------ elementwise --

void rmsNormRow(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += kLanes) {
    const __m256 v = loadPartial(x + d, std::min(kLanes, dim - d));
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const float mean = reduceSum(acc) / static_cast<float>(dim);
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(mean + eps));
  for (int64_t d = 0; d < dim; d += kLanes) {
    const int64_t count = std::min(kLanes, dim - d);
    const __m256 v = loadPartial(x + d, count);
    const __m256 g = loadPartial(weight + d, count);
    storePartial(y + d, _mm256_mul_ps(_mm256_mul_ps(v, inv), g), count);
  }
}

void siluMul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = std::min(kLanes, n - i);
    const __m256 g = loadPartial(gate + i, count);
    const __m256 u = loadPartial(up + i, count);
    const __m256 e = expPs(_mm256_sub_ps(_mm256_setzero_ps(), g));
    storePartial(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u), count);
  }
}

void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit) {
  const __m256 one = _mm256_set1_ps(1.0f), a = _mm256_set1_ps(alpha);
  const __m256 high = _mm256_set1_ps(limit), low = _mm256_set1_ps(-limit);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = std::min(kLanes, n - i);
    // min/max return their second operand when either is NaN: a NaN
    // passes.
    const __m256 g = _mm256_min_ps(high, loadPartial(gate + i, count));
    const __m256 u = _mm256_max_ps(low, _mm256_min_ps(high, loadPartial(up + i, count)));
    const __m256 e = expPs(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(g, a)));
    const __m256 glu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    storePartial(out + i, _mm256_mul_ps(_mm256_add_ps(u, one), glu), count);
  }
}

float maxOf(const float* x, int64_t n) {
  float best = -INFINITY;
  for (int64_t i = 0; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

// x[i] = e^(x[i] - max) in place; returns their sum (8-lane accumulation in
// index order, then reduceSum).
float expShiftAndSum(float* x, int64_t n, float max) {
  const __m256 shift = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = std::min(kLanes, n - i);
    const __m256 e = expPs(_mm256_sub_ps(loadPartial(x + i, count), shift));
    storePartial(x + i, e, count);
    acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(laneMask(count))));
  }
  return reduceSum(acc);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float sum = expShiftAndSum(x, n, maxOf(x, n));
  const __m256 divisor = _mm256_set1_ps(sum);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = std::min(kLanes, n - i);
    storePartial(x + i, _mm256_div_ps(loadPartial(x + i, count), divisor), count);
  }
}

// -------------------------------------------------------------- attention --

constexpr int64_t kMaxHeadDim = 256;

// One chunk of a row of head_dim elements, widened: zeros past head_dim.
template <typename Loader>
__m256 loadChunk(const typename Loader::Element* row, int64_t d, int64_t head_dim) {
  return d + kLanes <= head_dim ? Loader::load(row + d)
         : d < head_dim         ? Loader::loadPartial(row + d, head_dim - d)
                                : _mm256_setzero_ps();
}

// Copies row `src` (head_dim elements) to fp32 `dst` padded with zeros to a
// whole number of vectors, so the loops below need no partial loads.
template <typename Loader>
void widenRow(const void* src, int64_t head_dim, float* dst) {
  const auto* s = static_cast<const typename Loader::Element*>(src);
  for (int64_t d = 0; d < head_dim; d += kLanes) {
    _mm256_storeu_ps(dst + d, loadChunk<Loader>(s, d, head_dim));
  }
}

// The scores of query vectors 0..Queries) (rows of q, zero-padded to whole
// chunks; vectors past the query's own are zeros and not stored) against
// every key of the span, Keys keys a step: each key chunk is widened once,
// in registers, for all of them. Each dot product is reduceSum's tree over
// its own 8-lane sum of chunks in order, times the scale.
template <typename Loader, int Queries, int Keys>
void scoreKeys(const AttentionQuery& a, const float (*q)[kMaxHeadDim], int64_t span,
               float* scores) {
  constexpr int kSums = Queries * Keys;
  static_assert(kSums <= 8 && kSums % 4 == 0);
  using Element = typename Loader::Element;
  const int64_t head_dim = a.head_dim;
  const int64_t chunks = (head_dim + kLanes - 1) / kLanes;
  const int queries = a.num_rows * a.num_heads;
  const __m128 scale = _mm_set1_ps(a.scale);
  CacheRowCursor key_rows(a, 0);
  for (int64_t t = 0; t < span; t += Keys) {
    // The last step repeats its final key; those sums go nowhere.
    const int64_t valid = std::min<int64_t>(Keys, span - t);
    const Element* key[Keys];
    for (int j = 0; j < Keys; ++j) {
      key[j] = j < valid ? static_cast<const Element*>(key_rows.next()) : key[j - 1];
    }
    __m256 acc[Queries][Keys];
    for (int u = 0; u < Queries; ++u) {
      for (int j = 0; j < Keys; ++j) acc[u][j] = _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < chunks; ++c) {
      __m256 kv[Keys];
      for (int j = 0; j < Keys; ++j) kv[j] = loadChunk<Loader>(key[j], c * kLanes, head_dim);
      for (int u = 0; u < Queries; ++u) {
        const __m256 qv = _mm256_load_ps(q[u] + c * kLanes);
        for (int j = 0; j < Keys; ++j) acc[u][j] = _mm256_fmadd_ps(qv, kv[j], acc[u][j]);
      }
    }
    // Four sums per reduction, each lane its own tree.
    for (int s0 = 0; s0 < kSums; s0 += 4) {
      alignas(16) float dots[4];
      _mm_store_ps(dots, _mm_mul_ps(reduceSum4(acc[s0 / Keys][s0 % Keys],
                                               acc[(s0 + 1) / Keys][(s0 + 1) % Keys],
                                               acc[(s0 + 2) / Keys][(s0 + 2) % Keys],
                                               acc[(s0 + 3) / Keys][(s0 + 3) % Keys]),
                                    scale));
      for (int i = 0; i < 4; ++i) {
        const int u = (s0 + i) / Keys;
        const int j = (s0 + i) % Keys;
        if (u < queries && j < valid) scores[u * span + t + j] = dots[i];
      }
    }
  }
}

// Value sums over chunks [c0, c0 + Chunks) of the head for the task's query
// vectors, Queries at a time (past the task's own, its last again, whose
// sums are not stored): each V chunk is widened once, in registers, for all
// of them (Queries x Chunks accumulators, Chunks value vectors and one
// weight in sixteen registers). Each vector adds its positions in order
// from its own first one, as it would alone.
template <typename Loader, int Queries, int Chunks>
void valueSums(const AttentionQuery& a, const float* scores, int64_t span, const int64_t* lo,
               const int64_t* hi, const float* divisor, int64_t c0) {
  const int64_t head_dim = a.head_dim;
  const int heads = a.num_heads;
  const int queries = a.num_rows * heads;
  int64_t first[Queries], last[Queries];
  const float* weights[Queries];
  __m256 acc[Queries][Chunks];
  for (int u = 0; u < Queries; ++u) {
    const int v = std::min(u, queries - 1);
    first[u] = lo[v / heads];
    last[u] = hi[v / heads];
    weights[u] = scores + v * span;
    for (int g = 0; g < Chunks; ++g) acc[u][g] = _mm256_setzero_ps();
  }
  CacheRowCursor value_rows(a, 1);
  auto add = [&]<bool kChecked>(int64_t t) {
    const auto* src = static_cast<const typename Loader::Element*>(value_rows.next());
    __m256 value[Chunks];
    for (int g = 0; g < Chunks; ++g) value[g] = loadChunk<Loader>(src, (c0 + g) * kLanes, head_dim);
    for (int u = 0; u < Queries; ++u) {
      if (kChecked && (t < first[u] || t > last[u])) continue;
      const __m256 p = _mm256_set1_ps(weights[u][t]);
      for (int g = 0; g < Chunks; ++g) acc[u][g] = _mm256_fmadd_ps(p, value[g], acc[u][g]);
    }
  };
  // The positions every vector takes need no check.
  const int64_t all_first = *std::max_element(first, first + Queries);
  const int64_t all_last = *std::min_element(last, last + Queries);
  int64_t t = 0;
  for (; t < std::min(all_first, span); ++t) add.template operator()<true>(t);
  for (; t <= all_last; ++t) add.template operator()<false>(t);
  for (; t < span; ++t) add.template operator()<true>(t);
  for (int v = 0; v < std::min(Queries, queries); ++v) {
    const __m256 d = _mm256_set1_ps(divisor[v]);
    float* out = a.out + v / heads * a.row_stride + v % heads * head_dim;
    for (int g = 0; g < Chunks; ++g) {
      const int64_t begin = (c0 + g) * kLanes;
      if (begin >= head_dim) break;
      const __m256 result = _mm256_div_ps(acc[v][g], d);
      if (begin + kLanes <= head_dim) {
        _mm256_storeu_ps(out + begin, result);
      } else {
        storePartial(out + begin, result, head_dim - begin);
      }
    }
  }
}

// Every head of every row of `a` (AttentionQuery): query vector v = i *
// num_heads + g is row i's head g, its scores at scores + v * span indexed
// by position - first_position. Each K row is widened once for all query
// vectors and each V chunk once per pass over the values; every query
// vector's operations are exactly those of a lone head of a lone row (its
// own dot products, reduced on their own; its softmax over its own
// positions; its value sums in position order from its own first
// position). The score loop computes a few dot products no row keeps (keys
// before a row's window or past its position), in slots that row never
// reads.
template <typename Loader>
void attendRows(const AttentionQuery& a, float* scores) {
  const int64_t head_dim = a.head_dim;
  const int rows = a.num_rows;
  const int heads = a.num_heads;
  const int queries = rows * heads;
  const int64_t span = a.position + rows - a.first_position;
  const int64_t chunks = (head_dim + kLanes - 1) / kLanes;
  // Row i's positions as offsets into the span: [lo[i], hi[i]].
  int64_t lo[kMaxAttentionQueries], hi[kMaxAttentionQueries];
  alignas(32) float q[kMaxAttentionQueries][kMaxHeadDim];
  for (int v = queries; v < kMaxAttentionQueries; ++v) std::fill_n(q[v], chunks * kLanes, 0.0f);
  for (int i = 0; i < rows; ++i) {
    lo[i] = a.rowFirstPosition(i) - a.first_position;
    hi[i] = a.position + i - a.first_position;
    for (int g = 0; g < heads; ++g) {
      widenRow<F32Loader>(a.q + i * a.row_stride + g * head_dim, head_dim, q[i * heads + g]);
    }
  }

  // Scores, every query vector at once: two keys a step for three or four
  // vectors, four for one or two (at most 8 accumulators).
  if (queries >= 3) {
    scoreKeys<Loader, 4, 2>(a, q, span, scores);
  } else if (queries == 2) {
    scoreKeys<Loader, 2, 4>(a, q, span, scores);
  } else {
    scoreKeys<Loader, 1, 4>(a, q, span, scores);
  }

  float divisor[kMaxAttentionQueries];
  for (int v = 0; v < queries; ++v) {
    const int i = v / heads;
    float* own = scores + v * span + lo[i];
    const int64_t count = hi[i] + 1 - lo[i];
    softcapScores(own, count, a.softcap);
    const float* sink = a.sinks == nullptr ? nullptr : a.sinks + v % heads;
    divisor[v] = softmaxSum(own, count, maxOf(own, count), sink, expShiftAndSum) / a.value_scale;
  }

  // Every query vector in one pass over the values where their
  // accumulators fit the registers: four vectors (the last repeated when
  // there are three) two chunks at a time, else four chunks at a time.
  if (queries >= 3) {
    for (int64_t c0 = 0; c0 < chunks; c0 += 2) {
      valueSums<Loader, 4, 2>(a, scores, span, lo, hi, divisor, c0);
    }
  } else if (queries == 2) {
    for (int64_t c0 = 0; c0 < chunks; c0 += 4) {
      valueSums<Loader, 2, 4>(a, scores, span, lo, hi, divisor, c0);
    }
  } else {
    for (int64_t c0 = 0; c0 < chunks; c0 += 4) {
      valueSums<Loader, 1, 4>(a, scores, span, lo, hi, divisor, c0);
    }
  }
}

void attendQuery(const AttentionQuery& query, float* scores) {
  if (query.cache_dtype == DType::kBF16) {
    attendRows<Bf16Loader>(query, scores);
  } else if (query.cache_dtype == DType::kF8E4M3) {
    attendRows<F8Loader>(query, scores);
  } else {
    attendRows<F32Loader>(query, scores);
  }
}

// ------------------------------------------------------------ peak probe --

// Twelve independent accumulators cover the FMA latency times the issue rate.
constexpr int kProbeChains = 12;

int64_t fmaProbe(int64_t steps, float* sink) {
  __m256 acc[kProbeChains];
  for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999f);
  const __m256 b = _mm256_set1_ps(1e-3f);
  for (int64_t s = 0; s < steps; ++s) {
    for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 total = acc[0];
  for (int c = 1; c < kProbeChains; ++c) total = _mm256_add_ps(total, acc[c]);
  *sink += reduceSum(total);
  return steps * kProbeChains * kLanes * 2;
}

}  // namespace

const IsaKernels& avx2Kernels() {
  static const IsaKernels kernels{
      .name = "avx2",
      .matmul = matmul,
      .matmul_tile_rows = kTileRows,
      .mxfp4_to_bf16 = mxfp4ToBf16,
      .matmul_bf16_pairs = matmulBf16PairsGeneric,
      .bf16_pairs_tile_rows = 1,
      .to_bf16 = toBf16Generic,
      .fma_probe = fmaProbe,
      .bf16_dot_probe = nullptr,
      .rmsNormRow = rmsNormRow,
      .siluMul = siluMul,
      .clampedSwiglu = clampedSwiglu,
      .softmax = softmax,
      .attendQuery = attendQuery,
  };
  return kernels;
}

}  // namespace tandem::kernels::cpu
