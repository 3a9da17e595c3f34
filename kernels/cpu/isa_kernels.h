// Per-ISA kernel tables behind the public functions of kernels/kernels.h.
//
// Each vector ISA (AVX-512, AVX2, scalar) lives in its own translation unit,
// compiled with that ISA's flags, and exposes its single-threaded building
// blocks through one IsaKernels table. dispatch.cpp splits work across the
// thread pool and calls the table of the ISA picked at start-up; only that
// table's code ever runs, so a CPU without AVX-512 never executes it.
//
// Every entry computes each output element by a fixed sequence of operations
// that depends only on that element's inputs and reduced length — never on
// the range it is asked for — which is what lets dispatch split work freely
// and keep the batch-invariance contract of kernels.h.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/kernels.h"

namespace tandem::kernels::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// Output rows per panel of weights packed by packBf16Pairs (kernels.h).
constexpr int64_t kBf16PanelRows = 16;

// The matmul tiles' view of a weight matrix's rows (each ISA file adds the
// vector loads): row-major rows of Element, or MXFP4's values and exponents
// (kernels.h), row_step rows of the stored matrix apart.
template <typename Element>
struct RowMajorRows {
  using Row = const Element*;
  const Element* data;
  int64_t k;

  explicit RowMajorRows(const WeightView& w)
      : data(static_cast<const Element*>(w.data)), k(w.cols) {}
  Row row(int64_t r) const { return data + r * k; }
  // Column kk of the row `rows` below `row` (for prefetching).
  const void* ahead(Row row, int64_t rows, int64_t kk) const { return row + rows * k + kk; }
};

struct Mxfp4Rows {
  struct Row {
    const uint8_t* values;
    const uint8_t* exponents;
  };
  // One 64-byte line holds 128 values.
  static constexpr int64_t kPrefetchColumns = 128;

  const uint8_t* values;
  const uint8_t* exponents;
  int64_t value_pitch;
  int64_t exponent_pitch;
  int64_t k;

  explicit Mxfp4Rows(const WeightView& w)
      : values(static_cast<const uint8_t*>(w.data)),
        exponents(w.exponents),
        value_pitch(w.row_step * w.cols / 2),
        exponent_pitch(w.row_step * w.cols / 32),
        k(w.cols) {}
  Row row(int64_t r) const { return {values + r * value_pitch, exponents + r * exponent_pitch}; }
  const void* ahead(Row row, int64_t rows, int64_t kk) const {
    return row.values + rows * value_pitch + kk / 2;
  }
};

// E8M0 exponents' powers of two 2^(e - 127) as fp32 (common/dtype.h's
// e8m0ToF32, one load in the MXFP4 kernels' inner loops).
inline constexpr std::array<float, 256> kE8m0Powers = [] {
  std::array<float, 256> powers{};
  for (uint32_t e = 0; e < 256; ++e) {
    powers[e] = std::bit_cast<float>(e == 0 ? 0x00400000u : e << 23);
  }
  return powers;
}();

// Most query vectors (rows x heads) one attention call handles together.
constexpr int kMaxAttentionQueries = 4;

// Heads h0 .. h0 + num_heads - 1 of query rows 0 .. num_rows - 1, all of one
// kv head (a grouped-query group or part of one) and of one sequence, row i
// at position + i: row i attends to cached positions
// rowFirstPosition(i) .. position + i. Doing them together loads each K/V
// row once for all of them and gives the accumulations enough independent
// chains; every row's and head's result is still computed exactly as if it
// were alone (a decode step, a chunk of one row).
struct AttentionQuery {
  const float* q = nullptr;  // num_heads * head_dim values per row, head after head
  float* out = nullptr;      // the same layout
  int32_t num_heads = 1;     // num_heads * num_rows <= kMaxAttentionQueries (pagedAttention checks)
  int32_t num_rows = 1;
  // Elements between consecutive rows' q (and out).
  int64_t row_stride = 0;
  const char* cache_base = nullptr;
  DType cache_dtype = DType::kF32;
  int64_t block_bytes = 0;
  const int32_t* block_table = nullptr;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  // Element offsets, inside a block, of this layer's/kv head's K and V rows
  // for slot 0, and the element distance between consecutive slots.
  int64_t k_offset = 0;
  int64_t v_offset = 0;
  int64_t slot_stride = 0;
  int64_t position = 0;
  // The first position row 0 attends (a sliding window's start; 0 without
  // one): positions first_position..position.
  int64_t first_position = 0;
  // The sliding window (0: none): row i attends to its last `window`
  // positions.
  int64_t window = 0;
  // Soft-capping of the scores (Gemma 2): s = tanh(s / softcap) * softcap
  // before the softmax; 0: none.
  float softcap = 0.0f;
  // The heads' sink logits (GPT-OSS: num_heads values from this query's
  // first head on; nullptr: none), each one more softmax term that weighs
  // no value (softmaxSum).
  const float* sinks = nullptr;
  // Scores are q.k x scale; the output is the softmax-weighted sum of V
  // rows x value_scale. With an f8e4m3 cache the loaders read each element
  // as its value x 2^-8 (exact: kernels.h), and these factors carry the 2^8
  // and the layer's K/V scales; other caches have value_scale 1.
  float scale = 1.0f;
  float value_scale = 1.0f;

  // The first position row i attends.
  int64_t rowFirstPosition(int32_t i) const {
    return window > 0 ? std::max<int64_t>(first_position, position + i - window + 1)
                      : first_position;
  }
  // Row i as a query of its own.
  AttentionQuery row(int32_t i) const {
    AttentionQuery one = *this;
    one.q = q + i * row_stride;
    one.out = out + i * row_stride;
    one.num_rows = 1;
    one.position = position + i;
    one.first_position = rowFirstPosition(i);
    return one;
  }
};

// Scores soft-capped in place as Gemma 2's attention caps them (each step
// rounded to fp32, the same on every ISA); nothing when softcap is 0.
inline void softcapScores(float* scores, int64_t count, float softcap) {
  if (softcap == 0.0f) return;
  for (int64_t t = 0; t < count; ++t) scores[t] = std::tanh(scores[t] / softcap) * softcap;
}

// The softmax of one head's scores, in place: each score becomes e^(s -
// max), max taken over the scores and the head's sink when there is one;
// returns the sum that divides them, the sink's e^(sink - max) added last
// (after the ISA's own sum of the scores). expShiftAndSum(x, n, max) is
// the ISA's.
template <typename ExpShiftAndSum>
float softmaxSum(float* scores, int64_t count, float max, const float* sink,
                 ExpShiftAndSum expShiftAndSum) {
  if (sink != nullptr) max = std::max(max, *sink);
  float sum = expShiftAndSum(scores, count, max);
  if (sink != nullptr) sum += std::exp(*sink - max);
  return sum;
}

// Walks the K (kv = 0) or V (kv = 1) rows of positions first_position,
// first_position + 1, ... of one query without a division per row.
class CacheRowCursor {
 public:
  CacheRowCursor(const AttentionQuery& query, int kv)
      : query_(query),
        element_bytes_(static_cast<int64_t>(dtypeSize(query.cache_dtype))),
        row_offset_((kv == 0 ? query.k_offset : query.v_offset) * element_bytes_),
        slot_bytes_(query.slot_stride * element_bytes_),
        block_index_(query.first_position / query.block_size),
        slot_(static_cast<int32_t>(query.first_position % query.block_size)) {
    // Mid-block: next() steps from the row before.
    if (slot_ != 0) {
      row_ = query_.cache_base + query_.block_table[block_index_] * query_.block_bytes +
             row_offset_ + (slot_ - 1) * slot_bytes_;
    }
  }

  // The row of the next position.
  const void* next() {
    if (slot_ == query_.block_size) {
      slot_ = 0;
      ++block_index_;
    }
    if (slot_ == 0) {
      row_ =
          query_.cache_base + query_.block_table[block_index_] * query_.block_bytes + row_offset_;
    } else {
      row_ += slot_bytes_;
    }
    ++slot_;
    return row_;
  }

 private:
  const AttentionQuery& query_;
  int64_t element_bytes_;
  int64_t row_offset_;
  int64_t slot_bytes_;
  int64_t block_index_ = 0;
  int32_t slot_ = 0;
  const char* row_ = nullptr;
};

struct IsaKernels {
  const char* name;
  // y[i, j] for i in [0, m), j in [n_begin, n_end); x row stride k, y row stride ldy.
  void (*matmul)(const float* x, int64_t m, int64_t k, const WeightView& w, int64_t n_begin,
                 int64_t n_end, float* y, int64_t ldy);
  // Rows of the matmul micro-kernel; dispatch aligns row blocks to it.
  int matmul_tile_rows;
  // Rows [n_begin, n_end) of an MXFP4 matrix (kernels.h) as row-major bf16,
  // which holds each value exactly: what the matmul widens them to.
  void (*mxfp4_to_bf16)(const WeightView& w, int64_t n_begin, int64_t n_end, uint16_t* out);
  // y[i, j] against weights packed by packBf16Pairs (kernels.h): x is m rows
  // of 2 * kp bf16 activations (kp = ceil(k / 2), zero-padded), n_begin a
  // multiple of 16. Each output adds its activation/weight pairs t = 0 ..
  // kp - 1 in order, both (exact) products of a pair into one fp32 sum.
  void (*matmul_bf16_pairs)(const uint16_t* x, int64_t m, int64_t kp, const uint16_t* w,
                            int64_t n_begin, int64_t n_end, float* y, int64_t ldy);
  int bf16_pairs_tile_rows;
  // n values rounded to bf16, nearest even.
  void (*to_bf16)(const float* x, int64_t n, uint16_t* out);
  // Peak probes: `steps` rounds of independent multiply-adds on registers
  // only (fp32 FMAs; bf16 dot products, nullptr where the ISA has none).
  // Return the flops done (2 per multiply-add) and add a result to *sink so
  // the work cannot be dropped.
  int64_t (*fma_probe)(int64_t steps, float* sink);
  int64_t (*bf16_dot_probe)(int64_t steps, float* sink);
  // One row of rmsNorm; y may alias x.
  void (*rmsNormRow)(const float* x, const float* weight, int64_t dim, float eps, float* y);
  void (*siluMul)(const float* gate, const float* up, float* out, int64_t n);
  // kernels.h's clampedSwiglu over one chunk.
  void (*clampedSwiglu)(const float* gate, const float* up, float* out, int64_t n, float alpha,
                        float limit);
  void (*softmax)(float* x, int64_t n);
  // scores: scratch of at least kMaxAttentionQueries * (position +
  // num_rows) floats.
  void (*attendQuery)(const AttentionQuery& query, float* scores);
};

// The plain C++ versions of the bf16-pair matmul and the bf16 rounding
// (kernels_scalar.cpp), for ISAs without bf16 dot products.
void matmulBf16PairsGeneric(const uint16_t* x, int64_t m, int64_t kp, const uint16_t* w,
                            int64_t n_begin, int64_t n_end, float* y, int64_t ldy);
void toBf16Generic(const float* x, int64_t n, uint16_t* out);

const IsaKernels& scalarKernels();
const IsaKernels& avx2Kernels();
const IsaKernels& avx512Kernels();

// Whether this CPU (and OS) can run `isa`.
bool isaSupported(Isa isa);

// Test hook: makes the public kernels use `isa` (which must be supported)
// from now on. Must not race with running kernels.
void setIsaForTesting(Isa isa);

}  // namespace tandem::kernels::cpu
