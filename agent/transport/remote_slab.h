// What two agents exchange so that one can read the other's KV blocks.
//
// A RemoteSlab names a peer (its serialized UCX worker address) and the KV
// slab it exposes (packed remote key, base address, block size, block count).
// The owner builds it with UcxSlabAllocator::remoteSlab(); the reader gets it
// through the handshake and passes it to UcxContext::connect(). serialize()
// gives one line of printable ASCII (safe inside JSON strings and on a
// command line); parse() accepts exactly that and says what is wrong
// otherwise. Plain value type, no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem::transport {

struct RemoteSlab {
  std::string worker_address;  // bytes from ucp_worker_get_address
  std::string packed_rkey;     // bytes from ucp_rkey_pack
  uint64_t base_address = 0;   // virtual address of block 0 in the owner
  uint64_t block_bytes = 0;
  int64_t num_blocks = 0;

  // "ucx1:<base hex>:<block_bytes>:<num_blocks>:<worker address hex>:<rkey hex>"
  std::string serialize() const;
  static StatusOr<RemoteSlab> parse(std::string_view text);

  bool operator==(const RemoteSlab&) const = default;
};

// Lower-case hex of arbitrary bytes, and back (InvalidArgument on odd length
// or a non-hex character, naming its position).
std::string hexEncode(std::string_view bytes);
StatusOr<std::string> hexDecode(std::string_view hex);

}  // namespace tandem::transport
