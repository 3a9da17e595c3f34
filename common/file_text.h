// A whole file's bytes, for the configuration and model files read at
// start-up. Each caller says in its own words what could not be read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace tandem {

// The file's bytes; nullopt when it cannot be opened or a read fails (a
// directory included).
std::optional<std::string> readFileText(const std::filesystem::path& path);

// The largest file of a model read whole (config.json, a sharded
// checkpoint's index, generation_config.json, a LoRA adapter's
// adapter_config.json, a chat template file): the largest real ones are a
// few MB.
inline constexpr uint64_t kMaxModelJsonBytes = 64ull << 20;

// A model's file read whole: its bytes, or nullopt when there is no
// such file. Anything else in its place (a FIFO, a device, a directory, a
// file over `max_bytes`) throws tandem::Error naming the file and what is
// accepted, without waiting on it or reading it through.
std::optional<std::string> readModelFile(const std::filesystem::path& path,
                                         uint64_t max_bytes = kMaxModelJsonBytes);

}  // namespace tandem
