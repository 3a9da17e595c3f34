// HMAC-SHA256 for authenticating messages between agents that share a
// secret. Thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

// Lower-case hex of HMAC-SHA256(key, message): 64 characters.
std::string hmacSha256Hex(std::string_view key, std::string_view message);

// Compares two strings in time independent of where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);

}  // namespace tandem
