// The model the router serves, learned from the first healthy agent's
// /v1/models: its served name, block size and hash scheme, and the tokenizer
// the router uses to compute a prompt's block hashes (common/block_hash.h)
// and to check requests the way an agent does (chat prompts rendered with
// the same ChatTemplate code and template choice as the agent's). Used by the router's own
// files only.
//
// Threads: learnFrom may run on several coroutines at once; the first to
// load a tokenizer wins and later calls change nothing. The accessors are
// valid only once ready() is true; what they return never changes after.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <atomic>
#include <boost/asio.hpp>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/block_hash.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "operator/router/router.h"

namespace tandem::router {

// What the router learns of the model from an agent's /v1/models.
struct ModelInfo {
  std::string served_name;
  std::string identity;
  int32_t block_size = 16;
  HashAlgorithm hash = HashAlgorithm::kXxh3_128;
  std::filesystem::path root;
  int64_t max_model_len = 0;
  // What the agents take for the fields a request leaves out.
  protocol::GenerationDefaults generation_defaults;
  // The LoRA adapters the agents serve (the /v1/models entries whose parent
  // is the model): each one's name and the identity its blocks are hashed
  // under (docs/lora.md).
  std::vector<std::pair<std::string, std::string>> lora_adapters;
};

class ServedModel {
 public:
  // `model_dir`: where the tokenizer is read; empty: the "root" the agent
  // reports. `chat_template_file`: the Jinja file the agents were given with
  // --chat-template (empty: the model's own), so that the router renders
  // chat prompts exactly as they do.
  explicit ServedModel(std::filesystem::path model_dir,
                       std::filesystem::path chat_template_file = {})
      : model_dir_(std::move(model_dir)), chat_template_file_(std::move(chat_template_file)) {}

  bool ready() const { return ready_; }
  // Why the model is not ready: the last failure to learn it ("" before any).
  std::string lastError() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_error_;
  }

  // Asks `agent` for the model and loads its tokenizer; a failure is logged
  // and leaves the model not ready (the next poll tries again).
  boost::asio::awaitable<void> learnFrom(AgentEndpoint agent);

  const ModelInfo& info() const { return info_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const BlockHasher& hasher() const { return *hasher_; }
  // The identity `adapter`'s blocks are hashed under (BlockHasher's
  // model_identity argument): empty for the base model (""), and for a name
  // the agents did not list.
  std::string_view adapterIdentity(const std::string& adapter) const {
    for (const auto& [name, identity] : info_.lora_adapters) {
      if (name == adapter) return identity;
    }
    return {};
  }
  const server::ServerLimits& limits() const { return limits_; }

 private:
  const std::filesystem::path model_dir_;
  const std::filesystem::path chat_template_file_;
  mutable std::mutex mutex_;
  std::atomic<bool> ready_{false};
  std::string last_error_;
  ModelInfo info_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<BlockHasher> hasher_;
  server::ServerLimits limits_;
};

}  // namespace tandem::router
