#include "operator/spec/agent_command.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tandem::spec {
namespace {

std::string numberText(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

namespace {

std::string secretOf(const nlohmann::json& extra) {
  if (!extra.is_object()) return "";
  auto it = extra.find("secret");
  return it != extra.end() && it->is_string() ? it->get<std::string>() : "";
}

// extraConfig.secret, else the first multi connector member's; "" if none.
std::string inlineKvSecret(const PoolSpec& pool) {
  const nlohmann::json& extra = pool.kv_transfer.extra_config;
  if (std::string secret = secretOf(extra); !secret.empty()) return secret;
  if (auto members = extra.find("connectors"); members != extra.end() && members->is_array()) {
    for (const nlohmann::json& member : *members) {
      if (!member.is_object()) continue;
      auto member_extra = member.find("kv_connector_extra_config");
      if (member_extra == member.end()) continue;
      if (std::string secret = secretOf(*member_extra); !secret.empty()) return secret;
    }
  }
  return "";
}

}  // namespace

int64_t agentStopGraceSeconds(const PoolSpec& pool) {
  return static_cast<int64_t>(std::ceil(pool.engine.shutdown_timeout_s.value_or(30.0))) + 15;
}

std::string kvTransferConfigJson(const PoolSpec& pool) {
  const KvTransferSpec& transfer = pool.kv_transfer;
  nlohmann::json config = {{"kv_connector", transfer.connector}, {"kv_role", transfer.role}};
  if (!transfer.extra_config.empty()) {
    nlohmann::json extra = transfer.extra_config;
    // A secret agentEnvironment passes leaves the command line; any other
    // value stays, for the agent to refuse naming it.
    const auto drop_secret = [](nlohmann::json& config) {
      if (config.is_object() && !secretOf(config).empty()) config.erase("secret");
    };
    drop_secret(extra);
    if (auto members = extra.find("connectors"); members != extra.end() && members->is_array()) {
      for (nlohmann::json& member : *members) {
        if (member.is_object() && member.contains("kv_connector_extra_config")) {
          drop_secret(member["kv_connector_extra_config"]);
        }
      }
    }
    config["kv_connector_extra_config"] = std::move(extra);
  }
  return config.dump();
}

std::vector<std::pair<std::string, std::string>> agentEnvironment(const PoolSpec& pool) {
  std::vector<std::pair<std::string, std::string>> env = pool.env;
  const std::string secret = inlineKvSecret(pool);
  if (secret.empty()) return env;
  std::erase_if(env, [](const auto& entry) { return entry.first == "TANDEM_KV_SECRET"; });
  env.emplace_back("TANDEM_KV_SECRET", secret);
  return env;
}

std::string poolKvSecret(const PoolSpec& pool) {
  if (std::string secret = inlineKvSecret(pool); !secret.empty()) return secret;
  for (const auto& [name, value] : pool.env) {
    if (name == "TANDEM_KV_SECRET") return value;
  }
  const char* inherited = std::getenv("TANDEM_KV_SECRET");
  return inherited != nullptr ? inherited : "";
}

std::vector<std::string> agentArguments(const PoolSpec& pool,
                                        const std::filesystem::path& agent_binary,
                                        const std::string& host, int port, bool insecure_kv) {
  const EngineSpec& engine = pool.engine;
  std::vector<std::string> argv = {agent_binary.string()};
  // --threads belongs to the program, before the subcommand.
  if (engine.threads) argv.insert(argv.end(), {"--threads", std::to_string(*engine.threads)});
  argv.insert(argv.end(),
              {"serve", "--model", pool.model_path, "--served-model-name", pool.served_model_name,
               "--host", host, "--port", std::to_string(port), "--role", poolRole(pool.kind)});
  auto add = [&](const char* flag, const std::string& value) {
    argv.push_back(flag);
    argv.push_back(value);
  };
  if (engine.block_size) add("--block-size", std::to_string(*engine.block_size));
  if (engine.num_blocks) add("--num-blocks", std::to_string(*engine.num_blocks));
  if (engine.kv_cache_memory) add("--kv-cache-memory", *engine.kv_cache_memory);
  if (engine.kv_dtype) add("--kv-dtype", *engine.kv_dtype);
  if (engine.compute_dtype) add("--compute-dtype", *engine.compute_dtype);
  if (engine.device) add("--device", *engine.device);
  if (engine.simulate) add("--simulate", *engine.simulate);
  if (engine.max_num_seqs) add("--max-num-seqs", std::to_string(*engine.max_num_seqs));
  if (engine.scheduling_policy) add("--scheduling-policy", *engine.scheduling_policy);
  if (engine.max_num_batched_tokens) {
    add("--max-num-batched-tokens", std::to_string(*engine.max_num_batched_tokens));
  }
  if (engine.max_model_len) add("--max-model-len", std::to_string(*engine.max_model_len));
  if (engine.max_waiting_requests) {
    add("--max-waiting-requests", std::to_string(*engine.max_waiting_requests));
  }
  if (engine.prefix_caching_hash) add("--prefix-caching-hash", *engine.prefix_caching_hash);
  if (engine.shutdown_timeout_s) add("--shutdown-timeout", numberText(*engine.shutdown_timeout_s));
  add("--kv-transfer-config", kvTransferConfigJson(pool));
  const auto& extra = pool.extra_args;
  if (insecure_kv && std::find(extra.begin(), extra.end(), "--insecure-kv") == extra.end()) {
    argv.push_back("--insecure-kv");
  }
  argv.insert(argv.end(), pool.extra_args.begin(), pool.extra_args.end());
  return argv;
}

}  // namespace tandem::spec
