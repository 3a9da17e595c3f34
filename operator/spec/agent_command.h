// The `tandem-agent serve` command line of one replica of a pool: how the
// PrefillPool/DecodePool spec's camelCase fields map to the agent's flags
// (the table is in docs/local-mode.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "operator/spec/cluster_spec.h"

namespace tandem::spec {

// argv for one agent of `pool` listening on host:port (0: a free port, which
// the agent prints as "listening on HOST:PORT"). Only the engine fields the
// spec sets are passed; the agent's defaults hold for the rest. `insecure_kv`
// adds --insecure-kv before spec.extraArgs (unless they hold it already): a
// KV producer on a non-loopback host without a shared secret (Kubernetes
// without kvTransfer.secretRef) is refused by the agent otherwise.
std::vector<std::string> agentArguments(const PoolSpec& pool,
                                        const std::filesystem::path& agent_binary,
                                        const std::string& host, int port,
                                        bool insecure_kv = false);

// Seconds an agent of `pool` stopped on purpose (a rollout, a scale-down)
// gets between SIGTERM and SIGKILL: its shutdown timeout (tandem-agent's
// default, 30 s, unless the spec sets one) to finish or hand over its
// requests, plus 15 s to exit. Kubernetes gets it as the pods'
// terminationGracePeriodSeconds; local mode waits as long.
int64_t agentStopGraceSeconds(const PoolSpec& pool);

// The pool's --kv-transfer-config: vLLM's shape, {"kv_connector", "kv_role",
// "kv_connector_extra_config"}, without any "secret" (a command line is
// logged and shown by ps): agentEnvironment passes it instead.
std::string kvTransferConfigJson(const PoolSpec& pool);

// The environment of the pool's agents: spec.env, and TANDEM_KV_SECRET set
// to kvTransfer.extraConfig.secret (or a multi connector member's) when one
// is written there.
std::vector<std::pair<std::string, std::string>> agentEnvironment(const PoolSpec& pool);

// The shared KV secret the pool's agents use, found the way they find it:
// kvTransfer.extraConfig.secret (or a multi connector member's), else
// TANDEM_KV_SECRET from spec.env, else from this process's environment
// (which the agents inherit); empty when none. Local mode gives it to the
// router, which signs its pull-back holds with it.
std::string poolKvSecret(const PoolSpec& pool);

}  // namespace tandem::spec
