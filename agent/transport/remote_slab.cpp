#include "agent/transport/remote_slab.h"

#include <charconv>
#include <limits>
#include <vector>

namespace tandem::transport {
namespace {

constexpr std::string_view kFormatTag = "ucx1";
constexpr size_t kNumFields = 6;

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::vector<std::string_view> splitFields(std::string_view text) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (;;) {
    size_t colon = text.find(':', start);
    if (colon == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, colon - start));
    start = colon + 1;
  }
}

template <typename T>
bool parseNumber(std::string_view text, int base, T* value) {
  if (text.empty()) return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value, base);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::string hexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xf]);
  }
  return hex;
}

StatusOr<std::string> hexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return invalidArgument("hex string must have an even length, got " +
                           std::to_string(hex.size()) + " characters");
  }
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < hex.size(); i += 2) {
    int high = hexValue(hex[i]);
    int low = hexValue(hex[i + 1]);
    if (high < 0 || low < 0) {
      size_t bad = high < 0 ? i : i + 1;
      return invalidArgument("hex string has a non-hex character at position " +
                             std::to_string(bad));
    }
    bytes[i / 2] = static_cast<char>((high << 4) | low);
  }
  return bytes;
}

std::string RemoteSlab::serialize() const {
  char base[17];
  auto end = std::to_chars(base, base + sizeof base, base_address, 16).ptr;
  return std::string(kFormatTag) + ":" + std::string(base, end) + ":" +
         std::to_string(block_bytes) + ":" + std::to_string(num_blocks) + ":" +
         hexEncode(worker_address) + ":" + hexEncode(packed_rkey);
}

StatusOr<RemoteSlab> RemoteSlab::parse(std::string_view text) {
  std::vector<std::string_view> fields = splitFields(text);
  if (fields.size() != kNumFields || fields[0] != kFormatTag) {
    return invalidArgument(
        "remote slab descriptor must be "
        "'ucx1:<base hex>:<block bytes>:<blocks>:<worker address hex>:<rkey hex>', got " +
        std::to_string(fields.size()) + " ':'-separated fields starting with '" +
        std::string(fields[0].substr(0, 16)) + "'");
  }
  RemoteSlab slab;
  if (!parseNumber(fields[1], 16, &slab.base_address) || slab.base_address == 0) {
    return invalidArgument("remote slab base address must be non-zero hex, got '" +
                           std::string(fields[1]) + "'");
  }
  if (!parseNumber(fields[2], 10, &slab.block_bytes) || slab.block_bytes == 0) {
    return invalidArgument("remote slab block size must be a positive integer, got '" +
                           std::string(fields[2]) + "'");
  }
  if (!parseNumber(fields[3], 10, &slab.num_blocks) || slab.num_blocks <= 0 ||
      slab.num_blocks > std::numeric_limits<int32_t>::max()) {
    return invalidArgument("remote slab block count must be between 1 and 2147483647, got '" +
                           std::string(fields[3]) + "'");
  }
  uint64_t max_blocks = std::numeric_limits<uint64_t>::max() / slab.block_bytes;
  if (static_cast<uint64_t>(slab.num_blocks) > max_blocks ||
      slab.base_address > std::numeric_limits<uint64_t>::max() -
                              static_cast<uint64_t>(slab.num_blocks) * slab.block_bytes) {
    return invalidArgument("remote slab of " + std::string(fields[3]) + " blocks of " +
                           std::string(fields[2]) + " bytes at 0x" + std::string(fields[1]) +
                           " overflows the address space");
  }
  StatusOr<std::string> worker = hexDecode(fields[4]);
  if (!worker.isOk()) {
    return invalidArgument("remote slab worker address: " + worker.status().message());
  }
  StatusOr<std::string> rkey = hexDecode(fields[5]);
  if (!rkey.isOk()) return invalidArgument("remote slab rkey: " + rkey.status().message());
  if (worker->empty() || rkey->empty()) {
    return invalidArgument("remote slab worker address and rkey must not be empty");
  }
  slab.worker_address = std::move(worker).value();
  slab.packed_rkey = std::move(rkey).value();
  return slab;
}

}  // namespace tandem::transport
