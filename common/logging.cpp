#include "common/logging.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace tandem {
namespace {

// Any case; "warning" too, as Python's levels (vLLM's VLLM_LOGGING_LEVEL)
// are written. Another value is said once on stderr, and info it is.
LogLevel thresholdFromEnv() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  std::string level(env);
  for (char& c : level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (level == "debug") return LogLevel::kDebug;
  if (level == "info") return LogLevel::kInfo;
  if (level == "warn" || level == "warning") return LogLevel::kWarn;
  if (level == "error") return LogLevel::kError;
  std::string shown = env;
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  std::fprintf(stderr,
               "W TANDEM_LOG_LEVEL \"%s\" is not a level (accepted: debug, info, warn, error): "
               "logging at info\n",
               shown.c_str());
  return LogLevel::kInfo;
}

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarn:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

bool logEnabled(LogLevel level) {
  static const LogLevel threshold = thresholdFromEnv();
  return level >= threshold;
}

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << levelName(level_) << ' ' << stamp << '.' << (millis.count() / 100)
          << (millis.count() / 10 % 10) << (millis.count() % 10) << ' '
          << (base != nullptr ? base + 1 : file) << ':' << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  std::string text = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace tandem
