#include "common/file_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/status.h"

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

std::optional<RegularFile> RegularFile::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  // Non-blocking: opening a FIFO would wait for a writer.
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error(name + ": cannot open: " + std::strerror(errno));
  }
  RegularFile file(fd, 0);
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw Error(name + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(info.st_mode)) {
    throw Error(name + ": not a regular file (accepted: a file, or a link to one)");
  }
  file.size_ = static_cast<uint64_t>(info.st_size);
  return file;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> readModelFile(const std::filesystem::path& path, uint64_t max_bytes) {
  const std::string name = path.string();
  const std::optional<RegularFile> file = RegularFile::open(path);
  if (!file) return std::nullopt;
  const int fd = file->fd();
  const uint64_t size = file->size();
  if (size > max_bytes) {
    throw Error(name + ": " + std::to_string(size) + " bytes, more than the " +
                std::to_string(max_bytes) + " this file may have");
  }
  std::string text(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(name + ": read failed: " + std::strerror(errno));
    if (n == 0) break;  // shrank while read
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace tandem
