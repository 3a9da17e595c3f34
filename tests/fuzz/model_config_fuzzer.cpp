// Fuzzes config.json: ModelConfig::fromJsonText either returns a configuration
// or throws tandem::Error (any other exception or a sanitizer report is a
// finding). An accepted configuration must survive toJsonText() and back
// unchanged, and its rotary frequencies must be finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "agent/engine/model_config.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::engine::ModelConfig;
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelConfig config;
  try {
    config = ModelConfig::fromJsonText(text, "config.json");
  } catch (const tandem::Error&) {
    return 0;
  }
  // What tandem-model writes must read back as the same configuration.
  const ModelConfig again = ModelConfig::fromJsonText(config.toJsonText(), "round trip");
  if (!(again == config)) std::abort();
  for (float frequency : tandem::engine::ropeInverseFrequencies(config)) {
    if (!std::isfinite(frequency)) std::abort();
  }
  return 0;
}
