#include "agent/kv/ucx/kv_buffer.h"

namespace tandem::kv {

const char* kvBufferPathName(KvBufferPath path) {
  return path == KvBufferPath::kSlab ? "slab" : "staging";
}

StatusOr<KvBufferOptions> parseKvBufferOptions(const nlohmann::json& extra) {
  KvBufferOptions options;
  options.staging_blocks = kDefaultStagingBlocks;
  if (!extra.is_object()) return options;
  if (auto it = extra.find("kv_buffer"); it != extra.end()) {
    const bool known = it->is_string() && (*it == "auto" || *it == "slab" || *it == "staging");
    if (!known) {
      return invalidArgument(
          "kv_connector_extra_config.kv_buffer must be \"auto\", \"slab\" or \"staging\", got " +
          it->dump());
    }
    options.requested = it->get<std::string>();
  }
  if (auto it = extra.find("staging_blocks"); it != extra.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 ||
        it->get<int64_t>() > kMaxStagingBlocks) {
      return invalidArgument(
          "kv_connector_extra_config.staging_blocks must be an integer number of block slots "
          "between 1 and " +
          std::to_string(kMaxStagingBlocks) + ", got " + it->dump());
    }
    options.staging_blocks = it->get<int64_t>();
  }
  return options;
}

StatusOr<KvBufferPath> chooseKvBuffer(const KvBufferOptions& options, bool slab_host_accessible,
                                      bool ucx_supports_cuda) {
  const bool slab_possible = slab_host_accessible || ucx_supports_cuda;
  if (options.requested == "staging") return KvBufferPath::kStaging;
  if (options.requested == "slab") {
    if (!slab_possible) {
      return failedPrecondition(
          "kv_connector_extra_config.kv_buffer \"slab\" cannot work here: the KV slab is in "
          "device memory and this UCX does not support CUDA memory (its memory types lack "
          "\"cuda\"); use \"staging\" or \"auto\", or a UCX built with CUDA");
    }
    return KvBufferPath::kSlab;
  }
  return slab_possible ? KvBufferPath::kSlab : KvBufferPath::kStaging;
}

}  // namespace tandem::kv
