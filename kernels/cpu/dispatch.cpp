// Public kernel entry points: pick the ISA table once, split work across the
// thread pool, call the table. Work is only ever split along independent
// outputs (matmul columns and rows, attention queries and heads, rows of
// elementwise kernels), never along a reduction, so the split — and with it
// the thread count — cannot change a result.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
namespace cpu {

bool isaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      // Everything kernels_avx512.cpp is compiled for, so the compiler is free
      // to use any of it.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
  }
  return false;
}

namespace {

const IsaKernels& kernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512Kernels();
    case Isa::kAvx2:
      return avx2Kernels();
    case Isa::kScalar:
      break;
  }
  return scalarKernels();
}

Isa bestSupportedIsa() {
  if (isaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (isaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa pickIsa() {
  const char* requested = std::getenv("TANDEM_KERNEL_ISA");
  if (requested == nullptr || *requested == '\0') return bestSupportedIsa();
  const std::string_view name(requested);
  Isa isa;
  if (name == "avx512") {
    isa = Isa::kAvx512;
  } else if (name == "avx2") {
    isa = Isa::kAvx2;
  } else if (name == "scalar") {
    isa = Isa::kScalar;
  } else {
    TANDEM_LOG(kWarn) << "TANDEM_KERNEL_ISA must be avx512, avx2 or scalar, got '" << name
                      << "'; using " << kernelsFor(bestSupportedIsa()).name;
    return bestSupportedIsa();
  }
  if (!isaSupported(isa)) {
    TANDEM_LOG(kWarn) << "TANDEM_KERNEL_ISA=" << name << " is not supported by this CPU; using "
                      << kernelsFor(bestSupportedIsa()).name;
    return bestSupportedIsa();
  }
  return isa;
}

std::atomic<const IsaKernels*>& activeSlot() {
  static std::atomic<const IsaKernels*> slot{&kernelsFor(pickIsa())};
  return slot;
}

}  // namespace

void setIsaForTesting(Isa isa) {
  TANDEM_CHECK(isaSupported(isa), "setIsaForTesting: ISA not supported by this CPU");
  activeSlot().store(&kernelsFor(isa));
}

}  // namespace cpu

namespace {

const cpu::IsaKernels& active() { return *cpu::activeSlot().load(std::memory_order_relaxed); }

cpu::ThreadPool& pool() { return cpu::globalThreadPool(); }

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t roundUp(int64_t a, int64_t b) { return ceilDiv(a, b) * b; }

// Weight bytes per matmul task: the block stays in L2 (1 MiB per core here)
// while every row tile of x passes over it.
constexpr int64_t kWeightBlockBytes = 256 * 1024;
constexpr int64_t kMaxRowBlock = 512;
// Below this much work (multiply-adds, or elements) a kernel runs on the
// calling thread: waking workers would cost more than it saves.
constexpr int64_t kMinParallelWork = 1 << 15;
// Tasks per thread, so dynamic hand-out evens out uneven progress.
constexpr int64_t kTasksPerThread = 8;
constexpr int64_t kElementwiseChunk = 1 << 14;

}  // namespace

void setNumThreads(int num_threads) { pool().setNumThreads(num_threads); }

int numThreads() { return pool().numThreads(); }

void parallelFor(int64_t num_tasks, const std::function<void(int64_t task, int worker)>& fn) {
  std::mutex mutex;
  std::exception_ptr error;
  pool().parallelFor(num_tasks, [&](int64_t task, int worker) {
    try {
      fn(task, worker);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

std::string isaName() { return active().name; }

namespace {

// Splits y[m, n] into tasks of whole row tiles and weight blocks whose first
// column is a multiple of col_align, and runs them on the pool:
// run(m_begin, rows, n_begin, n_end). row_bytes: bytes of one weight row.
template <typename RunTask>
void forEachMatmulTask(int64_t m, int64_t n, int64_t k, int64_t row_bytes, int64_t tile_rows,
                       int64_t col_align, const RunTask& run) {
  const int64_t threads = pool().numThreads();
  int64_t n_block =
      std::clamp<int64_t>(kWeightBlockBytes / std::max<int64_t>(1, row_bytes) / 16 * 16, 16, 512);
  // Long prompts: a row block of x stays in L3 while it meets every weight block.
  int64_t m_block = std::min(m, roundUp(kMaxRowBlock, tile_rows));
  const int64_t want_tasks =
      threads > 1 && m * n * k >= kMinParallelWork ? threads * kTasksPerThread : 1;
  if (ceilDiv(n, n_block) * ceilDiv(m, m_block) < want_tasks) {
    if (m > tile_rows) {
      // Many rows: split them too rather than shrink the weight block.
      const int64_t m_split =
          std::min(ceilDiv(want_tasks, ceilDiv(n, n_block)), ceilDiv(m, tile_rows));
      m_block = roundUp(ceilDiv(m, m_split), tile_rows);
    } else {
      // Decode: few rows, weights stream once; smaller blocks spread them.
      n_block = std::max(col_align, roundUp(ceilDiv(n, want_tasks), col_align));
    }
  }
  const int64_t n_blocks = ceilDiv(n, n_block);
  const int64_t m_blocks = ceilDiv(m, m_block);
  // Neighbouring tasks share a weight block, which then comes from L3 once
  // for both threads.
  pool().parallelFor(n_blocks * m_blocks, [&](int64_t task, int) {
    const int64_t n_begin = task / m_blocks * n_block;
    const int64_t m_begin = task % m_blocks * m_block;
    run(m_begin, std::min(m_block, m - m_begin), n_begin, std::min(n, n_begin + n_block));
  });
}

// Per calling thread: one matmul's activations rounded to bf16.
std::vector<uint16_t>& bf16Scratch() {
  thread_local std::vector<uint16_t> scratch;
  return scratch;
}

// bf16 compute: x rounded to bf16 rows of 2 * kp (zero-padded), then the
// ISA's pair kernel over panel-aligned weight blocks.
void matmulPacked(const cpu::IsaKernels& isa, const float* x, int64_t m, int64_t k,
                  const WeightView& w, float* y) {
  const int64_t n = w.rows;
  const int64_t kp = (k + 1) / 2;
  std::vector<uint16_t>& xb = bf16Scratch();
  xb.resize(static_cast<size_t>(m * 2 * kp));
  for (int64_t i = 0; i < m; ++i) {
    isa.to_bf16(x + i * k, k, xb.data() + i * 2 * kp);
    if (k % 2 != 0) xb[static_cast<size_t>(i * 2 * kp + k)] = 0;
  }
  const auto* panels = static_cast<const uint16_t*>(w.data);
  forEachMatmulTask(m, n, k, 2 * kp * static_cast<int64_t>(sizeof(uint16_t)),
                    isa.bf16_pairs_tile_rows, cpu::kBf16PanelRows,
                    [&](int64_t m_begin, int64_t rows, int64_t n_begin, int64_t n_end) {
                      isa.matmul_bf16_pairs(xb.data() + m_begin * 2 * kp, rows, kp, panels, n_begin,
                                            n_end, y + m_begin * n, n);
                    });
}

// Per worker: activations times one row block's scales (fp8, block-wise).
std::vector<float>& scaledXScratch() {
  thread_local std::vector<float> scratch;
  return scratch;
}

// out[i, c] = x[i, c] * scales[c / scale_cols] for `rows` rows of k: one
// column block at a time, a plain loop the compiler vectorizes.
void scaleColumnBlocks(const float* x, int64_t rows, int64_t k, const float* scales,
                       int64_t scale_cols, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t first = 0, b = 0; first < k; first += scale_cols, ++b) {
      const float scale = scales[b];
      const int64_t end = std::min(k, first + scale_cols);
      for (int64_t c = first; c < end; ++c) out[i * k + c] = x[i * k + c] * scale;
    }
  }
}

// fp8 weights (kernels.h): the ISA's matmul over the values times 2^-8, then
// each output times its scale x 2^8. With block-wise scales a task runs
// once per row block it covers, on its rows of x times that block's scales,
// a few row tiles at a time (the scaled copy stays small whatever k), and
// decode's tasks are whole row blocks, so each scales x once.
void matmulFp8(const cpu::IsaKernels& isa, const float* x, int64_t m, int64_t k,
               const WeightView& w, float* y) {
  TANDEM_CHECK(w.scales != nullptr && w.scale_rows > 0 && w.scale_cols > 0,
               "matmul: fp8 weights need their scales");
  const int64_t n = w.rows;
  const int64_t grid_cols = w.scaleGridCols();
  const bool blocked = grid_cols > 1;
  auto task = [&](int64_t m_begin, int64_t rows, int64_t n_begin, int64_t n_end) {
    float* y_rows = y + m_begin * n;
    const float* x_rows = x + m_begin * k;
    for (int64_t j0 = n_begin; j0 < n_end;) {
      const int64_t block = j0 / w.scale_rows;
      const int64_t j1 = blocked ? std::min(n_end, (block + 1) * w.scale_rows) : n_end;
      if (blocked) {
        const int64_t chunk = int64_t{8} * isa.matmul_tile_rows;
        std::vector<float>& scaled = scaledXScratch();
        scaled.resize(static_cast<size_t>(std::min(rows, chunk) * k));
        for (int64_t i = 0; i < rows; i += chunk) {
          const int64_t count = std::min(chunk, rows - i);
          scaleColumnBlocks(x_rows + i * k, count, k, w.scales + block * grid_cols, w.scale_cols,
                            scaled.data());
          isa.matmul(scaled.data(), count, k, w, j0, j1, y_rows + i * n, n);
        }
      } else {
        isa.matmul(x_rows, rows, k, w, j0, j1, y_rows, n);
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* out = y_rows + i * n;
        for (int64_t j = j0; j < j1; ++j) {
          out[j] *= blocked ? 256.0f : w.scales[j / w.scale_rows] * 256.0f;
        }
      }
      j0 = j1;
    }
  };
  const int64_t col_align = blocked && w.scale_rows <= 512 ? w.scale_rows : 4;
  forEachMatmulTask(m, n, k, k, isa.matmul_tile_rows, col_align, task);
}

// Per worker: a task's MXFP4 weight rows as bf16.
std::vector<uint16_t>& widenedScratch() {
  thread_local std::vector<uint16_t> scratch;
  return scratch;
}

// MXFP4 weights (kernels.h). Up to one register tile of rows (decode), the
// ISA's matmul widens each weight as it reads it; with more, each row tile
// would widen the same weights again, so a task writes its weight rows once
// as bf16 (exact: bf16 holds every MXFP4 value) and multiplies those, in
// the blocks bf16 rows get. The bf16 and MXFP4 kernels widen to the same
// fp32 values and are the same tiles in the same order: the same bits.
void matmulMxfp4(const cpu::IsaKernels& isa, const float* x, int64_t m, int64_t k,
                 const WeightView& w, float* y) {
  // MXFP4 rows are whole 32-value blocks (the kernels read no tail).
  TANDEM_CHECK(k % 32 == 0 && w.exponents != nullptr && w.row_step >= 1,
               "matmul: an MXFP4 matrix needs whole 32-value blocks and their exponents");
  const int64_t n = w.rows;
  if (m <= isa.matmul_tile_rows) {
    forEachMatmulTask(m, n, k, k / 2 + k / 32, isa.matmul_tile_rows, 4,
                      [&](int64_t m_begin, int64_t rows, int64_t n_begin, int64_t n_end) {
                        isa.matmul(x + m_begin * k, rows, k, w, n_begin, n_end, y + m_begin * n, n);
                      });
    return;
  }
  forEachMatmulTask(m, n, k, k * static_cast<int64_t>(sizeof(uint16_t)), isa.matmul_tile_rows, 4,
                    [&](int64_t m_begin, int64_t rows, int64_t n_begin, int64_t n_end) {
                      std::vector<uint16_t>& widened = widenedScratch();
                      widened.resize(static_cast<size_t>((n_end - n_begin) * k));
                      isa.mxfp4_to_bf16(w, n_begin, n_end, widened.data());
                      const WeightView bf16{widened.data(), DType::kBF16, n_end - n_begin, k};
                      isa.matmul(x + m_begin * k, rows, k, bf16, 0, n_end - n_begin,
                                 y + m_begin * n + n_begin, n);
                    });
}

}  // namespace

void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) {
  TANDEM_CHECK(w.cols == k, "matmul: weight columns must equal k");
  const int64_t n = w.rows;
  if (m <= 0 || n <= 0) return;
  const cpu::IsaKernels& isa = active();
  if (w.layout == WeightLayout::kBf16Pairs) return matmulPacked(isa, x, m, k, w, y);
  if (w.dtype == DType::kF8E4M3) return matmulFp8(isa, x, m, k, w, y);
  if (w.layout == WeightLayout::kMxfp4) return matmulMxfp4(isa, x, m, k, w, y);
  forEachMatmulTask(m, n, k, k * static_cast<int64_t>(dtypeSize(w.dtype)), isa.matmul_tile_rows, 4,
                    [&](int64_t m_begin, int64_t rows, int64_t n_begin, int64_t n_end) {
                      isa.matmul(x + m_begin * k, rows, k, w, n_begin, n_end, y + m_begin * n, n);
                    });
}

float mxfp4Value(const WeightView& w, int64_t row, int64_t col) {
  TANDEM_CHECK(w.layout == WeightLayout::kMxfp4, "mxfp4Value: not an MXFP4 view");
  const uint8_t byte =
      static_cast<const uint8_t*>(w.data)[row * w.row_step * (w.cols / 2) + col / 2];
  const auto nibble = static_cast<uint8_t>(col % 2 == 0 ? byte & 0x0f : byte >> 4);
  return fp4E2m1ToF32(nibble) * e8m0ToF32(w.exponents[row * w.row_step * (w.cols / 32) + col / 32]);
}

WeightView packBf16Pairs(const WeightView& w, std::vector<uint16_t>& storage) {
  if (w.dtype != DType::kBF16 || w.layout != WeightLayout::kRows) {
    throw Error(std::string("packBf16Pairs: needs row-major bf16 weights, got ") +
                dtypeShortName(w.dtype) + (w.layout == WeightLayout::kRows ? "" : " (packed)"));
  }
  const int64_t n = w.rows, k = w.cols, kp = (k + 1) / 2;
  const int64_t panel_elements = kp * 2 * cpu::kBf16PanelRows;
  const int64_t num_panels = ceilDiv(n, cpu::kBf16PanelRows);
  storage.assign(static_cast<size_t>(num_panels * panel_elements), 0);
  const auto* src = static_cast<const uint16_t*>(w.data);
  pool().parallelFor(num_panels, [&](int64_t panel, int) {
    uint16_t* out = storage.data() + panel * panel_elements;
    for (int64_t r = panel * cpu::kBf16PanelRows;
         r < std::min(n, (panel + 1) * cpu::kBf16PanelRows); ++r) {
      const uint16_t* row = src + r * k;
      uint16_t* lane = out + (r % cpu::kBf16PanelRows) * 2;
      for (int64_t c = 0; c < k; ++c) lane[c / 2 * 2 * cpu::kBf16PanelRows + c % 2] = row[c];
    }
  });
  WeightView packed = w;
  packed.data = storage.data();
  packed.layout = WeightLayout::kBf16Pairs;
  return packed;
}

double peakGflops(DType compute, int repeats) {
  const cpu::IsaKernels& isa = active();
  const auto probe = compute == DType::kBF16 ? isa.bf16_dot_probe : isa.fma_probe;
  if (probe == nullptr) return 0.0;
  // About 20 ms per thread at a few GFLOP/s per chain.
  constexpr int64_t kSteps = int64_t{1} << 22;
  const int threads = pool().numThreads();
  std::vector<float> sinks(static_cast<size_t>(threads), 0.0f);
  std::vector<int64_t> flops(static_cast<size_t>(threads), 0);
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    pool().parallelFor(threads, [&](int64_t task, int) {
      flops[static_cast<size_t>(task)] = probe(kSteps, &sinks[static_cast<size_t>(task)]);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double total = 0.0;
    for (int64_t f : flops) total += static_cast<double>(f);
    best = std::max(best, total / seconds / 1e9);
  }
  return best;
}

void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  if (rows <= 0 || dim <= 0) return;
  const cpu::IsaKernels& isa = active();
  const int64_t tasks = rows * dim >= kMinParallelWork
                            ? std::min<int64_t>(rows, pool().numThreads() * kTasksPerThread)
                            : 1;
  const int64_t rows_per_task = ceilDiv(rows, tasks);
  pool().parallelFor(ceilDiv(rows, rows_per_task), [&](int64_t task, int) {
    const int64_t end = std::min(rows, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < end; ++r) {
      isa.rmsNormRow(x + r * dim, weight, dim, eps, y + r * dim);
    }
  });
}

// cos/sin are evaluated in double from the fp32 angle and rounded to fp32:
// libm's double functions are correctly rounded in practice, so the table is
// the same on every ISA and close to what PyTorch computes in fp32.
void applyRope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq, const RopeVariant& variant) {
  const int64_t rotary_dim = variant.rotary_dim > 0 ? variant.rotary_dim : head_dim;
  TANDEM_CHECK(rotary_dim % 2 == 0 && rotary_dim <= head_dim,
               "applyRope: the rotary dims must be even and at most head_dim");
  if (rows <= 0 || num_heads <= 0 || head_dim <= 0) return;
  const int64_t half = rotary_dim / 2;
  const float factor = variant.attention_factor;
  // Pair i's two values: halves apart, or neighbours when interleaved.
  const int64_t stride = variant.interleaved ? 2 : 1;
  const int64_t offset = variant.interleaved ? 1 : half;
  const int64_t width = num_heads * head_dim;
  const int64_t tasks = rows * width >= kMinParallelWork
                            ? std::min<int64_t>(rows, pool().numThreads() * kTasksPerThread)
                            : 1;
  const int64_t rows_per_task = ceilDiv(rows, tasks);
  pool().parallelFor(ceilDiv(rows, rows_per_task), [&](int64_t task, int) {
    thread_local std::vector<float> cos_table;
    thread_local std::vector<float> sin_table;
    cos_table.resize(static_cast<size_t>(half));
    sin_table.resize(static_cast<size_t>(half));
    const int64_t end = std::min(rows, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < end; ++r) {
      const float position = static_cast<float>(positions[r]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = position * inv_freq[i];
        cos_table[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_table[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
        if (factor != 1.0f) {
          cos_table[i] *= factor;
          sin_table[i] *= factor;
        }
      }
      for (int64_t h = 0; h < num_heads; ++h) {
        float* head = x + r * width + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float& first = head[i * stride];
          float& second = head[i * stride + offset];
          const float a = first;
          const float b = second;
          first = a * cos_table[i] - b * sin_table[i];
          second = b * cos_table[i] + a * sin_table[i];
        }
      }
    }
  });
}

void siluMul(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  const cpu::IsaKernels& isa = active();
  pool().parallelFor(ceilDiv(n, kElementwiseChunk), [&](int64_t task, int) {
    const int64_t begin = task * kElementwiseChunk;
    isa.siluMul(gate + begin, up + begin, out + begin, std::min(kElementwiseChunk, n - begin));
  });
}

void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit) {
  if (n <= 0) return;
  const cpu::IsaKernels& isa = active();
  pool().parallelFor(ceilDiv(n, kElementwiseChunk), [&](int64_t task, int) {
    const int64_t begin = task * kElementwiseChunk;
    isa.clampedSwiglu(gate + begin, up + begin, out + begin, std::min(kElementwiseChunk, n - begin),
                      alpha, limit);
  });
}

void geluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  pool().parallelFor(ceilDiv(n, kElementwiseChunk), [&](int64_t task, int) {
    const int64_t begin = task * kElementwiseChunk;
    const int64_t end = std::min(n, begin + kElementwiseChunk);
    // PyTorch's order: inner = sqrt(2/pi) * (x + 0.044715 * x^3), then
    // 0.5 * x * (1 + tanh(inner)), each step rounded to fp32.
    const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    const float kKappa = 0.044715f;
    for (int64_t i = begin; i < end; ++i) {
      const float x = gate[i];
      const float cube = x * x * x;
      const float inner = kBeta * (x + kKappa * cube);
      const float gelu = 0.5f * x * (1.0f + std::tanh(inner));
      out[i] = gelu * up[i];
    }
  });
}

void softmax(float* x, int64_t n) { active().softmax(x, n); }

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  const size_t row_bytes = static_cast<size_t>(table.cols) * dtypeSize(table.dtype);
  for (int64_t r = 0; r < n; ++r) {
    TANDEM_CHECK(ids[r] >= 0 && ids[r] < table.rows, "embedding: id out of range");
    const auto* row =
        static_cast<const char*>(table.data) + static_cast<size_t>(ids[r]) * row_bytes;
    convertToF32(table.dtype, row, out + r * table.cols, static_cast<size_t>(table.cols));
  }
}

// NaNs never win (they compare false); with only NaNs the answer is 0.
int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  float best_value = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > best_value) {
      best_value = x[i];
      best = i;
    }
  }
  return best;
}

void addInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

namespace {

void checkSequences(const KvCacheLayout& cache, int32_t layer, const AttentionSequence* sequences,
                    int64_t num_sequences) {
  TANDEM_CHECK(
      cache.dtype == DType::kF32 || cache.dtype == DType::kBF16 || cache.dtype == DType::kF8E4M3,
      "KV cache dtype must be f32, bf16 or f8e4m3");
  TANDEM_CHECK(layer >= 0 && layer < cache.num_layers, "KV cache layer out of range");
  TANDEM_CHECK(cache.block_size > 0, "KV cache block_size must be positive");
  for (int64_t s = 0; s < num_sequences; ++s) {
    const AttentionSequence& seq = sequences[s];
    TANDEM_CHECK(seq.num_rows >= 0 && seq.first_position >= 0, "attention sequence bounds");
    if (seq.num_rows == 0) continue;
    const int64_t last = seq.first_position + seq.num_rows - 1;
    TANDEM_CHECK(last / cache.block_size < seq.num_blocks,
                 "attention sequence has too few blocks for its positions");
  }
}

}  // namespace

void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k, const float* v,
             const AttentionSequence* sequences, int64_t num_sequences) {
  checkSequences(cache, layer, sequences, num_sequences);
  const int64_t width = int64_t{cache.num_kv_heads} * cache.head_dim;
  const size_t element_bytes = dtypeSize(cache.dtype);
  const int64_t block_bytes = cache.blockBytes();
  const float scales[2] = {cache.scale(layer, 0), cache.scale(layer, 1)};
  for (int64_t s = 0; s < num_sequences; ++s) {
    const AttentionSequence& seq = sequences[s];
    for (int64_t r = 0; r < seq.num_rows; ++r) {
      const int64_t position = seq.first_position + r;
      const int64_t block = seq.block_table[position / cache.block_size];
      TANDEM_CHECK(block >= 0 && block < cache.num_blocks, "block id out of range");
      const int64_t slot = position % cache.block_size;
      char* block_base = static_cast<char*>(cache.base) + block * block_bytes;
      const int64_t row = seq.first_row + r;
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t element = ((int64_t{layer} * 2 + kv) * cache.block_size + slot) * width;
        const float* src = (kv == 0 ? k : v) + row * width;
        char* dst = block_base + element * static_cast<int64_t>(element_bytes);
        if (cache.dtype == DType::kF8E4M3) {
          auto* bytes = reinterpret_cast<uint8_t*>(dst);
          for (int64_t i = 0; i < width; ++i) bytes[i] = f32ToF8e4m3(src[i] / scales[kv]);
        } else {
          convertFromF32(cache.dtype, src, dst, static_cast<size_t>(width));
        }
      }
    }
  }
}

void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q, int64_t num_heads,
                    float scale, const AttentionSequence* sequences, int64_t num_sequences,
                    float* out, int64_t window, float softcap, const float* sinks) {
  checkSequences(cache, layer, sequences, num_sequences);
  TANDEM_CHECK(window >= 0, "attention window must not be negative");
  TANDEM_CHECK(softcap >= 0.0f, "attention softcap must not be negative");
  TANDEM_CHECK(cache.head_dim >= 1 && cache.head_dim <= kMaxAttentionHeadDim,
               "head_dim must be in 1..256");
  TANDEM_CHECK(cache.num_kv_heads >= 1 && num_heads % cache.num_kv_heads == 0,
               "num_heads must be a multiple of num_kv_heads");
  const cpu::IsaKernels& isa = active();
  const int64_t head_dim = cache.head_dim;
  const int64_t width = num_heads * head_dim;
  const int64_t group = num_heads / cache.num_kv_heads;
  const int64_t slot_stride = int64_t{cache.num_kv_heads} * head_dim;
  const int64_t layer_stride = int64_t{cache.block_size} * slot_stride;
  // An f8e4m3 element is read as its value x 2^-8 (AttentionQuery).
  const float unscale = cache.dtype == DType::kF8E4M3 ? 256.0f : 1.0f;
  const float key_factor = unscale * cache.scale(layer, 0);
  const float value_factor = unscale * cache.scale(layer, 1);

  // One task per (run of up to `rows_per_task` rows of a sequence, kv head,
  // run of up to kMaxAttentionQueries query heads), rows_per_task as many
  // rows as the heads leave room for: the causal cost grows along a
  // sequence, and fine tasks handed out dynamically keep both threads busy
  // to the end. Grouping rows changes no row's bits (AttentionQuery).
  const int64_t heads_per_run = std::min<int64_t>(group, cpu::kMaxAttentionQueries);
  const int64_t runs_per_kv_head = ceilDiv(group, heads_per_run);
  const int64_t rows_per_task = cpu::kMaxAttentionQueries / heads_per_run;
  // task_start[s]: index of sequence s's first row run among all of the call's.
  std::vector<int64_t> task_start(static_cast<size_t>(num_sequences) + 1, 0);
  int64_t max_position = 0;
  for (int64_t s = 0; s < num_sequences; ++s) {
    task_start[s + 1] = task_start[s] + ceilDiv(sequences[s].num_rows, rows_per_task);
    if (sequences[s].num_rows > 0) {
      max_position =
          std::max(max_position, sequences[s].first_position + sequences[s].num_rows - 1);
    }
  }

  const int64_t tasks_per_run = int64_t{cache.num_kv_heads} * runs_per_kv_head;
  pool().parallelFor(task_start.back() * tasks_per_run, [&](int64_t item, int) {
    const size_t scratch = static_cast<size_t>(cpu::kMaxAttentionQueries * (max_position + 1));
    thread_local std::vector<float> scores;
    if (scores.size() < scratch) scores.resize(scratch);
    const int64_t index = item / tasks_per_run;
    const int64_t kv_head = item % tasks_per_run / runs_per_kv_head;
    const int64_t run = item % runs_per_kv_head;
    const int64_t head = kv_head * group + run * heads_per_run;
    const int64_t s =
        std::upper_bound(task_start.begin(), task_start.end(), index) - task_start.begin() - 1;
    const AttentionSequence& seq = sequences[s];
    const int64_t r = (index - task_start[s]) * rows_per_task;
    const int64_t row = seq.first_row + r;

    cpu::AttentionQuery query;
    query.q = q + row * width + head * head_dim;
    query.out = out + row * width + head * head_dim;
    query.num_heads = static_cast<int32_t>(std::min(heads_per_run, group - run * heads_per_run));
    query.num_rows = static_cast<int32_t>(std::min(rows_per_task, seq.num_rows - r));
    query.row_stride = width;
    query.cache_base = static_cast<const char*>(cache.base);
    query.cache_dtype = cache.dtype;
    query.block_bytes = cache.blockBytes();
    query.block_table = seq.block_table;
    query.block_size = cache.block_size;
    query.head_dim = cache.head_dim;
    query.k_offset = int64_t{layer} * 2 * layer_stride + kv_head * head_dim;
    query.v_offset = (int64_t{layer} * 2 + 1) * layer_stride + kv_head * head_dim;
    query.slot_stride = slot_stride;
    query.position = seq.first_position + r;
    query.first_position = window > 0 ? std::max<int64_t>(0, query.position - window + 1) : 0;
    query.window = window;
    query.softcap = softcap;
    query.sinks = sinks == nullptr ? nullptr : sinks + head;
    query.scale = scale * key_factor;
    query.value_scale = value_factor;
    // The ISA kernels size their per-vector arrays by kMaxAttentionQueries.
    TANDEM_CHECK(query.num_heads >= 1 && query.num_rows >= 1 &&
                     query.num_heads * query.num_rows <= cpu::kMaxAttentionQueries,
                 "attention query of more heads x rows than kMaxAttentionQueries");
    isa.attendQuery(query, scores.data());
  });
}

}  // namespace tandem::kernels
