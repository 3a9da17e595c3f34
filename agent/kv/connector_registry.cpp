#include "agent/kv/connector_registry.h"

#include "agent/kv/multi/multi_connector.h"
#include "agent/kv/offload/offload_connector.h"
#include "agent/kv/storage/storage_connector.h"
#include "agent/kv/ucx/ucx_connector.h"

namespace tandem::kv {
namespace {

std::unique_ptr<KvConnector> makeStorage(const KvTransferConfig& config, engine::KvCache& cache,
                                         const std::string&) {
  return std::make_unique<StorageConnector>(config, cache);
}

std::unique_ptr<KvConnector> makeUcx(const KvTransferConfig& config, engine::KvCache& cache,
                                     const std::string& model_identity) {
  return std::make_unique<UcxConnector>(config, cache, model_identity);
}

std::unique_ptr<KvConnector> makeOffload(const KvTransferConfig& config, engine::KvCache& cache,
                                         const std::string&) {
  return std::make_unique<OffloadConnector>(config, cache);
}

std::unique_ptr<KvConnector> makeMulti(const KvTransferConfig& config, engine::KvCache& cache,
                                       const std::string& model_identity) {
  return MultiConnector::create(config, cache, model_identity);
}

constexpr const char* kStorageKeys[] = {"shared_storage_path", "capacity_blocks", "capacity_bytes"};
constexpr const char* kUcxKeys[] = {
    "read_timeout_s", "peer_idle_timeout_s", "advertise_host", "remote_pull_threshold",
    "kv_buffer",      "staging_blocks",      "hold_slots"};
constexpr const char* kOffloadKeys[] = {"capacity_blocks", "capacity_bytes"};
constexpr const char* kMultiKeys[] = {"connectors"};

const ConnectorKind kConnectorKinds[] = {
    {"storage", /*multi_member=*/true, /*needs_ucx_slab=*/false, makeStorage, kStorageKeys},
    {"ucx", true, true, makeUcx, kUcxKeys},
    {"offload", true, false, makeOffload, kOffloadKeys},
    {"multi", false, false, makeMulti, kMultiKeys},
};

}  // namespace

std::span<const ConnectorKind> connectorKinds() { return kConnectorKinds; }

const ConnectorKind* findConnectorKind(const std::string& name) {
  for (const ConnectorKind& kind : kConnectorKinds) {
    if (name == kind.name) return &kind;
  }
  return nullptr;
}

std::string connectorNames(bool members_only) {
  std::string names;
  for (const ConnectorKind& kind : kConnectorKinds) {
    if (members_only && !kind.multi_member) continue;
    if (!names.empty()) names += ", ";
    names += kind.name;
  }
  return names;
}

std::unique_ptr<KvConnector> makeConnector(const KvTransferConfig& config, engine::KvCache& cache,
                                           const std::string& model_identity) {
  const ConnectorKind* kind = findConnectorKind(config.connector);
  if (kind == nullptr) {
    throw Error("kv_connector \"" + config.connector +
                "\" is not supported (accepted: " + connectorNames() + ")");
  }
  return kind->make(config, cache, model_identity);
}

bool needsUcxSlab(const KvTransferConfig& config) {
  const ConnectorKind* kind = findConnectorKind(config.connector);
  if (kind != nullptr && kind->needs_ucx_slab) return true;
  for (const KvTransferConfig& member : config.members) {
    if (needsUcxSlab(member)) return true;
  }
  return false;
}

}  // namespace tandem::kv
