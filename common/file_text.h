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

// A regular file (or a link to one) open for reading, closed with this
// object. Opened without blocking: a FIFO in its place is refused, not
// waited on for a writer.
class RegularFile {
 public:
  // nullopt when there is no such file; anything else in its place (a FIFO,
  // a device, a directory) or a file that cannot be opened throws
  // tandem::Error naming the file.
  static std::optional<RegularFile> open(const std::filesystem::path& path);
  RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  RegularFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
};

// A model's file read whole: its bytes, or nullopt when there is no
// such file. Anything else in its place (a FIFO, a device, a directory, a
// file over `max_bytes`) throws tandem::Error naming the file and what is
// accepted, without waiting on it or reading it through.
std::optional<std::string> readModelFile(const std::filesystem::path& path,
                                         uint64_t max_bytes = kMaxModelJsonBytes);

}  // namespace tandem
