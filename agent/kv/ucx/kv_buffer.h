// Where the ucx connector's KV bytes live while UCX moves them: the KV buffer.
//
// - slab: the KV slab itself is registered with UCX; readers GET straight
//   from the producer's slab into their own. Possible when the slab is host
//   memory, or device memory that this UCX supports (its memory types name
//   "cuda").
// - staging: a registered HOST area of staging_blocks block slots is what
//   UCX sees. A producer copies a held transfer's blocks out of its slab into
//   free slots (Backend::readBlocks) and names the slots in its descriptor; a
//   consumer GETs into its own slots and copies them into its slab
//   (Backend::writeBlocks). This is how a device slab moves over a UCX
//   without CUDA support (vLLM's kv_buffer_device "cpu").
//
// kv_connector_extra_config:
//   "kv_buffer": "auto" (default: slab when possible, else staging), "slab"
//     (refused when not possible) or "staging" (always; works on a host slab
//     too);
//   "staging_blocks": slots of the staging area, 1 to kMaxStagingBlocks
//     (default kDefaultStagingBlocks); ignored on the slab path.
//
// Pure functions: the decision is made once at start-up.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace tandem::kv {

enum class KvBufferPath { kSlab, kStaging };

// "slab" or "staging".
const char* kvBufferPathName(KvBufferPath path);

struct KvBufferOptions {
  std::string requested = "auto";  // "auto", "slab" or "staging"
  int64_t staging_blocks = 256;
};

inline constexpr int64_t kDefaultStagingBlocks = 256;
inline constexpr int64_t kMaxStagingBlocks = 1 << 20;

// kv_buffer and staging_blocks from kv_connector_extra_config; errors name
// the field and what is accepted.
StatusOr<KvBufferOptions> parseKvBufferOptions(const nlohmann::json& extra);

// The path for a slab that is (or is not) host memory, given whether this
// UCX supports device (CUDA) memory. "slab" that cannot work is
// FailedPrecondition saying why and what to do.
StatusOr<KvBufferPath> chooseKvBuffer(const KvBufferOptions& options, bool slab_host_accessible,
                                      bool ucx_supports_cuda);

}  // namespace tandem::kv
