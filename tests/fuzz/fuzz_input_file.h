// A file that holds the current fuzz input, for parsers that only read from a
// path (safetensors, tokenizer.json). It lives in memory (memfd) and is
// reached through /proc/self/fd, so a run leaves nothing on disk, even when it
// crashes. One per harness process; not thread-safe (libFuzzer runs one input
// at a time).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::fuzz {

class FuzzInputFile {
 public:
  explicit FuzzInputFile(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~FuzzInputFile() { ::close(fd_); }
  FuzzInputFile(const FuzzInputFile&) = delete;
  FuzzInputFile& operator=(const FuzzInputFile&) = delete;

  // Replaces the file's content with `size` bytes at `data`.
  void write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t written = 0;
    while (written < size) {
      const ssize_t n = ::pwrite(fd_, data + written, size - written, static_cast<off_t>(written));
      if (n <= 0) std::abort();
      written += static_cast<size_t>(n);
    }
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  int fd_;
  std::filesystem::path path_;
};

}  // namespace tandem::fuzz
