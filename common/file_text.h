// A whole file's bytes, for the configuration and model files read at
// start-up. Each caller says in its own words what could not be read.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace tandem {

// The file's bytes; nullopt when it cannot be opened or a read fails (a
// directory included).
std::optional<std::string> readFileText(const std::filesystem::path& path);

}  // namespace tandem
