#include "common/hmac.h"

#include <openssl/hmac.h>

#include "common/check.h"

namespace tandem {

std::string hmacSha256Hex(std::string_view key, std::string_view message) {
  unsigned char digest[32];
  unsigned int size = 0;
  const unsigned char* ok =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &size);
  TANDEM_CHECK(ok != nullptr && size == sizeof digest, "HMAC-SHA256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof digest);
  for (unsigned char byte : digest) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 15]);
  }
  return out;
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tandem
