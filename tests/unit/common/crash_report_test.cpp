#include "common/crash_report.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <stdexcept>
#include <thread>

namespace tandem {
namespace {

// Each case runs in a child process (a death test) and checks how it died:
// by the same signal as without the report, with the report on stderr.

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST(CrashReportDeathTest, AFaultIsReportedWithItsStackAndStillKillsBySignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        installCrashReport("crash-test");
        *reinterpret_cast<volatile int*>(uintptr_t{0x10}) = 1;  // in the unmapped first page
      },
      testing::KilledBySignal(SIGSEGV),
      "F crash-test: fatal signal 11 \\(Segmentation fault\\) in thread [0-9]+ at address "
      "0x10\nF crash-test: stack \\(addr2line[^\n]*\n.*crash_report_test");
}

// Deep recursion overflows the stack; the report runs on its own stack.
[[gnu::noinline]] int recurse(int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  return depth < 0 ? frame[0] : recurse(depth + 1) + frame[0];
}

TEST(CrashReportDeathTest, AStackOverflowIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        installCrashReport("crash-test");
        recurse(0);
      },
      testing::KilledBySignal(SIGSEGV), "F crash-test: fatal signal 11 \\(Segmentation fault\\)");
}
#endif

TEST(CrashReportDeathTest, AnUncaughtExceptionNamesItsTypeAndMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        installCrashReport("crash-test");
        std::thread([] { throw std::out_of_range("index 7 of 3"); }).join();
      },
      testing::KilledBySignal(SIGABRT),
      "F crash-test: terminate called after an uncaught exception of type std::out_of_range: "
      "index 7 of 3 in thread [0-9]+\n");
}

}  // namespace
}  // namespace tandem
