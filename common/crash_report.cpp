#include "common/crash_report.h"

#include <cxxabi.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <typeinfo>

namespace tandem {
namespace {

// Only async-signal-safe calls from here to the end of onFatalSignal: write,
// backtrace (loaded before the first signal), raise.
const char* g_program = "tandem";
std::atomic<bool> g_reporting{false};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr size_t kAltStackBytes = 64 * 1024;
alignas(16) char g_alt_stack[kAltStackBytes];

void writeText(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void writeNumber(unsigned long value, unsigned base) {
  char digits[32];
  size_t at = sizeof digits - 1;
  digits[at] = '\0';
  do {
    digits[--at] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value != 0 && at > 0);
  writeText(digits + at);
}

void writePrefix() {
  writeText("F ");
  writeText(g_program);
  writeText(": ");
}

const char* signalName(int signal_number) {
  switch (signal_number) {
    case SIGSEGV:
      return "Segmentation fault";
    case SIGBUS:
      return "Bus error";
    case SIGFPE:
      return "Floating point exception";
    case SIGILL:
      return "Illegal instruction";
    case SIGABRT:
      return "Aborted";
    default:
      return "signal";
  }
}

void writeStack() {
  void* frames[64];
  const int count = ::backtrace(frames, 64);
  writePrefix();
  writeText("stack (addr2line -Cfpe <binary> <offset> names a frame):\n");
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
}

void onFatalSignal(int signal_number, siginfo_t* info, void*) {
  // One report: a second thread faulting meanwhile waits for the first to
  // end the process.
  if (g_reporting.exchange(true)) {
    for (;;) ::pause();
  }
  writePrefix();
  writeText("fatal signal ");
  writeNumber(static_cast<unsigned long>(signal_number), 10);
  writeText(" (");
  writeText(signalName(signal_number));
  writeText(") in thread ");
  writeNumber(static_cast<unsigned long>(::syscall(SYS_gettid)), 10);
  // The address a fault touched (a signal sent by kill() carries none).
  if ((signal_number == SIGSEGV || signal_number == SIGBUS) && info->si_code > 0) {
    writeText(" at address 0x");
    writeNumber(reinterpret_cast<unsigned long>(info->si_addr), 16);
  }
  writeText("\n");
  writeStack();
  // SA_RESETHAND restored the default action: raised again, it runs once
  // this handler returns (a faulting instruction would fault again anyway).
  ::raise(signal_number);
}

void onTerminate() {
  if (!g_reporting.exchange(true)) {
    writePrefix();
    writeText("terminate called");
    if (const std::exception_ptr current = std::current_exception()) {
      writeText(" after an uncaught exception");
      if (const std::type_info* type = abi::__cxa_current_exception_type()) {
        int status = 0;
        char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
        writeText(" of type ");
        writeText(status == 0 && name != nullptr ? name : type->name());
        std::free(name);
      }
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        writeText(": ");
        writeText(e.what());
      } catch (...) {
      }
    }
    writeText(" in thread ");
    writeNumber(static_cast<unsigned long>(::syscall(SYS_gettid)), 10);
    writeText("\n");
    writeStack();
  }
  ::signal(SIGABRT, SIG_DFL);  // reported: abort() needs no second report
  std::abort();
}

}  // namespace

void installCrashReport(const char* program) {
  g_program = program;
  std::set_terminate(onTerminate);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // The sanitizers report faults themselves, better.
  void* warm[1];
  ::backtrace(warm, 1);  // loads the unwinder now, not inside a handler
  stack_t alt{};
  alt.ss_sp = g_alt_stack;
  alt.ss_size = kAltStackBytes;
  ::sigaltstack(&alt, nullptr);
  struct sigaction action {};
  action.sa_sigaction = onFatalSignal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int signal_number : kFatalSignals) ::sigaction(signal_number, &action, nullptr);
#endif
}

}  // namespace tandem
