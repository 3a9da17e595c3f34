// Prefill and decode agents joined by the ucx connector, for integration
// tests: configs, the two halves of the hand-off, and a fixture that runs
// each case over one UCX transport (UCX_TLS, inherited by the agents).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/agent_server.h"
#include "tests/support/test_files.h"

namespace tandem::testing {

// A --kv-transfer-config for the ucx connector; `extra` is merged into
// kv_connector_extra_config.
inline std::string ucxConfig(const std::string& role, json extra = json::object()) {
  if (!extra.contains("abort_timeout_s")) extra["abort_timeout_s"] = 120;
  return json{{"kv_connector", "ucx"}, {"kv_role", role}, {"kv_connector_extra_config", extra}}
      .dump();
}

// A tiny-model agent with `kv_config` listening on every address (0.0.0.0),
// with `extra` flags; its stderr goes under `logs`. For the start-up checks
// of a KV connector reachable from other hosts.
inline std::unique_ptr<ChildProcess> startOnAllAddresses(const std::filesystem::path& logs,
                                                         const std::string& kv_config,
                                                         const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-agent",
                                   "serve",
                                   "--model",
                                   tinyModelDir().string(),
                                   "--port",
                                   "0",
                                   "--host",
                                   "0.0.0.0",
                                   "--kv-transfer-config",
                                   kv_config};
  argv.insert(argv.end(), extra.begin(), extra.end());
  sizeTinyAgentKv(argv, extra, tinyModelDir());
  return std::make_unique<ChildProcess>(argv, logs / "stderr");
}

// ucx for the hand-off (with `ucx_extra` as its kv_connector_extra_config)
// plus a storage member that writes every computed or loaded full block to
// `dir`: a window on the agent's KV bytes.
inline std::string ucxWithBlockFiles(const std::string& role, const std::filesystem::path& dir,
                                     json ucx_extra = json::object()) {
  return json{
      {"kv_connector", "multi"},
      {"kv_role", "kv_both"},
      {"kv_connector_extra_config",
       {{"connectors",
         {{{"kv_connector", "ucx"}, {"kv_role", role}, {"kv_connector_extra_config", ucx_extra}},
          {{"kv_connector", "storage"},
           {"kv_role", "kv_producer"},
           {"kv_connector_extra_config", {{"shared_storage_path", dir.string()}}}}}}}}}
      .dump();
}

// Block files (relative path → bytes) under a storage directory.
inline std::map<std::string, std::string> blockFiles(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".kvblock") {
      files[std::filesystem::relative(entry.path(), dir).string()] = readFile(entry.path());
    }
  }
  return files;
}

// The prefill half: one token computed, the KV held; the descriptor.
inline json prefillOn(const Agent& agent, const std::vector<int>& prompt) {
  json body = greedy(prompt, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  json response = agent.post("/v1/completions", body);
  return response["kv_transfer_params"];
}

// The decode half with `params` from the prefill half; `status` gets the
// HTTP status when given.
inline json decodeOn(const Agent& agent, const std::vector<int>& prompt, json params,
                     int max_tokens = 8, int* status = nullptr) {
  json body = greedy(prompt, max_tokens);
  params["do_remote_prefill"] = true;
  body["kv_transfer_params"] = params;
  return agent.post("/v1/completions", body, status);
}

// Frees what a prefill agent holds for a transfer that will not happen.
inline json releaseOn(const Agent& agent, const json& params, int* status = nullptr) {
  return agent.post("/v1/kv_transfer/release", {{"kv_transfer_params", params}}, status);
}

// Runs each case over the transport named by the parameter.
class UcxTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", GetParam().c_str(), 1); }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
};

}  // namespace tandem::testing
