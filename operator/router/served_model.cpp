#include "operator/router/served_model.h"

#include <boost/beast/http.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/logging.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/tool_call_parser.h"
#include "operator/router/upstream_call.h"

namespace tandem::router {

using nlohmann::json;

std::vector<AdapterInfo> adaptersOf(const json& models_answer) {
  std::vector<AdapterInfo> adapters;
  const json& data = models_answer.at("data");
  const std::string base = data.at(0).value("id", std::string());
  for (size_t i = 1; i < data.size(); ++i) {
    const json& entry = data[i];
    if (entry.value("parent", std::string()) != base) continue;
    const json tandem = entry.value("tandem", json::object());
    const auto identity = tandem.find("model_identity");
    if (identity == tandem.end() || !identity->is_string() ||
        identity->get<std::string>().empty()) {
      continue;
    }
    adapters.push_back({entry.at("id").get<std::string>(), identity->get<std::string>()});
  }
  return adapters;
}

std::string modelIdentityOf(const json& models_answer) {
  const json tandem = models_answer.at("data").at(0).value("tandem", json::object());
  return tandem.value("model_identity", std::string());
}

int64_t agentCountOf(const json& models_answer, const char* key) {
  const json tandem = models_answer.at("data").at(0).value("tandem", json::object());
  const auto it = tandem.find(key);
  if (it == tandem.end() || !it->is_number_integer()) return 0;
  return std::max<int64_t>(0, it->get<int64_t>());
}

bool ServedModel::wouldReplaceWith(const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return replaceableLocked(identity);
}

bool ServedModel::replaceableLocked(const std::string& identity) const {
  if (!current_ || identity.empty() || identity == current_->info.identity || !replacing_.empty()) {
    return false;
  }
  return identity != failed_identity_ ||
         std::chrono::steady_clock::now() - failed_at_ >= kRelearnBackoff;
}

boost::asio::awaitable<void> ServedModel::learnFrom(AgentEndpoint agent, bool replace) {
  UpstreamResult models = co_await callAgent(agent, boost::beast::http::verb::get,
                                             std::string("/v1/models"), std::string(), 5.0);
  if (models.status == 401 || models.status == 403) {
    // The agents want a key this router does not send: said once, and
    // given as the reason the model is not ready.
    const std::string error =
        "agent " + agent.name + " refused GET /v1/models with HTTP " +
        std::to_string(models.status) +
        ": give the router the agents' API key (--agent-api-key or TANDEM_AGENT_API_KEY)";
    std::lock_guard<std::mutex> lock(mutex_);
    if (last_error_ != error) {
      TANDEM_LOG(kWarn) << "router: " << error;
    }
    last_error_ = error;
    co_return;
  }
  if (models.status != 200) co_return;
  json body = parseJsonOrDiscarded(models.body);
  if (!body.is_object() || !body.contains("data") || body["data"].empty()) co_return;
  ModelInfo info;
  protocol::ChatOutputOptions chat_output;
  // An answer not shaped as an agent's (a field of another type) is named
  // and tried again at the next poll; it must not end the agent's polling.
  bool shaped = true;
  try {
    const json& model = body["data"].at(0);
    info.served_name = model.value("id", std::string());
    info.max_model_len = model.value("max_model_len", int64_t{0});
    info.root = model.value("root", std::string());
    const json tandem = model.value("tandem", json::object());
    info.identity = modelIdentityOf(body);
    if (const auto it = tandem.find("generation_defaults"); it != tandem.end()) {
      info.generation_defaults = protocol::GenerationDefaults::fromJson(*it);
    }
    info.block_size = tandem.value("block_size", 16);
    auto hash = parseHashAlgorithm(tandem.value("prefix_caching_hash", std::string("xxhash")));
    if (hash.isOk()) info.hash = *hash;
    // The agents' output parsers: a forced tool call is written in the tool
    // parser's format, so the router checks it as they do.
    auto text = [&tandem](const char* key) {
      const auto it = tandem.find(key);
      return it != tandem.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (auto parser = protocol::toolCallParserFromName(text("tool_call_parser")); parser.isOk()) {
      chat_output.tool_call_parser = *parser;
    }
    if (auto parser = protocol::reasoningParserFromName(text("reasoning_parser")); parser.isOk()) {
      chat_output.reasoning_parser = *parser;
    }
  } catch (const std::exception& e) {
    TANDEM_LOG(kWarn) << "router: the /v1/models answer of " << agent.name
                      << " is not an agent's: " << e.what();
    std::lock_guard<std::mutex> lock(mutex_);
    last_error_ = "the /v1/models answer of " + agent.name + " is not an agent's: " + e.what();
    shaped = false;
  }
  if (!shaped) co_return;
  bool claimed = false;  // this call loads a replacement
  if (ready_) {
    // One replacement loads at a time (a tokenizer takes a while to read).
    if (!replace) co_return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!replaceableLocked(info.identity)) co_return;
    replacing_ = info.identity;
    claimed = true;
  }
  // Whatever way this load ends, the next replacement may be tried.
  struct Replacing {
    ServedModel* model;
    bool claimed;
    ~Replacing() {
      if (!claimed) return;
      std::lock_guard<std::mutex> lock(model->mutex_);
      model->replacing_.clear();
    }
  } replacing{this, claimed};
  const std::filesystem::path dir = model_dir_.empty() ? info.root : model_dir_;
  try {
    auto view = std::make_shared<ModelView>();
    view->tokenizer = Tokenizer::fromDirectory(dir);
    int64_t vocab = view->tokenizer->vocabSize();
    std::ifstream config_file(dir / "config.json");
    json model_config = json::parse(config_file, nullptr, false);
    if (model_config.is_object()) vocab = model_config.value("vocab_size", vocab);
    auto chat_template = server::ChatTemplate::load(*view->tokenizer, chat_template_file_);
    if (!chat_template.isOk()) throw Error(chat_template.status().message());
    view->hasher = std::make_unique<BlockHasher>(info.hash, info.identity, info.block_size);
    server::ServerLimits& limits = view->limits;
    limits.served_model_name = info.served_name;
    limits.max_model_len = info.max_model_len;
    limits.vocab_size = vocab;
    limits.ignore_kv_transfer_params = true;  // dropped from what is forwarded
    limits.chat_template = std::move(*chat_template);
    limits.chat_output = chat_output;
    // The agents' request defaults: a request's max_tokens is theirs.
    limits.generation_defaults = info.generation_defaults;
    limits.lora_adapters = adapter_source_;
    view->info = info;

    std::lock_guard<std::mutex> lock(mutex_);
    const std::shared_ptr<const ModelView> replaced = current_;
    // Another coroutine got there first, or the model is no longer to be
    // replaced by this one.
    if (replaced && (!replace || replaced->info.identity == info.identity)) co_return;
    current_ = std::move(view);
    ready_ = true;
    TANDEM_LOG(kInfo) << "router: "
                      << (replaced ? "the decode agents moved to another model: " : "")
                      << "serving " << info.served_name << " (" << info.identity
                      << (replaced ? ", was " + replaced->info.identity : std::string())
                      << ", block size " << info.block_size << ", tokenizer from " << dir.string()
                      << ")";
  } catch (const std::exception& e) {
    TANDEM_LOG(kWarn) << "router: cannot load the tokenizer from " << dir.string() << ": "
                      << e.what();
    std::lock_guard<std::mutex> lock(mutex_);
    last_error_ = "cannot load the tokenizer from " + dir.string() + ": " + e.what() +
                  " (the agents' model directory must exist on the router's host, or --model-dir "
                  "name a copy)";
    if (current_) {
      failed_identity_ = info.identity;
      failed_at_ = std::chrono::steady_clock::now();
    }
  }
}

}  // namespace tandem::router
