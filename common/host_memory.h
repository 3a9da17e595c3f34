// What this host's memory can hold, for allocations made once at start
// (the KV cache's slab): one larger than the host's memory is refused with
// a clear error instead of being met by the kernel's OOM killer later
// (which kills other processes too, and can leave a shared-memory file in
// /dev/shm that no process holds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// A field of /proc/meminfo ("MemTotal", "MemAvailable") in bytes; none when
// it cannot be read.
std::optional<uint64_t> memInfoBytes(const std::string& field);

// Throws tandem::Error when `bytes` of `what` cannot fit: more than the
// host's memory (MemTotal), or, for memory committed at once (`committed`),
// more than what is available now (MemAvailable). Unknown figures check
// nothing.
void requireHostMemoryFor(uint64_t bytes, const std::string& what, bool committed);

}  // namespace tandem
