#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/status.h"

extern char** environ;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Rounded up: truncating would turn a short timeout (1 ms, less the time
// already spent) into 0 and skip a read of output that is already there.
std::chrono::milliseconds leftUntil(Clock::time_point deadline) {
  return std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
}

}  // namespace

Subprocess::Subprocess(const std::vector<std::string>& argv,
                       const std::filesystem::path& stderr_path,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       bool own_process_group)
    : stderr_path_(stderr_path) {
  if (argv.empty()) throw Error("Subprocess needs a program to run");
  // Everything the child needs is built here: between fork and exec only
  // async-signal-safe calls are allowed (the parent may have threads).
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    bool replaced = false;
    for (const auto& [name, value] : env) {
      replaced = replaced ||
                 (text.size() > name.size() && text.starts_with(name) && text[name.size()] == '=');
    }
    if (!replaced) env_entries.emplace_back(text);
  }
  for (const auto& [name, value] : env) env_entries.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& entry : env_entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  const std::string stderr_file = stderr_path.string();
  // For kernels without close_range (before 5.9): the descriptors to close
  // one by one in the child.
  rlimit limit{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20))
                         : 1 << 16;

  const pid_t parent = ::getpid();
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw Error(std::string("cannot start ") + argv[0] + ": pipe failed: " + std::strerror(errno));
  }
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw Error(std::string("cannot start ") + argv[0] + ": fork failed: " + std::strerror(error));
  }
  if (pid_ == 0) {
    if (own_process_group) {
      // Out of our group, so nothing of the terminal's reaches it: it ends
      // with us instead (and at once if we already ended).
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      // A background group that read the terminal would be stopped
      // (SIGTTIN): stdin is /dev/null.
      ::setpgid(0, 0);
      const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
    }
    ::dup2(out[1], STDOUT_FILENO);
    if (!stderr_file.empty()) {
      const int err = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (err >= 0) ::dup2(err, STDERR_FILENO);
    }
    // Nothing but stdin, stdout and stderr goes to the child: sockets opened
    // without SOCK_CLOEXEC (Boost.Asio's listeners and accepted connections)
    // would otherwise live on in it. A supervised agent holding the router's
    // listener keeps its port accepting after the router is gone, and one
    // holding a client's connection keeps that client from seeing it close.
    if (::close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < max_fd; ++fd) ::close(fd);
    }
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  // Also here, so that the group exists before the constructor returns
  // whichever of parent and child runs first (an error once the child has
  // exec'd is that it already did).
  if (own_process_group) ::setpgid(pid_, pid_);
  ::close(out[1]);
  stdout_fd_ = out[0];
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

bool Subprocess::readSome(std::chrono::milliseconds timeout) {
  if (stdout_closed_) return false;
  pollfd fd{stdout_fd_, POLLIN, 0};
  const int ready = ::poll(&fd, 1, static_cast<int>(std::max<int64_t>(0, timeout.count())));
  if (ready <= 0) return true;  // nothing yet (or interrupted): the caller's deadline decides
  char chunk[4096];
  const ssize_t n = ::read(stdout_fd_, chunk, sizeof chunk);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) {
    stdout_closed_ = true;
    return false;
  }
  buffer_.append(chunk, static_cast<size_t>(n));
  return true;
}

std::string Subprocess::waitForLine(const std::string& prefix, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    size_t newline;
    while ((newline = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (line.starts_with(prefix)) return line;
    }
    const auto left = leftUntil(deadline);
    if (left.count() <= 0 || !readSome(left)) return "";
  }
}

std::string Subprocess::readStdout(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto left = leftUntil(deadline); left.count() > 0 && readSome(left);
       left = leftUntil(deadline)) {
  }
  return std::exchange(buffer_, {});
}

void Subprocess::signal(int signal_number) {
  // Under the lock: once reaped, the pid may belong to another process.
  std::lock_guard<std::mutex> lock(exit_mutex_);
  if (pid_ > 0 && !exited_) ::kill(pid_, signal_number);
}

int Subprocess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      // Checked on every round: another thread's wait() may have reaped the
      // child since the last one (our waitpid then fails with ECHILD).
      std::lock_guard<std::mutex> lock(exit_mutex_);
      if (exited_) return exit_status_;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        exited_ = true;
        return exit_status_;
      }
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Subprocess::stderrText() const {
  if (stderr_path_.empty()) return "";
  std::ifstream in(stderr_path_, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace tandem
