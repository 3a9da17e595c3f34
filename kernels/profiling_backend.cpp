#include "kernels/profiling_backend.h"

#include <algorithm>

namespace tandem::kernels {

namespace {

std::string shape(const char* op, std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string name = op;
  for (const auto& [key, value] : dims) {
    name += ' ';
    name += key;
    name += '=';
    name += std::to_string(value);
  }
  return name;
}

// The bytes of `tokens` positions' K and V rows of one layer.
double layerKvBytes(const KvCacheLayout& cache, int64_t tokens) {
  return static_cast<double>(tokens) * 2.0 * cache.num_kv_heads * cache.head_dim *
         static_cast<double>(dtypeSize(cache.dtype));
}

}  // namespace

template <typename Name, typename Fn>
void ProfilingBackend::timed(Name&& opName, double bytes, Fn&& fn, double flops) {
  if (!enabled_) {
    fn();
    return;
  }
  inner_.synchronize();
  const auto start = std::chrono::steady_clock::now();
  fn();
  inner_.synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string name = opName();
  OpProfile& entry = ops_[name];
  if (entry.op.empty()) entry.op = std::move(name);
  ++entry.calls;
  entry.seconds += seconds;
  entry.bytes += bytes;
  entry.flops += flops;
}

std::vector<OpProfile> ProfilingBackend::take() {
  std::vector<OpProfile> out;
  out.reserve(ops_.size());
  for (auto& [name, entry] : ops_) out.push_back(std::move(entry));
  ops_.clear();
  std::sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  return out;
}

void ProfilingBackend::copyToHost(void* host_dst, const void* src, size_t bytes) {
  timed(
      [&] {
        return shape("copyToHost", {{"bytes", static_cast<int64_t>(bytes)}});
      },
      static_cast<double>(bytes), [&] { inner_.copyToHost(host_dst, src, bytes); });
}

void ProfilingBackend::beginBatch(const BatchLayout& batch) {
  rows_ = batch.rows;
  sequences_ = batch.num_sequences;
  context_tokens_ = 0;
  for (int64_t s = 0; s < batch.num_sequences; ++s) {
    context_tokens_ += batch.sequences[s].first_position + batch.sequences[s].num_rows;
  }
  timed(
      [&] {
        return shape("beginBatch", {{"rows", batch.rows}});
      },
      0.0, [&] { inner_.beginBatch(batch); });
}

void ProfilingBackend::embedding(const WeightView& table, float* out) {
  // Each row reads one row of the table.
  const double bytes =
      static_cast<double>(rows_ * table.cols) * static_cast<double>(dtypeSize(table.dtype));
  timed(
      [&] {
        return shape("embedding", {{"rows", rows_}, {"dim", table.cols}});
      },
      bytes, [&] { inner_.embedding(table, out); });
}

// A matmul-like op: named by its shape and weight dtype, counting the
// weights' bytes and the multiply-adds.
template <typename Call>
void ProfilingBackend::timedMatmul(const char* op, int64_t m, int64_t k, const WeightView& w,
                                   Call&& call) {
  timed(
      [&] {
        return shape(op, {{"m", m}, {"k", k}, {"n", w.rows}}) + ' ' +
               (w.layout == WeightLayout::kMxfp4 ? "mxfp4" : dtypeShortName(w.dtype));
      },
      static_cast<double>(viewBytes(w)), call,
      2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(w.rows));
}

void ProfilingBackend::matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) {
  timedMatmul("matmul", m, k, w, [&] { inner_.matmul(x, m, k, w, y); });
}

void ProfilingBackend::matmulAdd(const float* x, int64_t m, int64_t k, const WeightView& w,
                                 float* y, float* scratch) {
  timedMatmul("matmulAdd", m, k, w, [&] { inner_.matmulAdd(x, m, k, w, y, scratch); });
}

void ProfilingBackend::matmulSplit(const float* x, int64_t m, int64_t k, const WeightView& w,
                                   const SplitOutputs& out, float* scratch) {
  timedMatmul("matmulSplit", m, k, w, [&] { inner_.matmulSplit(x, m, k, w, out, scratch); });
}

void ProfilingBackend::matmulSiluMul(const float* x, int64_t m, int64_t k,
                                     const WeightView& gate_up, float* out, float* scratch,
                                     float* up_scratch) {
  timedMatmul("matmulSiluMul", m, k, gate_up,
              [&] { inner_.matmulSiluMul(x, m, k, gate_up, out, scratch, up_scratch); });
}

void ProfilingBackend::matmulQkvRope(const float* x, int64_t m, int64_t k, const WeightView& qkv,
                                     const QkvRope& a, const KvCacheLayout& cache, float* scratch) {
  timedMatmul("matmulQkvRope", m, k, qkv,
              [&] { inner_.matmulQkvRope(x, m, k, qkv, a, cache, scratch); });
}

void ProfilingBackend::rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim,
                               float eps, float* y) {
  timed(
      [&] {
        return shape("rmsNorm", {{"rows", rows}, {"dim", dim}});
      },
      0.0, [&] { inner_.rmsNorm(x, weight, rows, dim, eps, y); });
}

void ProfilingBackend::addBias(float* y, const float* bias, int64_t rows, int64_t width) {
  timed(
      [&] {
        return shape("addBias", {{"rows", rows}, {"width", width}});
      },
      0.0, [&] { inner_.addBias(y, bias, rows, width); });
}

void ProfilingBackend::applyRope(float* x, int64_t num_heads, int64_t head_dim,
                                 const float* inv_freq) {
  timed(
      [&] {
        return shape("applyRope", {{"rows", rows_}, {"heads", num_heads}});
      },
      0.0, [&] { inner_.applyRope(x, num_heads, head_dim, inv_freq); });
}

void ProfilingBackend::applyRopeWith(float* x, int64_t num_heads, int64_t head_dim,
                                     const float* inv_freq, const RopeVariant& variant) {
  timed(
      [&] {
        return shape("applyRope", {{"rows", rows_}, {"heads", num_heads}});
      },
      0.0, [&] { inner_.applyRopeWith(x, num_heads, head_dim, inv_freq, variant); });
}

void ProfilingBackend::siluMul(const float* gate, const float* up, float* out, int64_t n) {
  timed(
      [&] {
        return shape("siluMul", {{"n", n}});
      },
      0.0, [&] { inner_.siluMul(gate, up, out, n); });
}

void ProfilingBackend::clampedSwiglu(const float* gate, const float* up, float* out, int64_t n,
                                     float alpha, float limit) {
  timed(
      [&] {
        return shape("clampedSwiglu", {{"n", n}});
      },
      0.0, [&] { inner_.clampedSwiglu(gate, up, out, n, alpha, limit); });
}

void ProfilingBackend::geluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  timed(
      [&] {
        return shape("geluTanhMul", {{"n", n}});
      },
      0.0, [&] { inner_.geluTanhMul(gate, up, out, n); });
}

void ProfilingBackend::addInPlace(float* y, const float* x, int64_t n) {
  timed([&] { return shape("addInPlace", {{"n", n}}); }, 0.0, [&] { inner_.addInPlace(y, x, n); });
}

void ProfilingBackend::copyColumns(const float* src, int64_t rows, int64_t src_width, int64_t first,
                                   int64_t width, float* dst) {
  timed(
      [&] {
        return shape("copyColumns", {{"rows", rows}, {"width", width}});
      },
      0.0, [&] { inner_.copyColumns(src, rows, src_width, first, width, dst); });
}

void ProfilingBackend::writeKv(const KvCacheLayout& cache, int32_t layer, const float* k,
                               const float* v) {
  timed(
      [&] {
        return shape("writeKv", {{"rows", rows_}});
      },
      0.0, [&] { inner_.writeKv(cache, layer, k, v); });
}

void ProfilingBackend::pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q,
                                      int64_t num_heads, float scale, float* out) {
  // Each sequence's K and V rows of this layer, read at least once.
  const double kv_bytes = layerKvBytes(cache, context_tokens_);
  timed(
      [&] {
        return shape("pagedAttention",
                     {{"rows", rows_}, {"sequences", sequences_}, {"heads", num_heads}});
      },
      kv_bytes, [&] { inner_.pagedAttention(cache, layer, q, num_heads, scale, out); });
}

void ProfilingBackend::pagedAttentionWith(const KvCacheLayout& cache, int32_t layer, const float* q,
                                          int64_t num_heads, float scale,
                                          const AttentionVariant& variant, float* out) {
  // A window reads at most `window` K and V rows per query; counted as the
  // whole context, an upper bound.
  const double kv_bytes = layerKvBytes(cache, context_tokens_);
  timed(
      [&] {
        return shape("pagedAttentionWith", {{"rows", rows_},
                                            {"sequences", sequences_},
                                            {"heads", num_heads},
                                            {"window", variant.window}});
      },
      kv_bytes,
      [&] { inner_.pagedAttentionWith(cache, layer, q, num_heads, scale, variant, out); });
}

void ProfilingBackend::gatherLastRows(const float* x, int64_t width, float* out) {
  timed(
      [&] {
        return shape("gatherLastRows", {{"sequences", sequences_}});
      },
      0.0, [&] { inner_.gatherLastRows(x, width, out); });
}

void ProfilingBackend::argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) {
  timed(
      [&] {
        return shape("argmaxRows", {{"rows", rows}, {"width", width}});
      },
      0.0, [&] { inner_.argmaxRows(x, rows, width, host_out); });
}

}  // namespace tandem::kernels
