// Which agent holds which KV block, fed by the agents' /v1/kv_events streams.
//
// Each agent's stream is applied in sequence order: BlockStored adds hashes,
// BlockRemoved drops them, AllCleared and Snapshot start the agent over. An
// agent is trusted only while its stream is connected and gap-free: when the
// stream drops (or a sequence number is skipped) the agent's blocks are
// forgotten until a Snapshot or a fresh stream rebuilds them, so the router
// never sends work to an agent for blocks it may no longer hold.
//
// Hashes are kept as 128-bit BlockHash values (an event's hex strings are
// converted once, when applied; strings that are not 32 hex digits are
// ignored), both per agent and as one hash -> agents map, so that a routing
// decision walks a prompt's hashes once for every agent (leadingBlocksForAll).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "operator/router/holder_table.h"

namespace tandem::router {

class OwnershipIndex {
 public:
  // Applies one event of `agent`'s stream (the JSON of one SSE data line).
  // Returns false when the event does not follow the last one applied (a
  // gap): the agent is then untrusted and the caller resubscribes from the
  // beginning (since=0: a replay or a Snapshot). A Snapshot is always
  // accepted.
  bool apply(const std::string& agent, const nlohmann::json& event);
  // Blocks a routing decision just sent `agent` to compute or read (the
  // prompt's hashes from its leading run on): counted as held from now, so
  // the next decision sees the prefix where it is being computed instead of
  // computing it again elsewhere (a hot prefix arriving in a burst; the
  // agent's scheduler makes a request wait for blocks another request is
  // computing), until the agent's BlockStored confirms them; one never
  // confirmed (a failed request) is dropped after `ttl`. Ignored for an
  // untrusted agent.
  void expect(const std::string& agent, std::span<const BlockHash> hashes,
              std::chrono::steady_clock::duration ttl);
  // The request expected on `agent` failed there: those of `hashes` it only
  // expected (not confirmed stored) are no longer counted for it.
  void unexpect(const std::string& agent, std::span<const BlockHash> hashes);
  // The agent's stream is open from the beginning (since=0): trusted from
  // now, holding nothing known; the replay or Snapshot that follows fills it
  // in. A fresh agent sends no event before its first stored block, so
  // without this its expected blocks would not count until then, and a
  // burst arriving at a fresh pool would compute each prefix everywhere.
  void connected(const std::string& agent);
  // The agent's stream dropped: forget its blocks until it is rebuilt.
  void untrust(const std::string& agent);
  // The agent left the pool: forget everything about it.
  void remove(const std::string& agent);

  // Sequence number of the last event applied for `agent` (0: none).
  uint64_t lastSequence(const std::string& agent) const;
  bool trusted(const std::string& agent) const;
  // How many of `hashes` (a prompt's chained block hashes, in order) the
  // agent holds as a leading run; 0 for an untrusted agent.
  // Expected blocks past their ttl are dropped first (these lookups are what
  // routes requests: a lapsed expectation must never attract one).
  int64_t leadingBlocks(const std::string& agent, const std::vector<BlockHash>& hashes);
  // leadingBlocks for every agent the index knows, from one walk over
  // `hashes`: each known agent maps to what leadingBlocks would return for it
  // (0 when untrusted). Agents it does not know are absent (they hold nothing).
  std::unordered_map<std::string, int64_t> leadingBlocksForAll(
      const std::vector<BlockHash>& hashes);
  // Blocks known for the agent, and agents known to hold a hash (for tests
  // and metrics).
  int64_t numBlocks(const std::string& agent) const;
  std::vector<std::string> holders(const BlockHash& hash) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct AgentState {
    std::unordered_set<BlockHash> blocks;
    // Expected (expect()) and not yet stored, with when each lapses. The
    // agent's holder bit is set for blocks and expected alike.
    std::unordered_map<BlockHash, Clock::time_point> expected;
    uint64_t sequence = 0;
    bool trusted = false;
    size_t slot = 0;
  };

  AgentState& stateOf(const std::string& agent);
  void insertBlock(AgentState& state, const BlockHash& hash);
  void eraseBlock(AgentState& state, const BlockHash& hash);
  void clearBlocks(AgentState& state);
  void dropLapsed(Clock::time_point now);
  // Calls `apply` with each of the event's block_hashes that is a valid hex hash.
  template <typename Apply>
  static void forEachHash(const nlohmann::json& event, Apply apply);

  mutable std::mutex mutex_;
  std::map<std::string, AgentState> agents_;
  // hash -> the slots of the agents holding it.
  HolderTable holders_;
  // expect() calls, the first to lapse on top.
  struct Expectation {
    Clock::time_point lapses;
    std::string agent;
    std::vector<BlockHash> hashes;
    bool operator>(const Expectation& other) const { return lapses > other.lapses; }
  };
  std::priority_queue<Expectation, std::vector<Expectation>, std::greater<>> expectations_;
  std::vector<size_t> free_slots_;
  size_t next_slot_ = 0;
};

}  // namespace tandem::router
