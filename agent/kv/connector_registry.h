// The KV connectors the agent can build, by name: the one place that knows
// every implementation (agent/kv/<name>/). The contract (connector.h) asks it
// which names exist when it parses a kv-transfer-config; the agent, a multi
// connector and tests build connectors through it. Adding a connector is a
// row here and a folder beside the others.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "agent/kv/connector.h"

namespace tandem::kv {

struct ConnectorKind {
  const char* name;     // kv_connector
  bool multi_member;    // may be a member of a multi connector
  bool needs_ucx_slab;  // its KV cache must be allocated by UCX
  std::unique_ptr<KvConnector> (*make)(const KvTransferConfig& config, engine::KvCache& cache,
                                       const std::string& model_identity);
  // The kv_connector_extra_config keys it reads, besides those every
  // connector's config has (connector.cpp): any other is refused at parse.
  std::span<const char* const> extra_keys;
};

// Every connector, in the order messages list them.
std::span<const ConnectorKind> connectorKinds();
// The connector named `name`, or nullptr.
const ConnectorKind* findConnectorKind(const std::string& name);
// "storage, ucx, offload, multi" (only those a multi connector may hold
// with `members_only`), for messages.
std::string connectorNames(bool members_only = false);

// Builds the configured connector over `cache`; throws tandem::Error naming
// the problem (unknown connector, bad extra config). model_identity is the
// engine's (what its block hashes are made from).
std::unique_ptr<KvConnector> makeConnector(const KvTransferConfig& config, engine::KvCache& cache,
                                           const std::string& model_identity);

// Whether the connector (or a member of a multi connector) needs its KV
// cache allocated by UCX.
bool needsUcxSlab(const KvTransferConfig& config);

}  // namespace tandem::kv
