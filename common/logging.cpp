#include "common/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace tandem {
namespace {

LogLevel thresholdFromEnv() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
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
