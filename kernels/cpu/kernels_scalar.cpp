// Portable scalar kernels: the fallback for CPUs without AVX2. See
// isa_kernels.h. Every reduction runs strictly in index order, one element at
// a time (the build forbids contracting a*b+c into fma), so a result depends
// only on its inputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/isa_kernels.h"

namespace tandem::kernels::cpu {
namespace {

// Weight rows are converted to fp32 once and reused for every x row.
void loadRow(const WeightView& w, int64_t row, float* out) {
  const int64_t k = w.cols;
  if (w.layout == WeightLayout::kMxfp4) {
    for (int64_t i = 0; i < k; ++i) out[i] = mxfp4Value(w, row, i);
    return;
  }
  const size_t offset = static_cast<size_t>(row * k);
  switch (w.dtype) {
    case DType::kF32:
      std::copy_n(static_cast<const float*>(w.data) + offset, k, out);
      return;
    case DType::kBF16: {
      const auto* src = static_cast<const uint16_t*>(w.data) + offset;
      for (int64_t i = 0; i < k; ++i) out[i] = bf16ToF32(src[i]);
      return;
    }
    case DType::kF16:
      convertToF32(DType::kF16, static_cast<const uint16_t*>(w.data) + offset, out,
                   static_cast<size_t>(k));
      return;
    case DType::kF8E4M3: {
      // The values times 2^-8, as the vector ISAs widen them (kernels.h).
      const auto* src = static_cast<const uint8_t*>(w.data) + offset;
      for (int64_t i = 0; i < k; ++i) out[i] = f16ToF32(f8e4m3ToScaledF16(src[i]));
      return;
    }
    case DType::kU8:
      TANDEM_CHECK(false, "u8 bytes reached a matmul outside an MXFP4 view");
      return;
  }
}

void mxfp4ToBf16(const WeightView& w, int64_t n_begin, int64_t n_end, uint16_t* out) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = n_begin; r < n_end; ++r) {
    loadRow(w, r, row.data());
    for (float value : row) *out++ = f32ToBf16(value);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, int64_t n_begin,
            int64_t n_end, float* y, int64_t ldy) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(k));
  for (int64_t j = n_begin; j < n_end; ++j) {
    loadRow(w, j, row.data());
    for (int64_t i = 0; i < m; ++i) y[i * ldy + j] = dot(x + i * k, row.data(), k);
  }
}

void rmsNormRow(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  const float mean = dot(x, x, dim) / static_cast<float>(dim);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (int64_t d = 0; d < dim; ++d) y[d] = x[d] * inv * weight[d];
}

void siluMul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float maxOf(const float* x, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  return max;
}

void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::isnan(gate[i]) ? gate[i] : std::min(gate[i], limit);
    const float u = std::isnan(up[i]) ? up[i] : std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-(g * alpha))));
  }
}

// x[i] = e^(x[i] - max) in place, returning their sum in index order.
float expShiftAndSum(float* x, int64_t n, float max) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return sum;
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float sum = expShiftAndSum(x, n, maxOf(x, n));
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

constexpr int64_t kMaxHeadDim = 256;

void readRow(DType dtype, const void* src, float* out, int64_t n) {
  if (dtype == DType::kBF16) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = bf16ToF32(s[i]);
  } else if (dtype == DType::kF8E4M3) {
    // As the vector kernels: the value x 2^-8 (AttentionQuery).
    const auto* s = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = f16ToF32(f8e4m3ToScaledF16(s[i]));
  } else {
    std::copy_n(static_cast<const float*>(src), n, out);
  }
}

// One head of `a` (q and out already offset to it).
void attendHead(const AttentionQuery& a, const float* q, float* out, float* scores) {
  const int64_t head_dim = a.head_dim;
  const int64_t count = a.position + 1 - a.first_position;
  float row[kMaxHeadDim];
  CacheRowCursor keys(a, 0);
  for (int64_t t = 0; t < count; ++t) {
    readRow(a.cache_dtype, keys.next(), row, head_dim);
    scores[t] = dot(q, row, head_dim) * a.scale;
  }
  softcapScores(scores, count, a.softcap);
  const float sum = softmaxSum(scores, count, maxOf(scores, count), a.sinks, expShiftAndSum);
  float acc[kMaxHeadDim] = {};
  CacheRowCursor values(a, 1);
  for (int64_t t = 0; t < count; ++t) {
    readRow(a.cache_dtype, values.next(), row, head_dim);
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += scores[t] * row[d];
  }
  const float divisor = sum / a.value_scale;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] / divisor;
}

void attendQuery(const AttentionQuery& query, float* scores) {
  for (int32_t i = 0; i < query.num_rows; ++i) {
    const AttentionQuery a = query.row(i);
    for (int32_t h = 0; h < a.num_heads; ++h) {
      AttentionQuery head = a;
      if (a.sinks != nullptr) head.sinks = a.sinks + h;
      attendHead(head, a.q + h * a.head_dim, a.out + h * a.head_dim, scores);
    }
  }
}

// Eight independent multiply-then-add chains (no FMA in the baseline ISA).
int64_t fmaProbe(int64_t steps, float* sink) {
  constexpr int kChains = 8;
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c);
  for (int64_t s = 0; s < steps; ++s) {
    for (float& v : acc) v = v * 0.999f + 1e-3f;
  }
  for (float v : acc) *sink += v;
  return steps * kChains * 2;
}

}  // namespace

void matmulBf16PairsGeneric(const uint16_t* x, int64_t m, int64_t kp, const uint16_t* w,
                            int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* row = x + i * 2 * kp;
    for (int64_t j = n_begin; j < n_end; ++j) {
      const uint16_t* lane =
          w + j / kBf16PanelRows * kp * 2 * kBf16PanelRows + j % kBf16PanelRows * 2;
      float acc = 0.0f;
      for (int64_t t = 0; t < kp; ++t) {
        const uint16_t* pair = lane + t * 2 * kBf16PanelRows;
        acc += bf16ToF32(row[2 * t]) * bf16ToF32(pair[0]);
        acc += bf16ToF32(row[2 * t + 1]) * bf16ToF32(pair[1]);
      }
      y[i * ldy + j] = acc;
    }
  }
}

void toBf16Generic(const float* x, int64_t n, uint16_t* out) {
  convertFromF32(DType::kBF16, x, out, static_cast<size_t>(n));
}

const IsaKernels& scalarKernels() {
  static const IsaKernels kernels{
      .name = "scalar",
      .matmul = matmul,
      .matmul_tile_rows = 1,
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
