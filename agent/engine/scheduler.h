// The continuous-batching scheduler.
//
// Each step it chooses which tokens of which sequences the model computes,
// within a token budget (max_num_batched_tokens) and a sequence limit
// (max_num_seqs): first every running sequence (a decode token, or the next
// chunk of a prompt still being prefilled), then waiting sequences in arrival
// order, each starting after the longest prefix the block manager already
// holds (chunked prefill: a prompt larger than the budget is split over
// steps). When blocks run out, the most recently admitted running sequence is
// preempted by recompute: its blocks are freed and it goes back to the head of
// the queue with everything it generated so far, to be recomputed later —
// bit-identical, since the kernels are batch-invariant.
//
// A sequence whose remote load finished waits, holding its blocks, at the
// head of the queue. When the oldest running sequence would have to preempt
// itself, or nothing runs and the next sequence cannot get the blocks it
// needs, the newest waiting sequences that hold blocks give them up first
// (preempted like a running one), so the queue always moves.
//
// Segmented prefill: a sequence may hold KV for ranges beyond its computed
// prefix (present_ranges, e.g. loaded from another agent around a block that
// failed to load). The scheduler computes only the gaps: a chunk never runs
// into a present range, and when the computed prefix reaches one it jumps to
// its end.
//
// Priority (SchedulingPolicy::kPriority, vLLM's --scheduling-policy
// priority): every sequence has its request's priority, lower first. The
// queue and the running sequences are kept ordered by it, first come, first
// served among equals (the rules above hold within each priority), and a
// step serves the priorities in order: the running sequences of the first,
// then its waiting ones, then the next priority's, so a request of a better
// priority takes the step's tokens before those of a worse one; once a
// priority has computed prompt tokens in a step, worse priorities only
// decode in it (their prompts would lengthen the step). Blocks
// running out preempt the newest sequence of the worst priority. A waiting
// sequence that finds no blocks or no seat preempts running sequences of a
// strictly worse priority, worst and newest first, until it fits (never one
// of its own priority: equals never preempt each other). Under kFcfs every
// sequence counts as priority 0 and all of this is the order above.
//
// Pure logic over sequence state and the block manager: no model, no
// threads. Used by the engine loop thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/engine/block_manager.h"
#include "common/protocol/request.h"

namespace tandem::engine {

// The order requests are served in (vLLM's --scheduling-policy).
enum class SchedulingPolicy {
  kFcfs,      // first come, first served; a request's priority must be 0
  kPriority,  // by the request's priority (lower first), then first come
};
// "fcfs" / "priority" (the option values); anything else throws an Error
// naming `option` and the accepted values.
SchedulingPolicy schedulingPolicyFromName(std::string_view name,
                                          std::string_view option = "--scheduling-policy");
const char* schedulingPolicyName(SchedulingPolicy policy);

struct SchedulerConfig {
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  // When false a prompt is only admitted if all of it fits in one step.
  bool enable_chunked_prefill = true;
};

enum class SequenceStatus {
  kWaiting,
  kWaitingForRemoteKv,
  // Its load failed under the fail policy: reported in failed_loads, never
  // scheduled, until the engine finishes it.
  kLoadFailed,
  kRunning,
  kFinished
};

struct Sequence {
  explicit Sequence(Request r);

  Request request;
  // The LoRA adapter it runs with (request.adapter, as the engine resolved
  // it): the model runner's index (-1: the base model alone) and the model
  // identity its blocks are hashed under (empty: the base model's).
  int32_t adapter = -1;
  std::string adapter_identity;
  SequenceStatus status = SequenceStatus::kWaiting;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;
  // Ranges [begin, end) past num_computed_tokens whose KV is already in this
  // sequence's blocks; sorted, disjoint, and never covering the last token
  // (its logits are needed to sample).
  std::vector<std::pair<int64_t, int64_t>> present_ranges;
  SequenceBlocks blocks;
  // Prompt tokens served by the prefix cache at first admission.
  int64_t num_cached_tokens = 0;
  bool admitted_once = false;
  int64_t num_preemptions = 0;
  // Full blocks already handed to the KV connector for saving.
  int64_t num_saved_blocks = 0;
  // An asynchronous load in flight (status kWaitingForRemoteKv): blocks
  // [load_first_block, load_first_block + load_num_blocks).
  int64_t load_first_block = 0;
  int64_t load_num_blocks = 0;
  // Aborted while its load was in flight: its blocks are freed when the load
  // finishes, never earlier (the connector may still be writing them).
  bool abandoned = false;
  Clock::time_point first_scheduled{};
  // Content hashes of the prompt's full blocks (Scheduler::promptHashes
  // fills them on first use), and whether admission ever waited for another
  // sequence to compute one of them.
  std::vector<BlockHash> prompt_block_hashes;
  bool prompt_hashed = false;
  bool waited_for_in_flight = false;

  // SamplingParams::prompt_logprobs: one entry per prompt token, filled as
  // the model computes the prompt (entry 0 at admission), handed out with
  // the first output. Until it is complete the sequence takes no prefix-cache
  // hit and no external KV: the model computes every prompt position.
  std::vector<GeneratedToken> prompt_logprobs;
  // Speculative decoding: the tokens proposed to follow the last one in
  // this step's chunk (ScheduledChunk::num_draft_tokens of them); empty when
  // the sequence is not scheduled with drafts.
  std::vector<TokenId> draft;
  // The most drafts its next step may take: one more than its last step
  // with drafts accepted (0: no step has drafted yet, the configured most).
  int64_t draft_limit = 0;
  bool needsPromptLogits() const {
    return request.sampling.prompt_logprobs &&
           static_cast<int64_t>(prompt_logprobs.size()) < num_prompt_tokens;
  }
  int64_t numGenerated() const { return static_cast<int64_t>(tokens.size()) - num_prompt_tokens; }
  // End of the range the model can compute next from position `from`: the
  // start of the next present range, or the end of the tokens.
  int64_t nextComputeLimit(int64_t from) const;
  // Moves num_computed_tokens past present ranges it has reached.
  void skipPresentRanges();
  // Its next chunk is a decode: one generated token, the last, is all it
  // has left to compute (not a prompt, nor output recomputed after a
  // preemption).
  bool decodesNext() const;
};

struct ScheduledChunk {
  Sequence* sequence = nullptr;
  int64_t start = 0;       // position of the first token computed
  int64_t num_tokens = 0;  // tokens [start, start + num_tokens)
  // The chunk ends at the last known token: its logits give the next token.
  bool samples = false;
  // Of num_tokens, the last ones are the sequence's drafts (Sequence::draft)
  // after its last known token. Their KV is computed but counts as computed
  // only as the engine accepts them, one by one (Scheduler::acceptDraft).
  int64_t num_draft_tokens = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  int64_t num_tokens = 0;
  std::vector<Sequence*> preempted;  // preempted during this step
  // Sequences whose external KV failed to load under the "fail" policy; they
  // hold no blocks and the engine ends them with an error.
  std::vector<Sequence*> failed_loads;
  bool empty() const { return chunks.empty(); }
};

// Where a sequence's KV may come from besides this agent's prefix cache. The
// engine implements it over a KV connector; the scheduler only decides.
class ExternalKvSource {
 public:
  virtual ~ExternalKvSource() = default;
  struct Lookup {
    bool pending = false;    // not known yet: ask again on a later step
    int64_t num_tokens = 0;  // whole blocks right after num_local_tokens
  };
  virtual Lookup lookup(const Sequence& sequence, int64_t num_local_tokens) = 0;
  struct Load {
    bool done = true;                    // false: completion comes later
    std::vector<int64_t> failed_blocks;  // when done: indices that failed
  };
  // Loads blocks [first_block, first_block + num_blocks) of the sequence into
  // its block table.
  virtual Load load(const Sequence& sequence, int64_t first_block, int64_t num_blocks) = 0;
  // true: a failed load ends the request; false: the failed blocks are recomputed.
  virtual bool failOnLoadError() const = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  void add(std::unique_ptr<Sequence> sequence);
  // Optional; consulted when a sequence is admitted without blocks.
  void setExternalKvSource(ExternalKvSource* source) { external_ = source; }
  // Optional; called with the number of blocks missing when a sequence
  // cannot grow (before a running one is preempted) or be admitted for lack
  // of blocks: frees blocks held outside the scheduler (KV holds for remote
  // readers that have not come) and returns whether it freed any, so the
  // allocation is tried again. It frees nothing unless it can free them all.
  void setHeldBlocksReclaimer(std::function<bool(int64_t blocks_short)> reclaim) {
    reclaim_held_ = std::move(reclaim);
  }
  // Optional (speculative decoding): once every running and admitted
  // sequence has its chunk, and unless the step preempted, called for each
  // sequence whose chunk is its one last token, with the token budget left;
  // fills Sequence::draft (at most that many) and returns how many. The
  // drafts join the chunk as far as the blocks the sequence holds and free
  // blocks that hold no cached prefix reach: they never take budget or
  // blocks from another sequence's chunk, preempt one, or evict a cached
  // block; the engine gives the blocks of drafts not accepted back. With
  // `disable_by_batch_size` > 0, no drafts in a step in which at least that
  // many sequences run.
  void setDrafter(std::function<int64_t(Sequence&, int64_t max_drafts)> drafter,
                  int64_t disable_by_batch_size = 0) {
    drafter_ = std::move(drafter);
    disable_drafts_at_ = disable_by_batch_size;
  }
  SchedulerOutput schedule();
  // Call after the model computed a step: advances computed counts (up to
  // each chunk's last known token) and registers blocks that became full in
  // the prefix cache.
  void onStepComputed(const SchedulerOutput& output);
  // The next of the sequence's drafts was accepted (the token sampled before
  // it equals it): its KV, computed in the step, now counts as computed.
  void acceptDraft(Sequence& sequence);
  // After a step with drafts: gives back the blocks past those its computed
  // positions fill (taken for drafts that were not accepted), so that the
  // sequence holds what it would hold without drafts.
  void releaseDraftBlocks(Sequence& sequence);
  // Frees the sequence's blocks and forgets it. Returns the sequence so the
  // caller can report on it. A sequence whose load is in flight is forgotten
  // by the queues at once but keeps its blocks until loadFinished().
  std::unique_ptr<Sequence> finish(Sequence* sequence, bool free_blocks = true);
  // An asynchronous load finished: the sequence becomes schedulable again,
  // with failed blocks recomputed (segmented prefill) or, under the fail
  // policy, reported in the next schedule()'s failed_loads. Returns false for
  // unknown ids.
  bool loadFinished(const std::string& request_id, std::vector<int64_t> failed_blocks);
  int64_t numWaitingForRemoteKv() const;
  // Finds a live sequence by request id (nullptr when unknown).
  Sequence* find(const std::string& request_id);
  // The waiting sequence whose admission the last schedule() was making
  // when it left by an exception (a KV connector's lookup or load threw);
  // null after a schedule() that returned.
  Sequence* admitting() const { return admitting_; }

  int64_t numRunning() const { return static_cast<int64_t>(running_.size()); }
  int64_t numWaiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Tokens the waiting sequences still need computed before they can sample:
  // the uncomputed part of each queued prompt (and of what a preempted
  // sequence generated, which it recomputes). Loads in flight count too.
  int64_t numPrefillTokensWaiting() const;
  // Blocks the queued sequences (not those parked on a load, which hold
  // theirs) still lack to hold every token they know: what admitting them
  // all would take from the free blocks, before any prefix-cache hit.
  int64_t numBlocksNeededByWaiting() const;
  bool hasWork() const { return !running_.empty() || !waiting_.empty() || !abandoned_.empty(); }
  int64_t numPreemptions() const { return num_preemptions_; }
  // Of those, the running sequences preempted to admit a waiting one of a
  // better priority.
  int64_t numPriorityPreemptions() const { return num_priority_preemptions_; }
  // Sequences whose admission waited for another sequence to compute a
  // prompt block they share (each counted once).
  int64_t numInFlightPrefixWaits() const { return in_flight_prefix_waits_; }
  int64_t numExternalBlocksLoaded() const { return external_blocks_loaded_; }
  int64_t numExternalBlocksFailed() const { return external_blocks_failed_; }

  const SchedulerConfig& config() const { return config_; }

  // Whether a live sequence other than `except` — running, or waiting to
  // run or to load — has a prompt whose blocks up to `index` are those of
  // `hashes` (hashes chain: equal at `index` means the same whole prefix) and
  // has not yet computed block `index`: that block is on its way into the
  // prefix cache. `waiting_to_run` counts sequences not yet admitted too.
  // Under kPriority a sequence of a worse priority than `except` does not
  // count.
  bool prefixBlockComing(const std::vector<BlockHash>& hashes, int64_t index,
                         const Sequence* except, bool waiting_to_run);

 private:
  void preempt(Sequence* sequence);
  // Frees a sequence's blocks and sends it back to compute from nothing.
  void dropBlocks(Sequence& sequence);
  // Frees a sequence's blocks after a load failed under the fail policy.
  void failLoad(Sequence& sequence);
  // Registers the sequence's full blocks within its computed tokens in the
  // prefix cache (under its salt and adapter).
  void cacheComputedBlocks(Sequence& sequence);
  // Gives decode chunks the drafts the drafter proposes, within `budget`.
  void addDrafts(int64_t budget, SchedulerOutput& output);
  enum class Admission { kAdmitted, kNoRoom, kSkipped };
  // The priority a sequence is scheduled by (0 for all under kFcfs).
  int64_t rank(const Sequence& sequence) const;
  // Queues a sequence behind those of its priority (a new one), or before
  // them (a preempted one, or one whose load finished: it goes first).
  void queueBehind(std::unique_ptr<Sequence> sequence);
  void queueAhead(std::unique_ptr<Sequence> sequence);
  // Schedules the running sequences of priority `rank` from index `*next`
  // on, growing them (and preempting when blocks run out); moves `*next`
  // past them. With `decode_only`, only those whose next chunk decodes.
  // False when a sequence had to preempt itself: the step ends.
  bool scheduleRunning(int64_t rank, size_t* next, int64_t& budget, SchedulerOutput& output,
                       bool decode_only);
  // Why the queue stopped at a sequence.
  struct Blocked {
    Sequence* sequence = nullptr;  // null: it did not stop
    bool no_seat = false;          // max_num_seqs, not blocks or budget
  };
  // Admits waiting sequences of priority `rank` in order while the budget
  // and max_num_seqs allow, each joining the running ones at `*next`
  // (moved past it); returns the one that found no room or no seat (the
  // queue stops there).
  Blocked admitWaiting(int64_t rank, size_t* next, int64_t& budget, SchedulerOutput& output);
  // kPriority: preempts the newest running sequence of the worst priority
  // when that is strictly worse than `blocked`'s and `blocked` lacks a seat
  // or blocks; false when there is none.
  bool preemptForPriority(const Blocked& blocked, SchedulerOutput& output);
  // Frees the blocks of the newest waiting sequence other than `except` that
  // holds blocks and is not being loaded into; false when there is none.
  bool reclaimWaitingBlocks(const Sequence* except);
  Admission admit(Sequence* sequence, int64_t budget, SchedulerOutput& output);
  // Loads external KV after allocation; returns the new computed position, or
  // -1 when the request must fail.
  int64_t loadExternal(Sequence* sequence, int64_t local_tokens, int64_t external_tokens);
  const std::vector<BlockHash>& promptHashes(Sequence* sequence);
  // Another running (or loading) sequence has yet to produce the prompt
  // block `sequence` would compute first, block `first_uncached`: admitting
  // it now would compute that block twice, while after the other has cached
  // it, it is a prefix-cache hit.
  bool blockIsInFlight(Sequence* sequence, int64_t first_uncached);
  // Applies a finished load's failures; the new computed position, or -1.
  int64_t applyLoadResult(Sequence* sequence, int64_t first_block, int64_t num_blocks,
                          std::vector<int64_t> failed);

  SchedulerConfig config_;
  BlockManager& blocks_;
  // Admission order (kPriority: by priority, then admission order).
  std::vector<std::unique_ptr<Sequence>> running_;
  // Arrival order, preempted and loaded sequences first (kPriority: by
  // priority, then that order).
  std::deque<std::unique_ptr<Sequence>> waiting_;
  int64_t num_preemptions_ = 0;
  int64_t num_priority_preemptions_ = 0;
  int64_t in_flight_prefix_waits_ = 0;
  ExternalKvSource* external_ = nullptr;
  std::function<bool(int64_t)> reclaim_held_;
  std::function<int64_t(Sequence&, int64_t)> drafter_;
  int64_t disable_drafts_at_ = 0;
  // Blocks the last admission that found no room lacked (0: it lacked
  // token budget, not blocks).
  int64_t admission_blocks_short_ = 0;
  int64_t external_blocks_loaded_ = 0;
  int64_t external_blocks_failed_ = 0;
  std::vector<std::unique_ptr<Sequence>> abandoned_;  // aborted with a load in flight
  std::vector<Sequence*> pending_failed_loads_;       // reported by the next schedule()
  Sequence* admitting_ = nullptr;
};

}  // namespace tandem::engine
