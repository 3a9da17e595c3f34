// Small test helpers with no dependencies: seeded random token ids, deeply
// nested JSON text, and waiting for a condition with a deadline (tests never
// sleep a fixed time).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testing {

// n ids drawn uniformly from [low, high], the same for the same seed.
inline std::vector<int32_t> randomTokenIds(size_t n, uint32_t seed, int32_t low, int32_t high) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(low, high);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

// JSON text of `depth` objects nested as {"a":{"a":...1...}}.
inline std::string nestedJsonObject(int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += R"({"a":)";
  text += "1";
  text.append(static_cast<size_t>(depth), '}');
  return text;
}

// Polls `condition` until it holds or the timeout passes; its last answer.
template <typename Fn>
bool eventually(Fn&& condition, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(poll);
  }
  return condition();
}

}  // namespace tandem::testing
