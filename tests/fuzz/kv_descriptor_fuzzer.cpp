// Fuzzes the serialized remote slab of a KV transfer descriptor, the part of
// a client-visible descriptor that names UCX memory. RemoteSlab::parse returns
// a slab or an error status and never throws; an accepted slab is non-empty,
// does not overflow the address space, and serializes back to a text that
// parses to the same slab.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "agent/transport/remote_slab.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::transport::RemoteSlab;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto slab = RemoteSlab::parse(text);
  if (!slab.isOk()) return 0;
  if (slab->worker_address.empty() || slab->packed_rkey.empty()) std::abort();
  if (slab->base_address == 0 || slab->block_bytes == 0 || slab->num_blocks <= 0) std::abort();
  const auto num_blocks = static_cast<uint64_t>(slab->num_blocks);
  if (num_blocks > std::numeric_limits<uint64_t>::max() / slab->block_bytes) std::abort();
  if (slab->base_address > std::numeric_limits<uint64_t>::max() - num_blocks * slab->block_bytes) {
    std::abort();
  }
  const auto again = RemoteSlab::parse(slab->serialize());
  if (!again.isOk() || !(*again == *slab)) std::abort();
  return 0;
}
