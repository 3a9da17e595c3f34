#include "common/loopback_socket.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace tandem {
namespace {

sockaddr* raw(sockaddr_in& address) { return reinterpret_cast<sockaddr*>(&address); }

// Closes fd keeping the errno of the call that failed before.
int closeFailed(int fd) {
  const int error = errno;
  ::close(fd);
  errno = error;
  return -1;
}

}  // namespace

sockaddr_in loopbackAddress(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

int connectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address = loopbackAddress(port);
  if (::connect(fd, raw(address), sizeof address) != 0) return closeFailed(fd);
  return fd;
}

int listenLoopback(int* port, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address = loopbackAddress(0);
  socklen_t length = sizeof address;
  if (::bind(fd, raw(address), sizeof address) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, raw(address), &length) != 0) {
    return closeFailed(fd);
  }
  *port = ntohs(address.sin_port);
  return fd;
}

int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address = loopbackAddress(0);
  socklen_t length = sizeof address;
  if (::bind(fd, raw(address), sizeof address) != 0 ||
      ::getsockname(fd, raw(address), &length) != 0) {
    return closeFailed(fd);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

bool sendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(sent));
  }
  return true;
}

void resetAndClose(int fd) {
  const linger abortive{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive);
  ::close(fd);
}

}  // namespace tandem
