// Numbers and sizes written as text in flags, files and specs, read by hand
// (no std::regex, no strtod's leniency: hex, "inf", leading spaces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// Decimal numbers in text, scanned without std::regex (whose matching
// recurses once per character: a string of a few ten thousand digits, which
// a CRD pattern without maxLength lets through, overflows the stack):
// `text` from `at` on as digits [. digits] [e|E [sign] digits], with a
// sign in front when `signed_`; a fraction needs its digits when
// `fraction_digits`, and the exponent its sign only when `exponent_sign`.
// The end of the longest such number, or npos when none starts at `at`
// (digits, or a '.' and digits, must come first).
struct DecimalForm {
  bool signed_ = true;
  bool fraction_digits = false;
  bool exponent = true;
  bool exponent_sign = true;
};
size_t scanDecimal(std::string_view text, size_t at, DecimalForm form);

// Whether `text` is a whole decimal integer, "[-+]?[0-9]+" (no spaces,
// fraction, exponent or hex): what integer flags and fields accept.
bool isDecimalInteger(std::string_view text);

// The largest size byteSizeOf reads: 1 PiB.
inline constexpr int64_t kMaxByteSize = int64_t{1} << 50;

// A size in bytes: a decimal number (digits [. digits] [e|E digits]; no
// sign, leading '.', spaces or hex), then a unit: none or B (bytes, a whole number of
// them), KiB MiB GiB TiB PiB (or K M G T P, or Kubernetes' Ki Mi Gi Ti Pi),
// KB MB GB TB PB; a larger unit's fraction rounds down to a byte. nullopt
// when `text` is not one, or it is under 1 byte or over kMaxByteSize. The
// agent's --kv-cache-memory and the pools' kvCacheMemory both read it.
std::optional<int64_t> byteSizeOf(std::string_view text);

}  // namespace tandem
