#include "operator/router/ownership_index.h"

namespace tandem::router {

bool OwnershipIndex::apply(const std::string& agent, const nlohmann::json& event) {
  if (!event.is_object()) return true;
  const std::string type = event.value("type", std::string());
  const uint64_t sequence = event.value("sequence", uint64_t{0});
  std::lock_guard<std::mutex> lock(mutex_);
  AgentState& state = agents_[agent];
  auto hashes = [&]() -> const nlohmann::json& {
    static const nlohmann::json kEmpty = nlohmann::json::array();
    auto it = event.find("block_hashes");
    return it != event.end() && it->is_array() ? *it : kEmpty;
  };
  if (type == "Snapshot") {
    state.blocks.clear();
    for (const auto& hash : hashes()) {
      if (hash.is_string()) state.blocks.insert(hash.get<std::string>());
    }
    state.sequence = sequence;
    state.trusted = true;
    return true;
  }
  if (sequence != state.sequence + 1 && state.sequence != 0) {
    // A gap (or a repeat): what this agent holds is unknown from here; the
    // caller resubscribes from the beginning.
    state.blocks.clear();
    state.sequence = 0;
    state.trusted = false;
    return false;
  }
  state.sequence = sequence;
  state.trusted = true;
  if (type == "BlockStored") {
    for (const auto& hash : hashes()) {
      if (hash.is_string()) state.blocks.insert(hash.get<std::string>());
    }
  } else if (type == "BlockRemoved") {
    for (const auto& hash : hashes()) {
      if (hash.is_string()) state.blocks.erase(hash.get<std::string>());
    }
  } else if (type == "AllCleared") {
    state.blocks.clear();
  }
  return true;
}

void OwnershipIndex::untrust(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return;
  it->second.blocks.clear();
  it->second.sequence = 0;
  it->second.trusted = false;
}

void OwnershipIndex::remove(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  agents_.erase(agent);
}

uint64_t OwnershipIndex::lastSequence(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  return it == agents_.end() ? 0 : it->second.sequence;
}

bool OwnershipIndex::trusted(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  return it != agents_.end() && it->second.trusted;
}

int64_t OwnershipIndex::leadingBlocks(const std::string& agent,
                                      const std::vector<BlockHash>& hashes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  if (it == agents_.end() || !it->second.trusted) return 0;
  int64_t count = 0;
  for (const BlockHash& hash : hashes) {
    if (it->second.blocks.count(hash.toHex()) == 0) break;
    ++count;
  }
  return count;
}

int64_t OwnershipIndex::numBlocks(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  return it == agents_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

std::vector<std::string> OwnershipIndex::holders(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  const std::string hex = hash.toHex();
  for (const auto& [name, state] : agents_) {
    if (state.trusted && state.blocks.count(hex) != 0) out.push_back(name);
  }
  return out;
}

}  // namespace tandem::router
