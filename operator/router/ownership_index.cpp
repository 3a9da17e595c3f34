#include "operator/router/ownership_index.h"

#include <bit>

namespace tandem::router {
namespace {

constexpr size_t kSlotsPerWord = HolderTable::kSlotsPerWord;

uint64_t bitOf(size_t slot) { return uint64_t{1} << (slot % kSlotsPerWord); }

}  // namespace

template <typename Apply>
void OwnershipIndex::forEachHash(const nlohmann::json& event, Apply apply) {
  auto it = event.find("block_hashes");
  if (it == event.end() || !it->is_array()) return;
  for (const auto& hex : *it) {
    if (!hex.is_string()) continue;
    // An agent only sends hashes it computed; one that does not parse names
    // no block a prompt can have, so it is skipped.
    StatusOr<BlockHash> hash = BlockHash::fromHex(hex.get_ref<const std::string&>());
    if (hash.isOk()) apply(hash.value());
  }
}

OwnershipIndex::AgentState& OwnershipIndex::stateOf(const std::string& agent) {
  auto it = agents_.find(agent);
  if (it != agents_.end()) return it->second;
  AgentState& state = agents_[agent];
  if (!free_slots_.empty()) {
    state.slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    state.slot = next_slot_++;
  }
  return state;
}

void OwnershipIndex::insertBlock(AgentState& state, const BlockHash& hash) {
  if (!state.blocks.insert(hash).second) return;
  if (state.expected.erase(hash) > 0) return;  // its bit is already set
  holders_.set(hash, state.slot);
}

void OwnershipIndex::eraseBlock(AgentState& state, const BlockHash& hash) {
  const size_t removed = state.blocks.erase(hash) + state.expected.erase(hash);
  if (removed > 0) holders_.reset(hash, state.slot);
}

void OwnershipIndex::clearBlocks(AgentState& state) {
  for (const BlockHash& hash : state.blocks) holders_.reset(hash, state.slot);
  for (const auto& [hash, lapses] : state.expected) holders_.reset(hash, state.slot);
  state.blocks.clear();
  state.expected.clear();
}

void OwnershipIndex::expect(const std::string& agent, std::span<const BlockHash> hashes,
                            Clock::duration ttl) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  dropLapsed(now);
  auto it = agents_.find(agent);
  if (it == agents_.end() || !it->second.trusted || hashes.empty()) return;
  AgentState& state = it->second;
  const Clock::time_point lapses = now + ttl;
  for (const BlockHash& hash : hashes) {
    if (state.blocks.count(hash) > 0) continue;
    auto [entry, added] = state.expected.try_emplace(hash, lapses);
    entry->second = lapses;
    if (added) holders_.set(hash, state.slot);
  }
  expectations_.push({lapses, agent, {hashes.begin(), hashes.end()}});
}

void OwnershipIndex::unexpect(const std::string& agent, std::span<const BlockHash> hashes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return;
  AgentState& state = it->second;
  for (const BlockHash& hash : hashes) {
    // Its entry in expectations_ finds nothing to drop when it lapses.
    if (state.expected.erase(hash) > 0) holders_.reset(hash, state.slot);
  }
}

void OwnershipIndex::dropLapsed(Clock::time_point now) {
  while (!expectations_.empty() && expectations_.top().lapses <= now) {
    const Expectation& lapsed = expectations_.top();
    auto agent = agents_.find(lapsed.agent);
    if (agent != agents_.end()) {
      AgentState& state = agent->second;
      for (const BlockHash& hash : lapsed.hashes) {
        auto it = state.expected.find(hash);
        // Still unconfirmed, and not renewed by a later expect().
        if (it == state.expected.end() || it->second > now) continue;
        state.expected.erase(it);
        holders_.reset(hash, state.slot);
      }
    }
    expectations_.pop();
  }
}

bool OwnershipIndex::apply(const std::string& agent, const nlohmann::json& event) {
  if (!event.is_object()) return true;
  const std::string type = event.value("type", std::string());
  const uint64_t sequence = event.value("sequence", uint64_t{0});
  std::lock_guard<std::mutex> lock(mutex_);
  dropLapsed(Clock::now());
  AgentState& state = stateOf(agent);
  auto insert = [&](const BlockHash& hash) { insertBlock(state, hash); };
  if (type == "Snapshot") {
    clearBlocks(state);
    forEachHash(event, insert);
    state.sequence = sequence;
    state.trusted = true;
    return true;
  }
  if (sequence != state.sequence + 1 && state.sequence != 0) {
    // A gap (or a repeat): what this agent holds is unknown from here; the
    // caller resubscribes from the beginning.
    clearBlocks(state);
    state.sequence = 0;
    state.trusted = false;
    return false;
  }
  state.sequence = sequence;
  state.trusted = true;
  if (type == "BlockStored") {
    forEachHash(event, insert);
  } else if (type == "BlockRemoved") {
    forEachHash(event, [&](const BlockHash& hash) { eraseBlock(state, hash); });
  } else if (type == "AllCleared") {
    clearBlocks(state);
  }
  return true;
}

void OwnershipIndex::connected(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  AgentState& state = stateOf(agent);
  clearBlocks(state);
  state.sequence = 0;
  state.trusted = true;
}

void OwnershipIndex::untrust(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return;
  clearBlocks(it->second);
  it->second.sequence = 0;
  it->second.trusted = false;
}

void OwnershipIndex::remove(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return;
  clearBlocks(it->second);
  free_slots_.push_back(it->second.slot);
  agents_.erase(it);
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
                                      const std::vector<BlockHash>& hashes) {
  std::lock_guard<std::mutex> lock(mutex_);
  dropLapsed(Clock::now());
  auto it = agents_.find(agent);
  if (it == agents_.end() || !it->second.trusted) return 0;
  int64_t count = 0;
  for (const BlockHash& hash : hashes) {
    if (it->second.blocks.count(hash) == 0 && it->second.expected.count(hash) == 0) break;
    ++count;
  }
  return count;
}

std::unordered_map<std::string, int64_t> OwnershipIndex::leadingBlocksForAll(
    const std::vector<BlockHash>& hashes) {
  std::lock_guard<std::mutex> lock(mutex_);
  dropLapsed(Clock::now());
  std::unordered_map<std::string, int64_t> result;
  // The agents still inside their leading run, as slot bits, and who each
  // slot is.
  std::vector<uint64_t> running((next_slot_ + kSlotsPerWord - 1) / kSlotsPerWord, 0);
  std::vector<int64_t> counts(next_slot_, 0);
  std::vector<const std::string*> names(next_slot_, nullptr);
  size_t num_running = 0;
  for (const auto& [name, state] : agents_) {
    result[name] = 0;
    if (!state.trusted || (state.blocks.empty() && state.expected.empty())) continue;
    names[state.slot] = &name;
    running[state.slot / kSlotsPerWord] |= bitOf(state.slot);
    ++num_running;
  }
  // Each lookup is about one cache miss; loading the entries a few blocks
  // ahead overlaps them.
  constexpr size_t kPrefetchAhead = 24;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (num_running == 0) break;
    if (i + kPrefetchAhead < hashes.size()) holders_.prefetch(hashes[i + kPrefetchAhead]);
    const uint64_t* bits = holders_.find(hashes[i]);
    for (size_t word = 0; word < running.size(); ++word) {
      const uint64_t held = holders_.word(bits, word);
      uint64_t stopped = running[word] & ~held;
      running[word] &= held;
      while (stopped != 0) {
        const size_t bit = static_cast<size_t>(std::countr_zero(stopped));
        stopped &= stopped - 1;
        counts[word * kSlotsPerWord + bit] = static_cast<int64_t>(i);
        --num_running;
      }
    }
  }
  for (size_t slot = 0; slot < next_slot_; ++slot) {
    if (names[slot] == nullptr) continue;
    if ((running[slot / kSlotsPerWord] & bitOf(slot)) != 0) {
      counts[slot] = static_cast<int64_t>(hashes.size());  // held every hash
    }
    result[*names[slot]] = counts[slot];
  }
  return result;
}

int64_t OwnershipIndex::numBlocks(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = agents_.find(agent);
  return it == agents_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

std::vector<std::string> OwnershipIndex::holders(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  const uint64_t* bits = holders_.find(hash);
  if (bits == nullptr) return out;
  for (const auto& [name, state] : agents_) {
    if (state.trusted &&
        (holders_.word(bits, state.slot / kSlotsPerWord) & bitOf(state.slot)) != 0) {
      out.push_back(name);
    }
  }
  return out;
}

}  // namespace tandem::router
