// The model the router serves, learned from a healthy agent's /v1/models:
// its served name, block size and hash scheme, and the tokenizer the router
// uses to compute a prompt's block hashes (common/block_hash.h) and to check
// requests the way an agent does (chat prompts rendered with the same
// ChatTemplate code and template choice as the agent's). Used by the
// router's own files only.
//
// The model is learned from the first healthy agent, and learned again when
// the decode agents move to another model (a rollout that changes the model
// or its identity): a request keeps the ModelView it began with, so a
// change never alters a request under way.
//
// Threads: learnFrom may run on several coroutines at once; the first to
// load a model wins, later calls change nothing unless they replace it with
// another identity's.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
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
};

// A LoRA adapter an agent serves: its name and the identity its blocks are
// hashed under (docs/lora.md).
struct AdapterInfo {
  std::string name;
  std::string identity;
  bool operator==(const AdapterInfo&) const = default;
};
// The adapters an agent's /v1/models answer lists (the entries after the
// first whose parent is the first's id); an entry without a string
// tandem.model_identity is left out (its prompts could not be hashed as
// the agent does). Throws on an answer not shaped as an agent's.
std::vector<AdapterInfo> adaptersOf(const nlohmann::json& models_answer);
// The model identity of an agent's /v1/models answer (its first entry's
// tandem.model_identity); "" when it gives none. Throws on an answer not
// shaped as an agent's.
std::string modelIdentityOf(const nlohmann::json& models_answer);
// A count an agent gives in its /v1/models answer (its first entry's
// tandem.<key>: kv_cache_tokens, max_waiting_requests); 0 when it gives
// none or not a positive integer. Throws on an answer not shaped as an
// agent's.
int64_t agentCountOf(const nlohmann::json& models_answer, const char* key);
// Whether two agents' model identities may meet in one request (a prefill
// agent's KV read by a decode agent, a stream resumed on another): equal,
// or one not known ("").
inline bool sameModel(const std::string& a, const std::string& b) {
  return a.empty() || b.empty() || a == b;
}

// One learned model: what a request is parsed, checked and hashed with.
struct ModelView {
  ModelInfo info;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<BlockHasher> hasher;
  server::ServerLimits limits;
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
  // Why the model is not ready, or why another could not replace it: the
  // last failure to learn one ("" before any).
  std::string lastError() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_error_;
  }

  // Asks `agent` for the model and loads its tokenizer; a failure is logged
  // and leaves the model as it was (the next poll tries again). Once the
  // model is ready, the agent's model replaces it only with `replace` and
  // when its identity differs; a replacement that failed for an identity is
  // not tried again for that identity within kRelearnBackoff.
  boost::asio::awaitable<void> learnFrom(AgentEndpoint agent, bool replace = false);
  // Whether learnFrom(..., true) would try `identity` now: it differs from
  // the current model's, no replacement is being loaded, and it did not
  // fail within kRelearnBackoff.
  bool wouldReplaceWith(const std::string& identity) const;

  // The model requests are parsed and hashed with now; null before ready().
  // A request holds it to its end.
  std::shared_ptr<const ModelView> current() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  // The current model's identity ("" before ready()).
  std::string identity() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_ ? current_->info.identity : std::string();
  }
  // The LoRA adapters requests may name now (ServerLimits::lora_adapters):
  // the router's agents', learned per agent. Set before the model is
  // learned.
  void setAdapterSource(std::function<std::vector<std::string>()> source) {
    adapter_source_ = std::move(source);
  }

  static constexpr std::chrono::seconds kRelearnBackoff{30};

 private:
  bool replaceableLocked(const std::string& identity) const;  // mutex_ held

  const std::filesystem::path model_dir_;
  const std::filesystem::path chat_template_file_;
  mutable std::mutex mutex_;
  std::atomic<bool> ready_{false};
  std::string last_error_;
  std::shared_ptr<const ModelView> current_;
  std::function<std::vector<std::string>()> adapter_source_;
  // The identity a replacement is being loaded for ("" when none): one
  // load at a time, whichever agent's poll asks.
  std::string replacing_;
  // The identity a replacement last failed for, and when.
  std::string failed_identity_;
  std::chrono::steady_clock::time_point failed_at_;
};

}  // namespace tandem::router
