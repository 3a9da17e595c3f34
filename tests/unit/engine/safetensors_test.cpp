// The safetensors reader on malformed headers: whatever the header holds,
// loading either succeeds or throws tandem::Error naming the file and what is
// wrong (never a JSON library exception).
#include "agent/engine/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

}  // namespace
}  // namespace tandem::engine
