#include "kernels/cuda/weight_layout.h"

#include <cstring>
#include <string>

#include "common/status.h"

namespace tandem::kernels::cuda {
namespace {

GemvTiling checkedTiling(int64_t n, int64_t k, int64_t element_bytes) {
  if (element_bytes != 2 && element_bytes != 4) {
    throw Error("GEMV weight layout: elements must be 2 or 4 bytes, got " +
                std::to_string(element_bytes));
  }
  if (n <= 0 || k <= 0) {
    throw Error("GEMV weight layout: shape must be positive, got " + std::to_string(n) + " x " +
                std::to_string(k));
  }
  return GemvTiling{n, k, element_bytes};
}

// Calls copy(offset in the re-laid matrix, row-major offset, elements) for
// every run of real elements: one (tile, step, lane) vector, cut at k.
template <typename Copy>
void forEachVector(const GemvTiling& t, Copy&& copy) {
  const int64_t vector = t.vector();
  for (int64_t tile = 0; tile < t.tiles(); ++tile) {
    const int64_t length = t.chunkLength(t.tileChunk(tile));
    for (int64_t step = 0; step * vector < length; ++step) {
      const int64_t count = length - step * vector < vector ? length - step * vector : vector;
      for (int64_t lane = 0; lane < kGemvTileCols; ++lane) {
        const int64_t column = t.column(tile, lane);
        if (column >= t.n) break;
        copy(t.offset(tile, step, lane, 0), column * t.k + t.kOf(tile, step, 0), count);
      }
    }
  }
}

MmaFragmentTiling checkedMmaTiling(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) {
    throw Error("mma weight layout: shape must be positive, got " + std::to_string(n) + " x " +
                std::to_string(k));
  }
  return MmaFragmentTiling{n, k};
}

// Calls copy(offset in the re-laid matrix, row-major offset) for every real
// element.
template <typename Copy>
void forEachMmaElement(const MmaFragmentTiling& t, Copy&& copy) {
  for (int64_t tile = 0; tile < t.tileColumns(); ++tile) {
    for (int64_t p = 0; p < t.pairs(); ++p) {
      for (int64_t lane = 0; lane < 32; ++lane) {
        const int64_t column = MmaFragmentTiling::column(tile, lane);
        if (column >= t.n) continue;
        for (int64_t e = 0; e < 8; ++e) {
          const int64_t kk = MmaFragmentTiling::kOf(p, lane, e);
          if (kk < t.k) copy(t.offset(tile, p, lane, e), column * t.k + kk);
        }
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> relayoutForMma(const void* src, int64_t n, int64_t k) {
  const MmaFragmentTiling t = checkedMmaTiling(n, k);
  std::vector<uint8_t> out(static_cast<size_t>(t.bytes()), 0);  // padding stays zero
  const auto* from = static_cast<const uint16_t*>(src);
  auto* to = reinterpret_cast<uint16_t*>(out.data());
  forEachMmaElement(t, [&](int64_t relaid, int64_t rows) { to[relaid] = from[rows]; });
  return out;
}

void restoreFromMma(const void* relaid, size_t bytes, int64_t n, int64_t k, void* dst) {
  const MmaFragmentTiling t = checkedMmaTiling(n, k);
  if (static_cast<int64_t>(bytes) != t.bytes()) {
    throw Error("mma weight layout: " + std::to_string(bytes) + " bytes do not hold a re-laid " +
                std::to_string(n) + " x " + std::to_string(k) + " matrix (" +
                std::to_string(t.bytes()) + " bytes)");
  }
  const auto* from = static_cast<const uint16_t*>(relaid);
  auto* to = static_cast<uint16_t*>(dst);
  forEachMmaElement(t, [&](int64_t relaid_at, int64_t rows) { to[rows] = from[relaid_at]; });
}

std::vector<uint8_t> relayoutForGemv(const void* src, int64_t n, int64_t k, int64_t element_bytes) {
  const GemvTiling t = checkedTiling(n, k, element_bytes);
  std::vector<uint8_t> out(static_cast<size_t>(t.bytes()), 0);  // padding stays zero
  const auto* from = static_cast<const uint8_t*>(src);
  forEachVector(t, [&](int64_t relaid, int64_t rows, int64_t count) {
    std::memcpy(out.data() + relaid * element_bytes, from + rows * element_bytes,
                static_cast<size_t>(count * element_bytes));
  });
  return out;
}

void restoreFromGemv(const void* relaid, size_t bytes, int64_t n, int64_t k, int64_t element_bytes,
                     void* dst) {
  const GemvTiling t = checkedTiling(n, k, element_bytes);
  if (static_cast<int64_t>(bytes) != t.bytes()) {
    throw Error("GEMV weight layout: " + std::to_string(bytes) + " bytes do not hold a re-laid " +
                std::to_string(n) + " x " + std::to_string(k) + " matrix (" +
                std::to_string(t.bytes()) + " bytes)");
  }
  const auto* from = static_cast<const uint8_t*>(relaid);
  auto* to = static_cast<uint8_t*>(dst);
  forEachVector(t, [&](int64_t relaid_at, int64_t rows, int64_t count) {
    std::memcpy(to + rows * element_bytes, from + relaid_at * element_bytes,
                static_cast<size_t>(count * element_bytes));
  });
}

}  // namespace tandem::kernels::cuda
