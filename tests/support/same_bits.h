// A gtest assertion that two buffers hold the same bytes, naming the first
// byte that differs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::testing {

inline ::testing::AssertionResult sameBits(const void* a, const void* b, size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return ::testing::AssertionSuccess();
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  size_t i = 0;
  while (x[i] == y[i]) ++i;
  return ::testing::AssertionFailure() << "byte " << i << " of " << bytes << " differs";
}

}  // namespace tandem::testing
