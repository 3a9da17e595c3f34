// A child process started from argv: its stdout comes back through a pipe (read
// line by line, e.g. to learn the port a server bound, or whole), its stderr
// goes to a file kept for error messages, and extra environment variables may
// be set for it alone. Used by tandem-bench to run agents and ucx_perftest and
// by the integration tests to run Tandem binaries.
//
// The process is killed (SIGKILL) and reaped when the Subprocess is destroyed,
// unless wait() already saw it exit. One owner: the stdout methods
// (waitForLine, readStdout) are for one thread at a time; wait() and signal()
// may be called from any thread at the same time (one thread reading output
// and polling wait(0) while another waits for the exit is fine: whichever
// reaps the child, every wait() sees its status).
// The child gets stdin, the stdout pipe and stderr, no other descriptor of
// ours (close-on-exec or not). Start-up failures (pipe, fork) throw
// tandem::Error; an executable that cannot be run makes the child exit with
// status 127.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

class Subprocess {
 public:
  // argv[0] is a path, or a name looked up in PATH. `env` is set (replacing
  // inherited values) in the child's environment only. stderr goes to
  // stderr_path (created or truncated); an empty path inherits ours. With
  // `own_process_group` the child leads a process group of its own, with
  // stdin from /dev/null: a signal to our group (Ctrl-C in a terminal sends
  // SIGINT to the foreground group, a hang-up SIGHUP) does not reach it,
  // only what we send it; and it gets SIGTERM when the thread that started
  // it ends (PR_SET_PDEATHSIG: this process killed, say), so that it never
  // outlives us.
  Subprocess(const std::vector<std::string>& argv, const std::filesystem::path& stderr_path,
             const std::vector<std::pair<std::string, std::string>>& env = {},
             bool own_process_group = false);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // The first stdout line starting with `prefix` (lines before it are
  // dropped), or "" at the deadline or when stdout closes first.
  std::string waitForLine(const std::string& prefix, std::chrono::milliseconds timeout);
  // Everything not yet consumed from stdout, up to its end (the process closed
  // it, usually by exiting) or the deadline, whichever comes first.
  std::string readStdout(std::chrono::milliseconds timeout);

  void signal(int signal_number);
  // Exit status (or 128 + signal), or -1 if still running at the deadline.
  // Once seen, the status is kept: later calls return it at once.
  int wait(std::chrono::milliseconds timeout);

  // What the process wrote to stderr_path so far ("" when stderr is inherited).
  std::string stderrText() const;
  pid_t pid() const { return pid_; }

 private:
  // Reads what stdout has within `timeout`; false at its end.
  bool readSome(std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  // Guards reaping: waitpid and the status it yields are one step, so a
  // wait() never finds the child gone without its status stored.
  std::mutex exit_mutex_;
  bool exited_ = false;
  int exit_status_ = -1;
  bool stdout_closed_ = false;
  std::string buffer_;
  std::filesystem::path stderr_path_;
};

}  // namespace tandem
