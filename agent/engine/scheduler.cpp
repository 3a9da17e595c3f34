#include "agent/engine/scheduler.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace tandem::engine {
namespace {

// loadExternal(): the load continues asynchronously.
constexpr int64_t kLoadPending = -2;

}  // namespace

SchedulingPolicy schedulingPolicyFromName(std::string_view name, std::string_view option) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  throw Error(std::string(option) + " must be fcfs or priority, got \"" + std::string(name) + "\"");
}

const char* schedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kPriority ? "priority" : "fcfs";
}

Sequence::Sequence(Request r) : request(std::move(r)) {
  tokens = request.prompt;
  num_prompt_tokens = static_cast<int64_t>(tokens.size());
  // A resumed request starts as a preempted one does: its output so far is
  // recomputed as context before the next token is sampled.
  tokens.insert(tokens.end(), request.resume_output.begin(), request.resume_output.end());
  if (request.sampling.prompt_logprobs && !tokens.empty()) {
    GeneratedToken first;
    first.token = tokens[0];
    prompt_logprobs.push_back(first);
  }
}

int64_t Sequence::nextComputeLimit(int64_t from) const {
  for (const auto& [begin, end] : present_ranges) {
    if (begin >= from) return begin;
  }
  return static_cast<int64_t>(tokens.size());
}

bool Sequence::decodesNext() const {
  return numGenerated() > 0 && num_computed_tokens + 1 == std::ssize(tokens);
}

void Sequence::skipPresentRanges() {
  while (!present_ranges.empty() && present_ranges.front().first <= num_computed_tokens) {
    num_computed_tokens = std::max(num_computed_tokens, present_ranges.front().second);
    present_ranges.erase(present_ranges.begin());
  }
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  TANDEM_CHECK(config_.max_num_batched_tokens > 0 && config_.max_num_seqs > 0,
               "scheduler limits must be positive");
}

void Scheduler::add(std::unique_ptr<Sequence> sequence) {
  sequence->status = SequenceStatus::kWaiting;
  queueBehind(std::move(sequence));
}

int64_t Scheduler::rank(const Sequence& sequence) const {
  return config_.policy == SchedulingPolicy::kPriority ? sequence.request.priority : 0;
}

void Scheduler::queueBehind(std::unique_ptr<Sequence> sequence) {
  const int64_t own = rank(*sequence);
  auto at = waiting_.end();
  while (at != waiting_.begin() && rank(**std::prev(at)) > own) --at;
  waiting_.insert(at, std::move(sequence));
}

void Scheduler::queueAhead(std::unique_ptr<Sequence> sequence) {
  const int64_t own = rank(*sequence);
  auto at = waiting_.begin();
  while (at != waiting_.end() && rank(**at) < own) ++at;
  waiting_.insert(at, std::move(sequence));
}

Sequence* Scheduler::find(const std::string& request_id) {
  for (auto& sequence : running_) {
    if (sequence->request.id == request_id) return sequence.get();
  }
  for (auto& sequence : waiting_) {
    if (sequence->request.id == request_id) return sequence.get();
  }
  return nullptr;
}

void Scheduler::preempt(Sequence* sequence) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& s) { return s.get() == sequence; });
  TANDEM_CHECK(it != running_.end(), "preempting a sequence that is not running");
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  dropBlocks(*owned);
  queueAhead(std::move(owned));
}

void Scheduler::dropBlocks(Sequence& sequence) {
  blocks_.free(sequence.blocks);
  sequence.num_computed_tokens = 0;
  sequence.present_ranges.clear();
  sequence.draft.clear();
  sequence.status = SequenceStatus::kWaiting;
  ++sequence.num_preemptions;
  ++num_preemptions_;
}

bool Scheduler::reclaimWaitingBlocks(const Sequence* except) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Sequence& sequence = **it;
    if (&sequence == except || sequence.status != SequenceStatus::kWaiting ||
        sequence.blocks.blocks.empty()) {
      continue;
    }
    dropBlocks(sequence);
    return true;
  }
  return false;
}

int64_t Scheduler::loadExternal(Sequence* sequence, int64_t local_tokens, int64_t external_tokens) {
  const int64_t block_size = blocks_.blockSize();
  const int64_t first_block = local_tokens / block_size;
  const int64_t num_blocks = external_tokens / block_size;
  ExternalKvSource::Load load = external_->load(*sequence, first_block, num_blocks);
  if (!load.done) return kLoadPending;
  return applyLoadResult(sequence, first_block, num_blocks, std::move(load.failed_blocks));
}

int64_t Scheduler::applyLoadResult(Sequence* sequence, int64_t first_block, int64_t num_blocks,
                                   std::vector<int64_t> failed) {
  const int64_t block_size = blocks_.blockSize();
  std::sort(failed.begin(), failed.end());
  external_blocks_failed_ += static_cast<int64_t>(failed.size());
  external_blocks_loaded_ += num_blocks - static_cast<int64_t>(failed.size());
  if (failed.empty()) return (first_block + num_blocks) * block_size;
  if (external_->failOnLoadError()) return -1;
  // Segmented prefill: recompute from the first failed block; the valid
  // blocks after it stay, as present ranges the scheduler computes around.
  blocks_.invalidateBlocks(sequence->blocks, failed);
  sequence->present_ranges.clear();
  int64_t run_start = -1;
  for (int64_t block = failed.front() + 1; block <= first_block + num_blocks; ++block) {
    const bool valid = block < first_block + num_blocks &&
                       !std::binary_search(failed.begin(), failed.end(), block);
    if (valid && run_start < 0) run_start = block;
    if (!valid && run_start >= 0) {
      sequence->present_ranges.emplace_back(run_start * block_size, block * block_size);
      run_start = -1;
    }
  }
  return failed.front() * block_size;
}

bool Scheduler::loadFinished(const std::string& request_id, std::vector<int64_t> failed_blocks) {
  for (auto it = abandoned_.begin(); it != abandoned_.end(); ++it) {
    if ((*it)->request.id == request_id) {
      blocks_.free((*it)->blocks);  // now nobody writes them any more
      abandoned_.erase(it);
      return true;
    }
  }
  const auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& sequence) {
    return sequence->request.id == request_id &&
           sequence->status == SequenceStatus::kWaitingForRemoteKv;
  });
  if (it == waiting_.end()) return false;
  Sequence* sequence = it->get();
  const int64_t computed = applyLoadResult(sequence, sequence->load_first_block,
                                           sequence->load_num_blocks, std::move(failed_blocks));
  sequence->load_num_blocks = 0;
  if (computed < 0) {
    failLoad(*sequence);
    pending_failed_loads_.push_back(sequence);
    return true;
  }
  sequence->status = SequenceStatus::kWaiting;
  sequence->num_computed_tokens = computed;
  // It holds its blocks: first in line, so that they are used (a running
  // sequence's can be preempted; a waiting one's only by
  // reclaimWaitingBlocks).
  std::unique_ptr<Sequence> loaded = std::move(*it);
  waiting_.erase(it);
  queueAhead(std::move(loaded));
  return true;
}

void Scheduler::failLoad(Sequence& sequence) {
  blocks_.free(sequence.blocks);
  sequence.num_computed_tokens = 0;
  sequence.present_ranges.clear();
  sequence.status = SequenceStatus::kLoadFailed;
}

int64_t Scheduler::numWaitingForRemoteKv() const {
  return std::count_if(waiting_.begin(), waiting_.end(), [](const auto& s) {
    return s->status == SequenceStatus::kWaitingForRemoteKv;
  });
}

int64_t Scheduler::numPrefillTokensWaiting() const {
  int64_t total = 0;
  for (const auto& sequence : waiting_) {
    if (sequence->status == SequenceStatus::kLoadFailed) continue;
    total += std::max<int64_t>(
        0, static_cast<int64_t>(sequence->tokens.size()) - sequence->num_computed_tokens);
  }
  return total;
}

int64_t Scheduler::numBlocksNeededByWaiting() const {
  int64_t total = 0;
  for (const auto& sequence : waiting_) {
    if (sequence->status == SequenceStatus::kWaitingForRemoteKv ||
        sequence->status == SequenceStatus::kLoadFailed) {
      continue;
    }
    total += std::max<int64_t>(0, blocks_.blocksForTokens(std::ssize(sequence->tokens)) -
                                      std::ssize(sequence->blocks.blocks));
  }
  return total;
}

const std::vector<BlockHash>& Scheduler::promptHashes(Sequence* sequence) {
  if (!sequence->prompt_hashed) {
    sequence->prompt_block_hashes = blocks_.hasher().hashFullBlocks(
        std::span<const TokenId>(sequence->tokens).first(sequence->num_prompt_tokens),
        sequence->request.cache_salt, sequence->adapter_identity);
    sequence->prompt_hashed = true;
  }
  return sequence->prompt_block_hashes;
}

bool Scheduler::blockIsInFlight(Sequence* sequence, int64_t first_uncached) {
  // Without prefix caching a computed block is never a hit: nothing to wait for.
  if (!blocks_.config().enable_prefix_caching || running_.empty()) return false;
  const std::vector<BlockHash>& own = promptHashes(sequence);
  const size_t index = static_cast<size_t>(first_uncached);
  // The prompt's last token is always computed (findCachedPrefix leaves it),
  // so a block holding it is not worth waiting for.
  if (index >= own.size() ||
      (first_uncached + 1) * blocks_.blockSize() >= sequence->num_prompt_tokens) {
    return false;
  }
  return prefixBlockComing(own, first_uncached, sequence, /*waiting_to_run=*/false);
}

bool Scheduler::prefixBlockComing(const std::vector<BlockHash>& hashes, int64_t index,
                                  const Sequence* except, bool waiting_to_run) {
  const auto at = static_cast<size_t>(index);
  if (at >= hashes.size()) return false;
  auto producing = [&](Sequence* other) {
    if (other == except) return false;
    // A sequence never waits for one of a worse priority, which may be
    // served after others between them (kPriority): it computes the block.
    if (except != nullptr && rank(*other) > rank(*except)) return false;
    const std::vector<BlockHash>& theirs = promptHashes(other);
    return at < theirs.size() && theirs[at] == hashes[at] &&
           other->num_computed_tokens < (index + 1) * blocks_.blockSize();
  };
  for (const auto& other : running_) {
    if (producing(other.get())) return true;
  }
  for (const auto& other : waiting_) {
    if ((waiting_to_run || other->status == SequenceStatus::kWaitingForRemoteKv) &&
        producing(other.get())) {
      return true;
    }
  }
  return false;
}

Scheduler::Admission Scheduler::admit(Sequence* sequence, int64_t budget, SchedulerOutput& output) {
  PrefixMatch match;
  const bool first_admission = !sequence->admitted_once;
  sequence->skipPresentRanges();
  // A sequence computing its prompt logprobs computes every position.
  const bool looks_up = sequence->blocks.blocks.empty() && !sequence->needsPromptLogits();
  if (looks_up) {
    match = blocks_.findCachedPrefix(sequence->tokens, sequence->request.cache_salt,
                                     sequence->adapter_identity);
  }
  const int64_t matched_tokens = match.numCachedTokens(blocks_.blockSize());
  const int64_t local = sequence->num_computed_tokens + matched_tokens;
  int64_t external = 0;
  if (looks_up && external_ != nullptr) {
    ExternalKvSource::Lookup lookup = external_->lookup(*sequence, local);
    if (lookup.pending) return Admission::kSkipped;
    external = lookup.num_tokens;
  }
  if (looks_up && external == 0 && blockIsInFlight(sequence, std::ssize(match.blocks))) {
    if (!sequence->waited_for_in_flight) ++in_flight_prefix_waits_;
    sequence->waited_for_in_flight = true;
    return Admission::kSkipped;
  }
  const int64_t remaining = sequence->nextComputeLimit(local + external) - (local + external);
  const int64_t num_tokens = std::min(remaining, budget);
  admission_blocks_short_ = 0;
  if (!config_.enable_chunked_prefill && num_tokens < remaining) return Admission::kNoRoom;
  if (num_tokens <= 0) return Admission::kNoRoom;
  if (!blocks_.allocate(sequence->blocks, looks_up ? &match : nullptr,
                        local + external + num_tokens)) {
    admission_blocks_short_ = blocks_.blocksShort(sequence->blocks, looks_up ? &match : nullptr,
                                                  local + external + num_tokens);
    return Admission::kNoRoom;
  }
  if (first_admission) {
    if (looks_up) blocks_.countPrefixQuery(match, matched_tokens);
    sequence->num_cached_tokens = matched_tokens;
    sequence->admitted_once = true;
    sequence->first_scheduled = Clock::now();
  }
  int64_t computed = local;
  if (external > 0) {
    computed = loadExternal(sequence, local, external);
    if (computed == kLoadPending) {
      // Parked with its blocks until the connector reports the load.
      sequence->num_computed_tokens = local;
      sequence->load_first_block = local / blocks_.blockSize();
      sequence->load_num_blocks = external / blocks_.blockSize();
      sequence->status = SequenceStatus::kWaitingForRemoteKv;
      return Admission::kSkipped;
    }
    if (computed < 0) {
      failLoad(*sequence);
      pending_failed_loads_.push_back(sequence);  // reported at the end of this schedule()
      return Admission::kSkipped;
    }
  }
  sequence->num_computed_tokens = computed;
  const int64_t chunk_tokens =
      std::min(sequence->nextComputeLimit(computed) - computed, num_tokens);
  sequence->status = SequenceStatus::kRunning;
  ScheduledChunk chunk;
  chunk.sequence = sequence;
  chunk.start = computed;
  chunk.num_tokens = chunk_tokens;
  chunk.samples = computed + chunk_tokens == static_cast<int64_t>(sequence->tokens.size());
  output.chunks.push_back(chunk);
  output.num_tokens += chunk_tokens;
  return Admission::kAdmitted;
}

SchedulerOutput Scheduler::schedule() {
  admitting_ = nullptr;
  SchedulerOutput output;
  int64_t budget = config_.max_num_batched_tokens;
  for (const auto& sequence : running_) sequence->draft.clear();

  // The priorities present, best first (one under kFcfs), served in turn:
  // the running sequences of each, then its waiting ones.
  std::vector<int64_t> ranks;
  for (const auto& sequence : running_) ranks.push_back(rank(*sequence));
  for (const auto& sequence : waiting_) ranks.push_back(rank(*sequence));
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  size_t next = 0;  // the first running sequence not yet served
  // Growing a running sequence had to preempt: there is no room to admit.
  bool grew_by_preempting = false;
  // A waiting sequence found no room or seat: the queue stops there.
  bool queue_stopped = false;
  // A better priority computes prompt tokens in this step: worse ones only
  // decode in it, so that the step (the better prompt's time to its first
  // token) is not lengthened by their prompts, which wait for the next.
  bool decode_only = false;
  for (const int64_t served : ranks) {
    if (budget <= 0) break;
    const size_t preempted_before = output.preempted.size();
    if (!scheduleRunning(served, &next, budget, output, decode_only)) break;
    grew_by_preempting = grew_by_preempting || output.preempted.size() > preempted_before;
    if (!grew_by_preempting && !queue_stopped && !decode_only) {
      Blocked blocked = admitWaiting(served, &next, budget, output);
      while (blocked.sequence != nullptr) {
        // Holds whose readers have not come give way first; then running
        // sequences of a worse priority (kPriority); then, when nothing runs
        // (no running sequence will free a block), the blocks that waiting
        // ones hold (loaded, not yet admitted). A missing seat only the
        // second can give.
        const bool reclaimed = blocked.no_seat ? preemptForPriority(blocked, output)
                                               : (admission_blocks_short_ > 0 && reclaim_held_ &&
                                                  reclaim_held_(admission_blocks_short_)) ||
                                                     preemptForPriority(blocked, output) ||
                                                     (running_.empty() && output.chunks.empty() &&
                                                      reclaimWaitingBlocks(blocked.sequence));
        if (!reclaimed) break;
        blocked = admitWaiting(served, &next, budget, output);
      }
      queue_stopped = blocked.sequence != nullptr;
    }
    decode_only =
        decode_only ||
        std::any_of(output.chunks.begin(), output.chunks.end(), [&](const ScheduledChunk& chunk) {
          // (The step's chunks are not computed yet: decodesNext() says
          // what each chunk is.)
          return rank(*chunk.sequence) == served && !chunk.sequence->decodesNext();
        });
  }
  // Not in a step that preempted: its free blocks are the victims'.
  if (drafter_ && output.preempted.empty()) addDrafts(budget, output);
  // Failed loads leave the pending list only with an output that is
  // returned: an admission that throws above drops this output, and they are
  // reported by the next schedule() instead of never.
  output.failed_loads = std::exchange(pending_failed_loads_, {});
  return output;
}

bool Scheduler::scheduleRunning(int64_t served, size_t* next, int64_t& budget,
                                SchedulerOutput& output, bool decode_only) {
  // Oldest first; the newest of the worst priority are preempted when
  // blocks run out.
  size_t i = *next;
  for (; i < running_.size() && rank(*running_[i]) == served && budget > 0;) {
    Sequence* sequence = running_[i].get();
    const int64_t limit = sequence->nextComputeLimit(sequence->num_computed_tokens);
    const int64_t num_tokens = std::min(limit - sequence->num_computed_tokens, budget);
    if (num_tokens <= 0 || (decode_only && !sequence->decodesNext())) {
      ++i;
      continue;
    }
    bool preempted_self = false;
    while (
        !blocks_.allocate(sequence->blocks, nullptr, sequence->num_computed_tokens + num_tokens)) {
      // Holds whose readers have not come give way before live work does.
      if (reclaim_held_ &&
          reclaim_held_(blocks_.blocksShort(sequence->blocks, nullptr,
                                            sequence->num_computed_tokens + num_tokens))) {
        continue;
      }
      Sequence* victim = running_.back().get();
      // Before a sequence preempts itself (all admitted after it are gone
      // already), waiting sequences give up the blocks they hold (loaded,
      // not yet admitted): else it would recompute, fill the cache and
      // preempt itself again, for ever, while they wait behind it.
      if (victim == sequence && reclaimWaitingBlocks(nullptr)) continue;
      // A victim scheduled earlier this step gives its chunk back.
      for (auto it = output.chunks.begin(); it != output.chunks.end(); ++it) {
        if (it->sequence == victim) {
          output.num_tokens -= it->num_tokens;
          budget += it->num_tokens;
          output.chunks.erase(it);
          break;
        }
      }
      preempt(victim);
      output.preempted.push_back(victim);
      if (victim == sequence) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) return false;  // everything after it was preempted too
    ScheduledChunk chunk;
    chunk.sequence = sequence;
    chunk.start = sequence->num_computed_tokens;
    chunk.num_tokens = num_tokens;
    chunk.samples = chunk.start + num_tokens == static_cast<int64_t>(sequence->tokens.size());
    output.chunks.push_back(chunk);
    output.num_tokens += num_tokens;
    budget -= num_tokens;
    ++i;
  }
  // Those of this priority the budget did not reach wait for a later step.
  while (i < running_.size() && rank(*running_[i]) == served) ++i;
  *next = i;
  return true;
}

Scheduler::Blocked Scheduler::admitWaiting(int64_t served, size_t* next, int64_t& budget,
                                           SchedulerOutput& output) {
  // Sequences waiting for remote KV are passed over, so they never block
  // the queue behind them.
  // Sequences parked on a load hold blocks: they count toward max_num_seqs.
  const int64_t parked = numWaitingForRemoteKv();
  size_t i = 0;
  while (i < waiting_.size() && rank(*waiting_[i]) < served) ++i;  // passed over before
  while (i < waiting_.size() && rank(*waiting_[i]) == served && budget > 0) {
    Sequence* sequence = waiting_[i].get();
    if (sequence->status == SequenceStatus::kWaitingForRemoteKv ||
        sequence->status == SequenceStatus::kLoadFailed) {
      ++i;
      continue;
    }
    if (std::ssize(running_) + parked >= config_.max_num_seqs) {
      return {.sequence = sequence, .no_seat = true};
    }
    const int64_t before = output.num_tokens;
    admitting_ = sequence;
    const Admission admission = admit(sequence, budget, output);
    admitting_ = nullptr;
    if (admission == Admission::kNoRoom) return {.sequence = sequence};
    if (admission == Admission::kSkipped) {
      ++i;
      continue;
    }
    budget -= output.num_tokens - before;
    running_.insert(running_.begin() + static_cast<std::ptrdiff_t>(*next), std::move(waiting_[i]));
    ++*next;
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return {};
}

bool Scheduler::preemptForPriority(const Blocked& blocked, SchedulerOutput& output) {
  if (config_.policy != SchedulingPolicy::kPriority || running_.empty()) return false;
  // Lacking token budget (a prompt that may not be chunked), a victim
  // would give nothing: it has no chunk in this step yet.
  if (!blocked.no_seat && admission_blocks_short_ == 0) return false;
  Sequence* victim = running_.back().get();
  if (rank(*victim) <= rank(*blocked.sequence)) return false;
  preempt(victim);
  output.preempted.push_back(victim);
  ++num_priority_preemptions_;
  return true;
}

void Scheduler::onStepComputed(const SchedulerOutput& output) {
  for (const ScheduledChunk& chunk : output.chunks) {
    Sequence* sequence = chunk.sequence;
    sequence->num_computed_tokens = chunk.start + chunk.num_tokens - chunk.num_draft_tokens;
    // Reaching a present range: its KV is already there, skip over it.
    sequence->skipPresentRanges();
    cacheComputedBlocks(*sequence);
  }
}

void Scheduler::cacheComputedBlocks(Sequence& sequence) {
  blocks_.cacheFullBlocks(sequence.blocks, sequence.tokens, sequence.num_computed_tokens,
                          sequence.request.cache_salt, sequence.adapter_identity);
}

void Scheduler::addDrafts(int64_t budget, SchedulerOutput& output) {
  if (disable_drafts_at_ > 0 && std::ssize(running_) >= disable_drafts_at_) return;
  for (ScheduledChunk& chunk : output.chunks) {
    if (budget <= 0) break;
    Sequence* sequence = chunk.sequence;
    if (!chunk.samples || chunk.num_tokens != 1) continue;
    // Into the blocks the sequence holds and free blocks whose taking
    // evicts no cached prefix, as far as they reach.
    int64_t drafts = drafter_(*sequence, budget);
    const int64_t held = std::ssize(sequence->blocks.blocks);
    const int64_t extra = blocks_.blocksForTokens(chunk.start + 1 + drafts) - held;
    const int64_t reach =
        (held + (extra > 0 ? blocks_.freeBlocksWithoutEviction(extra) : 0)) * blocks_.blockSize();
    drafts = std::clamp<int64_t>(reach - (chunk.start + 1), 0, drafts);
    TANDEM_CHECK(blocks_.allocate(sequence->blocks, nullptr, chunk.start + 1 + drafts),
                 "free blocks counted for drafts could not be taken");
    sequence->draft.resize(static_cast<size_t>(drafts));
    chunk.num_draft_tokens = std::ssize(sequence->draft);
    chunk.num_tokens += chunk.num_draft_tokens;
    output.num_tokens += chunk.num_draft_tokens;
    budget -= chunk.num_draft_tokens;
  }
}

void Scheduler::acceptDraft(Sequence& sequence) {
  ++sequence.num_computed_tokens;
  // The draft's position now holds the token sampled there (equal to it).
  TANDEM_CHECK(sequence.num_computed_tokens <= static_cast<int64_t>(sequence.tokens.size()),
               "a draft accepted before the token at its position was sampled");
  cacheComputedBlocks(sequence);
}

void Scheduler::releaseDraftBlocks(Sequence& sequence) {
  blocks_.truncate(sequence.blocks, blocks_.blocksForTokens(sequence.num_computed_tokens));
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* sequence, bool free_blocks) {
  if (admitting_ == sequence) admitting_ = nullptr;
  std::unique_ptr<Sequence> owned;
  auto running = std::find_if(running_.begin(), running_.end(),
                              [&](const auto& s) { return s.get() == sequence; });
  if (running != running_.end()) {
    owned = std::move(*running);
    running_.erase(running);
  } else {
    auto waiting = std::find_if(waiting_.begin(), waiting_.end(),
                                [&](const auto& s) { return s.get() == sequence; });
    TANDEM_CHECK(waiting != waiting_.end(), "finishing an unknown sequence");
    owned = std::move(*waiting);
    waiting_.erase(waiting);
  }
  std::erase(pending_failed_loads_, sequence);
  if (owned->status == SequenceStatus::kWaitingForRemoteKv) {
    // The connector may still be writing its blocks: free them when the
    // load is reported. The caller gets a stand-in with the request's data.
    auto report = std::make_unique<Sequence>(*owned);
    report->blocks = {};
    owned->abandoned = true;
    abandoned_.push_back(std::move(owned));
    report->status = SequenceStatus::kFinished;
    return report;
  }
  if (free_blocks) blocks_.free(owned->blocks);
  owned->status = SequenceStatus::kFinished;
  return owned;
}

}  // namespace tandem::engine
