#include "common/loopback_socket.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

namespace tandem {
namespace {

// Reads what the peer sends until it closes (the recv result that ended it
// in *end: 0 for a FIN, -1 with errno for a reset).
std::string readToEnd(int fd, ssize_t* end, int* error) {
  std::string received;
  char buffer[4096];
  for (;;) {
    pollfd entry{fd, POLLIN, 0};
    if (::poll(&entry, 1, 10000) != 1) {
      *end = -2;  // nothing within 10 s
      return received;
    }
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      *end = n;
      *error = errno;
      return received;
    }
    received.append(buffer, static_cast<size_t>(n));
  }
}

TEST(LoopbackSocket, ConnectsSendsEveryByteAndClosesWithAFinOrAReset) {
  int port = 0;
  const int listener = listenLoopback(&port);
  ASSERT_GE(listener, 0);
  ASSERT_GT(port, 0);
  EXPECT_NE(::fcntl(listener, F_GETFD) & FD_CLOEXEC, 0) << "children must not keep it";

  for (const bool reset : {false, true}) {
    const int client = connectLoopback(port);
    ASSERT_GE(client, 0);
    EXPECT_NE(::fcntl(client, F_GETFD) & FD_CLOEXEC, 0);
    const int served = ::accept(listener, nullptr, nullptr);
    ASSERT_GE(served, 0);
    // More than a socket buffer holds in one send, so sendAll must loop.
    const std::string bytes(8 << 20, reset ? 'r' : 'f');
    std::string received;
    ssize_t end = 0;
    int error = 0;
    std::thread reader([&] { received = readToEnd(served, &end, &error); });
    EXPECT_TRUE(sendAll(client, bytes));
    if (reset) {
      resetAndClose(client);  // the reader sees the reset whatever it had read
    } else {
      ::close(client);
    }
    reader.join();
    ::close(served);
    if (reset) {
      EXPECT_EQ(end, -1);
      EXPECT_EQ(error, ECONNRESET);
    } else {
      EXPECT_EQ(end, 0) << "an orderly close";
      EXPECT_EQ(received, bytes);
    }
  }
  ::close(listener);
}

TEST(LoopbackSocket, AClosedPortIsRefusedAndAFreePortCanBeBound) {
  int port = 0;
  const int listener = listenLoopback(&port);
  ASSERT_GE(listener, 0);
  ::close(listener);
  errno = 0;
  EXPECT_EQ(connectLoopback(port), -1);
  EXPECT_EQ(errno, ECONNREFUSED);

  const int free_port = freeLoopbackPort();
  ASSERT_GT(free_port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = loopbackAddress(free_port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(fd);
}

TEST(LoopbackSocket, SendingToAPeerThatLeftIsFalseNotSigpipe) {
  int port = 0;
  const int listener = listenLoopback(&port);
  ASSERT_GE(listener, 0);
  const int client = connectLoopback(port);
  ASSERT_GE(client, 0);
  resetAndClose(::accept(listener, nullptr, nullptr));
  ::close(listener);
  // The first send may still be taken by the kernel; a later one fails.
  bool sent = true;
  for (int i = 0; i < 100 && sent; ++i) sent = sendAll(client, std::string(4096, 'x'));
  EXPECT_FALSE(sent);
  ::close(client);
}

}  // namespace
}  // namespace tandem
