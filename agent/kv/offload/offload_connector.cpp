#include "agent/kv/offload/offload_connector.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/logging.h"

namespace tandem::kv {

OffloadConnector::OffloadConnector(const KvTransferConfig& config, engine::KvCache& cache)
    : config_(config), cache_(cache), block_bytes_(cache.blockBytes()) {
  capacity_blocks_ = extraCapacityBlocks(config_.extra, "offload connector", block_bytes_,
                                         /*required=*/true);
  if (capacity_blocks_ > std::numeric_limits<int32_t>::max()) {
    throw Error("offload connector: a capacity of " + std::to_string(capacity_blocks_) +
                " blocks is more than the " + std::to_string(std::numeric_limits<int32_t>::max()) +
                " supported");
  }
  slab_bytes_ = static_cast<size_t>(capacity_blocks_) * block_bytes_;
  // Anonymous memory: pages are backed only once a block is written to them.
  slab_ = static_cast<uint8_t*>(allocator_.allocate(slab_bytes_));
  if (slab_ == nullptr) {
    throw Error("offload connector: cannot map " + std::to_string(slab_bytes_) +
                " bytes for a tier of " + std::to_string(capacity_blocks_) + " blocks");
  }
  slots_.resize(static_cast<size_t>(capacity_blocks_));
  index_.reserve(static_cast<size_t>(capacity_blocks_));
  TANDEM_LOG(kInfo) << "offload connector: host tier of " << capacity_blocks_ << " blocks ("
                    << slab_bytes_ << " bytes)";
}

OffloadConnector::~OffloadConnector() { allocator_.release(slab_, slab_bytes_); }

void OffloadConnector::unlink(int32_t slot) {
  Slot& s = slots_[slot];
  if (s.prev != kNone) {
    slots_[s.prev].next = s.next;
  } else {
    most_recent_ = s.next;
  }
  if (s.next != kNone) {
    slots_[s.next].prev = s.prev;
  } else {
    least_recent_ = s.prev;
  }
  s.prev = s.next = kNone;
}

void OffloadConnector::pushFront(int32_t slot) {
  Slot& s = slots_[slot];
  s.prev = kNone;
  s.next = most_recent_;
  if (most_recent_ != kNone) slots_[most_recent_].prev = slot;
  most_recent_ = slot;
  if (least_recent_ == kNone) least_recent_ = slot;
}

void OffloadConnector::store(const BlockHash& hash, BlockId block) {
  // A GPU's block comes to host memory before the tier changes: a device
  // copy that fails leaves the tier as it was.
  const uint8_t* bytes = cache_.readableBlock(block, host_block_);
  int32_t slot;
  if (num_used_ < capacity_blocks_) {
    slot = num_used_++;
    slots_[slot].hash = hash;
    index_.emplace(hash, slot);
  } else {
    slot = least_recent_;
    TANDEM_CHECK(slot != kNone, "a full offload tier has no least recently used block");
    unlink(slot);
    // Reuse the index node of the evicted hash: no allocation once full.
    auto node = index_.extract(slots_[slot].hash);
    TANDEM_CHECK(!node.empty(), "an offload slot's hash is missing from the index");
    node.key() = hash;
    node.mapped() = slot;
    index_.insert(std::move(node));
    slots_[slot].hash = hash;
  }
  std::memcpy(slotData(slot), bytes, block_bytes_);
  pushFront(slot);
}

LookupResult OffloadConnector::lookup(const ConnectorRequest& request, int64_t num_local_tokens) {
  LookupResult result;
  if (!config_.consumes()) return result;
  const int64_t block_size = cache_.blockSize();
  // The last token is always computed: its logits are needed.
  const int64_t max_blocks =
      std::min((static_cast<int64_t>(request.tokens.size()) - 1) / block_size,
               static_cast<int64_t>(request.block_hashes.size()));
  int64_t found = 0;
  for (int64_t block = num_local_tokens / block_size;
       block < max_blocks && contains(request.block_hashes[block]); ++block) {
    ++found;
  }
  if (found > 0) {
    result.state = LookupResult::State::kAvailable;
    result.num_tokens = found * block_size;
  }
  return result;
}

LoadResult OffloadConnector::load(const ConnectorRequest& request, int64_t first_block,
                                  std::span<const BlockId> block_ids) {
  LoadResult result;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t index = first_block + static_cast<int64_t>(i);
    auto it = index < static_cast<int64_t>(request.block_hashes.size())
                  ? index_.find(request.block_hashes[index])
                  : index_.end();
    if (it == index_.end()) {
      TANDEM_LOG(kWarn) << "offload connector: block " << index << " of request "
                        << request.request_id << " was evicted from the tier before its load";
      failures_.add("evicted");
      result.failed_block_indices.push_back(index);
      continue;
    }
    cache_.copyBlockFromHost(block_ids[i], slotData(it->second));
    unlink(it->second);
    pushFront(it->second);
  }
  return result;
}

void OffloadConnector::save(const ConnectorRequest& request, int64_t first_block,
                            std::span<const BlockId> block_ids) {
  if (!config_.produces()) return;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t index = first_block + static_cast<int64_t>(i);
    if (index >= static_cast<int64_t>(request.block_hashes.size())) break;
    const BlockHash& hash = request.block_hashes[index];
    auto it = index_.find(hash);
    if (it != index_.end()) {
      // Same hash, same bytes: only its recency changes.
      unlink(it->second);
      pushFront(it->second);
      continue;
    }
    store(hash, block_ids[i]);
  }
}

}  // namespace tandem::kv
