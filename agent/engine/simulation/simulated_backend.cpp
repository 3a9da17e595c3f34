#include "agent/engine/simulation/simulated_backend.h"

namespace tandem::engine {

std::string SimulatedBackend::description() const {
  return "simulated (profile " + profile_name_ + "; KV blocks in cpu memory)";
}

}  // namespace tandem::engine
