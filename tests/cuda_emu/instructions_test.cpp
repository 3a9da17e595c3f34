// The instructions the fast kernels are built on (kernels/cuda/ptx.h) and
// the way CUDA threads meet, probed with known inputs. Built twice: against
// the GPU (gpu_instructions_test, label gpu: what the hardware does) and
// against the CUDA emulator (emu_instructions_test, in `make test`: that
// the emulator does the same), so the emulator's model of each instruction
// is checked on the hardware whenever the gpu suite runs. The emulator-only
// tests check that it shows what a GPU would hide or break on: a race, a
// divergent warp.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "common/dtype.h"
#include "tests/cuda_emu/instruction_kernels.h"

namespace tandem::cuda_probe {
namespace {

class InstructionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (deviceCount() == 0) GTEST_SKIP() << "no CUDA device visible: instruction probes not run";
  }
};

// Operands of small integers (and halves in c): every product and sum is
// exact in fp32, so the tensor cores' result has one right answer, whatever
// order they add in. a and b also as bf16 bits.
struct ExactOperands {
  ExactOperands(size_t a_count, size_t b_count, size_t c_count, unsigned seed)
      : a(a_count), b(b_count), c(c_count), a_bits(a_count), b_bits(b_count) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-8, 8);
    for (float& x : a) x = static_cast<float>(small(rng));
    for (float& x : b) x = static_cast<float>(small(rng));
    for (float& x : c) x = static_cast<float>(small(rng)) * 0.5f;
    for (size_t i = 0; i < a.size(); ++i) a_bits[i] = f32ToBf16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b_bits[i] = f32ToBf16(b[i]);
  }
  std::vector<float> a, b, c;
  std::vector<uint16_t> a_bits, b_bits;
};

TEST_F(InstructionsTest, MmaComputesTheMatrixProductInPtxFragmentLayout) {
  const ExactOperands o(16 * 16, 16 * 8, 16 * 8, 7);
  const std::vector<float>&a = o.a, &b = o.b, &c = o.c;
  const std::vector<float> d = mma(o.a_bits, o.b_bits, c);
  ASSERT_EQ(d.size(), 16u * 8u);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float expected = c[i * 8 + j];
      for (int k = 0; k < 16; ++k) expected += a[i * 16 + k] * b[k * 8 + j];
      EXPECT_EQ(expected, d[i * 8 + j]) << "row " << i << ", column " << j;
    }
  }
}

// wgmma m64n128k16 (sm_90a): the descriptors' leading and stride offsets,
// the core-matrix layout and the accumulator's register layout as
// kernels/cuda/wgmma.h describes them, with exact small integers again.
TEST_F(InstructionsTest, WarpgroupMmaReadsCoreMatricesAndFillsTheDocumentedRegisters) {
  if (!wgmmaAvailable()) {
    GTEST_SKIP() << "wgmma needs compute capability 9.0 and a build for sm_90a";
  }
  const ExactOperands o(64 * 16, 128 * 16, 64 * 128, 8);
  const std::vector<float>&a = o.a, &b = o.b, &c = o.c;
  const std::vector<float> d = warpgroupMma(o.a_bits, o.b_bits, c);
  ASSERT_EQ(d.size(), 64u * 128u);
  int wrong = 0;
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 128; ++j) {
      float expected = c[i * 128 + j];
      for (int k = 0; k < 16; ++k) expected += a[i * 16 + k] * b[j * 16 + k];
      if (expected != d[i * 128 + j] && ++wrong <= 8) {
        ADD_FAILURE() << "row " << i << ", column " << j << ": " << d[i * 128 + j] << ", expected "
                      << expected;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "outputs differ";
}

// Lane l's register i holds two elements of matrix i (rows 8i..8i + 7 of
// the tile), the first in the low half: as stored, row l / 4 at columns
// 2 (l % 4) and the next; transposed (.trans), column l / 4 of rows
// 2 (l % 4) and the next.
TEST_F(InstructionsTest, LoadMatricesGivesEachLaneItsPairAsStoredOrTransposed) {
  std::vector<uint16_t> tile(32 * 8);
  for (size_t i = 0; i < tile.size(); ++i) tile[i] = static_cast<uint16_t>(i * 3 + 1);
  for (const bool transposed : {false, true}) {
    const std::vector<uint32_t> words = loadMatrices(tile, transposed);
    ASSERT_EQ(words.size(), 128u);
    for (int lane = 0; lane < 32; ++lane) {
      for (int m = 0; m < 4; ++m) {
        auto element = [&](int row, int column) {
          return static_cast<uint32_t>(tile[(8 * m + row) * 8 + column]);
        };
        const int pair = 2 * (lane % 4), other = lane / 4;
        const uint32_t expected = transposed
                                      ? element(pair, other) | (element(pair + 1, other) << 16)
                                      : element(other, pair) | (element(other, pair + 1) << 16);
        EXPECT_EQ(expected, words[lane * 4 + m])
            << (transposed ? "transposed, " : "") << "lane " << lane << ", matrix " << m;
      }
    }
  }
}

// Tensor copies (sm_90, kernels/cuda/tma.h): two 16 x 64 boxes of a 20 x 136
// bf16 matrix from row 8, columns 64 and 128, on one barrier's two phases.
// Rows 20 on and columns 136 on are outside: zeros. Each box row's 16-byte
// chunk c lands at chunk c ^ row % 8 (the 128-byte swizzle from a
// 1024-byte aligned box), the layout wgmma's swizzled descriptors read.
TEST_F(InstructionsTest, TensorCopyLandsSwizzledBoxesWithZerosOutside) {
  if (!wgmmaAvailable()) {
    GTEST_SKIP() << "tensor copies need compute capability 9.0 and a build for sm_90";
  }
  const int64_t rows = 20, k = 136;
  std::vector<uint16_t> matrix(static_cast<size_t>(rows * k));
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<uint16_t>(i + 1);
  const std::vector<uint8_t> out = tensorCopy(matrix, rows, k, 64, 8);
  ASSERT_EQ(out.size(), 4096u);
  int64_t wrong = 0;
  for (int box = 0; box < 2; ++box) {
    for (int r = 0; r < 16; ++r) {
      for (int e = 0; e < 64; ++e) {
        const int64_t row = 8 + r, column = 64 + 64 * box + e;
        const uint16_t expected =
            row < rows && column < k ? matrix[static_cast<size_t>(row * k + column)] : 0;
        const size_t at =
            static_cast<size_t>(box * 2048 + r * 128 + (e / 8 ^ r % 8) * 16 + e % 8 * 2);
        uint16_t landed;
        std::memcpy(&landed, out.data() + at, 2);
        if (landed != expected && ++wrong <= 8) {
          ADD_FAILURE() << "box " << box << ", row " << r << ", element " << e << ": " << landed
                        << " at byte " << at << ", expected " << expected;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_F(InstructionsTest, ShuffleXorExchangesLanes) {
  for (int mask : {1, 2, 16, 31}) {
    const std::vector<int> out = shuffleXor(mask);
    ASSERT_EQ(out.size(), 32u);
    for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(lane ^ mask, out[lane]) << "mask " << mask;
  }
}

TEST_F(InstructionsTest, CopyAsyncLandsOrZeroFillsEachVector) {
  std::vector<uint8_t> bytes(48 * 16), valid(48);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t v = 0; v < valid.size(); ++v) valid[v] = v % 3 != 1;
  const std::vector<uint8_t> out = copyThroughShared(bytes, valid);
  ASSERT_EQ(out.size(), 64u * 16u);
  for (size_t v = 0; v < 64; ++v) {
    for (size_t i = 0; i < 16; ++i) {
      const uint8_t expected = v >= valid.size() ? 0xab : valid[v] ? bytes[v * 16 + i] : 0;
      EXPECT_EQ(expected, out[v * 16 + i]) << "vector " << v << ", byte " << i;
    }
  }
}

TEST_F(InstructionsTest, TooMuchDynamicSharedMemoryIsRefusedAtLaunch) {
  EXPECT_EQ(0, launchErrorForSharedBytes(1024));
  EXPECT_NE(0, launchErrorForSharedBytes(100 * 1024)) << "above 48 KiB without the opt-in";
}

// A GPU refuses an allocation in the middle of a (global mode) stream
// capture and fails the capture; the emulator does the same, so a recorded
// step that allocates fails here as it would there.
TEST_F(InstructionsTest, AllocatingDuringAStreamCaptureFailsTheCapture) {
  const std::vector<int> errors = mallocDuringCapture();
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(0, errors[0]) << "cudaMalloc during capture";
  EXPECT_NE(0, errors[1]) << "cudaStreamEndCapture after it";
}

#if defined(TANDEM_CUDA_EMULATOR)

// Two warps with no barrier between a write and a read, only warp-wide
// instructions: one of the two turn orders runs the reading warp first.
TEST_F(InstructionsTest, EmulatorShowsARaceBetweenWarps) {
  const std::vector<int> out = crossWarpWithoutBarrier();
  int stale = 0;
  for (int block = 0; block < 2; ++block) {
    for (int t = 0; t < 32; ++t) stale += out[block * 32 + t] != 1000 * block + t;
  }
  EXPECT_GT(stale, 0) << "the race between warps went unseen";
}

// Shared memory holds no earlier block's values: every block reads all
// ones before its threads write.
TEST_F(InstructionsTest, EmulatorFillsStaticSharedMemoryForEachBlock) {
  const std::vector<uint32_t> out = sharedBeforeWrite();
  ASSERT_EQ(out.size(), 96u);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(0xffffffffu, out[i]) << "read " << i;
}

// A read of another thread's shared-memory write that no barrier orders: in
// one of the two blocks (threads in ascending, then descending order) a
// thread reads its neighbour's slot before the neighbour has written it.
TEST_F(InstructionsTest, EmulatorShowsAMissingBarrier) {
  const int threads = 64;
  const std::vector<int> out = neighbourWithoutBarrier(threads);
  int stale = 0;
  for (int block = 0; block < 2; ++block) {
    for (int t = 0; t + 1 < threads; ++t) {
      if (out[block * threads + t] != 1000 * block + t + 1) ++stale;
    }
  }
  EXPECT_GT(stale, 0) << "the race went unseen";
}

TEST_F(InstructionsTest, EmulatorStopsAtADivergentWarp) {
  EXPECT_DEATH(divergentWarp(), "diverged");
}

#endif

}  // namespace
}  // namespace tandem::cuda_probe
