// The safetensors reader on malformed headers: whatever the header holds,
// loading either succeeds or throws tandem::Error naming the file and what is
// wrong (never a JSON library exception).
#include "agent/engine/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/support/test_files.h"

namespace tandem::engine {
namespace {

using ::tandem::testing::TempDir;

// A file of the 8-byte little-endian header length, `header`, and `data_size`
// zero bytes.
std::string fileWith(const std::string& header, size_t data_size) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(data_size, '\0');
}

// The tandem::Error message loading the file gives; any other exception
// escapes and fails the test.
std::string errorFor(const std::string& content) {
  TempDir dir("safetensors-test");
  const auto path = dir.write("model.safetensors", content);
  try {
    SafetensorsFile file(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loaded without an error";
  return "";
}

TEST(SafetensorsTest, NumberTooLargeForADoubleIsAnError) {
  const std::string message =
      errorFor(fileWith(R"({"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})", 4));
  EXPECT_NE(message.find("model.safetensors: header is not valid JSON (number overflow parsing "
                         "'1e400')"),
            std::string::npos)
      << message;
}

// A header longer than Hugging Face's bound is refused before it is parsed
// (its JSON would take some ten times its length in memory); one at the
// bound is parsed. The files are sparse: their zeros take no disk.
TEST(SafetensorsTest, AHeaderPastTheBoundIsRefusedUnparsed) {
  for (const uint64_t length : {uint64_t{100'000'000}, uint64_t{100'000'001}}) {
    TempDir dir("safetensors-test");
    std::string prefix;
    for (int i = 0; i < 8; ++i) prefix += static_cast<char>((length >> (8 * i)) & 0xff);
    const auto path = dir.write("model.safetensors", prefix);
    std::filesystem::resize_file(path, 8 + length);
    try {
      SafetensorsFile file(path);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      const std::string message = e.what();
      if (length > 100'000'000) {
        EXPECT_EQ(message, path.string() +
                               ": header length 100000001 is more than the 100000000 bytes a "
                               "safetensors header may have (Hugging Face's safetensors "
                               "refuses it too)");
      } else {
        EXPECT_NE(message.find("header is not valid JSON"), std::string::npos) << message;
      }
    }
  }
}

// A tensor of `count` elements of `dtype`, all `fill`, at one byte past an
// aligned start (a tensor's data need not be aligned), with `bits` at
// element `at`.
struct Poisoned {
  std::vector<uint8_t> storage;
  TensorInfo tensor;

  Poisoned(DType dtype, std::vector<int64_t> shape, uint64_t fill, size_t at, uint64_t bits) {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    const size_t size = dtypeSize(dtype);
    storage.assign(1 + count * size, 0);
    for (size_t i = 0; i < count; ++i) {
      const uint64_t value = i == at ? bits : fill;
      std::memcpy(storage.data() + 1 + i * size, &value, size);  // little-endian
    }
    tensor = {"w", dtype, std::move(shape), storage.data() + 1, count * size};
  }
};

TEST(SafetensorsTest, FirstNonFiniteFindsNanAndInfinityInEveryFloatDtype) {
  struct Case {
    DType dtype;
    uint64_t one, nan, plus_inf, minus_inf, largest;  // largest: finite, exponent below all ones
  };
  for (const Case& c : {
           Case{DType::kF32, 0x3f800000, 0x7fc00001, 0x7f800000, 0xff800000, 0x7f7fffff},
           Case{DType::kBF16, 0x3f80, 0xffc1, 0x7f80, 0xff80, 0x7f7f},
           Case{DType::kF16, 0x3c00, 0x7e00, 0x7c00, 0xfc00, 0x7bff},
           // E4M3: 0x7e is 448, its largest; 0x7f and 0xff its NaNs.
           Case{DType::kF8E4M3, 0x38, 0xff, 0x7f, 0x7f, 0x7e},
       }) {
    SCOPED_TRACE(dtypeSafetensorsName(c.dtype));
    // Past a 4,096-element chunk, and in its last element.
    for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{5000}, size_t{9999}}) {
      const Poisoned nan(c.dtype, {100, 100}, c.one, at, c.nan);
      const std::optional<NonFiniteElement> found = firstNonFinite(nan.tensor);
      ASSERT_TRUE(found.has_value()) << at;
      EXPECT_EQ(found->index, at);
      EXPECT_STREQ(found->kind, "NaN");
      EXPECT_EQ(elementPosition(nan.tensor.shape, found->index),
                shapeText({static_cast<int64_t>(at / 100), static_cast<int64_t>(at % 100)}));
    }
    if (c.dtype != DType::kF8E4M3) {
      const Poisoned plus(c.dtype, {3, 5}, c.one, 7, c.plus_inf);
      EXPECT_STREQ(firstNonFinite(plus.tensor).value().kind, "+inf");
      const Poisoned minus(c.dtype, {3, 5}, c.one, 7, c.minus_inf);
      EXPECT_STREQ(firstNonFinite(minus.tensor).value().kind, "-inf");
    }
    // The largest finite value is finite.
    const Poisoned largest(c.dtype, {64}, c.one, 3, c.largest);
    EXPECT_FALSE(firstNonFinite(largest.tensor).has_value());
  }
  // Whole chunks are asked several elements at a time: a NaN in any lane
  // of a word among the largest finite values (every exponent bit but one
  // set, in every neighbour) is found, and a chunk of them alone is finite.
  for (const Case& c : {
           Case{DType::kF32, 0, 0x7fc00001, 0, 0, 0x7f7fffff},
           Case{DType::kBF16, 0, 0xffc1, 0, 0, 0xff7f},
           Case{DType::kF16, 0, 0x7e00, 0, 0, 0xfbff},
           Case{DType::kF8E4M3, 0, 0xff, 0, 0, 0xfe},
       }) {
    SCOPED_TRACE(dtypeSafetensorsName(c.dtype));
    const Poisoned finite(c.dtype, {3, 4096}, c.largest, 0, c.largest);
    EXPECT_FALSE(firstNonFinite(finite.tensor).has_value());
    for (size_t at = 4096; at < 4096 + 8; ++at) {
      const Poisoned nan(c.dtype, {3, 4096}, c.largest, at, c.nan);
      EXPECT_EQ(firstNonFinite(nan.tensor).value().index, at);
    }
    const Poisoned last(c.dtype, {3, 4096}, c.largest, 2 * 4096 + 4095, c.nan);
    EXPECT_EQ(firstNonFinite(last.tensor).value().index, 2 * 4096 + 4095);
  }
  // U8 holds bytes whose meaning the tensor's use gives.
  const Poisoned bytes(DType::kU8, {16}, 0xff, 0, 0xff);
  EXPECT_FALSE(firstNonFinite(bytes.tensor).has_value());
}

TEST(SafetensorsTest, ElementPositionIsRowMajor) {
  EXPECT_EQ(elementPosition({2, 3, 4}, 0), "[0, 0, 0]");
  EXPECT_EQ(elementPosition({2, 3, 4}, 23), "[1, 2, 3]");
  EXPECT_EQ(elementPosition({2, 3, 4}, 13), "[1, 0, 1]");
  EXPECT_EQ(elementPosition({7}, 6), "[6]");
}

}  // namespace
}  // namespace tandem::engine
