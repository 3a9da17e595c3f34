// Fuzzes --kv-transfer-config: KvTransferConfig::parse returns a config or an
// error status and never throws. An accepted config names a known connector,
// and a multi connector's members are all accepted, non-multi connectors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent/kv/connector.h"
#include "agent/kv/connector_registry.h"

namespace {

bool isKnownConnector(const std::string& name) {
  return name == "storage" || name == "ucx" || name == "offload" || name == "multi";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto config = tandem::kv::KvTransferConfig::parse(text);
  if (!config.isOk()) {
    if (config.status().message().empty()) std::abort();
    return 0;
  }
  if (!isKnownConnector(config->connector)) std::abort();
  if (!config->extra.is_object()) std::abort();
  if (config->connector != "multi" && !config->members.empty()) std::abort();
  for (const tandem::kv::KvTransferConfig& member : config->members) {
    if (!isKnownConnector(member.connector) || member.connector == "multi") std::abort();
  }
  tandem::kv::needsUcxSlab(*config);
  return 0;
}
