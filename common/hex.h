// A 64-bit value as 16 lower-case hex digits, zero-padded: the form of the
// digests, hashes and random suffixes the project prints and stores.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

inline std::string hex64(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[i] = kDigits[value & 0xf];
  return text;
}

}  // namespace tandem
