// CPU kernels against plain scalar references, and the batch-invariance
// contract of kernels/kernels.h, for every ISA this machine supports.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
namespace {

using cpu::Isa;

std::vector<float> randomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (auto& v : out) v = dist(rng);
  return out;
}

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Asserts that two float ranges hold the same bits, naming the first
// difference.
::testing::AssertionResult sameBits(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (bitsOf(a[i]) != bitsOf(b[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Weights of one dtype plus the exact fp32 values they hold.
struct TestWeights {
  DType dtype;
  int64_t rows;
  int64_t cols;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<float> values;  // what the kernel must see, for references

  WeightView view() const {
    const void* data = dtype == DType::kF32 ? static_cast<const void*>(f32.data())
                                            : static_cast<const void*>(half.data());
    return WeightView{data, dtype, rows, cols};
  }
};

TestWeights makeWeights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  TestWeights w{dtype, rows, cols, {}, {}, {}};
  const std::vector<float> source = randomFloats(static_cast<size_t>(rows * cols), seed);
  if (dtype == DType::kF32) {
    w.f32 = source;
    w.values = source;
  } else {
    w.half.resize(source.size());
    convertFromF32(dtype, source.data(), w.half.data(), source.size());
    w.values.resize(source.size());
    convertToF32(dtype, w.half.data(), w.values.data(), source.size());
  }
  return w;
}

// compute bf16: the weights packed for it first (packBf16Pairs), as the CPU
// backend does.
std::vector<float> runMatmul(const std::vector<float>& x, int64_t m, const TestWeights& w,
                             DType compute = DType::kF32) {
  std::vector<float> y(static_cast<size_t>(m * w.rows), std::nanf(""));
  std::vector<uint16_t> packed;
  const WeightView view = compute == DType::kBF16 ? packBf16Pairs(w.view(), packed) : w.view();
  matmul(x.data(), m, w.cols, view, y.data());
  return y;
}

std::vector<Isa> availableIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (cpu::isaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

std::string isaLabel(const ::testing::TestParamInfo<Isa>& info) {
  switch (info.param) {
    case Isa::kAvx512:
      return "Avx512";
    case Isa::kAvx2:
      return "Avx2";
    case Isa::kScalar:
      return "Scalar";
  }
  return "Unknown";
}

class CpuKernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    cpu::setIsaForTesting(GetParam());
    setNumThreads(2);
  }
};

TEST_P(CpuKernels, ReportsSelectedIsa) {
  const char* expected = GetParam() == Isa::kAvx512 ? "avx512"
                         : GetParam() == Isa::kAvx2 ? "avx2"
                                                    : "scalar";
  EXPECT_EQ(isaName(), expected);
}

// ------------------------------------------------------------------ matmul --

// y[m, n] against x · values^T in double, each output to 1e-5 of the sum
// of its terms' magnitudes (the bound explained below).
template <typename Value>
void expectNearReference(const std::vector<float>& x, int64_t m, int64_t k, int64_t n,
                         const std::vector<Value>& values, const std::vector<float>& y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0;
      double magnitude = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double term = double{x[i * k + kk]} * static_cast<double>(values[j * k + kk]);
        ref += term;
        magnitude += std::fabs(term);
      }
      ASSERT_NEAR(y[i * n + j], ref, 1e-5 * magnitude + 1e-30) << "at " << i << "," << j;
    }
  }
}

// Tolerance: each output is a dot product of length k <= 2048 summed in fp32;
// its rounding error is bounded by ~k * 2^-24 * sum|x_i w_i| and in practice
// far smaller, so we allow 1e-5 * sum|x_i w_i| (relative to the magnitude of
// the terms, since cancellation makes the plain relative error meaningless).
TEST_P(CpuKernels, MatmulMatchesReference) {
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 1, 1},     {1, 17, 5},     {3, 64, 4},    {7, 100, 13}, {6, 16, 8},
                          {37, 257, 33}, {13, 1040, 70}, {64, 2048, 9}, {2, 5, 600}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(dtypeShortName(dtype)) + " m=" + std::to_string(s.m) +
                   " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n));
      const TestWeights w = makeWeights(dtype, s.n, s.k, 7);
      const std::vector<float> x = randomFloats(static_cast<size_t>(s.m * s.k), 11);
      expectNearReference(x, s.m, s.k, s.n, w.values, runMatmul(x, s.m, w));
    }
  }
}

// bf16 compute (weights packed by packBf16Pairs): the activations are
// rounded to bf16 first, then every product is exact and summed in fp32, so
// the result is the reference of the rounded activations to the fp32
// summation bound above, and visibly not the reference of the unrounded
// ones. Shapes cover odd k, partial panels and every row count of a tile.
TEST_P(CpuKernels, MatmulBf16ComputeMatchesRoundedReference) {
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 1, 1},     {1, 31, 5},     {3, 64, 4},    {7, 100, 13}, {6, 32, 8},
                          {37, 257, 33}, {13, 1040, 70}, {64, 2048, 9}, {2, 33, 600}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("m=" + std::to_string(s.m) + " k=" + std::to_string(s.k) +
                 " n=" + std::to_string(s.n));
    const TestWeights w = makeWeights(DType::kBF16, s.n, s.k, 7);
    const std::vector<float> x = randomFloats(static_cast<size_t>(s.m * s.k), 11);
    const std::vector<float> y = runMatmul(x, s.m, w, DType::kBF16);
    int64_t beyond_exact_tolerance = 0;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double rounded_ref = 0.0;
        double exact_ref = 0.0;
        double magnitude = 0.0;
        for (int64_t kk = 0; kk < s.k; ++kk) {
          const float xv = x[i * s.k + kk];
          const double term = double{bf16ToF32(f32ToBf16(xv))} * w.values[j * s.k + kk];
          rounded_ref += term;
          exact_ref += double{xv} * w.values[j * s.k + kk];
          magnitude += std::fabs(term);
        }
        const double tolerance = 1e-5 * magnitude + 1e-30;
        ASSERT_NEAR(y[i * s.n + j], rounded_ref, tolerance) << "at " << i << "," << j;
        if (std::fabs(y[i * s.n + j] - exact_ref) > tolerance) ++beyond_exact_tolerance;
      }
    }
    if (s.k >= 64) {
      EXPECT_GT(beyond_exact_tolerance, 0) << "the activations were not rounded";
    }
  }
}

TEST(PackBf16Pairs, LaysOutPanelsOfPairsAndRefusesOtherWeights) {
  const TestWeights w = makeWeights(DType::kBF16, 17, 5, 3);
  std::vector<uint16_t> packed;
  const WeightView view = packBf16Pairs(w.view(), packed);
  EXPECT_EQ(view.layout, WeightLayout::kBf16Pairs);
  EXPECT_EQ(view.rows, 17);
  EXPECT_EQ(view.cols, 5);
  EXPECT_EQ(view.data, packed.data());
  // Two panels of 16 rows, 3 pairs each (k = 5 padded to 6), 2 per row.
  ASSERT_EQ(packed.size(), 2u * 3 * 16 * 2);
  for (int64_t r = 0; r < 32; ++r) {
    for (int64_t c = 0; c < 6; ++c) {
      const uint16_t expected = r < 17 && c < 5 ? w.half[r * 5 + c] : 0;
      EXPECT_EQ(packed[(r / 16) * 96 + (c / 2) * 32 + (r % 16) * 2 + c % 2], expected)
          << "row " << r << " column " << c;
    }
  }
  for (DType dtype : {DType::kF32, DType::kF16}) {
    const TestWeights other = makeWeights(dtype, 4, 4, 3);
    EXPECT_THROW(packBf16Pairs(other.view(), packed), Error) << dtypeShortName(dtype);
  }
  EXPECT_THROW(packBf16Pairs(view, packed), Error) << "packing twice";
}

// The compute ceilings tandem-bench reports: fp32 multiply-adds on every
// ISA, bf16 dot products only where the ISA has them (0 elsewhere).
TEST_P(CpuKernels, PeakProbesReportTheirOwnInstructions) {
  EXPECT_GT(peakGflops(DType::kF32, 1), 0.0);
  const double bf16 = peakGflops(DType::kBF16, 1);
  if (GetParam() == Isa::kAvx512) {
    EXPECT_GT(bf16, 0.0);
  } else {
    EXPECT_EQ(bf16, 0.0);
  }
}

TEST_P(CpuKernels, MatmulWithZeroKGivesZeros) {
  const TestWeights w = makeWeights(DType::kBF16, 5, 0, 1);
  const std::vector<float> x;
  const std::vector<float> y = runMatmul(x, 3, w);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// A row's output must not depend on how many rows share the call, where the
// row sits, or the thread count. k is not a multiple of any vector width and
// n not a multiple of the register tile, so edge tiles are exercised.
TEST_P(CpuKernels, MatmulRowsAreBatchInvariant) {
  struct Shape {
    int64_t k, n;
  };
  struct Case {
    DType weights, compute;
  };
  for (const Case c : {Case{DType::kF32, DType::kF32}, Case{DType::kBF16, DType::kF32},
                       Case{DType::kF16, DType::kF32}, Case{DType::kBF16, DType::kBF16}}) {
    const DType dtype = c.weights;
    const auto runMatmul = [&](const std::vector<float>& x, int64_t m, const TestWeights& w) {
      return tandem::kernels::runMatmul(x, m, w, c.compute);
    };
    for (const Shape& s : {Shape{300, 37}, Shape{96, 701}, Shape{1041, 130}}) {
      SCOPED_TRACE(std::string(dtypeShortName(dtype)) + " weights, " + dtypeShortName(c.compute) +
                   " compute, k=" + std::to_string(s.k) + " n=" + std::to_string(s.n));
      const int64_t k = s.k;
      const int64_t n = s.n;
      const TestWeights w = makeWeights(dtype, n, k, 3);
      const std::vector<float> x512 = randomFloats(static_cast<size_t>(512 * k), 5);
      setNumThreads(2);
      const std::vector<float> y512 = runMatmul(x512, 512, w);
      setNumThreads(1);
      const std::vector<float> y512_one_thread = runMatmul(x512, 512, w);
      setNumThreads(2);
      EXPECT_TRUE(sameBits(y512.data(), y512_one_thread.data(), y512.size()));

      for (int64_t row : {0, 1, 5, 6, 7, 255, 301, 511}) {
        SCOPED_TRACE("row " + std::to_string(row));
        const std::vector<float> x1(x512.begin() + row * k, x512.begin() + (row + 1) * k);
        const std::vector<float> y1 = runMatmul(x1, 1, w);
        EXPECT_TRUE(sameBits(y1.data(), y512.data() + row * n, static_cast<size_t>(n)));

        // The same row at odd positions of a 37-row batch of other rows.
        for (int64_t slot : {17, 35, 36}) {
          std::vector<float> x37 = randomFloats(static_cast<size_t>(37 * k), 9);
          std::copy(x1.begin(), x1.end(), x37.begin() + slot * k);
          const std::vector<float> y37 = runMatmul(x37, 37, w);
          EXPECT_TRUE(
              sameBits(y37.data() + slot * n, y512.data() + row * n, static_cast<size_t>(n)));
        }
      }
    }
  }
}

// ------------------------------------------------------------ fp8 matmul --

// fp8 weights with random scales on a grid of scale_rows x scale_cols
// blocks, and the values they stand for (fp8 value x scale, in double).
struct Fp8Weights {
  int64_t rows, cols, scale_rows, scale_cols;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> values;

  WeightView view() const {
    WeightView w{bytes.data(), DType::kF8E4M3, rows, cols};
    w.scales = scales.data();
    w.scale_rows = scale_rows;
    w.scale_cols = scale_cols;
    return w;
  }
};

Fp8Weights makeFp8Weights(int64_t rows, int64_t cols, int64_t scale_rows, int64_t scale_cols,
                          uint32_t seed) {
  Fp8Weights w{rows, cols, scale_rows, scale_cols, {}, {}, {}};
  const WeightView shape = w.view();
  w.scales = randomFloats(static_cast<size_t>(shape.scaleGridRows() * shape.scaleGridCols()),
                          seed + 1, 1e-3f, 4e-3f);
  const WeightView grid = w.view();
  // Values over the whole range, subnormals included.
  const std::vector<float> source = randomFloats(static_cast<size_t>(rows * cols), seed, -448, 448);
  w.bytes.resize(source.size());
  w.values.resize(source.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      const float magnitude = std::ldexp(source[i], -static_cast<int>(i % 17));
      w.bytes[i] = f32ToF8e4m3(magnitude);
      w.values[i] = double{f8e4m3ToF32(w.bytes[i])} * grid.scaleAt(r, c);
    }
  }
  return w;
}

std::vector<float> runFp8Matmul(const std::vector<float>& x, int64_t m, const Fp8Weights& w) {
  std::vector<float> y(static_cast<size_t>(m * w.rows), std::nanf(""));
  matmul(x.data(), m, w.cols, w.view(), y.data());
  return y;
}

struct Fp8Grid {
  const char* name;
  int64_t scale_rows, scale_cols;  // 0: the whole dimension
};
const Fp8Grid kFp8Grids[] = {
    {"tensor", 0, 0}, {"channel", 1, 0}, {"block 16x32", 16, 32}, {"block 5x7", 5, 7}};

// Against the fp8 values times their scales, to the fp32 bound of
// MatmulMatchesReference (block scales add one rounding per activation),
// whatever the grid: per tensor, per row, or blocks splitting rows and
// columns (partial ones at the edges included).
TEST_P(CpuKernels, MatmulFp8MatchesItsScaledValues) {
  struct Shape {
    int64_t m, k, n;
  };
  for (const Fp8Grid& grid : kFp8Grids) {
    for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 17, 5}, Shape{7, 100, 13}, Shape{6, 64, 48},
                           Shape{37, 257, 33}, Shape{2, 1040, 70}}) {
      SCOPED_TRACE(std::string(grid.name) + " m=" + std::to_string(s.m) +
                   " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n));
      const Fp8Weights w = makeFp8Weights(s.n, s.k, grid.scale_rows ? grid.scale_rows : s.n,
                                          grid.scale_cols ? grid.scale_cols : s.k, 7);
      const std::vector<float> x = randomFloats(static_cast<size_t>(s.m * s.k), 11);
      expectNearReference(x, s.m, s.k, s.n, w.values, runFp8Matmul(x, s.m, w));
    }
  }
}

// A row's outputs are the same bits alone, in a batch of 512 on one or two
// threads, and at any place of a batch of 37.
TEST_P(CpuKernels, MatmulFp8RowsAreBatchInvariant) {
  const int64_t k = 300, n = 133;
  for (const Fp8Grid& grid : kFp8Grids) {
    SCOPED_TRACE(grid.name);
    const Fp8Weights w = makeFp8Weights(n, k, grid.scale_rows ? grid.scale_rows : n,
                                        grid.scale_cols ? grid.scale_cols : k, 3);
    const std::vector<float> x512 = randomFloats(static_cast<size_t>(512 * k), 5);
    setNumThreads(2);
    const std::vector<float> y512 = runFp8Matmul(x512, 512, w);
    setNumThreads(1);
    const std::vector<float> y512_one_thread = runFp8Matmul(x512, 512, w);
    setNumThreads(2);
    EXPECT_TRUE(sameBits(y512.data(), y512_one_thread.data(), y512.size()));
    for (int64_t row : {0, 5, 6, 301, 511}) {
      SCOPED_TRACE("row " + std::to_string(row));
      const std::vector<float> x1(x512.begin() + row * k, x512.begin() + (row + 1) * k);
      const std::vector<float> y1 = runFp8Matmul(x1, 1, w);
      EXPECT_TRUE(sameBits(y1.data(), y512.data() + row * n, static_cast<size_t>(n)));
      std::vector<float> x37 = randomFloats(static_cast<size_t>(37 * k), 9);
      std::copy(x1.begin(), x1.end(), x37.begin() + 36 * k);
      const std::vector<float> y37 = runFp8Matmul(x37, 37, w);
      EXPECT_TRUE(sameBits(y37.data() + 36 * n, y512.data() + row * n, static_cast<size_t>(n)));
    }
  }
}

// ---------------------------------------------------------- MXFP4 matmul --

// A random MXFP4 matrix (kernels.h, WeightLayout::kMxfp4): nibbles uniform,
// block exponents around 127 (the values near 1), and views of it: every
// row, or every other row from the first or the second (GPT-OSS's gate and
// up rows, interleaved).
struct Mxfp4Weights {
  int64_t stored_rows, cols;
  std::vector<uint8_t> values, exponents;

  WeightView view(int64_t first, int64_t row_step) const {
    WeightView w{values.data() + first * (cols / 2), DType::kU8,
                 (stored_rows - first + row_step - 1) / row_step, cols, WeightLayout::kMxfp4};
    w.exponents = exponents.data() + first * (cols / 32);
    w.row_step = row_step;
    return w;
  }
};

Mxfp4Weights makeMxfp4Weights(int64_t rows, int64_t cols, uint32_t seed, int exponent_lo = 120,
                              int exponent_hi = 130) {
  Mxfp4Weights w{rows, cols, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), exponent(exponent_lo, exponent_hi);
  w.values.resize(static_cast<size_t>(rows * cols / 2));
  for (uint8_t& b : w.values) b = static_cast<uint8_t>(byte(rng));
  w.exponents.resize(static_cast<size_t>(rows * cols / 32));
  for (uint8_t& e : w.exponents) e = static_cast<uint8_t>(exponent(rng));
  return w;
}

// The view's values as row-major bf16 weights (which hold each exactly).
TestWeights decodedToBf16(const WeightView& view) {
  TestWeights w{DType::kBF16, view.rows, view.cols, {}, {}, {}};
  for (int64_t r = 0; r < view.rows; ++r) {
    for (int64_t c = 0; c < view.cols; ++c) {
      const float value = mxfp4Value(view, r, c);
      w.half.push_back(f32ToBf16(value));
      w.values.push_back(value);
      EXPECT_EQ(bitsOf(bf16ToF32(w.half.back())), bitsOf(value)) << r << " " << c;
    }
  }
  return w;
}

// What an element is: its E2M1 nibble (the low one first in a byte) times
// 2^(exponent - 127), from the OCP Microscaling definition, at every nibble
// and at E8M0's ends (2^-127, an f32 subnormal; beyond 2^128, infinity).
TEST(Mxfp4, ValuesAreTheFormatsDefinition) {
  const double magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (int exponent : {0, 1, 2, 100, 127, 128, 200, 253, 254}) {
    for (int nibble = 0; nibble < 16; ++nibble) {
      for (int high = 0; high < 2; ++high) {
        const uint8_t byte = static_cast<uint8_t>(high ? nibble << 4 : nibble);
        const uint8_t exponents[1] = {static_cast<uint8_t>(exponent)};
        std::vector<uint8_t> values(16, 0);
        values[3] = byte;
        WeightView w{values.data(), DType::kU8, 1, 32, WeightLayout::kMxfp4};
        w.exponents = exponents;
        const double magnitude = std::ldexp(magnitudes[nibble & 7], exponent - 127);
        const auto expected = static_cast<float>((nibble & 8) != 0 ? -magnitude : magnitude);
        EXPECT_EQ(bitsOf(mxfp4Value(w, 0, 6 + high)), bitsOf(expected))
            << "nibble " << nibble << " exponent " << exponent;
        EXPECT_EQ(bitsOf(mxfp4Value(w, 0, 7 - high)), bitsOf(0.0f));
      }
    }
  }
}

// An MXFP4 matrix multiplies to the bits of its values decoded into bf16
// rows, for any number of rows (register tiles, a prefill split over row
// blocks), every view (every other row included), at E8M0's ends too.
TEST_P(CpuKernels, MatmulMxfp4GivesTheBitsOfItsBf16Decoding) {
  struct Shape {
    int64_t k, stored_rows;
    int exponent_lo, exponent_hi;
  };
  for (const Shape& s : {Shape{32, 9, 120, 130}, Shape{320, 67, 110, 135},
                         Shape{1056, 34, 120, 130}, Shape{64, 24, 0, 254}}) {
    const Mxfp4Weights weights =
        makeMxfp4Weights(s.stored_rows, s.k, 13, s.exponent_lo, s.exponent_hi);
    for (const auto& [first, step] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}}) {
      const WeightView view = weights.view(first, step);
      const TestWeights bf16 = decodedToBf16(view);
      for (int64_t m : {1, 2, 3, 6, 7, 13, 300}) {
        SCOPED_TRACE("k=" + std::to_string(s.k) + " view " + std::to_string(first) + "/" +
                     std::to_string(step) + " m=" + std::to_string(m));
        const std::vector<float> x = randomFloats(static_cast<size_t>(m * s.k), 17);
        std::vector<float> y(static_cast<size_t>(m * view.rows), std::nanf(""));
        matmul(x.data(), m, s.k, view, y.data());
        const std::vector<float> expected = runMatmul(x, m, bf16);
        EXPECT_TRUE(sameBits(y.data(), expected.data(), y.size()));
      }
    }
  }
}

// ------------------------------------------------------------- elementwise --

// Tolerance: the sum of squares is a fixed-order fp32 reduction (see the
// matmul bound); the rest is a few correctly rounded operations: 1e-5 relative.
TEST_P(CpuKernels, RmsNormMatchesReference) {
  for (int64_t dim : {1, 7, 16, 100, 2051}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t rows = 5;
    const std::vector<float> x = randomFloats(static_cast<size_t>(rows * dim), 21, -3.0f, 3.0f);
    const std::vector<float> weight = randomFloats(static_cast<size_t>(dim), 22);
    std::vector<float> y(x.size());
    rmsNorm(x.data(), weight.data(), rows, dim, 1e-6f, y.data());
    std::vector<float> in_place = x;
    rmsNorm(in_place.data(), weight.data(), rows, dim, 1e-6f, in_place.data());
    EXPECT_TRUE(sameBits(y.data(), in_place.data(), y.size()));
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t d = 0; d < dim; ++d) sum += double{x[r * dim + d]} * x[r * dim + d];
      const double inv = 1.0 / std::sqrt(sum / dim + 1e-6);
      for (int64_t d = 0; d < dim; ++d) {
        const double ref = x[r * dim + d] * inv * weight[d];
        ASSERT_NEAR(y[r * dim + d], ref, 1e-5 * std::fabs(ref) + 1e-7);
      }
    }
  }
}

TEST_P(CpuKernels, RmsNormRowDoesNotDependOnBatch) {
  const int64_t dim = 333;
  const std::vector<float> x = randomFloats(static_cast<size_t>(64 * dim), 23);
  const std::vector<float> weight = randomFloats(static_cast<size_t>(dim), 24);
  std::vector<float> all(x.size());
  rmsNorm(x.data(), weight.data(), 64, dim, 1e-5f, all.data());
  std::vector<float> one(static_cast<size_t>(dim));
  rmsNorm(x.data() + 41 * dim, weight.data(), 1, dim, 1e-5f, one.data());
  EXPECT_TRUE(sameBits(one.data(), all.data() + 41 * dim, static_cast<size_t>(dim)));
}

// Tolerance: cos/sin come from double and are rounded once; each output is
// two products and a sum in fp32: 1e-6 absolute for |x| <= 1.
TEST_P(CpuKernels, RopeMatchesReference) {
  const int64_t rows = 6;
  const int64_t num_heads = 3;
  const int64_t head_dim = 64;
  const int64_t width = num_heads * head_dim;
  const std::vector<int32_t> positions = {0, 1, 7, 100, 4095, 131071};
  std::vector<float> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / head_dim));
  }
  const std::vector<float> x = randomFloats(static_cast<size_t>(rows * width), 31);
  std::vector<float> y = x;
  applyRope(y.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* in = x.data() + r * width + h * head_dim;
      const float* out = y.data() + r * width + h * head_dim;
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        const double c = std::cos(double{angle});
        const double s = std::sin(double{angle});
        const double a = in[i];
        const double b = in[i + head_dim / 2];
        ASSERT_NEAR(out[i], a * c - b * s, 1e-6);
        ASSERT_NEAR(out[i + head_dim / 2], b * c + a * s, 1e-6);
      }
    }
  }
}

TEST_P(CpuKernels, RopeRotatesHalvesLikeHuggingFace) {
  // One head of 4: pairs are (0, 2) and (1, 3); position 1 turns pair 0 by
  // inv_freq[0] = 1 radian.
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 0.0f};
  const int32_t position = 1;
  const float inv_freq[] = {1.0f, 0.5f};
  applyRope(x.data(), 1, 1, 4, &position, inv_freq);
  EXPECT_FLOAT_EQ(x[0], std::cos(1.0f));
  EXPECT_FLOAT_EQ(x[1], 0.0f);
  EXPECT_FLOAT_EQ(x[2], std::sin(1.0f));
  EXPECT_FLOAT_EQ(x[3], 0.0f);
}

// Phi-4-mini's rotary embedding: 3/4 of each head rotates, as pairs (i, i +
// rotary_dim/2); cos and sin carry LongRoPE's attention factor (rounded as
// transformers rounds them: the fp32 cos times the fp32 factor); the last
// quarter is left bit for bit.
TEST_P(CpuKernels, PartialRopeRotatesTheFirstDimsWithTheAttentionFactor) {
  const int64_t rows = 4;
  const int64_t num_heads = 2;
  const int64_t head_dim = 32;
  const int64_t rotary_dim = 24;
  const int64_t width = num_heads * head_dim;
  const std::vector<int32_t> positions = {0, 3, 600, 70000};
  std::vector<float> inv_freq(rotary_dim / 2);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / rotary_dim));
  }
  const float factor = 1.19f;
  const std::vector<float> x = randomFloats(static_cast<size_t>(rows * width), 32);
  std::vector<float> y = x;
  applyRope(y.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data(),
            {.rotary_dim = rotary_dim, .attention_factor = factor});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* in = x.data() + r * width + h * head_dim;
      const float* out = y.data() + r * width + h * head_dim;
      for (int64_t i = 0; i < rotary_dim / 2; ++i) {
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        const float c = static_cast<float>(std::cos(double{angle})) * factor;
        const float s = static_cast<float>(std::sin(double{angle})) * factor;
        const float a = in[i];
        const float b = in[i + rotary_dim / 2];
        ASSERT_NEAR(out[i], double{a} * c - double{b} * s, 2e-6) << r << " " << h << " " << i;
        ASSERT_NEAR(out[i + rotary_dim / 2], double{b} * c + double{a} * s, 2e-6);
      }
      EXPECT_TRUE(
          sameBits(out + rotary_dim, in + rotary_dim, static_cast<size_t>(head_dim - rotary_dim)));
    }
  }
  // Rotary dims equal to head_dim and a factor of 1 are the plain kernel.
  std::vector<float> plain = x;
  std::vector<float> whole = x;
  std::vector<float> full_freq(head_dim / 2, 0.01f);
  applyRope(plain.data(), rows, num_heads, head_dim, positions.data(), full_freq.data());
  applyRope(whole.data(), rows, num_heads, head_dim, positions.data(), full_freq.data(),
            {.rotary_dim = head_dim, .attention_factor = 1.0f});
  EXPECT_TRUE(sameBits(plain.data(), whole.data(), plain.size()));
}

// GLM's rotary embedding: the first half of each head rotates as neighbour
// pairs (2i, 2i + 1). Pair i takes the same arithmetic as the halves
// convention's pair (i, i + rotary_dim/2): the interleaved head, its rotated
// values gathered into halves, gives the halves kernel's bits; the rest is
// left bit for bit.
TEST_P(CpuKernels, InterleavedRopeRotatesNeighbourPairsWithTheHalvesArithmetic) {
  const int64_t rows = 5;
  const int64_t num_heads = 3;
  const int64_t head_dim = 32;
  const int64_t rotary_dim = 16;
  const int64_t half = rotary_dim / 2;
  const int64_t width = num_heads * head_dim;
  const std::vector<int32_t> positions = {0, 1, 9, 513, 131071};
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / rotary_dim));
  }
  const std::vector<float> x = randomFloats(static_cast<size_t>(rows * width), 33);
  // x with each head's rotated dims regrouped: (2i, 2i + 1) -> (i, i + half).
  std::vector<float> halves = x;
  for (int64_t r = 0; r < rows * num_heads; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      halves[r * head_dim + i] = x[r * head_dim + 2 * i];
      halves[r * head_dim + i + half] = x[r * head_dim + 2 * i + 1];
    }
  }
  for (const float factor : {1.0f, 1.19f}) {
    std::vector<float> y = x;
    applyRope(y.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data(),
              {.rotary_dim = rotary_dim, .attention_factor = factor, .interleaved = true});
    std::vector<float> expected = halves;
    applyRope(expected.data(), rows, num_heads, head_dim, positions.data(), inv_freq.data(),
              {.rotary_dim = rotary_dim, .attention_factor = factor});
    for (int64_t r = 0; r < rows * num_heads; ++r) {
      const float* out = y.data() + r * head_dim;
      const float* want = expected.data() + r * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        ASSERT_TRUE(sameBits(&out[2 * i], &want[i], 1)) << r << " " << i;
        ASSERT_TRUE(sameBits(&out[2 * i + 1], &want[i + half], 1)) << r << " " << i;
      }
      EXPECT_TRUE(sameBits(out + rotary_dim, x.data() + r * head_dim + rotary_dim,
                           static_cast<size_t>(head_dim - rotary_dim)));
    }
  }
  // One head of 4, whole: position 1 turns pair (0, 1) by 1 radian.
  std::vector<float> one = {1.0f, 0.0f, 0.0f, 0.0f};
  const int32_t position = 1;
  const float freq[] = {1.0f, 0.5f};
  applyRope(one.data(), 1, 1, 4, &position, freq, {.interleaved = true});
  EXPECT_FLOAT_EQ(one[0], std::cos(1.0f));
  EXPECT_FLOAT_EQ(one[1], std::sin(1.0f));
  EXPECT_FLOAT_EQ(one[2], 0.0f);
  EXPECT_FLOAT_EQ(one[3], 0.0f);
}

// Tolerance: e^x is a polynomial approximation good to a few ulp; with the
// division and product: 4e-6 relative.
TEST_P(CpuKernels, SiluMulMatchesReference) {
  std::vector<float> gate = randomFloats(1003, 41, -20.0f, 20.0f);
  gate[0] = -100.0f;
  gate[1] = 100.0f;
  gate[2] = 0.0f;
  gate[3] = -87.5f;
  gate[4] = 89.5f;
  const std::vector<float> up = randomFloats(gate.size(), 42, -2.0f, 2.0f);
  std::vector<float> out(gate.size());
  siluMul(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double ref = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(out[i], ref, 4e-6 * std::fabs(ref) + 1e-30) << "gate " << gate[i];
  }
  std::vector<float> aliased = gate;
  siluMul(aliased.data(), up.data(), aliased.data(), static_cast<int64_t>(gate.size()));
  EXPECT_TRUE(sameBits(aliased.data(), out.data(), out.size()));
}

// GPT-OSS's activation: gate clamped above, up on both sides, at the
// limit; values on both sides of it, large ones where the exponential
// saturates, and NaN passing through. Same tolerance as siluMul's.
TEST_P(CpuKernels, ClampedSwigluMatchesReference) {
  const float limit = 7.0f, alpha = 1.702f;
  std::vector<float> gate = randomFloats(1003, 45, -12.0f, 12.0f);
  std::vector<float> up = randomFloats(gate.size(), 46, -12.0f, 12.0f);
  gate[0] = -100.0f;
  gate[1] = 100.0f;
  gate[2] = 7.0f;
  up[3] = -7.5f;
  up[4] = 7.5f;
  gate[5] = std::nanf("");
  up[6] = std::nanf("");
  std::vector<float> out(gate.size());
  clampedSwiglu(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()), alpha,
                limit);
  for (size_t i = 0; i < gate.size(); ++i) {
    if (i == 5 || i == 6) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
      continue;
    }
    const double g = std::min(double{gate[i]}, double{limit});
    const double u = std::clamp(double{up[i]}, -double{limit}, double{limit});
    const double ref = (u + 1.0) * g / (1.0 + std::exp(-double{alpha} * g));
    ASSERT_NEAR(out[i], ref, 4e-6 * std::fabs(ref) + 1e-30)
        << "gate " << gate[i] << " up " << up[i];
  }
  EXPECT_EQ(out[1], static_cast<float>((up[1] + 1.0) * 7.0 / (1.0 + std::exp(-1.702 * 7.0))))
      << "a gate above the limit computes as the limit";
  std::vector<float> aliased = gate;
  clampedSwiglu(aliased.data(), up.data(), aliased.data(), static_cast<int64_t>(gate.size()), alpha,
                limit);
  EXPECT_TRUE(sameBits(aliased.data(), out.data(), out.size()));
  std::vector<float> piece(77);
  clampedSwiglu(gate.data() + 501, up.data() + 501, piece.data(), 77, alpha, limit);
  EXPECT_TRUE(sameBits(piece.data(), out.data() + 501, 77)) << "independent of chunking";
}

TEST_P(CpuKernels, SiluMulIsIndependentOfChunking) {
  const int64_t n = 100000;  // several parallel chunks
  const std::vector<float> gate = randomFloats(n, 43, -10.0f, 10.0f);
  const std::vector<float> up = randomFloats(n, 44);
  std::vector<float> all(n);
  siluMul(gate.data(), up.data(), all.data(), n);
  std::vector<float> piece(77);
  siluMul(gate.data() + 40001, up.data() + 40001, piece.data(), 77);
  EXPECT_TRUE(sameBits(piece.data(), all.data() + 40001, 77));
}

// Tolerance: the exp approximation is good to a few ulp (4e-6 relative with
// the division); the fp32 sum of n positive terms adds error growing with n —
// about sqrt(n) * 2^-24 in practice for the sequential scalar sum, less for
// the 8/16-way vector sums — so we allow 4e-6 + sqrt(n) * 1e-6 relative.
TEST_P(CpuKernels, SoftmaxMatchesReference) {
  for (int64_t n : {1, 5, 16, 17, 1000, 32000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> x = randomFloats(static_cast<size_t>(n), 51, -8.0f, 8.0f);
    for (auto& v : x) v += 1000.0f;  // stability: naive exp would overflow
    std::vector<float> y = x;
    softmax(y.data(), n);
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (float v : x) sum += std::exp(double{v} - max);
    const double tolerance = 4e-6 + std::sqrt(static_cast<double>(n)) * 1e-6;
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(double{x[i]} - max) / sum;
      ASSERT_NEAR(y[i], ref, tolerance * ref + 1e-30);
      total += y[i];
    }
    EXPECT_NEAR(total, 1.0, tolerance);
  }
}

TEST_P(CpuKernels, EmbeddingCopiesRowsExactly) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const TestWeights table = makeWeights(dtype, 10, 33, 61);
    const std::vector<int32_t> ids = {3, 0, 9, 3};
    std::vector<float> out(ids.size() * 33);
    embedding(table.view(), ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_TRUE(sameBits(out.data() + r * 33, table.values.data() + ids[r] * 33, 33));
    }
  }
}

TEST_P(CpuKernels, ArgmaxPrefersSmallestIndexOnTies) {
  const std::vector<float> x = {1.0f, 5.0f, -2.0f, 5.0f, 4.0f};
  EXPECT_EQ(argmax(x.data(), 5), 1);
  const std::vector<float> with_nan = {std::nanf(""), -1.0f, 3.0f, std::nanf("")};
  EXPECT_EQ(argmax(with_nan.data(), 4), 2);
  const std::vector<float> big = randomFloats(32000, 71);
  EXPECT_EQ(argmax(big.data(), 32000), std::max_element(big.begin(), big.end()) - big.begin());
}

TEST_P(CpuKernels, AddInPlaceAdds) {
  std::vector<float> y = randomFloats(37, 81);
  const std::vector<float> x = randomFloats(37, 82);
  const std::vector<float> before = y;
  addInPlace(y.data(), x.data(), 37);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], before[i] + x[i]);
}

// --------------------------------------------------------------- KV cache --

// A cache with its memory, plus one query/key/value set per sequence. An
// fp8 cache gets a K and a V scale per layer, none a power of two and no two
// alike, so a scale taken from the wrong layer or the wrong half shows.
struct TestCache {
  KvCacheLayout layout;
  std::vector<char> memory;
  std::vector<float> scales;

  TestCache(DType dtype, int64_t num_blocks, int32_t block_size, int32_t num_layers,
            int32_t num_kv_heads, int32_t head_dim) {
    layout.dtype = dtype;
    layout.num_blocks = num_blocks;
    layout.block_size = block_size;
    layout.num_layers = num_layers;
    layout.num_kv_heads = num_kv_heads;
    layout.head_dim = head_dim;
    // Poison so a read of an unwritten slot shows up as NaN.
    memory.assign(static_cast<size_t>(num_blocks * layout.blockBytes()), static_cast<char>(0xff));
    layout.base = memory.data();
    if (dtype == DType::kF8E4M3) {
      for (int32_t i = 0; i < 2 * num_layers; ++i) scales.push_back(0.0171f * (1.0f + 0.13f * i));
      layout.scales = scales.data();
    }
  }

  // The fp32 value of element (layer, kv, position, kv_head, d) of a sequence.
  float at(const std::vector<int32_t>& block_table, int32_t layer, int kv, int64_t position,
           int64_t kv_head, int64_t d) const {
    const int64_t block = block_table[position / layout.block_size];
    const int64_t slot = position % layout.block_size;
    const int64_t element =
        (((int64_t{layer} * 2 + kv) * layout.block_size + slot) * layout.num_kv_heads + kv_head) *
            layout.head_dim +
        d;
    const char* p = memory.data() + block * layout.blockBytes() +
                    element * static_cast<int64_t>(dtypeSize(layout.dtype));
    if (layout.dtype == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      return bf16ToF32(h);
    }
    if (layout.dtype == DType::kF8E4M3) {
      return f8e4m3ToF32(static_cast<uint8_t>(*p)) * layout.scale(layer, kv);
    }
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
};

TEST_P(CpuKernels, WriteKvStoresRoundedValuesAtTheirSlots) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(dtypeShortName(dtype));
    const int32_t block_size = 4;
    TestCache cache(dtype, 8, block_size, 2, 2, 6);
    const int64_t width = 12;
    // Two sequences sharing the call; the second's rows come first in k/v.
    const std::vector<int32_t> table_a = {5, 2, 7};
    const std::vector<int32_t> table_b = {1, 4};
    const AttentionSequence sequences[] = {
        {table_a.data(), 3, 3, 6, 3},  // positions 3..8 at rows 3..8
        {table_b.data(), 2, 0, 3, 0},  // positions 0..2 at rows 0..2
    };
    const std::vector<float> k = randomFloats(9 * width, 91);
    const std::vector<float> v = randomFloats(9 * width, 92);
    writeKv(cache.layout, 1, k.data(), v.data(), sequences, 2);
    auto expect_row = [&](const std::vector<int32_t>& table, int64_t position, int64_t row) {
      for (int64_t e = 0; e < width; ++e) {
        const int64_t kv_head = e / 6;
        const int64_t d = e % 6;
        for (int kv = 0; kv < 2; ++kv) {
          const float written = (kv == 0 ? k : v)[row * width + e];
          // fp8: the value over its layer's K or V scale, rounded.
          const float scale = cache.layout.scale(1, kv);
          const float expected = dtype == DType::kBF16 ? bf16ToF32(f32ToBf16(written))
                                 : dtype == DType::kF8E4M3
                                     ? f8e4m3ToF32(f32ToF8e4m3(written / scale)) * scale
                                     : written;
          ASSERT_EQ(bitsOf(cache.at(table, 1, kv, position, kv_head, d)), bitsOf(expected));
        }
      }
    };
    for (int64_t r = 0; r < 6; ++r) expect_row(table_a, 3 + r, 3 + r);
    for (int64_t r = 0; r < 3; ++r) expect_row(table_b, r, r);
  }
}

struct AttentionShape {
  DType dtype;
  int32_t block_size;
  int32_t num_kv_heads;
  int64_t num_heads;
  int32_t head_dim;
};

std::string shapeName(const AttentionShape& s) {
  return std::string(dtypeShortName(s.dtype)) + " block=" + std::to_string(s.block_size) +
         " heads=" + std::to_string(s.num_heads) + "/" + std::to_string(s.num_kv_heads) +
         " head_dim=" + std::to_string(s.head_dim);
}

const AttentionShape kAttentionShapes[] = {
    {DType::kF32, 16, 2, 4, 64},    {DType::kBF16, 16, 2, 4, 64},  {DType::kF32, 5, 1, 3, 20},
    {DType::kBF16, 7, 3, 3, 128},   {DType::kF32, 3, 1, 2, 256},   {DType::kBF16, 1, 2, 8, 80},
    {DType::kF32, 16, 2, 2, 7},     {DType::kBF16, 16, 2, 14, 64},  // groups of 7 heads
    {DType::kF8E4M3, 16, 2, 4, 64}, {DType::kF8E4M3, 5, 1, 3, 20}, {DType::kF8E4M3, 3, 2, 14, 256},
};

// Block tables that scatter each sequence over the cache in a shuffled order.
std::vector<std::vector<int32_t>> scatteredTables(const std::vector<int64_t>& lengths,
                                                  int32_t block_size, int64_t* num_blocks) {
  int64_t total = 0;
  for (int64_t len : lengths) total += (len + block_size - 1) / block_size;
  std::vector<int32_t> ids(static_cast<size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(123));
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (int64_t len : lengths) {
    const int64_t blocks = (len + block_size - 1) / block_size;
    tables.emplace_back(ids.begin() + next, ids.begin() + next + blocks);
    next += blocks;
  }
  *num_blocks = total;
  return tables;
}

// Tolerance: scores are fp32 dot products of length head_dim <= 256 (see the
// matmul bound), exp is good to a few ulp, and the output is a convex
// combination of values in [-1, 1] summed in fp32 over <= 100 positions:
// 2e-5 absolute. With a sliding window (13: not a block size's multiple,
// and shorter than most of the positions) a query reads only the last 13
// positions, starting mid-block. Gemma 2's soft-capping (1.5: near the
// scores' own size, so the tanh bends them), with and without a window.
// GPT-OSS's sinks, with and without a window: one logit per head, from
// below the scores to far above them (8: the sink holds the maximum and
// takes most of the weight).
TEST_P(CpuKernels, PagedAttentionMatchesReference) {
  struct Variant {
    int64_t window;
    float softcap;
    bool sinks;
  };
  const Variant variants[] = {{0, 0.0f, false},  {13, 0.0f, false}, {0, 1.5f, false},
                              {13, 1.5f, false}, {0, 0.0f, true},   {13, 0.0f, true}};
  for (const auto& [window, softcap, with_sinks] : variants)
    for (const AttentionShape& shape : kAttentionShapes) {
      SCOPED_TRACE(shapeName(shape) + " window " + std::to_string(window) + " softcap " +
                   std::to_string(softcap) + (with_sinks ? " sinks" : ""));
      const std::vector<int64_t> lengths = {1, 37, 100};
      const std::vector<int64_t> new_rows = {1, 37, 9};  // decode, prefill, continued prefill
      int64_t num_blocks = 0;
      const auto tables = scatteredTables(lengths, shape.block_size, &num_blocks);
      TestCache cache(shape.dtype, num_blocks, shape.block_size, 2, shape.num_kv_heads,
                      shape.head_dim);
      const int64_t kv_width = int64_t{shape.num_kv_heads} * shape.head_dim;
      const int64_t q_width = shape.num_heads * shape.head_dim;
      const int32_t layer = 1;

      // Fill every position of every sequence, one writeKv per sequence.
      for (size_t s = 0; s < lengths.size(); ++s) {
        const std::vector<float> k = randomFloats(lengths[s] * kv_width, 200 + s);
        const std::vector<float> v = randomFloats(lengths[s] * kv_width, 300 + s);
        const AttentionSequence seq{tables[s].data(), static_cast<int32_t>(tables[s].size()), 0,
                                    lengths[s], 0};
        writeKv(cache.layout, layer, k.data(), v.data(), &seq, 1);
      }
      std::vector<AttentionSequence> sequences;
      int64_t rows = 0;
      for (size_t s = 0; s < lengths.size(); ++s) {
        sequences.push_back({tables[s].data(), static_cast<int32_t>(tables[s].size()), rows,
                             new_rows[s], lengths[s] - new_rows[s]});
        rows += new_rows[s];
      }
      const std::vector<float> q = randomFloats(rows * q_width, 400);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
      std::vector<float> sinks;
      for (int64_t h = 0; h < shape.num_heads; ++h) {
        const float cycle[] = {-2.0f, 0.25f, 8.0f, 1.0f};
        sinks.push_back(cycle[h % 4]);
      }
      std::vector<float> out(q.size(), std::nanf(""));
      pagedAttention(cache.layout, layer, q.data(), shape.num_heads, scale, sequences.data(),
                     static_cast<int64_t>(sequences.size()), out.data(), window, softcap,
                     with_sinks ? sinks.data() : nullptr);

      const int64_t group = shape.num_heads / shape.num_kv_heads;
      for (size_t s = 0; s < sequences.size(); ++s) {
        for (int64_t r = 0; r < sequences[s].num_rows; ++r) {
          const int64_t row = sequences[s].first_row + r;
          const int64_t position = sequences[s].first_position + r;
          for (int64_t h = 0; h < shape.num_heads; ++h) {
            const float* qh = q.data() + row * q_width + h * shape.head_dim;
            const int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
            std::vector<double> p(position + 1, 0.0);
            double max = -INFINITY;
            for (int64_t t = first; t <= position; ++t) {
              double dot = 0.0;
              for (int64_t d = 0; d < shape.head_dim; ++d) {
                dot += double{qh[d]} * cache.at(tables[s], layer, 0, t, h / group, d);
              }
              p[t] = dot * scale;
              if (softcap > 0) p[t] = std::tanh(p[t] / softcap) * softcap;
              max = std::max(max, p[t]);
            }
            if (with_sinks) max = std::max(max, double{sinks[h]});
            double sum = 0.0;
            for (int64_t t = first; t <= position; ++t) sum += (p[t] = std::exp(p[t] - max));
            if (with_sinks) sum += std::exp(sinks[h] - max);
            for (int64_t d = 0; d < shape.head_dim; ++d) {
              double ref = 0.0;
              for (int64_t t = first; t <= position; ++t) {
                ref += p[t] * cache.at(tables[s], layer, 1, t, h / group, d);
              }
              ref /= sum;
              ASSERT_NEAR(out[row * q_width + h * shape.head_dim + d], ref, 2e-5)
                  << "sequence " << s << " row " << r << " head " << h << " dim " << d;
            }
          }
        }
      }
    }
}

// One sequence's prompt, its KV and queries.
struct Prompt {
  int64_t length;
  std::vector<float> q, k, v;
};

Prompt makePrompt(const AttentionShape& shape, int64_t length, uint32_t seed) {
  const int64_t kv_width = int64_t{shape.num_kv_heads} * shape.head_dim;
  return Prompt{length, randomFloats(length * shape.num_heads * shape.head_dim, seed),
                randomFloats(length * kv_width, seed + 1),
                randomFloats(length * kv_width, seed + 2)};
}

// The attention variants a model may ask for (PagedAttentionMatchesReference).
struct AttentionVariant {
  int64_t window = 0;
  float softcap = 0.0f;
  const float* sinks = nullptr;
};

// Runs `prompt` through writeKv + pagedAttention in chunks of `chunk` rows
// (the whole prompt at once when chunk >= length) and returns all outputs.
std::vector<float> prefillInChunks(const AttentionShape& shape, const Prompt& prompt, int64_t chunk,
                                   const AttentionVariant& variant = {}) {
  int64_t num_blocks = 0;
  const auto tables = scatteredTables({prompt.length}, shape.block_size, &num_blocks);
  TestCache cache(shape.dtype, num_blocks, shape.block_size, 1, shape.num_kv_heads, shape.head_dim);
  const int64_t kv_width = int64_t{shape.num_kv_heads} * shape.head_dim;
  const int64_t q_width = shape.num_heads * shape.head_dim;
  std::vector<float> out(prompt.q.size(), std::nanf(""));
  for (int64_t start = 0; start < prompt.length; start += chunk) {
    const int64_t rows = std::min(chunk, prompt.length - start);
    const AttentionSequence seq{tables[0].data(), static_cast<int32_t>(tables[0].size()), 0, rows,
                                start};
    writeKv(cache.layout, 0, prompt.k.data() + start * kv_width, prompt.v.data() + start * kv_width,
            &seq, 1);
    pagedAttention(cache.layout, 0, prompt.q.data() + start * q_width, shape.num_heads, 0.125f,
                   &seq, 1, out.data() + start * q_width, variant.window, variant.softcap,
                   variant.sinks);
  }
  return out;
}

// Chunks of 1 row are decode steps, each row alone; a whole prompt's rows
// share their K/V loads in runs of up to four (pagedAttention), and chunks
// of 2, 3, 7 and 16 rows end those runs early. Sliding windows (3, shorter
// than a run; 13, starting mid-block) start each row of a run at another
// position, and soft-capping and sinks take their own paths.
TEST_P(CpuKernels, AttentionIsIndependentOfChunking) {
  std::vector<float> sinks;
  for (int h = 0; h < 14; ++h) sinks.push_back(h % 3 == 0 ? 8.0f : -1.0f + 0.5f * h);
  const AttentionVariant variants[] = {
      {}, {3, 0.0f, nullptr}, {13, 0.0f, nullptr}, {0, 1.5f, nullptr}, {13, 0.0f, sinks.data()}};
  for (const AttentionVariant& variant : variants)
    for (const AttentionShape& shape : kAttentionShapes) {
      SCOPED_TRACE(shapeName(shape) + " window " + std::to_string(variant.window) + " softcap " +
                   std::to_string(variant.softcap) + (variant.sinks ? " sinks" : ""));
      const Prompt prompt = makePrompt(shape, 45, 500);
      const std::vector<float> whole = prefillInChunks(shape, prompt, prompt.length, variant);
      for (int64_t chunk : {1, 2, 3, 7, 16}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const std::vector<float> chunked = prefillInChunks(shape, prompt, chunk, variant);
        EXPECT_TRUE(sameBits(chunked.data(), whole.data(), whole.size()));
      }
    }
}

// A sequence's outputs must not change when other sequences of other lengths
// share the call, nor with the thread count.
TEST_P(CpuKernels, AttentionIsIndependentOfBatchAndThreads) {
  for (const AttentionShape& shape : kAttentionShapes) {
    SCOPED_TRACE(shapeName(shape));
    const std::vector<int64_t> lengths = {23, 64, 5};
    std::vector<Prompt> prompts;
    for (size_t s = 0; s < lengths.size(); ++s) {
      prompts.push_back(makePrompt(shape, lengths[s], 600 + 10 * s));
    }
    int64_t num_blocks = 0;
    const auto tables = scatteredTables(lengths, shape.block_size, &num_blocks);
    TestCache cache(shape.dtype, num_blocks, shape.block_size, 1, shape.num_kv_heads,
                    shape.head_dim);
    const int64_t q_width = shape.num_heads * shape.head_dim;
    auto sequence = [&](size_t s, int64_t first_row) {
      return AttentionSequence{tables[s].data(), static_cast<int32_t>(tables[s].size()), first_row,
                               lengths[s], 0};
    };
    // Batched: all three prompts in one writeKv and one attention call.
    std::vector<AttentionSequence> batch;
    std::vector<float> q, k, v;
    for (size_t s = 0; s < lengths.size(); ++s) {
      batch.push_back(sequence(s, static_cast<int64_t>(q.size()) / q_width));
      q.insert(q.end(), prompts[s].q.begin(), prompts[s].q.end());
      k.insert(k.end(), prompts[s].k.begin(), prompts[s].k.end());
      v.insert(v.end(), prompts[s].v.begin(), prompts[s].v.end());
    }
    writeKv(cache.layout, 0, k.data(), v.data(), batch.data(), 3);
    std::vector<float> batched(q.size(), std::nanf(""));
    pagedAttention(cache.layout, 0, q.data(), shape.num_heads, 0.125f, batch.data(), 3,
                   batched.data());

    int64_t offset = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const AttentionSequence alone = sequence(s, 0);
      for (int threads : {1, 2}) {
        setNumThreads(threads);
        std::vector<float> out(prompts[s].q.size(), std::nanf(""));
        pagedAttention(cache.layout, 0, prompts[s].q.data(), shape.num_heads, 0.125f, &alone, 1,
                       out.data());
        EXPECT_TRUE(sameBits(out.data(), batched.data() + offset, out.size()));
      }
      // Its last row alone, as a decode step.
      const AttentionSequence last{tables[s].data(), static_cast<int32_t>(tables[s].size()), 0, 1,
                                   lengths[s] - 1};
      std::vector<float> decode(static_cast<size_t>(q_width));
      pagedAttention(cache.layout, 0, prompts[s].q.data() + (lengths[s] - 1) * q_width,
                     shape.num_heads, 0.125f, &last, 1, decode.data());
      EXPECT_TRUE(sameBits(decode.data(), batched.data() + offset + (lengths[s] - 1) * q_width,
                           decode.size()));
      offset += static_cast<int64_t>(prompts[s].q.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CpuKernels, ::testing::ValuesIn(availableIsas()), isaLabel);

// -------------------------------------------------------------- thread pool --

// Gemma 3's activation: PyTorch's gelu(approximate="tanh") times up, to
// fp32 rounding, with the published values at +-1; in place as well; split
// over tasks the same bits as one by one.
TEST(GeluTanhMul, IsPyTorchsTanhApproximationTimesUp) {
  std::vector<float> gate = {-20.0f, -6.0f, -3.0f, -1.0f, -0.5f, 0.0f, 0.25f, 1.0f, 2.5f, 8.0f};
  const std::vector<float> extra = randomFloats(40000, 77);
  gate.insert(gate.end(), extra.begin(), extra.end());
  for (float& g : gate) g *= 4.0f;
  const std::vector<float> up = randomFloats(gate.size(), 78);
  std::vector<float> out(gate.size());
  geluTanhMul(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()));
  const double beta = std::sqrt(2.0 / std::acos(-1.0));
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double expected = 0.5 * g * (1.0 + std::tanh(beta * (g + 0.044715 * g * g * g))) * up[i];
    ASSERT_NEAR(out[i], expected, 1e-6 * std::max(1.0, std::abs(expected))) << "gate " << g;
  }
  const float ones[2] = {1.0f, 1.0f};
  const float at[2] = {1.0f, -1.0f};
  float gelu[2];
  geluTanhMul(at, ones, gelu, 2);
  EXPECT_NEAR(gelu[0], 0.841192f, 1e-6f);
  EXPECT_NEAR(gelu[1], -0.158808f, 1e-6f);
  std::vector<float> in_place = gate;
  geluTanhMul(in_place.data(), up.data(), in_place.data(), static_cast<int64_t>(gate.size()));
  EXPECT_EQ(in_place, out);
  std::vector<float> one_by_one(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) geluTanhMul(&gate[i], &up[i], &one_by_one[i], 1);
  EXPECT_EQ(one_by_one, out);
}

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 5}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.numThreads(), threads);
    for (int64_t tasks : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
      std::atomic<bool> worker_in_range{true};
      pool.parallelFor(tasks, [&](int64_t task, int worker) {
        runs[task].fetch_add(1);
        if (worker < 0 || worker >= threads) worker_in_range = false;
      });
      for (auto& r : runs) EXPECT_EQ(r.load(), 1);
      EXPECT_TRUE(worker_in_range.load());
    }
  }
}

// Kernels may be called from several threads at once: each call must still
// run exactly its own tasks.
TEST(ThreadPool, ConcurrentCallersEachRunTheirOwnTasks) {
  cpu::ThreadPool pool(3);
  std::atomic<bool> wrong_sum{false};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      const int64_t tasks = 50 + c;
      for (int i = 0; i < 200; ++i) {
        std::atomic<int64_t> sum{0};
        pool.parallelFor(tasks, [&](int64_t task, int) { sum.fetch_add(task + 1); });
        if (sum.load() != tasks * (tasks + 1) / 2) wrong_sum = true;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_FALSE(wrong_sum.load());
}

// kernels::parallelFor (host work): a throwing task reaches the caller as
// its exception, after every other task has run, and the pool goes on.
TEST(ThreadPool, AThrowingHostTaskIsThrownOnTheCallersThread) {
  const int threads = numThreads();
  setNumThreads(2);
  std::atomic<int> ran{0};
  try {
    parallelFor(64, [&](int64_t task, int) {
      ran.fetch_add(1);
      if (task == 5) throw Error("task 5 failed");
    });
    ADD_FAILURE() << "the task's exception did not reach the caller";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("task 5 failed"), std::string::npos);
  }
  EXPECT_EQ(ran.load(), 64);
  std::atomic<int> after{0};
  parallelFor(10, [&](int64_t, int) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 10);
  setNumThreads(threads);
}

TEST(ThreadPool, ChangesThreadCount) {
  cpu::ThreadPool pool(1);
  pool.setNumThreads(4);
  EXPECT_EQ(pool.numThreads(), 4);
  std::atomic<int> count{0};
  pool.parallelFor(100, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 100);
  pool.setNumThreads(0);  // hardware concurrency
  EXPECT_GE(pool.numThreads(), 1);
}

}  // namespace
}  // namespace tandem::kernels
