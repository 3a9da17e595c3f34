#include "common/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include "common/loopback_socket.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

fs::path tempFile(const std::string& name) {
  return fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
}

TEST(Subprocess, StdoutLinesStdoutToTheEndAndExitStatus) {
  Subprocess child({"/bin/sh", "-c",
                    "echo starting; echo 'listening on 127.0.0.1:4242'; "
                    "echo rest; printf tail; exit 3"},
                   "");
  EXPECT_EQ(child.waitForLine("listening on ", seconds(10)), "listening on 127.0.0.1:4242");
  EXPECT_EQ(child.readStdout(seconds(10)), "rest\ntail");
  EXPECT_EQ(child.wait(seconds(10)), 3);
  EXPECT_EQ(child.wait(seconds(0)), 3) << "the status is kept";
  EXPECT_EQ(child.waitForLine("anything", seconds(1)), "") << "stdout has ended";
}

// Output already in the pipe comes back even with the shortest timeout
// (local mode polls many agents with 1 ms each; a timeout rounded down to 0
// read nothing and no agent ever became ready).
TEST(Subprocess, ShortTimeoutStillReadsWhatIsThere) {
  Subprocess child({"/bin/sh", "-c", "echo listening on 127.0.0.1:1234"}, "");
  ASSERT_EQ(child.wait(std::chrono::seconds(10)), 0);
  std::string out;
  for (int i = 0; i < 5 && out.find('\n') == std::string::npos; ++i) {
    out += child.readStdout(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(out, "listening on 127.0.0.1:1234\n");
}

TEST(Subprocess, EnvironmentIsSetForTheChildOnly) {
  ::setenv("TANDEM_SUBPROCESS_TEST_A", "inherited", 1);
  ::setenv("TANDEM_SUBPROCESS_TEST_B", "replaced", 1);
  Subprocess child({"sh", "-c", "echo $TANDEM_SUBPROCESS_TEST_A-$TANDEM_SUBPROCESS_TEST_B"}, "",
                   {{"TANDEM_SUBPROCESS_TEST_B", "set"}});
  EXPECT_EQ(child.readStdout(seconds(10)), "inherited-set\n") << "found in PATH as well";
  EXPECT_STREQ(::getenv("TANDEM_SUBPROCESS_TEST_B"), "replaced");
  ::unsetenv("TANDEM_SUBPROCESS_TEST_A");
  ::unsetenv("TANDEM_SUBPROCESS_TEST_B");
}

TEST(Subprocess, StderrGoesToItsFile) {
  const fs::path path = tempFile("tandem-subprocess-stderr");
  {
    Subprocess child({"/bin/sh", "-c", "echo oops >&2"}, path);
    EXPECT_EQ(child.wait(seconds(10)), 0);
    EXPECT_EQ(child.stderrText(), "oops\n");
  }
  fs::remove(path);
}

TEST(Subprocess, MissingProgramExits127AndSignalsAreReported) {
  Subprocess missing({"/nonexistent/tandem-no-such-program"}, "");
  EXPECT_EQ(missing.wait(seconds(10)), 127);

  Subprocess sleeper({"/bin/sh", "-c", "echo ready; exec sleep 30"}, "");
  ASSERT_EQ(sleeper.waitForLine("ready", seconds(10)), "ready");
  EXPECT_EQ(sleeper.wait(std::chrono::milliseconds(20)), -1) << "still running";
  sleeper.signal(SIGTERM);
  EXPECT_EQ(sleeper.wait(seconds(10)), 128 + SIGTERM);
}

// One thread polls wait(0) (as a thread reading the child's output does)
// while another waits long for the exit: whichever reaps the child, the long
// wait returns its status instead of running to its deadline.
TEST(Subprocess, AWaitSeesAChildReapedByAnotherThread) {
  for (int round = 0; round < 3; ++round) {
    Subprocess sleeper({"/bin/sh", "-c", "echo ready; exec sleep 30"}, "");
    ASSERT_EQ(sleeper.waitForLine("ready", seconds(10)), "ready");
    auto long_wait = std::async(std::launch::async, [&] { return sleeper.wait(seconds(50)); });
    EXPECT_EQ(sleeper.wait(std::chrono::milliseconds(20)), -1) << "still running";
    sleeper.signal(SIGTERM);
    int polled = -1;
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (polled < 0 && std::chrono::steady_clock::now() < deadline)
      polled = sleeper.wait(seconds(0));
    EXPECT_EQ(polled, 128 + SIGTERM);
    ASSERT_EQ(long_wait.wait_for(seconds(20)), std::future_status::ready)
        << "the long wait missed the exit seen by the other thread";
    EXPECT_EQ(long_wait.get(), 128 + SIGTERM);
  }
}

TEST(Subprocess, DestructionKillsTheChild) {
  pid_t pid = 0;
  {
    Subprocess sleeper({"/bin/sh", "-c", "exec sleep 30"}, "");
    pid = sleeper.pid();
    ASSERT_GT(pid, 0);
  }
  EXPECT_NE(::kill(pid, 0), 0) << "reaped, so the pid no longer exists";
}

// Descriptors opened without O_CLOEXEC, as Boost.Asio opens its listeners and
// accepted connections, stay with the parent: once the parent closes them, a
// pipe's reader sees its end and connecting to a listener is refused, while
// the child still runs.
TEST(Subprocess, TheChildGetsNoDescriptorBeyondStderr) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  int port = 0;
  const int listener = listenLoopback(&port);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(::fcntl(listener, F_SETFD, 0), 0);
  ASSERT_EQ(::fcntl(pipe_fds[1], F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(::fcntl(listener, F_GETFD) & FD_CLOEXEC, 0);

  Subprocess sleeper({"/bin/sh", "-c", "exec sleep 30"}, "");
  ::close(pipe_fds[1]);
  ::close(listener);
  pollfd reader{pipe_fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&reader, 1, 10000), 1) << "the child still holds the pipe's write end";
  char byte;
  EXPECT_EQ(::read(pipe_fds[0], &byte, 1), 0) << "end of the pipe";
  ::close(pipe_fds[0]);

  const int client = connectLoopback(port);
  const int error = errno;
  if (client >= 0) ::close(client);
  EXPECT_LT(client, 0) << "the child still listens on the parent's port";
  EXPECT_EQ(error, ECONNREFUSED);
  EXPECT_EQ(sleeper.wait(seconds(0)), -1) << "the child runs";
}

}  // namespace
}  // namespace tandem
