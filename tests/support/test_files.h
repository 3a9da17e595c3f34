// File helpers shared by the tests: a self-removing temporary directory,
// whole-file reads and writes, and Debian-installed tools.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace tandem::testing {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tandem-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Writes `content` to path()/name and returns that path.
  std::filesystem::path write(const std::string& name, const std::string& content) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out << content;
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Creates or replaces `path` with `bytes`.
inline void writeFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The path of an executable `name` installed by the system (make deps'
// Debian packages: prometheus, promtool, ...), or "" when there is none.
inline std::string findSystemTool(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    const std::filesystem::path path = std::filesystem::path(dir) / name;
    if (::access(path.c_str(), X_OK) == 0) return path.string();
  }
  return "";
}

}  // namespace tandem::testing
