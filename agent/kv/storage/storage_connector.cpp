#include "agent/kv/storage/storage_connector.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>

#include "common/logging.h"

namespace tandem::kv {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[4] = {'T', 'K', 'V', 'B'};
constexpr uint32_t kFormatVersion = 1;

struct FileHeader {
  char magic[4];
  uint32_t version;
  uint64_t block_bytes;
  uint64_t checksum;
};
static_assert(sizeof(FileHeader) == 24);

}  // namespace

StorageConnector::StorageConnector(const KvTransferConfig& config, engine::KvCache& cache)
    : config_(config), cache_(cache) {
  const auto& path = config_.extra.find("shared_storage_path");
  if (path == config_.extra.end() || !path->is_string() || path->get<std::string>().empty()) {
    throw Error(
        "storage connector: kv_connector_extra_config.shared_storage_path must name a directory");
  }
  root_ = path->get<std::string>();
  std::error_code error;
  fs::create_directories(root_, error);
  if (!fs::is_directory(root_)) {
    throw Error("storage connector: cannot create shared_storage_path " + root_.string() +
                (error ? ": " + error.message() : ""));
  }
}

fs::path StorageConnector::blockPath(const BlockHash& hash) const {
  const std::string hex = hash.toHex();
  return root_ / hex.substr(0, 2) / (hex + ".kvblock");
}

LookupResult StorageConnector::lookup(const ConnectorRequest& request, int64_t num_local_tokens) {
  LookupResult result;
  if (!config_.consumes()) return result;
  const int64_t block_size = cache_.blockSize();
  // The last token is always computed: its logits are needed.
  const int64_t max_blocks = (static_cast<int64_t>(request.tokens.size()) - 1) / block_size;
  int64_t block = num_local_tokens / block_size;
  int64_t found = 0;
  while (block < max_blocks && block < static_cast<int64_t>(request.block_hashes.size()) &&
         fs::exists(blockPath(request.block_hashes[block]))) {
    ++block;
    ++found;
  }
  if (found > 0) {
    result.state = LookupResult::State::kAvailable;
    result.num_tokens = found * block_size;
  }
  return result;
}

std::string StorageConnector::loadBlock(const fs::path& path, BlockId block) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "missing";
  FileHeader header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof header)) return "truncated";
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0 || header.version != kFormatVersion ||
      header.block_bytes != cache_.blockBytes()) {
    return "format";
  }
  // Read into the block, then verify; a bad block is recomputed over anyway.
  uint8_t* data = cache_.blockData(block);
  if (!in.read(reinterpret_cast<char*>(data), static_cast<std::streamsize>(header.block_bytes))) {
    return "truncated";
  }
  if (in.peek() != std::char_traits<char>::eof()) return "format";  // trailing bytes
  return XXH3_64bits(data, header.block_bytes) == header.checksum ? "" : "checksum";
}

LoadResult StorageConnector::load(const ConnectorRequest& request, int64_t first_block,
                                  std::span<const BlockId> block_ids) {
  LoadResult result;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t index = first_block + static_cast<int64_t>(i);
    const std::string failure =
        index < static_cast<int64_t>(request.block_hashes.size())
            ? loadBlock(blockPath(request.block_hashes[index]), block_ids[i])
            : "missing";
    if (!failure.empty()) {
      TANDEM_LOG(kWarn) << "storage connector: block " << index << " of request "
                        << request.request_id << " did not load (" << failure << ")";
      failures_.add(failure);
      result.failed_block_indices.push_back(index);
    }
  }
  return result;
}

void StorageConnector::save(const ConnectorRequest& request, int64_t first_block,
                            std::span<const BlockId> block_ids) {
  if (!config_.produces()) return;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t index = first_block + static_cast<int64_t>(i);
    if (index >= static_cast<int64_t>(request.block_hashes.size())) break;
    const fs::path path = blockPath(request.block_hashes[index]);
    if (fs::exists(path)) continue;  // same hash, same bytes
    std::error_code error;
    fs::create_directories(path.parent_path(), error);
    const uint8_t* data = cache_.blockData(block_ids[i]);
    FileHeader header{};
    std::memcpy(header.magic, kMagic, sizeof kMagic);
    header.version = kFormatVersion;
    header.block_bytes = cache_.blockBytes();
    header.checksum = XXH3_64bits(data, header.block_bytes);
    const fs::path temp = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(temp_counter_++);
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(&header), sizeof header);
      out.write(reinterpret_cast<const char*>(data),
                static_cast<std::streamsize>(header.block_bytes));
      if (!out) {
        TANDEM_LOG(kWarn) << "storage connector: cannot write " << temp.string();
        fs::remove(temp, error);
        continue;
      }
    }
    fs::rename(temp, path, error);
    if (error) {
      TANDEM_LOG(kWarn) << "storage connector: cannot rename to " << path.string() << ": "
                        << error.message();
      fs::remove(temp, error);
    }
  }
}

}  // namespace tandem::kv
