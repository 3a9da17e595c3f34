// The seeded byte pattern transport tests fill remote blocks with, so that a
// reader can check every byte it pulled without a second copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::testing {

inline uint64_t splitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Writes block `block`'s pattern (block_bytes, a multiple of 8) to `out`.
inline void fillBlockPattern(uint64_t seed, int64_t block, size_t block_bytes, uint8_t* out) {
  const uint64_t stream = splitMix64(seed) ^ splitMix64(static_cast<uint64_t>(block) + 1);
  for (size_t word = 0; word < block_bytes / 8; ++word) {
    uint64_t value = splitMix64(stream + word);
    std::memcpy(out + word * 8, &value, 8);
  }
}

}  // namespace tandem::testing
