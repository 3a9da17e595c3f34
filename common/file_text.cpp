#include "common/file_text.h"

#include <fstream>
#include <sstream>

namespace tandem {

std::optional<std::string> readFileText(const std::filesystem::path& path) {
  // A directory opens, and reads as nothing: the caller would take it for
  // an empty file.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

}  // namespace tandem
