#include "agent/kv/storage/storage_connector.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

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
  capacity_blocks_ = extraCapacityBlocks(config_.extra, "storage connector",
                                         sizeof(FileHeader) + cache_.blockBytes(),
                                         /*required=*/false);
  if (!config_.produces()) {
    capacity_blocks_ = 0;  // a reader adds no files, so it removes none (and keeps no index)
    return;
  }
  if (capacity_blocks_ == 0) {
    TANDEM_LOG(kInfo) << "storage connector: no capacity_blocks or capacity_bytes: block files "
                         "under "
                      << root_.string() << " are never removed";
    return;
  }
  // The files already there, least recently used (modified) first.
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  for (auto it = fs::recursive_directory_iterator(root_, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file(error) && it->path().extension() == ".kvblock") {
      found.emplace_back(it->last_write_time(error), it->path());
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& [time, path] : found) used(path);
  evictToCapacity();
  TANDEM_LOG(kInfo) << "storage connector: keeps at most " << capacity_blocks_
                    << " block files under " << root_.string() << " (" << known_.size()
                    << " there now)";
}

void StorageConnector::used(const fs::path& path) {
  if (capacity_blocks_ == 0) return;
  const std::string name = path.filename().string();
  if (known_.find(name) == nullptr) known_.put(name, path);
}

void StorageConnector::evictToCapacity() {
  while (static_cast<int64_t>(known_.size()) > capacity_blocks_) {
    const fs::path& oldest = known_.oldest().second;
    std::error_code error;
    fs::remove(oldest, error);  // gone already (another agent): as good
    if (error) {
      TANDEM_LOG(kWarn) << "storage connector: cannot remove " << oldest.string() << ": "
                        << error.message();
    }
    known_.popOldest();
  }
}

bool StorageConnector::blockFileExists(const fs::path& path) {
  // Without an error_code, a stat that fails other than "no such file"
  // (a directory this user may not read, a symlink loop, a stale NFS
  // handle) throws on the engine thread and ends the process.
  std::error_code error;
  const bool exists = fs::exists(path, error);
  if (error) {
    TANDEM_LOG(kWarn) << "storage connector: cannot look at " << path.string() << ": "
                      << error.message() << "; taken as absent";
    failures_.add("unreadable");
    return false;
  }
  return exists;
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
         blockFileExists(blockPath(request.block_hashes[block]))) {
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
  // Read into the block (a GPU's: into host memory first), then verify; a
  // bad block is recomputed over anyway.
  const bool direct = cache_.hostAccessible();
  if (!direct) host_block_.resize(cache_.blockBytes());
  uint8_t* data = direct ? cache_.blockData(block) : host_block_.data();
  if (!in.read(reinterpret_cast<char*>(data), static_cast<std::streamsize>(header.block_bytes))) {
    return "truncated";
  }
  if (in.peek() != std::char_traits<char>::eof()) return "format";  // trailing bytes
  if (XXH3_64bits(data, header.block_bytes) != header.checksum) return "checksum";
  if (!direct) cache_.copyBlockFromHost(block, data);
  return "";
}

LoadResult StorageConnector::load(const ConnectorRequest& request, int64_t first_block,
                                  std::span<const BlockId> block_ids) {
  LoadResult result;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t index = first_block + static_cast<int64_t>(i);
    const bool hashed = index < static_cast<int64_t>(request.block_hashes.size());
    const fs::path path = hashed ? blockPath(request.block_hashes[index]) : fs::path();
    const std::string failure = hashed ? loadBlock(path, block_ids[i]) : "missing";
    if (failure.empty() && capacity_blocks_ > 0) {
      // A use: the most recent, here and, for the next agent's start, on disk.
      std::error_code error;
      fs::last_write_time(path, fs::file_time_type::clock::now(), error);
      used(path);
    }
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
    if (blockFileExists(path)) {  // same hash, same bytes
      used(path);
      continue;
    }
    std::error_code error;
    fs::create_directories(path.parent_path(), error);
    const uint8_t* data = cache_.readableBlock(block_ids[i], host_block_);
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
      continue;
    }
    used(path);
  }
  evictToCapacity();
}

}  // namespace tandem::kv
