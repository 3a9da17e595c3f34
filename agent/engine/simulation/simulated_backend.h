// The compute backend of a simulated agent: the CPU backend (host memory for
// the KV slab, block copies for connectors), described as simulated with the
// step profile's name, so /health's device_description and the metric
// tandem_device_info{description} say that no forward pass is computed.
// Thread-safety as CpuBackend.
#pragma once

#include <string>

#include "kernels/cpu/cpu_backend.h"

namespace tandem::engine {

class SimulatedBackend : public kernels::cpu::CpuBackend {
 public:
  explicit SimulatedBackend(std::string profile_name) : profile_name_(std::move(profile_name)) {}
  // "simulated (profile NAME; KV blocks in cpu memory)".
  std::string description() const override;

 private:
  std::string profile_name_;
};

}  // namespace tandem::engine
