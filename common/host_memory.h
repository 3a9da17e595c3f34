// What this host's memory can hold, for allocations made once at start
// (the KV cache's slab): one larger than the host's memory is refused with
// a clear error instead of being met by the kernel's OOM killer later
// (which kills other processes too), or, for shared memory, a file left in
// /dev/shm that no process holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// A field of /proc/meminfo ("MemTotal", "MemAvailable") in bytes; none when
// it cannot be read.
std::optional<uint64_t> memInfoBytes(const std::string& field);

// Bytes free to an unprivileged writer on the filesystem holding `path`
// (statvfs's f_bavail); none when it cannot be asked.
std::optional<uint64_t> freeBytesOn(const std::string& path);

// Throws tandem::Error when `bytes` of `what` cannot fit: more than the
// host's memory (MemTotal) for memory committed lazily (`committed` false),
// more than what is available now (MemAvailable) and, for shared memory
// (`shared_memory_dir` not empty), more than that filesystem has free, for
// memory committed at once. Unknown figures check nothing.
void requireHostMemoryFor(uint64_t bytes, const std::string& what, bool committed,
                          const std::string& shared_memory_dir = {});

}  // namespace tandem
